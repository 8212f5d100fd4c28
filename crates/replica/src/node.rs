//! One member of a replicated store on shm: a backup until it becomes the
//! master, through as many failovers as it takes.
//!
//! ```text
//!  epoch e, master m            every member                     epoch e+1
//!  ───────────────── m dies ──▶ backups stop and seal epoch e ──▶ lowest live rank n:
//!                               (whole log on disk + guard)       replay its log (latest epoch
//!                                                                 with a complete snapshot),
//!                                                                 publish epoch e+1, wait for the
//!                                                                 others to follow, write the
//!                                                                 snapshot + SnapshotDone, serve
//! ```
//!
//! Liveness on shm: a member is alive while its slot in the group file
//! says *running* and its process exists (a crashed process is found by
//! pid; a member thread that leaves sets its slot to *left*).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::Fabric;
use spindle_sst::IdleStrategy;

use crate::backup::Backup;
use crate::disk::SegmentDisk;
use crate::layout::{ReplicaLayout, ROLE_MASTER};
use crate::log::LogGeometry;
use crate::master::{Master, Mode};
use crate::record::RecordKind;
use crate::replay::replay_into;
use crate::store::ObjectMap;

/// What one member needs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub group: String,
    pub members: usize,
    pub mode: Mode,
    pub geometry: LogGeometry,
    pub value_bytes_max: usize,
    pub memory_bytes_max: usize,
    /// Each member keeps its segments in `<data_dir>/member-<rank>`.
    pub data_dir: PathBuf,
    /// How the rpc copier idles.
    pub idle: IdleStrategy,
    pub join_timeout: Duration,
}

/// A member that has become the master: its log writer and its objects.
pub struct Leader {
    pub master: Master<ShmFabric>,
    pub objects: ObjectMap,
    /// How the objects were recovered (empty for the first master).
    pub recovery: Option<RecoveryReport>,
}

/// What a new master replayed.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub from_epoch: u64,
    pub guard: u64,
    pub end: u64,
    pub records: u64,
    pub objects: usize,
    pub torn: Option<String>,
    pub replay_ns: u64,
}

/// One member of the store.
pub struct Node {
    fabric: Arc<ShmFabric>,
    layout: ReplicaLayout,
    config: NodeConfig,
    disk: SegmentDisk,
}

/// Slot state "running" in the shm group file header (see the fabric's
/// file layout diagram).
const SLOT_RUNNING: u32 = 1;

/// Whether `rank` is alive (see the module docs).
pub fn alive(fabric: &ShmFabric, rank: usize) -> bool {
    let slot = &fabric.header().members[rank];
    // Partner: the Release store of the slot state by the fabric.
    if slot.state.load(Ordering::Acquire) != SLOT_RUNNING {
        return false;
    }
    let pid = slot.pid.load(Ordering::Relaxed);
    pid == std::process::id() || process_alive(pid)
}

/// A process exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

