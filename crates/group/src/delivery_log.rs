//! The delivery log of one member, `<dir>/member-<id>.jsonl`: one JSON line
//! per event, in the order the member saw them. Two kinds of lines:
//!
//! ```text
//! {"member":0,"view":0,"members":[0,1,2]}
//! {"member":0,"view":0,"sender":1,"index":7,"seq":15,"len":32,"xxh3":"9c3e…"}
//! ```
//!
//! - **view** (`members`): the member installed `view`, whose members are
//!   `members` (ids, ascending). A log that has view lines starts with the
//!   view the member starts in (view 0, or the view it joined); each later
//!   one follows the last delivery of the previous view. Logs written
//!   before views existed have none (one view, 0).
//! - **delivery**: one delivered message, nulls excluded. `view` is the view
//!   it was sent and delivered in; `index` counts the sender's messages in
//!   that view and `seq` is the position in that view's total order
//!   (`index × senders of the view + position of the sender`): both restart
//!   at 0 in each view and skip the values of nulls. `xxh3` is the lowercase
//!   hex of the payload's xxh3-64.
//!
//! - **null run** (`null_from`, `null_to`): the indices `null_from..=null_to`
//!   of `sender` in `view` were nulls, passed in the total order (see
//!   [`crate::Upcalls::null_passed`]). A run is written when it ends: at the
//!   sender's next delivery, at the next view line, or at a flush. With
//!   these lines every index of every sender is accounted for, so a reader
//!   can prove a log has no gaps ([`crate::invariants::index_gaps`]):
//!
//! ```text
//! {"member":0,"view":0,"sender":2,"null_from":8,"null_to":11}
//! ```
//!
//! The writer buffers up to 1 MiB; a driver that wants a bound on what a
//! crash loses calls [`DeliveryLog::flush_if_due`] from its loop (`spindle
//! run` and the bench: every 100 ms) and [`DeliveryLog::flush`] at every
//! view change.
//!
//! Member ids are stable across views. The checkers in
//! [`crate::invariants`] read these files ([`crate::invariants::read_all`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::core::Delivery;

/// A null run not yet written: (view, first index, last index).
type NullRun = Option<(u64, u64, u64)>;

/// Appends delivery, view and null-run lines for one member to
/// `<dir>/member-<rank>.jsonl`.
pub struct DeliveryLog {
    member: usize,
    out: BufWriter<File>,
    path: PathBuf,
    /// Per sender rank, the null run being coalesced.
    null_runs: [NullRun; spindle_fabric::MEMBERS_MAX],
    /// When the buffer was last written out (the driver's clock, ns).
    flushed_ns: u64,
}

/// How often [`DeliveryLog::flush_if_due`] writes the buffer out: what a
/// crash can lose at most.
pub const FLUSH_INTERVAL_NS: u64 = 100_000_000;

impl DeliveryLog {
    pub fn create(dir: &Path, member: usize) -> std::io::Result<DeliveryLog> {
        std::fs::create_dir_all(dir)?;
        let path = Self::path_for(dir, member);
        let out = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        Ok(DeliveryLog {
            member,
            out,
            path,
            null_runs: [None; spindle_fabric::MEMBERS_MAX],
            flushed_ns: 0,
        })
    }

    pub fn path_for(dir: &Path, member: usize) -> PathBuf {
        dir.join(format!("member-{member}.jsonl"))
    }

    /// Record one delivery (formats into the buffer: no allocation).
    pub fn record(&mut self, d: &Delivery<'_>) -> std::io::Result<()> {
        let hash = xxhash_rust::xxh3::xxh3_64(d.payload);
        self.record_hashed(d.view, d.sender_rank, d.index, d.seq, d.payload.len() as u64, hash)
    }

