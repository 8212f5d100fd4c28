//! `spindle sim`: deterministic simulation with fault injection and
//! invariant checking (the driver is `spindle_group::invariants::simulation`).
//!
//! ```text
//! spindle sim --seed 7 --members 3 --steps 500 --faults crash --trace
//! spindle sim --seeds 0..2000 --jobs 2 --json bench/results/sim-seeds.json
//! ```
//!
//! Every seed draws its group shape, workload, network and faults; the
//! invariants are checked after every step. A failing seed prints the
//! broken property, the plan, the last scheduler events and the command
//! line that replays it. The last line is always `N seeds, V violations`;
//! the exit status is non-zero when V > 0.

use std::io::Write;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Args;
use spindle_fabric::sim::Sabotage;
use spindle_group::invariants::simulation::{self, FaultClass, SimReport, SimSpec};

/// Largest group the simulator runs (every member has a copy of every row).
const MEMBERS_MAX: usize = 16;
const STEPS_MAX: u64 = 10_000_000;
const JOBS_MAX: usize = 64;
/// Scheduler events shown for a failing seed.
const TRACE_SHOWN: usize = 40;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run every seed in A..B (B excluded).
    #[arg(long, value_name = "A..B")]
    seeds: Option<String>,
    /// Members of the simulated group.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Steps with the workload running (a bounded drain follows).
    #[arg(long, default_value_t = 400)]
    steps: u64,
    /// Faults to draw: none, delays, crash, partition, churn (a join and a leave) or all.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Print every scheduler event of the run (with --seed).
    #[arg(long)]
    trace: bool,
    /// Threads running seeds at once.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Write a summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<std::path::PathBuf>,
    /// Break the fabric on purpose (reorder or corrupt) to see a failure report.
    #[arg(long, hide = true)]
    sabotage: Option<String>,
    /// Per mille of reservations the application abandons (skip slots).
    #[arg(long, default_value_t = 20, value_name = "PER_MILLE")]
    abandon: u64,
}

struct Validated {
    seeds: Range<u64>,
    spec: SimSpec,
    jobs: usize,
}

fn validate(args: &SimArgs) -> Result<Validated, String> {
    let seeds = seed_range(args.seed, args.seeds.as_deref())?;
    if args.members == 0 || args.members > MEMBERS_MAX {
        return Err(format!("--members {} must be in 1..={MEMBERS_MAX}", args.members));
    }
    if args.steps == 0 || args.steps > STEPS_MAX {
        return Err(format!("--steps {} must be in 1..={STEPS_MAX}", args.steps));
    }
    if args.jobs == 0 || args.jobs > JOBS_MAX {
        return Err(format!("--jobs {} must be in 1..={JOBS_MAX}", args.jobs));
    }
    if args.trace && seeds.end - seeds.start != 1 {
        return Err("--trace prints one run: use it with --seed".into());
    }
    let faults = FaultClass::parse(&args.faults)?;
    let sabotage = match args.sabotage.as_deref() {
        None => None,
        Some("reorder") => Some(Sabotage::ReorderPushes),
        Some("corrupt") => Some(Sabotage::CorruptBytes),
        Some(other) => return Err(format!("unknown sabotage '{other}': expected reorder or corrupt")),
    };
    if args.abandon > 1000 {
        return Err(format!("--abandon {} must be in 0..=1000 (per mille)", args.abandon));
    }
    let mut spec = SimSpec::new(seeds.start, args.members, args.steps, faults);
    spec.sabotage = sabotage;
    spec.abandon_per_mille = args.abandon;
    spec.trace_events_max = if args.trace { 1 << 22 } else { TRACE_SHOWN };
    Ok(Validated {
        seeds,
        spec,
        jobs: args.jobs,
    })
}

/// `A..B` with A < B.
/// The seeds of `--seed S` (one) or `--seeds A..B`; seed 0 without either.
pub(crate) fn seed_range(seed: Option<u64>, seeds: Option<&str>) -> Result<Range<u64>, String> {
    match (seed, seeds) {
        (Some(s), None) => Ok(s..s.checked_add(1).ok_or("--seed must be below 2^64 - 1")?),
        (None, Some(range)) => parse_seeds(range),
        (None, None) => Ok(0..1),
        (Some(_), Some(_)) => Err("give --seed or --seeds, not both".into()),
    }
}

fn parse_seeds(text: &str) -> Result<Range<u64>, String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("--seeds '{text}': expected A..B, for example 0..1000"))?;
    let parse = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("--seeds '{text}': '{s}' is not a whole number"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a >= b {
        return Err(format!("--seeds {a}..{b} is empty: A must be below B"));
    }
    Ok(a..b)
}

