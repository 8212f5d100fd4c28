//! A backup's segments on disk: `<dir>/epoch-<e>/segment-<k>`, each
//! written whole to a temporary file, fsynced, renamed into place and the
//! directory fsynced, so a segment file is either complete or absent.
//! `<dir>/epoch-<e>/sealed` holds the guard (u64 LE) once the epoch's
//! whole log is on disk.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
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
