//! The simulator's total failure and restart (persistent mode).
//!
//! At the plan's `restart_at` step every member is killed at once. What
//! survives is each member's disk: its log's durable bytes, and a torn
//! part of what it had committed but not synced (a SIGKILL leaves the
//! page cache written; a power cut does not: the draw covers both). Every
//! configured member then starts again from its disk in a new world, as
//! [`Group::join`] does after its exchange of log summaries: the members
//! compute the same [`crate::restart::RestartPlan`], those that take part
//! are replayed the history and go on in the plan's first view, the
//! others say why, set their log aside and join the restarted group
//! afresh (a member that had left on request stays away).
//!
//! ```text
//!  step restart_at:  disks ─► recover_records ─► summaries ─► plan
//!                    new world; Group::start_from_log per member of the plan
//!  each step:        a replayed delivery ─► check_replayed (sent, agrees)
//!  replay over:      check_replay_done (order, no loss, same history)
//!  end:              check_all_replayed (every restarted member finished)
//! ```
//!
//! The properties checked:
//! - **nothing invented**: every replayed message is one its sender sent
//!   (its length and bytes), and one delivered before the failure at
//!   that position is the same message;
//! - **no loss of delivered messages**: every message delivered anywhere
//!   before the failure is in every restarted member's history, replayed
//!   or held by the snapshot its log was compacted to;
//! - **total order**: each member's history is in (view, seq) order, and
//!   every restarted member rebuilt the same history (where two members'
//!   snapshots differ, from the later one on).
//!
//! The restarted group is then checked like any other (a fresh checker
//! from its first view), and so are its log compactions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use spindle_fabric::sim::SimEvent;
use spindle_fabric::{Fabric, PeerSet};

use super::{Cluster, MemberEnd, SimFailure};
use crate::invariants::checker::{Checker, Delivered};
use crate::invariants::{LogEntry, Violation};
use crate::layout::SmcLayout;
use crate::persist::{self, LogSummary, PersistLog};
use crate::Group;

/// What a total failure did, as checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartReport {
    pub at_step: u64,
    /// The restarted group's first view (0: every log was empty, a
    /// first start) and its members.
    pub first_view: u64,
    pub members: Vec<usize>,
    /// Configured members that did not take part, and why.
    pub excluded: Vec<(usize, String)>,
    /// The members that joined the restarted group afresh, their logs set
    /// aside: those of the configured ones left out that had not left on
    /// request, then those that had joined a running group.
    pub rejoined: Vec<usize>,
    /// Messages delivered anywhere before the failure: each one is in
    /// every restarted member's history.
    pub delivered_before: u64,
    /// The history the first member to finish its replay rebuilt
    /// (messages, those of them its snapshot held included).
    pub history_messages: u64,
    /// Restarted members whose log was compacted (their history starts
    /// with the snapshot).
    pub snapshots_restored: u64,
    /// Logs whose torn tail (written, not synced) was dropped.
    pub torn_tails_dropped: u64,
    /// Why the restart was refused, if it was: the history may go on in
    /// logs of members that joined a running group
    /// ([`crate::restart::PlanError::HistoryElsewhere`]), or every log of
    /// the last view was lost or begun by a join
    /// ([`crate::restart::PlanError::NoCompleteLog`]). Nobody is
    /// restarted; the run ends at the failure.
    pub refused: Option<String>,
}

/// The first run's totals, added to the restarted group's in the report.
#[derive(Clone, Debug, Default)]
pub(super) struct TotalsBefore {
    pub sent: u64,
    pub delivered: Vec<u64>,
    pub large_sent: u64,
    pub large_cut: u64,
    pub log_compactions: u64,
}

