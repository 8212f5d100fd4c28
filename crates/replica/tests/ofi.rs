//! The one-sided replica over libfabric (feature `ofi`, the `tcp`
//! provider on loopback): a write is acknowledged when the master's
//! completion queue reports every `fi_write` delivered into the backups'
//! memory (`Completion::Queue`), with no Spindle thread on the backups'
//! write path.
//!
//! - `an_acknowledged_write_is_in_every_backups_memory`: right after each
//!   acknowledgement (no wait) every backup's copy of the master's row
//!   holds the record and the guard that covers it, and no backup runs an
//!   echo thread.
//! - `a_lost_backup_is_dropped_and_writes_go_on`: a backup whose process
//!   leaves is dropped from the set; the next writes are acknowledged by
//!   the others.
//! - `completion_queue_without_delivery_is_refused`: an ofi fabric opened
//!   without `delivery_complete` (its completions only say the bytes left)
//!   cannot back a `Completion::Queue` replica: `Master::start` says why.
//! - `rpc_over_ofi_answers_every_write`: the two-sided baseline on the same
//!   provider: each backup's thread copies the request and answers.
//!
//! Every wait is bounded; nothing asserts a duration.
#![cfg(feature = "ofi")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use spindle_fabric::ofi::{OfiFabric, OfiOptions};
use spindle_fabric::Fabric;
use spindle_replica::backup::Backup;
use spindle_replica::disk::SegmentDisk;
use spindle_replica::layout::{Completion, ReplicaLayout};
use spindle_replica::log::LogGeometry;
use spindle_replica::master::Master;
use spindle_replica::node::Membership;
use spindle_replica::record::{decode, encoded_len, RecordKind};
use spindle_replica::Mode;
use spindle_runtime::IdleStrategy;

const BACKUPS: usize = 3;
const VALUE_BYTES_MAX: usize = 256;

fn provider() -> String {
    std::env::var("SPINDLE_OFI_PROVIDER").unwrap_or_else(|_| "tcp".into())
}

fn layout(mode: Mode) -> ReplicaLayout {
    let geometry = LogGeometry {
        segment_bytes: 16 * 1024,
        segments_max: 4,
    };
    ReplicaLayout::with_completion(BACKUPS + 1, geometry, mode.as_str(), Completion::Queue)
}

/// Options for a group of `members` on loopback, with their listeners.
fn options(
    group: &str,
    layout: &ReplicaLayout,
    delivery_complete: bool,
) -> (OfiOptions, Vec<Option<std::net::TcpListener>>) {
    let (listeners, addresses) = common::loopback_listeners(layout.members);
    let mut options = OfiOptions::new(
        &format!("{group}-{}", std::process::id()),
        layout.row.row_len_bytes(),
        layout.row.tag(),
        addresses,
        b"ofi replica test".to_vec(),
        &provider(),
    );
    options.tcp.join_timeout = Duration::from_secs(30);
    options.delivery_complete = delivery_complete;
    (options, listeners)
}

/// Open every member at once (each waits for the others), rank order.
fn open_all(options: &OfiOptions, listeners: Vec<Option<std::net::TcpListener>>) -> Vec<Arc<OfiFabric>> {
    let threads: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let options = options.clone();
            std::thread::spawn(move || {
                Arc::new(OfiFabric::open_with_listener(&options, rank, l.unwrap()).expect("open an ofi member"))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("open thread")).collect()
}

/// The threads of this process whose names start with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with(prefix))
        .collect()
}

struct Backups {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<(), String>>>,
}

