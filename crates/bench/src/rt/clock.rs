//! `spindle rt clock`: global clock error against the true (injected)
//! time, and the reported bound.

use std::time::Duration;

use crate::rt::scenario::{ClockSample, Scenario, Summary};
use clap::Args;
use serde::Serialize;

use super::common::*;
use super::plot::two_panel_plot;
use super::{CommonArgs, MS, US};
use crate::report::Machine;

#[derive(Args, Debug, Clone)]
pub struct ClockArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Members (node 0 is the master).
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// How long to sample (s).
    #[arg(long, default_value_t = 10)]
    pub duration_s: u64,
    /// Time between samples (ms).
    #[arg(long, default_value_t = 10)]
    pub sample_ms: u64,
    /// Injected clock steps `node:at_ms:delta_us` (comma-separated; not node 0).
    #[arg(long, default_value = "2:5000:500")]
    pub jumps: String,
}

#[derive(Debug, Clone, Serialize)]
struct ClockNodeRow {
    node: usize,
    offset_ns: i64,
    drift_ppb: i64,
    jumps: Vec<(u64, i64)>,
    samples: u64,
    unsynced_samples: u64,
    error_ns: Summary,
    bound_ns: Summary,
    outside_bound: u64,
    rounds: u64,
    jumps_detected: u64,
}

#[derive(Debug, Clone, Serialize)]
struct ClockReport {
    transport: String,
    members: usize,
    duration_ns: u64,
    /// |midpoint − true master time| over every sample of every node.
    error_ns: Summary,
    bound_ns_max: u64,
    bound_ns: Summary,
    /// Samples whose true time was outside the reported interval.
    outside_bound: u64,
    samples: u64,
    unsynced_samples: u64,
    nodes: Vec<ClockNodeRow>,
    machine: Machine,
    unix_time_s: u64,
    command: String,
}

pub(super) fn clock(args: ClockArgs) -> Result<(), String> {
    if !(2..=64).contains(&args.members) {
        return Err(format!("--members {} must be in 2..=64", args.members));
    }
    if args.duration_s == 0 || args.duration_s > 3_600 {
        return Err(format!("--duration-s {} must be in 1..=3600", args.duration_s));
    }
    if args.sample_ms == 0 {
        return Err("--sample-ms must be at least 1".into());
    }
    let mut spec = base_spec(Scenario::Clock, &args.common, args.members)?;
    for j in args.jumps.split(',').filter(|j| !j.trim().is_empty()) {
        let parts: Vec<&str> = j.trim().split(':').collect();
        let bad = || format!("--jumps: '{j}' must be node:at_ms:delta_us");
        let [node, at, delta] = parts[..] else {
            return Err(bad());
        };
        let node: usize = node.parse().map_err(|_| bad())?;
        let at_ms: u64 = at.parse().map_err(|_| bad())?;
        let delta_us: i64 = delta.parse().map_err(|_| bad())?;
        if node == 0 || node >= args.members {
            return Err(format!(
                "--jumps: node {node} must be in 1..{} (node 0's clock defines global time)",
                args.members
            ));
        }
        spec.clocks[node].jumps.push((at_ms * MS, delta_us * US as i64));
    }
    spec.duration_ns = args.duration_s * 1_000 * MS;
    spec.sample_interval_ns = args.sample_ms * MS;
    spec.period_ns = vec![MS];
    spec.sizes = vec![8];
    println!(
        "spindle rt clock: {} members on {}, master = node 0, {} s, a sample every {} ms",
        args.members,
        transport_label(&spec),
        args.duration_s,
        args.sample_ms
    );
    let reports = run_members(&spec, Duration::from_secs(args.common.timeout_s + args.duration_s))?;
    let mut nodes = Vec::new();
    let (mut errors, mut bounds) = (Vec::new(), Vec::new());
    for r in reports.iter().skip(1) {
        let e: Vec<u64> = r.clock_samples.iter().map(|s| s.error_ns.unsigned_abs()).collect();
        let b: Vec<u64> = r.clock_samples.iter().map(|s| s.bound_ns).collect();
        let c = &spec.clocks[r.rank];
        nodes.push(ClockNodeRow {
            node: r.rank,
            offset_ns: c.offset_ns,
            drift_ppb: c.drift_ppb,
            jumps: c.jumps.clone(),
            samples: r.clock_samples.len() as u64,
            unsynced_samples: r.clock_unsynced_samples,
            error_ns: Summary::of(&e),
            bound_ns: Summary::of(&b),
            outside_bound: r.clock_samples.iter().filter(|s| !s.inside).count() as u64,
            rounds: r.clock_rounds,
            jumps_detected: r.clock_jumps_detected,
        });
        errors.extend(e);
        bounds.extend(b);
    }
    let report = ClockReport {
        transport: transport_label(&spec),
        members: args.members,
        duration_ns: spec.duration_ns,
        error_ns: Summary::of(&errors),
        bound_ns_max: bounds.iter().copied().max().unwrap_or(0),
        bound_ns: Summary::of(&bounds),
        outside_bound: nodes.iter().map(|n| n.outside_bound).sum(),
        samples: errors.len() as u64,
        unsynced_samples: nodes.iter().map(|n| n.unsynced_samples).sum(),
        nodes,
        machine: Machine::detect(),
        unix_time_s: unix_time_s(),
        command: command_line(),
    };
    println!(
        "{:>4} {:>9} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}",
        "node",
        "offset µs",
        "drift",
        "samples",
        "err p50",
        "err p99",
        "err max",
        "bound p99",
        "bound max",
        "outside",
        "jumps"
    );
    for n in &report.nodes {
        println!(
            "{:>4} {:>9} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}",
            n.node,
            n.offset_ns / US as i64,
            format!("{}ppm", n.drift_ppb / 1_000),
            n.samples,
            n.error_ns.p50,
            n.error_ns.p99,
            n.error_ns.max,
            n.bound_ns.p99,
            n.bound_ns.max,
            n.outside_bound,
            n.jumps.len()
        );
    }
    println!(
        "all nodes (ns): error p50 {} p99 {} max {}; bound max {}; true time outside the interval: {} of {} samples; unsynchronized (after a step): {}",
        report.error_ns.p50,
        report.error_ns.p99,
        report.error_ns.max,
        report.bound_ns_max,
        report.outside_bound,
        report.samples,
        report.unsynced_samples
    );
    write_json(&args.common.json, &report)?;
    if let Some(path) = &args.common.plot {
        let mut left = Vec::new();
        let mut right = Vec::new();
        for r in reports.iter().skip(1) {
            let pts = |f: &dyn Fn(&ClockSample) -> f64| -> Vec<(f64, f64)> {
                r.clock_samples.iter().map(|s| (s.t_ns as f64 / 1e9, f(s))).collect()
            };
            left.push((format!("node {} error", r.rank), pts(&|s| s.error_ns as f64 / 1_000.0)));
            right.push((format!("node {} bound", r.rank), pts(&|s| s.bound_ns as f64 / 1_000.0)));
        }
        let title = format!(
            "spindle rt clock: {} members on {} ({})",
            args.members, report.transport, report.machine.cpu_model
        );
        two_panel_plot(
            path,
            &title,
            ("error of now() midpoint vs true time (µs) over time (s)", &left),
            ("reported error bound (µs) over time (s)", &right),
            false,
        )?;
    }
    Ok(())
}
