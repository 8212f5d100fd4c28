//! `spindle dds sim`: NAPA in the deterministic simulator
//! (`spindle_dds::napa_sim`), seed by seed with its invariants checked,
//! and the seed paper's experiment as a sweep over sample sizes.
//!
//! ```text
//! spindle dds sim --seeds 0..500 --json bench/results/dds-napa-sim-seeds.json
//! spindle dds sim --sweep --json bench/results/dds-napa-sim-sweep.json
//! ```
//!
//! Every seed draws a scenario (sample size 5–200 KB, link capacity,
//! delay, K, reader speed, slow phases) and runs it with NAPA on and
//! off; a panic of an invariant (no loss, no duplication, no reordering,
//! occupancy within the window, every sample delivered, the gap within
//! its bounds) is a violation. The last line is always `N seeds, V
//! violations`; the exit status is non-zero when V > 0.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use spindle_dds::napa_sim::{self, SimReport};

use crate::report::Machine;
use crate::sim::seed_range;

/// `spindle dds sim` arguments.
#[derive(Args, Debug)]
pub struct DdsSimArgs {
    /// Run this one seed (NAPA on and off) and print both reports.
    #[arg(long, conflicts_with_all = ["seeds", "sweep"])]
    seed: Option<u64>,
    /// Run every seed in A..B (B excluded).
    #[arg(long, value_name = "A..B", conflicts_with = "sweep")]
    seeds: Option<String>,
    /// The seed paper's experiment: 1 publisher → 1 subscriber on a
    /// 1 Gb/s LAN, reliable, K = 10, sizes 5 KB – 200 KB, NAPA on vs off.
    #[arg(long)]
    sweep: bool,
    /// Write the results as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct SizeRow {
    sample_bytes: u32,
    napa_p50_ns: u64,
    napa_p99_ns: u64,
    off_p50_ns: u64,
    off_p99_ns: u64,
    napa_throughput_mbps: f64,
    off_throughput_mbps: f64,
    latency_p50_ratio_off_over_napa: f64,
    throughput_ratio_napa_over_off: f64,
}

#[derive(Serialize, Default)]
struct SeedSummary {
    seeds: u64,
    violations: Vec<String>,
    latency_p50_gain_median: f64,
    throughput_ratio_median: f64,
    throughput_ratio_min: f64,
}

fn row(size: u32, on: &SimReport, off: &SimReport) -> SizeRow {
    SizeRow {
        sample_bytes: size,
        napa_p50_ns: on.latency_send_ns.p50_ns,
        napa_p99_ns: on.latency_send_ns.p99_ns,
        off_p50_ns: off.latency_send_ns.p50_ns,
        off_p99_ns: off.latency_send_ns.p99_ns,
        napa_throughput_mbps: on.throughput_bytes_per_s * 8.0 / 1e6,
        off_throughput_mbps: off.throughput_bytes_per_s * 8.0 / 1e6,
        latency_p50_ratio_off_over_napa: off.latency_send_ns.p50_ns as f64 / on.latency_send_ns.p50_ns.max(1) as f64,
        throughput_ratio_napa_over_off: on.throughput_bytes_per_s / off.throughput_bytes_per_s.max(1e-9),
    }
}

/// One seed with NAPA on and off; an invariant's panic is a violation.
fn run_seed(seed: u64) -> Result<(SimReport, SimReport), String> {
    std::panic::catch_unwind(|| {
        let scenario = napa_sim::scenario_for_seed(seed);
        let on = napa_sim::run(&scenario, Some(scenario.napa_config()));
        let off = napa_sim::run(&scenario, None);
        (on, off)
    })
    .map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        format!("seed {seed}: {what}")
    })
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Run `spindle dds sim`.
pub fn run(args: DdsSimArgs) -> Result<(), String> {
    let json = if args.sweep {
        let sizes = [5_000u32, 10_000, 20_000, 50_000, 100_000, 150_000, 200_000];
        println!("size      napa p50/p99 (µs)    off p50/p99 (µs)     napa/off Mb/s        latency gain");
        let rows: Vec<SizeRow> = napa_sim::sweep(&sizes)
            .iter()
            .map(|(size, off, on)| {
                let r = row(*size, on, off);
                println!(
                    "{:>7}  {:>9.0} /{:>9.0}  {:>9.0} /{:>9.0}  {:>8.1} /{:>8.1}  {:>6.1}×",
                    size,
                    r.napa_p50_ns as f64 / 1e3,
                    r.napa_p99_ns as f64 / 1e3,
                    r.off_p50_ns as f64 / 1e3,
                    r.off_p99_ns as f64 / 1e3,
                    r.napa_throughput_mbps,
                    r.off_throughput_mbps,
                    r.latency_p50_ratio_off_over_napa
                );
                r
            })
            .collect();
        serde_json::json!({ "experiment": "napa-sim-sweep (1 Gb/s LAN model, K = 10, window 64)", "rows": rows, "machine": Machine::detect() })
    } else {
        let range = seed_range(args.seed, args.seeds.as_deref())?;
        let mut summary = SeedSummary::default();
        let (mut gains, mut ratios) = (Vec::new(), Vec::new());
        for seed in range.clone() {
            summary.seeds += 1;
            match run_seed(seed) {
                Ok((on, off)) => {
                    if args.seed.is_some() {
                        println!("seed {seed}: NAPA on  {on:?}\nseed {seed}: NAPA off {off:?}");
                    }
                    gains.push(off.latency_send_ns.p50_ns as f64 / on.latency_send_ns.p50_ns.max(1) as f64);
                    ratios.push(on.throughput_bytes_per_s / off.throughput_bytes_per_s.max(1e-9));
                }
                Err(v) => {
                    eprintln!("violation: {v}");
                    summary.violations.push(v);
                }
            }
        }
        summary.latency_p50_gain_median = median(&mut gains);
        summary.throughput_ratio_median = median(&mut ratios);
        summary.throughput_ratio_min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "median p50 latency gain {:.1}×, throughput ratio median {:.3} (min {:.3})",
            summary.latency_p50_gain_median, summary.throughput_ratio_median, summary.throughput_ratio_min
        );
        println!("{} seeds, {} violations", summary.seeds, summary.violations.len());
        let json = serde_json::json!({ "seeds": format!("{}..{}", range.start, range.end), "summary": summary, "machine": Machine::detect() });
        if !summary.violations.is_empty() {
            write_json(&args.json, &json)?;
            return Err(format!("{} violations", summary.violations.len()));
        }
        json
    };
    write_json(&args.json, &json)
}

fn write_json(path: &Option<PathBuf>, json: &serde_json::Value) -> Result<(), String> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(json).expect("json"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
