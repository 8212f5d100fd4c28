//! Recovery scenarios on real shm members (threads of this process, each
//! with its own mapping of the group file): the master writes a random
//! number of objects of random sizes (crossing segments, so backups flush
//! to disk and flow control runs), then dies at a random point of its
//! next write — part of the record copied to some backups, nothing
//! published — and a backup must recover every acknowledged write.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use spindle_replica::node::{Leader, Node, NodeConfig};
use spindle_replica::record::{encoded_len, RecordKind};
use spindle_replica::Mode;

/// The simulator's generator: a seed reproduces the run.
use spindle_fabric::sim::SimRng as Rng;

fn config(group: &str, members: usize, mode: Mode, dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        mode,
        ..common::node_config(group, members, members - 1, 16 * 1024, dir)
    }
}

/// A cluster of `members` nodes; rank 0 leads first.
struct Cluster {
    leader: Option<(Leader, Node)>,
    followers: Vec<std::thread::JoinHandle<Result<(), String>>>,
    leaders: mpsc::Receiver<(Leader, Node)>,
    stop: Arc<AtomicBool>,
    group: String,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    /// Even when a scenario fails, leave no group file behind.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(
            std::path::Path::new("/dev/shm"),
            &self.group,
        ));
    }
}

impl Cluster {
    fn start(seed: u64, members: usize, mode: Mode) -> Cluster {
        // Segment files go to tmpfs: on a disk shared with busy builds an
        // fsync can stall for tens of seconds (journal commits), and these
        // tests check recovery logic, not the disk.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let group = format!("rrec-{}-{seed}-{}", std::process::id(), mode.as_str());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, leaders) = mpsc::channel();
        let mut followers = Vec::new();
        for rank in 1..members {
            let (cfg, stop, tx) = (config(&group, members, mode, dir.path()), stop.clone(), tx.clone());
            followers.push(std::thread::spawn(move || {
                let node = Node::open(cfg, rank)?;
                if let Some(leader) = node.run_until_master(&stop)? {
                    let _ = tx.send((leader, node));
                }
                Ok(())
            }));
        }
        let node = Node::open(config(&group, members, mode, dir.path()), 0).unwrap();
        let leader = node
            .run_until_master(&AtomicBool::new(false))
            .unwrap()
            .expect("rank 0 leads epoch 0");
        Cluster {
            leader: Some((leader, node)),
            followers,
            leaders,
            stop,
            group,
            _dir: dir,
        }
    }

    fn leader(&mut self) -> &mut Leader {
        &mut self.leader.as_mut().expect("a leader").0
    }

    /// The leader dies (its member leaves the group); wait for the next.
    fn kill_leader(&mut self) -> &mut Leader {
        drop(self.leader.take());
        let next = self
            .leaders
            .recv_timeout(Duration::from_secs(60))
            .expect("a backup takes over");
        self.leader = Some(next);
        self.leader()
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        drop(self.leader.take());
        for f in self.followers.drain(..) {
            f.join().expect("follower thread").expect("follower ran cleanly");
        }
    }
}

fn write(leader: &mut Leader, model: &mut HashMap<Vec<u8>, Vec<u8>>, key: Vec<u8>, value: Vec<u8>) {
    let version = leader.objects.next_version();
    leader
        .master
        .append_record(RecordKind::Put, &key, &value, version)
        .expect("append");
    leader.objects.put(&key, &value, version);
    model.insert(key, value);
}

fn assert_recovered(leader: &Leader, model: &HashMap<Vec<u8>, Vec<u8>>, torn: Option<(&[u8], &[u8])>) {
    let mut expected = model.len();
    if let Some((key, value)) = torn {
        // The torn write may survive only whole (it reached this backup
        // completely); it was never acknowledged, so either is linearizable.
        if let Some(o) = leader.objects.get(key) {
            if model.get(key).map(|v| &v[..]) != Some(&o.value[..]) {
                assert_eq!(&o.value[..], value, "a torn write survives only whole");
                expected += usize::from(!model.contains_key(key));
            }
        }
    }
    assert_eq!(
        leader.objects.len(),
        expected,
        "durability: acknowledged write lost (or invented)"
    );
    for (key, value) in model {
        let o = leader.objects.get(key).expect("durability: acknowledged write lost");
        if torn.map(|t| t.0) != Some(&key[..]) {
            assert_eq!(&o.value[..], &value[..], "durability: acknowledged value changed");
        }
    }
}

fn scenario(seed: u64, mode: Mode) {
    let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut cluster = Cluster::start(seed, 3, mode);
    let mut model = HashMap::new();
    let writes = rng.below(400);
    for _ in 0..writes {
        let key = format!("k{}", rng.below(64)).into_bytes();
        let value = vec![b'a' + rng.below(26) as u8; rng.below(2000) as usize];
        write(cluster.leader(), &mut model, key, value);
    }
    // Sometimes a batch (an MSET) was under way: part of it acknowledged
    // record by record, never as a whole: none of it may survive.
    if rng.below(2) == 0 {
        let n = 2 + rng.below(4) as u32;
        let leader = cluster.leader();
        let base = leader.objects.next_version();
        for i in 0..rng.below(n as u64) as u32 {
            let key = format!("batch{i}");
            leader
                .master
                .append_in_batch(RecordKind::Put, key.as_bytes(), b"partial", base + i as u64, n - 1 - i)
                .expect("batch append");
        }
    }
    // Die in the middle of the next write.
    let key = format!("k{}", rng.below(64)).into_bytes();
    let value = vec![b'Z'; rng.below(2000) as usize];
    let len = encoded_len(key.len(), value.len());
    let cut = rng.below(len as u64 + 1) as usize;
    let reached = rng.below(3) as usize;
    let leader = cluster.leader();
    let version = leader.objects.next_version();
    leader
        .master
        .append_torn(&key, &value, version, cut, reached)
        .expect("torn append");
    let next = cluster.kill_leader();
    let report = next.recovery.clone().expect("the new master recovered");
    assert!(report.end >= report.guard, "replay reached the guard");
    assert_recovered(next, &model, Some((&key, &value)));
    // The new master accepts writes, and survives another failover.
    let value = b"after failover".to_vec();
    let torn_survived = next.objects.get(&key).map(|o| o.value.to_vec());
    if let Some(v) = torn_survived {
        model.insert(key.clone(), v);
    }
    write(next, &mut model, b"after".to_vec(), value);
    let last = cluster.kill_leader();
    assert_recovered(last, &model, None);
    cluster.stop();
}

#[test]
fn master_killed_at_random_points_one_sided() {
    for seed in 1..=6 {
        scenario(seed, Mode::OneSided);
    }
}

#[test]
fn master_killed_at_random_points_rpc() {
    for seed in 11..=13 {
        scenario(seed, Mode::Rpc);
    }
}
