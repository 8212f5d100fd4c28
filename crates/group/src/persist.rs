//! The persistent delivery mode's on-disk log: one file per member,
//! appended in total order, made durable by group commit.
//!
//! ## File layout
//!
//! ```text
//!  file   ┌ LogFileHeader (16 B): magic "SPNDLOG1", version u32, rank u32
//!         └ record, record, …                       (each 8-aligned)
//!  record  +0  magic   u32  RECORD_MAGIC ("SPLR")
//!          +4  kind    u32  1: message, 2: view installed, 3: snapshot
//!          +8  view    u64  message: the view it was sent in; view record: the new view;
//!                            snapshot: the view it was taken in
//!          +16 seq     u64  message: its seq in that view; view record: the old view's final_seq;
//!                            snapshot: it holds every message of `view` below this seq
//!                            (and every message of the views before)
//!                            (view record payload: the old view u64 (JOINED for a joiner),
//!                             then the new view's members u64, bit r = rank r)
//!                            (snapshot payload: SnapshotPrefix (32 B), then the application's
//!                             snapshot bytes)
//!          +24 sender  u32  message: sender rank (bits 0-7), its index in the view's
//!                            sender list (8-15), the view's sender count (16-23); view record: 0
//!          +28 len     u32  payload bytes
//!          +32 crc     u32  CRC-32 (IEEE) of bytes +0..+32, then of the payload
//!          +36 pad     u32  0
//!          +40 payload len bytes, zero-padded to a multiple of 8
//! ```
//!
//! A message record is appended once its seq is below the member's
//! receive frontier (every seq below it received), in seq order, so a log
//! is a prefix of the view's total order, view after view. A view record
//! is appended (and synced) when the member installs a view, before it
//! delivers the old view's ragged edge: it says where the old view ended
//! (`final_seq`), so the messages of that view at or beyond it (received,
//! trimmed, sent again in the new view) are not part of the history.
//!
//! ## Group commit
//!
//! The progress thread encodes records into a staging buffer and hands the
//! pass's batch over under one lock ([`PersistLog::commit`]); a sync
//! thread writes whatever accumulated and covers it with one
//! `fdatasync`, then publishes the durable frontier and wakes the progress
//! thread. The progress thread never waits for the disk, except at a view
//! install ([`PersistLog::install_view`]), which is rare.
//!
//! ## Compaction
//!
//! A log grows with every message. [`PersistLog::compact`] replaces the
//! part the application has already applied with the application's
//! snapshot ([`crate::Upcalls::snapshot`] at a delivery position), in
//! place, copying nothing:
//!
//! ```text
//!  <log>           header | ····· hole ····· | records after the snapshot … appends
//!                                            ^ log_offset
//!  <log>.snapshot  header | snapshot record (SnapshotPrefix: position, view
//!                           history, log_offset; the application's bytes)
//! ```
//!
//! A compaction thread (beside the sync thread, which goes on appending)
//! scans record headers from where the last compaction's records began to
//! the first record after the position, writes `<log>.snapshot.tmp`,
//! syncs it, renames it to `<log>.snapshot`, syncs the directory, and
//! then punches a hole over the records before `log_offset` (the disk
//! gives their blocks back; the file keeps its length). A crash before
//! the rename leaves the old snapshot (or none) and the whole log; after
//! it, the new snapshot, whose records are all still there. Every record
//! left behind was delivered, so on every member's disk: a restart (see
//! [`crate::restart`]) restores the snapshot, then replays the records
//! after it. The simulator's log in memory keeps the snapshot record at
//! its head instead ([`compact_records`]).
//!
//! ## Recovery
//!
//! [`recover`] reads a log back. It stops at the first record that is cut
//! short (a torn tail: the process died mid-write), has a bad magic or
//! length, or fails its checksum, and says exactly where and why; what
//! follows is dropped, never guessed at. [`PersistLog::open`] moves the
//! dropped bytes aside (`<log>.dropped-<offset>`) before appending.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// First bytes of every log file.
pub const FILE_MAGIC: [u8; 8] = *b"SPNDLOG1";
/// Version of the record layout this build writes (2 added the snapshot
/// record; version 1 logs read back unchanged).
pub const FILE_VERSION: u32 = 2;
/// Oldest version this build reads.
pub const FILE_VERSION_OLDEST: u32 = 1;
/// First word of every record ("SPLR" little-endian).
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SPLR");
pub const KIND_MESSAGE: u32 = 1;
pub const KIND_VIEW: u32 = 2;
pub const KIND_SNAPSHOT: u32 = 3;
/// A view record's old view when the member joined in the new view (it
/// has no old view: its state came in a snapshot).
pub const JOINED: u64 = u64::MAX;
/// Largest payload a record may carry (a slot's payload is at most 1 MiB).
pub const RECORD_PAYLOAD_MAX: u32 = 1 << 30;
/// Bytes the progress thread may have handed over and not yet written
/// before it stops appending for a pass (back-pressure on a slow disk).
pub const PENDING_BYTES_MAX: usize = 64 << 20;

/// The file header.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogFileHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub rank: u32,
}
pub const FILE_HEADER_BYTES: usize = 16;
const _: () = assert!(std::mem::size_of::<LogFileHeader>() == FILE_HEADER_BYTES);

/// A record's header (see the module docs for the diagram).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub magic: u32,
    pub kind: u32,
    pub view: u64,
    pub seq: u64,
    pub sender: u32,
    pub len: u32,
    pub crc: u32,
    pub pad: u32,
}
pub const RECORD_HEADER_BYTES: usize = 40;
const _: () = assert!(std::mem::size_of::<RecordHeader>() == RECORD_HEADER_BYTES);
const _: () = assert!(std::mem::offset_of!(RecordHeader, kind) == 4);
const _: () = assert!(std::mem::offset_of!(RecordHeader, view) == 8);
const _: () = assert!(std::mem::offset_of!(RecordHeader, seq) == 16);
const _: () = assert!(std::mem::offset_of!(RecordHeader, sender) == 24);
const _: () = assert!(std::mem::offset_of!(RecordHeader, len) == 28);
const _: () = assert!(std::mem::offset_of!(RecordHeader, crc) == 32);
/// The checksum covers the header bytes before `crc`.
const CRC_COVERED_HEADER_BYTES: usize = 32;

/// The start of a snapshot record's payload: where the snapshot stands in
/// the view history (what a restart needs from the view records it
/// replaces) and, in a snapshot file, where the log's records after it
/// begin. The application's snapshot bytes follow.
///
/// ```text
///  +0  members     u64  the snapshot's view's members (bit r = rank r)
///  +8  prev_view   u64  the view before it (valid if flags bit 0)
///  +16 prev_final  u64  where that view ended (its final_seq)
///  +24 flags       u64  bit 0: prev_view/prev_final are set
///  +32 log_offset  u64  snapshot file: the log file offset of the first
///                       record after the snapshot (what precedes it is a
///                       hole); a record inside a log: 0
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPrefix {
    pub members: u64,
    pub prev_view: u64,
    pub prev_final: u64,
    pub flags: u64,
    pub log_offset: u64,
}
pub const SNAPSHOT_PREFIX_BYTES: usize = 40;
const _: () = assert!(std::mem::size_of::<SnapshotPrefix>() == SNAPSHOT_PREFIX_BYTES);
const _: () = assert!(std::mem::offset_of!(SnapshotPrefix, prev_view) == 8);
const _: () = assert!(std::mem::offset_of!(SnapshotPrefix, prev_final) == 16);
const _: () = assert!(std::mem::offset_of!(SnapshotPrefix, flags) == 24);
const _: () = assert!(std::mem::offset_of!(SnapshotPrefix, log_offset) == 32);
const SNAPSHOT_FLAG_PREV: u64 = 1;
/// Largest application snapshot a compaction stores (a record's payload).
pub const SNAPSHOT_STATE_BYTES_MAX: usize = RECORD_PAYLOAD_MAX as usize - SNAPSHOT_PREFIX_BYTES;

/// A snapshot record's fields (see [`SnapshotPrefix`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// The snapshot holds every message of `view` below `seq`, and every
    /// message of the views before.
    pub view: u64,
    pub seq: u64,
    pub members: u64,
    /// The view before `view` and where it ended (`None` in the first
    /// view, or for a member that joined in `view`).
    pub prev: Option<(u64, u64)>,
    /// Read from a snapshot file: the log offset where the records after
    /// it begin (0 for a snapshot record inside a log).
    pub log_offset: u64,
    /// The application's snapshot in [`RecoveredLog::bytes`].
    pub state: std::ops::Range<usize>,
}

