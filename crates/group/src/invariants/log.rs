//! The delivery log format: what a member's `member-<id>.jsonl` holds
//! (written by [`crate::delivery_log`]) and how it is read back.
//!
//! Two kinds of lines, in the member's order: deliveries ([`LogEntry`])
//! and view installations ([`ViewEntry`]). Member ids are stable across
//! views; in each view `seq` and each sender's `index` restart at 0.

use std::collections::BTreeMap;
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

/// One line of a delivery log, either kind, or the member's leave: a
/// `{"member":m,"view":v,"left":true}` line says that `m` left the group
/// on request at the end of view `v` (it agreed to the view without it,
/// which the majority rule of [`super::view_chain`] counts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogLine {
    Delivery(LogEntry),
    View(ViewEntry),
    Left { member: usize, view: u64 },
}

impl LogLine {
    /// The member whose log holds the line.
    pub fn member(&self) -> usize {
        match self {
            LogLine::Delivery(e) => e.member,
            LogLine::View(v) => v.member,
            LogLine::Left { member, .. } => *member,
        }
    }

    /// The view the line is about: the one delivered in, or installed.
    pub fn view(&self) -> u64 {
        match self {
            LogLine::Delivery(e) => e.view,
            LogLine::View(v) => v.view,
            LogLine::Left { view, .. } => *view,
        }
    }
}

/// Every member's log lines, both kinds interleaved as written, by member id.
pub type MemberLines = BTreeMap<usize, Vec<LogLine>>;

/// One null-run line of a delivery log: indices `null_from..=null_to` of
/// `sender` in `view` were nulls, passed in the total order.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct NullRunEntry {
    pub member: usize,
    pub view: u64,
    pub sender: usize,
    pub null_from: u64,
    pub null_to: u64,
}

/// Every member's null runs, in log order, by member id.
pub type NullRuns = BTreeMap<usize, Vec<NullRunEntry>>;

/// Any kind of line, before telling which.
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
    null_from: Option<u64>,
    null_to: Option<u64>,
    left: Option<bool>,
}

/// A line: a delivery or a view line (`Ok(Ok)`), or a null run (`Ok(Err)`).
fn parse_any(line: &str) -> Result<Result<LogLine, NullRunEntry>, String> {
    let raw: RawLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
    match raw {
        RawLine {
            member,
            view,
            members: None,
            sender: Some(sender),
            index: None,
            seq: None,
            len: None,
            xxh3: None,
            null_from: Some(null_from),
            null_to: Some(null_to),
            left: None,
        } if null_from <= null_to => Ok(Err(NullRunEntry {
            member,
            view,
            sender,
            null_from,
            null_to,
        })),
        RawLine {
            member,
            view,
            members: None,
            sender: None,
            index: None,
            seq: None,
            len: None,
            xxh3: None,
            null_from: None,
            null_to: None,
            left: Some(true),
        } => Ok(Ok(LogLine::Left { member, view })),
        RawLine {
            null_from: None,
            null_to: None,
            left: None,
            ..
        } => parse_line(raw).map(Ok),
        _ => Err(
            "a null-run line needs sender, null_from <= null_to and nothing else; a leave line only left: true".into(),
        ),
    }
}

fn parse_line(raw: RawLine) -> Result<LogLine, String> {
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
            ..
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
            ..
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

/// Read every `member-*.jsonl` in `dir`: delivery and view lines,
/// interleaved as written (null-run lines are left out: see
/// [`read_lines_and_nulls`]).
pub fn read_lines(dir: &Path) -> Result<MemberLines, String> {
    Ok(read_lines_and_nulls(dir)?.0)
}

/// Read every `member-*.jsonl` in `dir`: delivery and view lines,
/// interleaved as written, and the null runs apart.
pub fn read_lines_and_nulls(dir: &Path) -> Result<(MemberLines, NullRuns), String> {
    let mut all = MemberLines::new();
    let mut all_nulls = NullRuns::new();
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
        let mut nulls = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let parsed = parse_any(line).map_err(|e| format!("{name} line {}: {e}", n + 1))?;
            let member = match &parsed {
                Ok(l) => l.member(),
                Err(run) => run.member,
            };
            if member != rank {
                return Err(format!(
                    "{name} line {}: member {member} in the log of member {rank}",
                    n + 1
                ));
            }
            match parsed {
                Ok(l) => lines.push(l),
                Err(run) => nulls.push(run),
            }
        }
        all.insert(rank, lines);
        all_nulls.insert(rank, nulls);
    }
    if all.is_empty() {
        return Err(format!("no member-*.jsonl logs in {}", dir.display()));
    }
    Ok((all, all_nulls))
}

