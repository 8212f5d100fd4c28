//! The shared-memory fabric: every member of a group on one host maps one
//! file, `/dev/shm/spindle-<group>` (mode 0600). Each row is written only
//! by its owner and read in place by the others, so a push is ordering
//! only: zero copies.
//!
//! ## File layout
//!
//! ```text
//!  offset 0 ┌──────────────────────────────────────────────── ShmHeader (4096 B)
//!           │ +0    magic u64 = "SPNDLSHM"   +8 version u32  +12 member_count u32
//!           │ +16   row_len_bytes u64        +24 layout_tag u64
//!           │ +32   created_unix_ns u64      +40 init_complete u32, pad u32
//!           │ +48   pad to 64
//!           │ +64   doorbell_seq u32  +68 doorbell_sleepers u32   (own line)
//!           │ +128  member slots [64 × MemberSlot (32 B)]:
//!           │         pid u32, state u32 (0 empty, 1 running, 2 left),
//!           │         joined_unix_ns u64, left_unix_ns u64, pad u64
//!           │ +2176 layout description, NUL-padded (up to 1920 B)
//!  offset 4096 ├─────────────────────────────────────────────── row 0
//!           │ row_len_bytes (multiple of 64), written only by member 0
//!           ├─────────────────────────────────────────────── row 1 …
//! ```
//!
//! ## Liveness without cooperation: open-file-description locks
//!
//! Byte locks (not file contents) mark who is alive, and the kernel drops
//! them when a process dies, however it dies:
//!
//! | lock byte | held as | by | meaning |
//! |---|---|---|---|
//! | 0 | write, briefly | a member opening or closing | serializes setup |
//! | 1 | read, for life | every live member | "the group is live" |
//! | 2 + rank | write, for life | member `rank` | "rank is taken and alive" |
//!
//! A member that can take byte 1 for *writing* knows nobody is alive: any
//! existing file is stale (a crashed run) and is re-initialized, and the
//! recovery is reported in [`ShmFabric::recovered_stale`]. A member whose
//! slot says *running* but whose byte `2 + rank` is unlocked has crashed:
//! [`Fabric::check_peers`] reports "member N is gone". The last member to
//! close removes the file.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::doorbell::{Doorbell, FutexDoorbell};
use crate::{check_range, Fabric, FabricError, PeerSet, RowRef, CACHE_LINE_BYTES, MEMBERS_MAX};

const MAGIC: u64 = u64::from_le_bytes(*b"SPNDLSHM");
const VERSION: u32 = 1;
/// Bytes before row 0.
pub const HEADER_BYTES: usize = 4096;
const SLOT_EMPTY: u32 = 0;
const SLOT_RUNNING: u32 = 1;
const SLOT_LEFT: u32 = 2;
const LOCK_SETUP: i64 = 0;
const LOCK_LIVE: i64 = 1;
const LOCK_RANK_BASE: i64 = 2;
const DESCRIPTION_BYTES_MAX: usize = HEADER_BYTES - 2176;

/// One member's entry in the header (see the module diagram).
#[repr(C)]
pub struct MemberSlot {
    pub pid: AtomicU32,
    pub state: AtomicU32,
    pub joined_unix_ns: AtomicU64,
    pub left_unix_ns: AtomicU64,
    _pad: u64,
}

/// The file's first page (see the module diagram).
#[repr(C, align(64))]
pub struct ShmHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub member_count: AtomicU32,
    pub row_len_bytes: AtomicU64,
    pub layout_tag: AtomicU64,
    pub created_unix_ns: AtomicU64,
    pub init_complete: AtomicU32,
    _pad0: [u32; 5],
    doorbell_seq: AtomicU32,
    doorbell_sleepers: AtomicU32,
    _pad1: [u32; 14],
    pub members: [MemberSlot; MEMBERS_MAX],
    description: std::cell::UnsafeCell<[u8; DESCRIPTION_BYTES_MAX]>,
}

