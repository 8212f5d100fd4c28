//! Invariant checkers, one file per property, over delivery logs (the
//! same checkers serve unit tests, process tests and the simulator).
//!
//! A delivery log (`member-<id>.jsonl`, see [`crate::delivery_log`]) holds,
//! in the member's order, two kinds of lines: deliveries ([`LogEntry`]) and
//! view installations ([`ViewEntry`]). Member ids are stable across views;
//! in each view `seq` and each sender's `index` restart at 0.
//!
//! Per-message properties (all keyed by view: a `(sender, index)` names a
//! message only within one view):
//!
//! - [`no_duplication`]: no member delivers a `(view, sender, index)` twice;
//! - [`fifo`]: each member delivers each sender's messages of a view in send order;
//! - [`total_order`]: per view, members agree on one delivery order (each
//!   member's sequence in the view is a prefix of the longest), `seq` grows
//!   within a view, and a member's views never go back;
//! - [`integrity`]: every member delivered the same bytes for a `(view, sender, index)`;
//! - [`no_gaps`]: every member delivered every message each sender sent
//!   (only meaningful when the membership never changed).
//!
//! View properties (need the view lines, [`ViewLogs`]):
//!
//! - [`view_chain`]: views strictly increase per member, one membership per
//!   view id (no split brain), a member installs only views that list it,
//!   and each view keeps a majority of the previous one;
//! - [`sending_view`]: a message is delivered in the view it was sent in,
//!   which is the view the member installed last, by a member of that view;
//! - [`no_loss`]: what any surviving member delivered in a view, every
//!   surviving member of that view delivered in it;
//! - [`virtual_synchrony`]: the members that moved on from a view delivered
//!   the same set of messages in it.
//!
//! [`online`] checks the same properties one delivery (or one view
//! installation) at a time, for the simulator.

pub mod fifo;
pub mod integrity;
pub mod no_duplication;
pub mod no_gaps;
pub mod no_loss;
pub mod online;
pub mod sending_view;
pub mod simulation;
pub mod total_order;
pub mod view_chain;
pub mod virtual_synchrony;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

/// One delivery line of a delivery log.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct LogEntry {
    pub member: usize,
    pub view: u64,
    pub sender: usize,
    pub index: u64,
    pub seq: u64,
    pub len: u64,
    pub xxh3: String,
}

/// Every member's deliveries, in delivery order, by member id.
pub type Logs = BTreeMap<usize, Vec<LogEntry>>;

/// One view line of a delivery log: `member` installed `view`, whose
/// members are `members` (ids, ascending).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ViewEntry {
    pub member: usize,
    pub view: u64,
    pub members: Vec<usize>,
}

/// Every member's view installations, in log order, by member id.
pub type ViewLogs = BTreeMap<usize, Vec<ViewEntry>>;

/// One line of a delivery log, either kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogLine {
    Delivery(LogEntry),
    View(ViewEntry),
}

/// Every member's log lines, both kinds interleaved as written, by member id.
pub type MemberLines = BTreeMap<usize, Vec<LogLine>>;

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

/// Either kind of line, before telling which.
#[derive(Deserialize)]
struct RawLine {
    member: usize,
    view: u64,
    members: Option<Vec<usize>>,
    sender: Option<usize>,
    index: Option<u64>,
    seq: Option<u64>,
    len: Option<u64>,
    xxh3: Option<String>,
}

fn parse_line(line: &str) -> Result<LogLine, String> {
    let raw: RawLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
    match raw {
        RawLine {
            member,
            view,
            members: Some(members),
            sender: None,
            index: None,
            seq: None,
            len: None,
            xxh3: None,
        } => Ok(LogLine::View(ViewEntry { member, view, members })),
        RawLine {
            member,
            view,
            members: None,
            sender: Some(sender),
            index: Some(index),
            seq: Some(seq),
            len: Some(len),
            xxh3: Some(xxh3),
        } => Ok(LogLine::Delivery(LogEntry {
            member,
            view,
            sender,
            index,
            seq,
            len,
            xxh3,
        })),
        _ => Err("neither a delivery line (sender, index, seq, len, xxh3) nor a view line (members)".into()),
    }
}

/// Read every `member-*.jsonl` in `dir`, both kinds of lines, interleaved
/// as written.
pub fn read_lines(dir: &Path) -> Result<MemberLines, String> {
    let mut all = MemberLines::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rank) = name.strip_prefix("member-").and_then(|n| n.strip_suffix(".jsonl")) else {
            continue;
        };
        let rank: usize = rank.parse().map_err(|_| format!("bad log file name {name}"))?;
        let mut text = std::fs::read_to_string(entry.path()).map_err(|e| format!("read {name}: {e}"))?;
        // A member killed while writing leaves a torn last line: every
        // complete line ends with a newline.
        if !text.ends_with('\n') {
            let keep = text.rfind('\n').map_or(0, |i| i + 1);
            text.truncate(keep);
        }
        let mut lines = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let parsed = parse_line(line).map_err(|e| format!("{name} line {}: {e}", n + 1))?;
            let member = match &parsed {
                LogLine::Delivery(e) => e.member,
                LogLine::View(v) => v.member,
            };
            if member != rank {
                return Err(format!(
                    "{name} line {}: member {member} in the log of member {rank}",
                    n + 1
                ));
            }
            lines.push(parsed);
        }
        all.insert(rank, lines);
    }
    if all.is_empty() {
        return Err(format!("no member-*.jsonl logs in {}", dir.display()));
    }
    Ok(all)
}

