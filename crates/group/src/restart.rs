//! Restart after a total failure (persistent mode).
//!
//! Every member of a persistent group starts by reading its log back
//! ([`crate::persist::recover`]) and publishing a summary of it, a
//! [`RestartLine`] in its row: the last view it installed, that view's
//! members, where the view before it ended, and how far its log goes in
//! its last view. When every configured member's summary is in, each
//! member computes the same [`RestartPlan`] from them:
//!
//! - `L`, the last view any log reached, and its members;
//! - the members that can rebuild the state: in `L`, with a complete log
//!   (not empty, not started by a join), that installed `L` or the view
//!   before it;
//! - the cut: the smallest log frontier in `L` over those members (0 for
//!   a member that had not installed `L` yet).
//!
//! **Why nothing delivered is lost.** A message of `L` is delivered only
//! once every member of `L` has it on disk, so it lies below every such
//! member's frontier, hence below the cut. A message of an earlier view was
//! delivered below that view's `final_seq`, which in persistent mode is the
//! smallest *persisted* frontier over the survivors (see
//! `membership::fresh_proposal`): every member of the next view had it on
//! disk before the view was proposed. A member that had not installed `L`
//! has no message of `L` on disk, so none of `L` was delivered.
//! **Why nothing is invented.** The history each member replays is read
//! from its own log: messages that were on its disk, in the total order,
//! without those a view record trimmed, and below the cut.
//!
//! Each member then seals its log (view records that end `L` at the cut,
//! and the view before it where it had not yet installed `L`), hands the
//! history to the application (as deliveries, before anything new) and
//! the group goes on in view `L + 1` with the members that could rebuild
//! the state. A member that cannot (removed before the failure, joined
//! late, lost its log) says why, sets its log aside (renamed, kept) and
//! joins the restarted group afresh with an empty log: it is admitted in
//! a later view and gets the state from a member, like any joiner.

use std::ops::Range;
use std::time::{Duration, Instant};

use spindle_fabric::{Fabric, PeerSet};

use crate::layout::{RestartLine, SmcLayout, RESTART_LINE_VALID};
use crate::persist::{LogSummary, PersistLog, RecoveredLog};
use crate::sync::Ordering;
use crate::GroupError;

const FLAG_PREV: u64 = 1;
const FLAG_JOINED: u64 = 2;

/// What every member computes from the summaries (the same everywhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPlan {
    /// The last view any log reached.
    pub last_view: u64,
    pub last_members: u64,
    /// The view before it and its final seq, where a log knows it.
    pub prev: Option<(u64, u64)>,
    /// The history of `last_view` is its messages below this seq.
    pub cut_seq: u64,
    /// The members that rebuild the state and form the next view.
    pub members: u64,
    /// The restarted group's first view: `last_view + 1`.
    pub first_view: u64,
}

impl RestartPlan {
    /// Why `rank` (with this summary) does not take part, if it does not.
    pub fn excluded(&self, rank: usize, s: &LogSummary) -> Option<String> {
        if self.members & (1 << rank) != 0 {
            return None;
        }
        Some(
            if self.last_members & (1 << rank) == 0 && s.last_view == self.last_view {
                format!(
                    "it left the group, or was removed, at view {}: the group went on without it (members {:?})",
                    self.last_view,
                    PeerSet(self.last_members).iter().collect::<Vec<_>>()
                )
            } else if self.last_members & (1 << rank) == 0 {
                format!(
                    "its log ends in view {} but the group went on to view {} without it (members {:?}): \
                 it cannot rebuild the group's state from its log",
                    s.last_view,
                    self.last_view,
                    PeerSet(self.last_members).iter().collect::<Vec<_>>()
                )
            } else if s.records == 0 {
                format!(
                    "its log is empty but it was a member of the last view {}: its history is gone",
                    self.last_view
                )
            } else if s.joined {
                "it joined a running group, so its log lacks the history before that".to_string()
            } else {
                format!(
                    "its log ends in view {}, more than one view before the last view {}",
                    s.last_view, self.last_view
                )
            },
        )
    }
}

