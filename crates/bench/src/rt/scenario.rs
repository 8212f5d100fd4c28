//! Measurement scenarios run by `spindle rt …` (one member per process, or
//! one per thread in tests), over shm or tcp (optionally each member in
//! its own network namespace): the thesis's 3-node ring, latency by
//! message size, best-effort vs time-based, and clock accuracy. Everything
//! below [`run_member`] is generic over the [`Fabric`].
//!
//! A scenario is described once ([`ScenarioSpec`], JSON on the command
//! line of each member process) and every member runs
//! [`run_member`], which writes a [`MemberReport`]. Pipelines (ring,
//! latency) are lists of [`StageSpec`]s in time order: a `send` stage
//! followed by a `recv` stage is a channel; a `user` stage is an
//! application computation task that takes the message from the channel
//! before it and passes it on to the channel after it.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{wait_all_joined, Fabric, PeerSet};
use spindle_runtime::monotonic_ns;

use spindle_rt::buffers::IteratorPolicy;
use spindle_rt::clock::InjectedClock;
use spindle_rt::clock_service::{ClockService, ClockServiceConfig, GlobalClock};
use spindle_rt::interference::{AdmissionMode, InterferenceReport};
use spindle_rt::layout::RtLayout;
use spindle_rt::node::{
    calibrate_host, layout_for, measure_channel_compute_ns, CalibrationPlan, ChannelKind, ChannelSpec, CommitConfig,
    CommitError, MissKind, MissReport, RtNode, RunCounters, RunStats, INTERFERENCE_PROBE_NS,
};
use spindle_rt::os::{drop_rt_priority, enter_netns, raise_threads_named, request_rt_privileges};
use spindle_rt::qos::{TaskKind, TaskSpec, TimeQos};
use spindle_rt::spin::{calibrate_spin, spin_cap_ns, SpinPolicy, SpinReport};
use spindle_rt::watchdog::{InterferenceExceeded, WatchdogConfig};

/// Which measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scenario {
    Ring,
    Latency,
    Compare,
    Clock,
}

impl Scenario {
    /// The `spindle rt` command that runs it.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Ring => "ring",
            Scenario::Latency => "latency",
            Scenario::Compare => "compare",
            Scenario::Clock => "clock",
        }
    }
}

/// One task of a pipeline, in time order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSpec {
    pub node: usize,
    /// "user", "send" or "recv".
    pub kind: String,
    pub offset_ns: u64,
    pub compute_ns: u64,
    pub deadline_ns: u64,
}

/// A node's injected clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeClockSpec {
    pub offset_ns: i64,
    pub drift_ppb: i64,
    /// `(after_ns, delta_ns)` steps.
    pub jumps: Vec<(u64, i64)>,
}

impl NodeClockSpec {
    pub fn injected(&self, start_mono_ns: u64) -> Result<InjectedClock, String> {
        let mut c = InjectedClock::new(start_mono_ns, self.offset_ns, self.drift_ppb);
        for &(at, d) in &self.jumps {
            c = c.with_jump(at, d)?;
        }
        Ok(c)
    }
}

/// How the members reach each other.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportSpec {
    /// `shm` (one host; the default when empty) or `tcp`.
    pub kind: String,
    /// tcp: `ip:port` where each member listens, by rank.
    pub addresses: Vec<String>,
    /// tcp: the group key, hex.
    pub key_hex: String,
    /// The network namespace (`ip netns` name) each member enters before
    /// opening the fabric, by rank; empty: none.
    pub netns: Vec<String>,
}

impl TransportSpec {
    pub fn name(&self) -> &str {
        if self.kind.is_empty() {
            "shm"
        } else {
            &self.kind
        }
    }

    fn tcp_options(&self, group: &str, layout: &RtLayout, join_timeout: Duration) -> Result<TcpOptions, String> {
        let addresses = self
            .addresses
            .iter()
            .enumerate()
            .map(|(r, a)| {
                a.parse()
                    .map_err(|e| format!("address of member {r} '{a}': {e} (expected ip:port)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let key = hex_decode(&self.key_hex)?;
        let mut options = TcpOptions::new(group, layout.row.row_len_bytes(), layout.row.tag(), addresses, key);
        options.join_timeout = join_timeout;
        Ok(options)
    }
}

/// Decode a hex string (the group key).
pub fn hex_decode(hex: &str) -> Result<Vec<u8>, String> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return Err(format!(
            "group key: {} hex digits, expected a non-zero even number",
            hex.len()
        ));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&hex[i..i + 2], 16)
                .map_err(|_| format!("group key: '{}' at {i} is not hex", &hex[i..i + 2]))
        })
        .collect()
}

