//! `spindle fanout bench|calibrate|sim`: the fanout crate measured on
//! this machine, the costs of its model measured here, and the model run
//! for 4–256 cores (every simulated row says so).
//!
//! - `bench`: median and p99 multicast+ack latency vs group size for the
//!   four layouts (flat is the `smp_call_function_many` baseline, measured
//!   in the same run), with a cache-line round-trip probe and the cost of
//!   join and leave, all in one run;
//! - `calibrate`: the model's [`Params`] measured here ([`probe`]);
//! - `sim`: the model's curves, the crossover group size of
//!   tree+helping+skipping over flat, helping's small-group penalty with
//!   and without skipping, and (with `--validate`) the model against a
//!   real run where they overlap.

pub mod clock;
pub mod plot;
pub mod probe;
pub mod procs;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spindle_fanout::model::{self, Params};
use spindle_fanout::{Domain, Layout, Port, Shape, Tree};

use crate::report::Machine;

/// `spindle fanout …`.
#[derive(clap::Subcommand)]
pub enum FanoutCommand {
    /// Multicast+ack latency vs group size on this machine, all layouts.
    Bench(BenchArgs),
    /// Measure the model's costs on this machine.
    Calibrate(CalibrateArgs),
    /// The calibrated model for 4–256 cores (SIMULATED).
    Sim(SimArgs),
    /// (internal) one member process of `fanout bench --procs`.
    #[command(hide = true)]
    Member(procs::MemberArgs),
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Slots of the tree (one thread each at most); default: the CPUs.
    #[arg(long)]
    pub slots: Option<usize>,
    /// Tree shape: cpu (from /sys), binary, kary:K, flat.
    #[arg(long, default_value = "cpu")]
    pub shape: String,
    /// Group sizes (members, origin included); default 2..=slots.
    #[arg(long, value_delimiter = ',')]
    pub members: Vec<usize>,
    /// Timed multicasts per point.
    #[arg(long, default_value_t = 20_000)]
    pub iterations: u64,
    #[arg(long, default_value_t = 2_000)]
    pub warmup: u64,
    /// Also measure with every member but the origin a separate process
    /// on one /dev/shm domain (rows with `mode: processes`, next to the
    /// thread rows of the same run).
    #[arg(long)]
    pub procs: bool,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CalibrateArgs {
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct SimArgs {
    /// A `spindle fanout calibrate --json` file; default: typical x86 costs.
    #[arg(long)]
    pub params: Option<PathBuf>,
    /// Core counts to model.
    #[arg(long, value_delimiter = ',', default_values_t = vec![4, 8, 16, 32, 64, 128, 256])]
    pub cores: Vec<usize>,
    /// Tree shape of the modelled machine: binary, kary:K, flat.
    #[arg(long, default_value = "binary")]
    pub shape: String,
    /// Random groups (and origins) per point.
    #[arg(long, default_value_t = 400)]
    pub trials: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `spindle fanout bench --json` files to validate the model against.
    #[arg(long)]
    pub validate: Vec<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Latency percentiles of a row, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

/// One point of a curve.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub layout: String,
    /// `threads` (one process) or `processes` (members over /dev/shm).
    #[serde(default = "threads")]
    pub mode: String,
    pub members: usize,
    /// Cores (slots of the tree) of the machine, real or modelled.
    pub cores: usize,
    pub simulated: bool,
    pub latency_ns: Latency,
    pub samples: u64,
    /// Real rows: the median over batches of [`BACK_TO_BACK_MULTICASTS`]
    /// multicasts in a row of the time per multicast, the clock read
    /// once per batch as the cache-line round trip is measured (the
    /// per-multicast `latency_ns` carries two clock reads each).
    #[serde(default)]
    pub back_to_back_ns: Option<f64>,
}

fn threads() -> String {
    "threads".into()
}

/// The probes of a bench run (same run as its rows).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Probes {
    pub cache_line_round_trip_ns: f64,
    pub join_ns: f64,
    pub leave_ns: f64,
    /// 2-member tree_help_skip and flat p50 over the round trip.
    pub two_member_p50_over_round_trip: f64,
    pub two_member_flat_p50_over_round_trip: f64,
    /// 2-member tree_help_skip multicasts back to back (the clock read
    /// once per batch, like the round trip) over the round trip.
    #[serde(default)]
    pub two_member_back_to_back_over_round_trip: Option<f64>,
    pub join_over_round_trip: f64,
    pub leave_over_round_trip: f64,
    /// Whether join, leave and the 2-member p50 are within 2x the round trip.
    pub within_2x_round_trip: bool,
    /// With `--procs`: the 2-member p50 with the member a process,
    /// tree_help_skip and flat, over the round trip.
    #[serde(default)]
    pub procs_two_member_p50_over_round_trip: Option<f64>,
    #[serde(default)]
    pub procs_two_member_flat_p50_over_round_trip: Option<f64>,
    /// From a wake to the sleeper running again, median: the futex word
    /// the ports sleep on, and std's thread unpark (what the thread mode
    /// used before), same run.
    #[serde(default)]
    pub wake_futex_ns: Option<f64>,
    #[serde(default)]
    pub wake_unpark_ns: Option<f64>,
    /// The 2-member multicast's hardware floor between the same CPUs: its
    /// two hand-offs alone, each a locked swap on a line of its own
    /// ([`probe::handoff_round_trip_ns`]), and the 2-member tree_help_skip
    /// back-to-back time over it.
    #[serde(default)]
    pub handoff_round_trip_ns: Option<f64>,
    #[serde(default)]
    pub two_member_back_to_back_over_handoff: Option<f64>,
    /// The clock read around every timed multicast (`tsc` or `instant`,
    /// [`clock::SampleClock`]) and what two reads in a row cost (the
    /// clock's share of each sample), in ns.
    #[serde(default)]
    pub sample_clock: Option<String>,
    #[serde(default)]
    pub sample_clock_read_pair_ns: Option<f64>,
}

/// Model against a real run, one point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Validation {
    pub layout: String,
    pub members: usize,
    pub cores: usize,
    pub real_p50_ns: f64,
    pub simulated_p50_ns: f64,
    pub simulated_over_real: f64,
}