/// Why the summaries give no restart plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The history may go on in logs that take no part in the restart:
    /// enough members of the last view the logs know joined a running
    /// group (they restart as joiners, their logs set aside) to have gone
    /// on without the members here, so a restart from these logs could
    /// lose what they delivered. Nothing is restarted (safety over
    /// liveness); every log is kept.
    HistoryElsewhere {
        last_view: u64,
        last_members: u64,
        /// The members of `last_view` that take no part in the restart.
        outside: u64,
    },
    /// No member of the last view the logs know has a log that can
    /// rebuild the state (each is empty, lost, or begun by a join).
    NoCompleteLog { last_view: u64, last_members: u64 },
    /// The logs cannot be restarted from: they disagree.
    Logs(String),
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::HistoryElsewhere {
                last_view,
                last_members,
                outside,
            } => write!(
                f,
                "the last view the logs here know, view {last_view} (members {:?}), holds members {:?} that joined a \
                 running group and take no part in a restart (their logs are set aside when they start again): \
                 they are enough to have gone on without the members here, so a restart from these logs could lose \
                 what they delivered; nothing is restarted and every log is kept",
                PeerSet(*last_members).iter().collect::<Vec<_>>(),
                PeerSet(*outside).iter().collect::<Vec<_>>()
            ),
            PlanError::NoCompleteLog {
                last_view,
                last_members,
            } => write!(
                f,
                "no log can rebuild the state: the members of the last view {last_view} ({:?}) have empty or \
                 incomplete logs",
                PeerSet(*last_members).iter().collect::<Vec<_>>()
            ),
            PlanError::Logs(why) => f.write_str(why),
        }
    }
}

/// The plan from every configured member's summary (`None`: every log is
/// empty, a first start). The summaries are those of the members that take
/// part in the restart (the configured initial members, see
/// [`exchange`]).
///
/// **The history is not elsewhere.** Members that joined a running group
/// take no part (their logs lack the history before their join). A view
/// needs a strict majority of the view before it (leavers count: they
/// agree to their removal, and a leaver's log records the view that went
/// on without it, see `membership`), so if the members of the last view
/// `L` that take part are at least half of `L`, every view after `L`
/// would have one of them in it, and its log would show it. Otherwise the
/// members outside may have gone on alone: [`PlanError::HistoryElsewhere`].
pub fn plan(summaries: &[(usize, LogSummary)]) -> Result<Option<RestartPlan>, PlanError> {
    let written: Vec<&(usize, LogSummary)> = summaries.iter().filter(|(_, s)| s.records > 0).collect();
    let Some(last_view) = written.iter().map(|(_, s)| s.last_view).max() else {
        return Ok(None);
    };
    let at_last: Vec<&LogSummary> = written
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.last_view == last_view)
        .collect();
    let last_members = at_last[0].last_members;
    if let Some(other) = at_last.iter().find(|s| s.last_members != last_members) {
        return Err(PlanError::Logs(format!(
            "the logs disagree on the members of view {last_view}: {:?} and {:?} (logs of different groups?)",
            PeerSet(last_members).iter().collect::<Vec<_>>(),
            PeerSet(other.last_members).iter().collect::<Vec<_>>()
        )));
    }
    let taking_part = summaries.iter().fold(0u64, |mask, (r, _)| mask | 1 << r);
    let outside = last_members & !taking_part;
    if outside.count_ones() * 2 > last_members.count_ones() {
        return Err(PlanError::HistoryElsewhere {
            last_view,
            last_members,
            outside,
        });
    }
    let prev = at_last.iter().find_map(|s| s.prev);
    let eligible = |s: &LogSummary| {
        s.records > 0 && !s.joined && (s.last_view == last_view || prev.is_some_and(|(pv, _)| pv == s.last_view))
    };
    let mut members = 0u64;
    let mut cut_seq = u64::MAX;
    for (rank, s) in summaries {
        if last_members & (1 << rank) != 0 && eligible(s) {
            members |= 1 << rank;
            cut_seq = cut_seq.min(if s.last_view == last_view { s.frontier } else { 0 });
        }
    }
    if members == 0 {
        return Err(PlanError::NoCompleteLog {
            last_view,
            last_members,
        });
    }
    Ok(Some(RestartPlan {
        last_view,
        last_members,
        prev,
        cut_seq,
        members,
        first_view: last_view + 1,
    }))
}

