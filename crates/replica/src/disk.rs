//! A backup's segments on disk: `<dir>/epoch-<e>/segment-<k>`.
//! `<dir>/epoch-<e>/sealed` holds the guard (u64 LE) once the epoch's
//! whole log is on disk.
//!
//! While an epoch runs, a backup writes its log as it arrives through a
//! [`SegmentAppender`]: in place, straight into `segment-<k>`, made
//! durable by `fdatasync` in rounds (with `durability = "disk"` the
//! syncer's group commit; with `"memory"` the flusher's rounds, at a
//! segment's close and every 50 ms). Such a file's synced prefix is intact
//! after a crash (on a disk that keeps synced blocks when a later write to
//! the same block is cut short); past it the tail may be torn, which
//! replay drops (checksums). Only the last file of an epoch can be short:
//! a segment is written to its end before the next one's file is created.
//!
//! The seal ([`SegmentDisk::write_segment`]) writes a segment whole to a
//! temporary file, fsyncs it, renames it into place and fsyncs the
//! directory, so a sealed epoch's files are complete.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One member's segment directory.
#[derive(Clone, Debug)]
pub struct SegmentDisk {
    dir: PathBuf,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

impl SegmentDisk {
    pub fn new(dir: PathBuf) -> SegmentDisk {
        SegmentDisk { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn epoch_dir(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("epoch-{epoch}"))
    }

    /// Write segment `k` of `epoch` durably.
    pub fn write_segment(&self, epoch: u64, k: u64, bytes: &[u8]) -> Result<(), String> {
        let dir = self.epoch_dir(epoch);
        fs::create_dir_all(&dir).map_err(|e| io_err("create", &dir, e))?;
        let path = dir.join(format!("segment-{k}"));
        write_durably(&path, bytes)?;
        sync_dir(&dir)
    }

    /// Record that `epoch`'s whole log is on disk, up to `guard`.
    pub fn seal(&self, epoch: u64, guard: u64) -> Result<(), String> {
        let dir = self.epoch_dir(epoch);
        fs::create_dir_all(&dir).map_err(|e| io_err("create", &dir, e))?;
        write_durably(&dir.join("sealed"), &guard.to_le_bytes())?;
        sync_dir(&dir)
    }

    /// The guard of a sealed epoch.
    pub fn sealed_guard(&self, epoch: u64) -> Option<u64> {
        let bytes = fs::read(self.epoch_dir(epoch).join("sealed")).ok()?;
        Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
    }

    /// Every segment of `epoch`, in order, up to the first missing one.
    pub fn read_segments(&self, epoch: u64) -> Result<Vec<Vec<u8>>, String> {
        let dir = self.epoch_dir(epoch);
        let mut out = Vec::new();
        loop {
            let path = dir.join(format!("segment-{}", out.len()));
            match fs::read(&path) {
                Ok(bytes) => out.push(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(io_err("read", &path, e)),
            }
        }
    }

    /// Delete every epoch older than `epoch` (log cleaning: `epoch`'s
    /// snapshot is on disk, so they are no longer needed for recovery).
    pub fn remove_epochs_before(&self, epoch: u64) -> Result<(), String> {
        for e in self.epochs().into_iter().filter(|e| *e < epoch) {
            let dir = self.epoch_dir(e);
            fs::remove_dir_all(&dir).map_err(|err| io_err("remove", &dir, err))?;
        }
        Ok(())
    }

    /// Whether `epoch` has segment 0 on disk.
    pub fn has_segments(&self, epoch: u64) -> bool {
        self.epoch_dir(epoch).join("segment-0").exists()
    }

    /// Segment files on disk over every epoch (for bounds and tests).
    pub fn segment_files(&self) -> usize {
        self.epochs()
            .into_iter()
            .map(|e| {
                fs::read_dir(self.epoch_dir(e))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|f| {
                        f.file_name()
                            .to_str()
                            .is_some_and(|n| n.starts_with("segment-") && !n.ends_with(".tmp"))
                    })
                    .count()
            })
            .sum()
    }

    /// Epochs with a directory, newest first.
    pub fn epochs(&self) -> Vec<u64> {
        let mut epochs: Vec<u64> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("epoch-")?.parse().ok())
            .collect();
        epochs.sort_unstable_by(|a, b| b.cmp(a));
        epochs
    }
}

/// One epoch's log written in place as it arrives, and synced in rounds
/// (the disk syncer and the memory-durability flusher; see the module
/// docs).
///
/// ```text
///  write(k, offset, bytes)   pwrite into segment-<k> (created, truncated,
///                            on the first write to k; the previous
///                            segment's file is fdatasynced first)
///  sync()                    fdatasync the open file (if written), then
///                            fsync the epoch directory (if a file was
///                            created) and the member directory (if the
///                            epoch directory was): everything written
///                            before it is on disk when it returns
/// ```
#[derive(Debug)]
pub struct SegmentAppender {
    disk: SegmentDisk,
    epoch: u64,
    /// The segment being written and its file.
    open: Option<(u64, File)>,
    /// Bytes written to the open file since its last fdatasync.
    unsynced_bytes: u64,
    /// A file (or the epoch directory) was created since the last sync:
    /// its directory entry needs an fsync of the directory.
    epoch_dir_unsynced: bool,
    member_dir_unsynced: bool,
    epoch_dir_created: bool,
}

impl SegmentAppender {
    pub fn new(disk: SegmentDisk, epoch: u64) -> SegmentAppender {
        SegmentAppender {
            disk,
            epoch,
            open: None,
            unsynced_bytes: 0,
            epoch_dir_unsynced: false,
            member_dir_unsynced: false,
            epoch_dir_created: false,
        }
    }