/// Append a snapshot record to `out` (see [`SnapshotPrefix`]).
pub fn encode_snapshot_record(
    out: &mut Vec<u8>,
    (view, seq): (u64, u64),
    members: u64,
    prev: Option<(u64, u64)>,
    log_offset: u64,
    state: &[u8],
) -> Result<(), String> {
    if state.len() > SNAPSHOT_STATE_BYTES_MAX {
        return Err(format!(
            "log compaction: the application's snapshot is {} bytes, more than a log record holds ({SNAPSHOT_STATE_BYTES_MAX})",
            state.len()
        ));
    }
    let (prev_view, prev_final) = prev.unwrap_or((0, 0));
    let flags = if prev.is_some() { SNAPSHOT_FLAG_PREV } else { 0 };
    let mut payload = Vec::with_capacity(SNAPSHOT_PREFIX_BYTES + state.len());
    for w in [members, prev_view, prev_final, flags, log_offset] {
        payload.extend_from_slice(&w.to_le_bytes());
    }
    payload.extend_from_slice(state);
    encode_record(out, KIND_SNAPSHOT, view, seq, 0, &payload);
    Ok(())
}

/// The records of a compacted log (no file header): `snapshot_record`,
/// then the records of `records` after position `(view, seq)`: messages
/// of `view` from `seq` on and of later views, and the view records of
/// later views (the snapshot record stands for `view`'s own, and older
/// snapshots are dropped). A bad record is an error: compaction reads
/// only what the sync thread wrote and synced.
pub fn compact_records(records: &[u8], view: u64, seq: u64, snapshot_record: &[u8]) -> Result<Vec<u8>, String> {
    let mut kept = Vec::with_capacity(snapshot_record.len());
    kept.extend_from_slice(snapshot_record);
    let mut at = 0;
    while at < records.len() {
        let r = check_record(records, at).map_err(|reason| format!("log compaction: record at +{at}: {reason}"))?;
        let next = at + record_bytes(r.payload.len());
        let after = match r.kind {
            KIND_MESSAGE => (r.view, r.seq) >= (view, seq),
            KIND_VIEW => r.view > view,
            _ => false,
        };
        if after {
            kept.extend_from_slice(&records[at..next]);
        }
        at = next;
    }
    Ok(kept)
}

/// Bytes a record with `len` payload bytes takes in the file.
pub fn record_bytes(len: usize) -> usize {
    RECORD_HEADER_BYTES + len.next_multiple_of(8)
}

/// Why persistence failed; persistent delivery stops on any of these.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("persistent log {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("persistent log {path}: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// Append `kind/view/seq/sender/payload` as one record to `out`.
pub fn encode_record(out: &mut Vec<u8>, kind: u32, view: u64, seq: u64, sender: u32, payload: &[u8]) {
    debug_assert!(payload.len() <= RECORD_PAYLOAD_MAX as usize);
    let start = out.len();
    out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&view.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&sender.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out[start..start + CRC_COVERED_HEADER_BYTES]);
    hasher.update(payload);
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(start + record_bytes(payload.len()), 0);
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// One record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredRecord {
    pub kind: u32,
    pub view: u64,
    pub seq: u64,
    pub sender: u32,
    /// The payload's byte range in [`RecoveredLog::bytes`].
    pub payload: std::ops::Range<usize>,
}

/// What [`recover`] dropped, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// File offset of the first byte not kept.
    pub offset: u64,
    /// Bytes from there to the end of the file.
    pub bytes: u64,
    /// What was wrong with the record at `offset`.
    pub reason: String,
    /// Whether a well-formed record follows somewhere after it: the damage
    /// is inside the log, not a write cut short at its end.
    pub valid_records_after: bool,
}

/// A log read back: its records, in file order, up to the first bad one.
#[derive(Debug)]
pub struct RecoveredLog {
    pub path: PathBuf,
    pub rank: u32,
    pub records: Vec<RecoveredRecord>,
    pub bytes: Vec<u8>,
    /// Length of the valid prefix (where appends continue).
    pub valid_bytes: u64,
    pub dropped: Option<Dropped>,
}

/// A delivered-order message read back (see [`RecoveredLog::history`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryMessage<'a> {
    pub view: u64,
    pub seq: u64,
    pub sender_rank: u32,
    pub sender_index: usize,
    /// The message's index in its sender's stream (`seq / senders`).
    pub index: u64,
    /// A fragment of a large message (see [`crate::large`]).
    pub fragment: bool,
    pub payload: &'a [u8],
}

impl RecoveredLog {
    /// The messages that are part of the history, in total order: every
    /// message record except those a later view record trimmed (seq at or
    /// beyond its view's `final_seq`) and those the log's snapshot holds
    /// (before its position).
    pub fn history(&self) -> Vec<HistoryMessage<'_>> {
        let from = self.snapshot().map_or((0, 0), |s| (s.view, s.seq));
        let mut final_seq: std::collections::BTreeMap<u64, u64> = Default::default();
        for r in self.records.iter().filter(|r| r.kind == KIND_VIEW) {
            if let Some(old) = self.view_record(r).map(|v| v.old_view).filter(|v| *v != JOINED) {
                final_seq.insert(old, r.seq);
            }
        }
        self.records
            .iter()
            .filter(|r| r.kind == KIND_MESSAGE && final_seq.get(&r.view).is_none_or(|f| r.seq < *f))
            .filter(|r| (r.view, r.seq) >= from)
            .map(|r| HistoryMessage {
                view: r.view,
                seq: r.seq,
                sender_rank: SenderWord(r.sender).rank() as u32,
                sender_index: SenderWord(r.sender).sender_index(),
                index: r.seq / SenderWord(r.sender).senders().max(1) as u64,
                fragment: SenderWord(r.sender).is_fragment(),
                payload: &self.bytes[r.payload.clone()],
            })
            .collect()
    }
}

/// A message record's `sender` field: rank, index in the view's sender
/// list, and that list's length (each below 256: `MEMBERS_MAX` is 64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderWord(pub u32);

impl SenderWord {
    pub fn new(rank: usize, sender_index: usize, senders: usize) -> SenderWord {
        debug_assert!(rank < 256 && sender_index < 256 && senders < 256 && sender_index < senders);
        SenderWord(rank as u32 | (sender_index as u32) << 8 | (senders as u32) << 16)
    }
    pub fn rank(self) -> usize {
        (self.0 & 0xff) as usize
    }
    pub fn sender_index(self) -> usize {
        (self.0 >> 8 & 0xff) as usize
    }
    pub fn senders(self) -> usize {
        (self.0 >> 16 & 0xff) as usize
    }
    /// The same word for a fragment of a large message (bit 24).
    pub fn fragment(self) -> SenderWord {
        SenderWord(self.0 | SENDER_WORD_FRAGMENT)
    }
    pub fn is_fragment(self) -> bool {
        self.0 & SENDER_WORD_FRAGMENT != 0
    }
}

/// Bit of a [`SenderWord`]: the record is a fragment of a large message
/// (see [`crate::large`]).
pub const SENDER_WORD_FRAGMENT: u32 = 1 << 24;

/// A view record's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewRecord {
    pub new_view: u64,
    /// The view it followed ([`JOINED`]: the member joined in `new_view`).
    pub old_view: u64,
    /// The old view delivered exactly its messages below this seq.
    pub final_seq: u64,
    /// The new view's members (bit r = rank r).
    pub members: u64,
}

/// What a member's log says about where it stopped: what the members
/// compare at a restart after a total failure (see `Group::join`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogSummary {
    /// The last view this member installed (0: the first view).
    pub last_view: u64,
    /// Its members (the first view's: the configured initial members).
    pub last_members: u64,
    /// The view before it and where that one ended (from the log's last
    /// view record; `None` in the first view).
    pub prev: Option<(u64, u64)>,
    /// Every message of `last_view` below this seq is in the log (the
    /// last message record's seq + 1; nulls have no record).
    pub frontier: u64,
    /// The member joined a running group: its log has no history before.
    pub joined: bool,
    /// Records in the log.
    pub records: u64,
}

impl RecoveredLog {
    /// A view record's fields (`None` for a message record, or a view
    /// record of an older layout).
    pub fn view_record(&self, r: &RecoveredRecord) -> Option<ViewRecord> {
        let b = self.bytes.get(r.payload.clone())?;
        (r.kind == KIND_VIEW && b.len() == 16).then(|| ViewRecord {
            new_view: r.view,
            old_view: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            final_seq: r.seq,
            members: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
        })
    }

