//! The tcp member's stat file: its rows, visible to `spindle stat` on the
//! same host without the member's cooperation.
//!
//! A tcp member keeps every row (its own and its copies of the peers')
//! in one allocation. With [`super::TcpOptions::stat_dir`] set (`spindle
//! run` and the bench set `/dev/shm`), that allocation is a shared mapping of the file
//! `<stat_dir>/spindle@tcp-<group>@<rank>` (mode 0600) behind a 4 KiB
//! header, so a reader maps the file and sees the member's rows live:
//! nothing is copied, nothing is sent. (`@` is not allowed in group
//! names, so the name never collides with an shm group file.)
//!
//! ```text
//!  header, 4096 bytes, native endian (read on the same host)
//!  +0    magic u64 = "SPNDLTST"        +40  started_unix_ns u64
//!  +8    version u32 = 1               +48  group_len u32
//!  +12   rank u32                      +52  description_len u32
//!  +16   member_count u32              +56  peer status [64] (u8 each:
//!  +20   pid u32                             0 connected, 1 left, 2 gone,
//!  +24   row_len_bytes u64                   3 fault, 4 waiting)
//!  +32   layout_tag u64                +120 zero [8]
//!  +128  group name [64], NUL-padded   +192 layout description [1024]
//!  +1216 handshakes_failed u64: accepted connections that failed the
//!        handshake (strangers, wrong keys, timeouts), counted since open
//!  +1224 handshakes_pending u64: accepted connections in handshake now
//!  +4096 rows: member_count × row_len_bytes (this member's view)
//! ```
//!
//! **Liveness**: the member holds an exclusive `flock` on the file for its
//! life and unlinks it when it closes; a reader whose shared `flock`
//! succeeds is looking at a member that crashed (the file is stale).
//! Every field is written before `magic` is stored with `Release`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::{FabricError, RowRef, MEMBERS_MAX};

/// Bytes before the rows (a page: the rows stay page- and line-aligned).
pub const STAT_HEADER_BYTES: usize = 4096;
/// Longest layout description kept (longer ones are cut).
pub const STAT_DESCRIPTION_BYTES_MAX: usize = 1024;
const GROUP_BYTES_MAX: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"SPNDLTST");
const VERSION: u32 = 1;
/// File name prefix; the group and `@<rank>` follow.
pub const STAT_FILE_PREFIX: &str = "spindle@tcp-";

/// The header (see the module docs).
#[repr(C)]
pub struct StatHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub rank: AtomicU32,
    pub member_count: AtomicU32,
    pub pid: AtomicU32,
    pub row_len_bytes: AtomicU64,
    pub layout_tag: AtomicU64,
    pub started_unix_ns: AtomicU64,
    pub group_len: AtomicU32,
    pub description_len: AtomicU32,
    pub peer_status: [AtomicU8; MEMBERS_MAX],
    _zero: [u8; 8],
    group: [AtomicU8; GROUP_BYTES_MAX],
    description: [AtomicU8; STAT_DESCRIPTION_BYTES_MAX],
    pub handshakes_failed: AtomicU64,
    pub handshakes_pending: AtomicU64,
}

const _: () = assert!(std::mem::offset_of!(StatHeader, peer_status) == 56);
const _: () = assert!(std::mem::offset_of!(StatHeader, group) == 128);
const _: () = assert!(std::mem::offset_of!(StatHeader, description) == 192);
const _: () = assert!(std::mem::offset_of!(StatHeader, handshakes_failed) == 1216);
const _: () = assert!(std::mem::offset_of!(StatHeader, handshakes_pending) == 1224);
const _: () = assert!(std::mem::size_of::<StatHeader>() <= STAT_HEADER_BYTES);
const _: () = assert!(STAT_HEADER_BYTES.is_multiple_of(crate::CACHE_LINE_BYTES));
const _: () = assert!(super::handshake::GROUP_NAME_BYTES_MAX <= GROUP_BYTES_MAX);

/// The path of `group`'s member `rank`'s stat file in `dir`.
pub fn stat_file_path(dir: &Path, group: &str, rank: usize) -> PathBuf {
    dir.join(format!("{STAT_FILE_PREFIX}{group}@{rank}"))
}

/// The member's side: the created, locked and mapped file.
pub struct StatFile {
    path: PathBuf,
    _file: File,
    map: memmap2::MmapRaw,
}

/// What the header says about the member.
pub struct StatIdentity<'a> {
    pub group: &'a str,
    pub rank: usize,
    pub member_count: usize,
    pub row_len_bytes: usize,
    pub layout_tag: u64,
    pub description: &'a str,
}

