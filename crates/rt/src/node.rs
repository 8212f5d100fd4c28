//! A node of time-driven channels over a fabric: declare channels, register
//! computation tasks, `commit` collectively (admission control on every
//! node, all-or-nothing, a common `epoch_start` in the future), `run` the
//! dispatcher (zero-sided transfers at release times), `uncommit`.
//!
//! ```text
//!   declare channels ─▶ RtNode::new ─▶ register_computation … ─▶ commit ─▶ run ─▶ uncommit
//!      commit, phase 1 (prepare): admission on every node; verdicts, proposals in rows
//!      commit, phase 2 (activate): epoch_start = max of proposals; every node votes; one abort aborts all
//! ```
//!
//! Activation is part of the commit agreement (the thesis's Chapter VI
//! gray areas): every channel task starts at `epoch_start + k·T + O` on
//! every node, with no separate `activate` call that could be made in the
//! middle of a period, and `epoch_start` is known before it arrives so
//! computation tasks are scheduled against it. See [`RtNode::commit`].
//!
//! Data path (zero-sided): the send task takes up to
//! `messages_per_period_max` buffers from the sender's input pool (its
//! iterator policy decides which) and writes them into slot `k % 2` of
//! its row, then stores the channel guard `k + 1` (Release). Each receive
//! task, released after the send deadline plus twice the clock bound,
//! checks the guard (Acquire), copies the slot to a scratch buffer, checks
//! the seqlock `begin` counter, and inserts the messages into the
//! receiver's output pool. The application only fills and drains pools,
//! from its computation tasks run by the same dispatcher.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_fabric::{Fabric, PeerSet};
use spindle_sst::monotonic_ns;

use crate::admission::{admit_node, check_channel_order, Admitted, Margins, Rejection};
use crate::buffers::{BufferError, BufferPool, IteratorPolicy};
use crate::clock_service::GlobalClock;
use crate::dispatch::{DispatchCore, Job, Poll};
use crate::layout::{self, ChannelArea, RtLayout, MESSAGE_HEADER_BYTES, REASON_BYTES_MAX, SLOT_HEADER_BYTES};
use crate::os::sleep_until_hybrid;
use crate::qos::{TaskKind, TaskSpec, TimeQos};
use crate::spin::SpinPolicy;
use crate::watchdog::{self, Timetable, WatchdogConfig, WatchdogShared};

/// Most channels one node declares.
pub const CHANNELS_MAX: usize = 64;
/// Verdict codes in the low 2 bits of `commit_verdict` (generation × 4 + code).
const VERDICT_ACCEPT: u64 = 1;
const VERDICT_REJECT: u64 = 2;
/// Most per-job samples a run keeps (each of jitter, start delay, exec time).
pub const RUN_SAMPLES_MAX: u64 = 1 << 18;

/// Time-driven (admitted, zero-sided) or best-effort (no admission,
/// per-message `send`/`receive` by the application).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    TimeDriven,
    BestEffort,
}

/// A channel as every member declares it (identically: the commit checks
/// a fingerprint). One receiver: point-to-point; several: broadcast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSpec {
    pub name: String,
    pub kind: ChannelKind,
    pub sender: usize,
    pub receivers: PeerSet,
    pub message_bytes_max: usize,
    pub messages_per_period_max: usize,
    /// Registered buffers at each end.
    pub buffer_count: usize,
    pub policy: IteratorPolicy,
    pub send_qos: TimeQos,
    pub receive_qos: TimeQos,
    /// Compute time of the send and receive tasks (measured or declared).
    pub send_compute_ns: u64,
    pub receive_compute_ns: u64,
}

impl ChannelSpec {
    pub fn send_task(&self) -> TaskSpec {
        TaskSpec::new(
            &format!("{} send", self.name),
            TaskKind::ChannelSend,
            self.send_qos,
            self.send_compute_ns,
        )
    }
    pub fn receive_task(&self, rank: usize) -> TaskSpec {
        TaskSpec::new(
            &format!("{} recv@{rank}", self.name),
            TaskKind::ChannelReceive,
            self.receive_qos,
            self.receive_compute_ns,
        )
    }
    fn validate(&self, members: usize) -> Result<(), String> {
        if self.sender >= members {
            return Err(format!(
                "channel '{}': sender {} ≥ members {members}",
                self.name, self.sender
            ));
        }
        if self.receivers.0 == 0 || self.receivers.iter().any(|r| r >= members || r == self.sender) {
            return Err(format!(
                "channel '{}': receivers {:?} must be non-empty, < {members} and exclude the sender",
                self.name,
                self.receivers.iter().collect::<Vec<_>>()
            ));
        }
        if !(1..=1 << 20).contains(&self.message_bytes_max) || !(1..=64).contains(&self.messages_per_period_max) {
            return Err(format!(
                "channel '{}': message_bytes_max {} must be in 1..=1048576 and messages_per_period_max {} in 1..=64",
                self.name, self.message_bytes_max, self.messages_per_period_max
            ));
        }
        self.send_task().validate().map_err(|e| e.to_string())?;
        self.receive_task(0).validate().map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The row layout for these channels.
pub fn layout_for(members: usize, channels: &[ChannelSpec]) -> RtLayout {
    let shapes: Vec<(usize, usize)> = channels
        .iter()
        .map(|c| (c.message_bytes_max, c.messages_per_period_max))
        .collect();
    RtLayout::new(members, &shapes)
}

/// Group-wide commit parameters (identical on every member) and this
/// node's measured release jitter.
#[derive(Debug, Clone, Copy)]
pub struct CommitConfig {
    /// The clock bound every node must stay within; deadlines are
    /// shortened by it.
    pub clock_bound_budget_ns: u64,
    /// This node's measured release jitter; deadlines are shortened by it.
    pub release_jitter_ns: u64,
    /// How far in the future to propose `epoch_start`.
    pub lead_ns: u64,
    /// Periods every task runs (`u64::MAX`: until uncommit).
    pub periods: u64,
    pub timeout: Duration,
    /// Run even if admission rejects (to measure what a rejected set
    /// does); the verdict is still reported.
    pub force: bool,
}

/// Why a commit failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("commit rejected by node {node}: {reason}")]
    Rejected { node: usize, reason: String },
    #[error(
        "node {node} declared a different channel set or commit parameters (fingerprint {theirs:#x}, ours {ours:#x})"
    )]
    Mismatch { node: usize, theirs: u64, ours: u64 },
    #[error("node {node} stopped before giving its commit verdict (see its own error)")]
    PeerStopped { node: usize },
    #[error("timed out after {waited_ms} ms waiting for the commit verdicts of nodes {missing:?}")]
    Timeout { missing: Vec<usize>, waited_ms: u64 },
    /// Phase 2 (activation) failed on `node`: every node aborts, none is active.
    #[error("commit aborted at activation by node {node}: {reason}")]
    Aborted { node: usize, reason: String },
    #[error("already committed: uncommit first")]
    AlreadyCommitted,
    #[error("clock: {0}")]
    Clock(String),
    #[error("fabric: {0}")]
    Fabric(String),
}

