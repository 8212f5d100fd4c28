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
//! Member ids are stable across views. The checkers in
//! [`crate::invariants`] read these files ([`crate::invariants::read_all`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::core::Delivery;

/// Appends delivery and view lines for one member to `<dir>/member-<rank>.jsonl`.
pub struct DeliveryLog {
    member: usize,
    out: BufWriter<File>,
    path: PathBuf,
}

impl DeliveryLog {
    pub fn create(dir: &Path, member: usize) -> std::io::Result<DeliveryLog> {
        std::fs::create_dir_all(dir)?;
        let path = Self::path_for(dir, member);
        let out = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        Ok(DeliveryLog { member, out, path })
    }

    pub fn path_for(dir: &Path, member: usize) -> PathBuf {
        dir.join(format!("member-{member}.jsonl"))
    }

    /// Record one delivery (formats into the buffer: no allocation).
    pub fn record(&mut self, d: &Delivery<'_>) -> std::io::Result<()> {
        let hash = xxhash_rust::xxh3::xxh3_64(d.payload);
        writeln!(
            self.out,
            "{{\"member\":{},\"view\":{},\"sender\":{},\"index\":{},\"seq\":{},\"len\":{},\"xxh3\":\"{:016x}\"}}",
            self.member,
            d.view,
            d.sender_rank,
            d.index,
            d.seq,
            d.payload.len(),
            hash
        )
    }

    /// Record that this member installed `view` with `members` (ids,
    /// ascending), before any delivery of that view (formats into the
    /// buffer: no allocation).
    pub fn record_view(&mut self, view: u64, members: &[usize]) -> std::io::Result<()> {
        write!(self.out, "{{\"member\":{},\"view\":{view},\"members\":[", self.member)?;
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                self.out.write_all(b",")?;
            }
            write!(self.out, "{m}")?;
        }
        self.out.write_all(b"]}\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
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
