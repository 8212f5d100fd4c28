//! Disk durability (`Durability::Disk`): a write is acknowledged only once
//! every backup's syncer has it in its segment files (fdatasync done) and
//! has published `durable` past it.
//!
//! - `an_ack_waits_for_every_backups_durable_position`: one backup is a
//!   hand-driven member whose `durable` the test holds back: the master's
//!   acknowledgement (the epoch's snapshot, a write, a group-commit batch)
//!   does not come while it is behind, and comes once it covers the write;
//!   the real backup meanwhile syncs a whole batch in exactly one round.
//! - `acknowledged_writes_are_in_the_backups_files` (shm and tcp): real
//!   backups; at every acknowledgement the record's bytes are already in
//!   every backup's segment file, across segments (flow control).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::tcp::TcpFabric;
use spindle_fabric::{Fabric, PeerSet};
use spindle_replica::driver::Driver;
use spindle_replica::failover::Timing;
use spindle_replica::layout::{Completion, Durability, ReplicaLayout, COUNTER_SYNCS, ROLE_BACKUP, ROLE_MASTER};
use spindle_replica::log::LogGeometry;
use spindle_replica::node::{Leader, Membership, Node, NodeConfig, LEASE_DEFAULT};
use spindle_replica::record::{RecordKind, RECORD_ALIGN};
use spindle_replica::Mode;
use spindle_runtime::IdleStrategy;

const GEOMETRY: LogGeometry = LogGeometry {
    segment_bytes: 16 * 1024,
    segments_max: 4,
};

/// Long enough for any busy machine; a hang fails instead of blocking.
const WAIT: Duration = Duration::from_secs(60);
/// How long the test watches for an acknowledgement that must not come.
const WATCH: Duration = Duration::from_millis(200);

fn config(group: &str, members: usize, dir: &Path) -> NodeConfig {
    NodeConfig {
        group: group.to_string(),
        members,
        backups: members - 1,
        mode: Mode::OneSided,
        geometry: GEOMETRY,
        value_bytes_max: 2048,
        memory_bytes_max: 64 << 20,
        clean_slack_segments: spindle_replica::node::CLEAN_SLACK_SEGMENTS_DEFAULT,
        data_dir: dir.to_path_buf(),
        idle: IdleStrategy::DEFAULT_BACKOFF,
        join_timeout: WAIT,
        lease: spindle_replica::node::LEASE_DEFAULT,
    }
}

fn layout(members: usize, completion: Completion) -> ReplicaLayout {
    ReplicaLayout::with_durability(members, GEOMETRY, "one-sided", completion, Durability::Disk)
}

struct ShmGroup(String);
impl Drop for ShmGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &self.0));
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A backup driven by the test: it joins, follows epoch 0 and publishes
/// whatever `durable` position the test says (its syncer "held back").
/// Its failover driver is the real one (it echoes the master's heartbeats,
/// so the master's lease holds and it is not dropped as unresponsive).
struct HandBackup {
    fabric: Arc<ShmFabric>,
    layout: ReplicaLayout,
    _driver: Arc<Driver<ShmFabric>>,
}

impl HandBackup {
    fn open(group: &str, members: usize, rank: usize) -> HandBackup {
        let layout = layout(members, Completion::Push);
        let mut options = ShmOptions::new(group, members, layout.row.row_len_bytes(), layout.row.tag());
        options.layout_description = layout.row.summary();
        let fabric = Arc::new(ShmFabric::open(&options, rank).expect("open the group file"));
        // What its disk holds: nothing (Node::start waits for every member).
        fabric
            .row(rank)
            .u64_at(layout.disk_epoch.offset())
            .store(1, Ordering::Release);
        let timing = Timing::from_lease_ms(LEASE_DEFAULT.as_millis() as u64);
        let driver = Driver::start(fabric.clone(), layout.clone(), timing, 0, 0, Mode::OneSided)
            .expect("start the failover driver");
        HandBackup {
            fabric,
            layout,
            _driver: driver,
        }
    }

    fn me(&self) -> usize {
        self.fabric.member_rank()
    }

    fn cell(&self, rank: usize, offset: usize) -> u64 {
        self.fabric.row(rank).u64_at(offset).load(Ordering::Acquire)
    }

    /// Follow master 0 in epoch 0, as `Backup::follow` does.
    fn follow_epoch_0(&self) {
        wait_until("the master to lead epoch 0", || {
            self.cell(0, self.layout.role.offset()) == ROLE_MASTER
                && self.cell(0, self.layout.backup_set.offset()) & (1 << self.me()) != 0
        });
        let row = self.fabric.row(self.me());
        row.u64_at(self.layout.role.offset())
            .store(ROLE_BACKUP, Ordering::Relaxed);
        row.u64_at(self.layout.ready_epoch.offset()).store(1, Ordering::Release);
        self.fabric.push(0..self.layout.areas.offset(), PeerSet(1)).unwrap();
    }