/// Everything a member needs; identical for every member of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioSpec {
    pub scenario: Scenario,
    pub group: String,
    pub members: usize,
    /// Periods (ns): ring/latency use the first; compare runs each.
    pub period_ns: Vec<u64>,
    pub periods: u64,
    /// Message sizes (bytes): ring/latency/compare run each.
    pub sizes: Vec<usize>,
    /// Pipeline stages (ring, latency; compare uses the first four).
    pub stages: Vec<StageSpec>,
    /// Whether the pipeline wraps (ring: the last recv feeds the first user).
    pub wraps: bool,
    pub clocks: Vec<NodeClockSpec>,
    pub clock_bound_budget_ns: u64,
    pub jitter_samples: usize,
    /// Declared release jitter for admission instead of the calibrated
    /// maximum (tests, and runs that want to show what a declared figure does).
    pub release_jitter_declared_ns: Option<u64>,
    /// The fixed spin window (used when `spin_auto` is off).
    pub spin_ns: u64,
    /// Self-tune the spin window ([`spindle_rt::spin`]): calibrate it from this
    /// node's sleep overshoot, keep learning during the run.
    #[serde(default)]
    pub spin_auto: bool,
    pub fifo: bool,
    pub force: bool,
    pub lead_ns: u64,
    /// Clock scenario: how long, how often to sample.
    pub duration_ns: u64,
    pub sample_interval_ns: u64,
    pub seed: u64,
    /// The host monotonic time all injected clocks count from.
    pub start_mono_ns: u64,
    pub result_dir: PathBuf,
    pub join_timeout_ms: u64,
    /// Best-effort per-period quota (compare).
    pub best_effort_quota: usize,
    #[serde(default)]
    pub transport: TransportSpec,
    /// Run a watchdog next to each dispatcher (see [`spindle_rt::watchdog`]).
    #[serde(default = "yes")]
    pub watchdog: bool,
    /// How admission turns each member's calibration into margins.
    #[serde(default)]
    pub admission: AdmissionMode,
    /// How long each member calibrates its host before commit (at least
    /// `jitter_samples` wake-ups; see [`spindle_rt::interference`]).
    #[serde(default)]
    pub calibration_ns: u64,
    /// Declared interference for admission instead of the calibrated one
    /// (tests, and runs that want to show what a declared figure does).
    #[serde(default)]
    pub interference_declared_ns: Option<u64>,
    /// Percent of the interference admission charges (100: as measured;
    /// see `RtNode::set_interference_headroom`).
    #[serde(default = "headroom_as_measured")]
    pub interference_headroom_pct: u32,
    /// The least release jitter and interference admission takes: this
    /// host's record (worst-case mode; 0 without a record or in
    /// statistical mode). See [`crate::rt::host_record`].
    #[serde(default)]
    pub release_jitter_recorded_ns: u64,
    #[serde(default)]
    pub interference_recorded_ns: u64,
    /// The host record's file, which the launcher updates after the run
    /// (members only read the floors above).
    #[serde(default)]
    pub host_record: Option<PathBuf>,
}

fn yes() -> bool {
    true
}

/// p50 / p99 / max of a set of samples (ns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub samples: u64,
}

impl Summary {
    pub fn of(values: &[u64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        let mut v = values.to_vec();
        v.sort_unstable();
        let at = |q: f64| v[(((v.len() - 1) as f64) * q).round() as usize];
        Summary {
            p50: at(0.50),
            p99: at(0.99),
            max: *v.last().expect("non-empty"),
            samples: v.len() as u64,
        }
    }
}

/// One commit/run/uncommit cycle of a member.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    pub size: usize,
    pub period_ns: u64,
    /// Every node's verdict (`None`: accepted).
    pub verdicts: Vec<Option<String>>,
    /// This node's admission verdict as text.
    pub admission: String,
    pub epoch_start_ns: u64,
    /// The tasks this node ran: (name, offset, period, compute, deadline) ns.
    pub tasks: Vec<(String, u64, u64, u64, u64)>,
    /// Global time a user inserted message k (0: not inserted).
    pub inserted_ns: Vec<u64>,
    /// Global time a user extracted message k (0: not extracted).
    pub extracted_ns: Vec<u64>,
    /// The application did not have its message when it ran.
    pub app_missed: u64,
    /// Jobs of this node's user (computation) tasks dropped at their
    /// critical start (overruns ran, and are counted in `overruns`).
    pub user_jobs_missed: u64,
    /// Latencies measured inside messages (compare): time-based, best-effort.
    pub latency_time_based_ns: Vec<u64>,
    pub latency_best_effort_ns: Vec<u64>,
    pub best_effort_dropped: u64,
    pub release_jitter_ns: Summary,
    /// The widest spin window used in the run, and the last.
    #[serde(default)]
    pub spin_window_max_ns: u64,
    #[serde(default)]
    pub spin_window_end_ns: u64,
    /// The mean window over the run's waits (what the spinning cost).
    #[serde(default)]
    pub spin_window_mean_ns: u64,
    pub start_delay_ns: Summary,
    /// Execution time of the channel tasks (the zero-sided data path).
    pub send_exec_ns: Summary,
    pub receive_exec_ns: Summary,
    #[serde(flatten)]
    pub counters: RunCounters,
    /// Misses as reported through the callback (first 32).
    pub miss_log: Vec<String>,
    /// The commit was rejected by admission (the error, naming the node,
    /// the task, the bound it needed and the interference measured);
    /// nothing ran.
    #[serde(default)]
    pub rejected_at_commit: Option<String>,
    /// The watchdog's reports that the run's interference exceeded what
    /// admission assumed (first 16).
    #[serde(default)]
    pub interference_log: Vec<String>,
}

/// One clock sample: host time since start, error of the midpoint against
/// the true (injected) master time, the reported bound.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ClockSample {
    pub t_ns: u64,
    pub error_ns: i64,
    pub bound_ns: u64,
    pub inside: bool,
}