/// Model summary at one core count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimSummary {
    pub cores: usize,
    /// The smallest group from which tree_help_skip's p50 beats flat's.
    pub crossover_members: Option<usize>,
    /// At 2 members: p50 over flat's p50.
    pub tree_help_over_flat_2_members: f64,
    pub tree_help_skip_over_flat_2_members: f64,
    /// At every slot a member: flat's p50 over tree_help_skip's.
    pub flat_over_tree_help_skip_full: f64,
}

/// A `spindle fanout` result file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FanoutReport {
    /// `bench`, `calibrate` or `sim`.
    pub kind: String,
    pub simulated: bool,
    pub shape: String,
    pub rows: Vec<Row>,
    #[serde(default)]
    pub probes: Option<Probes>,
    /// Each layout's p50 over flat's (the Linux-like baseline) per group size.
    #[serde(default)]
    pub ratio_to_flat: Vec<(String, usize, f64)>,
    #[serde(default)]
    pub params: Option<ParamsJson>,
    #[serde(default)]
    pub summaries: Vec<SimSummary>,
    #[serde(default)]
    pub validation: Vec<Validation>,
    pub machine: Machine,
    /// /proc/loadavg's 1-minute figure at the start of the run.
    pub load_avg_1m: f64,
    pub unix_time_s: u64,
    pub command: String,
}

/// [`Params`] as JSON.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ParamsJson {
    pub line_transfer_ns: f64,
    pub send_ns: f64,
    pub poll_ns: f64,
    pub handler_ns: f64,
    pub atomic_ns: f64,
    pub wake_ns: f64,
    pub visit_ns: f64,
}

