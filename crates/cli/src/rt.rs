//! `spindle rt …`: time-driven real-time channels (MPI/RT, the HARE
//! thesis's experiments), one process per member on shared memory.
//!
//! - `ring`: the 3-node ring (thesis §5.3, Table 5.1): missed and late
//!   counts, hop latency and jitter, dispatcher release jitter;
//! - `latency`: latency and jitter by message size, 8 B–4 KB (Figs 5.4–5.7);
//! - `compare`: best-effort vs time-based for several periods (Table 5.3);
//! - `clock`: global clock error and its reported bound over time.
//!
//! Every command prints a table, writes JSON with `--json FILE` and an SVG
//! plot with `--plot FILE`. Members are spawned from this executable with
//! the hidden `spindle rt member` subcommand.

use std::path::{Path, PathBuf};

use std::time::Duration;

use clap::{Args, Subcommand};
use plotters::prelude::*;
use serde::Serialize;
use spindle_rt::node::calibrate_release_jitter;
use spindle_rt::os::{drop_rt_priority, request_rt_privileges};
use spindle_rt::scenario::{
    run_member, ClockSample, MemberReport, NodeClockSpec, RunReport, Scenario, ScenarioSpec, StageSpec, Summary,
};

use crate::procs::{read_results, MemberProcesses};
use crate::report::Machine;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

#[derive(Subcommand, Debug)]
pub enum RtCommand {
    /// The thesis's 3-node ring (Table 5.1): zero-sided channels A→B→C→A.
    Ring(RingArgs),
    /// Latency and jitter of a time-driven channel by message size (8 B–4 KB).
    Latency(LatencyArgs),
    /// Best-effort vs time-based channels for several periods (Table 5.3).
    Compare(CompareArgs),
    /// Global clock: error against the true (injected) time, and the bound.
    Clock(ClockArgs),
    /// (internal) one member process of an rt run.
    #[command(hide = true)]
    Member {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        spec: String,
    },
}

/// Options every rt command shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Do not ask for SCHED_FIFO (to measure the dispatcher without it).
    #[arg(long)]
    pub no_fifo: bool,
    /// Spin this long before each release after sleeping (µs).
    #[arg(long, default_value_t = 100)]
    pub spin_us: u64,
    /// Clock error budget every node must stay within (µs); deadlines are
    /// shortened by it.
    #[arg(long, default_value_t = 10)]
    pub clock_budget_us: u64,
    /// Release-jitter calibration wake-ups per member (1 ms apart).
    #[arg(long, default_value_t = 1_000)]
    pub jitter_samples: usize,
    /// Declare the release jitter (µs) instead of using the calibrated maximum.
    #[arg(long)]
    pub declared_jitter_us: Option<u64>,
    /// Injected clock offsets per node (µs, comma-separated; node 0 is the master).
    #[arg(long, default_value = "0,1500,-800")]
    pub offset_us: String,
    /// Injected clock drifts per node (ppm, comma-separated).
    #[arg(long, default_value = "0,40,-25")]
    pub drift_ppm: String,
    /// Run even if admission rejects (the verdict is still reported).
    #[arg(long)]
    pub force: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

#[derive(Args, Debug, Clone)]
pub struct RingArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Round trips of the ring.
    #[arg(long, default_value_t = 5_000)]
    pub periods: u64,
    /// Message bytes (the thesis ran 4 and 1024).
    #[arg(long, default_value_t = 4)]
    pub size: usize,
    /// Period (µs). Default: 5000 for table-5.1; for `default`, chosen from
    /// this machine's measured release jitter (see --params).
    #[arg(long)]
    pub period_us: Option<u64>,
    /// Task parameters: `default` (every deadline = user compute + clock
    /// budget + 1.5 × the release jitter measured here, the period the
    /// 9 tasks then need, unless --period-us/--deadline-us are given) or
    /// `table-5.1` (the thesis's exact values; runs even if rejected).
    #[arg(long, default_value = "default")]
    pub params: String,
    /// Deadline of every task (µs) for `default` (default: the largest that fits).
    #[arg(long)]
    pub deadline_us: Option<u64>,
    /// Declared compute time of the user tasks (µs).
    #[arg(long, default_value_t = 50)]
    pub user_compute_us: u64,
}

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

