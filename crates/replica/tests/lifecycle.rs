//! The store's life beyond one failover, on real members (threads of this
//! process, each with its own fabric): a spare replacing a dead backup,
//! log cleaning bounding the disk, a restart from disk after every member
//! stopped, and failover over the tcp fabric (loopback).
//!
//! Every wait is bounded (`recv_timeout`, loops with a deadline); no test
//! asserts a duration. Segment files go to tmpfs (`/dev/shm`) and are
//! removed with the temp dir.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_fabric::shm::ShmFabric;
use spindle_fabric::tcp::TcpFabric;
use spindle_replica::disk::SegmentDisk;
use spindle_replica::log::LogGeometry;
use spindle_replica::node::{log_bytes_max, Leader, Membership, Node, NodeConfig};
use spindle_replica::record::RecordKind;

const SEGMENT_BYTES: usize = 16 * 1024;

fn config(group: &str, members: usize, backups: usize, dir: &Path) -> NodeConfig {
    common::node_config(group, members, backups, SEGMENT_BYTES, dir)
}

/// A member not leading: its rank, its stop flag, its thread.
type Member = (usize, Arc<AtomicBool>, std::thread::JoinHandle<Result<(), String>>);

type Opener<F> = Arc<dyn Fn(usize) -> Result<Node<F>, String> + Send + Sync>;

/// Every member on its own thread; whoever leads is sent back.
struct Cluster<F: Membership> {
    leader: Option<(Leader<F>, Node<F>)>,
    /// (rank, its stop flag, its thread) of every member not leading.
    members: Vec<Member>,
    leaders: mpsc::Receiver<(Leader<F>, Node<F>)>,
}

impl<F: Membership> Cluster<F> {
    fn start(members: usize, open: Opener<F>) -> Cluster<F> {
        let (tx, leaders) = mpsc::channel();
        let mut threads = Vec::new();
        for rank in 0..members {
            let (open, tx) = (open.clone(), tx.clone());
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            threads.push((
                rank,
                stop,
                std::thread::spawn(move || {
                    let node = open(rank)?;
                    if let Some(leader) = node.run_until_master(&flag)? {
                        let _ = tx.send((leader, node));
                    }
                    Ok(())
                }),
            ));
        }
        let mut cluster = Cluster {
            leader: None,
            members: threads,
            leaders,
        };
        cluster.next_leader();
        cluster
    }

    fn next_leader(&mut self) -> &mut Leader<F> {
        let next = self
            .leaders
            .recv_timeout(Duration::from_secs(60))
            .expect("a member leads");
        let rank = next.1.rank();
        // The leader's thread has ended: it handed its node over.
        if let Some(i) = self.members.iter().position(|m| m.0 == rank) {
            let (_, _, t) = self.members.remove(i);
            t.join().expect("leader thread").expect("leader thread ran cleanly");
        }
        self.leader = Some(next);
        self.leader()
    }

    fn leader(&mut self) -> &mut Leader<F> {
        &mut self.leader.as_mut().expect("a leader").0
    }

    /// The leader dies (its member leaves the group); wait for the next.
    fn kill_leader(&mut self) -> &mut Leader<F> {
        drop(self.leader.take());
        self.next_leader()
    }

    /// Member `rank` (not the leader) stops and leaves.
    fn kill_member(&mut self, rank: usize) {
        let i = self.members.iter().position(|m| m.0 == rank).expect("a running member");
        let (_, stop, t) = self.members.remove(i);
        stop.store(true, Ordering::Release);
        t.join().expect("member thread").expect("member stopped cleanly");
    }

    /// Stop cleanly: the leader ends its epoch with every backup's log
    /// sealed; the others then return on their own (spares by flag).
    fn stop(mut self) {
        if let Some((mut leader, node)) = self.leader.take() {
            leader.stop().expect("clean stop");
            // Keep the leader's fabric until the backups have sealed
            // (`stop` waited for that) and returned.
            for (_, stop, t) in self.members.drain(..) {
                stop.store(true, Ordering::Release);
                t.join().expect("member thread").expect("member ran cleanly");
            }
            drop((leader, node));
        }
    }
}

impl<F: Membership> Drop for Cluster<F> {
    /// Stop and join every member (each returns at its stop flag, a
    /// backup after sealing its log), so nothing writes into the data
    /// directory after the test removes it.
    fn drop(&mut self) {
        for (_, stop, _) in &self.members {
            stop.store(true, Ordering::Release);
        }
        for (_, _, t) in self.members.drain(..) {
            let _ = t.join();
        }
    }
}

fn shm_opener(group: &str, members: usize, backups: usize, dir: &Path) -> Opener<ShmFabric> {
    let (group, dir) = (group.to_string(), dir.to_path_buf());
    Arc::new(move |rank| Node::open(config(&group, members, backups, &dir), rank))
}