    /// Write `bytes` at `offset` of segment `k`. Segments are written in
    /// order: `k` is the open segment or a later one.
    pub fn write(&mut self, k: u64, offset: usize, bytes: &[u8]) -> Result<(), String> {
        let open_k = self.open.as_ref().map(|(open_k, _)| *open_k);
        assert!(
            open_k.is_none_or(|open_k| k >= open_k),
            "segments are appended in order: segment {k} after {open_k:?}"
        );
        if open_k != Some(k) {
            self.sync_file()?;
            self.open = Some((k, self.create(k, offset)?));
        }
        let (_, file) = self.open.as_ref().expect("opened above");
        let path = || self.disk.epoch_dir(self.epoch).join(format!("segment-{k}"));
        file.write_all_at(bytes, offset as u64)
            .map_err(|e| io_err("write", &path(), e))?;
        self.unsynced_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Make everything written so far durable (see the type's docs).
    pub fn sync(&mut self) -> Result<(), String> {
        self.sync_file()?;
        let dir = self.disk.epoch_dir(self.epoch);
        if self.epoch_dir_unsynced {
            sync_dir(&dir)?;
            self.epoch_dir_unsynced = false;
        }
        if self.member_dir_unsynced {
            sync_dir(&self.disk.dir)?;
            self.member_dir_unsynced = false;
        }
        debug_assert_eq!(self.unsynced_bytes, 0, "durability: every written byte is synced");
        Ok(())
    }

    fn sync_file(&mut self) -> Result<(), String> {
        if self.unsynced_bytes == 0 {
            return Ok(());
        }
        let Some((k, file)) = &self.open else {
            unreachable!("bytes written without an open segment")
        };
        file.sync_data().map_err(|e| {
            io_err(
                "fdatasync",
                &self.disk.epoch_dir(self.epoch).join(format!("segment-{k}")),
                e,
            )
        })?;
        self.unsynced_bytes = 0;
        Ok(())
    }

    /// Create segment `k`'s file (empty: it starts at offset 0, written
    /// in order).
    fn create(&mut self, k: u64, offset: usize) -> Result<File, String> {
        assert_eq!(offset, 0, "segment {k} is first written at its start");
        let dir = self.disk.epoch_dir(self.epoch);
        if !self.epoch_dir_created {
            fs::create_dir_all(&dir).map_err(|e| io_err("create", &dir, e))?;
            self.epoch_dir_created = true;
            self.member_dir_unsynced = true;
        }
        let path = dir.join(format!("segment-{k}"));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| io_err("create", &path, e))?;
        self.epoch_dir_unsynced = true;
        Ok(file)
    }
}

fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| io_err("create", &tmp, e))?;
    file.write_all(bytes).map_err(|e| io_err("write", &tmp, e))?;
    file.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| io_err("rename", &tmp, e))
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync", dir, e))
}
