//! Scenario tests: several members of one group, each on its own thread
//! with its own mapping of the group's shm file (as separate processes
//! would have), checked with the delivery-log invariant checkers.

use std::collections::BTreeMap;
use std::time::Duration;

use spindle_group::invariants::{self, LogEntry, Logs};
use spindle_group::{DeliveryMode, Group, GroupConfig, GroupError, SendError, SenderSet};

fn unique_name(test: &str) -> String {
    format!("t-{}-{test}", std::process::id())
}

struct Run {
    members: usize,
    senders: SenderSet,
    mode: DeliveryMode,
    per_sender: u64,
    window_slots: usize,
    batching: bool,
    sizes: fn(u64) -> usize,
    persist_dir: Option<std::path::PathBuf>,
}

impl Run {
    fn new(members: usize) -> Run {
        Run {
            members,
            senders: SenderSet::All,
            mode: DeliveryMode::Ordered,
            per_sender: 2_000,
            window_slots: 16,
            batching: true,
            sizes: |i| (i % 61) as usize + 1,
            persist_dir: None,
        }
    }

    /// Run every member to completion and return their delivery logs.
    fn go(&self, name: &str) -> Logs {
        let mut config = GroupConfig::new(&unique_name(name), self.members);
        config.senders = self.senders.clone();
        config.mode = self.mode;
        config.window_slots = self.window_slots;
        config.slot_payload_max = 64;
        config.batching = self.batching;
        config.persist_dir = self.persist_dir.clone();
        let sender_ranks = config.senders.ranks(self.members);
        let total = self.per_sender * sender_ranks.len() as u64;
        let threads: Vec<_> = (0..self.members)
            .map(|rank| {
                let config = config.clone();
                let (per_sender, sizes) = (self.per_sender, self.sizes);
                std::thread::spawn(move || member(config, rank, per_sender, total, sizes))
            })
            .collect();
        let mut logs = Logs::new();
        for (rank, t) in threads.into_iter().enumerate() {
            logs.insert(rank, t.join().expect("member thread"));
        }
        let expected: BTreeMap<usize, u64> = sender_ranks.iter().map(|r| (*r, self.per_sender)).collect();
        invariants::check_all(&logs, &expected, self.mode.is_total_order()).expect("invariants hold");
        logs
    }
}

fn member(config: GroupConfig, rank: usize, per_sender: u64, total: u64, sizes: fn(u64) -> usize) -> Vec<LogEntry> {
    let mut group = Group::join_shm(config, rank).expect("join");
    let sender = group.sender();
    let mut sent = 0u64;
    let mut log = Vec::new();
    let mut record = |d: &spindle_group::Delivery<'_>| {
        assert!(
            d.payload.iter().all(|b| *b == d.sender_rank as u8 + 1),
            "payload intact"
        );
        log.push(LogEntry {
            member: rank,
            view: d.view,
            sender: d.sender_rank,
            index: d.index,
            seq: d.seq,
            len: d.payload.len() as u64,
            xxh3: format!("{:016x}", xxhash_rust_free(d.payload)),
        });
    };
    loop {
        if let Some(s) = &sender {
            while sent < per_sender {
                let len = sizes(sent);
                match s.reserve(len) {
                    Ok(mut slot) => {
                        slot.payload_mut().fill(rank as u8 + 1);
                        slot.commit();
                        sent += 1;
                    }
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("send: {e}"),
                }
            }
        }
        group.poll_or_idle(&mut record).expect("poll");
        if done(&group, total) {
            break;
        }
    }
    group
        .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
        .expect("finish");
    log
}

fn done(group: &Group<spindle_fabric::shm::ShmFabric>, total: u64) -> bool {
    group.core().counters().values[spindle_group::counters::DELIVERED_MSGS] >= total
}