/// What a batch of seeds found.
#[derive(Default)]
struct Tally {
    seeds: u64,
    failures: Vec<SimReport>,
    lost_runs: u64,
    complete_runs: u64,
    /// Runs per delivery mode the plans drew (ordered, unordered, persistent).
    mode_runs: std::collections::BTreeMap<&'static str, u64>,
    /// Runs whose plan drew large messages; large messages sent and cut.
    large_runs: u64,
    large_sent: u64,
    large_cut: u64,
    /// Runs with large messages where some member took them in place
    /// (fragment by fragment); the large messages sent and cut in them.
    in_place_runs: u64,
    in_place_sent: u64,
    in_place_cut: u64,
    /// Persistent runs whose plan compacts the logs; compactions checked.
    compacting_runs: u64,
    log_compactions: u64,
    /// Persistent runs killed whole and restarted from their logs: the
    /// messages delivered before each failure (every one checked to be in
    /// every restarted member's history), the histories rebuilt, the
    /// snapshots restored, the torn log tails dropped, the members left out.
    restarts: u64,
    restart_delivered_before: u64,
    restart_history_messages: u64,
    restart_snapshots_restored: u64,
    restart_torn_tails_dropped: u64,
    restart_members_excluded: u64,
    restart_members_rejoined: u64,
    /// Of those, the ones admitted that delivered in the restarted group.
    restart_rejoined_delivered: u64,
    /// Restarts refused: the history may go on in logs that take no part
    /// (`PlanError::HistoryElsewhere`), or every log of the last view was
    /// lost with its member.
    restarts_refused: u64,
    /// Subgroup layouts checked (member × view) and inadequate views.
    layouts_checked: u64,
    layouts_inadequate: u64,
    /// Runs whose group followed an outer view (a shard following the
    /// top-level group), the members that view left out, and the views
    /// they installed that kept no majority of the view before (which
    /// the group could not have installed deciding alone).
    follow_runs: u64,
    follow_members_left_out: u64,
    follow_views_below_majority: u64,
    sent: u64,
    delivered: u64,
    steps: u64,
    events: u64,
}

impl Tally {
    fn add(&mut self, report: SimReport) {
        self.seeds += 1;
        self.sent += report.sent;
        self.delivered += report.delivered.iter().sum::<u64>();
        self.steps += report.steps_run;
        self.events += report.events;
        *self.mode_runs.entry(report.plan.mode.as_str()).or_default() += 1;
        self.large_runs += (report.plan.large_per_mille > 0) as u64;
        self.large_sent += report.large_sent;
        self.large_cut += report.large_cut;
        if report.plan.large_per_mille > 0 && report.plan.large_in_place_members != 0 {
            self.in_place_runs += 1;
            self.in_place_sent += report.large_sent;
            self.in_place_cut += report.large_cut;
        }
        self.compacting_runs += (report.plan.compact_log_bytes > 0) as u64;
        self.log_compactions += report.log_compactions;
        if let Some(r) = &report.restart {
            self.restarts += 1;
            self.restarts_refused += r.refused.is_some() as u64;
            self.restart_delivered_before += r.delivered_before;
            self.restart_history_messages += r.history_messages;
            self.restart_snapshots_restored += r.snapshots_restored;
            self.restart_torn_tails_dropped += r.torn_tails_dropped;
            self.restart_members_excluded += r.excluded.len() as u64;
            self.restart_members_rejoined += r.rejoined.len() as u64;
            self.restart_rejoined_delivered += r
                .rejoined
                .iter()
                .filter(|m| {
                    report
                        .logs
                        .get(m)
                        .is_some_and(|l| l.iter().any(|e| e.view > r.first_view))
                })
                .count() as u64;
        }
        self.layouts_checked += report.layouts_checked;
        self.layouts_inadequate += report.layouts_inadequate;
        if report.plan.follow_outer_lag_steps.is_some() {
            self.follow_runs += 1;
            self.follow_members_left_out += report.lost_members() as u64;
            let views: std::collections::BTreeMap<u64, &Vec<usize>> = report
                .view_logs
                .values()
                .flatten()
                .map(|e| (e.view, &e.members))
                .collect();
            self.follow_views_below_majority += views
                .values()
                .zip(views.values().skip(1))
                .filter(|(before, after)| {
                    let kept = after.iter().filter(|m| before.contains(m)).count();
                    kept * 2 <= before.len()
                })
                .count() as u64;
        }
        if report.lost_members() > 0 {
            self.lost_runs += 1;
        } else {
            self.complete_runs += 1;
        }
        if report.failure.is_some() {
            self.failures.push(report);
        }
    }
}

