//! `spindle rt ring`: the thesis's 3-node ring (§5.3, Table 5.1).

use std::path::Path;
use std::time::Duration;

use crate::rt::scenario::{MemberReport, RunReport, Scenario, ScenarioSpec, StageSpec, Summary};
use clap::Args;
use serde::Serialize;

use super::common::*;
use super::plot::{two_panel_plot, Series};
use super::{host_record, CommonArgs, MS, US};
use crate::report::Machine;
use spindle_rt::node::CALIBRATION_NS_MAX;

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
    /// budget + 3 × (release jitter + interference) measured here over
    /// --calibration-ms, the period the 9 tasks then need, unless
    /// --period-us/--deadline-us are given) or `table-5.1` (the thesis's
    /// exact values; runs even if rejected).
    #[arg(long, default_value = "default")]
    pub params: String,
    /// Deadline of every task (µs) for `default` (default: the largest that fits).
    #[arg(long)]
    pub deadline_us: Option<u64>,
    /// Declared compute time of the user tasks (µs).
    #[arg(long, default_value_t = 50)]
    pub user_compute_us: u64,
    /// While this host's record (--host-record) holds less than this many
    /// seconds of observation, the launcher first calibrates until it does
    /// (at most this long): stalls that come once a minute are not seen in
    /// 5 s. 0: never (then a new host's first run may be admitted on a
    /// calibration that missed them).
    #[arg(long, default_value_t = 60)]
    pub host_warmup_s: u64,
}

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
struct RingReport {
    params: String,
    transport: String,
    periods: u64,
    size: usize,
    period_ns: u64,
    /// `worst-case` or `statistical`, and the miss budget (0: worst case).
    admission_mode: String,
    miss_budget: f64,
    /// Percent of the interference admission charged (100: as measured).
    interference_headroom_pct: u32,
    /// `rejected at commit`, or `ran`.
    outcome: String,
    /// Why admission rejected the set at commit (node, task, the bound it
    /// needed, the interference measured); nothing ran.
    rejected_at_commit: Option<String>,
    /// Jobs released on all nodes, and (missed + late) / jobs.
    jobs: u64,
    miss_rate: f64,
    /// Statistical admission: whether the miss rate stayed within the budget.
    within_budget: Option<bool>,
    /// Some node saw more interference during the run than admission assumed.
    interference_exceeded: bool,
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

pub(super) fn ring(args: RingArgs) -> Result<(), String> {
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
    let here_ns = launcher_calibration_ns(&args, &spec)?;
    let here = calibrate_here(&args.common, &spec, here_ns)?;
    // The launcher's calibration (a new host's warm-up) is in the record
    // now: the members' admission takes at least it too, not only what the
    // record held before it.
    if let Some(path) = &spec.host_record {
        let (jitter_ns, interference_ns) = host_record::load(path, &host_record::hostname())?.floor(spec.admission);
        spec.release_jitter_recorded_ns = jitter_ns;
        spec.interference_recorded_ns = interference_ns;
    }
    let mut period_ns = args.period_us.unwrap_or(5_000) * US;
    let (stages, params, force) = match args.params.as_str() {
        "default" => {
            let jitter_ns = args
                .common
                .declared_jitter_us
                .map(|j| j * US)
                .unwrap_or(here.jitter_margin_ns);
            let interference_ns = args
                .common
                .declared_interference_us
                .map(|i| i * US)
                .unwrap_or(here.interference_margin_ns);
            // Deadlines that absorb three times the worst this host has
            // shown; with no period or deadline given, admission charges
            // that headroom too (`--interference-headroom-pct`, default 300
            // here): the worst seen is a lower bound of the host's worst (on
            // the VM this was built on, a run stalled 6.8 ms after 25
            // minutes of observation had seen at most 5.4 ms), so the
            // defaults are admitted only where they leave that much room.
            let from_host = (args.user_compute_us * US + eps + DEFAULT_HEADROOM * (jitter_ns + interference_ns))
                .next_multiple_of(100 * US);
            // Bounded: a host that stalled for tens of ms would otherwise ask
            // for a period of seconds; the members' admission then judges
            // the largest deadline that fits the longest default period.
            let d = match (args.deadline_us, args.period_us) {
                (Some(d), _) => d * US,
                (None, Some(_)) => largest_deadline_ns(&[0, 1, 2], true, period_ns, eps),
                (None, None) => from_host.min(largest_deadline_ns(&[0, 1, 2], true, DEFAULT_PERIOD_MAX_NS, eps)),
            };
            if args.deadline_us.is_none() && args.period_us.is_none() {
                spec.interference_headroom_pct = args
                    .common
                    .interference_headroom_pct
                    .unwrap_or(DEFAULT_HEADROOM as u32 * 100);
            }
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
        "spindle rt ring: 3 nodes on {}, {} periods of {} µs, {} B messages, params {params}{}",
        transport_label(&spec),
        args.periods,
        period_ns / US,
        args.size,
        if force { " (runs even if admission rejects)" } else { "" }
    );
    println!(
        "this machine ({:.1} s, {} wake-ups): release jitter p50 {} ns, p99 {} ns, max {} ns; interference (time lost per wake-up and probe) p50 {} ns, p99 {} ns, max {} ns ({})",
        here.duration_ns as f64 / 1e9,
        here.jitter.samples,
        here.jitter.p50,
        here.jitter.p99,
        here.jitter.max,
        here.lost.p50,
        here.lost.p99,
        here.lost.max,
        here.text
    );
    println!(
        "admission: {}{}; each member calibrates its own host for {} ms first",
        spec.admission.describe(),
        if spec.interference_headroom_pct > 100 {
            format!(
                ", charging {}% of the interference (headroom for stalls longer than any seen)",
                spec.interference_headroom_pct
            )
        } else {
            String::new()
        },
        args.common.calibration_ms
    );
    let record_line = describe_host_record(&spec);
    println!(
        "{record_line}{}",
        if spec.interference_recorded_ns + spec.release_jitter_recorded_ns > 0 {
            " — admission takes at least these"
        } else {
            ""
        }
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
    if let Some(reason) = &report.rejected_at_commit {
        if args.params == "default" && args.deadline_us.is_none() && args.period_us.is_none() {
            println!("{}", default_ring_hint(&spec, args.user_compute_us * US, &reports));
        }
        return Err(format!(
            "admission rejected the ring at commit, nothing ran: {reason} ({record_line})"
        ));
    }
    if let Some(path) = &args.common.plot {
        plot_ring(path, &report)?;
    }
    Ok(())
}

/// After the defaults were rejected: the period this host could be
/// promised the ring at (deadlines absorbing the same headroom over the
/// worst interference any member admitted with), and the other way out.
fn default_ring_hint(spec: &ScenarioSpec, user_compute_ns: u64, reports: &[MemberReport]) -> String {
    let eps = spec.clock_bound_budget_ns;
    let pct = spec.interference_headroom_pct.max(100) as u64;
    let i_ns = reports
        .iter()
        .map(|r| r.interference.interference_admitted_ns)
        .max()
        .unwrap_or(0);
    let j_ns = reports
        .iter()
        .map(|r| r.interference.release_jitter_admitted_ns)
        .max()
        .unwrap_or(0);
    let d_ns = (user_compute_ns + eps + j_ns + (i_ns * pct).div_ceil(100)).next_multiple_of(100 * US);
    let period_ns = pipeline_span_ns(&pipeline(&[0, 1, 2], true, d_ns, 1, 1, eps))
        .next_multiple_of(MS)
        .max(5 * MS);
    format!(
        "hint: this host has shown stalls of {} µs; with the defaults' {pct}% headroom the ring needs deadlines of at least {} µs: `spindle rt ring --period-us {} --interference-headroom-pct {pct}` (5,000 periods: {:.0} min), or `--interference-headroom-pct 100` to charge the worst as seen (then a stall longer than any seen may make a job miss)",
        i_ns / US,
        d_ns / US,
        period_ns / US,
        (period_ns * 5_000) as f64 / 60e9
    )
}

/// How long the launcher calibrates: `--calibration-ms`, or longer while
/// the host record holds less than `--host-warmup-s` of observation (says
/// so when it does).
fn launcher_calibration_ns(args: &RingArgs, spec: &ScenarioSpec) -> Result<u64, String> {
    let asked_ns = args.common.calibration_ms * MS;
    let warmup_ns = args.host_warmup_s.saturating_mul(1_000 * MS).min(CALIBRATION_NS_MAX);
    let Some(path) = spec.host_record.as_ref().filter(|_| warmup_ns > 0) else {
        return Ok(asked_ns);
    };
    let observed_ns = host_record::load(path, &host_record::hostname())?.observed_ns;
    let missing_ns = warmup_ns.saturating_sub(observed_ns);
    if missing_ns <= asked_ns {
        return Ok(asked_ns);
    }
    println!(
        "host record {}: this host has been watched for {:.0} s, less than --host-warmup-s {}: calibrating for {:.0} s first",
        path.display(),
        observed_ns as f64 / 1e9,
        args.host_warmup_s,
        missing_ns as f64 / 1e9
    );
    Ok(missing_ns)
}

/// The default deadline leaves room for this many times the release
/// jitter and interference the launcher measured, and (with no period or
/// deadline given) admission charges this many times the interference.
const DEFAULT_HEADROOM: u64 = 3;
/// The longest period the default parameters choose (5,000 periods: 4 min).
const DEFAULT_PERIOD_MAX_NS: u64 = 50 * MS;

fn ring_report(spec: &ScenarioSpec, params: &str, reports: &[MemberReport]) -> RingReport {
    let runs: Vec<&RunReport> = reports.iter().map(|r| &r.runs[0]).collect();
    let rejected_at_commit = runs.iter().find_map(|r| r.rejected_at_commit.clone());
    let missed: u64 = runs.iter().map(|r| r.app_missed + r.user_jobs_missed).sum();
    let late: u64 = runs.iter().map(|r| r.counters.missed_early + r.counters.overruns).sum();
    let jobs: u64 = runs.iter().map(|r| r.counters.released).sum();
    let miss_rate = (missed + late) as f64 / jobs.max(1) as f64;
    let miss_budget = spec.admission.miss_budget();
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
    let mut tasks: Vec<TaskRow> = reports
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
    if tasks.is_empty() {
        // Rejected at commit: the tasks as declared.
        tasks = spec
            .stages
            .iter()
            .map(|s| TaskRow {
                node: s.node,
                name: s.kind.clone(),
                offset_ns: s.offset_ns,
                period_ns: spec.period_ns[0],
                compute_ns: s.compute_ns,
                deadline_ns: s.deadline_ns,
            })
            .collect();
    }
    RingReport {
        params: params.to_string(),
        transport: transport_label(spec),
        periods: spec.periods,
        size: spec.sizes[0],
        period_ns: spec.period_ns[0],
        admission_mode: if miss_budget > 0.0 { "statistical" } else { "worst-case" }.into(),
        interference_headroom_pct: spec.interference_headroom_pct,
        miss_budget,
        outcome: if rejected_at_commit.is_some() {
            "rejected at commit".into()
        } else {
            "ran".into()
        },
        jobs,
        miss_rate,
        within_budget: (miss_budget > 0.0 && rejected_at_commit.is_none()).then_some(miss_rate <= miss_budget),
        interference_exceeded: reports.iter().any(|r| r.interference.exceeded()),
        missed,
        late,
        admitted: rejected_at_commit.is_none() && runs[0].verdicts.iter().all(|v| v.is_none()),
        verdicts: if rejected_at_commit.is_some() {
            vec![rejected_at_commit.clone()]
        } else {
            runs[0].verdicts.clone()
        },
        rejected_at_commit,
        latency_ns: Summary::of(&all),
        jitter_ns: Summary::of(&jitter),
        release_jitter_ns: worst(runs.iter().map(|r| r.release_jitter_ns)),
        hop_latency_p50_ns: hop_p50,
        clock_bound_ns_max: runs.iter().map(|r| r.counters.clock_bound_ns_max).max().unwrap_or(0),
        tasks,
        nodes: reports.iter().map(|r| node_row(r, &r.runs[0])).collect(),
        machine: Machine::detect(),
        unix_time_s: unix_time_s(),
        command: command_line(),
        latency_series: series,
    }
}

fn print_ring(r: &RingReport) {
    if let Some(reason) = &r.rejected_at_commit {
        println!("admission: REJECTED at commit, nothing ran: {reason}");
        for n in &r.nodes {
            println!("node {}: {}", ["A", "B", "C"][n.node], n.interference.describe());
        }
        return;
    }
    println!(
        "admission: {}",
        if r.admitted {
            "accepted on every node".to_string()
        } else {
            "REJECTED".to_string()
        }
    );
    if r.admitted && r.admission_mode == "worst-case" {
        // What the promise covers, plainly: no calibration bounds a host's
        // worst stall, only the worst it has shown.
        let charged_ns = r
            .nodes
            .iter()
            .map(|n| n.interference.interference_admitted_ns)
            .min()
            .unwrap_or(0);
        println!(
            "  the promise: every job meets its deadline while the host takes at most {} µs from a job ({}% of the worst this host has shown); a longer stall can still make a job miss (reported as EXCEEDED, and recorded so that the next commit charges it)",
            charged_ns * r.interference_headroom_pct.max(100) as u64 / 100 / 1_000,
            r.interference_headroom_pct.max(100)
        );
    }
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
    for n in &r.nodes {
        println!(
            "node {}: {}, in the run mean {} µs, widest {} µs; calibrated release jitter p99 {} ns, max {} ns; releases > 10 µs late: {} slept past the window, {} lost the CPU while spinning, {} already due",
            ["A", "B", "C"][n.node],
            n.spin.describe(),
            n.spin_window_mean_ns / US,
            n.spin_window_max_ns / US,
            n.calibration_jitter_ns.p99,
            n.calibration_jitter_ns.max,
            n.late_wakes_sleep,
            n.late_wakes_spin,
            n.late_wakes_no_sleep
        );
    }
    for n in &r.nodes {
        println!("node {}: {}", ["A", "B", "C"][n.node], n.interference.describe());
        for line in n.interference_log.iter().take(3) {
            println!("  watchdog: {line}");
        }
    }
    println!(
        "periods {}  missed {}  late {}  (messages the application did not have / jobs dropped or overrun)",
        r.periods, r.missed, r.late
    );
    let budget = match r.within_budget {
        Some(true) => format!(" — within the miss budget {:e}", r.miss_budget),
        Some(false) => format!(" — OVER the miss budget {:e}", r.miss_budget),
        None => String::new(),
    };
    println!(
        "miss rate {:.2e} ((missed + late) / {} jobs){budget}",
        r.miss_rate, r.jobs
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
}