/// What one member measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemberReport {
    pub rank: usize,
    pub privileges: String,
    pub fifo_granted: bool,
    pub calibration_jitter_ns: Summary,
    /// The host's interference: calibrated, admitted, seen in the run.
    #[serde(default)]
    pub interference: InterferenceReport,
    /// How the spin window was chosen (and the calibration it came from).
    #[serde(default)]
    pub spin: SpinReport,
    pub clock_bound_ns_at_commit: u64,
    pub runs: Vec<RunReport>,
    pub clock_samples: Vec<ClockSample>,
    pub clock_unsynced_samples: u64,
    pub clock_rounds: u64,
    pub clock_jumps_detected: u64,
}

impl MemberReport {
    pub fn path(dir: &Path, rank: usize) -> PathBuf {
        dir.join(format!("rt-member-{rank}.json"))
    }
}

/// Run one member of `spec` and write its report; returns it too. Enters
/// the member's network namespace first (if any), then opens the fabric
/// the spec names.
pub fn run_member(spec: &ScenarioSpec, rank: usize) -> Result<MemberReport, String> {
    let channels = channels_of(spec, 0)?;
    let layout = Arc::new(layout_for(spec.members, &channels));
    if let Some(ns) = spec.transport.netns.get(rank).filter(|n| !n.is_empty()) {
        enter_netns(ns).map_err(|e| format!("member {rank}: {e}"))?;
    }
    let join_timeout = Duration::from_millis(spec.join_timeout_ms);
    match spec.transport.name() {
        "shm" => {
            let mut options = ShmOptions::new(&spec.group, spec.members, layout.row.row_len_bytes(), layout.row.tag());
            options.layout_description = layout.row.summary();
            let fabric = ShmFabric::open(&options, rank).map_err(|e| format!("member {rank}: {e}"))?;
            run_member_on(spec, rank, Arc::new(fabric), layout)
        }
        "tcp" => {
            let options = spec.transport.tcp_options(&spec.group, &layout, join_timeout)?;
            if options.addresses.len() != spec.members {
                return Err(format!(
                    "{} tcp addresses for {} members",
                    options.addresses.len(),
                    spec.members
                ));
            }
            let fabric = TcpFabric::open(&options, rank).map_err(|e| format!("member {rank}: {e}"))?;
            if spec.fifo {
                // The channel data arrive through the fabric's receive
                // thread: below the dispatcher (80) and the clock (70) it
                // could wait behind them; above the clock it delivers the
                // clock's replies too. It blocks in poll, so it never spins.
                // A new thread names itself once it first runs: look again
                // for a while (bounded) until it has.
                let mut raised = 0;
                for _ in 0..100 {
                    raised = raise_threads_named("spindle-tcp-rec", 75);
                    if raised > 0 {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                if raised == 0 {
                    eprintln!("member {rank}: the tcp receive thread stays at normal priority (not found by name)");
                }
            }
            run_member_on(spec, rank, Arc::new(fabric), layout)
        }
        other => Err(format!("transport '{other}': expected shm or tcp")),
    }
}

/// [`run_member`] on an open fabric.
pub fn run_member_on<F: Fabric>(
    spec: &ScenarioSpec,
    rank: usize,
    fabric: Arc<F>,
    layout: Arc<RtLayout>,
) -> Result<MemberReport, String> {
    wait_all_joined(&*fabric, &spec.group, Duration::from_millis(spec.join_timeout_ms)).map_err(|e| e.to_string())?;
    let clock_spec = spec.clocks.get(rank).cloned().unwrap_or_default();
    let injected = clock_spec.injected(spec.start_mono_ns)?;
    let config = ClockServiceConfig {
        fifo_priority: spec.fifo.then_some(70),
        ring_doorbell: spec.transport.name() != "tcp",
        ..ClockServiceConfig::default()
    };
    let service = ClockService::start(fabric.clone(), layout.clone(), injected, config);
    let mut report = MemberReport {
        rank,
        ..MemberReport::default()
    };
    let result = match spec.scenario {
        Scenario::Clock => run_clock(spec, &service, &mut report),
        _ => run_channels(spec, rank, fabric.clone(), layout.clone(), &service, &mut report),
    };
    report.clock_rounds = service.clock().rounds.load(std::sync::atomic::Ordering::Relaxed);
    report.clock_jumps_detected = service
        .clock()
        .jumps_detected
        .load(std::sync::atomic::Ordering::Relaxed);
    // Every member stays until all are done, so the master keeps serving
    // the clock and nobody's row disappears under a reader.
    finish_barrier(&*fabric, &layout, spec)?;
    drop(service);
    result?;
    let path = MemberReport::path(&spec.result_dir, rank);
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    std::fs::write(&path, json).map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(report)
}

/// Each member bumps its `commit_generation` past any commit and waits
/// for everyone: a barrier in rows (generation `u64::MAX / 2`).
fn finish_barrier<F: Fabric>(fabric: &F, layout: &RtLayout, spec: &ScenarioSpec) -> Result<(), String> {
    const DONE: u64 = u64::MAX / 2;
    let at = layout.commit_generation.offset();
    // Partner: the Acquire loads below, in every other member.
    fabric
        .row(fabric.member_rank())
        .u64_at(at)
        .store(DONE, std::sync::atomic::Ordering::Release);
    let _ = fabric.push(
        at..at + 8,
        PeerSet::all_except(fabric.member_rank(), fabric.member_count()),
    );
    let started = monotonic_ns();
    let timeout_ns = spec.join_timeout_ms * 1_000_000 + spec.duration_ns + 60_000_000_000;
    loop {
        let all = (0..fabric.member_count())
            .all(|r| fabric.row(r).u64_at(at).load(std::sync::atomic::Ordering::Acquire) >= DONE);
        if all {
            return Ok(());
        }
        if monotonic_ns() - started > timeout_ns {
            return Err("timed out waiting for the other members to finish".into());
        }
        fabric.check_peers().map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The channels of a scenario (identical on every member).
pub fn channels_of(spec: &ScenarioSpec, period_index: usize) -> Result<Vec<ChannelSpec>, String> {
    let period_ns = *spec.period_ns.get(period_index).ok_or("no period given")?;
    let size_max = spec.sizes.iter().copied().max().ok_or("no message size given")?;
    // A measured compute time never exceeds the task's deadline: where the
    // copy is that slow the admission test rejects the set; a task spec
    // it could not even state would stop the run instead.
    let compute =
        |bytes: usize, n: usize, deadline_ns: u64| measure_channel_compute_ns(bytes, n, 64, 5_000).min(deadline_ns);
    let stage_qos = |s: &StageSpec| TimeQos::new(s.offset_ns, period_ns, s.deadline_ns);
    let mut channels = Vec::new();
    match spec.scenario {
        Scenario::Clock => {}
        Scenario::Ring | Scenario::Latency => {
            for i in 0..spec.stages.len() {
                let (s, next) = (&spec.stages[i], spec.stages.get(i + 1));
                if s.kind != "send" {
                    continue;
                }
                let r = next
                    .filter(|n| n.kind == "recv")
                    .ok_or(format!("stage {i}: a send must be followed by a recv"))?;
                channels.push(ChannelSpec {
                    name: format!("n{}->n{}", s.node, r.node),
                    kind: ChannelKind::TimeDriven,
                    sender: s.node,
                    receivers: PeerSet(1 << r.node),
                    message_bytes_max: size_max,
                    // Room for one late message besides this period's, so
                    // one missed send does not leave the pipeline a period behind.
                    messages_per_period_max: 2,
                    buffer_count: 4,
                    policy: IteratorPolicy::Fifo,
                    send_qos: stage_qos(s),
                    receive_qos: stage_qos(r),
                    send_compute_ns: s.compute_ns.max(compute(size_max, 1, s.deadline_ns)),
                    receive_compute_ns: r.compute_ns.max(compute(size_max, 1, r.deadline_ns)),
                });
            }
        }
        Scenario::Compare => {
            if spec.stages.len() < 4 {
                return Err("compare needs four stages: user, send, recv, user".into());
            }
            let (send, recv) = (&spec.stages[1], &spec.stages[2]);
            for (name, kind, per_period, buffers) in [
                ("time-based", ChannelKind::TimeDriven, 2, 8),
                (
                    "best-effort",
                    ChannelKind::BestEffort,
                    spec.best_effort_quota.max(1),
                    1_024,
                ),
            ] {
                channels.push(ChannelSpec {
                    name: name.into(),
                    kind,
                    sender: 0,
                    receivers: PeerSet(1 << 1),
                    message_bytes_max: size_max,
                    messages_per_period_max: per_period,
                    buffer_count: buffers,
                    policy: IteratorPolicy::Fifo,
                    send_qos: stage_qos(send),
                    receive_qos: stage_qos(recv),
                    send_compute_ns: compute(size_max, per_period, send.deadline_ns),
                    receive_compute_ns: compute(size_max, per_period, recv.deadline_ns),
                });
            }
        }
    }
    Ok(channels)
}

fn run_channels<F: Fabric>(
    spec: &ScenarioSpec,
    rank: usize,
    fabric: Arc<F>,
    layout: Arc<RtLayout>,
    service: &ClockService,
    report: &mut MemberReport,
) -> Result<(), String> {
    // Real-time priority for this (the dispatcher's) thread only.
    // Locked memory: no page fault on the data path (mlockall, MCL_FUTURE).
    let privileges = request_rt_privileges(spec.fifo, 80, true);
    report.fifo_granted = privileges.sched_fifo.is_ok();
    report.privileges = privileges.describe();
    // Calibrate after the clock has synchronized, so its warm-up bursts
    // are not what the dispatcher's jitter is measured against.
    let synced = service.wait_synced(spec.clock_bound_budget_ns, Duration::from_secs(20));
    let spin = choose_spin(spec, rank);
    report.spin = spin.1;
    let spin = spin.0;
    // The release jitter and the interference admission uses, measured
    // with the window the run starts with (an auto window never goes below
    // it), over seconds (`calibration_ns`): long enough to see the host's
    // preemptions, not only its wake-ups (see `calibration_plan`).
    let host = calibrate_host(calibration_plan(spec, rank, &spin));
    report.calibration_jitter_ns = Summary::of(&host.release_jitter_ns);
    // Declared figures replace the measured ones; measured ones are at
    // least what this host has ever shown (its record).
    let jitter_ns = spec.release_jitter_declared_ns.unwrap_or(
        spec.admission
            .margin_ns(&host.release_jitter_ns)
            .max(spec.release_jitter_recorded_ns),
    );
    let interference_ns = spec.interference_declared_ns.unwrap_or(
        spec.admission
            .margin_ns(&host.lost_ns)
            .max(spec.interference_recorded_ns),
    );
    let lost = Summary::of(&host.lost_ns);
    report.interference = InterferenceReport {
        calibration_ns: host.duration_ns,
        wakeups: host.lost_ns.len() as u64,
        lost_p99_ns: lost.p99,
        lost_max_ns: lost.max,
        gap_max_ns: host.gap_max_ns,
        release_jitter_admitted_ns: jitter_ns,
        interference_admitted_ns: interference_ns,
        release_jitter_recorded_ns: spec.release_jitter_recorded_ns,
        interference_recorded_ns: spec.interference_recorded_ns,
        ..InterferenceReport::default()
    };
    let outcome = synced.and_then(|bound| {
        report.clock_bound_ns_at_commit = bound;
        let combos: Vec<(usize, usize)> = match spec.scenario {
            Scenario::Compare => (0..spec.period_ns.len())
                .flat_map(|p| spec.sizes.iter().map(move |&s| (p, s)))
                .collect(),
            _ => spec.sizes.iter().map(|&s| (0, s)).collect(),
        };
        for (period_index, size) in combos {
            let channels = channels_of(spec, period_index)?;
            let mut node = RtNode::new(fabric.clone(), layout.clone(), service.clock().clone(), channels)?;
            node.set_admission(spec.admission, interference_ns);
            node.set_interference_headroom(spec.interference_headroom_pct);
            let run = match spec.scenario {
                Scenario::Compare => compare_run(spec, rank, &mut node, period_index, size, jitter_ns, &spin)?,
                _ => pipeline_run(spec, rank, &mut node, size, jitter_ns, &spin)?,
            };
            let r = &mut report.interference;
            r.run_gap_max_ns = r.run_gap_max_ns.max(run.counters.interference_lost_max_ns);
            r.run_release_late_max_ns = r.run_release_late_max_ns.max(run.counters.release_late_max_ns);
            r.run_over_admitted += run.counters.interference_over_admitted;
            report.runs.push(run);
        }
        Ok(())
    });
    drop_rt_priority();
    outcome
}

/// How this member calibrates its host: wake-ups at least 4 spin windows
/// and 1 ms apart; on one host (shm) the members take turns (phase `rank ×
/// gap / members`, each turn twice as long as the widest window any member
/// may use plus the probe), so that their spins never overlap and the
/// members together spin at most half of one CPU: no more than the
/// dispatchers will (a calibration that loads the host more than the run
/// measures its own load: on the 2-vCPU VM this was built on, members
/// spinning most of a CPU saw 12–22 ms stalls, see bench/RESULTS-rt.md §8).
pub fn calibration_plan(spec: &ScenarioSpec, rank: usize, spin: &SpinPolicy) -> CalibrationPlan {
    const MS: u64 = 1_000_000;
    let window = spin.window_ns();
    let mut gap_ns = (4 * window).max(MS);
    let mut phase_ns = 0;
    if spec.transport.name() == "shm" && spec.members > 1 {
        let widest = match spin {
            SpinPolicy::Auto(t) => t.cap_ns(),
            SpinPolicy::Fixed(w) => *w,
        };
        let turn_ns = 2 * (widest + INTERFERENCE_PROBE_NS);
        gap_ns = gap_ns.max(turn_ns * spec.members as u64);
        phase_ns = rank as u64 * (gap_ns / spec.members as u64);
    }
    CalibrationPlan {
        wakeups_min: spec.jitter_samples,
        duration_ns: spec.calibration_ns,
        gap_ns,
        spin_ns: window,
        probe_ns: INTERFERENCE_PROBE_NS,
        phase_ns,
    }
}

/// The spin window this node starts with: fixed (`spec.spin_ns`), or
/// calibrated from plain sleeps as long as this node's typical gap between
/// releases (the shortest period over its releases per period, 1–20 ms;
/// at most ~3 s of sleeps), capped at 1/16 of the shortest period.
pub fn choose_spin(spec: &ScenarioSpec, rank: usize) -> (SpinPolicy, SpinReport) {
    const MS: u64 = 1_000_000;
    if !spec.spin_auto {
        let report = SpinReport {
            window_ns: spec.spin_ns,
            window_max_ns: spec.spin_ns,
            window_end_ns: spec.spin_ns,
            cap_ns: spec.spin_ns,
            ..SpinReport::default()
        };
        return (SpinPolicy::Fixed(spec.spin_ns), report);
    }
    let period_min = spec.period_ns.iter().copied().min().unwrap_or(16 * MS).max(1);
    let releases = spec.stages.iter().filter(|s| s.node == rank).count().max(1) as u64;
    let gap = (period_min / releases).clamp(MS, 20 * MS);
    let samples = spec.jitter_samples.min((3_000 * MS / gap) as usize).max(1);
    let (tuner, report) = calibrate_spin(samples, gap, spin_cap_ns(period_min));
    (SpinPolicy::Auto(Box::new(tuner)), report)
}

fn commit_config(spec: &ScenarioSpec, jitter_ns: u64, periods: u64) -> CommitConfig {
    CommitConfig {
        clock_bound_budget_ns: spec.clock_bound_budget_ns,
        release_jitter_ns: jitter_ns,
        lead_ns: spec.lead_ns,
        periods,
        timeout: Duration::from_secs(30),
        force: spec.force,
    }
}

/// Shared recording state of a pipeline member's user tasks.
struct PipelineLog {
    inserted_ns: Vec<u64>,
    extracted_ns: Vec<u64>,
    app_missed: u64,
}

fn message_number(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(b)
}

/// Ring or latency: register the user tasks of this node, commit, run.
fn pipeline_run<F: Fabric>(
    spec: &ScenarioSpec,
    rank: usize,
    node: &mut RtNode<F>,
    size: usize,
    jitter_ns: u64,
    spin: &SpinPolicy,
) -> Result<RunReport, String> {
    let period_ns = spec.period_ns[0];
    let p = spec.periods;
    let log = Rc::new(RefCell::new(PipelineLog {
        inserted_ns: vec![0; p as usize],
        extracted_ns: vec![0; p as usize],
        app_missed: 0,
    }));
    let n = spec.stages.len();
    for (i, stage) in spec
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.node == rank && s.kind == "user")
    {
        let before = if i > 0 {
            Some(i - 1)
        } else if spec.wraps {
            Some(n - 1)
        } else {
            None
        };
        let before = before.filter(|&b| spec.stages[b].kind == "recv");
        let after = spec.stages.get(i + 1).filter(|s| s.kind == "send").map(|_| i + 1);
        let origin = i == 0;
        let input = before.map(|b| format!("n{}->n{}", spec.stages[b - 1].node, rank));
        let output = after.map(|a| format!("n{}->n{}", rank, spec.stages[a + 1].node));
        let input = input
            .map(|name| node.channel(&name).ok_or(format!("no channel {name}")))
            .transpose()?;
        let output = output
            .map(|name| node.channel(&name).ok_or(format!("no channel {name}")))
            .transpose()?;
        let log = log.clone();
        let mut scratch = vec![0u8; size];
        let task = TaskSpec::new(
            &format!("n{rank} user"),
            TaskKind::Computation,
            TimeQos::new(stage.offset_ns, period_ns, stage.deadline_ns),
            stage.compute_ns,
        );
        node.register_computation(
            task,
            Box::new(move |ctx| {
                let k = ctx.job.period;
                let now = ctx.global_now_ns().unwrap_or(0);
                let mut log = log.borrow_mut();
                // Which message this user expects: the origin of a ring gets
                // back last period's; everyone else this period's.
                let expected = if origin { k.checked_sub(1) } else { Some(k) }.filter(|e| *e < p);
                let mut got = None;
                if let Some(ch) = input {
                    while let Some((len, _)) = ctx.take_into(ch, &mut scratch) {
                        let number = message_number(&scratch[..len]);
                        if Some(number) == expected {
                            got = Some(number);
                        }
                    }
                    if let Some(e) = expected {
                        if got == Some(e) {
                            log.extracted_ns[e as usize] = now;
                        } else {
                            log.app_missed += 1;
                        }
                    }
                }
                let Some(ch) = output else { return };
                let send = if origin {
                    Some(k).filter(|k| *k < p)
                } else {
                    got.filter(|g| Some(*g) == expected)
                };
                if let Some(m) = send {
                    let fill = |buf: &mut [u8]| {
                        let n = size.min(8);
                        buf[..n].copy_from_slice(&m.to_le_bytes()[..n]);
                        size
                    };
                    if ctx.insert_with(ch, m, fill).is_ok() {
                        log.inserted_ns[m as usize] = now;
                    }
                }
            }),
        )?;
    }
    // One extra period lets the last message finish its trip.
    let report = commit_and_run(spec, node, jitter_ns, p + 1, size, period_ns, spin)?;
    let log = Rc::try_unwrap(log)
        .map_err(|_| "user tasks still registered")?
        .into_inner();
    Ok(RunReport {
        inserted_ns: log.inserted_ns,
        extracted_ns: log.extracted_ns,
        app_missed: log.app_missed,
        ..report
    })
}

/// Commit (both phases), run with a watchdog, uncommit; the report's
/// common part (verdicts, admission, tasks, counters, misses).
fn commit_and_run<F: Fabric>(
    spec: &ScenarioSpec,
    node: &mut RtNode<F>,
    jitter_ns: u64,
    periods: u64,
    size: usize,
    period_ns: u64,
    spin: &SpinPolicy,
) -> Result<RunReport, String> {
    let committed = match node.commit(&commit_config(spec, jitter_ns, periods)) {
        Ok(c) => c,
        Err(e @ CommitError::Rejected { .. }) => {
            // Every member gets the same rejection: an answer, not a failure.
            node.uncommit();
            return Ok(RunReport {
                size,
                period_ns,
                admission: e.to_string(),
                rejected_at_commit: Some(e.to_string()),
                ..RunReport::default()
            });
        }
        Err(e) => return Err(e.to_string()),
    };
    let (stats, misses) = run_node(node, spec, spin)?;
    node.uncommit();
    Ok(RunReport {
        size,
        period_ns,
        verdicts: committed.verdicts.clone(),
        admission: match &committed.admission {
            Ok(a) => format!(
                "admitted: utilization {} ppm, slack {} ns",
                a.utilization_ppm, a.slack_ns_min
            ),
            Err(r) => format!("REJECTED (run forced): {r}"),
        },
        epoch_start_ns: committed.epoch_start_ns,
        tasks: committed
            .tasks
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.qos.release_offset_ns,
                    t.qos.period_ns,
                    t.compute_ns,
                    t.qos.deadline_ns,
                )
            })
            .collect(),
        user_jobs_missed: misses.user_jobs_missed,
        release_jitter_ns: Summary::of(&stats.release_jitter_ns),
        spin_window_max_ns: stats.spin_window_max_ns,
        spin_window_end_ns: stats.spin_window_end_ns,
        spin_window_mean_ns: stats.spin_window_sum_ns / stats.spin_waits.max(1),
        start_delay_ns: Summary::of(&stats.start_delay_ns),
        send_exec_ns: Summary::of(&stats.send_exec_ns),
        receive_exec_ns: Summary::of(&stats.receive_exec_ns),
        counters: stats.counters,
        miss_log: misses.lines,
        interference_log: misses.interference,
        ..RunReport::default()
    })
}