pub fn run(command: RtCommand) -> Result<(), String> {
    match command {
        RtCommand::Ring(args) => ring(args),
        RtCommand::Latency(args) => latency(args),
        RtCommand::Compare(args) => compare(args),
        RtCommand::Clock(args) => clock(args),
        RtCommand::Member { rank, spec } => {
            let spec: ScenarioSpec = serde_json::from_str(&spec).map_err(|e| format!("--spec: {e}"))?;
            run_member(&spec, rank).map(|_| ())
        }
    }
}

// ───────────────────────────── arguments ─────────────────────────────

fn parse_list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("{flag}: '{x}' is not a valid number"))
        })
        .collect()
}

fn clocks_of(common: &CommonArgs, members: usize) -> Result<Vec<NodeClockSpec>, String> {
    let offsets: Vec<i64> = parse_list("--offset-us", &common.offset_us)?;
    let drifts: Vec<f64> = parse_list("--drift-ppm", &common.drift_ppm)?;
    if let Some(d) = drifts.iter().find(|d| d.abs() > 150.0) {
        return Err(format!(
            "--drift-ppm {d} is beyond ±150 ppm, outside the estimator's assumed tolerance"
        ));
    }
    Ok((0..members)
        .map(|n| NodeClockSpec {
            offset_ns: offsets.get(n).copied().unwrap_or(0) * US as i64,
            drift_ppb: (drifts.get(n).copied().unwrap_or(0.0) * 1_000.0) as i64,
            jumps: vec![],
        })
        .collect())
}

fn check_common(common: &CommonArgs) -> Result<(), String> {
    if common.clock_budget_us == 0 || common.clock_budget_us > 100_000 {
        return Err(format!(
            "--clock-budget-us {} must be in 1..=100000",
            common.clock_budget_us
        ));
    }
    if common.jitter_samples == 0 || common.jitter_samples > 100_000 {
        return Err(format!(
            "--jitter-samples {} must be in 1..=100000",
            common.jitter_samples
        ));
    }
    if common.spin_us > 10_000 {
        return Err(format!("--spin-us {} must be at most 10000", common.spin_us));
    }
    Ok(())
}

fn check_sizes(sizes: &[usize]) -> Result<(), String> {
    if sizes.is_empty() {
        return Err("--sizes: give at least one size".into());
    }
    if let Some(s) = sizes.iter().find(|s| **s < 8 || **s > 65_536) {
        return Err(format!(
            "--sizes: {s} must be in 8..=65536 (messages carry an 8-byte timestamp)"
        ));
    }
    Ok(())
}

fn base_spec(scenario: Scenario, common: &CommonArgs, members: usize) -> Result<ScenarioSpec, String> {
    check_common(common)?;
    let result_dir = std::env::temp_dir().join(format!(
        "spindle-rt-{}-{}",
        std::process::id(),
        spindle_sst::monotonic_ns()
    ));
    // Created by `run_members` (which removes it), so an argument error
    // found later leaves nothing behind.
    Ok(ScenarioSpec {
        scenario,
        group: format!("rt-{}", std::process::id()),
        members,
        period_ns: vec![],
        periods: 0,
        sizes: vec![],
        stages: vec![],
        wraps: false,
        clocks: clocks_of(common, members)?,
        clock_bound_budget_ns: common.clock_budget_us * US,
        jitter_samples: common.jitter_samples,
        release_jitter_declared_ns: common.declared_jitter_us.map(|j| j * US),
        spin_ns: common.spin_us * US,
        fifo: !common.no_fifo,
        force: common.force,
        lead_ns: 200 * MS,
        duration_ns: 0,
        sample_interval_ns: 10 * MS,
        seed: 1,
        start_mono_ns: spindle_sst::monotonic_ns(),
        result_dir,
        join_timeout_ms: 20_000,
        best_effort_quota: 2,
    })
}