    /// [`DeliveryLog::record`] of a message whose bytes were hashed
    /// elsewhere (`xxh3` of all `len` of them: a large message taken in
    /// place, fragment by fragment).
    pub fn record_hashed(
        &mut self,
        view: u64,
        sender_rank: usize,
        index: u64,
        seq: u64,
        len: u64,
        xxh3: u64,
    ) -> std::io::Result<()> {
        if self.null_runs[sender_rank].is_some() {
            self.write_null_run(sender_rank)?;
        }
        writeln!(
            self.out,
            "{{\"member\":{},\"view\":{view},\"sender\":{sender_rank},\"index\":{index},\"seq\":{seq},\"len\":{len},\"xxh3\":\"{xxh3:016x}\"}}",
            self.member,
        )
    }

    /// Record that this member installed `view` with `members` (ids,
    /// ascending), before any delivery of that view (formats into the
    /// buffer: no allocation).
    pub fn record_view(&mut self, view: u64, members: &[usize]) -> std::io::Result<()> {
        self.write_null_runs()?;
        write!(self.out, "{{\"member\":{},\"view\":{view},\"members\":[", self.member)?;
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                self.out.write_all(b",")?;
            }
            write!(self.out, "{m}")?;
        }
        self.out.write_all(b"]}\n")
    }

    /// Record that this member left the group on request at the end of
    /// `view` (replayed, it tells the checkers the leave was agreed to).
    pub fn record_left(&mut self, view: u64) -> std::io::Result<()> {
        self.write_null_runs()?;
        writeln!(self.out, "{{\"member\":{},\"view\":{view},\"left\":true}}", self.member)
    }

    /// Record that index `index` of `sender_rank` in `view` was a null
    /// (coalesced into runs: consecutive nulls of a sender make one line).
    pub fn record_null(&mut self, view: u64, sender_rank: usize, index: u64) -> std::io::Result<()> {
        match &mut self.null_runs[sender_rank] {
            Some((v, _, last)) if *v == view && *last + 1 == index => {
                *last = index;
                return Ok(());
            }
            Some(_) => self.write_null_run(sender_rank)?,
            None => {}
        }
        self.null_runs[sender_rank] = Some((view, index, index));
        Ok(())
    }

    fn write_null_run(&mut self, sender_rank: usize) -> std::io::Result<()> {
        let Some((view, from, to)) = self.null_runs[sender_rank].take() else {
            return Ok(());
        };
        debug_assert!(from <= to, "no gaps: null run {from}..={to} is empty");
        writeln!(
            self.out,
            "{{\"member\":{},\"view\":{view},\"sender\":{sender_rank},\"null_from\":{from},\"null_to\":{to}}}",
            self.member
        )
    }

    fn write_null_runs(&mut self) -> std::io::Result<()> {
        for sender_rank in 0..self.null_runs.len() {
            self.write_null_run(sender_rank)?;
        }
        Ok(())
    }

    /// Write everything recorded so far (null runs included) to the file.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.write_null_runs()?;
        self.out.flush()
    }

    /// [`DeliveryLog::flush`] when the last one is at least
    /// [`FLUSH_INTERVAL_NS`] before `now_ns` (the driver's monotonic
    /// clock). Returns whether it flushed.
    pub fn flush_if_due(&mut self, now_ns: u64) -> std::io::Result<bool> {
        if now_ns.saturating_sub(self.flushed_ns) < FLUSH_INTERVAL_NS {
            return Ok(false);
        }
        self.flushed_ns = now_ns;
        self.flush()?;
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::{read_all, ViewEntry};

    #[test]
    fn view_lines_read_back() {
        let dir = std::env::temp_dir().join(format!("spindle-delivery-log-{}", std::process::id()));
        let mut log = DeliveryLog::create(&dir, 2).unwrap();
        log.record_view(0, &[0, 1, 2]).unwrap();
        log.record_view(1, &[2]).unwrap();
        log.record_view(2, &[]).unwrap();
        log.flush().unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert!(
            text.starts_with("{\"member\":2,\"view\":0,\"members\":[0,1,2]}\n"),
            "{text}"
        );
        let (logs, views) = read_all(&dir).unwrap();
        assert!(logs[&2].is_empty());
        let want = |view, members: &[usize]| ViewEntry {
            member: 2,
            view,
            members: members.to_vec(),
        };
        assert_eq!(views[&2], vec![want(0, &[0, 1, 2]), want(1, &[2]), want(2, &[])]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