fn xxhash_rust_free(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn three_members_all_senders_ordered_agree_on_one_order() {
    Run::new(3).go("all3");
}

/// Persistent mode: one total order, and each member's log, read back,
/// holds exactly what it delivered, in that order, with the same bytes.
#[test]
fn persistent_mode_delivers_one_order_and_every_log_holds_exactly_it() {
    let dir = std::env::temp_dir().join(unique_name("persist3"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut run = Run::new(3);
    run.mode = DeliveryMode::Persistent;
    run.persist_dir = Some(dir.clone());
    let name = "persist3";
    let logs = run.go(name);
    for (rank, delivered) in &logs {
        let path = spindle_group::persist::log_path(&dir, &unique_name(name), *rank);
        let rec = spindle_group::persist::recover(&path).expect("log reads back");
        assert!(rec.dropped.is_none(), "member {rank}: a clean log drops nothing");
        let history = rec.history();
        assert_eq!(
            history.len(),
            delivered.len(),
            "member {rank}: log holds what it delivered"
        );
        for (h, d) in history.iter().zip(delivered) {
            assert_eq!((h.view, h.seq, h.sender_rank as usize), (d.view, d.seq, d.sender));
            assert_eq!(format!("{:016x}", xxhash_rust_free(h.payload)), d.xxh3);
        }
    }
    // (Starting again over these logs is a restart: persistent_restart.rs.)
    let mut config = GroupConfig::new(&unique_name(name), 3);
    config.mode = DeliveryMode::Persistent;
    let e = Group::join_shm(config, 0)
        .err()
        .expect("persistent mode needs a directory");
    assert!(e.to_string().contains("persist_dir"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unordered_mode_is_fifo_per_sender_with_no_gaps() {
    let mut run = Run::new(3);
    run.mode = DeliveryMode::Unordered;
    run.go("unord");
}

#[test]
fn one_sender_needs_no_nulls_and_half_senders_work() {
    let mut run = Run::new(2);
    run.senders = SenderSet::One;
    run.go("one");
    let mut run = Run::new(4);
    run.senders = SenderSet::Half;
    run.go("half");
}

#[test]
fn batching_off_delivers_the_same() {
    let mut run = Run::new(2);
    run.batching = false;
    run.go("nobatch");
}

#[test]
fn uneven_senders_are_unblocked_by_nulls() {
    // Sender 1 sends nothing: only nulls from it let sender 0's messages
    // become deliverable in the round-robin order.
    let mut run = Run::new(2);
    run.senders = SenderSet::Ranks(vec![0, 1]);
    run.per_sender = 0;
    let mut config = GroupConfig::new(&unique_name("nulls"), 2);
    config.window_slots = 8;
    config.slot_payload_max = 16;
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let config = config.clone();
            std::thread::spawn(move || {
                let mut group = Group::join_shm(config, rank).unwrap();
                let sender = group.sender().unwrap();
                let mut sent = 0;
                let mut got = 0u64;
                while got < 100 {
                    if rank == 0 && sent < 100 && sender.send(&[1, 2, 3]).is_ok() {
                        sent += 1;
                    }
                    group
                        .poll_or_idle(&mut |d: &spindle_group::Delivery<'_>| {
                            assert_eq!(d.sender_rank, 0, "only sender 0 sends data");
                            got += 1;
                        })
                        .unwrap();
                }
                group
                    .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
                    .unwrap();
                group.core().counters().values[spindle_group::counters::NULL_RUNS]
            })
        })
        .collect();
    let nulls: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(nulls[0], 0, "the busy sender never needs nulls");
    assert!(nulls[1] > 0, "the idle sender sent null runs");
}

#[test]
fn oversized_payload_is_rejected_not_truncated() {
    let mut config = GroupConfig::new(&unique_name("big"), 1);
    config.slot_payload_max = 100;
    let group = Group::join_shm(config, 0).unwrap();
    let err = group.sender().unwrap().send(&[0u8; 101]).unwrap_err();
    assert_eq!(
        err,
        SendError::TooLarge {
            len: 101,
            slot_payload_max: 100
        }
    );
}

#[test]
fn a_vanished_member_of_a_pair_leaves_a_minority_that_stops() {
    let config = GroupConfig::new(&unique_name("minority"), 2);
    let c1 = config.clone();
    let other = std::thread::spawn(move || {
        let g = Group::join_shm(c1, 1).unwrap();
        drop(g);
    });
    let mut group = Group::join_shm(config, 0).unwrap();
    other.join().unwrap();
    let err = loop {
        match group.poll_or_idle(&mut |_: &spindle_group::Delivery<'_>| {}) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, GroupError::MinorityPartition { rank: 0, view: 0, .. }),
        "got {err}"
    );
    assert!(err.to_string().contains("minority partition"), "{err}");
}

#[test]
fn a_vanished_member_is_reported_by_rank() {
    let mut config = GroupConfig::new(&unique_name("gone"), 2);
    config.membership = false;
    let c1 = config.clone();
    let other = std::thread::spawn(move || {
        let g = Group::join_shm(c1, 1).unwrap();
        drop(g); // leaves without finishing: looks like a departure mid-run
    });
    let mut group = Group::join_shm(config, 0).unwrap();
    other.join().unwrap();
    let err = loop {
        match group.poll_or_idle(&mut |_: &spindle_group::Delivery<'_>| {}) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, GroupError::MemberGone { rank: 1 }), "got {err}");
    assert!(err.to_string().contains("member 1 is gone"));
}

#[test]
fn bad_configuration_names_the_bad_value() {
    let mut config = GroupConfig::new("ok-name", 2);
    config.window_slots = 1000;
    let msg = config.validate().unwrap_err().to_string();
    assert!(msg.contains("window_slots = 1000"), "{msg}");
    let config = GroupConfig::new("bad/name", 2);
    assert!(config.validate().unwrap_err().to_string().contains("bad/name"));
    let mut config = GroupConfig::new("ok-name", 2);
    config.senders = SenderSet::Ranks(vec![5]);
    assert!(config.validate().unwrap_err().to_string().contains("rank 5"));
}

#[test]
fn several_application_threads_send_at_once_without_loss_or_duplication() {
    // Member 0 runs its protocol on a dedicated progress thread while four
    // application threads share clones of one Sender (lock-free
    // reservation); member 1 polls in invoker mode.
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 2_000;
    let mut config = GroupConfig::new(&unique_name("mt"), 2);
    config.senders = SenderSet::One;
    config.window_slots = 64;
    config.slot_payload_max = 16;
    let peer = {
        let config = config.clone();
        std::thread::spawn(move || {
            let mut group = Group::join_shm(config, 1).unwrap();
            let mut seen = std::collections::HashSet::new();
            while seen.len() < (THREADS * PER_THREAD) as usize {
                group
                    .poll_or_idle(&mut |d: &spindle_group::Delivery<'_>| {
                        let key = u64::from_le_bytes(d.payload[..8].try_into().unwrap());
                        assert!(seen.insert(key), "no duplication: {key:#x} delivered twice");
                    })
                    .unwrap();
            }
            group
                .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
                .unwrap();
            seen.len()
        })
    };
    let group = Group::join_shm(config, 0).unwrap();
    let sender = group.sender().unwrap();
    let delivered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = delivered.clone();
    let running = group.spawn(move |_: &spindle_group::Delivery<'_>| {
        counter.fetch_add(1, std::sync::atomic::Ordering::Release);
    });
    let apps: Vec<_> = (0..THREADS)
        .map(|t| {
            let sender = sender.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                while i < PER_THREAD {
                    let key = t << 32 | i;
                    match sender.reserve(16) {
                        Ok(mut slot) => {
                            slot.payload_mut()[..8].copy_from_slice(&key.to_le_bytes());
                            slot.payload_mut()[8..].copy_from_slice(&t.to_le_bytes());
                            slot.commit();
                            i += 1;
                        }
                        Err(SendError::WouldBlock) => std::thread::yield_now(),
                        Err(e) => panic!("send: {e}"),
                    }
                }
            })
        })
        .collect();
    for a in apps {
        a.join().unwrap();
    }
    while delivered.load(std::sync::atomic::Ordering::Acquire) < THREADS * PER_THREAD {
        std::thread::yield_now();
    }
    let mut group = running.stop().unwrap();
    group
        .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
        .unwrap();
    assert_eq!(
        peer.join().unwrap(),
        (THREADS * PER_THREAD) as usize,
        "every message reached the peer once"
    );
}

/// A counter replicated by ordered delivery, recording the views it saw.
#[derive(Default)]
struct Counter {
    sum: u64,
    views: Vec<(u64, Vec<usize>)>,
}

impl spindle_group::StateMachine for Counter {
    fn apply(&mut self, d: &spindle_group::Delivery<'_>) {
        self.sum += d.payload[0] as u64;
    }
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sum.to_le_bytes());
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.sum = u64::from_le_bytes(snapshot.try_into().map_err(|_| "8 bytes".to_string())?);
        Ok(())
    }
    fn view_installed(&mut self, view: &spindle_group::View) {
        self.views.push((view.id, view.members.clone()));
    }
}