/// What a successful commit agreed.
#[derive(Debug, Clone)]
pub struct Committed {
    pub epoch_start_ns: u64,
    /// This node's admission result (`Err` only with `force`).
    pub admission: Result<Admitted, Rejection>,
    /// Every node's verdict (`None`: accepted), by rank.
    pub verdicts: Vec<Option<String>>,
    /// The tasks this node runs.
    pub tasks: Vec<TaskSpec>,
    pub margins: Margins,
}

/// A deadline miss, reported through the run's callback.
#[derive(Debug, Clone)]
pub struct MissReport {
    pub task: String,
    pub period: u64,
    pub kind: MissKind,
    /// Global time it was detected, and the job's deadline.
    pub detected_ns: u64,
    pub deadline_ns: u64,
    /// The last global time the job could have started and still met its
    /// deadline (`deadline − compute`).
    pub critical_start_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissKind {
    /// Dropped at its critical start time, before its deadline.
    Early,
    /// Started in time but finished after the deadline.
    Overrun,
    /// A receive task found no message for its period.
    MessageMissing,
    /// A receive task found the slot overwritten while copying.
    MessageTorn,
    /// Not started by its critical start time: the dispatcher was busy or
    /// stalled. Reported by the watchdog at that time (before the deadline).
    NotStarted,
}

/// What a run counted (the same figures a member reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunCounters {
    pub released: u64,
    pub completed: u64,
    pub missed_early: u64,
    /// Of `missed_early`: the jobs the watchdog reported (the dispatcher
    /// had not started them at their critical start time).
    #[serde(default)]
    pub missed_by_watchdog: u64,
    pub overruns: u64,
    pub messages_moved: u64,
    pub messages_missing: u64,
    pub messages_torn: u64,
    pub receive_overflow: u64,
    /// Jobs run while the clock's bound exceeded the budget (or it was unsynced).
    pub clock_over_budget: u64,
    /// Largest clock bound seen at a job start.
    pub clock_bound_ns_max: u64,
    /// Releases more than 10 µs late, by cause: the sleep woke later than
    /// the spin window covers; it woke in time but the spin was
    /// interrupted (the thread lost its CPU while spinning); or there was
    /// no sleep at all (the release was already due when the dispatcher
    /// got to it).
    #[serde(default)]
    pub late_wakes_sleep: u64,
    #[serde(default)]
    pub late_wakes_spin: u64,
    #[serde(default)]
    pub late_wakes_no_sleep: u64,
}

/// What a run measured (preallocated at commit; no allocation during the run).
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Wake-up lateness of each release the dispatcher slept for (ns).
    pub release_jitter_ns: Vec<u64>,
    /// Start − release of every job run (ns; includes queueing behind a job).
    pub start_delay_ns: Vec<u64>,
    /// Execution time of each channel send / receive job (host ns).
    pub send_exec_ns: Vec<u64>,
    pub receive_exec_ns: Vec<u64>,
    pub counters: RunCounters,
    /// The widest spin window used before a release, and the last one.
    pub spin_window_max_ns: u64,
    pub spin_window_end_ns: u64,
    /// Sum of the windows used, and how many waits used one (for the mean).
    pub spin_window_sum_ns: u64,
    pub spin_waits: u64,
}

/// What a computation task sees.
pub struct TaskContext<'a> {
    pub job: Job,
    channels: &'a mut [ChannelState],
    clock: &'a GlobalClock,
}

impl TaskContext<'_> {
    /// Global time now (interval midpoint; `None` when unsynced).
    pub fn global_now_ns(&self) -> Option<u64> {
        self.clock.now().ok().map(|i| i.mid_ns())
    }
    /// Insert a message into channel `ch`'s input iterator (sender side).
    pub fn insert(&mut self, ch: usize, bytes: &[u8], key: u64) -> Result<(), BufferError> {
        let pool = self.channels[ch]
            .input
            .as_mut()
            .expect("insert: this node does not send on the channel");
        pool.insert(bytes, key)
    }
    /// Fill a registered buffer of channel `ch` in place.
    pub fn insert_with(
        &mut self,
        ch: usize,
        key: u64,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<usize, BufferError> {
        let pool = self.channels[ch]
            .input
            .as_mut()
            .expect("insert: this node does not send on the channel");
        pool.insert_with(key, fill)
    }
    /// Extract the next message of channel `ch`'s output iterator.
    pub fn take_into(&mut self, ch: usize, out: &mut [u8]) -> Option<(usize, u64)> {
        self.channels[ch].output.as_mut()?.take_into(out)
    }
    /// Best-effort channels: a per-message send.
    pub fn send(&mut self, ch: usize, bytes: &[u8]) -> Result<(), BufferError> {
        self.insert(ch, bytes, 0)
    }
    /// Best-effort channels: a per-message receive.
    pub fn receive(&mut self, ch: usize, out: &mut [u8]) -> Option<usize> {
        self.take_into(ch, out).map(|(n, _)| n)
    }
}