fn tcp_opener(group: &str, members: usize, backups: usize, dir: &Path) -> Opener<TcpFabric> {
    let (listeners, addresses) = common::loopback_listeners(members);
    let listeners = std::sync::Mutex::new(listeners);
    let (group, dir) = (group.to_string(), dir.to_path_buf());
    Arc::new(move |rank| {
        let l = listeners.lock().unwrap()[rank].take();
        Node::open_tcp_on(
            config(&group, members, backups, &dir),
            rank,
            addresses.clone(),
            b"lifecycle test".to_vec(),
            l,
        )
    })
}

struct ShmGroup(String);
impl Drop for ShmGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &self.0));
    }
}

fn group_name(what: &str) -> ShmGroup {
    ShmGroup(format!("rlife-{}-{what}", std::process::id()))
}

fn write<F: Membership>(leader: &mut Leader<F>, model: &mut HashMap<Vec<u8>, Vec<u8>>, key: &[u8], value: &[u8]) {
    let version = leader.objects.next_version();
    leader
        .master
        .append_record(RecordKind::Put, key, value, version)
        .expect("append");
    leader.objects.put(key, value, version);
    model.insert(key.to_vec(), value.to_vec());
    leader.maintain().expect("housekeeping");
}

fn assert_store<F: Membership>(leader: &Leader<F>, model: &HashMap<Vec<u8>, Vec<u8>>) {
    assert_eq!(leader.objects.len(), model.len(), "durability: write lost or invented");
    for (key, value) in model {
        let o = leader
            .objects
            .get(key)
            .unwrap_or_else(|| panic!("durability: {} lost", String::from_utf8_lossy(key)));
        assert_eq!(
            &o.value[..],
            &value[..],
            "durability: value of {} changed",
            String::from_utf8_lossy(key)
        );
    }
}

fn fill<F: Membership>(leader: &mut Leader<F>, model: &mut HashMap<Vec<u8>, Vec<u8>>, tag: &str, n: usize) {
    for i in 0..n {
        let value = format!("{tag}-{i}-").repeat(1 + i % 40).into_bytes();
        write(leader, model, format!("key{}", i % 97).as_bytes(), &value);
    }
}

#[test]
fn a_spare_replaces_a_dead_backup_and_holds_every_write() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let group = group_name("spare");
    // 1 master + 2 backups + 1 spare.
    let mut cluster = Cluster::start(4, shm_opener(&group.0, 4, 2, dir.path()));
    let mut model = HashMap::new();
    fill(cluster.leader(), &mut model, "a", 300);
    assert_eq!(cluster.leader().master.backups(), &[1, 2]);
    cluster.kill_member(1);
    // The master notices within its check interval, at its next write.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while cluster.leader().master.backups() != [2, 3] {
        assert!(
            Instant::now() < deadline,
            "backup 1 was not replaced: {:?}",
            cluster.leader().master.backups()
        );
        write(
            cluster.leader(),
            &mut model,
            format!("during{}", i % 10).as_bytes(),
            b"x",
        );
        i += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cluster.leader().replacements, 1);
    fill(cluster.leader(), &mut model, "b", 200);
    // The new backup holds everything: the master dies, backup 2 takes
    // over; then it dies too and the former spare alone must have it all.
    let next = cluster.kill_leader();
    // Backups 2 and 3 both hold everything: either may win the election;
    // the other is its backup.
    let survivor = if next.master_rank() == 2 { 3 } else { 2 };
    assert_eq!(next.master.backups(), &[survivor], "the survivors are 2 and 3");
    assert_store(next, &model);
    write(next, &mut model, b"after", b"failover");
    let last = cluster.kill_leader();
    assert_store(last, &model);
    assert!(last.master.backups().is_empty(), "nobody left to back it up");
}

/// Overwrite 20 keys 1500 times each with ~200 B values (~8 MB of log,
/// ~500 segments without cleaning) under `clean_slack_segments = slack`:
/// after every write the epoch's log is within the cleaning bound (one
/// record past it at most), and every backup's disk within three epochs
/// of it; a failover then recovers every write. Returns the cleanings.
fn overwrite_hot_keys(slack: u64) -> u64 {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let group = group_name(&format!("clean{slack}"));
    let open: Opener<ShmFabric> = {
        let (group, dir) = (group.0.clone(), dir.path().to_path_buf());
        Arc::new(move |rank| {
            Node::open(
                NodeConfig {
                    clean_slack_segments: slack,
                    ..config(&group, 3, 2, &dir)
                },
                rank,
            )
        })
    };
    let mut cluster = Cluster::start(3, open);
    let mut model = HashMap::new();
    let geometry = LogGeometry {
        segment_bytes: SEGMENT_BYTES,
        segments_max: 4,
    };
    let mut bound = 0;
    for round in 0..1500 {
        for k in 0..20 {
            let value = vec![b'a' + (round % 26) as u8; 150 + (round * 7 + k) % 100];
            write(cluster.leader(), &mut model, format!("hot{k}").as_bytes(), &value);
            let leader = cluster.leader();
            let epoch_max = log_bytes_max(&leader.objects, &geometry, slack);
            assert!(
                leader.master.head() <= epoch_max + 512,
                "log cleaning: the epoch's log is {} bytes, past its bound {epoch_max} (slack {slack})",
                leader.master.head()
            );
        }
        let leader = cluster.leader();
        // A backup holds the previous epoch, the current one, and until
        // the current snapshot is on its disk the one before: each at most
        // log_bytes_max long (+1 segment for the record crossing it).
        let per_epoch = log_bytes_max(&leader.objects, &geometry, slack) / SEGMENT_BYTES as u64 + 2;
        bound = 3 * per_epoch as usize;
        if round % 100 == 99 {
            for b in 1..3 {
                let disk = SegmentDisk::new(dir.path().join(format!("member-{b}")));
                let files = disk.segment_files();
                assert!(files <= bound, "backup {b} holds {files} segments, bound {bound}");
            }
        }
    }
    let cleanings = cluster.leader().cleanings;
    println!("slack {slack}: cleanings {cleanings}, segment bound {bound}");
    let next = cluster.kill_leader();
    assert_store(next, &model);
    cleanings
}