impl From<ParamsJson> for Params {
    fn from(p: ParamsJson) -> Params {
        Params {
            line_transfer_ns: p.line_transfer_ns,
            send_ns: p.send_ns,
            poll_ns: p.poll_ns,
            handler_ns: p.handler_ns,
            atomic_ns: p.atomic_ns,
            wake_ns: p.wake_ns,
            visit_ns: p.visit_ns,
        }
    }
}

impl From<Params> for ParamsJson {
    fn from(p: Params) -> ParamsJson {
        ParamsJson {
            line_transfer_ns: p.line_transfer_ns,
            send_ns: p.send_ns,
            poll_ns: p.poll_ns,
            handler_ns: p.handler_ns,
            atomic_ns: p.atomic_ns,
            wake_ns: p.wake_ns,
            visit_ns: p.visit_ns,
        }
    }
}

/// Run a `spindle fanout` command.
pub fn run(command: FanoutCommand) -> Result<(), String> {
    match command {
        FanoutCommand::Bench(args) => bench(args),
        FanoutCommand::Calibrate(args) => calibrate(args),
        FanoutCommand::Sim(args) => sim(args),
        FanoutCommand::Member(args) => procs::member(args),
    }
}

fn report(kind: &str, simulated: bool, shape: &str) -> FanoutReport {
    FanoutReport {
        kind: kind.into(),
        simulated,
        shape: shape.into(),
        rows: Vec::new(),
        probes: None,
        ratio_to_flat: Vec::new(),
        params: None,
        summaries: Vec::new(),
        validation: Vec::new(),
        machine: Machine::detect(),
        load_avg_1m: load_avg_1m(),
        unix_time_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        command: std::env::args().collect::<Vec<_>>().join(" "),
    }
}