const _: () = assert!(std::mem::size_of::<MemberSlot>() == 32);
const _: () = assert!(std::mem::size_of::<ShmHeader>() == HEADER_BYTES);
const _: () = assert!(std::mem::offset_of!(ShmHeader, doorbell_seq) == 64);
const _: () = assert!(std::mem::offset_of!(ShmHeader, members) == 128);
const _: () = assert!(std::mem::offset_of!(ShmHeader, description) == 2176);

/// What a member needs to open (or create) a group's file.
#[derive(Clone, Debug)]
pub struct ShmOptions {
    /// Group name; the file is `<dir>/spindle-<group>`.
    pub group: String,
    pub member_count: usize,
    /// Bytes per row; rounded up to a cache line.
    pub row_len_bytes: usize,
    /// A fingerprint of the layer above's row layout: members that
    /// disagree refuse to share a file.
    pub layout_tag: u64,
    /// Human description of the layout, shown on a mismatch and by `stat`.
    pub layout_description: String,
    /// Directory of the file (default `/dev/shm`).
    pub dir: PathBuf,
}

impl ShmOptions {
    pub fn new(group: &str, member_count: usize, row_len_bytes: usize, layout_tag: u64) -> ShmOptions {
        ShmOptions {
            group: group.to_string(),
            member_count,
            row_len_bytes,
            layout_tag,
            layout_description: format!("members={member_count} row_len_bytes={row_len_bytes} tag={layout_tag:#x}"),
            dir: PathBuf::from("/dev/shm"),
        }
    }

    /// The file this group lives in.
    pub fn path(&self) -> PathBuf {
        group_file_path(&self.dir, &self.group)
    }
}

/// `<dir>/spindle-<group>`.
pub fn group_file_path(dir: &Path, group: &str) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{group}"))
}

/// Prefix of every group file (used by `spindle stat` to list groups).
pub const FILE_PREFIX: &str = "spindle-";

/// Check a group name: 1..=48 of `[A-Za-z0-9_.-]`, not starting with '.'.
pub fn validate_group_name(name: &str) -> Result<(), FabricError> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(FabricError::InvalidGroupName { name: name.to_string() })
    }
}

/// A member's mapping of its group's file.
pub struct ShmFabric {
    rank: usize,
    member_count: usize,
    row_len_bytes: usize,
    path: PathBuf,
    file: File,
    map: memmap2::MmapRaw,
    doorbell: FutexDoorbell,
    recovered_stale: Option<String>,
}

impl ShmFabric {
    /// Open the group's file as member `rank`, creating it (or replacing a
    /// stale one from a crashed run) when no member is alive.
    pub fn open(options: &ShmOptions, rank: usize) -> Result<ShmFabric, FabricError> {
        validate_group_name(&options.group)?;
        if options.member_count == 0 || options.member_count > MEMBERS_MAX {
            return Err(FabricError::InvalidOption(format!(
                "member_count {} must be in 1..={MEMBERS_MAX}",
                options.member_count
            )));
        }
        if rank >= options.member_count {
            return Err(FabricError::RankOutOfRange {
                rank,
                member_count: options.member_count,
            });
        }
        if options.row_len_bytes == 0 || options.row_len_bytes > (1 << 34) {
            return Err(FabricError::InvalidOption(format!(
                "row_len_bytes {} must be in 1..=16 GiB",
                options.row_len_bytes
            )));
        }
        let row_len_bytes = options.row_len_bytes.next_multiple_of(CACHE_LINE_BYTES);
        let path = options.path();
        let total_bytes = HEADER_BYTES + row_len_bytes * options.member_count;
        let (file, result) = Self::open_current_file(&path, |file| {
            Self::open_locked(options, rank, row_len_bytes, total_bytes, &path, file)
        })?;
        let (map, recovered_stale) = result?;
        // SAFETY: the header lies at the start of the mapping (which is at
        // least HEADER_BYTES long, page-aligned), and lives as long as
        // `map`, which the fabric owns alongside the doorbell.
        let doorbell = unsafe {
            let header = &*(map.as_ptr() as *const ShmHeader);
            FutexDoorbell::in_shared_memory(&header.doorbell_seq, &header.doorbell_sleepers)
        };
        Ok(ShmFabric {
            rank,
            member_count: options.member_count,
            row_len_bytes,
            path,
            file,
            map,
            doorbell,
            recovered_stale,
        })
    }

