//! Invariant checkers: one implementation per property, in the file
//! named after it, each an incremental checker fed one event at a time (a
//! delivery or a view installation at a member) by the one [`Checker`].
//!
//! - The simulator drives the [`Checker`] online, after every step of
//!   every member ([`simulation`]), and stops at the first violation.
//! - The log checks ([`check_all`], [`check_lines`], ...) read delivery
//!   logs ([`log`], written by [`crate::delivery_log`]) and replay them as
//!   a stream of events into the same [`Checker`] (`replay`).
//!
//! Member ids are stable across views; in each view `seq` and each
//! sender's `index` restart at 0, so a message is `(view, sender, index)`.
//!
//! Per delivery:
//!
//! - [`sending_view`]: a message is delivered in the view it was sent in,
//!   which is the view the member installed last, from a member of it;
//! - [`no_duplication`]: no member delivers a `(view, sender, index)` twice;
//! - [`fifo`]: each member delivers each sender's messages of a view in send order;
//! - [`integrity`]: every member delivered the same bytes for a message,
//!   from a sender of the view, and (when what was sent is known) bytes
//!   that were sent;
//! - [`no_gaps`]: every member delivered every message each sender sent
//!   (only while the membership never changed);
//! - [`total_order`] (ordered mode): per view, members agree on one
//!   delivery order (each member's sequence in the view is a prefix of
//!   one agreed sequence), `seq` grows within a view, and a member's
//!   views never go back.
//!
//! Per view installation:
//!
//! - [`view_chain`]: views strictly increase per member, one membership per
//!   view id (no split brain), a member installs only views that list it,
//!   and each view keeps a majority of the previous one;
//! - [`no_loss`]: what the first member to move past a view delivered in
//!   it, every member of the view that moves past it delivered in it;
//! - [`virtual_synchrony`]: no member that moves past a view delivered
//!   more in it than the first one did.

pub mod checker;
pub mod fifo;
pub mod integrity;
pub mod log;
pub mod no_duplication;
pub mod no_gaps;
pub mod no_loss;
#[cfg(test)]
mod online_tests;
mod replay;
pub mod sending_view;
pub mod simulation;
mod survivors;
pub mod total_order;
pub mod view_chain;
pub mod virtual_synchrony;

pub use checker::{Checker, Delivered, Event, Installed, Scope};
pub use log::{
    index_gaps, interleave, read_all, read_lines, read_lines_and_nulls, read_logs, split_lines, LogEntry, LogLine,
    Logs, MemberLines, NullRunEntry, NullRuns, ViewEntry, ViewLogs,
};
pub use replay::{check_all, check_all_views, check_lines, check_views};

/// A broken invariant: which property, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{property} violated: {detail}")]
pub struct Violation {
    pub property: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(property: &'static str, detail: String) -> Violation {
        Violation { property, detail }
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) use super::replay::both;
}

/// A delivery line in view 0 (tests).
#[cfg(test)]
pub(crate) fn entry(member: usize, sender: usize, index: u64, seq: u64) -> LogEntry {
    ventry(member, 0, sender, index, seq)
}

/// A delivery line in `view` (tests); the bytes depend on the message.
#[cfg(test)]
pub(crate) fn ventry(member: usize, view: u64, sender: usize, index: u64, seq: u64) -> LogEntry {
    LogEntry {
        member,
        view,
        sender,
        index,
        seq,
        len: 8,
        xxh3: format!("{:016x}", view * 1_000_000 + sender as u64 * 1000 + index),
    }
}

/// Test scenarios shared by the checkers' tests: multi-view logs built
/// from a compact description.
#[cfg(test)]
pub(crate) mod scenario {
    use super::*;

    /// One view: its id, members (ascending) and the agreed order of
    /// messages `(sender, index)` in it; `seq = index × senders + position
    /// of sender` with every member of the view a sender.
    pub struct View {
        pub id: u64,
        pub members: Vec<usize>,
        pub order: Vec<(usize, u64)>,
    }

    impl View {
        pub fn new(id: u64, members: &[usize], order: &[(usize, u64)]) -> View {
            View {
                id,
                members: members.to_vec(),
                order: order.to_vec(),
            }
        }

        pub fn seq(&self, sender: usize, index: u64) -> u64 {
            let pos = self.members.iter().position(|m| *m == sender).unwrap_or(0);
            index * self.members.len() as u64 + pos as u64
        }
    }

    /// What a member did: per view it installed, how many of the view's
    /// agreed messages it delivered (a prefix).
    pub fn build(views: &[View], lives: &[(usize, &[(u64, usize)])]) -> (Logs, ViewLogs) {
        let mut lines = MemberLines::new();
        for (member, steps) in lives {
            let mut out = Vec::new();
            for (id, count) in *steps {
                let v = views.iter().find(|v| v.id == *id).expect("view");
                out.push(LogLine::View(ViewEntry {
                    member: *member,
                    view: v.id,
                    members: v.members.clone(),
                }));
                for (s, i) in v.order.iter().take(*count) {
                    out.push(LogLine::Delivery(ventry(*member, v.id, *s, *i, v.seq(*s, *i))));
                }
            }
            lines.insert(*member, out);
        }
        split_lines(&lines)
    }

    /// Interleaved lines from the same description.
    pub fn build_lines(views: &[View], lives: &[(usize, &[(u64, usize)])]) -> MemberLines {
        let (logs, view_logs) = build(views, lives);
        let mut lines = MemberLines::new();
        for (member, vs) in &view_logs {
            let mut out = Vec::new();
            for v in vs {
                out.push(LogLine::View(v.clone()));
                out.extend(
                    logs[member]
                        .iter()
                        .filter(|e| e.view == v.view)
                        .cloned()
                        .map(LogLine::Delivery),
                );
            }
            lines.insert(*member, out);
        }
        lines
    }