fn line_bytes(s: &LogSummary) -> [u64; 8] {
    let (prev_view, prev_final) = s.prev.unwrap_or((0, 0));
    let flags = if s.prev.is_some() { FLAG_PREV } else { 0 } | if s.joined { FLAG_JOINED } else { 0 };
    [
        RESTART_LINE_VALID,
        s.last_view,
        s.last_members,
        prev_view,
        prev_final,
        s.frontier,
        flags,
        s.records,
    ]
}

/// Publish this member's summary and wait (up to `timeout`) for every
/// rank in `ranks` to publish its own; returns them all, by rank.
pub fn exchange<F: Fabric>(
    fabric: &F,
    layout: &SmcLayout,
    mine: &LogSummary,
    ranks: &[usize],
    timeout: Duration,
) -> Result<Vec<(usize, LogSummary)>, GroupError> {
    let me = fabric.member_rank();
    let base = layout.restart.offset();
    let row = fabric.row(me);
    let words = line_bytes(mine);
    for (i, w) in words.iter().enumerate().skip(1) {
        row.u64_at(base + 8 * i).store(*w, Ordering::Relaxed);
    }
    // Release: pairs with the Acquire load of `valid` below, in the peers
    // (the fields above are written first).
    row.u64_at(base).store(words[0], Ordering::Release);
    let range = base..base + std::mem::size_of::<RestartLine>();
    let peers = PeerSet(ranks.iter().filter(|r| **r != me).fold(0u64, |m, r| m | 1 << r));
    let started = Instant::now();
    let mut last_push: Option<Instant> = None;
    let mut sleep_us = 20u64;
    loop {
        if last_push.is_none_or(|t| t.elapsed() >= Duration::from_millis(20)) {
            fabric.push(range.clone(), peers)?;
            fabric.flush();
            last_push = Some(Instant::now());
        }
        fabric.receive_now();
        let missing: Vec<usize> = ranks
            .iter()
            .copied()
            // Acquire: pairs with the Release store of `valid` above, in
            // that member (its fields were written before).
            .filter(|r| fabric.row(*r).u64_at(base).load(Ordering::Acquire) != RESTART_LINE_VALID)
            .collect();
        if missing.is_empty() {
            break;
        }
        if started.elapsed() >= timeout {
            return Err(GroupError::JoinFailed {
                rank: me,
                group: String::new(),
                reason: format!(
                    "restart: members {missing:?} did not publish their log summaries within {} ms",
                    timeout.as_millis()
                ),
            });
        }
        std::thread::sleep(Duration::from_micros(sleep_us));
        sleep_us = (sleep_us * 2).min(2_000);
    }
    Ok(ranks
        .iter()
        .map(|&r| {
            let row = fabric.row(r);
            let w = |i: usize| row.u64_at(base + 8 * i).load(Ordering::Relaxed);
            let flags = w(6);
            (
                r,
                LogSummary {
                    last_view: w(1),
                    last_members: w(2),
                    prev: (flags & FLAG_PREV != 0).then(|| (w(3), w(4))),
                    frontier: w(5),
                    joined: flags & FLAG_JOINED != 0,
                    records: w(7),
                },
            )
        })
        .collect())
}

/// One message of a restart's history.
pub struct ReplayMessage {
    pub view: u64,
    pub seq: u64,
    pub sender_rank: usize,
    pub sender_index: usize,
    pub index: u64,
    /// A fragment of a large message (see [`crate::large`]).
    pub fragment: bool,
    /// Its payload in [`Replay::bytes`].
    pub bytes: Range<usize>,
}