    /// A snapshot record's fields (`None` for any other record, or one
    /// too short to hold its prefix).
    pub fn snapshot_record(&self, r: &RecoveredRecord) -> Option<SnapshotRecord> {
        let b = self.bytes.get(r.payload.clone())?;
        if r.kind != KIND_SNAPSHOT || b.len() < SNAPSHOT_PREFIX_BYTES {
            return None;
        }
        let flags = u64_at(b, 24);
        Some(SnapshotRecord {
            view: r.view,
            seq: r.seq,
            members: u64_at(b, 0),
            prev: (flags & SNAPSHOT_FLAG_PREV != 0).then(|| (u64_at(b, 8), u64_at(b, 16))),
            log_offset: u64_at(b, 32),
            state: r.payload.start + SNAPSHOT_PREFIX_BYTES..r.payload.end,
        })
    }
    /// The log's snapshot (a compacted log starts with one), if any.
    pub fn snapshot(&self) -> Option<SnapshotRecord> {
        self.records.iter().rev().find_map(|r| self.snapshot_record(r))
    }
    /// Where this log stopped; `initial_members` is the first view's
    /// membership (it has no view record).
    pub fn summary(&self, initial_members: u64) -> LogSummary {
        let mut s = LogSummary {
            last_members: initial_members,
            records: self.records.len() as u64,
            ..LogSummary::default()
        };
        for r in &self.records {
            if let Some(snap) = self.snapshot_record(r) {
                // A snapshot stands for the view records and messages it
                // replaced, and for the whole state: a member that had
                // joined now holds the history too.
                s.last_view = snap.view;
                s.last_members = snap.members;
                s.prev = snap.prev;
                s.joined = false;
                s.frontier = snap.seq;
            } else if let Some(v) = self.view_record(r) {
                s.last_view = v.new_view;
                s.last_members = v.members;
                s.prev = (v.old_view != JOINED).then_some((v.old_view, v.final_seq));
                s.joined |= v.old_view == JOINED;
                s.frontier = 0;
            } else if r.view == s.last_view {
                s.frontier = s.frontier.max(r.seq + 1);
            }
        }
        s
    }
}

/// Read the log at `path` back (see the module docs). A file shorter than
/// its header is an empty log (a crash before the header was written).
pub fn recover(path: &Path) -> Result<RecoveredLog, PersistError> {
    let io = |what: &'static str| {
        let path = path.to_path_buf();
        move |source| PersistError::Io { path, what, source }
    };
    let format = |reason: String| PersistError::Format {
        path: path.to_path_buf(),
        reason,
    };
    let snapshot = read_snapshot_file(path)?;
    let mut file = File::open(path).map_err(io("open for recovery"))?;
    let mut bytes = Vec::new();
    let Some(snapshot) = snapshot else {
        file.read_to_end(&mut bytes).map_err(io("read"))?;
        return recover_bytes(path, bytes, None);
    };
    // A compacted log: its header, then the records from the offset the
    // snapshot names (before it, a hole).
    let log_offset = u64_at(&snapshot, RECORD_HEADER_BYTES + 32);
    let len = file.metadata().map_err(io("stat"))?.len();
    if log_offset < FILE_HEADER_BYTES as u64 || log_offset > len || !log_offset.is_multiple_of(8) {
        return Err(format(format!(
            "its snapshot file {} says the log goes on at offset {log_offset}, but the log is {len} bytes: \
             the two files are of different logs (move both away, or neither)",
            snapshot_path(path).display()
        )));
    }
    bytes.resize(FILE_HEADER_BYTES, 0);
    file.read_exact(&mut bytes).map_err(io("read the header"))?;
    bytes.extend_from_slice(&snapshot);
    file.seek(SeekFrom::Start(log_offset)).map_err(io("seek"))?;
    file.read_to_end(&mut bytes).map_err(io("read"))?;
    recover_bytes(path, bytes, Some((snapshot.len(), log_offset)))
}

/// Where a log compacted on disk keeps its snapshot: `<log>.snapshot`
/// (see the module docs).
pub fn snapshot_path(log: &Path) -> PathBuf {
    log.with_extension("log.snapshot")
}

/// Where a compaction writes the snapshot file before renaming it.
fn snapshot_tmp_path(log: &Path) -> PathBuf {
    log.with_extension("log.snapshot.tmp")
}

/// The snapshot record of `log`'s snapshot file, checked, if there is one.
fn read_snapshot_file(log: &Path) -> Result<Option<Vec<u8>>, PersistError> {
    let path = snapshot_path(log);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Io {
                path,
                what: "read the snapshot file",
                source,
            })
        }
    };
    let bad = |reason: String| PersistError::Format {
        path: path.clone(),
        reason: format!(
            "{reason}: the state before the log's records is lost with it (it was written whole, synced and \
             renamed into place, so this is damage, not a crash)"
        ),
    };
    if bytes.len() < FILE_HEADER_BYTES || bytes[..8] != FILE_MAGIC || u32_at(&bytes, 8) != FILE_VERSION {
        return Err(bad("not a Spindle snapshot file of this version".into()));
    }
    let r = check_record(&bytes, FILE_HEADER_BYTES).map_err(|reason| bad(format!("its snapshot record: {reason}")))?;
    let end = FILE_HEADER_BYTES + record_bytes(r.payload.len());
    if r.kind != KIND_SNAPSHOT || r.payload.len() < SNAPSHOT_PREFIX_BYTES || end != bytes.len() {
        return Err(bad(format!(
            "expected one snapshot record, found a record of kind {} and {} more bytes",
            r.kind,
            bytes.len() - end
        )));
    }
    Ok(Some(bytes[FILE_HEADER_BYTES..].to_vec()))
}

/// [`recover`] for records held in memory without a file header (the
/// simulator's log: [`PersistLog::sim_durable_bytes`]) as member `rank`'s.
pub fn recover_records(records: &[u8], rank: u32) -> RecoveredLog {
    let mut bytes = Vec::with_capacity(FILE_HEADER_BYTES + records.len());
    bytes.extend_from_slice(&FILE_MAGIC);
    bytes.extend_from_slice(&FILE_VERSION.to_le_bytes());
    bytes.extend_from_slice(&rank.to_le_bytes());
    bytes.extend_from_slice(records);
    recover_bytes(Path::new("(memory)"), bytes, None).expect("a header of this build's version")
}

/// Read a log back from `bytes`: its header, then (a compacted log,
/// `snapshot = Some((record bytes, log offset))`) its snapshot record,
/// then its records from that log offset on.
fn recover_bytes(
    path: &Path,
    mut bytes: Vec<u8>,
    snapshot: Option<(usize, u64)>,
) -> Result<RecoveredLog, PersistError> {
    let mut log = RecoveredLog {
        path: path.to_path_buf(),
        rank: 0,
        records: Vec::new(),
        bytes: Vec::new(),
        valid_bytes: 0,
        dropped: None,
    };
    if bytes.len() < FILE_HEADER_BYTES {
        if !bytes.is_empty() {
            log.dropped = Some(Dropped {
                offset: 0,
                bytes: bytes.len() as u64,
                reason: format!("file header cut short ({} of {FILE_HEADER_BYTES} bytes)", bytes.len()),
                valid_records_after: false,
            });
        }
        return Ok(log);
    }
    if bytes[..8] != FILE_MAGIC {
        return Err(PersistError::Format {
            path: path.to_path_buf(),
            reason: format!("not a Spindle log (starts with {:02x?})", &bytes[..8]),
        });
    }
    let version = u32_at(&bytes, 8);
    if !(FILE_VERSION_OLDEST..=FILE_VERSION).contains(&version) {
        return Err(PersistError::Format {
            path: path.to_path_buf(),
            reason: format!("log version {version}, this build reads versions {FILE_VERSION_OLDEST} to {FILE_VERSION}"),
        });
    }
    log.rank = u32_at(&bytes, 12);
    let mut at = FILE_HEADER_BYTES;
    // Where the log's own records start in `bytes`, and their file offset.
    let (start, file_base) = match snapshot {
        Some((snapshot_bytes, log_offset)) => {
            let r = check_record(&bytes, at).map_err(|reason| PersistError::Format {
                path: path.to_path_buf(),
                reason: format!("its snapshot record: {reason}"),
            })?;
            log.records.push(r);
            at += snapshot_bytes;
            (at, log_offset)
        }
        None => (FILE_HEADER_BYTES, FILE_HEADER_BYTES as u64),
    };
    let file_offset = |at: usize| file_base + (at - start) as u64;
    while at < bytes.len() {
        match check_record(&bytes, at) {
            Ok(r) => {
                let next = at + record_bytes(r.payload.len());
                log.records.push(r);
                at = next;
            }
            Err(reason) => {
                let valid_records_after = (at + 8..bytes.len())
                    .step_by(8)
                    .any(|o| check_record(&bytes, o).is_ok());
                log.dropped = Some(Dropped {
                    offset: file_offset(at),
                    bytes: (bytes.len() - at) as u64,
                    reason,
                    valid_records_after,
                });
                break;
            }
        }
    }
    let at = at.min(bytes.len());
    log.valid_bytes = file_offset(at);
    bytes.truncate(at);
    log.bytes = bytes;
    Ok(log)
}

