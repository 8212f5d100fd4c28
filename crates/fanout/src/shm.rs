//! Domains of processes: the [`Region`] of a domain mapped from a file
//! under `/dev/shm` (`spindle-fanout@NAME`), so that member processes
//! attach to its slots like threads do to a heap domain. The protocol
//! code is the same ([`State`] over the mapping); what differs is who
//! creates and checks the region, and that a slot records the pid of the
//! process attached to it (a process gone without leaving is named by
//! the origin's bounded wait, and its slot can be taken over once it is
//! reaped).
//!
//! ```text
//!  creator                                  opener
//!  open(O_CREAT|O_EXCL, 0600)               open(O_RDWR)        (missing: ShmMissing)
//!  ftruncate(size_of::<Region>()) (zeros)   fstat: size          (else ShmMismatch)
//!  mmap(MAP_SHARED)                         mmap(MAP_SHARED)
//!  header: version, region_tag, layout,     magic (Acquire) == MAGIC, version,
//!    shape, shape_k, slots, tree_hash,      region_tag, layout, shape, slots known;
//!    creator_pid; magic last (Release)      the tree rebuilt here hashes the same
//!  ...                                      ...
//!  drop: munmap, unlink                     drop: munmap
//! ```

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::plan::Layout;
use crate::state::{fnv1a, Backing, Region, State, FNV_OFFSET, REGION_SLOTS, REGION_TAG};
use crate::sync::Ordering;
use crate::topology::{Shape, Tree};
use crate::FanoutError;

/// Where domain files live (tmpfs: the mapping is memory, not disk).
pub const SHM_DIR: &str = "/dev/shm";
/// The first word of a mapped region: "SPFANOUT".
pub const MAGIC: u64 = u64::from_le_bytes(*b"SPFANOUT");
/// The region format's version.
pub const VERSION: u32 = 3;

/// The file of domain `name`.
pub fn path_of(name: &str) -> Result<PathBuf, FanoutError> {
    if name.is_empty() || name.len() > 200 || name.contains(['/', '\0']) {
        return Err(FanoutError::BadShmName { name: name.into() });
    }
    Ok(Path::new(SHM_DIR).join(format!("spindle-fanout@{name}")))
}

/// Remove domain `name`'s file (a creator that died cannot). Returns
/// whether there was one. Processes that have it mapped keep their
/// mapping.
pub fn remove(name: &str) -> Result<bool, FanoutError> {
    let path = path_of(name)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(&path, "unlink", e)),
    }
}