/// A backup per fabric (ranks 1..), each on its own thread until `stop`
/// (or until its own stop flag, for the one a test takes away).
fn start_backups(
    fabrics: &[Arc<OfiFabric>],
    layout: &ReplicaLayout,
    mode: Mode,
    dir: &std::path::Path,
    leave: Option<(usize, Arc<AtomicBool>)>,
) -> Backups {
    let stop = Arc::new(AtomicBool::new(false));
    let following = Arc::new(Barrier::new(fabrics.len()));
    let mut threads = Vec::new();
    for fabric in fabrics.iter().skip(1) {
        let (fabric, layout, stop, dir, leave, following) = (
            fabric.clone(),
            layout.clone(),
            stop.clone(),
            dir.to_path_buf(),
            leave.clone(),
            following.clone(),
        );
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let rank = fabric.member_rank();
            let disk = SegmentDisk::new(dir.join(format!("member-{rank}")));
            let mut backup = Backup::follow(fabric.clone(), layout, mode, disk, 0, 0, IdleStrategy::DEFAULT_BACKOFF)?;
            following.wait();
            let leaves = leave.as_ref().filter(|(r, _)| *r == rank).map(|(_, f)| f.clone());
            loop {
                // Partner: the Release stores of the stop flags by the test.
                if stop.load(Ordering::Acquire) || leaves.as_ref().is_some_and(|f| f.load(Ordering::Acquire)) {
                    break;
                }
                if backup.failed() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            backup.stop()
        }));
    }
    following.wait();
    Backups { stop, threads }
}

impl Backups {
    fn stop(self) {
        // Partner: the Acquire loads in the backup threads.
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().expect("backup thread").expect("backup");
        }
    }
}

fn start_master(fabric: &Arc<OfiFabric>, layout: &ReplicaLayout, mode: Mode) -> Master<OfiFabric> {
    let live = fabric.clone();
    Master::start(
        fabric.clone(),
        layout.clone(),
        mode,
        0,
        (1..=BACKUPS).collect(),
        VALUE_BYTES_MAX,
        Box::new(move |r| live.member_alive(r)),
    )
    .expect("start the master")
}

/// The record ending at `head` as backup `b`'s fabric holds it (its copy
/// of the master's row 0), decoded: (key, value).
fn record_in_backup(fabric: &OfiFabric, layout: &ReplicaLayout, b: usize, head: u64, len: usize) -> (Vec<u8>, Vec<u8>) {
    let position = head - len as u64;
    let mut bytes = vec![0u8; len];
    fabric.row(0).copy_atomic(layout.area_offset(b, position), &mut bytes);
    let (record, _) = decode(&bytes, 0, position).unwrap_or_else(|e| panic!("backup {b} at {position}: {e:?}"));
    assert_eq!(record.kind, RecordKind::Put);
    (record.key.to_vec(), record.value.to_vec())
}

#[test]
fn an_acknowledged_write_is_in_every_backups_memory() {
    let layout = layout(Mode::OneSided);
    let (options, listeners) = options("rofi-ack", &layout, true);
    let fabrics = open_all(&options, listeners);
    assert!(
        fabrics[0].pushes_completed(1).is_some(),
        "delivery completions reported"
    );
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let backups = start_backups(&fabrics, &layout, Mode::OneSided, dir.path(), None);
    let mut master = start_master(&fabrics[0], &layout, Mode::OneSided);
    assert!(master.waits_for_backups(), "the completion queue is waited on");
    // No Spindle thread on the backups' write path: no echo thread (no
    // test of this file starts one; the rpc test's copiers may run beside
    // this test, so they are not counted here).
    assert!(threads_named("echo-").is_empty(), "{:?}", threads_named("echo-"));
    for i in 0..400u32 {
        let key = format!("key-{i:05}");
        let value = vec![(i % 251) as u8; 1 + (i as usize * 7) % VALUE_BYTES_MAX];
        master
            .append_record(RecordKind::Put, key.as_bytes(), &value, u64::from(i) + 1)
            .expect("append");
        let head = master.head();
        let len = encoded_len(key.len(), value.len());
        // Acknowledged: read at once, without waiting, in every backup.
        for (b, fabric) in fabrics.iter().enumerate().skip(1) {
            let guard = fabric.row(0).u64_at(layout.head.offset(b)).load(Ordering::Acquire);
            assert!(
                guard >= head,
                "backup {b}: guard {guard} < acknowledged head {head} (write {i})"
            );
            let (k, v) = record_in_backup(fabric, &layout, b, head, len);
            assert_eq!(k, key.as_bytes(), "backup {b}, write {i}");
            assert_eq!(v, value, "backup {b}, write {i}");
        }
    }
    assert_eq!(master.backups(), [1, 2, 3]);
    drop(master);
    backups.stop();
}

