//! `spindle rt compare`: best-effort vs time-based channels (Table 5.3).

use std::time::Duration;

use crate::rt::scenario::{Scenario, Summary};
use clap::Args;
use serde::Serialize;

use super::common::*;
use super::plot::two_panel_plot;
use super::{CommonArgs, MS, US};
use crate::report::Machine;

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Periods per configuration.
    #[arg(long, default_value_t = 500)]
    pub periods: u64,
    /// Periods to compare (µs, comma-separated).
    #[arg(long, default_value = "1000,2000,5000")]
    pub period_us: String,
    /// Message sizes (bytes, comma-separated, at least 8).
    #[arg(long, default_value = "8,1024")]
    pub sizes: String,
    /// Deadline of every task (µs), the same for every period.
    #[arg(long, default_value_t = 200)]
    pub deadline_us: u64,
    /// Seed of the best-effort load (random 0–4 messages per period).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
struct CompareRow {
    period_ns: u64,
    size: usize,
    time_based_latency_ns: Summary,
    time_based_jitter_ns: Summary,
    best_effort_latency_ns: Summary,
    best_effort_jitter_ns: Summary,
    /// The first 10 messages of each (µs), like Table 5.3.
    time_based_first_us: Vec<u64>,
    best_effort_first_us: Vec<u64>,
    best_effort_dropped: u64,
    late: u64,
    /// Admission's verdict for this period on each node (sender, receiver):
    /// `admitted: …`, `REJECTED (run forced): …` or the commit's rejection.
    admission: Vec<String>,
    /// Rejected at commit (without --force): nothing ran at this period.
    rejected_at_commit: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct CompareReport {
    transport: String,
    periods: u64,
    deadline_ns: u64,
    rows: Vec<CompareRow>,
    nodes: Vec<NodeRow>,
    machine: Machine,
    unix_time_s: u64,
    command: String,
}

pub(super) fn compare(args: CompareArgs) -> Result<(), String> {
    let sizes: Vec<usize> = parse_list("--sizes", &args.sizes)?;
    check_sizes(&sizes)?;
    let periods_us: Vec<u64> = parse_list("--period-us", &args.period_us)?;
    if periods_us.is_empty() {
        return Err("--period-us: give at least one period".into());
    }
    if args.periods == 0 || args.periods > 100_000 {
        return Err(format!("--periods {} must be in 1..=100000", args.periods));
    }
    let mut spec = base_spec(Scenario::Compare, &args.common, 2)?;
    let eps = spec.clock_bound_budget_ns;
    let d = args.deadline_us * US;
    spec.stages = pipeline(&[0, 1], false, d, 20 * US, 5 * US, eps);
    let span = pipeline_span_ns(&spec.stages);
    if let Some(p) = periods_us.iter().find(|p| **p * US < span) {
        return Err(format!(
            "--period-us {p}: the 4 tasks with --deadline-us {} need {} µs",
            args.deadline_us,
            span / US
        ));
    }
    spec.period_ns = periods_us.iter().map(|p| p * US).collect();
    spec.periods = args.periods;
    spec.sizes = sizes.clone();
    spec.seed = args.seed;
    println!(
        "spindle rt compare: best-effort (random 0–4 messages per period, channel reserves the average 2) vs time-based (2 per period); {} periods each",
        args.periods
    );
    let reports = run_members(&spec, Duration::from_secs(args.common.timeout_s))?;
    let mut rows = Vec::new();
    for (s, r) in reports[0].runs.iter().zip(&reports[1].runs) {
        let first = |v: &[u64]| v.iter().take(10).map(|x| x / US).collect::<Vec<_>>();
        rows.push(CompareRow {
            period_ns: r.period_ns,
            size: r.size,
            time_based_latency_ns: Summary::of(&r.latency_time_based_ns),
            time_based_jitter_ns: Summary::of(&jitter_of(&r.latency_time_based_ns)),
            best_effort_latency_ns: Summary::of(&r.latency_best_effort_ns),
            best_effort_jitter_ns: Summary::of(&jitter_of(&r.latency_best_effort_ns)),
            time_based_first_us: first(&r.latency_time_based_ns),
            best_effort_first_us: first(&r.latency_best_effort_ns),
            best_effort_dropped: s.best_effort_dropped,
            late: s.counters.missed_early + s.counters.overruns + r.counters.missed_early + r.counters.overruns,
            admission: vec![s.admission.clone(), r.admission.clone()],
            rejected_at_commit: s.rejected_at_commit.clone().or(r.rejected_at_commit.clone()),
        });
    }
    println!(
        "{:>7} {:>6} │ {:>9} {:>9} {:>9} │ {:>9} {:>9} {:>9} │ {:>4} │ admission",
        "period", "bytes", "TB p50", "TB p99", "TB max", "BE p50", "BE p99", "BE max", "late"
    );
    for r in &rows {
        let verdict = match &r.rejected_at_commit {
            Some(_) => "rejected at commit (nothing ran)",
            None if r.admission.iter().all(|a| a.starts_with("admitted")) => "admitted",
            None => "REJECTED, run forced",
        };
        println!(
            "{:>7} {:>6} │ {:>9} {:>9} {:>9} │ {:>9} {:>9} {:>9} │ {:>4} │ {verdict}",
            r.period_ns / US,
            r.size,
            r.time_based_latency_ns.p50 / US,
            r.time_based_latency_ns.p99 / US,
            r.time_based_latency_ns.max / US,
            r.best_effort_latency_ns.p50 / US,
            r.best_effort_latency_ns.p99 / US,
            r.best_effort_latency_ns.max / US,
            r.late
        );
    }
    println!("(µs; TB = time-based, BE = best-effort)");
    for r in rows
        .iter()
        .filter(|r| r.rejected_at_commit.is_some() || !r.admission.iter().all(|a| a.starts_with("admitted")))
    {
        let why = r.rejected_at_commit.clone().unwrap_or_else(|| r.admission.join(" | "));
        println!("  period {} µs, {} B: {why}", r.period_ns / US, r.size);
    }
    if let Some(r) = rows.iter().find(|r| r.period_ns == 5 * MS).or(rows.last()) {
        println!(
            "first 10 messages at period {} µs, {} B (like Table 5.3): BE {:?} µs, TB {:?} µs",
            r.period_ns / US,
            r.size,
            r.best_effort_first_us,
            r.time_based_first_us
        );
    }
    let report = CompareReport {
        transport: transport_label(&spec),
        periods: args.periods,
        deadline_ns: d,
        rows,
        nodes: reports.iter().map(|r| node_row(r, &r.runs[0])).collect(),
        machine: Machine::detect(),
        unix_time_s: unix_time_s(),
        command: command_line(),
    };
    write_json(&args.common.json, &report)?;
    if let Some(path) = &args.common.plot {
        let mut left = Vec::new();
        let mut right = Vec::new();
        for &size in &sizes {
            let pick = |f: &dyn Fn(&CompareRow) -> u64| -> Vec<(f64, f64)> {
                report
                    .rows
                    .iter()
                    .filter(|r| r.size == size)
                    .map(|r| (r.period_ns as f64 / 1_000.0, f(r) as f64 / 1_000.0))
                    .collect()
            };
            left.push((
                format!("time-based p50, {size} B"),
                pick(&|r| r.time_based_latency_ns.p50),
            ));
            left.push((
                format!("best-effort p50, {size} B"),
                pick(&|r| r.best_effort_latency_ns.p50),
            ));
            right.push((
                format!("time-based p99, {size} B"),
                pick(&|r| r.time_based_latency_ns.p99),
            ));
            right.push((
                format!("best-effort p99, {size} B"),
                pick(&|r| r.best_effort_latency_ns.p99),
            ));
        }
        let title = format!(
            "spindle rt compare: latency vs period on {} ({})",
            report.transport, report.machine.cpu_model
        );
        two_panel_plot(
            path,
            &title,
            ("p50 latency (µs) vs period (µs)", &left),
            ("p99 latency (µs) vs period (µs)", &right),
            false,
        )?;
    }
    Ok(())
}
