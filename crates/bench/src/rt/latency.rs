//! `spindle rt latency`: latency and jitter by message size (Figs 5.4–5.7).

use std::time::Duration;

use crate::rt::scenario::{Scenario, Summary};
use clap::Args;
use serde::Serialize;

use super::common::*;
use super::plot::two_panel_plot;
use super::{CommonArgs, US};
use crate::report::Machine;

#[derive(Args, Debug, Clone)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Messages per size.
    #[arg(long, default_value_t = 1_000)]
    pub periods: u64,
    /// Message sizes (bytes, comma-separated, at least 8).
    #[arg(long, default_value = "8,16,32,64,128,256,512,1024,2048,4096")]
    pub sizes: String,
    /// Period (µs).
    #[arg(long, default_value_t = 1_000)]
    pub period_us: u64,
    /// Deadline of every task (µs; default: the largest that fits).
    #[arg(long)]
    pub deadline_us: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
struct SizeRow {
    size: usize,
    latency_ns: Summary,
    jitter_ns: Summary,
    send_exec_ns: Summary,
    receive_exec_ns: Summary,
    release_jitter_ns: Summary,
    missed: u64,
    late: u64,
}

#[derive(Debug, Clone, Serialize)]
struct LatencyReport {
    transport: String,
    periods: u64,
    period_ns: u64,
    deadline_ns: u64,
    admitted: bool,
    verdicts: Vec<Option<String>>,
    sizes: Vec<SizeRow>,
    nodes: Vec<NodeRow>,
    machine: Machine,
    unix_time_s: u64,
    command: String,
}

pub(super) fn latency(args: LatencyArgs) -> Result<(), String> {
    let sizes: Vec<usize> = parse_list("--sizes", &args.sizes)?;
    check_sizes(&sizes)?;
    if args.periods == 0 || args.periods > 1_000_000 {
        return Err(format!("--periods {} must be in 1..=1000000", args.periods));
    }
    let mut spec = base_spec(Scenario::Latency, &args.common, 2)?;
    let period_ns = args.period_us * US;
    let eps = spec.clock_bound_budget_ns;
    let d = args
        .deadline_us
        .map(|d| d * US)
        .unwrap_or_else(|| largest_deadline_ns(&[0, 1], false, period_ns, eps));
    spec.stages = pipeline(&[0, 1], false, d, 20 * US, 5 * US, eps);
    if pipeline_span_ns(&spec.stages) > period_ns {
        return Err(format!(
            "--deadline-us {}: the 4 tasks do not fit the period of {} µs",
            d / US,
            args.period_us
        ));
    }
    spec.period_ns = vec![period_ns];
    spec.periods = args.periods;
    spec.sizes = sizes.clone();
    println!(
        "spindle rt latency: 2 nodes on {}, {} messages per size, period {} µs, deadlines {} µs",
        transport_label(&spec),
        args.periods,
        args.period_us,
        d / US
    );
    let reports = run_members(&spec, Duration::from_secs(args.common.timeout_s))?;
    let rows: Vec<SizeRow> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let (s, r) = (&reports[0].runs[i], &reports[1].runs[i]);
            let lat = hop_latencies(s, r);
            SizeRow {
                size,
                latency_ns: Summary::of(&lat),
                jitter_ns: Summary::of(&jitter_of(&lat)),
                send_exec_ns: s.send_exec_ns,
                receive_exec_ns: r.receive_exec_ns,
                release_jitter_ns: worst([s.release_jitter_ns, r.release_jitter_ns].into_iter()),
                missed: r.app_missed + r.user_jobs_missed,
                late: s.counters.missed_early + s.counters.overruns + r.counters.missed_early + r.counters.overruns,
            }
        })
        .collect();
    let report = LatencyReport {
        transport: transport_label(&spec),
        periods: args.periods,
        period_ns,
        deadline_ns: d,
        admitted: reports[0].runs[0].verdicts.iter().all(|v| v.is_none()),
        verdicts: reports[0].runs[0].verdicts.clone(),
        sizes: rows,
        nodes: reports.iter().map(|r| node_row(r, &r.runs[0])).collect(),
        machine: Machine::detect(),
        unix_time_s: unix_time_s(),
        command: command_line(),
    };
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6} {:>5}",
        "bytes", "lat p50", "lat p99", "lat max", "jit p99", "jit max", "send exec", "recv exec", "missed", "late"
    );
    for r in &report.sizes {
        println!(
            "{:>6} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6} {:>5}",
            r.size,
            r.latency_ns.p50,
            r.latency_ns.p99,
            r.latency_ns.max,
            r.jitter_ns.p99,
            r.jitter_ns.max,
            r.send_exec_ns.p50,
            r.receive_exec_ns.p50,
            r.missed,
            r.late
        );
    }
    println!(
        "(ns; latency = sender's user inserts → receiver's user extracts, on the global clock; set by the schedule)"
    );
    write_json(&args.common.json, &report)?;
    if let Some(path) = &args.common.plot {
        let series = |f: &dyn Fn(&SizeRow) -> u64| -> Vec<(f64, f64)> {
            report
                .sizes
                .iter()
                .map(|r| (r.size as f64, f(r) as f64 / 1_000.0))
                .collect()
        };
        let left = vec![
            ("latency p50".to_string(), series(&|r| r.latency_ns.p50)),
            ("latency p99".to_string(), series(&|r| r.latency_ns.p99)),
        ];
        let right = vec![
            ("jitter p99".to_string(), series(&|r| r.jitter_ns.p99)),
            ("send task exec p50".to_string(), series(&|r| r.send_exec_ns.p50)),
            ("receive task exec p50".to_string(), series(&|r| r.receive_exec_ns.p50)),
        ];
        let title = format!(
            "spindle rt latency: time-driven channel on {}, period {} µs ({})",
            report.transport, args.period_us, report.machine.cpu_model
        );
        two_panel_plot(
            path,
            &title,
            ("latency (µs) vs message bytes", &left),
            ("jitter and channel task time (µs) vs message bytes", &right),
            true,
        )?;
    }
    Ok(())
}