/// The history a restarted member hands its application: the snapshot
/// its log was compacted to, if any, then its log's messages in total
/// order, below the plan's cut.
pub struct Replay {
    /// The application's state at `snapshot_at` (view, seq), restored
    /// before the first message (see [`crate::persist`]'s compaction).
    pub snapshot: Option<Vec<u8>>,
    pub snapshot_at: (u64, u64),
    pub messages: Vec<ReplayMessage>,
    pub bytes: Vec<u8>,
    /// Messages handed over so far.
    pub next: usize,
    /// The view of the last message handed over, and the ranks of its
    /// senders by index (as far as seen).
    pub view: Option<u64>,
    pub ranks: Vec<usize>,
}

/// Seal this member's log for the plan (the view records that end the
/// old history at the cut, synced) and return the history to replay.
pub fn seal(
    log: &mut PersistLog,
    recovered: &RecoveredLog,
    summary: &LogSummary,
    plan: &RestartPlan,
) -> Result<Replay, String> {
    let history = recovered.history();
    let snapshot = recovered.snapshot();
    if let Some(snap) = &snapshot {
        // Only delivered messages are compacted, and a delivered message
        // is on every member's disk: below the cut (see the module docs).
        // A snapshot in the last view may lie past the cut: the cut is the
        // smallest *record* frontier, and nulls leave no record. Everything
        // below the snapshot's position was delivered here, so every member
        // of the view had it on disk: a position between the cut and the
        // snapshot with a message would have raised every frontier past
        // it. So only nulls lie there, and the snapshot is the state at
        // the cut (total order holds; nothing is replayed from this log).
        let past_last_view = snap.view > plan.last_view;
        let past_prev_end = plan.prev.is_some_and(|(pv, pf)| snap.view == pv && snap.seq > pf);
        if past_last_view || past_prev_end {
            return Err(format!(
                "{}: its snapshot holds the messages up to view {} seq {}, beyond the history the members agree on \
                 (view {} up to seq {}): the logs are of different runs",
                recovered.path.display(),
                snap.view,
                snap.seq,
                plan.last_view,
                plan.cut_seq
            ));
        }
    }
    let mut replay = Replay {
        snapshot: snapshot.as_ref().map(|s| recovered.bytes[s.state.clone()].to_vec()),
        snapshot_at: snapshot.as_ref().map_or((0, 0), |s| (s.view, s.seq)),
        messages: Vec::with_capacity(history.len()),
        bytes: Vec::new(),
        next: 0,
        view: None,
        ranks: Vec::new(),
    };
    for m in history {
        let trimmed_prev = plan.prev.is_some_and(|(pv, pf)| m.view == pv && m.seq >= pf);
        let past_cut = m.view == plan.last_view && m.seq >= plan.cut_seq;
        if trimmed_prev || past_cut || m.view > plan.last_view {
            continue;
        }
        let at = replay.bytes.len();
        replay.bytes.extend_from_slice(m.payload);
        replay.messages.push(ReplayMessage {
            view: m.view,
            seq: m.seq,
            sender_rank: m.sender_rank as usize,
            sender_index: m.sender_index,
            index: m.index,
            fragment: m.fragment,
            bytes: at..replay.bytes.len(),
        });
    }
    if summary.last_view != plan.last_view {
        let (pv, pf) = plan.prev.expect("a member one view behind knows where that view ended");
        log.install_view(plan.last_view, pv, pf, plan.last_members)?;
    }
    log.install_view(plan.first_view, plan.last_view, plan.cut_seq, plan.members)?;
    Ok(replay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(last_view: u64, members: u64, prev: Option<(u64, u64)>, frontier: u64) -> LogSummary {
        LogSummary {
            last_view,
            last_members: members,
            prev,
            frontier,
            joined: false,
            records: 10,
        }
    }

    #[test]
    fn empty_logs_are_a_first_start() {
        let empty = LogSummary::default();
        assert_eq!(plan(&[(0, empty), (1, empty)]).unwrap(), None);
    }

    #[test]
    fn the_cut_is_the_smallest_frontier_in_the_last_view() {
        let p = plan(&[
            (0, s(0, 0b111, None, 40)),
            (1, s(0, 0b111, None, 37)),
            (2, s(0, 0b111, None, 52)),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((p.last_view, p.cut_seq, p.members, p.first_view), (0, 37, 0b111, 1));
    }

    #[test]
    fn a_member_one_view_behind_cuts_the_last_view_to_nothing() {
        // Members 0 and 1 installed view 3 (view 2 ended at 17); member 2
        // was acknowledged into it but crashed before installing it.
        let p = plan(&[
            (0, s(3, 0b111, Some((2, 17)), 9)),
            (1, s(3, 0b111, Some((2, 17)), 4)),
            (2, s(2, 0b111, Some((1, 5)), 30)),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (p.last_view, p.prev, p.cut_seq, p.members),
            (3, Some((2, 17)), 0, 0b111)
        );
    }

    #[test]
    fn a_member_removed_earlier_or_with_an_empty_log_is_told_why() {
        let mut empty = s(0, 0b011, None, 0);
        empty.records = 0;
        let p = plan(&[
            (0, s(4, 0b011, Some((3, 2)), 6)),
            (1, s(4, 0b011, Some((3, 2)), 8)),
            (2, s(1, 0b111, Some((0, 3)), 1)),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((p.members, p.cut_seq), (0b011, 6));
        let why = p.excluded(2, &s(1, 0b111, Some((0, 3)), 1)).unwrap();
        assert!(why.contains("went on to view 4 without it"), "{why}");
        let p = plan(&[(0, s(0, 0b11, None, 6)), (1, empty)]).unwrap().unwrap();
        assert_eq!(p.members, 0b01);
        assert!(p.excluded(1, &empty).unwrap().contains("log is empty"));
    }

    #[test]
    fn a_last_view_of_members_that_take_no_part_is_refused() {
        // Member 0 (the one initial member) left at view 2; member 1, which
        // joined a running group, went on alone: its history is not here.
        let left = s(2, 0b10, Some((1, 30)), 0);
        let e = plan(&[(0, left)]).unwrap_err();
        assert_eq!(
            e,
            PlanError::HistoryElsewhere {
                last_view: 2,
                last_members: 0b10,
                outside: 0b10
            }
        );
        assert!(
            e.to_string().contains("holds members [1] that joined a running group"),
            "{e}"
        );
        // The leaver is told it left, not that the group went on to its
        // own last view without it.
        let left_two = s(2, 0b110, Some((1, 30)), 0);
        let p = plan(&[(0, left_two), (1, s(2, 0b110, Some((1, 30)), 4))])
            .unwrap()
            .unwrap();
        let why = p.excluded(0, &left_two).unwrap();
        assert!(why.contains("it left the group, or was removed, at view 2"), "{why}");
        // Two of three members outside: a majority of view 5, refused.
        let e = plan(&[(0, s(5, 0b1101, Some((4, 8)), 3)), (1, s(3, 0b111, None, 2))]).unwrap_err();
        assert!(
            matches!(e, PlanError::HistoryElsewhere { outside: 0b1100, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn a_joiner_beside_as_many_members_that_take_part_does_not_stop_a_restart() {
        // View 1 is members 1 and 2 (2 joined a running group): a next view
        // needs a majority of it, so member 1 would be in it and its log
        // would show it.
        let p = plan(&[(0, s(1, 0b110, Some((0, 12)), 0)), (1, s(1, 0b110, Some((0, 12)), 7))])
            .unwrap()
            .unwrap();
        assert_eq!((p.last_view, p.members, p.cut_seq), (1, 0b010, 7));
        // Both of the last view's logs gone or begun by a join: no plan.
        let mut joined = s(1, 0b110, Some((0, 12)), 7);
        joined.joined = true;
        let e = plan(&[(0, s(1, 0b110, Some((0, 12)), 0)), (1, joined)]).unwrap_err();
        assert_eq!(
            e,
            PlanError::NoCompleteLog {
                last_view: 1,
                last_members: 0b110
            }
        );
    }
}