    /// The lives of [`healthy`], as interleaved lines.
    pub fn healthy_lines(views: &[View]) -> MemberLines {
        build_lines(views, HEALTHY)
    }

    const HEALTHY: &[(usize, &[(u64, usize)])] = &[
        (0, &[(0, 5), (1, 3), (2, 2), (3, 2)]),
        (1, &[(0, 5), (1, 3), (2, 2), (3, 3)]),
        (2, &[(0, 5), (1, 3)]),
        (3, &[(0, 2)]),
        (4, &[(3, 2)]),
    ];

    /// A crash, a ragged edge, a leave and a join:
    /// - view 0 = {0, 1, 2, 3}; member 3 crashes after 2 deliveries; the
    ///   survivors deliver 5 (the ragged edge: message (2, 1) reached all).
    /// - view 1 = {0, 1, 2}: all deliver 3; member 2 leaves.
    /// - view 2 = {0, 1}: 2 deliveries; member 4 joins.
    /// - view 3 = {0, 1, 4}: member 1 delivered 3, members 0 and 4 only 2
    ///   (still running: no later view).
    pub fn healthy() -> (Vec<View>, (Logs, ViewLogs)) {
        let views = vec![
            View::new(0, &[0, 1, 2, 3], &[(0, 0), (1, 0), (2, 0), (3, 0), (2, 1)]),
            View::new(1, &[0, 1, 2], &[(0, 0), (1, 0), (0, 1)]),
            View::new(2, &[0, 1], &[(1, 0), (0, 1)]),
            View::new(3, &[0, 1, 4], &[(0, 0), (4, 0), (1, 1)]),
        ];
        let logs = build(&views, HEALTHY);
        (views, logs)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_healthy_multi_view_run_passes_everything() {
        let (views, (logs, view_logs)) = scenario::healthy();
        check_views(&logs, &view_logs).unwrap();
        // no_gaps is lifted (the membership changed): the counts are wrong on purpose.
        check_all_views(&logs, &view_logs, &BTreeMap::from([(0, 1000)]), true).unwrap();
        let lives: &[(usize, &[(u64, usize)])] = &[(0, &[(0, 5), (1, 3)]), (2, &[(0, 5), (1, 3)])];
        check_lines(&scenario::build_lines(&views, lives), true).unwrap();
        assert_eq!(tests_support::both(&scenario::healthy_lines(&views), true), None);
    }

    #[test]
    fn a_static_run_keeps_no_gaps() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 0, 0, 0), entry(1, 1, 0, 1)]),
        ]);
        let expected = BTreeMap::from([(0, 1), (1, 1)]);
        check_all(&logs, &expected, true).unwrap();
        let view = |member| ViewEntry {
            member,
            view: 0,
            members: vec![0, 1],
        };
        let views = ViewLogs::from([(0, vec![view(0)]), (1, vec![view(1)])]);
        check_all_views(&logs, &views, &expected, true).unwrap();
        let more = BTreeMap::from([(0, 2), (1, 1)]);
        assert_eq!(check_all(&logs, &more, true).unwrap_err().property, "no gaps");
        assert_eq!(
            check_all_views(&logs, &views, &more, true).unwrap_err().property,
            "no gaps"
        );
        // Deliveries in two views without view lines: a membership change.
        let mut two = logs.clone();
        two.get_mut(&0).unwrap().push(ventry(0, 1, 0, 0, 0));
        check_all(&two, &more, false).unwrap();
    }

    #[test]
    fn each_broken_property_of_a_multi_view_run_is_named() {
        type Corrupt = fn(&mut Logs, &mut ViewLogs);
        let cases: Vec<(Corrupt, &str)> = vec![
            (
                |l, _| {
                    let e = l[&1][6].clone();
                    l.get_mut(&1).unwrap().insert(7, e);
                },
                "no duplication",
            ),
            // Breaks total order too (seq goes back): FIFO is named first.
            (|l, _| l.get_mut(&0).unwrap().swap(5, 7), "per-sender FIFO"),
            (|l, _| l.get_mut(&2).unwrap()[6].xxh3 = "0".repeat(16), "integrity"),
            (|l, _| l.get_mut(&1).unwrap().swap(5, 6), "total order"),
            (|_, v| v.get_mut(&1).unwrap()[2].members = vec![1], "view chain"),
            (
                |_, v| v.get_mut(&4).unwrap()[0].members = vec![0, 1, 4, 5, 6],
                "view chain",
            ),
            (
                |l, _| l.get_mut(&4).unwrap().insert(0, ventry(4, 2, 1, 0, 1)),
                "delivery in the sending view",
            ),
            (
                |l, _| {
                    // Member 0, the first to leave view 2, without its last message.
                    l.get_mut(&0).unwrap().remove(9);
                },
                "virtual synchrony",
            ),
            (
                |l, _| {
                    // Member 2 moved on from view 0 without its last message.
                    l.get_mut(&2).unwrap().remove(4);
                },
                "no loss",
            ),
        ];
        for (corrupt, want) in cases {
            let (_, (mut logs, mut views)) = scenario::healthy();
            corrupt(&mut logs, &mut views);
            let got = check_all_views(&logs, &views, &BTreeMap::new(), true).unwrap_err();
            assert_eq!(got.property, want, "{got}");
        }
        // Members that stopped in a view may have delivered a prefix only:
        // member 2 (left after view 1) and member 3 (crashed in view 0).
        let (_, (mut logs, views)) = scenario::healthy();
        logs.get_mut(&2).unwrap().truncate(6);
        logs.get_mut(&3).unwrap().truncate(0);
        check_all_views(&logs, &views, &BTreeMap::new(), true).unwrap();
    }
}