fn stage(node: usize, kind: &str, offset_ns: u64, compute_ns: u64, deadline_ns: u64) -> StageSpec {
    StageSpec {
        node,
        kind: kind.into(),
        offset_ns,
        compute_ns,
        deadline_ns,
    }
}

/// A pipeline over `nodes` (user, send, recv, user, send, recv, …): each
/// stage starts at the previous one's deadline, plus twice the clock
/// budget between a send and its receive (the receiver's clock may be
/// ahead by the budget and the sender's behind by it).
fn pipeline(nodes: &[usize], wraps: bool, d_ns: u64, user_c_ns: u64, chan_c_ns: u64, eps_ns: u64) -> Vec<StageSpec> {
    let mut stages = Vec::new();
    let mut t = 0;
    for (i, &n) in nodes.iter().enumerate() {
        if i > 0 {
            stages.push(stage(n, "recv", t, chan_c_ns, d_ns));
            t += d_ns;
        }
        stages.push(stage(n, "user", t, user_c_ns, d_ns));
        t += d_ns;
        let last = i + 1 == nodes.len();
        if !last || wraps {
            stages.push(stage(n, "send", t, chan_c_ns, d_ns));
            t += d_ns + 2 * eps_ns;
        }
    }
    if wraps {
        stages.push(stage(nodes[0], "recv", t, chan_c_ns, d_ns));
    }
    stages
}

/// Length of a pipeline's schedule with deadline `d` (ns).
fn pipeline_span_ns(stages: &[StageSpec]) -> u64 {
    stages.iter().map(|s| s.offset_ns + s.deadline_ns).max().unwrap_or(0)
}

/// The largest deadline (a multiple of 25 µs) whose pipeline fits the period.
fn largest_deadline_ns(nodes: &[usize], wraps: bool, period_ns: u64, eps_ns: u64) -> u64 {
    let mut d = 25 * US;
    while pipeline_span_ns(&pipeline(nodes, wraps, d + 25 * US, 1, 1, eps_ns)) <= period_ns {
        d += 25 * US;
    }
    d
}

// ───────────────────────────── members ─────────────────────────────

/// Spawn one process per member, wait for all, read their reports, and
/// remove the result directory.
fn run_members(spec: &ScenarioSpec, timeout: Duration) -> Result<Vec<MemberReport>, String> {
    let dir = &spec.result_dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let result = spawn_and_wait(spec, timeout);
    let reports = result.and_then(|()| read_results(spec.members, |rank| MemberReport::path(&spec.result_dir, rank)));
    let _ = std::fs::remove_dir_all(&spec.result_dir);
    reports
}

fn spawn_and_wait(spec: &ScenarioSpec, timeout: Duration) -> Result<(), String> {
    let json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
    let procs = MemberProcesses::spawn(spec.members, |rank| {
        vec![
            "rt".into(),
            "member".into(),
            "--rank".into(),
            rank.to_string(),
            "--spec".into(),
            json.clone(),
        ]
    })?;
    // The others see the failed member's verdict or its absence and stop.
    let result = procs.wait(timeout, Duration::from_secs(5), Duration::from_millis(100), &mut || {});
    let failure = result.err();
    let shm = Path::new("/dev/shm").join(format!("spindle-{}", spec.group));
    if failure.is_some() && shm.exists() {
        // Members were killed: nobody removed the group file.
        let _ = std::fs::remove_file(&shm);
    }
    failure.map_or(Ok(()), Err)
}

/// Release jitter of this machine, measured here (with SCHED_FIFO when
/// asked and permitted) to choose default parameters.
fn calibrate_here(common: &CommonArgs) -> (Summary, String) {
    let (fifo, samples, spin) = (!common.no_fifo, common.jitter_samples.max(2_000), common.spin_us * US);
    std::thread::spawn(move || {
        let p = request_rt_privileges(fifo, 80, false);
        let j = calibrate_release_jitter(samples, MS, spin);
        drop_rt_priority();
        (Summary::of(&j), p.describe())
    })
    .join()
    .unwrap_or_default()
}