/// An application computation task's body.
pub type Computation = Box<dyn FnMut(&mut TaskContext<'_>)>;

struct ChannelState {
    spec: ChannelSpec,
    area: ChannelArea,
    input: Option<BufferPool>,
    output: Option<BufferPool>,
    scratch: Box<[u8]>,
}

#[derive(Debug, Clone, Copy)]
enum TaskRef {
    Send(usize),
    Receive(usize),
    Compute(usize),
}

struct Active {
    core: DispatchCore,
    budget_ns: u64,
    refs: Vec<TaskRef>,
    stats: RunStats,
    /// Which jobs were claimed (started by the dispatcher, or reported
    /// missed by the watchdog), allocated at commit.
    claims: Arc<WatchdogShared>,
}

/// One member's time-driven channels over fabric `F`.
pub struct RtNode<F: Fabric> {
    fabric: Arc<F>,
    layout: Arc<RtLayout>,
    clock: Arc<GlobalClock>,
    channels: Vec<ChannelState>,
    computations: Vec<(TaskSpec, Computation)>,
    generation: u64,
    active: Option<Active>,
    activation_veto: Option<String>,
    watchdog: Option<WatchdogConfig>,
}

impl<F: Fabric> RtNode<F> {
    /// Declare the channels (identically on every member); registers every
    /// buffer now.
    pub fn new(
        fabric: Arc<F>,
        layout: Arc<RtLayout>,
        clock: Arc<GlobalClock>,
        specs: Vec<ChannelSpec>,
    ) -> Result<RtNode<F>, String> {
        if specs.len() > CHANNELS_MAX {
            return Err(format!("{} channels > CHANNELS_MAX {CHANNELS_MAX}", specs.len()));
        }
        let members = fabric.member_count();
        let me = fabric.member_rank();
        if layout.channels.len() != specs.len() || layout.row.row_len_bytes() != fabric.row_len_bytes() {
            return Err("the layout does not match the channels or the fabric: build it with layout_for".into());
        }
        let mut channels = Vec::with_capacity(specs.len());
        for (spec, area) in specs.into_iter().zip(layout.channels.iter().copied()) {
            spec.validate(members)?;
            let pool = || BufferPool::new(spec.policy, spec.buffer_count, spec.message_bytes_max);
            channels.push(ChannelState {
                input: (spec.sender == me).then(pool),
                output: spec.receivers.contains(me).then(pool),
                scratch: vec![0u8; area.slot_bytes()].into_boxed_slice(),
                spec,
                area,
            });
        }
        let generation = fabric
            .row(me)
            .u64_at(layout.commit_generation.offset())
            .load(Ordering::Relaxed);
        Ok(RtNode {
            fabric,
            layout,
            clock,
            channels,
            computations: Vec::new(),
            generation,
            active: None,
            activation_veto: None,
            watchdog: None,
        })
    }

    pub fn rank(&self) -> usize {
        self.fabric.member_rank()
    }
    pub fn clock(&self) -> &Arc<GlobalClock> {
        &self.clock
    }
    pub fn channel(&self, name: &str) -> Option<usize> {
        self.channels.iter().position(|c| c.spec.name == name)
    }

    /// Register an application computation task with the dispatcher
    /// (before commit; it is part of this node's admission test).
    pub fn register_computation(&mut self, spec: TaskSpec, body: Computation) -> Result<(), String> {
        if self.active.is_some() {
            return Err("register computation tasks before commit".into());
        }
        spec.validate().map_err(|e| e.to_string())?;
        self.computations.push((spec, body));
        Ok(())
    }

    /// Fingerprint of the channel set and the group-wide commit parameters.
    fn fingerprint(&self, config: &CommitConfig) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |v: u64| {
            for b in v.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for c in &self.channels {
            let s = &c.spec;
            c.spec.name.bytes().for_each(|b| mix(b as u64));
            for v in [
                s.kind as u64,
                s.sender as u64,
                s.receivers.0,
                s.message_bytes_max as u64,
                s.messages_per_period_max as u64,
                s.send_qos.release_offset_ns,
                s.send_qos.period_ns,
                s.send_qos.deadline_ns,
                s.receive_qos.release_offset_ns,
                s.receive_qos.period_ns,
                s.receive_qos.deadline_ns,
            ] {
                mix(v);
            }
        }
        mix(config.clock_bound_budget_ns);
        mix(config.periods);
        mix(config.force as u64);
        h
    }

    /// The tasks this node runs, and which are admitted.
    fn node_tasks(&self) -> (Vec<TaskSpec>, Vec<TaskRef>, Vec<bool>) {
        let me = self.rank();
        let (mut tasks, mut refs, mut admitted) = (Vec::new(), Vec::new(), Vec::new());
        for (i, c) in self.channels.iter().enumerate() {
            let timed = c.spec.kind == ChannelKind::TimeDriven;
            if c.spec.sender == me {
                tasks.push(c.spec.send_task());
                refs.push(TaskRef::Send(i));
                admitted.push(timed);
            }
            if c.spec.receivers.contains(me) {
                tasks.push(c.spec.receive_task(me));
                refs.push(TaskRef::Receive(i));
                admitted.push(timed);
            }
        }
        for (i, (spec, _)) in self.computations.iter().enumerate() {
            tasks.push(spec.clone());
            refs.push(TaskRef::Compute(i));
            admitted.push(true);
        }
        (tasks, refs, admitted)
    }

    /// This node's verdict: admission over its tasks, plus the cross-node
    /// order of every time-driven channel.
    fn verdict(&self, tasks: &[TaskSpec], admitted: &[bool], margins: Margins) -> Result<Admitted, Rejection> {
        let checked: Vec<TaskSpec> = tasks
            .iter()
            .zip(admitted)
            .filter(|(_, a)| **a)
            .map(|(t, _)| t.clone())
            .collect();
        let result = admit_node(&checked, margins)?;
        for c in self.channels.iter().filter(|c| c.spec.kind == ChannelKind::TimeDriven) {
            for r in c.spec.receivers.iter() {
                check_channel_order(
                    &c.spec.send_task(),
                    &c.spec.receive_task(r),
                    margins.clock_error_bound_ns,
                )?;
            }
        }
        Ok(result)
    }

    /// Collective commit: every member calls it with the same group-wide
    /// parameters. Two phases, both collective:
    ///
    /// 1. **prepare** (admission): every node runs its admission test and
    ///    publishes its verdict, its proposed `epoch_start` and a
    ///    fingerprint of the channel set; every node gathers all of them.
    ///    A rejection anywhere rejects everywhere ([`CommitError::Rejected`]
    ///    names the node, the task and the reason), unless `force`.
    /// 2. **activate**: the agreed `epoch_start` is the largest proposal.
    ///    Every node prepares its dispatcher for it (the epoch must still
    ///    be in the future, the schedule must build) and votes activate or
    ///    abort; every node gathers every vote. One abort anywhere aborts
    ///    everywhere ([`CommitError::Aborted`] names the node and why) and
    ///    leaves every node uncommitted; otherwise every node is active
    ///    from the same `epoch_start`.
    pub fn commit(&mut self, config: &CommitConfig) -> Result<Committed, CommitError> {
        if self.active.is_some() {
            return Err(CommitError::AlreadyCommitted);
        }
        let margins = Margins {
            clock_error_bound_ns: config.clock_bound_budget_ns,
            release_jitter_ns: config.release_jitter_ns,
        };
        let (tasks, refs, admitted) = self.node_tasks();
        let now = self.clock.now().map_err(|e| CommitError::Clock(e.to_string()))?;
        let admission = self.verdict(&tasks, &admitted, margins);
        let bound_ok = now.bound_ns() <= config.clock_bound_budget_ns;
        let reason = match (&admission, bound_ok) {
            (_, false) => Some(format!(
                "clock bound {} ns exceeds the budget {} ns",
                now.bound_ns(),
                config.clock_bound_budget_ns
            )),
            (Err(r), true) => Some(r.to_string()),
            (Ok(_), true) => None,
        };
        let fingerprint = self.fingerprint(config);
        self.generation += 1;
        // Phase 1: prepare (admission everywhere).
        self.publish_verdict(
            reason.as_deref(),
            now.latest_ns + config.lead_ns,
            fingerprint,
            now.bound_ns(),
        )?;
        let (verdicts, epoch_start_ns) = self.gather(fingerprint, config.timeout)?;
        if let Some((node, reason)) = verdicts.iter().enumerate().find_map(|(n, v)| v.clone().map(|v| (n, v))) {
            if !config.force {
                return Err(CommitError::Rejected { node, reason });
            }
        }
        // Phase 2: activate with the agreed epoch_start, or abort everywhere.
        let prepared = self.prepare_activation(epoch_start_ns, &tasks, config);
        let veto = self.activation_veto.take();
        let vote = match (&prepared, veto) {
            (_, Some(v)) => Some(v),
            (Err(e), None) => Some(e.clone()),
            (Ok(_), None) => None,
        };
        self.publish_activation(vote.as_deref())?;
        let votes = self.gather_activation(config.timeout)?;
        if let Some((node, reason)) = votes.iter().enumerate().find_map(|(n, v)| v.clone().map(|v| (n, v))) {
            return Err(CommitError::Aborted { node, reason });
        }
        let core = prepared.map_err(|reason| CommitError::Aborted {
            node: self.rank(),
            reason,
        })?;
        // Measurement buffers, allocated now (none during the run), bounded.
        let jobs: u64 = (tasks.len() as u64).saturating_mul(config.periods).min(RUN_SAMPLES_MAX);
        let stats = RunStats {
            release_jitter_ns: Vec::with_capacity(jobs as usize),
            start_delay_ns: Vec::with_capacity(jobs as usize),
            send_exec_ns: Vec::with_capacity(jobs as usize),
            receive_exec_ns: Vec::with_capacity(jobs as usize),
            ..RunStats::default()
        };
        let claims = (0..tasks.len()).map(|_| AtomicU64::new(0)).collect();
        self.active = Some(Active {
            core,
            budget_ns: config.clock_bound_budget_ns,
            refs,
            stats,
            claims: Arc::new(WatchdogShared::new(claims)),
        });
        Ok(Committed {
            epoch_start_ns,
            admission,
            verdicts,
            tasks,
            margins,
        })
    }

    /// Make this node vote *abort* in the activation phase of its next
    /// commit, with `reason` (fault injection: tests and demos show that
    /// one node's abort aborts the commit on every node).
    pub fn veto_next_activation(&mut self, reason: &str) {
        self.activation_veto = Some(reason.to_string());
    }

    /// This node's side of phase 2: the dispatcher for the agreed epoch.
    fn prepare_activation(
        &self,
        epoch_start_ns: u64,
        tasks: &[TaskSpec],
        config: &CommitConfig,
    ) -> Result<DispatchCore, String> {
        let latest = self.clock.now().map_err(|e| format!("clock: {e}"))?.latest_ns;
        if epoch_start_ns <= latest {
            return Err(format!(
                "the agreed epoch_start {epoch_start_ns} ns had already passed (global time up to {latest} ns) when node {} learned it",
                self.rank()
            ));
        }
        DispatchCore::new(
            epoch_start_ns,
            tasks.iter().map(|t| (t.clone(), config.periods)).collect(),
        )
        .map_err(|e| e.to_string())
    }

    fn publish_verdict(
        &self,
        reason: Option<&str>,
        proposed_start_ns: u64,
        fingerprint: u64,
        bound_ns: u64,
    ) -> Result<(), CommitError> {
        let l = &self.layout;
        let row = self.fabric.row(self.rank());
        // SAFETY: see `write_reason`: commit_reason is only read by peers
        // after they Acquire-load a commit_generation that covers it.
        unsafe { self.write_reason(l.commit_reason.offset(), l.commit_reason_len.offset(), reason) };
        // The verdict carries its generation, so a peer never mistakes an
        // earlier commit's verdict for this one's.
        let code = if reason.is_some() {
            VERDICT_REJECT
        } else {
            VERDICT_ACCEPT
        };
        row.u64_at(l.commit_verdict.offset())
            .store(self.generation * 4 + code, Ordering::Relaxed);
        row.u64_at(l.commit_proposed_start_ns.offset())
            .store(proposed_start_ns, Ordering::Relaxed);
        row.u64_at(l.commit_fingerprint.offset())
            .store(fingerprint, Ordering::Relaxed);
        row.u64_at(l.commit_clock_bound_ns.offset())
            .store(bound_ns, Ordering::Relaxed);
        let peers = PeerSet::all_except(self.rank(), self.fabric.member_count());
        let guard = l.commit_generation.offset();
        // The fields first, then the guard, as separate pushes: a fabric
        // that copies rows (tcp) applies one push in address order.
        self.fabric
            .push(guard + 8..l.commit_reason.offset() + REASON_BYTES_MAX, peers)
            .map_err(|e| CommitError::Fabric(e.to_string()))?;
        // Partner: the Acquire load of commit_generation in `gather`.
        row.u64_at(guard).store(self.generation, Ordering::Release);
        self.fabric
            .push(guard..guard + 8, peers)
            .map_err(|e| CommitError::Fabric(e.to_string()))
    }

    /// Write `reason` (or nothing) into our row's text column at `text_at`
    /// and its length at `len_at`.
    ///
    /// # Safety
    /// Only for our own row's reason columns, whose readers read them only
    /// after Acquire-loading the guard (commit_generation or
    /// commit_activate) of the commit they belong to; the previous
    /// commit's readers are done: they read it before returning from that
    /// commit, which every member did before any member could start this
    /// one (we never start a commit while one of our own is in flight).
    unsafe fn write_reason(&self, text_at: usize, len_at: usize, reason: Option<&str>) {
        let row = self.fabric.row(self.rank());
        let text = reason.unwrap_or("").as_bytes();
        let len = text.len().min(REASON_BYTES_MAX);
        // SAFETY: our own row, in bounds (the layout's column), and no
        // reader is reading it now (the caller's contract above).
        let out = unsafe { row.bytes_mut(text_at, REASON_BYTES_MAX) };
        out[..len].copy_from_slice(&text[..len]);
        row.u64_at(len_at).store(len as u64, Ordering::Relaxed);
    }

    /// Read member `r`'s reason text (after Acquire-loading its guard).
    fn read_reason(&self, r: usize, text_at: usize, len_at: usize) -> String {
        let row = self.fabric.row(r);
        let len = (row.u64_at(len_at).load(Ordering::Relaxed) as usize).min(REASON_BYTES_MAX);
        // SAFETY: published before the guard the caller Acquire-loaded; the
        // owner does not rewrite it until every member has moved past this
        // commit.
        let text = unsafe { row.bytes(text_at, len) };
        String::from_utf8_lossy(text).into_owned()
    }

    /// Wait until every member's u64 at `at` is at least `at_least`.
    fn wait_all(&self, at: usize, at_least: u64, timeout: Duration) -> Result<(), CommitError> {
        let members = self.fabric.member_count();
        let started = monotonic_ns();
        loop {
            // Partner: the Release store of the guard at `at` (commit_generation
            // in `publish_verdict`, commit_activate in `publish_activation`).
            let missing: Vec<usize> = (0..members)
                .filter(|&r| self.fabric.row(r).u64_at(at).load(Ordering::Acquire) < at_least)
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if monotonic_ns() - started > timeout.as_nanos() as u64 {
                return Err(CommitError::Timeout {
                    missing,
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            self.fabric
                .check_peers()
                .map_err(|e| CommitError::Fabric(e.to_string()))?;
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Wait for every member's verdict of this generation.
    fn gather(&self, fingerprint: u64, timeout: Duration) -> Result<(Vec<Option<String>>, u64), CommitError> {
        let l = &self.layout;
        let members = self.fabric.member_count();
        self.wait_all(l.commit_generation.offset(), self.generation, timeout)?;
        let mut verdicts = Vec::with_capacity(members);
        let mut epoch_start_ns = 0u64;
        for r in 0..members {
            let row = self.fabric.row(r);
            let verdict = row.u64_at(l.commit_verdict.offset()).load(Ordering::Relaxed);
            if verdict / 4 != self.generation {
                return Err(CommitError::PeerStopped { node: r });
            }
            let theirs = row.u64_at(l.commit_fingerprint.offset()).load(Ordering::Relaxed);
            if theirs != fingerprint {
                return Err(CommitError::Mismatch {
                    node: r,
                    theirs,
                    ours: fingerprint,
                });
            }
            epoch_start_ns =
                epoch_start_ns.max(row.u64_at(l.commit_proposed_start_ns.offset()).load(Ordering::Relaxed));
            verdicts.push(
                (verdict % 4 != VERDICT_ACCEPT)
                    .then(|| self.read_reason(r, l.commit_reason.offset(), l.commit_reason_len.offset())),
            );
        }
        Ok((verdicts, epoch_start_ns))
    }

    /// Phase 2: publish this node's activation vote (`Some`: abort, why).
    fn publish_activation(&self, abort: Option<&str>) -> Result<(), CommitError> {
        let l = &self.layout;
        let row = self.fabric.row(self.rank());
        // SAFETY: see `write_reason`: commit_abort_reason is only read by
        // peers after they Acquire-load a commit_activate that covers it.
        unsafe {
            self.write_reason(
                l.commit_abort_reason.offset(),
                l.commit_abort_reason_len.offset(),
                abort,
            )
        };
        let peers = PeerSet::all_except(self.rank(), self.fabric.member_count());
        let at = l.commit_activate.offset();
        self.fabric
            .push(at + 8..l.commit_abort_reason.offset() + REASON_BYTES_MAX, peers)
            .map_err(|e| CommitError::Fabric(e.to_string()))?;
        let code = if abort.is_some() {
            VERDICT_REJECT
        } else {
            VERDICT_ACCEPT
        };
        // Partner: the Acquire load of commit_activate in `wait_all`
        // (called by `gather_activation`).
        row.u64_at(at).store(self.generation * 4 + code, Ordering::Release);
        self.fabric
            .push(at..at + 8, peers)
            .map_err(|e| CommitError::Fabric(e.to_string()))
    }

    /// Phase 2: every member's vote (`Some`: it aborted, why).
    fn gather_activation(&self, timeout: Duration) -> Result<Vec<Option<String>>, CommitError> {
        let l = &self.layout;
        self.wait_all(l.commit_activate.offset(), self.generation * 4, timeout)?;
        let members = self.fabric.member_count();
        let mut votes = Vec::with_capacity(members);
        for r in 0..members {
            let vote = self
                .fabric
                .row(r)
                .u64_at(l.commit_activate.offset())
                .load(Ordering::Relaxed);
            if vote / 4 != self.generation {
                return Err(CommitError::PeerStopped { node: r });
            }
            votes.push(
                (vote % 4 != VERDICT_ACCEPT)
                    .then(|| self.read_reason(r, l.commit_abort_reason.offset(), l.commit_abort_reason_len.offset())),
            );
        }
        Ok(votes)
    }

    /// Attach a watchdog to the following runs (see [`crate::watchdog`]):
    /// a second thread that reports, at its critical start time, every job
    /// the dispatcher has not started by then (the dispatcher stalled).
    pub fn set_watchdog(&mut self, config: Option<WatchdogConfig>) {
        self.watchdog = config;
    }

    /// Run the dispatcher on the calling thread until every task has run
    /// its periods. `on_miss` hears of every miss the dispatcher detects
    /// as it detects it; with a watchdog (see [`RtNode::set_watchdog`]),
    /// a job the dispatcher had not started at its critical start time is
    /// reported by the watchdog's callback instead, at that time, and
    /// only once.
    ///
    /// `spin` is the hybrid release's spin window: a fixed window in ns
    /// (`u64`), or a [`SpinPolicy::Auto`] tuner that keeps learning from
    /// every sleep of the dispatcher (see [`crate::spin`]); the stats
    /// report the widest and last window used.
    pub fn run(
        &mut self,
        spin: impl Into<SpinPolicy>,
        on_miss: &mut dyn FnMut(&MissReport),
    ) -> Result<RunStats, String> {
        let mut spin = spin.into();
        let mut active = self.active.take().ok_or("run before commit")?;
        let shared = active.claims.clone();
        shared.set_stop(false);
        let Some(config) = self.watchdog.clone() else {
            let stats = self.dispatch(&mut active, &mut spin, on_miss, None);
            self.active = Some(active);
            return Ok(stats);
        };
        let timetable = Timetable {
            epoch_start_ns: active.core.epoch_start_ns(),
            tasks: (0..active.core.task_count())
                .map(|i| (active.core.task(i).clone(), active.core.periods_max(i)))
                .collect(),
        };
        let (fabric, clock) = (self.fabric.clone(), self.clock.clone());
        let counter_at = self.layout.counters.offset(layout::WATCHDOG_MISSES);
        let result = std::thread::scope(|s| {
            let watched = shared.clone();
            let handle = std::thread::Builder::new()
                .name("rt-watchdog".into())
                .spawn_scoped(s, move || {
                    watchdog::run(&*fabric, counter_at, &clock, &timetable, &watched, &config)
                })
                .map_err(|e| format!("start the watchdog thread: {e}"))?;
            let watchdog = handle.thread().clone();
            // Stops the watchdog however the dispatcher returns (a panic
            // in a computation task too), so the scope's join never waits
            // for the rest of the timetable.
            let _stop = StopOnDrop(&shared, &watchdog);
            Ok(self.dispatch(&mut active, &mut spin, on_miss, Some(&watchdog)))
        });
        self.active = Some(active);
        result
    }

    /// The dispatcher loop (see [`RtNode::run`]).
    fn dispatch(
        &mut self,
        active: &mut Active,
        spin: &mut SpinPolicy,
        on_miss: &mut dyn FnMut(&MissReport),
        watchdog: Option<&std::thread::Thread>,
    ) -> RunStats {
        let budget_ns = active.budget_ns;
        let rank = self.rank();
        let claims = active.claims.clone();
        loop {
            let now = self.clock.now();
            let now_ns = match now {
                Ok(i) => i.mid_ns(),
                Err(_) => self.clock.now_mid_unchecked_ns(),
            };
            match active.core.poll(now_ns) {
                Poll::Run(job) => {
                    self.count(layout::RELEASED);
                    if !claims.claim(job.task, job.period) {
                        // The watchdog reported it at its critical start,
                        // a moment before this poll: dropped, not reported twice.
                        active.core.handle_dropped(job);
                        self.count(layout::MISSED_EARLY);
                        continue;
                    }
                    let bound = now.map(|i| i.bound_ns()).unwrap_or(u64::MAX);
                    active.stats.counters.clock_bound_ns_max =
                        active.stats.counters.clock_bound_ns_max.max(bound.min(1 << 40));
                    if bound > budget_ns {
                        active.stats.counters.clock_over_budget += 1;
                        self.count(layout::CLOCK_OVER_BUDGET);
                    }
                    push_bounded(&mut active.stats.start_delay_ns, now_ns.saturating_sub(job.release_ns));
                    let started_mono = monotonic_ns();
                    let task = active.refs[job.task];
                    let miss = self.execute(task, job, &mut active.stats);
                    // Claimed: the watchdog plans past this job (after the
                    // job, so that its wake-up never delays the start).
                    if let Some(w) = watchdog {
                        w.unpark();
                    }
                    let exec_ns = monotonic_ns() - started_mono;
                    match task {
                        TaskRef::Send(_) => push_bounded(&mut active.stats.send_exec_ns, exec_ns),
                        TaskRef::Receive(_) => push_bounded(&mut active.stats.receive_exec_ns, exec_ns),
                        TaskRef::Compute(_) => {}
                    }
                    if let Some(kind) = miss {
                        on_miss(&self.miss_report(&active.core, job, kind));
                    }
                    let finished = self.clock.now_mid_unchecked_ns();
                    if active.core.handle_completion(job, finished) {
                        self.count(layout::OVERRUNS);
                        on_miss(&self.miss_report(&active.core, job, MissKind::Overrun));
                    }
                    self.count(layout::COMPLETED);
                }
                Poll::Miss(job) => {
                    self.count(layout::RELEASED);
                    self.count(layout::MISSED_EARLY);
                    // Not reported again if the watchdog already did.
                    if claims.claim(job.task, job.period) {
                        if let Some(w) = watchdog {
                            w.unpark();
                        }
                        on_miss(&self.miss_report(&active.core, job, MissKind::Early));
                    }
                }
                Poll::Idle { wake_at_ns } => {
                    let target = self.clock.mono_for_global(wake_at_ns);
                    let window = spin.window_ns();
                    let wake = spin.sleep_until(target);
                    let late = wake.late_ns;
                    push_bounded(&mut active.stats.release_jitter_ns, late);
                    if late > LATE_WAKE_NS {
                        let c = &mut active.stats.counters;
                        match wake.overshoot_ns {
                            None => c.late_wakes_no_sleep += 1,
                            Some(o) if o > window => c.late_wakes_sleep += 1,
                            Some(_) => c.late_wakes_spin += 1,
                        }
                    }
                    active.stats.spin_window_max_ns = active.stats.spin_window_max_ns.max(window);
                    active.stats.spin_window_sum_ns = active.stats.spin_window_sum_ns.saturating_add(window);
                    active.stats.spin_waits += 1;
                }
                Poll::Done => break,
            }
        }
        let c = active.core.counters;
        let mut stats = std::mem::take(&mut active.stats);
        stats.spin_window_end_ns = spin.window_ns();
        stats.counters.released = c.released;
        stats.counters.completed = c.completed;
        stats.counters.missed_early = c.missed_early;
        stats.counters.overruns = c.overruns;
        stats.counters.missed_by_watchdog = claims.misses.load(Ordering::Relaxed);
        debug_assert_eq!(
            c.released,
            c.completed + c.missed_early,
            "every released job completed or missed (rank {rank})"
        );
        stats
    }

    fn count(&self, counter: usize) {
        self.fabric
            .row(self.rank())
            .u64_at(self.layout.counters.offset(counter))
            .fetch_add(1, Ordering::Relaxed);
    }

    fn miss_report(&self, core: &DispatchCore, job: Job, kind: MissKind) -> MissReport {
        MissReport {
            task: core.task(job.task).name.clone(),
            period: job.period,
            kind,
            detected_ns: self.clock.now().map(|i| i.mid_ns()).unwrap_or(0),
            deadline_ns: job.deadline_ns,
            critical_start_ns: job.critical_start_ns,
        }
    }

    fn execute(&mut self, task: TaskRef, job: Job, stats: &mut RunStats) -> Option<MissKind> {
        match task {
            TaskRef::Send(c) => {
                let moved = self.send_job(c, job.period);
                stats.counters.messages_moved += moved;
                None
            }
            TaskRef::Receive(c) => {
                let result = self.receive_job(c, job.period);
                match result {
                    Ok((moved, overflow)) => {
                        stats.counters.messages_moved += moved;
                        stats.counters.receive_overflow += overflow;
                        None
                    }
                    Err(kind) => {
                        if kind == MissKind::MessageMissing {
                            stats.counters.messages_missing += 1;
                            self.count(layout::MESSAGES_MISSING);
                        } else {
                            stats.counters.messages_torn += 1;
                            self.count(layout::MESSAGES_TORN);
                        }
                        Some(kind)
                    }
                }
            }
            TaskRef::Compute(i) => {
                let (_, body) = &mut self.computations[i];
                let mut ctx = TaskContext {
                    job,
                    channels: &mut self.channels,
                    clock: &self.clock,
                };
                body(&mut ctx);
                None
            }
        }
    }

    /// Zero-sided send: move up to `messages_per_period_max` buffers from
    /// the input iterator into slot `period % 2` and publish the guard.
    fn send_job(&mut self, c: usize, period: u64) -> u64 {
        let ch = &mut self.channels[c];
        let area = ch.area;
        let row = self.fabric.row(self.fabric.member_rank());
        let slot = area.slot_offset(period);
        // Partner: the Acquire fence + `begin` load in `receive_job` (seqlock).
        row.u64_at(area.begin.offset()).store(period + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        // SAFETY:
        // - our own row, and only this dispatcher thread writes channel areas;
        // - readers of this slot (period − 2) finished before their deadline,
        //   which admission placed before this release; a reader that overran
        //   sees `begin` advanced and discards what it copied (seqlock).
        let bytes = unsafe { row.bytes_mut(slot, area.slot_bytes()) };
        let input = ch.input.as_mut().expect("send task on a node that does not send");
        let mut count = 0usize;
        let record = area.record_bytes();
        while count < area.messages_per_period_max {
            let at = SLOT_HEADER_BYTES + count * record;
            let taken = input.take_with(|msg, key| {
                bytes[at..at + 4].copy_from_slice(&(msg.len() as u32).to_le_bytes());
                bytes[at + 8..at + 16].copy_from_slice(&key.to_le_bytes());
                bytes[at + MESSAGE_HEADER_BYTES..at + MESSAGE_HEADER_BYTES + msg.len()].copy_from_slice(msg);
            });
            if taken.is_none() {
                break;
            }
            count += 1;
        }
        bytes[0..8].copy_from_slice(&period.to_le_bytes());
        bytes[8..12].copy_from_slice(&(count as u32).to_le_bytes());
        // Three pushes, in this order, so that a fabric that copies rows
        // (tcp: frames applied in order, each in address order) never
        // shows a reader the guard before the slot: `begin`, the slot,
        // then the guard. On shm a push is a no-op.
        let receivers = ch.spec.receivers;
        let begin = area.begin.offset();
        let _ = self.fabric.push(begin..begin + 8, receivers);
        let _ = self.fabric.push(slot..slot + area.slot_bytes(), receivers);
        // Partner: the Acquire load of the guard in `receive_job`.
        row.u64_at(area.guard.offset()).store(period + 1, Ordering::Release);
        let guard = area.guard.offset();
        let _ = self.fabric.push(guard..guard + 8, receivers);
        count as u64
    }

    /// Zero-sided receive: take slot `period % 2` of the sender's row into
    /// the output iterator. Returns (moved, overflowed) or the miss kind.
    fn receive_job(&mut self, c: usize, period: u64) -> Result<(u64, u64), MissKind> {
        let ch = &mut self.channels[c];
        let area = ch.area;
        let row = self.fabric.row(ch.spec.sender);
        // Partner: the Release store of the guard in `send_job`.
        let guard = row.u64_at(area.guard.offset()).load(Ordering::Acquire);
        if guard < period + 1 {
            return Err(MissKind::MessageMissing);
        }
        let slot = area.slot_offset(period);
        // SAFETY: the guard (Acquire) covers the slot for `period`; a writer
        // that laps us is detected by the `begin` check below and the copy
        // discarded, so torn bytes never reach the application.
        let bytes = unsafe { row.bytes(slot, area.slot_bytes()) };
        ch.scratch.copy_from_slice(bytes);
        // Partner: the Release fence after the `begin` store in `send_job`.
        fence(Ordering::Acquire);
        let begin = row.u64_at(area.begin.offset()).load(Ordering::Relaxed);
        let slot_period = u64::from_le_bytes(ch.scratch[0..8].try_into().expect("8 bytes"));
        if begin > period + 2 || slot_period != period {
            return Err(MissKind::MessageTorn);
        }
        let count = u32::from_le_bytes(ch.scratch[8..12].try_into().expect("4 bytes")) as usize;
        let count = count.min(area.messages_per_period_max);
        let output = ch
            .output
            .as_mut()
            .expect("receive task on a node that does not receive");
        let (mut moved, mut overflow) = (0, 0);
        for i in 0..count {
            let at = SLOT_HEADER_BYTES + i * area.record_bytes();
            let len = u32::from_le_bytes(ch.scratch[at..at + 4].try_into().expect("4 bytes")) as usize;
            let key = u64::from_le_bytes(ch.scratch[at + 8..at + 16].try_into().expect("8 bytes"));
            let len = len.min(area.message_bytes_max);
            let msg = &ch.scratch[at + MESSAGE_HEADER_BYTES..at + MESSAGE_HEADER_BYTES + len];
            match output.insert(msg, key) {
                Ok(()) => moved += 1,
                Err(_) => overflow += 1,
            }
        }
        Ok((moved, overflow))
    }

    /// Release everything: the dispatcher's tasks, the registered
    /// computation tasks and every buffer's contents. The channels stay
    /// declared and can be committed again (with new computation tasks).
    pub fn uncommit(&mut self) {
        self.active = None;
        self.computations.clear();
        for c in &mut self.channels {
            c.input
                .iter_mut()
                .chain(c.output.iter_mut())
                .for_each(BufferPool::clear);
        }
    }

    pub fn is_committed(&self) -> bool {
        self.active.is_some()
    }

    /// Pre-load a sender's input iterator before commit (e.g. a first message).
    pub fn insert(&mut self, ch: usize, bytes: &[u8], key: u64) -> Result<(), BufferError> {
        self.channels[ch]
            .input
            .as_mut()
            .ok_or(BufferError::Full { capacity: 0 })?
            .insert(bytes, key)
    }
}

/// Stops a watchdog when dropped.
struct StopOnDrop<'a>(&'a WatchdogShared, &'a std::thread::Thread);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_stop(true);
        self.1.unpark();
    }
}

fn push_bounded(v: &mut Vec<u64>, x: u64) {
    if v.len() < v.capacity() {
        v.push(x);
    }
}

/// A release later than this counts as a late wake-up (by cause).
const LATE_WAKE_NS: u64 = 10_000;

/// Measure the dispatcher's release jitter on this machine: `samples`
/// hybrid wake-ups `period_ns` apart; returns each wake-up's lateness.
pub fn calibrate_release_jitter(samples: usize, period_ns: u64, spin_ns: u64) -> Vec<u64> {
    let mut out = Vec::with_capacity(samples);
    let mut target = monotonic_ns() + period_ns;
    for _ in 0..samples {
        out.push(sleep_until_hybrid(target, spin_ns));
        target += period_ns;
    }
    out
}

/// Measure a channel task's compute time for `message_bytes` messages,
/// `messages` per period: worst of `rounds` copies through a pool and a
/// slot-sized buffer, doubled for safety, at least `floor_ns`.
pub fn measure_channel_compute_ns(message_bytes: usize, messages: usize, rounds: usize, floor_ns: u64) -> u64 {
    let mut pool = BufferPool::new(IteratorPolicy::Fifo, messages.max(1), message_bytes.max(1));
    let mut slot = vec![0u8; messages.max(1) * (message_bytes + MESSAGE_HEADER_BYTES) + SLOT_HEADER_BYTES];
    let msg = vec![7u8; message_bytes.max(1)];
    let mut worst = 0u64;
    for _ in 0..rounds {
        for _ in 0..messages {
            let _ = pool.insert(&msg, 0);
        }
        let t0 = monotonic_ns();
        let mut at = SLOT_HEADER_BYTES;
        while pool
            .take_with(|m, _| {
                slot[at..at + m.len()].copy_from_slice(m);
                at += m.len() + MESSAGE_HEADER_BYTES;
            })
            .is_some()
        {}
        std::hint::black_box(&slot);
        worst = worst.max(monotonic_ns() - t0);
    }
    (worst * 2).max(floor_ns)
}