fn load_avg_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn write_json(path: &Option<PathBuf>, report: &FanoutReport) -> Result<(), String> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn read_report(path: &PathBuf) -> Result<FanoutReport, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a fanout result: {e}", path.display()))
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `spindle fanout bench`.
pub fn bench(args: BenchArgs) -> Result<(), String> {
    let slots = args.slots.unwrap_or_else(cpus);
    let shape = Shape::parse(&args.shape).map_err(|e| e.to_string())?;
    let tree = Tree::build(shape, slots).map_err(|e| e.to_string())?;
    let sizes: Vec<usize> = if args.members.is_empty() {
        (2..=slots).collect()
    } else {
        args.members.clone()
    };
    if let Some(bad) = sizes.iter().find(|&&g| g < 2 || g > slots) {
        return Err(format!(
            "--members {bad}: a group has 2..={slots} members on {slots} slots"
        ));
    }
    if args.iterations == 0 {
        return Err("--iterations 0: at least one multicast per point".into());
    }
    let mut out = report("bench", false, &args.shape);
    println!(
        "fanout bench: {slots} slots ({} cpus: {}), shape {}, load {:.2}",
        out.machine.cpus, out.machine.cpu_model, args.shape, out.load_avg_1m
    );
    // Between the CPUs of the 2-member group (origin and member).
    let pair = group_slots(slots, 2);
    let round_trip_ns =
        probe::cache_line_round_trip_ns(tree.cpu_of_slot(pair[0]) as usize, tree.cpu_of_slot(pair[1]) as usize);
    let handoff_ns =
        probe::handoff_round_trip_ns(tree.cpu_of_slot(pair[0]) as usize, tree.cpu_of_slot(pair[1]) as usize);
    let (join_ns, leave_ns) = probe::join_leave_ns();
    let sample_clock = clock::SampleClock::new();
    let clock_pair_ns = sample_clock.read_pair_ns();
    let (wake_futex_ns, wake_unpark_ns) = (probe::wake_ns(), probe::unpark_wake_ns());
    println!("  cache-line round trip {round_trip_ns:.0} ns; the two hand-offs of a multicast (a locked swap each, two lines) {handoff_ns:.0} ns; join {join_ns:.1} ns, leave {leave_ns:.1} ns; wake: futex {wake_futex_ns:.0} ns, unpark {wake_unpark_ns:.0} ns; samples read the {} clock ({clock_pair_ns:.1} ns a pair of reads)", sample_clock.name());
    let modes: &[&str] = if args.procs {
        &["threads", "processes"]
    } else {
        &["threads"]
    };
    for &mode in modes {
        for layout in Layout::ALL {
            for &members in &sizes {
                let timed = if mode == "threads" {
                    measure(&tree, layout, members, args.warmup, args.iterations)?
                } else {
                    procs::measure(&tree, layout, members, args.warmup, args.iterations)?
                };
                let h = &timed.histogram;
                let row = Row {
                    layout: layout.name().into(),
                    mode: mode.into(),
                    members,
                    cores: slots,
                    simulated: false,
                    latency_ns: Latency {
                        p50: h.value_at_quantile(0.5) as f64,
                        p99: h.value_at_quantile(0.99) as f64,
                    },
                    samples: h.len(),
                    back_to_back_ns: Some(timed.back_to_back_ns),
                };
                println!(
                    "  {:<9} {:<15} {:>3} members: p50 {:>8.0} ns  p99 {:>8.0} ns  back to back {:>8.0} ns",
                    row.mode, row.layout, members, row.latency_ns.p50, row.latency_ns.p99, timed.back_to_back_ns
                );
                out.rows.push(row);
            }
        }
    }
    out.ratio_to_flat = ratios_to_flat(&out.rows);
    let p50_of = |mode: &str, layout: &str| {
        out.rows
            .iter()
            .find(|r| r.mode == mode && r.layout == layout && r.members == 2)
            .map(|r| r.latency_ns.p50)
    };
    let p50 = |layout: &str| p50_of("threads", layout);
    let procs_over = |layout: &str| p50_of("processes", layout).map(|p| p / round_trip_ns);
    if let (Some(skip), Some(flat)) = (p50("tree_help_skip"), p50("flat")) {
        let back_to_back = out
            .rows
            .iter()
            .find(|r| r.mode == "threads" && r.layout == "tree_help_skip" && r.members == 2)
            .and_then(|r| r.back_to_back_ns);
        let probes = Probes {
            cache_line_round_trip_ns: round_trip_ns,
            join_ns,
            leave_ns,
            two_member_p50_over_round_trip: skip / round_trip_ns,
            two_member_flat_p50_over_round_trip: flat / round_trip_ns,
            two_member_back_to_back_over_round_trip: back_to_back.map(|b| b / round_trip_ns),
            handoff_round_trip_ns: Some(handoff_ns),
            two_member_back_to_back_over_handoff: back_to_back.map(|b| b / handoff_ns),
            sample_clock: Some(sample_clock.name().into()),
            sample_clock_read_pair_ns: Some(clock_pair_ns),
            join_over_round_trip: join_ns / round_trip_ns,
            leave_over_round_trip: leave_ns / round_trip_ns,
            within_2x_round_trip: skip <= 2.0 * round_trip_ns
                && join_ns <= 2.0 * round_trip_ns
                && leave_ns <= 2.0 * round_trip_ns,
            procs_two_member_p50_over_round_trip: procs_over("tree_help_skip"),
            procs_two_member_flat_p50_over_round_trip: procs_over("flat"),
            wake_futex_ns: Some(wake_futex_ns),
            wake_unpark_ns: Some(wake_unpark_ns),
        };
        println!(
            "  2 members: tree_help_skip p50 {:.2}x, flat {:.2}x the round trip; join {:.2}x, leave {:.2}x: within 2x: {}",
            probes.two_member_p50_over_round_trip,
            probes.two_member_flat_p50_over_round_trip,
            probes.join_over_round_trip,
            probes.leave_over_round_trip,
            probes.within_2x_round_trip
        );
        if let (Some(b), Some(h)) = (
            probes.two_member_back_to_back_over_round_trip,
            probes.two_member_back_to_back_over_handoff,
        ) {
            println!("  2 members back to back (clock read once per batch, as the round trip): tree_help_skip {b:.2}x the round trip, {h:.2}x the two hand-offs");
        }
        if let (Some(skip), Some(flat)) = (
            probes.procs_two_member_p50_over_round_trip,
            probes.procs_two_member_flat_p50_over_round_trip,
        ) {
            println!("  2 members as processes: tree_help_skip p50 {skip:.2}x, flat {flat:.2}x the round trip");
        }
        out.probes = Some(probes);
    } else {
        out.probes = Some(Probes {
            cache_line_round_trip_ns: round_trip_ns,
            join_ns,
            leave_ns,
            wake_futex_ns: Some(wake_futex_ns),
            wake_unpark_ns: Some(wake_unpark_ns),
            handoff_round_trip_ns: Some(handoff_ns),
            sample_clock: Some(sample_clock.name().into()),
            sample_clock_read_pair_ns: Some(clock_pair_ns),
            ..Probes::default()
        });
    }
    write_json(&args.json, &out)?;
    if let Some(svg) = &args.svg {
        // The curves are the thread rows (the process rows are 2-member
        // points, in the JSON).
        let mut threads_only = out.clone();
        threads_only.rows.retain(|r| r.mode == "threads");
        plot::write_curves(svg, &threads_only, None)?;
        println!("wrote {}", svg.display());
    }
    Ok(())
}