    /// The guard the master published to this backup.
    fn guard(&self) -> u64 {
        self.cell(0, self.layout.head.offset(self.me()))
    }

    fn set_durable(&self, position: u64) {
        let cell = self.layout.durable.offset();
        self.fabric
            .row(self.me())
            .u64_at(cell)
            .store(position, Ordering::Release);
        self.fabric.doorbell().ring();
    }
}

/// Backup `rank`'s `durable` position and sync rounds, read in place.
fn durable_and_syncs(fabric: &ShmFabric, layout: &ReplicaLayout, rank: usize) -> (u64, u64) {
    let row = fabric.row(rank);
    (
        row.u64_at(layout.durable.offset()).load(Ordering::Acquire),
        row.u64_at(layout.counters.offset(COUNTER_SYNCS))
            .load(Ordering::Relaxed),
    )
}

type Job = Box<dyn FnOnce(&mut Leader) -> u64 + Send>;

#[test]
fn an_ack_waits_for_every_backups_durable_position() {
    let group = ShmGroup(format!("rdur-{}-held", std::process::id()));
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Rank 1: a real backup with a syncer.
    let real = {
        let (cfg, stop) = (config(&group.0, 3, dir.path()), stop.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let node = Node::open_with(cfg, 1, Durability::Disk)?;
            node.run_until_master(&stop).map(|_| ())
        })
    };
    // Rank 0: the master; it runs jobs and reports when each is acknowledged.
    let (jobs, job_rx) = mpsc::channel::<Job>();
    let (acks, ack_rx) = mpsc::channel::<u64>();
    let master = {
        let cfg = config(&group.0, 3, dir.path());
        std::thread::spawn(move || -> Result<(), String> {
            let node = Node::open_with(cfg, 0, Durability::Disk)?;
            let mut leader = node.run_until_master(&AtomicBool::new(false))?.expect("rank 0 leads");
            let _ = acks.send(leader.master.head());
            while let Ok(job) = job_rx.recv() {
                let head = job(&mut leader);
                let _ = acks.send(head);
            }
            Ok(())
        })
    };
    let hand = HandBackup::open(&group.0, 3, 2);
    hand.follow_epoch_0();

    // 1. The epoch's snapshot (its SnapshotDone) is a write like any other.
    wait_until("the snapshot's guard", || hand.guard() > 0);
    let snapshot_end = hand.guard();
    assert!(
        ack_rx.recv_timeout(WATCH).is_err(),
        "acknowledged with durable 0 at a backup"
    );
    hand.set_durable(snapshot_end - RECORD_ALIGN as u64);
    assert!(
        ack_rx.recv_timeout(WATCH).is_err(),
        "acknowledged with durable short of the write at a backup"
    );
    hand.set_durable(snapshot_end);
    assert_eq!(
        ack_rx.recv_timeout(WAIT).expect("the ack once durable covers it"),
        snapshot_end
    );
    let (durable, _) = durable_and_syncs(&hand.fabric, &hand.layout, 1);
    assert!(
        durable >= snapshot_end,
        "durability: acknowledged past the real backup's disk"
    );

    // 2. One write: acknowledged only when the held-back backup syncs it.
    jobs.send(Box::new(|leader: &mut Leader| {
        let version = leader.objects.next_version();
        leader
            .master
            .append_record(RecordKind::Put, b"k1", b"v1", version)
            .unwrap();
        leader.master.head()
    }))
    .unwrap();
    wait_until("the write's guard", || hand.guard() > snapshot_end);
    let write_end = hand.guard();
    assert!(
        ack_rx.recv_timeout(WATCH).is_err(),
        "acknowledged before the backup synced"
    );
    hand.set_durable(write_end);
    assert_eq!(ack_rx.recv_timeout(WAIT).expect("the write's ack"), write_end);
    let (durable, syncs_before) = durable_and_syncs(&hand.fabric, &hand.layout, 1);
    assert!(
        durable >= write_end,
        "durability: acknowledged past the real backup's disk"
    );

    // 3. Group commit: the guard waits for `complete`, then one round.
    let (appended, appended_rx) = mpsc::channel::<u64>();
    jobs.send(Box::new(move |leader: &mut Leader| {
        leader.master.set_deferred(true);
        for i in 0..8u32 {
            let version = leader.objects.next_version();
            let key = format!("batch{i}");
            leader
                .master
                .append_record(RecordKind::Put, key.as_bytes(), b"v", version)
                .unwrap();
            leader.objects.put(key.as_bytes(), b"v", version);
        }
        let _ = appended.send(leader.master.head());
        leader.master.set_deferred(false);
        leader.master.complete().unwrap();
        leader.master.head()
    }))
    .unwrap();
    let batch_end = appended_rx.recv_timeout(WAIT).expect("the batch appended");
    assert!(batch_end > write_end);
    wait_until("the batch's guard", || hand.guard() == batch_end);
    assert!(
        ack_rx.recv_timeout(WATCH).is_err(),
        "a batch acknowledged before the backup synced"
    );
    wait_until("the real backup's sync of the batch", || {
        durable_and_syncs(&hand.fabric, &hand.layout, 1).0 == batch_end
    });
    let (_, syncs_after) = durable_and_syncs(&hand.fabric, &hand.layout, 1);
    assert_eq!(
        syncs_after - syncs_before,
        1,
        "group commit: one sync round for the batch"
    );
    hand.set_durable(batch_end);
    assert_eq!(ack_rx.recv_timeout(WAIT).expect("the batch's ack"), batch_end);

    // Stop: the real backup seals and returns, then the master goes.
    stop.store(true, Ordering::Release);
    wait_until("the real backup to stop", || real.is_finished());
    real.join().unwrap().unwrap();
    drop(jobs);
    master.join().unwrap().unwrap();
}

