//! A disk that fills in the middle of persistent delivery: three members
//! log to one small tmpfs (mounted by the test, so it needs root, as the
//! network-namespace tests do) and send until it is full.
//!
//! Checked:
//! - **a clear error**: every member's poll ends in an error, and at
//!   least one says the disk is full ("No space left on device"); none
//!   hangs (each is bounded);
//! - **nothing acknowledged that was not written**: every message a member
//!   delivered is in its own log on the disk, and every message delivered
//!   in the first view is in the log of every member of the deliverer's
//!   last view: all three, unless a member stopped first and the others
//!   installed a view without it (delivery waits for every member of the
//!   view to have a message on disk; a view change's ragged edge waits
//!   for the next view's members only, `membership::fresh_proposal`);
//! - the disk filled in the middle: messages were delivered before it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use spindle_group::persist::{log_path, recover};
use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, SendError};

const MEMBERS: usize = 3;
/// The tmpfs's size: a few thousand messages across the three logs.
const DISK_BYTES: usize = 1 << 20;
/// How long a member may run before it must have met the full disk.
const MEMBER_BOUND: Duration = Duration::from_secs(120);

/// One delivery: view, seq, payload.
type Seen = Vec<(u64, u64, Vec<u8>)>;

/// The mounted tmpfs; unmounted and removed on drop, with the group's
/// shm file.
struct SmallDisk {
    dir: PathBuf,
    group: String,
}

impl SmallDisk {
    /// `Ok(Err(why))`: mounting is not permitted here (root without
    /// CAP_SYS_ADMIN, say): the caller skips, naming why.
    fn mount(group: &str) -> Result<Result<SmallDisk, String>, String> {
        let dir = std::env::temp_dir().join(format!("{group}-disk"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_BYTES}"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let refused = ["permission denied", "must be superuser", "not permitted"]
                .iter()
                .any(|w| why.to_lowercase().contains(w));
            if refused {
                return Ok(Err(why));
            }
            return Err(format!("mount: {why}"));
        }
        Ok(Ok(SmallDisk {
            dir,
            group: group.to_string(),
        }))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Every member thread is joined before this runs; should a file
        // still be open, a lazy unmount detaches the mount anyway.
        let unmounted = (0..50).any(|_| {
            let done = Command::new("umount")
                .arg(&self.dir)
                .status()
                .is_ok_and(|s| s.success());
            if !done {
                std::thread::sleep(Duration::from_millis(20));
            }
            done
        }) || Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            eprintln!("persistent_disk_full: could not unmount {}", self.dir.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &self.group));
    }
}

fn config(name: &str, dir: &Path) -> GroupConfig {
    let mut c = GroupConfig::new(name, MEMBERS);
    c.mode = DeliveryMode::Persistent;
    c.persist_dir = Some(dir.to_path_buf());
    c.window_slots = 64;
    c.slot_payload_max = 256;
    c.join_timeout = Duration::from_secs(20);
    c
}

/// How a member ended: what it delivered, its error, the members of the
/// last view it installed.
type Ended = (Seen, String, Vec<usize>);

/// A member: send 200-byte messages (rank, counter) and deliver, until a
/// poll fails; returns how it ended.
fn member(config: GroupConfig, rank: usize) -> Ended {
    let mut group = Group::join_shm(config, rank).expect("join");
    let sender = group.sender().expect("every member sends");
    let mut seen: Seen = Vec::new();
    let mut record = |d: &Delivery<'_>| seen.push((d.view, d.seq, d.payload.to_vec()));
    let mut counter = 0u32;
    let started = Instant::now();
    let error = loop {
        assert!(
            started.elapsed() < MEMBER_BOUND,
            "member {rank}: no error within {MEMBER_BOUND:?} on a {DISK_BYTES}-byte disk"
        );
        let mut payload = [rank as u8; 200];
        payload[1..5].copy_from_slice(&counter.to_le_bytes());
        match sender.send(&payload) {
            Ok(()) => counter += 1,
            Err(SendError::WouldBlock) => {}
            Err(e) => break e.to_string(),
        }
        if let Err(e) = group.poll_or_idle(&mut record) {
            break e.to_string();
        }
    };
    (seen, error, group.view().members)
}

#[test]
fn a_full_disk_stops_persistent_delivery_with_an_error_and_nothing_unwritten_is_delivered() {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        eprintln!("SKIPPED: mounting a small tmpfs needs root");
        return;
    }
    let name = format!("t-{}-full", std::process::id());
    let disk = match SmallDisk::mount(&name).expect("mount a small tmpfs") {
        Ok(disk) => disk,
        Err(why) => {
            eprintln!("SKIPPED: mounting a small tmpfs is not permitted here: {why}");
            return;
        }
    };
    let members: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let config = config(&name, &disk.dir);
            std::thread::spawn(move || member(config, rank))
        })
        .collect();
    // Every member joined before any panic is raised, so that no log is
    // open when the disk is unmounted.
    let joined: Vec<_> = members.into_iter().map(|t| t.join()).collect();
    let mut ended: Vec<Ended> = Vec::new();
    for result in joined {
        match result {
            Ok(end) => ended.push(end),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    let errors: Vec<&String> = ended.iter().map(|(_, e, _)| e).collect();
    assert!(
        errors.iter().any(|e| e.contains("No space left")),
        "a member says the disk is full: {errors:?}"
    );
    let logs: Vec<_> = (0..MEMBERS)
        .map(|rank| recover(&log_path(&disk.dir, &name, rank)).expect("the log reads back"))
        .collect();
    let on_disk: Vec<Vec<(u64, u64, Vec<u8>)>> = logs
        .iter()
        .map(|log| {
            log.history()
                .iter()
                .map(|m| (m.view, m.seq, m.payload.to_vec()))
                .collect()
        })
        .collect();
    let delivered: usize = ended.iter().map(|(seen, _, _)| seen.len()).sum();
    assert!(delivered > 0, "the disk filled in the middle of the run: {errors:?}");
    for (rank, (seen, error, last_view)) in ended.iter().enumerate() {
        for d in seen {
            assert!(
                on_disk[rank].contains(d),
                "member {rank} delivered view {} seq {} that its log does not hold (it ended with: {error})",
                d.0,
                d.1
            );
            if d.0 == 0 {
                for &other in last_view {
                    assert!(
                        on_disk[other].contains(d),
                        "persisted before delivered: member {rank} (last view {last_view:?}) delivered view 0 \
                         seq {} that member {other}'s log does not hold",
                        d.1
                    );
                }
            }
        }
    }
    drop(disk);
}