fn write_json<T: Serialize>(path: &Option<PathBuf>, value: &T) -> Result<(), String> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

fn unix_time_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

// ───────────────────────────── ring ─────────────────────────────

/// One task of a run, as printed and recorded.
#[derive(Debug, Clone, Serialize)]
struct TaskRow {
    node: usize,
    name: String,
    offset_ns: u64,
    period_ns: u64,
    compute_ns: u64,
    deadline_ns: u64,
}

#[derive(Debug, Clone, Serialize)]
struct NodeRow {
    node: usize,
    privileges: String,
    fifo_granted: bool,
    calibration_jitter_ns: Summary,
    admission: String,
    clock_bound_ns_at_commit: u64,
    app_missed: u64,
    user_jobs_missed: u64,
    missed_early: u64,
    overruns: u64,
    messages_moved: u64,
    messages_missing: u64,
    messages_torn: u64,
    release_jitter_ns: Summary,
    send_exec_ns: Summary,
    receive_exec_ns: Summary,
    clock_over_budget: u64,
    clock_bound_ns_max: u64,
    miss_log: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
struct RingReport {
    params: String,
    transport: String,
    periods: u64,
    size: usize,
    period_ns: u64,
    /// The application did not have its message when it ran (or its job was dropped).
    missed: u64,
    /// Jobs dropped at their critical start or finished after their deadline.
    late: u64,
    admitted: bool,
    verdicts: Vec<Option<String>>,
    /// Hop latency: a user inserts message k → the next node's user extracts it.
    latency_ns: Summary,
    /// |hop latency − that hop's median|.
    jitter_ns: Summary,
    /// Dispatcher wake-up lateness at releases, all nodes.
    release_jitter_ns: Summary,
    hop_latency_p50_ns: Vec<u64>,
    clock_bound_ns_max: u64,
    tasks: Vec<TaskRow>,
    nodes: Vec<NodeRow>,
    machine: Machine,
    unix_time_s: u64,
    command: String,
    #[serde(skip)]
    latency_series: Vec<(u64, u64)>,
}

/// Table 5.1 of the thesis: start times (µs) within a 5 ms period,
/// compute 50 µs and deadline 75 µs for every task.
fn table_5_1() -> Vec<StageSpec> {
    let rows = [
        (0, "user", 0),
        (0, "send", 75),
        (1, "recv", 125),
        (1, "user", 200),
        (1, "send", 275),
        (2, "recv", 325),
        (2, "user", 400),
        (2, "send", 475),
        (0, "recv", 525),
    ];
    rows.iter()
        .map(|&(n, k, off)| stage(n, k, off * US, 50 * US, 75 * US))
        .collect()
}

fn ring(args: RingArgs) -> Result<(), String> {
    if args.periods == 0 || args.periods > 1_000_000 {
        return Err(format!("--periods {} must be in 1..=1000000", args.periods));
    }
    if args.size == 0 || args.size > 65_536 {
        return Err(format!("--size {} must be in 1..=65536", args.size));
    }
    if let Some(p) = args.period_us.filter(|p| !(100..=10_000_000).contains(p)) {
        return Err(format!("--period-us {p} must be in 100..=10000000"));
    }
    let mut spec = base_spec(Scenario::Ring, &args.common, 3)?;
    let eps = spec.clock_bound_budget_ns;
    let (here, privileges) = calibrate_here(&args.common);
    let mut period_ns = args.period_us.unwrap_or(5_000) * US;
    let (stages, params, force) = match args.params.as_str() {
        "default" => {
            let jitter_ns = args.common.declared_jitter_us.map(|j| j * US).unwrap_or(here.max);
            let from_jitter = (args.user_compute_us * US + eps + jitter_ns * 3 / 2).next_multiple_of(100 * US);
            let d = match (args.deadline_us, args.period_us) {
                (Some(d), _) => d * US,
                (None, Some(_)) => largest_deadline_ns(&[0, 1, 2], true, period_ns, eps),
                (None, None) => from_jitter,
            };
            if args.period_us.is_none() {
                let span = pipeline_span_ns(&pipeline(&[0, 1, 2], true, d, 1, 1, eps));
                period_ns = span.next_multiple_of(MS).max(5 * MS);
            }
            let stages = pipeline(&[0, 1, 2], true, d, args.user_compute_us * US, 5 * US, eps);
            if pipeline_span_ns(&stages) > period_ns {
                return Err(format!(
                    "--deadline-us {}: the ring's 9 tasks need {} µs, more than the period of {} µs",
                    d / US,
                    pipeline_span_ns(&stages) / US,
                    period_ns / US
                ));
            }
            (stages, "default".to_string(), args.common.force)
        }
        "table-5.1" => (table_5_1(), "table-5.1".to_string(), true),
        other => return Err(format!("--params '{other}': expected default or table-5.1")),
    };
    spec.period_ns = vec![period_ns];
    spec.periods = args.periods;
    spec.sizes = vec![args.size];
    spec.stages = stages;
    spec.wraps = true;
    spec.force = force;
    println!(
        "spindle rt ring: 3 nodes on shm, {} periods of {} µs, {} B messages, params {params}{}",
        args.periods,
        period_ns / US,
        args.size,
        if force { " (runs even if admission rejects)" } else { "" }
    );
    println!(
        "this machine: release jitter p50 {} ns, p99 {} ns, max {} ns over {} wake-ups ({privileges})",
        here.p50, here.p99, here.max, here.samples
    );
    println!("task parameters (µs):");
    println!(
        "  {:<5} {:<6} {:>8} {:>8} {:>8} {:>8}",
        "node", "task", "start", "period", "compute", "deadline"
    );
    for s in &spec.stages {
        println!(
            "  {:<5} {:<6} {:>8} {:>8} {:>8} {:>8}",
            ["A", "B", "C"][s.node],
            s.kind,
            s.offset_ns / US,
            period_ns / US,
            s.compute_ns / US,
            s.deadline_ns / US
        );
    }
    let timeout = Duration::from_secs(args.common.timeout_s);
    let reports = run_members(&spec, timeout)?;
    let report = ring_report(&spec, &params, &reports);
    print_ring(&report);
    write_json(&args.common.json, &report)?;
    if let Some(path) = &args.common.plot {
        plot_ring(path, &report)?;
    }
    Ok(())
}

fn node_row(r: &MemberReport, run: &RunReport) -> NodeRow {
    NodeRow {
        node: r.rank,
        privileges: r.privileges.clone(),
        fifo_granted: r.fifo_granted,
        calibration_jitter_ns: r.calibration_jitter_ns,
        admission: run.admission.clone(),
        clock_bound_ns_at_commit: r.clock_bound_ns_at_commit,
        app_missed: run.app_missed,
        user_jobs_missed: run.user_jobs_missed,
        missed_early: run.missed_early,
        overruns: run.overruns,
        messages_moved: run.messages_moved,
        messages_missing: run.messages_missing,
        messages_torn: run.messages_torn,
        release_jitter_ns: run.release_jitter_ns,
        send_exec_ns: run.send_exec_ns,
        receive_exec_ns: run.receive_exec_ns,
        clock_over_budget: run.clock_over_budget,
        clock_bound_ns_max: run.clock_bound_ns_max,
        miss_log: run.miss_log.clone(),
    }
}

/// Merge summaries by taking the worst of each percentile (conservative).
fn worst(summaries: impl Iterator<Item = Summary>) -> Summary {
    summaries.fold(Summary::default(), |a, b| Summary {
        p50: a.p50.max(b.p50),
        p99: a.p99.max(b.p99),
        max: a.max.max(b.max),
        samples: a.samples + b.samples,
    })
}

/// Latencies of the hops `from → to` of a pipeline: extract[to][k] − insert[from][k].
fn hop_latencies(from: &RunReport, to: &RunReport) -> Vec<u64> {
    from.inserted_ns
        .iter()
        .zip(&to.extracted_ns)
        .filter(|(i, e)| **i > 0 && **e > 0)
        .map(|(i, e)| e.saturating_sub(*i))
        .collect()
}

fn jitter_of(latencies: &[u64]) -> Vec<u64> {
    let median = Summary::of(latencies).p50;
    latencies.iter().map(|l| l.abs_diff(median)).collect()
}

fn ring_report(spec: &ScenarioSpec, params: &str, reports: &[MemberReport]) -> RingReport {
    let runs: Vec<&RunReport> = reports.iter().map(|r| &r.runs[0]).collect();
    let (mut all, mut jitter, mut hop_p50, mut series) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for n in 0..3 {
        let hop = hop_latencies(runs[n], runs[(n + 1) % 3]);
        hop_p50.push(Summary::of(&hop).p50);
        jitter.extend(jitter_of(&hop));
        if n == 0 {
            series = hop.iter().enumerate().map(|(k, l)| (k as u64, *l)).collect();
        }
        all.extend(hop);
    }
    let tasks = reports
        .iter()
        .flat_map(|r| {
            r.runs[0].tasks.iter().map(move |(name, o, p, c, d)| TaskRow {
                node: r.rank,
                name: name.clone(),
                offset_ns: *o,
                period_ns: *p,
                compute_ns: *c,
                deadline_ns: *d,
            })
        })
        .collect();
    RingReport {
        params: params.to_string(),
        transport: "shm".into(),
        periods: spec.periods,
        size: spec.sizes[0],
        period_ns: spec.period_ns[0],
        missed: runs.iter().map(|r| r.app_missed + r.user_jobs_missed).sum(),
        late: runs.iter().map(|r| r.missed_early + r.overruns).sum(),
        admitted: runs[0].verdicts.iter().all(|v| v.is_none()),
        verdicts: runs[0].verdicts.clone(),
        latency_ns: Summary::of(&all),
        jitter_ns: Summary::of(&jitter),
        release_jitter_ns: worst(runs.iter().map(|r| r.release_jitter_ns)),
        hop_latency_p50_ns: hop_p50,
        clock_bound_ns_max: runs.iter().map(|r| r.clock_bound_ns_max).max().unwrap_or(0),
        tasks,
        nodes: reports.iter().map(|r| node_row(r, &r.runs[0])).collect(),
        machine: Machine::detect(),
        unix_time_s: unix_time_s(),
        command: command_line(),
        latency_series: series,
    }
}

fn print_ring(r: &RingReport) {
    println!(
        "admission: {}",
        if r.admitted {
            "accepted on every node".to_string()
        } else {
            "REJECTED".to_string()
        }
    );
    for (n, v) in r.verdicts.iter().enumerate() {
        if let Some(v) = v {
            println!("  node {}: {v}", ["A", "B", "C"][n]);
        }
    }
    println!(
        "{:>4} {:>6} {:>9} {:>8} {:>8} {:>9} {:>9} {:>12} {:>12}  scheduler",
        "node", "moved", "app miss", "dropped", "overrun", "no msg", "torn", "rel jit p99", "rel jit max"
    );
    for n in &r.nodes {
        println!(
            "{:>4} {:>6} {:>9} {:>8} {:>8} {:>9} {:>9} {:>12} {:>12}  {}",
            ["A", "B", "C"][n.node],
            n.messages_moved,
            n.app_missed + n.user_jobs_missed,
            n.missed_early,
            n.overruns,
            n.messages_missing,
            n.messages_torn,
            n.release_jitter_ns.p99,
            n.release_jitter_ns.max,
            if n.fifo_granted {
                "SCHED_FIFO"
            } else {
                "normal (no SCHED_FIFO)"
            }
        );
    }
    println!(
        "periods {}  missed {}  late {}  (messages the application did not have / jobs dropped or overrun)",
        r.periods, r.missed, r.late
    );
    println!(
        "hop latency (ns): p50 {} p99 {} max {}   jitter: p50 {} p99 {} max {}",
        r.latency_ns.p50, r.latency_ns.p99, r.latency_ns.max, r.jitter_ns.p50, r.jitter_ns.p99, r.jitter_ns.max
    );
    println!(
        "release jitter (ns, worst node): p50 {} p99 {} max {}; clock bound max {} ns",
        r.release_jitter_ns.p50, r.release_jitter_ns.p99, r.release_jitter_ns.max, r.clock_bound_ns_max
    );
    for n in &r.nodes {
        for line in n.miss_log.iter().take(5) {
            println!("  miss: {line}");
        }
    }
}

// ───────────────────────────── latency ─────────────────────────────

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

fn latency(args: LatencyArgs) -> Result<(), String> {
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
        "spindle rt latency: 2 nodes on shm, {} messages per size, period {} µs, deadlines {} µs",
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
                late: s.missed_early + s.overruns + r.missed_early + r.overruns,
            }
        })
        .collect();
    let report = LatencyReport {
        transport: "shm".into(),
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
            "spindle rt latency: time-driven channel on shm, period {} µs ({})",
            args.period_us, report.machine.cpu_model
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

// ───────────────────────────── compare ─────────────────────────────

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

fn compare(args: CompareArgs) -> Result<(), String> {
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
            late: s.missed_early + s.overruns + r.missed_early + r.overruns,
        });
    }
    println!(
        "{:>7} {:>6} │ {:>9} {:>9} {:>9} │ {:>9} {:>9} {:>9} │ {:>4}",
        "period", "bytes", "TB p50", "TB p99", "TB max", "BE p50", "BE p99", "BE max", "late"
    );
    for r in &rows {
        println!(
            "{:>7} {:>6} │ {:>9} {:>9} {:>9} │ {:>9} {:>9} {:>9} │ {:>4}",
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
        transport: "shm".into(),
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
            "spindle rt compare: latency vs period on shm ({})",
            report.machine.cpu_model
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

// ───────────────────────────── clock ─────────────────────────────

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

fn clock(args: ClockArgs) -> Result<(), String> {
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
        "spindle rt clock: {} members on shm, master = node 0, {} s, a sample every {} ms",
        args.members, args.duration_s, args.sample_ms
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
        transport: "shm".into(),
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
            "spindle rt clock: {} members on shm ({})",
            args.members, report.machine.cpu_model
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

// ───────────────────────────── plots ─────────────────────────────

type Series = Vec<(String, Vec<(f64, f64)>)>;

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x2b, 0x6c, 0xb0),
    RGBColor(0xdd, 0x6b, 0x20),
    RGBColor(0x38, 0xa1, 0x69),
    RGBColor(0x80, 0x5a, 0xd5),
    RGBColor(0xc5, 0x30, 0x30),
    RGBColor(0x71, 0x80, 0x96),
];

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Two line charts side by side; `log2_x` plots x on a log2 scale.
fn two_panel_plot(
    path: &Path,
    title: &str,
    left: (&str, &Series),
    right: (&str, &Series),
    log2_x: bool,
) -> Result<(), String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let body = root.titled(title, ("sans-serif", 18).into_font()).map_err(err)?;
        let (l, r) = body.split_horizontally(600);
        line_chart(&l, left.0, left.1, log2_x)?;
        line_chart(&r, right.0, right.1, log2_x)?;
        root.present().map_err(err)?;
    }
    std::fs::write(path, svg).map_err(|e| format!("plot {}: {e}", path.display()))?;
    println!("plot written to {}", path.display());
    Ok(())
}