/// Shares a `Replicated<Counter>` between the progress thread and the test.
struct Shared(std::sync::Arc<std::sync::Mutex<spindle_group::Replicated<Counter>>>);

impl spindle_group::Upcalls for Shared {
    fn deliver(&mut self, d: &spindle_group::Delivery<'_>) {
        self.0.lock().unwrap().deliver(d);
    }
    fn view_installed(&mut self, view: &spindle_group::View) {
        self.0.lock().unwrap().view_installed(view);
    }
    fn snapshot(&mut self, out: &mut Vec<u8>) {
        self.0.lock().unwrap().snapshot(out);
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.0.lock().unwrap().restore(snapshot)
    }
}

#[test]
fn spawned_members_get_view_changes_and_survive_a_member_leaving_abruptly() {
    let mut config = GroupConfig::new(&unique_name("spawned-views"), 3);
    config.suspect_timeout = Duration::from_millis(300);
    let groups: Vec<_> = (0..3)
        .map(|r| {
            let c = config.clone();
            std::thread::spawn(move || Group::join_shm(c, r).unwrap())
        })
        .collect();
    let mut groups: Vec<_> = groups.into_iter().map(|t| t.join().unwrap()).collect();
    let gone = groups.pop().unwrap();
    let states: Vec<_> = (0..2)
        .map(|_| {
            std::sync::Arc::new(std::sync::Mutex::new(
                spindle_group::Replicated::new(Counter::default()),
            ))
        })
        .collect();
    let senders: Vec<_> = groups.iter().map(|g| g.sender().unwrap()).collect();
    let threads: Vec<_> = groups
        .into_iter()
        .zip(&states)
        .map(|(g, s)| g.spawn(Shared(s.clone())))
        .collect();
    // Member 2 goes away without finishing: its fabric's drop is a leave
    // the others see, and they install a view without it.
    drop(gone);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while states
        .iter()
        .any(|s| !s.lock().unwrap().state.views.iter().any(|(_, m)| m == &vec![0, 1]))
    {
        assert!(std::time::Instant::now() < deadline, "no view without member 2");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The survivors go on: 100 messages of value 1 from each.
    for s in &senders {
        for _ in 0..100 {
            while s.send(&[1]).is_err() {
                std::thread::yield_now();
            }
        }
    }
    while states.iter().any(|s| s.lock().unwrap().state.sum < 200) {
        assert!(std::time::Instant::now() < deadline, "the survivors did not deliver");
        std::thread::sleep(Duration::from_millis(10));
    }
    for t in threads {
        assert!(!t.has_failed());
        let _ = t.stop();
    }
    for s in &states {
        let s = s.lock().unwrap();
        assert_eq!(s.state.sum, 200);
        assert_eq!(s.state.views[0], (0, vec![0, 1, 2]));
        assert_eq!(s.view.members, vec![0, 1]);
    }
}