/// Misses as reported, by the dispatcher or by the watchdog.
#[derive(Default)]
struct MissLog {
    /// The first 32, as text.
    lines: Vec<String>,
    /// Jobs of user (computation) tasks dropped or not started in time.
    user_jobs_missed: u64,
    /// The watchdog's interference reports, as text (bounded by the
    /// watchdog: `INTERFERENCE_REPORTS_MAX`).
    interference: Vec<String>,
}

impl MissLog {
    fn record(&mut self, m: &MissReport) {
        let dropped = matches!(m.kind, MissKind::Early | MissKind::NotStarted);
        self.user_jobs_missed += u64::from(dropped && m.task.ends_with(" user"));
        if self.lines.len() < 32 {
            self.lines.push(describe_miss(m));
        }
    }
}

/// One line about interference over what admission assumed.
pub fn describe_interference(e: &InterferenceExceeded) -> String {
    format!(
        "interference exceeded what admission assumed: the dispatcher lost its CPU for up to {} µs at once (admitted {} µs), releases up to {} µs late (admitted {} µs of release jitter); {} observations over",
        e.lost_max_ns / 1_000,
        e.interference_admitted_ns / 1_000,
        e.release_late_max_ns / 1_000,
        e.release_jitter_admitted_ns / 1_000,
        e.over_admitted
    )
}