impl StatFile {
    /// Create (or take over a stale) stat file sized for the rows, lock
    /// it, map it and write the header. The rows read as zeros.
    pub fn create(dir: &Path, id: &StatIdentity<'_>) -> Result<StatFile, FabricError> {
        let path = stat_file_path(dir, id.group, id.rank);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| FabricError::io(format!("create the stat file {}", path.display()), e))?;
        if !flock(&file, libc::LOCK_EX | libc::LOCK_NB)
            .map_err(|e| FabricError::io(format!("lock {}", path.display()), e))?
        {
            let pid = StatReader::open(&path)
                .map(|r| r.header().pid.load(Ordering::Relaxed))
                .unwrap_or(0);
            return Err(FabricError::RankTaken {
                group: id.group.to_string(),
                rank: id.rank,
                pid,
            });
        }
        let len = STAT_HEADER_BYTES + id.member_count * id.row_len_bytes;
        // Truncating to 0 first zeroes whatever a stale file held.
        file.set_len(0)
            .and_then(|_| file.set_len(len as u64))
            .map_err(|e| FabricError::io(format!("size {} to {len} bytes", path.display()), e))?;
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| FabricError::io(format!("mmap {}", path.display()), e))?;
        let stat = StatFile { path, _file: file, map };
        let h = stat.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.rank.store(id.rank as u32, Ordering::Relaxed);
        h.member_count.store(id.member_count as u32, Ordering::Relaxed);
        h.pid.store(std::process::id(), Ordering::Relaxed);
        h.row_len_bytes.store(id.row_len_bytes as u64, Ordering::Relaxed);
        h.layout_tag.store(id.layout_tag, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        h.started_unix_ns.store(now, Ordering::Relaxed);
        let group = &id.group.as_bytes()[..id.group.len().min(GROUP_BYTES_MAX)];
        for (i, b) in group.iter().enumerate() {
            h.group[i].store(*b, Ordering::Relaxed);
        }
        h.group_len.store(group.len() as u32, Ordering::Relaxed);
        let description = &id.description.as_bytes()[..id.description.len().min(STAT_DESCRIPTION_BYTES_MAX)];
        for (i, b) in description.iter().enumerate() {
            h.description[i].store(*b, Ordering::Relaxed);
        }
        h.description_len.store(description.len() as u32, Ordering::Relaxed);
        // Partner: the Acquire load of `magic` in StatReader::open.
        h.magic.store(MAGIC, Ordering::Release);
        Ok(stat)
    }

    pub fn header(&self) -> &StatHeader {
        // SAFETY: the mapping holds at least STAT_HEADER_BYTES (>= the
        // header's size), is page-aligned, and lives as long as self;
        // StatHeader is all atomics.
        unsafe { &*(self.map.as_ptr() as *const StatHeader) }
    }

    /// The first row: 64-aligned, `member_count × row_len_bytes` bytes.
    pub fn rows_ptr(&self) -> NonNull<u8> {
        // SAFETY: the mapping is longer than the header.
        NonNull::new(unsafe { self.map.as_mut_ptr().add(STAT_HEADER_BYTES) }).expect("mapped")
    }
}