#[test]
fn overwrites_stay_within_a_bound_of_segments() {
    let default = overwrite_hot_keys(spindle_replica::node::CLEAN_SLACK_SEGMENTS_DEFAULT);
    assert!(default > 10, "the log was cleaned ({default} times)");
    // 16 KiB segments, ~5 KB live: the bound is ~266 KB of log with 16
    // segments of slack, ~43 KB with 2.
    let tight = overwrite_hot_keys(2);
    assert!(
        tight > 3 * default,
        "a smaller slack cleans more often: {tight} cleanings with 2 segments, {default} with the default"
    );
}

/// Total stop, then restart with the same data directory. With `crash`,
/// the members' logs are made to look as if every process died at once
/// in the middle of the last write: the `sealed` markers are gone and the
/// last record of the newest epoch is torn (a byte flipped).
fn restart(crash: bool) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let group = group_name(if crash { "restart-crash" } else { "restart" });
    let mut model = HashMap::new();
    {
        let mut cluster = Cluster::start(3, shm_opener(&group.0, 3, 2, dir.path()));
        fill(cluster.leader(), &mut model, "first", 500);
        write(cluster.leader(), &mut model, b"last", b"the last write");
        cluster.stop();
    }
    drop(ShmGroup(group.0.clone()));
    if crash {
        let geometry = config("x", 3, 2, dir.path()).geometry;
        for b in 1..3 {
            let disk = SegmentDisk::new(dir.path().join(format!("member-{b}")));
            let e = disk.epochs()[0];
            let epoch_dir: PathBuf = disk.dir().join(format!("epoch-{e}"));
            std::fs::remove_file(epoch_dir.join("sealed")).unwrap();
            let segments = disk.read_segments(e).unwrap();
            let outcome = spindle_replica::replay::replay(
                &geometry,
                e,
                0,
                |k| segments.get(k as usize).map(|s| &s[..]),
                |_| Ok(()),
            )
            .unwrap();
            let last = outcome.end - 1;
            let k = last / SEGMENT_BYTES as u64;
            let path = epoch_dir.join(format!("segment-{k}"));
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[(last % SEGMENT_BYTES as u64) as usize] ^= 0x5A;
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let mut cluster = Cluster::start(3, shm_opener(&group.0, 3, 2, dir.path()));
    {
        let leader = cluster.leader();
        let report = leader.recovery.clone().expect("a restart recovers");
        assert_eq!(report.unsealed, crash);
        if crash {
            // The torn last record is dropped: either the last write (the
            // service never got to report it durable), or the marker of a
            // snapshot that then counts as incomplete (the epoch before,
            // which holds everything, is recovered instead).
            if leader.objects.get(b"last").is_none() {
                assert!(report.torn.is_some(), "a dropped record is reported as torn");
                model.remove(&b"last"[..]);
            }
        }
        assert_store(leader, &model);
    }
    fill(cluster.leader(), &mut model, "second", 50);
    let next = cluster.kill_leader();
    assert_store(next, &model);
    cluster.stop();
}

#[test]
fn restart_after_a_clean_stop_recovers_the_store() {
    restart(false);
}

#[test]
fn restart_after_every_member_died_drops_the_torn_tail() {
    restart(true);
}

/// On tcp a loss is never certain: an election needs a majority of all
/// five members, so two may be lost (a backup, then the master).
#[test]
fn tcp_failover_and_replacement_keep_every_write() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let mut cluster = Cluster::start(5, tcp_opener("rlife-tcp", 5, 2, dir.path()));
    let mut model = HashMap::new();
    fill(cluster.leader(), &mut model, "tcp", 300);
    cluster.kill_member(2);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while cluster.leader().master.backups() != [1, 3] {
        assert!(Instant::now() < deadline, "backup 2 was not replaced");
        write(cluster.leader(), &mut model, format!("t{}", i % 5).as_bytes(), b"y");
        i += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let next = cluster.kill_leader();
    assert_store(next, &model);
    write(next, &mut model, b"after", b"tcp failover");
    assert_store(next, &model);
}