/// One line about a miss: which job, what, and when it was detected.
pub fn describe_miss(m: &MissReport) -> String {
    let kind = match m.kind {
        MissKind::Early => "missed early (dropped at critical start)",
        MissKind::NotStarted => "not started by its critical start (watchdog: the dispatcher was busy or stalled)",
        MissKind::Overrun => "overran its deadline",
        MissKind::MessageMissing => "found no message",
        MissKind::MessageTorn => "found its slot overwritten",
    };
    let ahead = m.deadline_ns as i64 - m.detected_ns as i64;
    let who = if m.kind == MissKind::NotStarted {
        "the watchdog was not running either (every thread stalled)"
    } else {
        "the dispatcher was not running"
    };
    let when = if ahead >= 0 {
        format!("detected {ahead} ns before the deadline")
    } else {
        format!("detected {} ns after the deadline: {who}", -ahead)
    };
    format!("{} period {}: {kind} ({when})", m.task, m.period)
}

/// Run the dispatcher with a watchdog (SCHED_FIFO 81 when asked: above
/// the dispatcher's 80, so it preempts a dispatcher stuck in a job).
fn run_node<F: Fabric>(
    node: &mut RtNode<F>,
    spec: &ScenarioSpec,
    spin: &SpinPolicy,
) -> Result<(RunStats, MissLog), String> {
    let log = Arc::new(Mutex::new(MissLog {
        lines: Vec::with_capacity(32),
        user_jobs_missed: 0,
        interference: Vec::with_capacity(spindle_rt::watchdog::INTERFERENCE_REPORTS_MAX as usize),
    }));
    let (watched, told) = (log.clone(), log.clone());
    node.set_watchdog(spec.watchdog.then(|| WatchdogConfig {
        on_miss: Arc::new(move |m| watched.lock().unwrap_or_else(|p| p.into_inner()).record(m)),
        on_interference: Some(Arc::new(move |e| {
            told.lock()
                .unwrap_or_else(|p| p.into_inner())
                .interference
                .push(describe_interference(e))
        })),
        fifo_priority: spec.fifo.then_some(81),
    }));
    let result = node.run(spin.clone(), &mut |m| {
        log.lock().unwrap_or_else(|p| p.into_inner()).record(m)
    });
    node.set_watchdog(None);
    let stats = result?;
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    Ok((stats, log))
}