    /// Open the file at `path` and run `setup` under the setup lock, on the
    /// file that is *still* at `path` once the lock is held: the last member
    /// of a previous group may have removed it meanwhile, and joining an
    /// unlinked file would split the group. On failure every lock this
    /// member took is released explicitly (not only at close, which a
    /// concurrently forked child could delay).
    fn open_current_file<T>(
        path: &Path,
        setup: impl Fn(&File) -> Result<T, FabricError>,
    ) -> Result<(File, Result<T, FabricError>), FabricError> {
        const ATTEMPTS_MAX: usize = 16;
        for _ in 0..ATTEMPTS_MAX {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| FabricError::io(format!("open {}", path.display()), e))?;
            lock(&file, LOCK_SETUP, LockKind::Write, Wait::Block)
                .map_err(|e| FabricError::io(format!("lock {}", path.display()), e))?;
            let same = match (file.metadata(), std::fs::symlink_metadata(path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if !same {
                let _ = lock(&file, LOCK_SETUP, LockKind::Unlock, Wait::NoWait);
                continue;
            }
            let result = setup(&file);
            if result.is_err() {
                let _ = lock(&file, LOCK_LIVE, LockKind::Unlock, Wait::NoWait);
            }
            let _ = lock(&file, LOCK_SETUP, LockKind::Unlock, Wait::NoWait);
            return Ok((file, result));
        }
        Err(FabricError::InvalidOption(format!(
            "{} kept being replaced while opening it ({ATTEMPTS_MAX} attempts)",
            path.display()
        )))
    }

    fn open_locked(
        options: &ShmOptions,
        rank: usize,
        row_len_bytes: usize,
        total_bytes: usize,
        path: &Path,
        file: &File,
    ) -> Result<(memmap2::MmapRaw, Option<String>), FabricError> {
        let ctx = |what: &str| format!("{what} {}", path.display());
        let nobody_alive =
            lock(file, LOCK_LIVE, LockKind::Write, Wait::NoWait).map_err(|e| FabricError::io(ctx("lock"), e))?;
        let mut recovered_stale = None;
        if nobody_alive {
            recovered_stale = describe_stale(file);
            file.set_len(0).map_err(|e| FabricError::io(ctx("truncate"), e))?;
            file.set_len(total_bytes as u64)
                .map_err(|e| FabricError::io(ctx("size"), e))?;
        }
        // Held for life; replaces our write lock when we took one.
        let live = lock(file, LOCK_LIVE, LockKind::Read, Wait::NoWait).map_err(|e| FabricError::io(ctx("lock"), e))?;
        assert!(live, "setup lock held: nobody can hold the live byte for writing");

        let meta = file.metadata().map_err(|e| FabricError::io(ctx("stat"), e))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid || meta.mode() & 0o077 != 0 {
            return Err(FabricError::InvalidOption(format!(
                "refusing {}: it belongs to uid {} with mode {:o}, expected uid {euid} and mode 600",
                path.display(),
                meta.uid(),
                meta.mode() & 0o777
            )));
        }
        let file_len = meta.len() as usize;
        if file_len < HEADER_BYTES {
            return Err(FabricError::LayoutMismatch {
                group: options.group.clone(),
                found: format!("a file of {file_len} bytes"),
                expected: options.layout_description.clone(),
            });
        }
        let map = memmap2::MmapOptions::new()
            .len(file_len)
            .map_raw(file)
            .map_err(|e| FabricError::io(ctx("mmap"), e))?;
        // SAFETY: the mapping is at least HEADER_BYTES (checked above),
        // page-aligned, and outlives this borrow.
        let header = unsafe { &*(map.as_ptr() as *const ShmHeader) };
        if nobody_alive {
            init_header(header, options, row_len_bytes);
        } else {
            check_header(header, options, row_len_bytes, file_len, total_bytes)?;
        }
        let slot = &header.members[rank];
        if !lock(file, LOCK_RANK_BASE + rank as i64, LockKind::Write, Wait::NoWait)
            .map_err(|e| FabricError::io(ctx("lock"), e))?
        {
            return Err(FabricError::RankTaken {
                group: options.group.clone(),
                rank,
                // Acquire: pairs with the Release store of `state` in the
                // holder's `open_locked` (which publishes its pid).
                pid: slot.pid.load(Ordering::Acquire),
            });
        }
        // Zero our row before announcing it: a rank restarted into a live
        // file must not expose its predecessor's counters.
        // SAFETY: the row lies inside the mapping (total_bytes checked), no
        // other process writes it (we hold the rank lock) and nobody reads
        // it meaningfully until `state` says running (Release below).
        unsafe {
            std::ptr::write_bytes(
                map.as_mut_ptr().add(HEADER_BYTES + rank * row_len_bytes),
                0,
                row_len_bytes,
            );
        }
        slot.pid.store(std::process::id(), Ordering::Relaxed);
        slot.joined_unix_ns.store(unix_ns(), Ordering::Relaxed);
        slot.left_unix_ns.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire loads of `state` in `joined`,
        // `check_peers`, `lost_peers` and `GroupFile::member_state` (publishes
        // the zeroed row, the pid and the join time).
        slot.state.store(SLOT_RUNNING, Ordering::Release);
        Ok((map, recovered_stale))
    }

    /// If this member replaced a stale file from a crashed run, what it found.
    pub fn recovered_stale(&self) -> Option<&str> {
        self.recovered_stale.as_deref()
    }

    /// The group's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header of the group's file.
    pub fn header(&self) -> &ShmHeader {
        // SAFETY: the mapping starts with the header and lives as long as self.
        unsafe { &*(self.map.as_ptr() as *const ShmHeader) }
    }
}

fn init_header(header: &ShmHeader, options: &ShmOptions, row_len_bytes: usize) {
    header.version.store(VERSION, Ordering::Relaxed);
    header
        .member_count
        .store(options.member_count as u32, Ordering::Relaxed);
    header.row_len_bytes.store(row_len_bytes as u64, Ordering::Relaxed);
    header.layout_tag.store(options.layout_tag, Ordering::Relaxed);
    header.created_unix_ns.store(unix_ns(), Ordering::Relaxed);
    let description = options.layout_description.as_bytes();
    let n = description.len().min(DESCRIPTION_BYTES_MAX - 1);
    // SAFETY: the description lies inside the header, behind an
    // UnsafeCell; nobody else touches the header while we hold the setup
    // lock and nobody is live, and n < its length.
    unsafe {
        let dst = header.description.get() as *mut u8;
        std::ptr::copy_nonoverlapping(description.as_ptr(), dst, n);
    }
    header.init_complete.store(1, Ordering::Relaxed);
    // Release: pairs with the Acquire loads of `magic` in `check_header`,
    // `describe_stale` and `GroupFile::open` (publishes the header fields
    // and the description above).
    header.magic.store(MAGIC, Ordering::Release);
}

fn check_header(
    header: &ShmHeader,
    options: &ShmOptions,
    row_len_bytes: usize,
    file_len: usize,
    total_bytes: usize,
) -> Result<(), FabricError> {
    // Acquire: pairs with the Release store of `magic` in `init_header`
    // (the fields below and the description).
    let matches = header.magic.load(Ordering::Acquire) == MAGIC
        && header.version.load(Ordering::Relaxed) == VERSION
        && header.member_count.load(Ordering::Relaxed) as usize == options.member_count
        && header.row_len_bytes.load(Ordering::Relaxed) as usize == row_len_bytes
        && header.layout_tag.load(Ordering::Relaxed) == options.layout_tag
        && file_len >= total_bytes;
    if matches {
        Ok(())
    } else {
        Err(FabricError::LayoutMismatch {
            group: options.group.clone(),
            found: describe_header(header),
            expected: options.layout_description.clone(),
        })
    }
}

/// The layout description stored in a header.
pub fn describe_header(header: &ShmHeader) -> String {
    // SAFETY: the description is written once, before `magic` is
    // published (Release), and only read afterwards.
    let bytes = unsafe { &*header.description.get() };
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// What a stale file held, if it was a real group left by a crash.
fn describe_stale(file: &File) -> Option<String> {
    let len = file.metadata().ok()?.len() as usize;
    if len < HEADER_BYTES {
        return None;
    }
    let map = memmap2::MmapOptions::new()
        .len(HEADER_BYTES)
        .map_raw_read_only(file)
        .ok()?;
    // SAFETY: HEADER_BYTES mapped; nobody is alive to write it.
    let header = unsafe { &*(map.as_ptr() as *const ShmHeader) };
    // Acquire: pairs with the Release store of `magic` in `init_header`.
    if header.magic.load(Ordering::Acquire) != MAGIC {
        return Some("a file that is not a Spindle group (no magic); replaced it".to_string());
    }
    let crashed: Vec<String> = header
        .members
        .iter()
        .enumerate()
        .filter(|(_, s)| s.state.load(Ordering::Relaxed) == SLOT_RUNNING)
        .map(|(rank, s)| format!("member {rank} (pid {})", s.pid.load(Ordering::Relaxed)))
        .collect();
    if crashed.is_empty() {
        Some("a file left by a run that did not clean up; replaced it".to_string())
    } else {
        Some(format!(
            "a stale file from a crashed run ({} never closed); replaced it",
            crashed.join(", ")
        ))
    }
}

impl Fabric for ShmFabric {
    fn member_rank(&self) -> usize {
        self.rank
    }

    fn member_count(&self) -> usize {
        self.member_count
    }

    fn row_len_bytes(&self) -> usize {
        self.row_len_bytes
    }

    #[inline(always)]
    fn row(&self, rank: usize) -> RowRef<'_> {
        assert!(rank < self.member_count, "rank {rank} >= {}", self.member_count);
        // SAFETY: the mapping covers HEADER_BYTES + member_count rows
        // (checked at open), rows start at multiples of 64 from a
        // page-aligned base, and the mapping outlives the borrow of self.
        unsafe {
            let base = self.map.as_mut_ptr().add(HEADER_BYTES + rank * self.row_len_bytes);
            RowRef::new(NonNull::new_unchecked(base), self.row_len_bytes)
        }
    }

    #[inline(always)]
    /// The push's `Release` store is in memory the peer maps: complete
    /// once `push` returned.
    fn pushes_completed(&self, _rank: usize) -> Option<bool> {
        Some(true)
    }

    fn push(&self, range: Range<usize>, _peers: PeerSet) -> Result<(), FabricError> {
        check_range(&range, self.row_len_bytes)?;
        // Rows are read in place: a push is ordering only.
        // Release: pairs with the Acquire loads of guards by peers reading
        // this row (publishes the bytes written before the push).
        fence(Ordering::Release);
        Ok(())
    }

    fn check_peers(&self) -> Result<(), FabricError> {
        let header = self.header();
        for rank in (0..self.member_count).filter(|r| *r != self.rank) {
            // Acquire: pairs with the Release stores of `state` in
            // `open_locked` (running) and `drop` (left).
            match header.members[rank].state.load(Ordering::Acquire) {
                SLOT_LEFT => return Err(FabricError::PeerLeft { rank }),
                SLOT_RUNNING => {
                    let held = lock_held(&self.file, LOCK_RANK_BASE + rank as i64)
                        .map_err(|e| FabricError::io(format!("probe lock of member {rank}"), e))?;
                    // The slot still says running: re-read it, since a clean
                    // leave sets `left` before releasing the lock. Acquire:
                    // pairs with the Release store of SLOT_LEFT in `drop`.
                    if !held && header.members[rank].state.load(Ordering::Acquire) == SLOT_RUNNING {
                        return Err(FabricError::PeerGone { rank });
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn lost_peers(&self) -> PeerSet {
        let header = self.header();
        let mut lost = 0u64;
        for rank in (0..self.member_count).filter(|r| *r != self.rank) {
            // Acquire: pairs with the Release stores of `state` in
            // `open_locked` (running) and `drop` (left).
            match header.members[rank].state.load(Ordering::Acquire) {
                SLOT_LEFT => lost |= 1 << rank,
                SLOT_RUNNING => {
                    // A failed probe counts as alive: suspicion by heartbeat
                    // still catches a member that is really gone.
                    let held = lock_held(&self.file, LOCK_RANK_BASE + rank as i64).unwrap_or(true);
                    // Acquire: pairs with the Release store of SLOT_LEFT in `drop`.
                    if !held && header.members[rank].state.load(Ordering::Acquire) == SLOT_RUNNING {
                        lost |= 1 << rank;
                    }
                }
                _ => {}
            }
        }
        PeerSet(lost)
    }

    fn joined(&self) -> PeerSet {
        let header = self.header();
        let mut set = 0u64;
        for rank in 0..self.member_count {
            // Acquire: pairs with the Release store of SLOT_RUNNING in
            // `open_locked` (the member's zeroed row and pid).
            if header.members[rank].state.load(Ordering::Acquire) != SLOT_EMPTY {
                set |= 1 << rank;
            }
        }
        PeerSet(set)
    }

    fn doorbell(&self) -> &dyn Doorbell {
        &self.doorbell
    }

    fn describe(&self) -> String {
        format!("shm:{}", self.path.display())
    }
}

impl Drop for ShmFabric {
    fn drop(&mut self) {
        let slot = &self.header().members[self.rank];
        slot.left_unix_ns.store(unix_ns(), Ordering::Relaxed);
        // Release: pairs with the Acquire loads of `state` in peers'
        // `check_peers` / `lost_peers` and `GroupFile::member_state`
        // (publishes the leave time).
        slot.state.store(SLOT_LEFT, Ordering::Release);
        self.doorbell.ring();
        // The last member out removes the file. Holding the setup lock
        // keeps joiners out while we look.
        let _ = lock(&self.file, LOCK_SETUP, LockKind::Write, Wait::Block);
        let _ = lock(
            &self.file,
            LOCK_RANK_BASE + self.rank as i64,
            LockKind::Unlock,
            Wait::NoWait,
        );
        let _ = lock(&self.file, LOCK_LIVE, LockKind::Unlock, Wait::NoWait);
        if let Ok(true) = lock(&self.file, LOCK_LIVE, LockKind::Write, Wait::NoWait) {
            let _ = std::fs::remove_file(&self.path);
            let _ = lock(&self.file, LOCK_LIVE, LockKind::Unlock, Wait::NoWait);
        }
        let _ = lock(&self.file, LOCK_SETUP, LockKind::Unlock, Wait::NoWait);
    }
}

/// A group file found on this host, for `spindle stat`.
pub struct GroupFile {
    pub group: String,
    pub path: PathBuf,
    map: memmap2::MmapRaw,
    pub live: bool,
}

impl GroupFile {
    /// Every `spindle-*` file in `dir`, mapped read-only, with whether any
    /// member is alive.
    pub fn list(dir: &Path) -> Result<Vec<GroupFile>, FabricError> {
        let mut groups = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| FabricError::io(format!("list {}", dir.display()), e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(group) = name.strip_prefix(FILE_PREFIX) else {
                continue;
            };
            if let Ok(g) = GroupFile::open(dir, group) {
                groups.push(g);
            }
        }
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(groups)
    }

    /// Map one group's file read-only.
    pub fn open(dir: &Path, group: &str) -> Result<GroupFile, FabricError> {
        let path = group_file_path(dir, group);
        let file = File::open(&path).map_err(|e| FabricError::io(format!("open {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| FabricError::io(format!("stat {}", path.display()), e))?
            .len() as usize;
        if len < HEADER_BYTES {
            return Err(FabricError::InvalidOption(format!(
                "{} is too short to be a group file",
                path.display()
            )));
        }
        let map = memmap2::MmapOptions::new()
            .map_raw_read_only(&file)
            .map_err(|e| FabricError::io(format!("mmap {}", path.display()), e))?;
        // SAFETY: at least HEADER_BYTES mapped.
        let header = unsafe { &*(map.as_ptr() as *const ShmHeader) };
        // Acquire: pairs with the Release store of `magic` in `init_header`.
        if header.magic.load(Ordering::Acquire) != MAGIC {
            return Err(FabricError::InvalidOption(format!(
                "{} is not a Spindle group file",
                path.display()
            )));
        }
        let member_count = header.member_count.load(Ordering::Relaxed) as usize;
        if member_count == 0 || member_count > MEMBERS_MAX {
            return Err(FabricError::InvalidOption(format!(
                "{} claims {member_count} members (1..={MEMBERS_MAX} allowed)",
                path.display()
            )));
        }
        let live = lock_held(&file, LOCK_LIVE).unwrap_or(false);
        let need = HEADER_BYTES
            + header.member_count.load(Ordering::Relaxed) as usize
                * header.row_len_bytes.load(Ordering::Relaxed) as usize;
        if len < need {
            return Err(FabricError::InvalidOption(format!(
                "{} is shorter than its header says",
                path.display()
            )));
        }
        Ok(GroupFile {
            group: group.to_string(),
            path,
            map,
            live,
        })
    }

    pub fn header(&self) -> &ShmHeader {
        // SAFETY: checked at open: at least HEADER_BYTES mapped.
        unsafe { &*(self.map.as_ptr() as *const ShmHeader) }
    }

    pub fn member_count(&self) -> usize {
        self.header().member_count.load(Ordering::Relaxed) as usize
    }

    /// Row `rank`, read-only.
    pub fn row(&self, rank: usize) -> RowRef<'_> {
        assert!(rank < self.member_count());
        let row_len = self.header().row_len_bytes.load(Ordering::Relaxed) as usize;
        // SAFETY: the file length covers every row (checked at open), the
        // mapping outlives the borrow; the view is only read.
        unsafe {
            RowRef::new(
                NonNull::new_unchecked(self.map.as_ptr().add(HEADER_BYTES + rank * row_len) as *mut u8),
                row_len,
            )
        }
    }

    /// The state of `rank`'s slot: "empty", "running", "left" or "crashed".
    pub fn member_state(&self, rank: usize) -> &'static str {
        // Acquire: pairs with the Release stores of `state` in
        // `open_locked` and `drop`.
        match self.header().members[rank].state.load(Ordering::Acquire) {
            SLOT_EMPTY => "empty",
            SLOT_LEFT => "left",
            _ if !self.live => "crashed",
            _ => "running",
        }
    }

    pub fn layout_description(&self) -> String {
        describe_header(self.header())
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[derive(Clone, Copy)]
enum LockKind {
    Read,
    Write,
    Unlock,
}

#[derive(Clone, Copy, PartialEq)]
enum Wait {
    Block,
    NoWait,
}

/// Open-file-description lock on one byte. Ok(false): held by someone else.
fn lock(file: &File, byte: i64, kind: LockKind, wait: Wait) -> io::Result<bool> {
    let mut fl = flock_for(
        byte,
        match kind {
            LockKind::Read => libc::F_RDLCK,
            LockKind::Write => libc::F_WRLCK,
            LockKind::Unlock => libc::F_UNLCK,
        },
    );
    let cmd = if wait == Wait::Block {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: valid fd for the call; `fl` is a properly initialized
        // flock that the kernel reads (and may write) during the call.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Whether anyone holds a lock on `byte` that conflicts with a write lock.
fn lock_held(file: &File, byte: i64) -> io::Result<bool> {
    let mut fl = flock_for(byte, libc::F_WRLCK);
    // SAFETY: valid fd; `fl` is initialized and written back by the kernel.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl as *mut libc::flock) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn flock_for(byte: i64, kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    fl.l_pid = 0; // required for OFD locks
    fl
}