/// Whether process `pid` exists (a zombie does, until it is reaped).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A mapped region and its file.
pub(crate) struct Mapping {
    map: memmap2::MmapRaw,
    path: PathBuf,
    /// The creator removes the file when it drops the domain.
    creator: bool,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.creator {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Mapping {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn region(&self) -> NonNull<Region> {
        let ptr = self.map.as_mut_ptr().cast::<Region>();
        assert!(ptr.is_aligned(), "a mapping is page-aligned");
        NonNull::new(ptr).expect("a mapping is not null")
    }
}

fn io_error(path: &Path, op: &str, e: std::io::Error) -> FanoutError {
    FanoutError::ShmIo {
        path: path.display().to_string(),
        op: op.into(),
        error: e.to_string(),
    }
}

fn layout_tag(layout: Layout) -> u32 {
    match layout {
        Layout::Flat => 1,
        Layout::Tree => 2,
        Layout::TreeHelp => 3,
        Layout::TreeHelpSkip => 4,
    }
}

fn shape_tag(shape: Shape) -> (u32, u32) {
    match shape {
        Shape::Flat => (1, 0),
        Shape::Kary(k) => (2, u32::from(k)),
        Shape::Cpu => (3, 0),
    }
}

fn shape_of(tag: u32, k: u32) -> Option<Shape> {
    match (tag, k) {
        (1, 0) => Some(Shape::Flat),
        (2, k) if (2..=u32::from(u16::MAX)).contains(&k) => Some(Shape::Kary(k as u16)),
        (3, 0) => Some(Shape::Cpu),
        _ => None,
    }
}

/// The tree's fingerprint: FNV-1a of its slot count and parent array.
fn tree_hash(tree: &Tree) -> u64 {
    (0..tree.slots()).fold(fnv1a(FNV_OFFSET, tree.slots() as u64), |h, s| {
        fnv1a(h, tree.parent(s).map_or(u64::MAX, |p| p as u64))
    })
}

const REGION_BYTES: usize = std::mem::size_of::<Region>();

/// Create domain `name`'s file and map it: a state of `tree` and
/// `layout` over it, whose drop unmaps and removes the file.
pub(crate) fn create(name: &str, tree: Tree, layout: Layout) -> Result<State, FanoutError> {
    let path = path_of(name)?;
    if tree.slots() > REGION_SLOTS {
        return Err(FanoutError::TooManyLiveSlots {
            slots: tree.slots(),
            max: REGION_SLOTS,
        });
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => FanoutError::ShmExists {
                path: path.display().to_string(),
            },
            _ => io_error(&path, "create", e),
        })?;
    let sized = file
        .set_len(REGION_BYTES as u64)
        .map_err(|e| io_error(&path, "ftruncate", e));
    let map = sized.and_then(|()| {
        memmap2::MmapOptions::new()
            .len(REGION_BYTES)
            .map_raw(&file)
            .map_err(|e| io_error(&path, "mmap", e))
    });
    let map = match map {
        Ok(map) => map,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
    };
    let mapping = Mapping {
        map,
        path,
        creator: true,
    };
    let region = mapping.region();
    let (shape, shape_k) = shape_tag(tree.shape());
    let hash = tree_hash(&tree);
    let slots = tree.slots() as u32;
    // SAFETY: `region` is the start of a fresh MAP_SHARED mapping of
    // size_of::<Region>() zeroed bytes (ftruncate), page-aligned; all-zero
    // is a valid region (atomics only); the mapping lives in `backing`.
    let state = unsafe { State::over(tree, layout, region, Backing::Mapped(mapping))? };
    let header = &state.r().header;
    header.version.store(VERSION, Ordering::Relaxed);
    header.region_tag.store(REGION_TAG, Ordering::Relaxed);
    header.layout.store(layout_tag(layout), Ordering::Relaxed);
    header.shape.store(shape, Ordering::Relaxed);
    header.shape_k.store(shape_k, Ordering::Relaxed);
    header.slots.store(slots, Ordering::Relaxed);
    header.tree_hash.store(hash, Ordering::Relaxed);
    header.creator_pid.store(std::process::id(), Ordering::Relaxed);
    // Release: partner of the Acquire load of the magic in `open` (the
    // header fields above are visible to an opener that sees it).
    header.magic.store(MAGIC, Ordering::Release);
    Ok(state)
}

/// Map domain `name`'s file and check that it is a region this build
/// understands, of a tree this machine rebuilds identically.
pub(crate) fn open(name: &str) -> Result<State, FanoutError> {
    let path = path_of(name)?;
    let shown = path.display().to_string();
    let mismatch = |what: String| FanoutError::ShmMismatch {
        path: shown.clone(),
        what,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FanoutError::ShmMissing { path: shown.clone() },
            _ => io_error(&path, "open", e),
        })?;
    let len = file.metadata().map_err(|e| io_error(&path, "fstat", e))?.len();
    if len != REGION_BYTES as u64 {
        return Err(mismatch(format!(
            "{len} bytes, a region is {REGION_BYTES} (another build, or not created yet)"
        )));
    }
    let map = memmap2::MmapOptions::new()
        .len(REGION_BYTES)
        .map_raw(&file)
        .map_err(|e| io_error(&path, "mmap", e))?;
    let mapping = Mapping {
        map,
        path,
        creator: false,
    };
    let region = mapping.region();
    // SAFETY: `region` is the start of a live MAP_SHARED mapping of
    // size_of::<Region>() bytes (checked above), page-aligned; any bit
    // pattern is a valid region (atomics of plain integers only); the
    // reference is dropped before `mapping` moves into the state.
    let header = unsafe { &region.as_ref().header };
    // Acquire: partner of the Release store of the magic in `create`.
    let magic = header.magic.load(Ordering::Acquire);
    if magic != MAGIC {
        return Err(mismatch(format!(
            "magic {magic:#018x}, expected {MAGIC:#018x} (not a fanout domain, or its creator has not finished)"
        )));
    }
    let version = header.version.load(Ordering::Relaxed);
    if version != VERSION {
        return Err(mismatch(format!("version {version}, this build reads {VERSION}")));
    }
    let tag = header.region_tag.load(Ordering::Relaxed);
    if tag != REGION_TAG {
        return Err(mismatch(format!(
            "region layout tag {tag:#018x}, this build's is {REGION_TAG:#018x}"
        )));
    }
    let layout_tag_seen = header.layout.load(Ordering::Relaxed);
    let layout = Layout::ALL
        .into_iter()
        .find(|&l| layout_tag(l) == layout_tag_seen)
        .ok_or_else(|| mismatch(format!("unknown multicast layout tag {layout_tag_seen}")))?;
    let (shape_seen, k) = (
        header.shape.load(Ordering::Relaxed),
        header.shape_k.load(Ordering::Relaxed),
    );
    let shape = shape_of(shape_seen, k).ok_or_else(|| mismatch(format!("unknown tree shape tag {shape_seen}:{k}")))?;
    let slots = header.slots.load(Ordering::Relaxed) as usize;
    if slots == 0 || slots > REGION_SLOTS {
        return Err(mismatch(format!("{slots} slots, a region holds 1..={REGION_SLOTS}")));
    }
    let tree = Tree::build(shape, slots).map_err(|e| mismatch(format!("its tree cannot be rebuilt here: {e}")))?;
    let hash = header.tree_hash.load(Ordering::Relaxed);
    if tree_hash(&tree) != hash {
        return Err(mismatch(format!(
            "its {shape:?} tree of {slots} slots differs from the one built here (another CPU topology?)"
        )));
    }
    // SAFETY: as above; the mapping lives in `backing` as long as the state.
    unsafe { State::over(tree, layout, region, Backing::Mapped(mapping)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_files_under_dev_shm() {
        assert_eq!(path_of("a").unwrap(), Path::new("/dev/shm/spindle-fanout@a"));
        for bad in ["", "a/b", "a\0b", &"x".repeat(201)] {
            assert!(matches!(path_of(bad), Err(FanoutError::BadShmName { .. })), "{bad:?}");
        }
    }

    #[test]
    fn tags_round_trip() {
        for shape in [Shape::Flat, Shape::Kary(2), Shape::Kary(7), Shape::Cpu] {
            let (t, k) = shape_tag(shape);
            assert_eq!(shape_of(t, k), Some(shape));
        }
        assert_eq!(shape_of(2, 1), None);
        assert_eq!(shape_of(9, 0), None);
        let tags: Vec<u32> = Layout::ALL.into_iter().map(layout_tag).collect();
        assert_eq!(tags, vec![1, 2, 3, 4]);
    }

    #[test]
    fn the_tree_hash_tells_shapes_apart() {
        let a = tree_hash(&Tree::build(Shape::Kary(2), 7).unwrap());
        let b = tree_hash(&Tree::build(Shape::Flat, 7).unwrap());
        let c = tree_hash(&Tree::build(Shape::Kary(2), 8).unwrap());
        assert!(a != b && a != c && b != c);
    }

    #[test]
    fn this_process_is_alive_and_pid_0x7fff_fff0_is_not() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0x7fff_fff0));
    }
}