/// A tiny deterministic generator (xorshift) for the best-effort load.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

struct CompareLog {
    time_based_ns: Vec<u64>,
    best_effort_ns: Vec<u64>,
    dropped: u64,
}

/// Best-effort vs time-based (Table 5.3): node 0 sends, node 1 receives.
/// The time-based channel carries 2 messages every period; the
/// best-effort sender offers a random 0–4 per period through per-message
/// `send`, and its channel reserves only the average (2 per period).
fn compare_run<F: Fabric>(
    spec: &ScenarioSpec,
    rank: usize,
    node: &mut RtNode<F>,
    period_index: usize,
    size: usize,
    jitter_ns: u64,
    spin: &SpinPolicy,
) -> Result<RunReport, String> {
    let period_ns = spec.period_ns[period_index];
    let p = spec.periods;
    let (tb, be) = (
        node.channel("time-based").ok_or("no time-based channel")?,
        node.channel("best-effort").ok_or("no best-effort channel")?,
    );
    let log = Rc::new(RefCell::new(CompareLog {
        time_based_ns: Vec::with_capacity(2 * p as usize),
        best_effort_ns: Vec::with_capacity(4 * p as usize),
        dropped: 0,
    }));
    let stage = if rank == 0 { &spec.stages[0] } else { &spec.stages[3] };
    let task = TaskSpec::new(
        &format!("n{rank} user"),
        TaskKind::Computation,
        TimeQos::new(stage.offset_ns, period_ns, stage.deadline_ns),
        stage.compute_ns,
    );
    let log2 = log.clone();
    let mut rng = spec.seed | 1;
    let mut buf = vec![0u8; size.max(8)];
    node.register_computation(
        task,
        Box::new(move |ctx| {
            let now = ctx.global_now_ns().unwrap_or(0);
            let mut log = log2.borrow_mut();
            if rank == 0 {
                let stamp = |b: &mut [u8]| {
                    b[..8].copy_from_slice(&now.to_le_bytes());
                    size
                };
                for _ in 0..2 {
                    let _ = ctx.insert_with(tb, 0, stamp);
                }
                if ctx.job.period < p {
                    for _ in 0..next_random(&mut rng) % 5 {
                        buf[..8].copy_from_slice(&now.to_le_bytes());
                        if ctx.send(be, &buf[..size]).is_err() {
                            log.dropped += 1;
                        }
                    }
                }
            } else {
                while let Some((len, _)) = ctx.take_into(tb, &mut buf) {
                    let sent = message_number(&buf[..len.min(8)]);
                    if log.time_based_ns.len() < log.time_based_ns.capacity() {
                        log.time_based_ns.push(now.saturating_sub(sent));
                    }
                }
                while let Some(len) = ctx.receive(be, &mut buf) {
                    let sent = message_number(&buf[..len.min(8)]);
                    if log.best_effort_ns.len() < log.best_effort_ns.capacity() {
                        log.best_effort_ns.push(now.saturating_sub(sent));
                    }
                }
            }
        }),
    )?;
    // Extra periods drain the best-effort backlog.
    let report = commit_and_run(spec, node, jitter_ns, p + p / 4 + 8, size, period_ns, spin)?;
    let log = Rc::try_unwrap(log)
        .map_err(|_| "user task still registered")?
        .into_inner();
    Ok(RunReport {
        latency_time_based_ns: log.time_based_ns,
        latency_best_effort_ns: log.best_effort_ns,
        best_effort_dropped: log.dropped,
        ..report
    })
}

