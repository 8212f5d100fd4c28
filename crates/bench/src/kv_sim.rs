//! `spindle kv sim`: the replicated store's failover (majority election,
//! lease, epochs) in the deterministic simulator, seed by seed
//! (the driver is `spindle_replica::failover_sim`).
//!
//! ```text
//! spindle kv sim --seeds 0..10000 --jobs 2 --json bench/results/kv-failover-sim.json
//! spindle kv sim --seed 42
//! ```
//!
//! Every seed draws a group (3–5 members, spares), clients, clock skews
//! and faults (crashes, pauses, cut links, an isolated master, heals);
//! each is checked for linearizability and for two masters answering at
//! once. The last line is always `N seeds, V violations`; the exit status
//! is non-zero when V > 0.

use std::io::Write;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Args;
use spindle_replica::failover_sim::{self, SimOutcome};

use crate::report::Machine;
use crate::sim::seed_range;

const JOBS_MAX: usize = 64;

#[derive(Args, Debug)]
pub struct KvSimArgs {
    /// Run this one seed (prints its plan and outcome).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run every seed in A..B (B excluded).
    #[arg(long, value_name = "A..B")]
    seeds: Option<String>,
    /// Threads running seeds at once.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Write a summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<std::path::PathBuf>,
}

#[derive(Default)]
struct Tally {
    seeds: u64,
    ops_ok: u64,
    ops_unanswered: u64,
    ops_refused: u64,
    elections: u64,
    rolls: u64,
    step_downs: u64,
    crashes: u64,
    failures: Vec<SimOutcome>,
}

impl Tally {
    fn add(&mut self, o: SimOutcome) {
        self.seeds += 1;
        self.ops_ok += o.ops_ok;
        self.ops_unanswered += o.ops_unanswered;
        self.ops_refused += o.ops_refused;
        self.elections += o.elections;
        self.rolls += o.rolls;
        self.step_downs += o.step_downs;
        self.crashes += o.crashes;
        if o.violation.is_some() {
            self.failures.push(o);
        }
    }
}

/// One seed, a panic of the engine reported as a violation.
fn run_seed(seed: u64) -> SimOutcome {
    std::panic::catch_unwind(|| failover_sim::run(seed)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        SimOutcome {
            seed,
            violation: Some(format!("panicked: {what}")),
            plan: format!("{:?}", failover_sim::plan(seed)),
            ..SimOutcome::default()
        }
    })
}

pub fn run(args: KvSimArgs) -> Result<(), String> {
    let seeds: Range<u64> = seed_range(args.seed, args.seeds.as_deref())?;
    if args.jobs == 0 || args.jobs > JOBS_MAX {
        return Err(format!("--jobs {} must be in 1..={JOBS_MAX}", args.jobs));
    }
    let started = Instant::now();
    std::panic::set_hook(Box::new(|_| {}));
    let next = AtomicU64::new(seeds.start);
    let tally = Mutex::new(Tally::default());
    std::thread::scope(|s| {
        for _ in 0..args.jobs {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end {
                    return;
                }
                let outcome = run_seed(seed);
                if args.seed.is_some() {
                    println!("seed {seed}: {outcome:?}");
                }
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                t.add(outcome);
                if t.seeds.is_multiple_of(2_000) {
                    eprintln!("{} seeds, {} violations so far", t.seeds, t.failures.len());
                }
            });
        }
    });
    let _ = std::panic::take_hook();
    let t = tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let seconds = started.elapsed().as_secs_f64();
    let mut failures: Vec<&SimOutcome> = t.failures.iter().collect();
    failures.sort_by_key(|o| o.seed);
    for f in &failures {
        println!(
            "VIOLATION seed {}: {}\n  plan: {}\n  replay: spindle kv sim --seed {}",
            f.seed,
            f.violation.as_deref().unwrap_or(""),
            f.plan,
            f.seed
        );
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "benchmark": "kv-failover-sim",
            "command": format!("spindle kv sim --seeds {}..{} --jobs {}", seeds.start, seeds.end, args.jobs),
            "machine": Machine::detect(),
            "seeds": t.seeds,
            "violations": t.failures.len(),
            "ops_answered": t.ops_ok,
            "ops_unanswered": t.ops_unanswered,
            "ops_refused": t.ops_refused,
            "elections": t.elections,
            "rolls": t.rolls,
            "step_downs": t.step_downs,
            "crashes": t.crashes,
            "seconds": seconds,
            "failures": failures.iter().map(|f| serde_json::json!({
                "seed": f.seed, "violation": f.violation, "plan": f.plan,
            })).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    println!(
        "{} operations answered, {} unanswered, {} refused; {} elections, {} rolls, {} masters stepped down, {} crashes; {:.1} s",
        t.ops_ok, t.ops_unanswered, t.ops_refused, t.elections, t.rolls, t.step_downs, t.crashes, seconds
    );
    println!("{} seeds, {} violations", t.seeds, t.failures.len());
    if !t.failures.is_empty() {
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
    Ok(())
}