impl Drop for StatFile {
    fn drop(&mut self) {
        // Unlink while still holding the lock (a reader never sees a
        // half-gone member as crashed); the mapping goes with `map`.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A reader's side (`spindle stat`): one member's file, mapped read-only.
pub struct StatReader {
    pub path: PathBuf,
    map: memmap2::MmapRaw,
    /// Whether the member holds its lock (false: it crashed).
    pub live: bool,
}

impl StatReader {
    /// Every tcp stat file in `dir` (of `group` only, if given), by group
    /// then rank; files that are not (or no longer) valid are skipped.
    pub fn list(dir: &Path, group: Option<&str>) -> Result<Vec<StatReader>, FabricError> {
        let mut found = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| FabricError::io(format!("list {}", dir.display()), e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(STAT_FILE_PREFIX) else {
                continue;
            };
            let Some((g, _rank)) = rest.rsplit_once('@') else {
                continue;
            };
            if group.is_some_and(|want| want != g) {
                continue;
            }
            if let Ok(r) = StatReader::open(&entry.path()) {
                found.push(r);
            }
        }
        found.sort_by_key(|r| (r.group(), r.rank()));
        Ok(found)
    }

    /// Map one stat file read-only and check its header.
    pub fn open(path: &Path) -> Result<StatReader, FabricError> {
        let file = File::open(path).map_err(|e| FabricError::io(format!("open {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| FabricError::io(format!("stat {}", path.display()), e))?
            .len() as usize;
        let bad = |what: String| FabricError::InvalidOption(format!("{}: {what}", path.display()));
        if len < STAT_HEADER_BYTES {
            return Err(bad(format!("{len} bytes, shorter than a stat header")));
        }
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_raw_read_only(&file)
            .map_err(|e| FabricError::io(format!("mmap {}", path.display()), e))?;
        let live = !flock(&file, libc::LOCK_SH | libc::LOCK_NB).unwrap_or(false);
        let reader = StatReader {
            path: path.to_path_buf(),
            map,
            live,
        };
        let h = reader.header();
        // Partner: the Release store of `magic` in StatFile::create.
        if h.magic.load(Ordering::Acquire) != MAGIC || h.version.load(Ordering::Relaxed) != VERSION {
            return Err(bad("not a Spindle tcp stat file of this version".into()));
        }
        let members = h.member_count.load(Ordering::Relaxed) as usize;
        let row_len = h.row_len_bytes.load(Ordering::Relaxed) as usize;
        if members == 0 || members > MEMBERS_MAX || !row_len.is_multiple_of(crate::CACHE_LINE_BYTES) {
            return Err(bad(format!("{members} members of {row_len} bytes")));
        }
        let need = members
            .checked_mul(row_len)
            .and_then(|r| r.checked_add(STAT_HEADER_BYTES))
            .ok_or_else(|| bad("rows overflow".into()))?;
        if len < need || reader.rank() >= members {
            return Err(bad(format!(
                "{len} bytes for {members} rows of {row_len} bytes, rank {}",
                reader.rank()
            )));
        }
        Ok(reader)
    }

    pub fn header(&self) -> &StatHeader {
        // SAFETY: at least STAT_HEADER_BYTES mapped (checked in open),
        // page-aligned, alive as long as self; all fields are atomics.
        unsafe { &*(self.map.as_ptr() as *const StatHeader) }
    }

    pub fn rank(&self) -> usize {
        self.header().rank.load(Ordering::Relaxed) as usize
    }

    pub fn member_count(&self) -> usize {
        self.header().member_count.load(Ordering::Relaxed) as usize
    }

    pub fn group(&self) -> String {
        let h = self.header();
        let n = (h.group_len.load(Ordering::Relaxed) as usize).min(GROUP_BYTES_MAX);
        let bytes: Vec<u8> = h.group[..n].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn layout_description(&self) -> String {
        let h = self.header();
        let n = (h.description_len.load(Ordering::Relaxed) as usize).min(STAT_DESCRIPTION_BYTES_MAX);
        let bytes: Vec<u8> = h.description[..n].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Accepted connections that failed the handshake since the member
    /// opened (strangers, wrong keys, timeouts), and those in handshake now.
    pub fn handshakes(&self) -> (u64, u64) {
        let h = self.header();
        (
            h.handshakes_failed.load(Ordering::Relaxed),
            h.handshakes_pending.load(Ordering::Relaxed),
        )
    }

    /// This member's view of `rank`'s connection: "self", "connected",
    /// "left", "gone", "fault" or "waiting".
    pub fn peer_state(&self, rank: usize) -> &'static str {
        if rank == self.rank() {
            return "self";
        }
        match self.header().peer_status[rank % MEMBERS_MAX].load(Ordering::Relaxed) {
            0 => "connected",
            1 => "left",
            2 => "gone",
            3 => "fault",
            _ => "waiting",
        }
    }

    /// The member's copy of `rank`'s row (its own row for its rank).
    pub fn row(&self, rank: usize) -> RowRef<'_> {
        assert!(rank < self.member_count(), "rank {rank} out of range");
        let row_len = self.header().row_len_bytes.load(Ordering::Relaxed) as usize;
        // SAFETY: open checked that the mapping holds the header and every
        // row; the rows start page-aligned, row_len is a multiple of 64,
        // and the RowRef borrows self (the mapping outlives it). The member
        // writes the rows with atomics only (tcp module docs).
        unsafe {
            RowRef::new(
                NonNull::new_unchecked(self.map.as_ptr().add(STAT_HEADER_BYTES + rank * row_len) as *mut u8),
                row_len,
            )
        }
    }
}

/// `flock`; Ok(false) when it would block (someone else holds it).
fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: a valid open fd for the call; flock has no memory
        // arguments.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}
