//! Invariant checkers, one file per property, over delivery logs (the
//! same checkers serve unit tests, process tests and, later, the
//! simulator):
//!
//! - [`no_duplication`]: no member delivers a message twice;
//! - [`fifo`]: each member delivers each sender's messages in send order;
//! - [`total_order`]: members agree on one delivery order (each member's
//!   sequence is a prefix of the longest), and `seq` grows;
//! - [`integrity`]: every member delivered the same bytes for a message;
//! - [`no_gaps`]: every member delivered every message each sender sent.

pub mod fifo;
pub mod integrity;
pub mod no_duplication;
pub mod no_gaps;
pub mod online;
pub mod simulation;
pub mod total_order;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// One line of a delivery log.
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

/// Every member's deliveries, in delivery order, by member rank.
pub type Logs = BTreeMap<usize, Vec<LogEntry>>;

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

/// Read every `member-*.jsonl` in `dir`.
pub fn read_logs(dir: &Path) -> Result<Logs, String> {
    let mut logs = Logs::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rank) = name.strip_prefix("member-").and_then(|n| n.strip_suffix(".jsonl")) else {
            continue;
        };
        let rank: usize = rank.parse().map_err(|_| format!("bad log file name {name}"))?;
        let text = std::fs::read_to_string(entry.path()).map_err(|e| format!("read {name}: {e}"))?;
        let mut lines = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let e: LogEntry = serde_json::from_str(line).map_err(|e| format!("{name} line {}: {e}", n + 1))?;
            if e.member != rank {
                return Err(format!(
                    "{name} line {}: member {} in the log of member {rank}",
                    n + 1,
                    e.member
                ));
            }
            lines.push(e);
        }
        logs.insert(rank, lines);
    }
    if logs.is_empty() {
        return Err(format!("no member-*.jsonl logs in {}", dir.display()));
    }
    Ok(logs)
}

/// Run every checker. `expected_per_sender`: how many messages each
/// sender rank sent (for [`no_gaps`]); `ordered`: whether total order applies.
pub fn check_all(logs: &Logs, expected_per_sender: &BTreeMap<usize, u64>, ordered: bool) -> Result<(), Violation> {
    no_duplication::check(logs)?;
    fifo::check(logs)?;
    integrity::check(logs)?;
    if ordered {
        total_order::check(logs)?;
    }
    no_gaps::check(logs, expected_per_sender)?;
    Ok(())
}

#[cfg(test)]
pub(crate) fn entry(member: usize, sender: usize, index: u64, seq: u64) -> LogEntry {
    LogEntry {
        member,
        view: 0,
        sender,
        index,
        seq,
        len: 8,
        xxh3: format!("{:016x}", sender as u64 * 1000 + index),
    }
}