/// No gaps, from a log alone (ordered delivery): in every view, the
/// indices of each sender that a member delivered or passed as nulls are
/// exactly `0..n` for some `n`, each once. A member's log written with
/// null-run lines ([`crate::delivery_log`]) proves it this way without
/// knowing what was sent; a crash only shortens the prefix.
pub fn index_gaps(lines: &MemberLines, nulls: &NullRuns) -> Result<(), String> {
    // (member, view, sender) -> index intervals, inclusive.
    let mut spans: BTreeMap<(usize, u64, usize), Vec<(u64, u64)>> = BTreeMap::new();
    for member_lines in lines.values() {
        for line in member_lines {
            if let LogLine::Delivery(e) = line {
                spans
                    .entry((e.member, e.view, e.sender))
                    .or_default()
                    .push((e.index, e.index));
            }
        }
    }
    for run in nulls.values().flatten() {
        spans
            .entry((run.member, run.view, run.sender))
            .or_default()
            .push((run.null_from, run.null_to));
    }
    for ((member, view, sender), mut list) in spans {
        list.sort_unstable();
        let mut next = 0u64;
        for (from, to) in list {
            if from > next {
                return Err(format!(
                    "no gaps: member {member}, view {view}: sender {sender}'s indices {next}..{from} were neither delivered nor nulls"
                ));
            }
            if from < next {
                return Err(format!(
                    "no duplication: member {member}, view {view}: sender {sender}'s index {from} accounted for twice"
                ));
            }
            next = to + 1;
        }
    }
    Ok(())
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
                LogLine::Left { .. } => {}
            }
        }
        logs.insert(*member, d);
        views.insert(*member, v);
    }
    (logs, views)
}

/// The inverse of [`split_lines`] where the interleaving was lost: each
/// member's view lines go in just before its first delivery of a later
/// or equal view (the most lenient interleaving: every delivery follows
/// the installation of its view whenever the split logs allow it).
pub fn interleave(logs: &Logs, views: &ViewLogs) -> MemberLines {
    let mut lines = MemberLines::new();
    for member in logs.keys().chain(views.keys()) {
        if lines.contains_key(member) {
            continue;
        }
        let deliveries = logs.get(member).map_or(&[][..], |d| d.as_slice());
        let mut pending = views.get(member).map_or(&[][..], |v| v.as_slice()).iter().peekable();
        let mut out = Vec::with_capacity(deliveries.len());
        for e in deliveries {
            while let Some(v) = pending.next_if(|v| v.view <= e.view) {
                out.push(LogLine::View(v.clone()));
            }
            out.push(LogLine::Delivery(e.clone()));
        }
        out.extend(pending.cloned().map(LogLine::View));
        lines.insert(*member, out);
    }
    lines
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_of_lines_parse() {
        let d = r#"{"member":1,"view":2,"sender":0,"index":3,"seq":9,"len":4,"xxh3":"00000000000000ab"}"#;
        let v = r#"{"member":1,"view":2,"members":[0,1,4]}"#;
        assert_eq!(parse_any(d).unwrap(), Ok(LogLine::Delivery(ventry_with(1, 2, 0, 3, 9))));
        assert_eq!(
            parse_any(v).unwrap().unwrap(),
            LogLine::View(ViewEntry {
                member: 1,
                view: 2,
                members: vec![0, 1, 4]
            })
        );
        assert!(parse_any(r#"{"member":1,"view":2}"#).is_err());
        assert!(parse_any(r#"{"member":1,"view":2,"members":[0],"sender":0}"#).is_err());
        let n = r#"{"member":1,"view":2,"sender":0,"null_from":4,"null_to":6}"#;
        let run = NullRunEntry {
            member: 1,
            view: 2,
            sender: 0,
            null_from: 4,
            null_to: 6,
        };
        assert_eq!(parse_any(n).unwrap(), Err(run));
        assert!(parse_any(r#"{"member":1,"view":2,"sender":0,"null_from":6,"null_to":4}"#).is_err());
        let left = parse_any(r#"{"member":1,"view":2,"left":true}"#).unwrap();
        assert_eq!(left, Ok(LogLine::Left { member: 1, view: 2 }));
        assert!(parse_any(r#"{"member":1,"view":2,"left":true,"members":[1]}"#).is_err());
        assert!(parse_any(r#"{"member":1,"view":2,"sender":0,"index":3,"null_from":4,"null_to":6}"#).is_err());
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
    fn index_gaps_accounts_for_every_index_with_the_null_runs() {
        let member_lines = |indices: &[u64]| {
            let mut lines = MemberLines::new();
            lines.insert(
                0,
                indices
                    .iter()
                    .map(|i| LogLine::Delivery(ventry_with(0, 1, 2, *i, *i)))
                    .collect(),
            );
            lines
        };
        let nulls = |runs: &[(u64, u64)]| {
            let mut all = NullRuns::new();
            all.insert(
                0,
                runs.iter()
                    .map(|(f, t)| NullRunEntry {
                        member: 0,
                        view: 1,
                        sender: 2,
                        null_from: *f,
                        null_to: *t,
                    })
                    .collect(),
            );
            all
        };
        assert_eq!(index_gaps(&member_lines(&[0, 1, 5]), &nulls(&[(2, 4)])), Ok(()));
        assert_eq!(index_gaps(&member_lines(&[0, 1, 2]), &nulls(&[])), Ok(()));
        let gap = index_gaps(&member_lines(&[0, 1, 5]), &nulls(&[(2, 3)])).unwrap_err();
        assert!(gap.contains("no gaps") && gap.contains("4..5"), "{gap}");
        let dup = index_gaps(&member_lines(&[0, 1, 3]), &nulls(&[(2, 3)])).unwrap_err();
        assert!(dup.contains("no duplication"), "{dup}");
        let late = index_gaps(&member_lines(&[1]), &nulls(&[])).unwrap_err();
        assert!(late.contains("0..1"), "{late}");
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
}