/// Check the record at `at`; the reason names what is wrong.
fn check_record(b: &[u8], at: usize) -> Result<RecoveredRecord, String> {
    let left = b.len() - at;
    if left < RECORD_HEADER_BYTES {
        return Err(format!(
            "record header cut short ({left} of {RECORD_HEADER_BYTES} bytes)"
        ));
    }
    let magic = u32_at(b, at);
    if magic != RECORD_MAGIC {
        return Err(format!("bad record magic {magic:#010x}"));
    }
    let kind = u32_at(b, at + 4);
    if kind != KIND_MESSAGE && kind != KIND_VIEW && kind != KIND_SNAPSHOT {
        return Err(format!("unknown record kind {kind}"));
    }
    let len = u32_at(b, at + 28);
    if len > RECORD_PAYLOAD_MAX {
        return Err(format!("record length {len} exceeds {RECORD_PAYLOAD_MAX}"));
    }
    let need = record_bytes(len as usize);
    if left < need {
        return Err(format!("record cut short ({left} of {need} bytes)"));
    }
    let payload = at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + len as usize;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&b[at..at + CRC_COVERED_HEADER_BYTES]);
    hasher.update(&b[payload.clone()]);
    let (want, got) = (u32_at(b, at + 32), hasher.finalize());
    if want != got {
        return Err(format!("checksum mismatch (stored {want:#010x}, computed {got:#010x})"));
    }
    Ok(RecoveredRecord {
        kind,
        view: u64_at(b, at + 8),
        seq: u64_at(b, at + 16),
        sender: u32_at(b, at + 24),
        payload,
    })
}

/// The path of member `rank`'s log in `dir`.
pub fn log_path(dir: &Path, group: &str, rank: usize) -> PathBuf {
    dir.join(format!("{group}-member-{rank}.log"))
}

/// The durable frontier: every message of `view` below `seq` is on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Frontier {
    view: u64,
    seq: u64,
}

/// State shared with the sync thread.
struct Shared {
    pending: Mutex<Pending>,
    /// Signalled when `pending` gets bytes or `stop`.
    work: Condvar,
    /// Held by whoever writes and syncs the file (the sync thread, or an
    /// install), taken while `pending` is held so batches reach the file in
    /// the order they were handed over.
    file: Mutex<File>,
    durable: Mutex<(Frontier, Option<String>)>,
    path: PathBuf,
    wake: Box<dyn Fn() + Send + Sync>,
    /// Compactions finished (the sync thread counts them).
    compactions_done: std::sync::atomic::AtomicU64,
}

struct Pending {
    bytes: Vec<u8>,
    frontier: Frontier,
    stop: bool,
    /// A compaction handed over and not yet begun.
    compact: Option<Compaction>,
}

/// A compaction for the sync thread: the snapshot record and its position.
struct Compaction {
    view: u64,
    seq: u64,
    members: u64,
    prev: Option<(u64, u64)>,
    state: Vec<u8>,
}

/// Where the log lives: a file with a sync thread, or memory (the
/// simulator: durability advances when the simulator says).
enum Backend {
    File {
        shared: Arc<Shared>,
        thread: Option<JoinHandle<()>>,
    },
    Memory {
        appended: Vec<u8>,
        durable_bytes: usize,
        frontier: Frontier,
        durable: Frontier,
        compactions_done: u64,
    },
}

/// The core's handle on its member's log (see the module docs).
pub struct PersistLog {
    backend: Backend,
    /// Records of the current pass, not yet handed over.
    staging: Vec<u8>,
    /// The spare buffer swapped with the pending one (no allocation once
    /// both reached their working size).
    spare: Vec<u8>,
    staged_frontier: Frontier,
    /// A write or sync failed: persistent delivery is over.
    failed: Option<String>,
    /// Bytes handed over since the last compaction was asked for.
    bytes_since_compaction: u64,
    /// Compactions asked for (`compactions_done` catches up).
    compactions_asked: u64,
    /// The last view this log installed (its view record's fields): what
    /// a snapshot in that view says about the view history.
    installed: Option<ViewRecord>,
}

