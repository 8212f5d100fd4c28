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

/// One line of a delivery log, either kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogLine {
    Delivery(LogEntry),
    View(ViewEntry),
}

impl LogLine {
    /// The member whose log holds the line.
    pub fn member(&self) -> usize {
        match self {
            LogLine::Delivery(e) => e.member,
            LogLine::View(v) => v.member,
        }
    }

    /// The view the line is about: the one delivered in, or installed.
    pub fn view(&self) -> u64 {
        match self {
            LogLine::Delivery(e) => e.view,
            LogLine::View(v) => v.view,
        }
    }
}

/// Every member's log lines, both kinds interleaved as written, by member id.
pub type MemberLines = BTreeMap<usize, Vec<LogLine>>;

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
            let member = parsed.member();
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
}