pub fn run(args: SimArgs) -> Result<(), String> {
    let v = validate(&args)?;
    let started = Instant::now();
    // A protocol assertion is reported with its seed, not as a panic trace.
    std::panic::set_hook(Box::new(|_| {}));
    let tally = if args.trace {
        let report = simulation::run(&v.spec);
        for line in &report.trace {
            println!("{line}");
        }
        print_outcome(&report);
        let mut t = Tally::default();
        t.add(report);
        t
    } else {
        run_seeds(&v)
    };
    let _ = std::panic::take_hook();
    let seconds = started.elapsed().as_secs_f64();
    let mut failures = tally.failures.iter().collect::<Vec<_>>();
    failures.sort_by_key(|r| r.spec.seed);
    for report in &failures {
        print_failure(report);
    }
    if let Some(path) = &args.json {
        write_json(path, &args, &v, &tally, seconds)?;
    }
    println!(
        "ran {} steps, {} messages sent, {} deliveries checked, {} runs lost a member, {} ran to completion, {:.1} s",
        tally.steps, tally.sent, tally.delivered, tally.lost_runs, tally.complete_runs, seconds
    );
    println!(
        "subgroup layouts checked at every view change: {} (member × view), {} views too small for their drawn subgroups",
        tally.layouts_checked, tally.layouts_inadequate
    );
    println!(
        "large messages: {} sent in {} runs, {} cut by a view change; in place (fragment by fragment, at some members): \
         {} sent in {} runs, {} cut",
        tally.large_sent, tally.large_runs, tally.large_cut, tally.in_place_sent, tally.in_place_runs, tally.in_place_cut
    );
    println!(
        "persistent log compactions checked: {} in {} runs",
        tally.log_compactions, tally.compacting_runs
    );
    println!(
        "following an outer view (a shard following the top-level group): {} runs, {} members crashed or left out by it, \
         {} views keeping no majority of the view before (allowed by the outer view's majority)",
        tally.follow_runs, tally.follow_members_left_out, tally.follow_views_below_majority
    );
    println!(
        "total failures (every member killed, restarted from its log): {} runs, {} of them refused (the history may be \
         in logs of members that joined a running group, or the last view's logs were lost); {} messages delivered before them, \
         each found in every restarted member's history; {} snapshots restored, {} torn log tails dropped, {} members left out \
         ({} joined the restarted group afresh, {} of them admitted and delivering)",
        tally.restarts,
        tally.restarts_refused,
        tally.restart_delivered_before,
        tally.restart_snapshots_restored,
        tally.restart_torn_tails_dropped,
        tally.restart_members_excluded,
        tally.restart_members_rejoined,
        tally.restart_rejoined_delivered
    );
    println!("{} seeds, {} violations", tally.seeds, tally.failures.len());
    if !tally.failures.is_empty() {
        // The summary above must stay the last line: exit here rather than
        // return an error that main would print after it.
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
    Ok(())
}

fn run_seeds(v: &Validated) -> Tally {
    let next = AtomicU64::new(v.seeds.start);
    let tally = Mutex::new(Tally::default());
    let progress = v.seeds.end - v.seeds.start >= 1000;
    std::thread::scope(|s| {
        for _ in 0..v.jobs {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= v.seeds.end {
                    return;
                }
                let mut spec = v.spec.clone();
                spec.seed = seed;
                let report = simulation::run(&spec);
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                t.add(report);
                if progress && t.seeds.is_multiple_of(10_000) {
                    eprintln!("{} seeds, {} violations so far", t.seeds, t.failures.len());
                }
            });
        }
    });
    tally.into_inner().unwrap_or_else(|p| p.into_inner())
}

fn print_outcome(report: &SimReport) {
    println!(
        "seed {}: {} steps, {} sent, delivered {:?}, ends {:?}, trace digest {:016x}",
        report.spec.seed, report.steps_run, report.sent, report.delivered, report.ends, report.trace_digest
    );
    if let Some((r, why)) = report.restart.as_ref().and_then(|r| Some((r, r.refused.as_deref()?))) {
        println!("  total failure at step {}: restart refused: {why}", r.at_step);
    } else if let Some(r) = &report.restart {
        println!(
            "  total failure at step {}: restarted in view {} with members {:?} ({} left out: {:?}; joined afresh: {:?}); \
             {} messages delivered before it, all in the rebuilt history of {} messages",
            r.at_step,
            r.first_view,
            r.members,
            r.excluded.len(),
            r.excluded,
            r.rejoined,
            r.delivered_before,
            r.history_messages
        );
    }
}