type Opener<F> = Arc<dyn Fn(usize) -> Result<Node<F>, String> + Send + Sync>;

fn shm_opener(group: &str, members: usize, dir: &Path) -> Opener<ShmFabric> {
    let (group, dir) = (group.to_string(), dir.to_path_buf());
    Arc::new(move |rank| Node::open_with(config(&group, members, &dir), rank, Durability::Disk))
}

fn tcp_opener(group: &str, members: usize, dir: &Path) -> Opener<TcpFabric> {
    let (listeners, addresses) = common::loopback_listeners(members);
    let listeners = std::sync::Mutex::new(listeners);
    let (group, dir) = (group.to_string(), dir.to_path_buf());
    Arc::new(move |rank| {
        let l = listeners.lock().unwrap()[rank].take();
        Node::open_tcp_with(
            config(&group, members, &dir),
            rank,
            addresses.clone(),
            b"durability test".to_vec(),
            l,
            Durability::Disk,
        )
    })
}

/// Real members 1..3 as backups, rank 0 the master: every acknowledged
/// write's bytes are in every backup's segment file when the ack comes.
fn acknowledged_writes_are_on_disk<F: Membership + 'static>(open: Opener<F>, dir: &Path) {
    let members = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let backups: Vec<_> = (1..members)
        .map(|rank| {
            let (open, stop) = (open.clone(), stop.clone());
            std::thread::spawn(move || -> Result<(), String> { open(rank)?.run_until_master(&stop).map(|_| ()) })
        })
        .collect();
    let node = open(0).unwrap();
    let mut leader = node
        .run_until_master(&AtomicBool::new(false))
        .unwrap()
        .expect("rank 0 leads");
    let mut model = HashMap::new();
    // ~5 segments of 16 KiB: segments close, flow control runs.
    for i in 0..200u32 {
        let key = format!("key{i}");
        let value = format!("value-{i}-{}", "x".repeat((i as usize * 37) % 400));
        let version = leader.objects.next_version();
        leader
            .master
            .append_record(RecordKind::Put, key.as_bytes(), value.as_bytes(), version)
            .expect("append");
        leader.objects.put(key.as_bytes(), value.as_bytes(), version);
        model.insert(key, value.clone());
        let end = leader.master.head();
        let k = GEOMETRY.segment_of(end - 1);
        let in_segment = (end - k * GEOMETRY.segment_bytes as u64) as usize;
        for &b in leader.master.backups() {
            let path = dir.join(format!("member-{b}/epoch-0/segment-{k}"));
            let file = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                file.len() >= in_segment,
                "durability: write {i} acknowledged but backup {b}'s {} holds {} of its {in_segment} bytes",
                path.display(),
                file.len()
            );
            let record = &file[in_segment.saturating_sub(value.len() + 64)..in_segment];
            assert!(
                record.windows(value.len()).any(|w| w == value.as_bytes()),
                "durability: write {i}'s value is not in backup {b}'s {}",
                path.display()
            );
        }
    }
    assert_eq!(leader.master.backups().len(), members - 1, "no backup was dropped");
    stop.store(true, Ordering::Release);
    for t in backups {
        wait_until("a backup to stop", || t.is_finished());
        t.join().unwrap().unwrap();
    }
    drop(leader);
    drop(node);
    // What the backups sealed replays to the model.
    let disk = spindle_replica::disk::SegmentDisk::new(dir.join("member-1"));
    let (objects, _) = spindle_replica::node::recover(&disk, &GEOMETRY, 64 << 20).unwrap();
    assert_eq!(objects.len(), model.len());
    for (key, value) in &model {
        assert_eq!(
            objects.get(key.as_bytes()).map(|o| &o.value[..]),
            Some(value.as_bytes()),
            "{key} after replay"
        );
    }
}

#[test]
fn acknowledged_writes_are_in_the_backups_files_shm() {
    let group = ShmGroup(format!("rdur-{}-files", std::process::id()));
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    acknowledged_writes_are_on_disk(shm_opener(&group.0, 3, dir.path()), dir.path());
}

#[test]
fn acknowledged_writes_are_in_the_backups_files_tcp() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    acknowledged_writes_are_on_disk(tcp_opener("rdur-tcp", 3, dir.path()), dir.path());
}
