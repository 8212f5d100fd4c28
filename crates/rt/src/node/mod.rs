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

mod calibrate;
mod channel;
mod commit;
mod data_path;
mod dispatcher;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use spindle_fabric::Fabric;

use crate::buffers::{BufferError, BufferPool};
use crate::clock_service::GlobalClock;
use crate::dispatch::DispatchCore;
use crate::interference::AdmissionMode;
use crate::layout::{ChannelArea, RtLayout};
use crate::qos::TaskSpec;
use crate::watchdog::{WatchdogConfig, WatchdogShared};

pub use calibrate::{
    calibrate_host, calibrate_release_jitter, measure_channel_compute_ns, CalibrationPlan, HostCalibration,
    CALIBRATION_NS_MAX, CALIBRATION_WAKEUPS_MAX, INTERFERENCE_PROBE_NS,
};
pub use channel::{layout_for, ChannelKind, ChannelSpec};
pub use commit::{CommitConfig, CommitError, Committed};
pub use data_path::{Computation, TaskContext};
pub use dispatcher::{MissKind, MissReport, RunCounters, RunStats};

/// Most channels one node declares.
pub const CHANNELS_MAX: usize = 64;
/// Most per-job samples a run keeps (each of jitter, start delay, exec time).
pub const RUN_SAMPLES_MAX: u64 = 1 << 18;

struct ChannelState {
    spec: ChannelSpec,
    area: ChannelArea,
    input: Option<BufferPool>,
    output: Option<BufferPool>,
    scratch: Box<[u8]>,
    /// Receivers: the first period whose message this node has not taken
    /// yet (0 at each commit, whose periods start again at 0); a receive
    /// job of a later period catches the one before it up.
    receive_next_period: u64,
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
    /// The admission mode and this node's interference (`set_admission`).
    admission: (AdmissionMode, u64),
    /// Percent of the interference charged (`set_interference_headroom`;
    /// 100: as measured).
    interference_headroom_pct: u32,
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
                receive_next_period: 0,
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
            admission: (AdmissionMode::WorstCase, 0),
            interference_headroom_pct: 100,
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

    /// Release everything: the dispatcher's tasks, the registered
    /// computation tasks and every buffer's contents. The channels stay
    /// declared and can be committed again (with new computation tasks).
    pub fn uncommit(&mut self) {
        self.active = None;
        self.computations.clear();
        for c in &mut self.channels {
            c.receive_next_period = 0;
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