fn print_failure(report: &SimReport) {
    let Some(f) = &report.failure else { return };
    println!(
        "VIOLATION seed {} at step {}: {} violated: {}",
        report.spec.seed, f.step, f.property, f.detail
    );
    println!("  plan: {}", report.plan.summary());
    println!("  members: delivered {:?}, ends {:?}", report.delivered, report.ends);
    println!("  last {} scheduler events:", report.trace.len());
    for line in &report.trace {
        println!("    {line}");
    }
    println!("  replay: {} --trace", report.spec.command_line());
}

fn write_json(path: &std::path::Path, args: &SimArgs, v: &Validated, t: &Tally, seconds: f64) -> Result<(), String> {
    let failures: Vec<_> = t
        .failures
        .iter()
        .map(|r| {
            let f = r.failure.as_ref().expect("a failure");
            serde_json::json!({
                "seed": r.spec.seed, "step": f.step, "property": f.property, "detail": f.detail,
                "replay": r.spec.command_line(),
            })
        })
        .collect();
    let doc = serde_json::json!({
        "command": format!(
            "spindle sim --seeds {}..{} --members {} --steps {} --faults {} --abandon {} --jobs {}",
            v.seeds.start, v.seeds.end, args.members, args.steps, args.faults, args.abandon, args.jobs
        ),
        "seeds": t.seeds,
        "violations": t.failures.len(),
        "runs_that_lost_a_member": t.lost_runs,
        "runs_to_completion": t.complete_runs,
        "runs_by_mode": t.mode_runs,
        "runs_with_large_messages": t.large_runs,
        "large_messages_sent": t.large_sent,
        "large_messages_cut_by_a_view_change": t.large_cut,
        "runs_taking_large_messages_in_place": t.in_place_runs,
        "large_messages_sent_taken_in_place": t.in_place_sent,
        "large_messages_cut_taken_in_place": t.in_place_cut,
        "runs_compacting_their_logs": t.compacting_runs,
        "log_compactions_checked": t.log_compactions,
        "total_failure_restarts": t.restarts,
        "total_failure_restarts_refused": t.restarts_refused,
        "restart_messages_delivered_before": t.restart_delivered_before,
        "restart_history_messages": t.restart_history_messages,
        "restart_snapshots_restored": t.restart_snapshots_restored,
        "restart_torn_tails_dropped": t.restart_torn_tails_dropped,
        "restart_members_excluded": t.restart_members_excluded,
        "restart_members_rejoined_afresh": t.restart_members_rejoined,
        "restart_rejoined_members_delivering": t.restart_rejoined_delivered,
        "subgroup_layouts_checked": t.layouts_checked,
        "subgroup_views_inadequate": t.layouts_inadequate,
        "runs_following_an_outer_view": t.follow_runs,
        "members_left_out_by_the_outer_view": t.follow_members_left_out,
        "views_below_majority_following_the_outer_view": t.follow_views_below_majority,
        "steps": t.steps,
        "messages_sent": t.sent,
        "deliveries_checked": t.delivered,
        "scheduler_events": t.events,
        "seconds": (seconds * 10.0).round() / 10.0,
        "failures": failures,
        "machine": machine(),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    format!("{model}, {cpus} cpus available")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut SimArgs)) -> SimArgs {
        let mut a = SimArgs {
            seed: None,
            seeds: None,
            members: 3,
            steps: 100,
            faults: "all".into(),
            trace: false,
            jobs: 1,
            json: None,
            sabotage: None,
            abandon: 0,
        };
        f(&mut a);
        a
    }

    #[test]
    fn bad_arguments_are_named() {
        let err = |a: SimArgs| validate(&a).err().expect("refused");
        assert!(err(args(|a| a.seeds = Some("5..2".into()))).contains("5..2 is empty"));
        assert!(err(args(|a| a.seeds = Some("x..2".into()))).contains("'x' is not a whole number"));
        assert!(err(args(|a| a.seeds = Some("7".into()))).contains("expected A..B"));
        assert!(err(args(|a| a.members = 0)).contains("--members 0"));
        assert!(err(args(|a| a.steps = 0)).contains("--steps 0"));
        assert!(err(args(|a| a.faults = "boom".into())).contains("'boom'"));
        assert!(err(args(|a| a.jobs = 0)).contains("--jobs 0"));
        assert!(err(args(|a| a.abandon = 1001)).contains("--abandon 1001"));
        assert!(err(args(|a| {
            a.trace = true;
            a.seeds = Some("0..2".into());
        }))
        .contains("--trace"));
        assert!(validate(&args(|a| a.seeds = Some("0..10".into()))).is_ok());
    }
}