fn ratios_to_flat(rows: &[Row]) -> Vec<(String, usize, f64)> {
    rows.iter()
        .filter_map(|r| {
            let flat = rows
                .iter()
                .find(|f| f.layout == "flat" && f.mode == r.mode && f.members == r.members && f.cores == r.cores)?;
            let name = if r.mode == "threads" {
                r.layout.clone()
            } else {
                format!("{}@{}", r.layout, r.mode)
            };
            (r.layout != "flat").then(|| (name, r.members, r.latency_ns.p50 / flat.latency_ns.p50))
        })
        .collect()
}

/// The slots of a group of `members`: the origin (slot 0) and the others
/// spread over the tree.
pub fn group_slots(slots: usize, members: usize) -> Vec<usize> {
    (0..members).map(|i| i * slots / members).collect()
}

/// Multicast+ack latency of one layout and group size: one thread per
/// member (and, for the broadcast, per non-member slot), pinned to its
/// slot's CPU; the origin is slot 0.
fn measure(tree: &Tree, layout: Layout, members: usize, warmup: u64, iterations: u64) -> Result<Timed, String> {
    let domain = Domain::new(tree.clone(), layout, procs::bench_wait()).map_err(|e| e.to_string())?;
    let group = group_slots(tree.slots(), members);
    let serving: Vec<usize> = if layout.interrupts_non_members() {
        (1..tree.slots()).collect()
    } else {
        group[1..].to_vec()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = serving
        .iter()
        .map(|&slot| {
            let (domain, stop, cpu) = (domain.clone(), stop.clone(), tree.cpu_of_slot(slot) as usize);
            let joins = group.contains(&slot);
            std::thread::spawn(move || -> Result<u64, String> {
                // Best effort: a cgroup may not allow every CPU.
                let _ = probe::pin_to_cpu(cpu);
                let mut port = domain
                    .attach(slot, |d| {
                        std::hint::black_box(d.payload);
                    })
                    .map_err(|e| e.to_string())?;
                if joins {
                    port.join().map_err(|e| e.to_string())?;
                } else {
                    port.set_wait(procs::relay_wait());
                }
                while !stop.load(Ordering::Acquire) {
                    port.serve(Duration::from_millis(50));
                }
                Ok(port.delivered())
            })
        })
        .collect();
    let origin_cpu = tree.cpu_of_slot(0) as usize;
    let expected = group.iter().fold(0u64, |m, s| m | 1 << s);
    let result = {
        let domain = domain.clone();
        std::thread::spawn(move || -> Result<Timed, String> {
            let _ = probe::pin_to_cpu(origin_cpu);
            let mut origin = domain.attach(0, |_| {}).map_err(|e| e.to_string())?;
            origin.join().map_err(|e| e.to_string())?;
            time_multicasts(&domain, &mut origin, expected, warmup, iterations)
        })
        .join()
        .map_err(|_| "the origin thread panicked".to_string())?
    };
    stop.store(true, Ordering::Release);
    domain.shutdown();
    for (t, slot) in threads.into_iter().zip(&serving) {
        let delivered = t.join().map_err(|_| format!("slot {slot}'s thread panicked"))??;
        let sent = result.as_ref().map_or(0, |t| t.multicasts);
        if result.is_ok() && group.contains(slot) && delivered != sent {
            return Err(format!("slot {slot} delivered {delivered} of {sent} multicasts"));
        }
    }
    result
}

/// Multicasts per back-to-back batch (timed as a whole).
pub const BACK_TO_BACK_MULTICASTS: u64 = 100;
/// Back-to-back batches per point (their median is the figure).
pub const BACK_TO_BACK_BATCHES: u64 = 21;

/// What the origin measured at one point.
pub struct Timed {
    /// One sample per multicast (two reads of the [`clock::SampleClock`]
    /// around each).
    pub histogram: hdrhistogram::Histogram<u64>,
    /// The median time per multicast over batches of multicasts in a row.
    pub back_to_back_ns: f64,
    /// Multicasts sent in all (warm-up, timed, back to back): what every
    /// member must have delivered.
    pub multicasts: u64,
}

/// The origin's part of a measurement: wait (at most 10 s) until the
/// members are exactly `expected`, then time `warmup + iterations`
/// multicasts one by one (the warm-up ones not recorded), then
/// [`BACK_TO_BACK_BATCHES`] batches of [`BACK_TO_BACK_MULTICASTS`] in a row.
pub(crate) fn time_multicasts(
    domain: &Domain,
    origin: &mut Port,
    expected: u64,
    warmup: u64,
    iterations: u64,
) -> Result<Timed, String> {
    let start = Instant::now();
    while domain.state().members() != expected {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "members did not join within 10 s: {:#b}",
                domain.state().members()
            ));
        }
        std::thread::yield_now();
    }
    let clock = clock::SampleClock::new();
    let mut ticks = Vec::with_capacity(iterations as usize);
    let (clock_start, instant_start) = (clock.now(), Instant::now());
    for i in 0..warmup + iterations {
        let t0 = clock.now();
        let done = origin.multicast(i, Duration::from_secs(5)).map_err(|e| e.to_string())?;
        let t1 = clock.now();
        assert_eq!(done.targets, expected & !1, "reached_exactly_the_group");
        if i >= warmup {
            ticks.push(t1 - t0);
        }
    }
    let ns_per_tick = clock.ns_per_tick(clock.now() - clock_start, instant_start.elapsed().as_nanos() as f64);
    let mut h = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    for t in ticks {
        h.record(((t as f64 * ns_per_tick).round() as u64).max(1))
            .map_err(|e| e.to_string())?;
    }
    let mut payload = warmup + iterations;
    let mut batches = Vec::with_capacity(BACK_TO_BACK_BATCHES as usize);
    for _ in 0..BACK_TO_BACK_BATCHES {
        let t0 = Instant::now();
        for _ in 0..BACK_TO_BACK_MULTICASTS {
            let done = origin
                .multicast(payload, Duration::from_secs(5))
                .map_err(|e| e.to_string())?;
            debug_assert_eq!(done.targets, expected & !1, "reached_exactly_the_group");
            payload += 1;
        }
        batches.push(t0.elapsed().as_nanos() as f64 / BACK_TO_BACK_MULTICASTS as f64);
    }
    batches.sort_by(f64::total_cmp);
    Ok(Timed {
        histogram: h,
        back_to_back_ns: batches[batches.len() / 2],
        multicasts: payload,
    })
}

