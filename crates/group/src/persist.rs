//! The persistent delivery mode's on-disk log: one file per member,
//! appended in total order, made durable by group commit.
//!
//! ## File layout
//!
//! ```text
//!  file   ┌ LogFileHeader (16 B): magic "SPNDLOG1", version u32, rank u32
//!         └ record, record, …                       (each 8-aligned)
//!  record  +0  magic   u32  RECORD_MAGIC ("SPLR")
//!          +4  kind    u32  1: message, 2: view installed
//!          +8  view    u64  message: the view it was sent in; view record: the new view
//!          +16 seq     u64  message: its seq in that view; view record: the old view's final_seq
//!                            (view record payload: the old view u64 (JOINED for a joiner),
//!                             then the new view's members u64, bit r = rank r)
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
/// Version of the record layout.
pub const FILE_VERSION: u32 = 1;
/// First word of every record ("SPLR" little-endian).
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SPLR");
pub const KIND_MESSAGE: u32 = 1;
pub const KIND_VIEW: u32 = 2;
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
    /// beyond its view's `final_seq`).
    pub fn history(&self) -> Vec<HistoryMessage<'_>> {
        let mut final_seq: std::collections::BTreeMap<u64, u64> = Default::default();
        for r in self.records.iter().filter(|r| r.kind == KIND_VIEW) {
            if let Some(old) = self.view_record(r).map(|v| v.old_view).filter(|v| *v != JOINED) {
                final_seq.insert(old, r.seq);
            }
        }
        self.records
            .iter()
            .filter(|r| r.kind == KIND_MESSAGE && final_seq.get(&r.view).is_none_or(|f| r.seq < *f))
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

    /// Where this log stopped; `initial_members` is the first view's
    /// membership (it has no view record).
    pub fn summary(&self, initial_members: u64) -> LogSummary {
        let mut s = LogSummary {
            last_members: initial_members,
            records: self.records.len() as u64,
            ..LogSummary::default()
        };
        for r in &self.records {
            if let Some(v) = self.view_record(r) {
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
    let mut bytes = Vec::new();
    File::open(path)
        .map_err(io("open for recovery"))?
        .read_to_end(&mut bytes)
        .map_err(io("read"))?;
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
    if version != FILE_VERSION {
        return Err(PersistError::Format {
            path: path.to_path_buf(),
            reason: format!("log version {version}, this build reads version {FILE_VERSION}"),
        });
    }
    log.rank = u32_at(&bytes, 12);
    let mut at = FILE_HEADER_BYTES;
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
                    offset: at as u64,
                    bytes: (bytes.len() - at) as u64,
                    reason,
                    valid_records_after,
                });
                break;
            }
        }
    }
    log.valid_bytes = at.min(bytes.len()) as u64;
    bytes.truncate(log.valid_bytes as usize);
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
    if kind != KIND_MESSAGE && kind != KIND_VIEW {
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
}

struct Pending {
    bytes: Vec<u8>,
    frontier: Frontier,
    stop: bool,
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
            }),
            work: Condvar::new(),
            file: Mutex::new(file),
            durable: Mutex::new((Frontier::default(), None)),
            path: path.to_path_buf(),
            wake,
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("spindle-log-{rank}"))
            .spawn(move || sync_loop(&for_thread))
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
        })
    }

    fn with_backend(backend: Backend) -> PersistLog {
        PersistLog {
            backend,
            staging: Vec::with_capacity(1 << 20),
            spare: Vec::with_capacity(1 << 20),
            staged_frontier: Frontier::default(),
            failed: None,
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

    /// Simulator: make everything committed durable.
    pub fn sim_sync(&mut self) {
        if let Backend::Memory {
            appended,
            durable_bytes,
            frontier,
            durable,
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

    /// The file's path (file logs).
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::File { shared, .. } => Some(&shared.path),
            Backend::Memory { .. } => None,
        }
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
fn sync_loop(shared: &Shared) {
    let mut batch: Vec<u8> = Vec::with_capacity(1 << 20);
    loop {
        let Ok(mut p) = shared.pending.lock() else { return };
        while p.bytes.is_empty() && !p.stop {
            p = match shared.work.wait(p) {
                Ok(p) => p,
                Err(_) => return,
            };
        }
        if p.bytes.is_empty() && p.stop {
            return;
        }
        std::mem::swap(&mut p.bytes, &mut batch);
        let frontier = p.frontier;
        let Ok(file) = shared.file.lock() else { return };
        drop(p);
        if write_and_sync(shared, file, &mut batch, frontier).is_err() {
            return;
        }
    }
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