/// Split interleaved lines into deliveries and view installations (every
/// member of `lines` gets an entry in both, possibly empty).
pub fn split_lines(lines: &MemberLines) -> (Logs, ViewLogs) {
    let mut logs = Logs::new();
    let mut views = ViewLogs::new();
    for (member, member_lines) in lines {
        let (mut d, mut v) = (Vec::new(), Vec::new());
        for line in member_lines {
            match line {
                LogLine::Delivery(e) => d.push(e.clone()),
                LogLine::View(e) => v.push(e.clone()),
            }
        }
        logs.insert(*member, d);
        views.insert(*member, v);
    }
    (logs, views)
}

/// Read every `member-*.jsonl` in `dir`: deliveries and view lines apart
/// (every member gets an entry in both, possibly empty).
pub fn read_all(dir: &Path) -> Result<(Logs, ViewLogs), String> {
    Ok(split_lines(&read_lines(dir)?))
}

/// Read every `member-*.jsonl` in `dir`: the deliveries only (view lines
/// are skipped).
pub fn read_logs(dir: &Path) -> Result<Logs, String> {
    Ok(read_all(dir)?.0)
}

/// Every view id named by a view line, with its membership as the first
/// member (lowest id) that installed it lists it. [`view_chain`] checks
/// that every member lists the same.
pub fn known_views(views: &ViewLogs) -> BTreeMap<u64, (usize, &[usize])> {
    let mut known: BTreeMap<u64, (usize, &[usize])> = BTreeMap::new();
    for (member, entries) in views {
        for v in entries {
            known.entry(v.view).or_insert((*member, v.members.as_slice()));
        }
    }
    known
}

/// The last view each member installed (members without view lines are
/// absent).
pub(crate) fn last_installed(views: &ViewLogs) -> BTreeMap<usize, u64> {
    views
        .iter()
        .filter_map(|(m, v)| v.iter().map(|e| e.view).max().map(|last| (*m, last)))
        .collect()
}

/// Whether the logs show more than one view: two view ids among the view
/// lines or among the deliveries, or two memberships for one view id.
/// When they do, [`no_gaps`] does not apply (messages sent in a view that
/// ended may never be delivered: the ragged edge trims them).
pub fn membership_changed(logs: &Logs, views: &ViewLogs) -> bool {
    let mut ids: BTreeSet<u64> = BTreeSet::new();
    let mut memberships: BTreeSet<&[usize]> = BTreeSet::new();
    for v in views.values().flatten() {
        ids.insert(v.view);
        memberships.insert(v.members.as_slice());
    }
    ids.extend(logs.values().flatten().map(|e| e.view));
    ids.len() > 1 || memberships.len() > 1
}

/// Run every checker that needs the view lines and holds in every
/// delivery mode: [`view_chain`], [`no_duplication`], [`fifo`],
/// [`integrity`], [`sending_view`], [`no_loss`], [`virtual_synchrony`].
/// Total order holds only in ordered mode: [`check_all_views`] adds it.
///
/// Two members that moved on from a view with different sets of messages
/// break both [`no_loss`] and [`virtual_synchrony`]; here the first to
/// run, [`no_loss`], names it (the member that lacks a message).
pub fn check_views(logs: &Logs, views: &ViewLogs) -> Result<(), Violation> {
    view_chain::check(views)?;
    no_duplication::check(logs)?;
    fifo::check(logs)?;
    integrity::check(logs)?;
    sending_view::check(logs, views)?;
    no_loss::check(logs, views)?;
    virtual_synchrony::check(logs, views)?;
    Ok(())
}

/// [`check_views`] on interleaved lines, with the exact form of
/// [`sending_view`] (each delivery in the view installed just before it).
pub fn check_lines(lines: &MemberLines) -> Result<(), Violation> {
    sending_view::check_lines(lines)?;
    let (logs, views) = split_lines(lines);
    check_views(&logs, &views)
}

/// Run every checker on logs without view lines (as [`check_all_views`]
/// with no view lines). `expected_per_sender`: how many messages each
/// sender id sent (for [`no_gaps`], which applies only when every delivery
/// carries the same view id); `ordered`: whether total order applies.
pub fn check_all(logs: &Logs, expected_per_sender: &BTreeMap<usize, u64>, ordered: bool) -> Result<(), Violation> {
    check_all_views(logs, &ViewLogs::new(), expected_per_sender, ordered)
}

