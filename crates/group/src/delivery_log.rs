//! The delivery log: one JSON line per delivered message, in delivery
//! order, nulls excluded:
//!
//! ```text
//! {"member":0,"view":0,"sender":1,"index":7,"seq":15,"len":32,"xxh3":"9c3e…"}
//! ```
//!
//! `xxh3` is the lowercase hex of the payload's xxh3-64. The checkers in
//! [`crate::invariants`] read these files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::core::Delivery;

/// Appends delivery lines for one member to `<dir>/member-<rank>.jsonl`.
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

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