fn line_chart(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    series: &Series,
    log2_x: bool,
) -> Result<(), String> {
    let tx = |x: f64| if log2_x { x.max(1.0).log2() } else { x };
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.1).max(0.5);
    let (y0, y1) = (y0.min(0.0) - if y0 < 0.0 { pad } else { 0.0 }, y1 + pad);
    let x1 = if x1 <= x0 { x0 + 1.0 } else { x1 };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| {
            if log2_x {
                format!("{:.0}", 2f64.powf(*x))
            } else {
                format!("{x:.1}")
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mapped: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (tx(x), y)).collect();
        chart
            .draw_series(LineSeries::new(mapped.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        if mapped.len() <= 64 {
            chart
                .draw_series(mapped.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn plot_ring(path: &Path, r: &RingReport) -> Result<(), String> {
    let left = vec![(
        "hop A→B latency".to_string(),
        r.latency_series
            .iter()
            .map(|&(k, l)| (k as f64, l as f64 / 1_000.0))
            .collect(),
    )];
    let per_node = |f: &dyn Fn(&NodeRow) -> Summary| -> Series {
        ["p50", "p99", "max"]
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let pts = r
                    .nodes
                    .iter()
                    .map(|n| {
                        let s = f(n);
                        (n.node as f64, [s.p50, s.p99, s.max][i] as f64 / 1_000.0)
                    })
                    .collect();
                (format!("release jitter {q}"), pts)
            })
            .collect()
    };
    let right = per_node(&|n| n.release_jitter_ns);
    let title = format!(
        "spindle rt ring ({}): {} periods of {} µs, {} B: missed {}, late {} ({})",
        r.params,
        r.periods,
        r.period_ns / US,
        r.size,
        r.missed,
        r.late,
        r.machine.cpu_model
    );
    two_panel_plot(
        path,
        &title,
        ("hop latency (µs) by message number", &left),
        ("dispatcher release jitter (µs) by node (0=A, 1=B, 2=C)", &right),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ring_pipeline_matches_the_table_5_1_shape_and_fits_the_period() {
        let eps = 10 * US;
        let d = largest_deadline_ns(&[0, 1, 2], true, 5 * MS, eps);
        let stages = pipeline(&[0, 1, 2], true, d, 50 * US, 5 * US, eps);
        let kinds: Vec<&str> = stages.iter().map(|s| s.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["user", "send", "recv", "user", "send", "recv", "user", "send", "recv"]
        );
        let nodes: Vec<usize> = stages.iter().map(|s| s.node).collect();
        assert_eq!(nodes, [0, 0, 1, 1, 1, 2, 2, 2, 0]);
        assert!(pipeline_span_ns(&stages) <= 5 * MS);
        assert!(pipeline_span_ns(&pipeline(&[0, 1, 2], true, d + 25 * US, 1, 1, eps)) > 5 * MS);
        // Each receive starts after its send's deadline plus twice the clock budget.
        assert_eq!(stages[2].offset_ns, stages[1].offset_ns + d + 2 * eps);
    }

    #[test]
    fn table_5_1_has_the_thesis_values() {
        let t = table_5_1();
        let offsets: Vec<u64> = t.iter().map(|s| s.offset_ns / US).collect();
        assert_eq!(offsets, [0, 75, 125, 200, 275, 325, 400, 475, 525]);
        assert!(t.iter().all(|s| s.compute_ns == 50 * US && s.deadline_ns == 75 * US));
    }

    #[test]
    fn bad_lists_name_the_flag_and_value() {
        let e = parse_list::<u64>("--sizes", "8,x").unwrap_err();
        assert!(e.contains("--sizes") && e.contains("'x'"), "{e}");
        assert!(check_sizes(&[4]).unwrap_err().contains('4'));
    }

    #[test]
    fn hop_latency_pairs_inserts_with_extracts() {
        let from = RunReport {
            inserted_ns: vec![100, 0, 300],
            ..RunReport::default()
        };
        let to = RunReport {
            extracted_ns: vec![150, 250, 0],
            ..RunReport::default()
        };
        assert_eq!(hop_latencies(&from, &to), vec![50]);
        assert_eq!(jitter_of(&[10, 12, 20]), vec![2, 0, 8]);
    }
}