/// `spindle fanout calibrate`.
pub fn calibrate(args: CalibrateArgs) -> Result<(), String> {
    let mut out = report("calibrate", false, "");
    let params = probe::calibrate();
    println!(
        "fanout calibrate ({} cpus: {}, load {:.2}):",
        out.machine.cpus, out.machine.cpu_model, out.load_avg_1m
    );
    println!("  {params:?}");
    out.params = Some(params.into());
    write_json(&args.json, &out)
}

/// Group sizes of the model at `cores` cores.
pub fn sim_sizes(cores: usize) -> Vec<usize> {
    if cores <= 16 {
        return (2..=cores).collect();
    }
    let mut sizes = vec![2, 3, 4, 6, 8, 12, 16];
    let mut g = 24;
    while g < cores {
        sizes.push(g);
        g = if g.is_power_of_two() { g + g / 2 } else { g / 3 * 4 };
    }
    sizes.push(cores);
    sizes
}

fn sim_shape(shape: &str) -> Result<Shape, String> {
    match Shape::parse(shape).map_err(|e| e.to_string())? {
        Shape::Cpu => Ok(Shape::Kary(2)),
        s => Ok(s),
    }
}

/// `spindle fanout sim`.
pub fn sim(args: SimArgs) -> Result<(), String> {
    let params: Params = match &args.params {
        Some(path) => read_report(path)?
            .params
            .ok_or_else(|| {
                format!(
                    "{}: no params (make it with `spindle fanout calibrate --json`)",
                    path.display()
                )
            })?
            .into(),
        None => Params::TYPICAL_X86,
    };
    let shape = sim_shape(&args.shape)?;
    if args.trials == 0 {
        return Err("--trials 0: a point needs trials".into());
    }
    let mut out = report("sim", true, &args.shape);
    out.params = Some(params.into());
    println!(
        "fanout sim (SIMULATED, {:?} tree, {} trials, params {params:?})",
        shape, args.trials
    );
    for &cores in &args.cores {
        if !(2..=spindle_fanout::SLOTS_MAX).contains(&cores) {
            return Err(format!(
                "--cores {cores}: the model has 2..={} cores",
                spindle_fanout::SLOTS_MAX
            ));
        }
        let tree = Tree::build(shape, cores).map_err(|e| e.to_string())?;
        let sizes = sim_sizes(cores);
        let curves: Vec<(Layout, Vec<model::Point>)> = Layout::ALL
            .into_iter()
            .map(|layout| {
                (
                    layout,
                    model::curve(&tree, layout, params, &sizes, args.trials, args.seed),
                )
            })
            .collect();
        for (layout, points) in &curves {
            for p in points {
                out.rows.push(Row {
                    layout: layout.name().into(),
                    mode: threads(),
                    members: p.members,
                    cores,
                    simulated: true,
                    latency_ns: Latency {
                        p50: p.latency_ns_p50,
                        p99: p.latency_ns_p99,
                    },
                    samples: args.trials as u64,
                    back_to_back_ns: None,
                });
            }
        }
        let curve = |l: Layout| &curves.iter().find(|c| c.0 == l).expect("every layout").1;
        let (flat, help, skip) = (
            curve(Layout::Flat),
            curve(Layout::TreeHelp),
            curve(Layout::TreeHelpSkip),
        );
        let summary = SimSummary {
            cores,
            crossover_members: model::crossover(skip, flat),
            tree_help_over_flat_2_members: help[0].latency_ns_p50 / flat[0].latency_ns_p50,
            tree_help_skip_over_flat_2_members: skip[0].latency_ns_p50 / flat[0].latency_ns_p50,
            flat_over_tree_help_skip_full: flat.last().unwrap().latency_ns_p50 / skip.last().unwrap().latency_ns_p50,
        };
        println!(
            "  {cores:>3} cores: crossover {:?} members; 2 members: help {:.2}x flat, help+skip {:.2}x flat; full group: flat {:.2}x help+skip",
            summary.crossover_members,
            summary.tree_help_over_flat_2_members,
            summary.tree_help_skip_over_flat_2_members,
            summary.flat_over_tree_help_skip_full
        );
        out.summaries.push(summary);
    }
    out.ratio_to_flat = ratios_to_flat(&out.rows);
    for path in &args.validate {
        let real = read_report(path)?;
        for r in real.rows.iter().filter(|r| !r.simulated) {
            let layout = Layout::parse(&r.layout).map_err(|e| e.to_string())?;
            let real_shape = sim_shape(&real.shape)?;
            let tree = Tree::build(real_shape, r.cores).map_err(|e| e.to_string())?;
            let p = model::curve(&tree, layout, params, &[r.members], args.trials, args.seed)[0];
            out.validation.push(Validation {
                layout: r.layout.clone(),
                members: r.members,
                cores: r.cores,
                real_p50_ns: r.latency_ns.p50,
                simulated_p50_ns: p.latency_ns_p50,
                simulated_over_real: p.latency_ns_p50 / r.latency_ns.p50,
            });
        }
        println!("  validated against {} ({} points)", path.display(), real.rows.len());
    }
    for v in &out.validation {
        println!(
            "    {:<15} {:>3} members on {:>3} cores: real {:>8.0} ns, model {:>8.0} ns ({:.2}x)",
            v.layout, v.members, v.cores, v.real_p50_ns, v.simulated_p50_ns, v.simulated_over_real
        );
    }
    write_json(&args.json, &out)?;
    if let Some(svg) = &args.svg {
        let cores = *args.cores.iter().max().expect("at least one core count");
        plot::write_curves(svg, &out, Some(cores))?;
        println!("wrote {}", svg.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_distinct_slots_with_the_origin_first() {
        for slots in 2..=63 {
            for members in 2..=slots {
                let g = group_slots(slots, members);
                assert_eq!(g[0], 0);
                assert!(
                    g.windows(2).all(|w| w[0] < w[1]),
                    "{slots} slots, {members} members: {g:?}"
                );
                assert!(*g.last().unwrap() < slots);
            }
        }
    }

    #[test]
    fn sim_sizes_grow_to_the_core_count() {
        for cores in [4, 16, 32, 100, 256] {
            let sizes = sim_sizes(cores);
            assert_eq!(sizes[0], 2);
            assert_eq!(*sizes.last().unwrap(), cores);
            assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{cores}: {sizes:?}");
        }
    }

    #[test]
    fn ratios_are_against_flat_at_the_same_size() {
        let row = |layout: &str, members, p50| Row {
            layout: layout.into(),
            mode: threads(),
            members,
            cores: 4,
            simulated: true,
            latency_ns: Latency { p50, p99: p50 },
            samples: 1,
            back_to_back_ns: None,
        };
        let mut rows = vec![
            row("flat", 2, 100.0),
            row("tree", 2, 250.0),
            row("flat", 4, 200.0),
            row("tree", 4, 100.0),
        ];
        // Process rows are compared with the process flat row only.
        for (layout, p50) in [("flat", 400.0), ("tree", 100.0)] {
            let mut r = row(layout, 2, p50);
            r.mode = "processes".into();
            rows.push(r);
        }
        assert_eq!(
            ratios_to_flat(&rows),
            vec![
                ("tree".to_string(), 2, 2.5),
                ("tree".to_string(), 4, 0.5),
                ("tree@processes".to_string(), 2, 0.25)
            ]
        );
    }

    #[test]
    fn the_sim_command_writes_labelled_rows() {
        let dir = crate::tempdir("fanout-sim-test").unwrap();
        let json = dir.join("sim.json");
        let svg = dir.join("sim.svg");
        sim(SimArgs {
            params: None,
            cores: vec![4, 16],
            shape: "binary".into(),
            trials: 20,
            seed: 3,
            validate: vec![],
            json: Some(json.clone()),
            svg: Some(svg.clone()),
        })
        .unwrap();
        let report = read_report(&json).unwrap();
        assert!(report.simulated && report.rows.iter().all(|r| r.simulated));
        assert_eq!(report.rows.len(), 4 * (3 + 15));
        assert!(std::fs::read_to_string(&svg).unwrap().contains("SIMULATED"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
