//! The collective commit (see [`RtNode::commit`]): phase 1, admission on
//! every node (verdicts, proposals and fingerprints in the rows); phase 2,
//! activation at the agreed `epoch_start` (one abort aborts all).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use spindle_fabric::{Fabric, PeerSet};
use spindle_runtime::monotonic_ns;

use super::{Active, ChannelKind, RtNode, RunStats, TaskRef, RUN_SAMPLES_MAX};
use crate::admission::{admit_node, check_channel_order, Admitted, Margins, Rejection};
use crate::dispatch::DispatchCore;
use crate::interference::AdmissionMode;
use crate::layout::REASON_BYTES_MAX;
use crate::qos::TaskSpec;
use crate::watchdog::WatchdogShared;

/// Verdict codes in the low 2 bits of `commit_verdict` (generation × 4 + code).
const VERDICT_ACCEPT: u64 = 1;
const VERDICT_REJECT: u64 = 2;

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

impl<F: Fabric> RtNode<F> {
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
        // The admission mode is group-wide (the interference is each node's own).
        mix(self.admission.0.miss_budget().to_bits());
        mix(self.interference_headroom_pct as u64);
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
            interference_ns: self.admission.1,
            interference_headroom_pct: self.interference_headroom_pct,
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
        // Periods start again at 0: no receive has a period to catch up.
        for c in &mut self.channels {
            c.receive_next_period = 0;
        }
        self.active = Some(Active {
            core,
            budget_ns: config.clock_bound_budget_ns,
            refs,
            stats,
            claims: Arc::new(
                WatchdogShared::new(tasks.len())
                    .with_admitted(margins.interference_charged_ns(), margins.release_jitter_ns),
            ),
        });
        Ok(Committed {
            epoch_start_ns,
            admission,
            verdicts,
            tasks,
            margins,
        })
    }

    /// How the following commits admit (the same mode on every member: it
    /// is part of the fingerprint) and the interference this node measured
    /// (see [`crate::interference`]): charged to every job on top of its
    /// compute time. Default: worst case, no interference assumed.
    pub fn set_admission(&mut self, mode: AdmissionMode, interference_ns: u64) {
        self.admission = (mode, interference_ns);
    }

    /// Charge `pct` percent of the measured interference (at least 100:
    /// as measured). A worst case learned from a host is a lower bound of
    /// its true worst case (the next run may stall longer than anything
    /// seen); a headroom is how much longer the user bets it can be.
    /// Group-wide (part of the fingerprint). `spindle rt ring`'s default
    /// parameters use 300.
    pub fn set_interference_headroom(&mut self, pct: u32) {
        self.interference_headroom_pct = pct.max(100);
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
}