/// What the restart is checked against.
pub(super) struct Restarted {
    pub report: RestartReport,
    pub totals_before: TotalsBefore,
    /// Every message delivered before the failure, by (view, seq).
    delivered_before: BTreeMap<(u64, u64), LogEntry>,
    /// Per sender rank, what it sent before the failure (len, xxh3).
    sent_before: Vec<BTreeSet<(u64, u64)>>,
    /// Per member, its snapshot's position (its history before it is
    /// the snapshot's).
    snapshot_at: Vec<(u64, u64)>,
    /// Per member, whether its finished replay was checked.
    replay_checked: Vec<bool>,
    /// The first member whose replay finished, and its history.
    reference: Option<(usize, Vec<LogEntry>)>,
}

/// A delivery's identity, without the member that delivered it.
fn message_of(e: &LogEntry) -> (u64, u64, usize, u64, u64, &str) {
    (e.view, e.seq, e.sender, e.index, e.len, e.xxh3.as_str())
}

impl Restarted {
    /// One replayed delivery: a message that was sent, and the one
    /// delivered at its position before the failure, if any was.
    pub fn check_replayed(&self, d: &Delivered) -> Result<(), Violation> {
        let sent = self
            .sent_before
            .get(d.sender)
            .is_some_and(|s| s.contains(&(d.len, d.xxh3)));
        if !sent {
            return Err(Violation::new(
                "nothing invented",
                format!(
                    "member {} was replayed seq {} of view {} from sender {} ({} B, xxh3 {:016x}), which that sender never sent",
                    d.member, d.seq, d.view, d.sender, d.len, d.xxh3
                ),
            ));
        }
        let e = d.to_log_entry();
        if let Some(before) = self.delivered_before.get(&(d.view, d.seq)) {
            if message_of(before) != message_of(&e) {
                return Err(Violation::new(
                    "total order",
                    format!(
                        "member {} was replayed {:?} at seq {} of view {}, where member {} had delivered {:?} before the failure",
                        d.member,
                        message_of(&e),
                        d.seq,
                        d.view,
                        before.member,
                        message_of(before)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// At the end of the run: every restarted member still running
    /// finished its replay.
    pub fn check_all_replayed(&self, ends: &[MemberEnd]) -> Result<(), Violation> {
        for &m in &self.report.members {
            if ends[m] == MemberEnd::Running && !self.replay_checked[m] {
                return Err(Violation::new(
                    "liveness",
                    format!("member {m} restarted from its log and never finished replaying its history"),
                ));
            }
        }
        Ok(())
    }
}

impl Cluster {
    /// Kill every member at once and restart the configured ones from
    /// their disks (see the module docs).
    pub(super) fn total_failure(&mut self) -> Result<(), SimFailure> {
        let n = self.spec.members;
        let at_ns = self.world.now_ns();
        self.world.record(SimEvent::Note {
            at_ns,
            text: "total failure: every member is killed".into(),
        });
        // What each disk holds: the durable bytes, and a torn part of
        // what was committed after them.
        let mut disks = Vec::with_capacity(n);
        for m in 0..n {
            let log = self.agents[m].as_ref().and_then(|a| a.group.core().persist_log());
            disks.push(match log {
                Some(log) => {
                    let written = log.sim_written_bytes();
                    let durable = log.sim_durable_bytes().len();
                    if self.plan.restart_disk_lies {
                        written[..durable * 3 / 4].to_vec()
                    } else {
                        let torn = self.restart_rng.below((written.len() - durable) as u64 + 1) as usize;
                        written[..durable + torn].to_vec()
                    }
                }
                None => self.left_disks[m].take().unwrap_or_default(),
            });
        }
        // Every application is gone with its process.
        self.agents = (0..n).map(|_| None).collect();
        self.senders = (0..n).map(|_| None).collect();
        self.large = (0..n).map(|_| None).collect();
        for m in 0..n {
            self.inboxes[m].lock().expect("inbox").clear();
            self.own_cuts[m].lock().expect("own cuts").clear();
        }
        // What the restart is checked against.
        let mut delivered_before = BTreeMap::new();
        for entries in self.logs.values() {
            for e in entries {
                delivered_before.entry((e.view, e.seq)).or_insert_with(|| e.clone());
            }
        }
        let sent_before: Vec<BTreeSet<(u64, u64)>> = (0..n)
            .map(|s| {
                self.checker
                    .context()
                    .sent(s)
                    .map(|v| v.iter().copied().collect())
                    .unwrap_or_default()
            })
            .collect();
        let totals_before = TotalsBefore {
            sent: self.sent.iter().sum(),
            delivered: (0..n).map(|m| self.checker.delivered_by(m)).collect(),
            large_sent: self.large_sent_ids.iter().map(|ids| ids.len() as u64).sum(),
            large_cut: self.cut_sent.iter().sum(),
            log_compactions: self.compactions_checked.iter().sum(),
        };
        // Read back, and the plan every member computes (Group::join
        // gets the same summaries through its exchange).
        let recovered: Vec<persist::RecoveredLog> = disks
            .iter()
            .enumerate()
            .map(|(m, d)| persist::recover_records(d, m as u32))
            .collect();
        let initial = self.config.initial_ranks();
        let initial_mask = initial.iter().fold(0u64, |mask, r| mask | 1 << r);
        let summaries: Vec<(usize, LogSummary)> = initial
            .iter()
            .map(|&m| (m, recovered[m].summary(initial_mask)))
            .collect();
        // A refusal is right when the history may be in logs that take
        // no part (members that joined a running group), or when every
        // member of the last view lost its log (the simulator keeps no
        // disk of a member that crashed before the total failure) or began
        // it by a join.
        let refusal_is_right = |e: &crate::restart::PlanError| match e {
            crate::restart::PlanError::HistoryElsewhere { .. } => true,
            crate::restart::PlanError::NoCompleteLog { last_members, .. } => PeerSet(*last_members).iter().all(|m| {
                !initial.contains(&m) || recovered[m].records.is_empty() || recovered[m].summary(initial_mask).joined
            }),
            crate::restart::PlanError::Logs(_) => false,
        };
        let plan = match crate::restart::plan(&summaries) {
            Ok(plan) => plan,
            Err(e) if refusal_is_right(&e) => {
                // Refused, as Group::join refuses: every member stops with
                // the reason, and the run ends here (no restarted group).
                let why = e.to_string();
                self.world.record(SimEvent::Note {
                    at_ns: self.world.now_ns(),
                    text: format!("restart refused: {why}"),
                });
                for m in 0..n {
                    if !matches!(self.ends[m], MemberEnd::NotStarted) {
                        self.ends[m] = MemberEnd::Stopped(format!("restart refused: {why}"));
                    }
                }
                self.restart = Some(Restarted {
                    report: RestartReport {
                        at_step: self.step,
                        delivered_before: delivered_before.len() as u64,
                        refused: Some(why),
                        ..RestartReport::default()
                    },
                    totals_before,
                    delivered_before,
                    sent_before,
                    snapshot_at: vec![(0, 0); n],
                    replay_checked: vec![false; n],
                    reference: None,
                });
                return Ok(());
            }
            Err(why) => {
                return Err(self.fail(Violation::new(
                    "restart after a total failure",
                    format!("the logs give no restart plan: {why}"),
                )))
            }
        };
        let (first_view, members) = plan.map_or((0, initial_mask), |p| (p.first_view, p.members));
        let ranks: Vec<usize> = PeerSet(members).iter().collect();
        let mut report = RestartReport {
            at_step: self.step,
            first_view,
            members: ranks.clone(),
            delivered_before: delivered_before.len() as u64,
            ..RestartReport::default()
        };
        for (m, r) in recovered.iter().enumerate() {
            if let Some(d) = &r.dropped {
                if d.valid_records_after {
                    return Err(self.fail(Violation::new(
                        "restart after a total failure",
                        format!("member {m}'s log is damaged inside, not torn at its end: {}", d.reason),
                    )));
                }
                report.torn_tails_dropped += 1;
            }
        }
        for &m in &initial {
            if let Some(why) = plan.and_then(|p| p.excluded(m, &summaries.iter().find(|s| s.0 == m).expect("m").1)) {
                report.excluded.push((m, why.clone()));
                // Restarted with the others, it joins afresh; one that
                // left on request is not started again.
                if self.ends[m] != MemberEnd::Left {
                    report.rejoined.push(m);
                }
            }
        }
        for m in 0..n {
            if !initial.contains(&m) && !matches!(self.ends[m], MemberEnd::NotStarted | MemberEnd::Left) {
                // A member that joined a running group restarts by joining
                // again (`Group::start_join`, as `join_running` does: its
                // log is set aside).
                report.rejoined.push(m);
            }
        }
        // The new world: every restarted member's processes and memory.
        let layout = SmcLayout::new(&self.config);
        let seed = self.restart_rng.next_u64();
        self.world = Self::open_world(&self.spec, &self.plan, &layout, seed).map_err(|e| {
            self.fail(Violation::new(
                "restart after a total failure",
                format!("a new world: {e}"),
            ))
        })?;
        let mut started = ranks.clone();
        started.extend(&report.rejoined);
        let fabrics = started
            .iter()
            .map(|&r| self.world.open(r).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.fail(Violation::new("restart after a total failure", e.to_string())))?;
        let logs_before = std::mem::take(&mut self.logs);
        self.logs = (0..n).map(|m| (m, Vec::new())).collect();
        let mut snapshot_at = vec![(0, 0); n];
        for fabric in fabrics {
            let m = fabric.member_rank();
            let rec = &recovered[m];
            let rejoins = report.rejoined.contains(&m);
            if rejoins {
                // Its history is gone with its log: a joiner's, from the
                // state a member sends it.
                self.logs.insert(m, Vec::new());
                let joined = if initial.contains(&m) {
                    let log = PersistLog::memory_recovered(rec);
                    Group::start_from_log(fabric, self.config.clone(), log, rec, &summaries)
                } else {
                    let fresh = PersistLog::memory_recovered(rec)
                        .set_aside(m, "sim")
                        .expect("a log in memory is set aside without I/O")
                        .0;
                    Group::start_join_with_log(fabric, self.config.clone(), Some(fresh)).map(|g| (g, None))
                };
                let (group, line) = joined.map_err(|e| {
                    self.fail(Violation::new(
                        "restart after a total failure",
                        format!("member {m}, left out, could not join the restarted group: {e}"),
                    ))
                })?;
                if !group.is_joining() {
                    return Err(self.fail(Violation::new(
                        "restart after a total failure",
                        format!("member {m} was left out of the restart but did not join afresh"),
                    )));
                }
                if let Some(text) = line {
                    self.world.record(SimEvent::Note {
                        at_ns: self.world.now_ns(),
                        text,
                    });
                }
                self.senders[m] = group.sender();
                let in_place = self.plan.large_in_place_members >> m & 1 == 1;
                self.agents[m] = Some(Self::agent(group, &self.inboxes[m], &self.own_cuts[m], in_place));
                self.ends[m] = MemberEnd::Running;
                continue;
            }
            if let Some(s) = rec.snapshot() {
                snapshot_at[m] = (s.view, s.seq);
                report.snapshots_restored += 1;
            }
            // Its state holds what it delivered before its snapshot's
            // position; the replay delivers the rest of the history.
            self.logs.insert(
                m,
                logs_before[&m]
                    .iter()
                    .filter(|e| (e.view, e.seq) < snapshot_at[m])
                    .cloned()
                    .collect(),
            );
            let log = PersistLog::memory_recovered(rec);
            let (group, line) =
                Group::start_from_log(fabric, self.config.clone(), log, rec, &summaries).map_err(|e| {
                    self.fail(Violation::new(
                        "restart after a total failure",
                        format!("member {m} could not restart from its log: {e}"),
                    ))
                })?;
            if let Some(text) = line {
                self.world.record(SimEvent::Note {
                    at_ns: self.world.now_ns(),
                    text,
                });
            }
            self.senders[m] = group.sender();
            self.agents[m] = Some(Self::agent_after(
                group,
                &self.inboxes[m],
                &self.own_cuts[m],
                first_view,
                self.plan.large_in_place_members >> m & 1 == 1,
            ));
            self.ends[m] = MemberEnd::Running;
        }
        // The restarted group is checked from its first view, afresh.
        let sender_ranks: Vec<usize> = self
            .config
            .senders
            .ranks(n)
            .into_iter()
            .filter(|r| ranks.contains(r))
            .collect();
        self.checker = Checker::with_members(first_view, &ranks, n, &sender_ranks, true);
        self.views = vec![None; n];
        self.sent = vec![0; n];
        self.large_sent_ids = vec![Vec::new(); n];
        self.cut_sent = vec![0; n];
        self.compactions_checked = vec![0; n];
        self.compaction_checked_deliveries = vec![0; n];
        self.faults_injected = true;
        self.restart = Some(Restarted {
            report,
            totals_before,
            delivered_before,
            sent_before,
            snapshot_at,
            replay_checked: vec![false; n],
            reference: None,
        });
        Ok(())
    }

    /// Once restarted member `m` finished its replay: its history is in
    /// order, holds every message delivered before the failure, and is
    /// the history the other restarted members rebuilt.
    pub(super) fn check_replay_done(&mut self, m: usize) -> Result<(), Violation> {
        let Some(r) = self.restart.as_mut() else {
            return Ok(());
        };
        if r.replay_checked[m] || !r.report.members.contains(&m) {
            return Ok(());
        }
        if self.agents[m].as_ref().is_none_or(|a| a.group.core().is_replaying()) {
            return Ok(());
        }
        r.replay_checked[m] = true;
        let first_view = r.report.first_view;
        let history: Vec<LogEntry> = self.logs[&m].iter().filter(|e| e.view < first_view).cloned().collect();
        if let Some(w) = history
            .windows(2)
            .find(|w| (w[0].view, w[0].seq) >= (w[1].view, w[1].seq))
        {
            return Err(Violation::new(
                "total order",
                format!(
                    "member {m}'s restored history has seq {} of view {} before seq {} of view {}",
                    w[0].seq, w[0].view, w[1].seq, w[1].view
                ),
            ));
        }
        let held: BTreeSet<(u64, u64)> = history.iter().map(|e| (e.view, e.seq)).collect();
        let snapshot_at = r.snapshot_at[m];
        if let Some((at, lost)) = r
            .delivered_before
            .iter()
            .find(|(at, _)| **at >= snapshot_at && !held.contains(at))
        {
            return Err(Violation::new(
                "no loss of delivered messages",
                format!(
                    "member {} delivered seq {} of view {} before the total failure; member {m}'s restored history \
                     (snapshot at view {} seq {}, {} messages replayed) does not hold it",
                    lost.member,
                    at.1,
                    at.0,
                    snapshot_at.0,
                    snapshot_at.1,
                    held.len()
                ),
            ));
        }
        match &r.reference {
            None => {
                r.report.history_messages = history.len() as u64;
                r.reference = Some((m, history));
            }
            Some((other, theirs)) => {
                let from = snapshot_at.max(r.snapshot_at[*other]);
                let tail = |h: &[LogEntry]| -> Vec<(u64, u64, usize, u64, u64, String)> {
                    h.iter()
                        .filter(|e| (e.view, e.seq) >= from)
                        .map(|e| (e.view, e.seq, e.sender, e.index, e.len, e.xxh3.clone()))
                        .collect()
                };
                let (mine, theirs) = (tail(&history), tail(theirs));
                if mine != theirs {
                    let at = mine
                        .iter()
                        .zip(&theirs)
                        .position(|(a, b)| a != b)
                        .unwrap_or(mine.len().min(theirs.len()));
                    return Err(Violation::new(
                        "total order",
                        format!(
                            "members {m} and {other} restored different histories (from view {} seq {} on): \
                             {} and {} messages, first difference at #{at}: {:?} vs {:?}",
                            from.0,
                            from.1,
                            mine.len(),
                            theirs.len(),
                            mine.get(at),
                            theirs.get(at)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