impl PersistLog {
    /// Open (create) member `rank`'s log at `path` for appending, after
    /// recovering what it holds; `wake` is called from the sync thread
    /// when the durable frontier moved (ring the progress loop's doorbell).
    pub fn open(
        path: &Path,
        rank: usize,
        wake: Box<dyn Fn() + Send + Sync>,
    ) -> Result<(PersistLog, RecoveredLog), PersistError> {
        let io = |what: &'static str| {
            let path = path.to_path_buf();
            move |source| PersistError::Io { path, what, source }
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create the log directory"))?;
        }
        // A compaction cut short by a crash before its rename: the log and
        // its snapshot file (if any) are as they were.
        match std::fs::remove_file(snapshot_tmp_path(path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("remove an unfinished compaction")(e));
            }
            _ => {}
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io("open"))?;
        let is_file = file.metadata().map_err(io("stat"))?.is_file();
        let recovered = if is_file {
            recover(path)?
        } else {
            RecoveredLog {
                path: path.to_path_buf(),
                rank: rank as u32,
                records: Vec::new(),
                bytes: Vec::new(),
                valid_bytes: 0,
                dropped: None,
            }
        };
        if is_file && !recovered.records.is_empty() && recovered.rank != rank as u32 {
            return Err(PersistError::Format {
                path: path.to_path_buf(),
                reason: format!("the log belongs to rank {}, not rank {rank}", recovered.rank),
            });
        }
        if let (true, Some(d)) = (is_file, &recovered.dropped) {
            // Keep the dropped bytes beside the log: nothing vanishes.
            let aside = path.with_extension(format!("log.dropped-{}", d.offset));
            let mut tail = Vec::new();
            file.seek(SeekFrom::Start(d.offset)).map_err(io("seek"))?;
            file.read_to_end(&mut tail).map_err(io("read the dropped tail"))?;
            std::fs::write(&aside, &tail).map_err(io("save the dropped tail"))?;
            file.set_len(d.offset).map_err(io("truncate the dropped tail"))?;
        }
        let mut header = Vec::new();
        if recovered.valid_bytes == 0 {
            header.extend_from_slice(&FILE_MAGIC);
            header.extend_from_slice(&FILE_VERSION.to_le_bytes());
            header.extend_from_slice(&(rank as u32).to_le_bytes());
        }
        if is_file {
            file.seek(SeekFrom::End(0)).map_err(io("seek"))?;
        }
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                bytes: header,
                frontier: Frontier::default(),
                stop: false,
                compact: None,
            }),
            work: Condvar::new(),
            file: Mutex::new(file),
            durable: Mutex::new((Frontier::default(), None)),
            path: path.to_path_buf(),
            wake,
            compactions_done: std::sync::atomic::AtomicU64::new(0),
        });
        // Where the next compaction starts looking for the records after
        // its snapshot: after the last one's (see `compact_in_place`).
        let scan_from = recovered
            .snapshot()
            .map(|s| s.log_offset)
            .filter(|o| *o >= FILE_HEADER_BYTES as u64)
            .unwrap_or(FILE_HEADER_BYTES as u64);
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("spindle-log-{rank}"))
            .spawn(move || sync_loop(&for_thread, scan_from))
            .map_err(io("start the sync thread"))?;
        Ok((
            PersistLog::with_backend(Backend::File {
                shared,
                thread: Some(thread),
            }),
            recovered,
        ))
    }

    /// A log in memory (the simulator): nothing is durable until
    /// [`PersistLog::sim_sync`].
    pub fn memory() -> PersistLog {
        PersistLog::with_backend(Backend::Memory {
            appended: Vec::new(),
            durable_bytes: 0,
            frontier: Frontier::default(),
            durable: Frontier::default(),
            compactions_done: 0,
        })
    }

    /// A log in memory that goes on from a log read back (the simulator's
    /// restart after a total failure): its valid records, all durable (a
    /// dropped tail is gone, as [`PersistLog::open`] cuts it off a file).
    pub fn memory_recovered(recovered: &RecoveredLog) -> PersistLog {
        // `bytes` is the header and the valid records (a compacted memory
        // log holds its snapshot record at its head, among them).
        let appended = recovered.bytes.get(FILE_HEADER_BYTES..).unwrap_or(&[]).to_vec();
        PersistLog::with_backend(Backend::Memory {
            durable_bytes: appended.len(),
            appended,
            frontier: Frontier::default(),
            durable: Frontier::default(),
            compactions_done: 0,
        })
    }

    fn with_backend(backend: Backend) -> PersistLog {
        PersistLog {
            backend,
            staging: Vec::with_capacity(1 << 20),
            spare: Vec::with_capacity(1 << 20),
            staged_frontier: Frontier::default(),
            failed: None,
            bytes_since_compaction: 0,
            compactions_asked: 0,
            installed: None,
        }
    }

    /// Whether the pass may stage more (the disk keeps up).
    pub fn accepting(&self) -> bool {
        match &self.backend {
            Backend::File { shared, .. } => {
                self.staging.len() < PENDING_BYTES_MAX
                    && shared
                        .pending
                        .lock()
                        .map(|p| p.bytes.len() < PENDING_BYTES_MAX)
                        .unwrap_or(false)
            }
            Backend::Memory { .. } => true,
        }
    }

    /// Stage message `seq` of `view` (in seq order).
    #[inline]
    pub fn stage_message(&mut self, view: u64, seq: u64, sender: SenderWord, payload: &[u8]) {
        encode_record(&mut self.staging, KIND_MESSAGE, view, seq, sender.0, payload);
    }

    /// Every message of `view` below `seq` is staged (nulls have no record).
    pub fn stage_frontier(&mut self, view: u64, seq: u64) {
        debug_assert!(
            (view, seq) >= (self.staged_frontier.view, self.staged_frontier.seq),
            "total order: the log's frontier never moves back"
        );
        self.staged_frontier = Frontier { view, seq };
    }

    /// Hand the pass's staged records to the sync thread (one lock).
    pub fn commit(&mut self) {
        self.bytes_since_compaction += self.staging.len() as u64;
        match &mut self.backend {
            Backend::File { shared, .. } => {
                let Ok(mut p) = shared.pending.lock() else {
                    self.failed.get_or_insert_with(|| "the sync thread panicked".into());
                    return;
                };
                if p.bytes.is_empty() {
                    std::mem::swap(&mut p.bytes, &mut self.staging);
                } else {
                    p.bytes.extend_from_slice(&self.staging);
                    self.staging.clear();
                }
                p.frontier = self.staged_frontier;
                shared.work.notify_one();
            }
            Backend::Memory { appended, frontier, .. } => {
                appended.extend_from_slice(&self.staging);
                self.staging.clear();
                *frontier = self.staged_frontier;
            }
        }
    }

    /// How far `view` is durable (0 while the disk holds none of it), or
    /// why persistence failed.
    pub fn durable_seq(&self, view: u64) -> Result<u64, String> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        let d = match &self.backend {
            Backend::File { shared, .. } => {
                let d = shared
                    .durable
                    .lock()
                    .map_err(|_| "the sync thread panicked".to_string())?;
                if let Some(e) = &d.1 {
                    return Err(e.clone());
                }
                d.0
            }
            Backend::Memory { durable, .. } => *durable,
        };
        Ok(if d.view == view { d.seq } else { 0 })
    }

    /// Whether message `seq` of `view` is on disk (the durable frontier
    /// is past it: later in that view, or in a later view).
    pub fn is_durable(&self, view: u64, seq: u64) -> bool {
        let d = match &self.backend {
            Backend::File { shared, .. } => match shared.durable.lock() {
                Ok(d) => d.0,
                Err(_) => return false,
            },
            Backend::Memory { durable, .. } => *durable,
        };
        d.view > view || (d.view == view && d.seq > seq)
    }

    /// Install `new_view` (`old_view` ended at `final_seq`; [`JOINED`]
    /// for a joiner): append the view record and make everything appended
    /// durable before returning (the ragged edge is delivered after this).
    pub fn install_view(&mut self, new_view: u64, old_view: u64, final_seq: u64, members: u64) -> Result<(), String> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        let mut payload = [0u8; 16];
        payload[..8].copy_from_slice(&old_view.to_le_bytes());
        payload[8..].copy_from_slice(&members.to_le_bytes());
        self.installed = Some(ViewRecord {
            new_view,
            old_view,
            final_seq,
            members,
        });
        encode_record(&mut self.staging, KIND_VIEW, new_view, final_seq, 0, &payload);
        self.staged_frontier = Frontier { view: new_view, seq: 0 };
        match &mut self.backend {
            Backend::File { shared, .. } => {
                let shared = Arc::clone(shared);
                let r = {
                    let mut p = shared
                        .pending
                        .lock()
                        .map_err(|_| "the sync thread panicked".to_string())?;
                    p.bytes.extend_from_slice(&self.staging);
                    self.staging.clear();
                    p.frontier = self.staged_frontier;
                    std::mem::swap(&mut p.bytes, &mut self.spare);
                    let frontier = p.frontier;
                    let file = shared.file.lock().map_err(|_| "the sync thread panicked".to_string())?;
                    drop(p);
                    write_and_sync(&shared, file, &mut self.spare, frontier)
                };
                if let Err(e) = r {
                    self.failed = Some(e.clone());
                    return Err(e);
                }
                Ok(())
            }
            Backend::Memory { .. } => {
                self.commit();
                self.sim_sync();
                Ok(())
            }
        }
    }

    /// Bytes appended since the last compaction was asked for (what
    /// `GroupConfig::compact_log_bytes` is compared with).
    pub fn bytes_since_compaction(&self) -> u64 {
        self.bytes_since_compaction
    }

    /// Compactions this log finished.
    pub fn compactions_done(&self) -> u64 {
        match &self.backend {
            Backend::File { shared, .. } => shared.compactions_done.load(std::sync::atomic::Ordering::Relaxed),
            Backend::Memory { compactions_done, .. } => *compactions_done,
        }
    }

    /// Whether a compaction was asked for and has not finished.
    pub fn is_compacting(&self) -> bool {
        self.compactions_done() < self.compactions_asked
    }

    /// Replace everything before message `seq` of `view` with `state`,
    /// the application's snapshot after delivering exactly the messages
    /// before that position (see the module docs). `members` is the
    /// view's membership. Every message before the position must be on
    /// disk (delivered messages are). The file is rewritten by the sync
    /// thread; this returns at once.
    pub fn compact(&mut self, view: u64, seq: u64, members: u64, state: &[u8]) -> Result<(), String> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        debug_assert!(!self.is_compacting(), "one compaction at a time");
        debug_assert!(
            seq == 0 || self.is_durable(view, seq - 1),
            "no loss of persisted messages: a compaction covers only messages on disk"
        );
        let prev = match self.installed {
            Some(v) if v.new_view == view => (v.old_view != JOINED).then_some((v.old_view, v.final_seq)),
            Some(v) => {
                return Err(format!(
                    "log compaction in view {view}, but the log's last view record installs view {}",
                    v.new_view
                ))
            }
            None if view == 0 => None,
            None => return Err(format!("log compaction in view {view}, but the log installed no view")),
        };
        if state.len() > SNAPSHOT_STATE_BYTES_MAX {
            return Err(format!(
                "log compaction: the application's snapshot is {} bytes, more than a log record holds ({SNAPSHOT_STATE_BYTES_MAX})",
                state.len()
            ));
        }
        self.compactions_asked += 1;
        self.bytes_since_compaction = 0;
        match &mut self.backend {
            Backend::File { shared, .. } => {
                let mut p = shared
                    .pending
                    .lock()
                    .map_err(|_| "the sync thread panicked".to_string())?;
                p.compact = Some(Compaction {
                    view,
                    seq,
                    members,
                    prev,
                    state: state.to_vec(),
                });
                shared.work.notify_one();
                Ok(())
            }
            Backend::Memory {
                appended,
                durable_bytes,
                compactions_done,
                ..
            } => {
                // In memory the snapshot record leads the log itself.
                let mut record = Vec::new();
                encode_snapshot_record(&mut record, (view, seq), members, prev, 0, state)?;
                // Everything before the position is durable: compact the
                // durable part, keep what follows it as it is.
                let mut compacted = compact_records(&appended[..*durable_bytes], view, seq, &record)?;
                let new_durable = compacted.len();
                compacted.extend_from_slice(&appended[*durable_bytes..]);
                *appended = compacted;
                *durable_bytes = new_durable;
                *compactions_done += 1;
                Ok(())
            }
        }
    }

    /// Simulator: make everything committed durable.
    pub fn sim_sync(&mut self) {
        if let Backend::Memory {
            appended,
            durable_bytes,
            frontier,
            durable,
            ..
        } = &mut self.backend
        {
            *durable_bytes = appended.len();
            *durable = *frontier;
        }
    }

    /// Simulator: the durable bytes (what a crash would leave).
    pub fn sim_durable_bytes(&self) -> &[u8] {
        match &self.backend {
            Backend::Memory {
                appended,
                durable_bytes,
                ..
            } => &appended[..*durable_bytes],
            Backend::File { .. } => &[],
        }
    }

    /// Simulator: every byte committed, durable or not (what a crash
    /// could leave written past the durable bytes, in part: a torn tail).
    pub fn sim_written_bytes(&self) -> &[u8] {
        match &self.backend {
            Backend::Memory { appended, .. } => appended,
            Backend::File { .. } => &[],
        }
    }

    /// The file's path (file logs).
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::File { shared, .. } => Some(&shared.path),
            Backend::Memory { .. } => None,
        }
    }

    /// Set this log aside and go on with an empty one at the same place
    /// (a restart that leaves member `rank` out: it joins the restarted
    /// group afresh). Nothing is deleted: `<name>.log` is renamed to
    /// `<name>.<label>.log` (`<name>.<label>.1.log`, `.2`, … when that is
    /// taken), which is returned, and its snapshot file, if any, goes with
    /// it (`<name>.<label>.log.snapshot`), so [`recover`] still reads the
    /// pair. A log in memory (the simulator) is replaced by an empty one.
    pub fn set_aside(mut self, rank: usize, label: &str) -> Result<(PersistLog, Option<PathBuf>), PersistError> {
        let Backend::File { shared, thread } = &mut self.backend else {
            return Ok((PersistLog::memory(), None));
        };
        if let Ok(mut p) = shared.pending.lock() {
            p.stop = true;
            shared.work.notify_one();
        }
        if let Some(t) = thread.take() {
            let _ = t.join();
        }
        let path = shared.path.clone();
        let io = |what: &'static str| {
            let path = path.clone();
            move |source| PersistError::Io { path, what, source }
        };
        // The sync thread is gone, so this is the last handle on `shared`:
        // take its wake-up (for the new log's sync thread) and close the
        // file before renaming it.
        let placeholder = Backend::Memory {
            appended: Vec::new(),
            durable_bytes: 0,
            frontier: Frontier::default(),
            durable: Frontier::default(),
            compactions_done: 0,
        };
        let Backend::File { shared, .. } = std::mem::replace(&mut self.backend, placeholder) else {
            unreachable!("matched above");
        };
        let shared = Arc::try_unwrap(shared).map_err(|_| PersistError::Format {
            path: path.clone(),
            reason: "the log is still in use elsewhere: it cannot be set aside".into(),
        })?;
        let Shared { wake, .. } = shared;
        // Bounded: a thousand logs set aside under one label is a loop
        // gone wrong, not a history.
        let name = path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let aside = (0..1000)
            .map(|i| {
                let suffix = if i == 0 {
                    label.to_string()
                } else {
                    format!("{label}.{i}")
                };
                path.with_file_name(format!("{name}.{suffix}.log"))
            })
            .find(|p| !p.exists() && !snapshot_path(p).exists())
            .ok_or_else(|| PersistError::Format {
                path: path.clone(),
                reason: format!("a thousand logs were set aside as {label} already"),
            })?;
        std::fs::rename(&path, &aside).map_err(io("set the log aside"))?;
        let snapshot = snapshot_path(&path);
        if snapshot.exists() {
            if let Err(e) = std::fs::rename(&snapshot, snapshot_path(&aside)) {
                // Put the log back beside its snapshot: a log without it
                // would have lost what it was compacted to.
                let _ = std::fs::rename(&aside, &path);
                return Err(io("set the snapshot file aside")(e));
            }
        }
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io("sync the log directory"))?;
        }
        let (log, _) = PersistLog::open(&path, rank, wake)?;
        Ok((log, Some(aside)))
    }
}