impl Node {
    /// Open the group's shm file as `rank` and wait for every member.
    pub fn open(config: NodeConfig, rank: usize) -> Result<Node, String> {
        config.geometry.validate(config.value_bytes_max)?;
        let layout = ReplicaLayout::new(config.members, config.geometry, config.mode.as_str());
        let mut options = ShmOptions::new(
            &config.group,
            config.members,
            layout.row.row_len_bytes(),
            layout.row.tag(),
        );
        options.layout_description = layout.row.summary();
        let fabric = Arc::new(ShmFabric::open(&options, rank).map_err(|e| e.to_string())?);
        spindle_fabric::wait_all_joined(fabric.as_ref(), &config.group, config.join_timeout)
            .map_err(|e| e.to_string())?;
        // A store starts empty (restarting from disk after a total failure
        // is not built): segments of an earlier run must not be replayed
        // into this one.
        let dir = config.data_dir.join(format!("member-{rank}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("clear {}: {e}", dir.display()))?;
        }
        let disk = SegmentDisk::new(dir);
        Ok(Node {
            fabric,
            layout,
            config,
            disk,
        })
    }

    pub fn fabric(&self) -> &Arc<ShmFabric> {
        &self.fabric
    }
    pub fn rank(&self) -> usize {
        self.fabric.member_rank()
    }

    /// Run as a backup (through failovers) until this member becomes the
    /// master; `None` when `stop` was set first.
    pub fn run_until_master(&self, stop: &AtomicBool) -> Result<Option<Leader>, String> {
        let me = self.rank();
        let mut epoch = 0u64;
        let mut master = 0usize;
        loop {
            if me == master {
                return self.lead(epoch).map(Some);
            }
            if !self.wait_published(master, epoch, stop) {
                if stop.load(Ordering::Acquire) {
                    return Ok(None);
                }
                // The candidate died before leading: its epoch is skipped.
                (epoch, master) = (epoch + 1, self.next_master(master)?);
                continue;
            }
            let mut backup = Backup::follow(
                self.fabric.clone(),
                self.layout.clone(),
                self.config.mode,
                self.disk.clone(),
                master,
                epoch,
                self.config.idle,
            )?;
            loop {
                if stop.load(Ordering::Acquire) {
                    backup.stop()?;
                    return Ok(None);
                }
                if !alive(&self.fabric, master) {
                    break;
                }
                if backup.failed() {
                    return backup.stop().and(Err("a backup thread stopped".into()));
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            backup.seal()?;
            (epoch, master) = (epoch + 1, self.next_master(master)?);
        }
    }

    /// The lowest live rank other than `dead`: every member computes the
    /// same (liveness on one host is exact and a dead member stays dead).
    fn next_master(&self, dead: usize) -> Result<usize, String> {
        (0..self.config.members)
            .find(|r| *r != dead && alive(&self.fabric, *r))
            .ok_or_else(|| "no live member left to become master".to_string())
    }

    /// Wait until `master` leads `epoch`; false if it died first (or stop).
    fn wait_published(&self, master: usize, epoch: u64, stop: &AtomicBool) -> bool {
        let row = self.fabric.row(master);
        loop {
            // Partner: the Release store of `epoch` in Master::start.
            let e = row.u64_at(self.layout.epoch.offset()).load(Ordering::Acquire);
            if e == epoch && row.u64_at(self.layout.role.offset()).load(Ordering::Relaxed) == ROLE_MASTER {
                return true;
            }
            if stop.load(Ordering::Acquire) || !alive(&self.fabric, master) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Become master of `epoch`: recover, take the live others as
    /// backups, re-replicate the objects, mark the snapshot done.
    fn lead(&self, epoch: u64) -> Result<Leader, String> {
        let started = Instant::now();
        let (objects, mut recovery) = if epoch == 0 {
            (ObjectMap::new(self.config.memory_bytes_max), None)
        } else {
            let (o, r) = recover(&self.disk, &self.config.geometry, self.config.memory_bytes_max)?;
            (o, Some(r))
        };
        let me = self.rank();
        let backups: Vec<usize> = (0..self.config.members)
            .filter(|r| *r != me && alive(&self.fabric, *r))
            .collect();
        let fabric = self.fabric.clone();
        let mut master = Master::start(
            self.fabric.clone(),
            self.layout.clone(),
            self.config.mode,
            epoch,
            backups,
            self.config.value_bytes_max,
            Box::new(move |r| alive(&fabric, r)),
        )?;
        if master.backups().is_empty() {
            // Nothing to replicate to: serve reads; writes are refused
            // (`-ERR replication failed: no live backup left`).
            eprintln!("spindle replica: member {me} leads epoch {epoch} with no live backup: read-only");
        } else {
            for (key, object) in objects.iter() {
                master.append_record(RecordKind::Put, key, &object.value, object.version)?;
            }
            master.append_record(RecordKind::SnapshotDone, &[], &[], objects.version_max())?;
        }
        if let Some(r) = recovery.as_mut() {
            r.replay_ns = started.elapsed().as_nanos() as u64;
        }
        Ok(Leader {
            master,
            objects,
            recovery,
        })
    }
}

/// Replay the newest epoch on disk whose snapshot is complete.
pub fn recover(
    disk: &SegmentDisk,
    geometry: &LogGeometry,
    memory_bytes_max: usize,
) -> Result<(ObjectMap, RecoveryReport), String> {
    for epoch in disk.epochs() {
        let Some(guard) = disk.sealed_guard(epoch) else {
            continue;
        };
        let segments = disk.read_segments(epoch)?;
        let mut objects = ObjectMap::new(memory_bytes_max);
        let outcome = replay_into(
            geometry,
            epoch,
            guard,
            |k| segments.get(k as usize).map(|s| &s[..]),
            &mut objects,
        )
        .map_err(|e| format!("replaying epoch {epoch} from {}: {e}", disk.dir().display()))?;
        if outcome.snapshot_done {
            let report = RecoveryReport {
                from_epoch: epoch,
                guard,
                end: outcome.end,
                records: outcome.records,
                objects: objects.len(),
                torn: outcome.torn,
                replay_ns: 0,
            };
            return Ok((objects, report));
        }
    }
    Ok((ObjectMap::new(memory_bytes_max), RecoveryReport::default()))
}