/// Run every checker: [`no_duplication`], [`fifo`], [`integrity`],
/// [`total_order`] when `ordered`, the view checkers of [`check_views`],
/// and [`no_gaps`] with `expected_per_sender` only when the logs show no
/// membership change ([`membership_changed`]): after a view change,
/// messages of the old view beyond the ragged edge are never delivered, so
/// counts per sender say nothing; [`no_loss`] and [`virtual_synchrony`]
/// take over. A static run (view 0, with or without view lines) is checked
/// exactly as before views existed.
pub fn check_all_views(
    logs: &Logs,
    views: &ViewLogs,
    expected_per_sender: &BTreeMap<usize, u64>,
    ordered: bool,
) -> Result<(), Violation> {
    no_duplication::check(logs)?;
    fifo::check(logs)?;
    integrity::check(logs)?;
    if ordered {
        total_order::check(logs)?;
    }
    check_views(logs, views)?;
    if !membership_changed(logs, views) {
        no_gaps::check(logs, expected_per_sender)?;
    }
    Ok(())
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
        let logs = build(
            &views,
            &[
                (0, &[(0, 5), (1, 3), (2, 2), (3, 2)]),
                (1, &[(0, 5), (1, 3), (2, 2), (3, 3)]),
                (2, &[(0, 5), (1, 3)]),
                (3, &[(0, 2)]),
                (4, &[(3, 2)]),
            ],
        );
        (views, logs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_of_lines_parse() {
        let d = r#"{"member":1,"view":2,"sender":0,"index":3,"seq":9,"len":4,"xxh3":"00000000000000ab"}"#;
        let v = r#"{"member":1,"view":2,"members":[0,1,4]}"#;
        assert_eq!(parse_line(d).unwrap(), LogLine::Delivery(ventry_with(1, 2, 0, 3, 9)));
        assert_eq!(
            parse_line(v).unwrap(),
            LogLine::View(ViewEntry {
                member: 1,
                view: 2,
                members: vec![0, 1, 4]
            })
        );
        assert!(parse_line(r#"{"member":1,"view":2}"#).is_err());
        assert!(parse_line(r#"{"member":1,"view":2,"members":[0],"sender":0}"#).is_err());
    }

    fn ventry_with(member: usize, view: u64, sender: usize, index: u64, seq: u64) -> LogEntry {
        LogEntry {
            member,
            view,
            sender,
            index,
            seq,
            len: 4,
            xxh3: "00000000000000ab".into(),
        }
    }

    #[test]
    fn read_all_splits_and_read_logs_skips_view_lines() {
        let dir = std::env::temp_dir().join(format!("spindle-invariants-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = concat!(
            r#"{"member":0,"view":0,"members":[0,1]}"#,
            "\n",
            r#"{"member":0,"view":0,"sender":1,"index":0,"seq":1,"len":4,"xxh3":"00000000000000ab"}"#,
            "\n",
            r#"{"member":0,"view":1,"members":[0]}"#,
            "\n",
        );
        std::fs::write(dir.join("member-0.jsonl"), text).unwrap();
        std::fs::write(dir.join("other.txt"), "ignored").unwrap();
        let (logs, views) = read_all(&dir).unwrap();
        assert_eq!(logs[&0].len(), 1);
        assert_eq!(views[&0].iter().map(|v| v.view).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(read_logs(&dir).unwrap(), logs);
        assert_eq!(read_lines(&dir).unwrap()[&0].len(), 3);
        std::fs::write(
            dir.join("member-1.jsonl"),
            concat!(r#"{"member":0,"view":0,"members":[0,1]}"#, "\n"),
        )
        .unwrap();
        // A torn last line (a member killed while writing) is dropped.
        std::fs::write(dir.join("member-2.jsonl"), r#"{"member":2,"view":0,"mem"#).unwrap();
        assert!(read_lines(&dir.join("none")).unwrap_err().contains("read"));
        assert!(read_all(&dir).unwrap_err().contains("in the log of member 1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_healthy_multi_view_run_passes_everything() {
        let (views, (logs, view_logs)) = scenario::healthy();
        assert!(membership_changed(&logs, &view_logs));
        check_views(&logs, &view_logs).unwrap();
        // no_gaps is skipped: the expected counts are wrong on purpose.
        check_all_views(&logs, &view_logs, &BTreeMap::from([(0, 1000)]), true).unwrap();
        let lives: &[(usize, &[(u64, usize)])] = &[(0, &[(0, 5), (1, 3)]), (2, &[(0, 5), (1, 3)])];
        check_lines(&scenario::build_lines(&views, lives)).unwrap();
    }

    #[test]
    fn a_static_run_keeps_no_gaps() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 0, 0, 0), entry(1, 1, 0, 1)]),
        ]);
        let expected = BTreeMap::from([(0, 1), (1, 1)]);
        check_all(&logs, &expected, true).unwrap();
        let views = ViewLogs::from([
            (
                0,
                vec![ViewEntry {
                    member: 0,
                    view: 0,
                    members: vec![0, 1],
                }],
            ),
            (
                1,
                vec![ViewEntry {
                    member: 1,
                    view: 0,
                    members: vec![0, 1],
                }],
            ),
        ]);
        assert!(!membership_changed(&logs, &views));
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
                    l.get_mut(&0).unwrap().remove(9);
                },
                "no loss",
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