impl Drop for PersistLog {
    fn drop(&mut self) {
        if let Backend::File { shared, thread } = &mut self.backend {
            if let Ok(mut p) = shared.pending.lock() {
                p.stop = true;
                shared.work.notify_one();
            }
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Write `bytes` and `fdatasync` under the file lock, then publish
/// `frontier` as durable (or the error) and wake the progress thread.
fn write_and_sync(
    shared: &Shared,
    mut file: std::sync::MutexGuard<'_, File>,
    bytes: &mut Vec<u8>,
    frontier: Frontier,
) -> Result<(), String> {
    let r = file
        .write_all(bytes)
        .map_err(|e| format!("{}: write: {e}", shared.path.display()))
        .and_then(|()| {
            file.sync_data()
                .map_err(|e| format!("{}: fdatasync: {e}", shared.path.display()))
        });
    bytes.clear();
    if let Ok(mut d) = shared.durable.lock() {
        match &r {
            Ok(()) => {
                if (frontier.view, frontier.seq) >= (d.0.view, d.0.seq) {
                    d.0 = frontier;
                }
            }
            Err(e) => {
                d.1.get_or_insert_with(|| e.clone());
            }
        }
    }
    drop(file);
    (shared.wake)();
    r
}

/// The sync thread: wait for bytes, write them, one `fdatasync`, publish.
fn sync_loop(shared: &Arc<Shared>, mut scan_from: u64) {
    let mut batch: Vec<u8> = Vec::with_capacity(1 << 20);
    // The compaction under way, on a thread of its own beside the appends
    // (one at a time: the core asks for the next once this one is done).
    let mut compacting: Option<JoinHandle<Option<u64>>> = None;
    let finish = |compacting: &mut Option<JoinHandle<Option<u64>>>, scan_from: &mut u64| {
        if let Some(t) = compacting.take() {
            if let Ok(Some(next)) = t.join() {
                *scan_from = next;
            }
        }
    };
    loop {
        let Ok(mut p) = shared.pending.lock() else { return };
        while p.bytes.is_empty() && p.compact.is_none() && !p.stop {
            p = match shared.work.wait(p) {
                Ok(p) => p,
                Err(_) => return,
            };
        }
        if p.bytes.is_empty() && p.compact.is_none() && p.stop {
            drop(p);
            finish(&mut compacting, &mut scan_from);
            return;
        }
        std::mem::swap(&mut p.bytes, &mut batch);
        let frontier = p.frontier;
        let compaction = p.compact.take();
        let Ok(file) = shared.file.lock() else { return };
        drop(p);
        if batch.is_empty() {
            drop(file);
        } else if write_and_sync(shared, file, &mut batch, frontier).is_err() {
            return;
        }
        if let Some(c) = compaction {
            finish(&mut compacting, &mut scan_from);
            // Under the file lock no write is under way: the file's length
            // ends at a record boundary, and every record before the
            // snapshot's position is in it (delivered, so durable).
            let handle = shared
                .file
                .lock()
                .map_err(|_| "the file lock is poisoned".to_string())
                .and_then(|f| {
                    let len = f.metadata().map_err(|e| format!("stat: {e}"))?.len();
                    Ok((f.try_clone().map_err(|e| format!("dup: {e}"))?, len))
                });
            let for_thread = Arc::clone(shared);
            let from = scan_from;
            let started = handle.and_then(|(file, len)| {
                std::thread::Builder::new()
                    .name("spindle-compact".into())
                    .spawn(move || {
                        let r = compact_in_place(&for_thread.path, &file, &c, from, len);
                        let next = r.as_ref().ok().copied();
                        compaction_done(&for_thread, r.map(|_| ()));
                        next
                    })
                    .map_err(|e| format!("start the compaction thread: {e}"))
            });
            match started {
                Ok(t) => compacting = Some(t),
                Err(e) => compaction_done(shared, Err(format!("{}: log compaction: {e}", shared.path.display()))),
            }
        }
    }
}

/// A compaction ended: count it, or stop persistence with its error;
/// then wake the progress thread.
fn compaction_done(shared: &Shared, r: Result<(), String>) {
    match r {
        Ok(()) => {
            shared
                .compactions_done
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Err(e) => {
            if let Ok(mut d) = shared.durable.lock() {
                d.1.get_or_insert(e);
            }
        }
    }
    (shared.wake)();
}

/// Bytes a compaction reads at a time while it looks for where the
/// records after its snapshot begin.
const COMPACTION_SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Compact the log at `path` (`file`, its first `len` bytes written and
/// not changing) in place for `c`, without copying it: find the first
/// record after the snapshot's position (scanning record headers from
/// `scan_from`, where the last compaction's records began), write the
/// snapshot file naming that offset (beside it, synced, renamed into
/// place, the directory synced), then punch a hole over the records
/// before it, so the disk gives their space back. The log keeps its
/// length, and appends go on at its end meanwhile (on the sync thread).
/// Returns where the records after the snapshot begin.
fn compact_in_place(path: &Path, file: &File, c: &Compaction, scan_from: u64, len: u64) -> Result<u64, String> {
    use std::os::unix::fs::FileExt;
    let err = |what: &'static str| {
        let path = path.display().to_string();
        move |e: std::io::Error| format!("{path}: log compaction: {what}: {e}")
    };
    let mut head = [0u8; RECORD_HEADER_BYTES];
    file.read_exact_at(&mut head[..FILE_HEADER_BYTES], 0)
        .map_err(err("read the header"))?;
    let rank = u32_at(&head, 12);
    // The file is in total order (a view's messages in seq order, then
    // the next view's record, …): the records after the position are a
    // suffix of it.
    // Read in chunks (one syscall per chunk, not per record); a record
    // whose header crosses a chunk's end is read again with the next.
    let mut at = scan_from.max(FILE_HEADER_BYTES as u64);
    let mut chunk = vec![0u8; COMPACTION_SCAN_CHUNK_BYTES];
    'scan: while at + RECORD_HEADER_BYTES as u64 <= len {
        let n = chunk.len().min((len - at) as usize);
        file.read_exact_at(&mut chunk[..n], at).map_err(err("read the log"))?;
        let mut i = 0usize;
        while i + RECORD_HEADER_BYTES <= n {
            let h = &chunk[i..i + RECORD_HEADER_BYTES];
            if u32_at(h, 0) != RECORD_MAGIC {
                return Err(format!(
                    "{}: log compaction: no record at offset {} (bad magic {:#010x})",
                    path.display(),
                    at + i as u64,
                    u32_at(h, 0)
                ));
            }
            let (kind, view, seq) = (u32_at(h, 4), u64_at(h, 8), u64_at(h, 16));
            let after = match kind {
                KIND_MESSAGE => (view, seq) >= (c.view, c.seq),
                KIND_VIEW => view > c.view,
                _ => false,
            };
            if after {
                at += i as u64;
                break 'scan;
            }
            i += record_bytes(u32_at(h, 28) as usize);
        }
        at += i as u64;
    }
    let log_offset = at.min(len);
    let mut out = Vec::with_capacity(FILE_HEADER_BYTES + RECORD_HEADER_BYTES + SNAPSHOT_PREFIX_BYTES + c.state.len());
    out.extend_from_slice(&FILE_MAGIC);
    out.extend_from_slice(&FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    encode_snapshot_record(&mut out, (c.view, c.seq), c.members, c.prev, log_offset, &c.state)?;
    let tmp = snapshot_tmp_path(path);
    std::fs::write(&tmp, &out).map_err(err("write the snapshot file"))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(err("sync the snapshot file"))?;
    std::fs::rename(&tmp, snapshot_path(path)).map_err(err("rename the snapshot file into place"))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err("sync the log directory"))?;
    }
    // The snapshot is durable: the records before `log_offset` are no
    // longer read. Give their blocks back (a file system without hole
    // punching keeps them: only space is lost, not correctness).
    if log_offset > FILE_HEADER_BYTES as u64 {
        let _ = rustix::fs::fallocate(
            file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            FILE_HEADER_BYTES as u64,
            log_offset - FILE_HEADER_BYTES as u64,
        );
    }
    Ok(log_offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spindle-persist-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn wait_durable(log: &mut PersistLog, view: u64, seq: u64) {
        for _ in 0..10_000 {
            if log.durable_seq(view).unwrap() >= seq {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("never durable");
    }

    #[test]
    fn records_come_back_in_order_and_a_view_record_trims_its_view() {
        let dir = tmp("roundtrip");
        let path = log_path(&dir, "g", 1);
        {
            let (mut log, rec) = PersistLog::open(&path, 1, Box::new(|| {})).unwrap();
            assert!(rec.records.is_empty() && rec.dropped.is_none());
            for seq in 0..5u64 {
                log.stage_message(
                    0,
                    seq,
                    SenderWord::new((seq % 2) as usize, 0, 1),
                    format!("m{seq}").as_bytes(),
                );
            }
            log.stage_frontier(0, 5);
            log.commit();
            wait_durable(&mut log, 0, 5);
            // View 1 ends view 0 at seq 3: seqs 3 and 4 were trimmed.
            log.install_view(1, 0, 3, 0b11).unwrap();
            log.stage_message(1, 0, SenderWord::new(0, 0, 1), b"n0");
            log.stage_frontier(1, 1);
            log.commit();
            wait_durable(&mut log, 1, 1);
        }
        let rec = recover(&path).unwrap();
        assert_eq!(rec.rank, 1);
        assert!(rec.dropped.is_none());
        let h: Vec<_> = rec
            .history()
            .iter()
            .map(|m| (m.view, m.seq, m.payload.to_vec()))
            .collect();
        assert_eq!(
            h,
            vec![
                (0, 0, b"m0".to_vec()),
                (0, 1, b"m1".to_vec()),
                (0, 2, b"m2".to_vec()),
                (1, 0, b"n0".to_vec())
            ]
        );
    }

    fn wait_compacted(log: &PersistLog, done: u64) {
        for _ in 0..10_000 {
            if log.compactions_done() >= done {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the compaction never finished");
    }

    fn messages(log: &mut PersistLog, view: u64, seqs: std::ops::Range<u64>) {
        let end = seqs.end;
        for seq in seqs {
            log.stage_message(view, seq, SenderWord::new(0, 0, 1), format!("{view}.{seq}").as_bytes());
        }
        log.stage_frontier(view, end);
        log.commit();
    }

    fn history_of(rec: &RecoveredLog) -> Vec<(u64, u64)> {
        rec.history().iter().map(|m| (m.view, m.seq)).collect()
    }

    #[test]
    fn a_compacted_log_is_its_snapshot_then_the_records_after_it() {
        let dir = tmp("compact");
        let path = log_path(&dir, "g", 2);
        {
            let (mut log, _) = PersistLog::open(&path, 2, Box::new(|| {})).unwrap();
            messages(&mut log, 0, 0..10);
            wait_durable(&mut log, 0, 10);
            // View 1 ends view 0 at seq 8 (8 and 9 trimmed).
            log.install_view(1, 0, 8, 0b101).unwrap();
            messages(&mut log, 1, 0..6);
            wait_durable(&mut log, 1, 6);
            assert!(log.bytes_since_compaction() > 0);
            // The application applied view 0 (to seq 8) and view 1 to seq 4.
            log.compact(1, 4, 0b101, b"state after 1.3").unwrap();
            assert_eq!(log.bytes_since_compaction(), 0);
            wait_compacted(&log, 1);
            assert!(!log.is_compacting());
            assert!(snapshot_path(&path).exists(), "the snapshot file");
            // Appends go on in the new file.
            messages(&mut log, 1, 6..8);
            wait_durable(&mut log, 1, 8);
        }
        assert!(!snapshot_tmp_path(&path).exists(), "no leftover beside the log");
        let rec = recover(&path).unwrap();
        assert!(rec.dropped.is_none(), "{:?}", rec.dropped);
        let snap = rec.snapshot().expect("a snapshot record");
        // The records before the snapshot are not read (a hole, where the
        // file system punches one).
        assert!(snap.log_offset > FILE_HEADER_BYTES as u64);
        assert_eq!((rec.records[1].view, rec.records[1].seq), (1, 4));
        assert_eq!(
            (snap.view, snap.seq, snap.members, snap.prev),
            (1, 4, 0b101, Some((0, 8)))
        );
        assert_eq!(&rec.bytes[snap.state.clone()], b"state after 1.3");
        assert_eq!(history_of(&rec), vec![(1, 4), (1, 5), (1, 6), (1, 7)]);
        let s = rec.summary(0b111);
        assert_eq!(
            (s.last_view, s.last_members, s.prev, s.frontier, s.joined),
            (1, 0b101, Some((0, 8)), 8, false)
        );
        // A second compaction replaces the first snapshot.
        {
            let (mut log, rec) = PersistLog::open(&path, 2, Box::new(|| {})).unwrap();
            assert_eq!(rec.records.len(), 5);
            log.install_view(2, 1, 8, 0b101).unwrap();
            log.compact(2, 0, 0b101, b"second").unwrap();
            wait_compacted(&log, 1);
        }
        let rec = recover(&path).unwrap();
        assert_eq!(rec.records.iter().filter(|r| r.kind == KIND_SNAPSHOT).count(), 1);
        assert_eq!(&rec.bytes[rec.snapshot().unwrap().state], b"second");
        assert!(history_of(&rec).is_empty());
        assert_eq!(rec.summary(0b111).prev, Some((1, 8)));
    }

    #[test]
    fn the_view_records_after_a_snapshot_still_trim_their_views() {
        let mut log = PersistLog::memory();
        messages(&mut log, 0, 0..6);
        log.sim_sync();
        log.compact(0, 2, 0b11, b"s").unwrap();
        assert_eq!(log.compactions_done(), 1);
        // Not yet durable: kept as it is, after the compacted part.
        messages(&mut log, 0, 6..7);
        log.install_view(1, 0, 5, 0b01).unwrap();
        let path = tmp("compact-mem").join("m.log");
        let mut file = FILE_MAGIC.to_vec();
        file.extend_from_slice(&FILE_VERSION.to_le_bytes());
        file.extend_from_slice(&0u32.to_le_bytes());
        file.extend_from_slice(log.sim_durable_bytes());
        std::fs::write(&path, &file).unwrap();
        let rec = recover(&path).unwrap();
        // Seqs 5 and 6 of view 0 are beyond the view's end: not history.
        assert_eq!(history_of(&rec), vec![(0, 2), (0, 3), (0, 4)]);
        let s = rec.summary(0b11);
        assert_eq!(
            (s.last_view, s.last_members, s.prev, s.frontier),
            (1, 0b01, Some((0, 5)), 0)
        );
    }

    #[test]
    fn compaction_refuses_what_it_cannot_place() {
        let mut log = PersistLog::memory();
        // View 3 without a view record: the snapshot could not say where
        // the view history stands.
        let e = log.compact(3, 0, 0b1, b"").unwrap_err();
        assert!(e.contains("installed no view"), "{e}");
        log.install_view(4, 3, 0, 0b1).unwrap();
        let e = log.compact(5, 0, 0b1, b"").unwrap_err();
        assert!(e.contains("installs view 4"), "{e}");
        assert_eq!(log.compactions_done(), 0);
    }

    #[test]
    fn a_damaged_or_foreign_snapshot_file_is_refused_and_an_unfinished_one_removed() {
        let dir = tmp("compact-damage");
        let path = log_path(&dir, "g", 0);
        {
            let (mut log, _) = PersistLog::open(&path, 0, Box::new(|| {})).unwrap();
            messages(&mut log, 0, 0..4);
            wait_durable(&mut log, 0, 4);
            log.compact(0, 4, 0b1, &[7u8; 64]).unwrap();
            wait_compacted(&log, 1);
        }
        // A crash before the rename leaves a temporary file: removed.
        std::fs::write(snapshot_tmp_path(&path), b"half a compaction").unwrap();
        drop(PersistLog::open(&path, 0, Box::new(|| {})).unwrap());
        assert!(
            !snapshot_tmp_path(&path).exists(),
            "the unfinished compaction is removed at open"
        );
        // A flipped byte in the snapshot: refused, naming the file; the
        // state it held is not guessed at.
        let good = std::fs::read(snapshot_path(&path)).unwrap();
        let mut bad = good.clone();
        bad[FILE_HEADER_BYTES + RECORD_HEADER_BYTES + SNAPSHOT_PREFIX_BYTES + 10] ^= 0xff;
        std::fs::write(snapshot_path(&path), &bad).unwrap();
        let e = recover(&path).unwrap_err().to_string();
        assert!(e.contains("log.snapshot") && e.contains("checksum mismatch"), "{e}");
        // A snapshot file beside another log (the log moved away, the
        // snapshot left behind): refused.
        std::fs::write(snapshot_path(&path), &good).unwrap();
        std::fs::remove_file(&path).unwrap();
        let e = PersistLog::open(&path, 0, Box::new(|| {}))
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("different logs"), "{e}");
    }

    #[test]
    fn a_torn_tail_is_dropped_set_aside_and_said() {
        let dir = tmp("torn");
        let path = log_path(&dir, "g", 0);
        {
            let (mut log, _) = PersistLog::open(&path, 0, Box::new(|| {})).unwrap();
            for seq in 0..3u64 {
                log.stage_message(0, seq, SenderWord::new(0, 0, 1), &[seq as u8; 100]);
            }
            log.stage_frontier(0, 3);
            log.commit();
            wait_durable(&mut log, 0, 3);
        }
        let full = std::fs::metadata(&path).unwrap().len();
        // Cut the last record in the middle of its payload.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(full - 30).unwrap();
        drop(f);
        let rec = recover(&path).unwrap();
        assert_eq!(rec.records.len(), 2);
        let d = rec.dropped.clone().unwrap();
        let third = (FILE_HEADER_BYTES + 2 * record_bytes(100)) as u64;
        assert_eq!(d.offset, third);
        assert_eq!(d.bytes, full - 30 - third);
        assert!(d.reason.contains("cut short"), "{}", d.reason);
        assert!(!d.valid_records_after);
        // Reopening keeps the dropped bytes beside the log and appends
        // after the valid prefix.
        let (mut log, again) = PersistLog::open(&path, 0, Box::new(|| {})).unwrap();
        assert_eq!(again.records.len(), 2);
        let aside = path.with_extension(format!("log.dropped-{third}"));
        assert_eq!(std::fs::metadata(&aside).unwrap().len(), d.bytes);
        log.stage_message(0, 2, SenderWord::new(0, 0, 1), b"again");
        log.stage_frontier(0, 3);
        log.commit();
        wait_durable(&mut log, 0, 3);
        drop(log);
        let rec = recover(&path).unwrap();
        assert!(rec.dropped.is_none());
        assert_eq!(rec.history().last().unwrap().payload, b"again");
    }

    #[test]
    fn a_log_set_aside_is_kept_renamed_and_an_empty_one_goes_on_in_its_place() {
        let dir = tmp("aside");
        let path = log_path(&dir, "g", 1);
        let woken = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let wake = {
            let woken = Arc::clone(&woken);
            Box::new(move || {
                woken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
        };
        let (mut log, _) = PersistLog::open(&path, 1, wake).unwrap();
        log.stage_message(0, 0, SenderWord::new(1, 0, 1), b"old");
        log.stage_frontier(0, 1);
        log.commit();
        wait_durable(&mut log, 0, 1);
        let (mut fresh, aside) = log.set_aside(1, "set-aside-at-view-3").unwrap();
        let aside = aside.expect("a file log is renamed");
        assert_eq!(aside, dir.join("g-member-1.set-aside-at-view-3.log"));
        // The old records are in the file set aside, none in the new log.
        assert_eq!(recover(&aside).unwrap().history()[0].payload, b"old");
        assert!(recover(&path).unwrap().records.is_empty());
        // The new log works, with the old one's wake-up.
        let before = woken.load(std::sync::atomic::Ordering::Relaxed);
        fresh.stage_message(4, 0, SenderWord::new(1, 0, 1), b"new");
        fresh.stage_frontier(4, 1);
        fresh.commit();
        wait_durable(&mut fresh, 4, 1);
        assert!(woken.load(std::sync::atomic::Ordering::Relaxed) > before);
        // A second one under the same label does not overwrite the first,
        // and a snapshot file goes with its log (named so that `recover`
        // finds it beside it).
        std::fs::write(snapshot_path(&path), b"its snapshot").unwrap();
        let (_, second) = fresh.set_aside(1, "set-aside-at-view-3").unwrap();
        let second = second.unwrap();
        assert_eq!(second, dir.join("g-member-1.set-aside-at-view-3.1.log"));
        assert_eq!(std::fs::read(snapshot_path(&second)).unwrap(), b"its snapshot");
        assert!(!snapshot_path(&path).exists());
        assert_eq!(recover(&aside).unwrap().history()[0].payload, b"old");
        // In memory: an empty log, nothing renamed.
        let (memory, none) = PersistLog::memory().set_aside(0, "x").unwrap();
        assert!(none.is_none() && memory.path().is_none());
    }

    #[test]
    fn a_flipped_byte_inside_the_log_is_a_checksum_mismatch_with_records_after_it() {
        let dir = tmp("flip");
        let path = log_path(&dir, "g", 0);
        {
            let (mut log, _) = PersistLog::open(&path, 0, Box::new(|| {})).unwrap();
            for seq in 0..4u64 {
                log.stage_message(0, seq, SenderWord::new(0, 0, 1), &[7u8; 24]);
            }
            log.stage_frontier(0, 4);
            log.commit();
            wait_durable(&mut log, 0, 4);
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let second = FILE_HEADER_BYTES + record_bytes(24);
        bytes[second + RECORD_HEADER_BYTES + 3] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let rec = recover(&path).unwrap();
        assert_eq!(rec.records.len(), 1);
        let d = rec.dropped.unwrap();
        assert_eq!(d.offset, second as u64);
        assert!(d.reason.contains("checksum mismatch"), "{}", d.reason);
        assert!(d.valid_records_after, "records 3 and 4 follow the damaged one");
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused() {
        let dir = tmp("notalog");
        let path = dir.join("x.log");
        std::fs::write(&path, b"hello world, this is not a log").unwrap();
        let e = PersistLog::open(&path, 0, Box::new(|| {})).err().unwrap();
        assert!(e.to_string().contains("not a Spindle log"), "{e}");
    }

    #[test]
    fn a_full_disk_is_an_error_and_nothing_becomes_durable() {
        let dir = tmp("full");
        let path = dir.join("full.log");
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let (mut log, _) = PersistLog::open(&path, 0, Box::new(|| {})).unwrap();
        log.stage_message(0, 0, SenderWord::new(0, 0, 1), b"x");
        log.stage_frontier(0, 1);
        log.commit();
        let mut err = None;
        for _ in 0..10_000 {
            match log.durable_seq(0) {
                Ok(d) => assert_eq!(d, 0, "nothing written may count as durable"),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let e = err.expect("a write to a full disk fails");
        assert!(e.contains("No space left"), "{e}");
        assert!(log.install_view(1, 0, 0, 1).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any cut of a log recovers exactly the records wholly before it.
        #[test]
        fn any_cut_recovers_exactly_the_whole_records_before_it(
            lens in proptest::collection::vec(0usize..300, 1..20),
            cut_frac in 0.0f64..1.0,
        ) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&FILE_MAGIC);
            bytes.extend_from_slice(&FILE_VERSION.to_le_bytes());
            bytes.extend_from_slice(&3u32.to_le_bytes());
            let mut ends = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                encode_record(&mut bytes, KIND_MESSAGE, 0, i as u64, 0, &vec![i as u8; *len]);
                ends.push(bytes.len());
            }
            let cut = FILE_HEADER_BYTES + ((bytes.len() - FILE_HEADER_BYTES) as f64 * cut_frac) as usize;
            let dir = tmp("prop");
            let path = dir.join(format!("p-{}.log", lens.len()));
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let rec = recover(&path).unwrap();
            let whole = ends.iter().filter(|e| **e <= cut).count();
            proptest::prop_assert_eq!(rec.records.len(), whole);
            proptest::prop_assert_eq!(rec.dropped.is_some(), cut != FILE_HEADER_BYTES + ends[..whole].last().map_or(0, |e| e - FILE_HEADER_BYTES));
            for (i, r) in rec.records.iter().enumerate() {
                proptest::prop_assert_eq!(r.seq, i as u64);
                proptest::prop_assert_eq!(r.payload.len(), lens[i]);
            }
        }
    }
}