/// Clock accuracy: every non-master samples its `now()` against the true
/// master time (known: the injected clocks are in the spec).
fn run_clock(spec: &ScenarioSpec, service: &ClockService, report: &mut MemberReport) -> Result<(), String> {
    let clock: &GlobalClock = service.clock();
    if clock.is_master() {
        std::thread::sleep(Duration::from_nanos(spec.duration_ns));
        return Ok(());
    }
    let master = spec
        .clocks
        .first()
        .cloned()
        .unwrap_or_default()
        .injected(spec.start_mono_ns)?;
    service.wait_synced(u64::MAX / 4, Duration::from_secs(20))?;
    let started = monotonic_ns();
    let samples_max = (spec.duration_ns / spec.sample_interval_ns.max(1)) as usize + 1;
    report.clock_samples.reserve(samples_max);
    while monotonic_ns() - started < spec.duration_ns && report.clock_samples.len() < samples_max {
        let mono = monotonic_ns();
        match clock.at_mono(mono) {
            Ok(i) => {
                let truth = master.local(mono);
                report.clock_samples.push(ClockSample {
                    t_ns: mono - started,
                    error_ns: i.mid_ns() as i64 - truth as i64,
                    bound_ns: i.bound_ns(),
                    inside: i.contains(truth),
                });
            }
            Err(_) => report.clock_unsynced_samples += 1,
        }
        std::thread::sleep(Duration::from_nanos(spec.sample_interval_ns));
    }
    Ok(())
}

fn headroom_as_measured() -> u32 {
    100
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_picks_nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        let s = Summary::of(&v);
        assert_eq!((s.p50, s.p99, s.max, s.samples), (51, 99, 100, 100));
        assert_eq!(Summary::of(&[]), Summary::default());
    }

    #[test]
    fn message_numbers_fit_short_messages() {
        assert_eq!(message_number(&7u64.to_le_bytes()[..4]), 7);
        assert_eq!(message_number(&[]), 0);
    }
}