#[test]
fn a_lost_backup_is_dropped_and_writes_go_on() {
    let layout = layout(Mode::OneSided);
    let (options, listeners) = options("rofi-loss", &layout, true);
    let mut fabrics = open_all(&options, listeners);
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let leave = Arc::new(AtomicBool::new(false));
    let backups = start_backups(&fabrics, &layout, Mode::OneSided, dir.path(), Some((2, leave.clone())));
    let mut master = start_master(&fabrics[0], &layout, Mode::OneSided);
    for i in 0..50u64 {
        master
            .append_record(RecordKind::Put, b"k", b"before", i + 1)
            .expect("append");
    }
    // Backup 2 leaves: its thread stops and its fabric (endpoint and
    // control connection) closes.
    leave.store(true, Ordering::Release);
    let gone = fabrics.remove(2);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while Arc::strong_count(&gone) > 1 {
        assert!(std::time::Instant::now() < deadline, "backup 2's thread did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(gone);
    let mut i = 50u64;
    while master.backups().contains(&2) {
        assert!(std::time::Instant::now() < deadline, "backup 2 was never dropped");
        master
            .append_record(RecordKind::Put, b"k", b"during", i + 1)
            .expect("append while 2 leaves");
        master.check_backups();
        i += 1;
    }
    assert_eq!(master.backups(), [1, 3]);
    for j in 0..50u64 {
        master
            .append_record(RecordKind::Put, b"k", b"after", i + j + 1)
            .expect("append after");
        let head = master.head();
        for (fabric, b) in [(&fabrics[1], 1), (&fabrics[2], 3)] {
            let guard = fabric.row(0).u64_at(layout.head.offset(b)).load(Ordering::Acquire);
            assert!(guard >= head, "backup {b}: guard {guard} < acknowledged head {head}");
        }
    }
    drop(master);
    backups.stop();
}

#[test]
fn completion_queue_without_delivery_is_refused() {
    let layout = layout(Mode::OneSided);
    let (options, listeners) = options("rofi-nodc", &layout, false);
    let fabrics = open_all(&options, listeners);
    assert_eq!(fabrics[0].pushes_completed(1), None);
    let live = fabrics[0].clone();
    let err = Master::start(
        fabrics[0].clone(),
        layout.clone(),
        Mode::OneSided,
        0,
        (1..=BACKUPS).collect(),
        VALUE_BYTES_MAX,
        Box::new(move |r| live.member_alive(r)),
    )
    .err()
    .expect("refused");
    assert!(
        err.contains("reports no write completions") && err.contains("delivery_complete"),
        "{err}"
    );
}

#[test]
fn rpc_over_ofi_answers_every_write() {
    let layout = layout(Mode::Rpc);
    let (options, listeners) = options("rofi-rpc", &layout, true);
    let fabrics = open_all(&options, listeners);
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let backups = start_backups(&fabrics, &layout, Mode::Rpc, dir.path(), None);
    let mut master = start_master(&fabrics[0], &layout, Mode::Rpc);
    // Each backup starts its copier on its own thread, which names itself
    // once it runs: wait for them (bounded) rather than race their start.
    let started = std::time::Instant::now();
    while threads_named("rpc-").len() < BACKUPS && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        threads_named("rpc-").len() >= BACKUPS,
        "one copier per backup: {:?}",
        threads_named("rpc-")
    );
    for i in 0..200u64 {
        master
            .append_record(RecordKind::Put, b"rpc", &[7u8; 100], i + 1)
            .expect("append");
        let head = master.head();
        for b in 1..=BACKUPS {
            // The reply: the backup's own head[b], copied that far.
            let reply = fabrics[0].row(b).u64_at(layout.head.offset(b)).load(Ordering::Acquire);
            assert!(reply >= head, "backup {b} replied {reply} < {head}");
        }
    }
    drop(master);
    backups.stop();
}
