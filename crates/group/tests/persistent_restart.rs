//! Persistent mode across restarts: members that start over their logs
//! agree on the history, hand it to the application first, and go on in a
//! new view (see `spindle_group::restart`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, SendError};

type Seen = Vec<(u64, u64, usize, Vec<u8>)>;

fn config(name: &str, dir: &Path) -> GroupConfig {
    let mut c = GroupConfig::new(name, 3);
    c.mode = DeliveryMode::Persistent;
    c.persist_dir = Some(dir.to_path_buf());
    c.window_slots = 64;
    c.slot_payload_max = 64;
    c
}

/// One run of every member: each sends `per_member` messages tagged with
/// `run`, delivers everything (the history first, on a restart), and
/// finishes with the others. Returns each member's deliveries.
fn run(name: &str, dir: &Path, run: u8, per_member: u64, expect_total: usize) -> Vec<Seen> {
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let config = config(name, dir);
            std::thread::spawn(move || {
                let mut group = Group::join_shm(config, rank).expect("join");
                let sender = group.sender().expect("every member sends");
                let mut seen: Seen = Vec::new();
                let mut sent = 0u64;
                let mut record = |d: &Delivery<'_>| seen.push((d.view, d.seq, d.sender_rank, d.payload.to_vec()));
                while sent < per_member
                    || group.core().counters().values[spindle_group::counters::DELIVERED_MSGS] < 3 * per_member
                {
                    while sent < per_member {
                        match sender.send(&[run, rank as u8, sent as u8, (sent >> 8) as u8]) {
                            Ok(()) => sent += 1,
                            Err(SendError::WouldBlock) => break,
                            Err(e) => panic!("send: {e}"),
                        }
                    }
                    group.poll_or_idle(&mut record).expect("poll");
                }
                group
                    .finish_together(&mut record, Duration::from_secs(30))
                    .expect("finish");
                seen
            })
        })
        .collect();
    let seen: Vec<Seen> = threads.into_iter().map(|t| t.join().expect("member")).collect();
    for (rank, s) in seen.iter().enumerate() {
        assert_eq!(
            s.len(),
            expect_total,
            "member {rank} delivered {} of {expect_total}",
            s.len()
        );
        assert_eq!(s, &seen[0], "total order: member {rank} agrees with member 0");
    }
    seen
}

fn fresh_dir(test: &str) -> (String, PathBuf) {
    let name = format!("t-{}-{test}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    (name, dir)
}

#[test]
fn a_restarted_group_replays_its_history_first_and_goes_on_in_a_new_view() {
    let (name, dir) = fresh_dir("restart");
    let first = run(&name, &dir, 1, 200, 600);
    assert!(first[0].iter().all(|d| d.0 == 0), "the first run is view 0");
    // Every member starts again over its log: the 600 messages come back
    // first, in the same order with the same bytes, then the new run's.
    let second = run(&name, &dir, 2, 100, 900);
    assert_eq!(
        &second[0][..600],
        &first[0][..],
        "the history is replayed first, unchanged"
    );
    assert!(
        second[0][600..].iter().all(|d| d.0 == 1 && d.3[0] == 2),
        "new messages are delivered in view 1, after the history"
    );
    // And once more: both runs' messages are the history now.
    let third = run(&name, &dir, 3, 10, 930);
    assert_eq!(&third[0][..900], &second[0][..]);
    assert!(third[0][900..].iter().all(|d| d.0 == 2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Member 1 joins a running group, member 0 (the one initial member)
/// leaves, member 1 delivers alone, and both are gone. Member 0's log is
/// the only one a restart reads; it records the view that went on
/// without it, so the restart is refused (the history is in member 1's
/// log) instead of rebuilt from member 0's older history, which would lose
/// what member 1 delivered alone.
#[test]
fn a_restart_whose_last_view_holds_only_a_joiner_is_refused_and_keeps_the_logs() {
    let (name, dir) = fresh_dir("joiner-alone");
    let config = || {
        let mut c = GroupConfig::new(&name, 2);
        c.mode = DeliveryMode::Persistent;
        c.persist_dir = Some(dir.clone());
        c.window_slots = 64;
        c.slot_payload_max = 64;
        c.initial_members = Some(vec![0]);
        c.join_timeout = Duration::from_secs(20);
        c
    };
    let first = config();
    let leaver = std::thread::spawn(move || {
        let mut group = Group::join_shm(first, 0).expect("join");
        let mut ignore = |_: &Delivery<'_>| {};
        while group.view().members.len() < 2 {
            group.poll_or_idle(&mut ignore).expect("poll");
        }
        group.leave(&mut ignore, Duration::from_secs(30)).expect("leave");
    });
    let delivered = std::cell::Cell::new(0u64);
    let mut count = |_: &Delivery<'_>| delivered.set(delivered.get() + 1);
    let mut joiner = Group::join_running_shm(config(), 1, &mut count).expect("join the running group");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while joiner.view().members != [1] {
        joiner.poll_or_idle(&mut count).expect("poll");
        assert!(std::time::Instant::now() < deadline, "member 1 never ran alone");
    }
    leaver.join().expect("the leaver");
    let sender = joiner.sender().expect("member 1 sends");
    let alone_from = delivered.get();
    let mut sent = 0u64;
    while delivered.get() < alone_from + 50 {
        if sent < 50 && sender.send(&sent.to_le_bytes()).is_ok() {
            sent += 1;
        }
        joiner.poll_or_idle(&mut count).expect("poll");
        assert!(
            std::time::Instant::now() < deadline,
            "member 1 delivered {}",
            delivered.get()
        );
    }
    // Gone without a word, as under SIGKILL: what it delivered is on its
    // disk (persistent delivery waits for that).
    drop(sender);
    drop(joiner);
    let err = match Group::join_shm(config(), 0) {
        Ok(_) => panic!("member 0 restarted from a log that lacks the 50 messages member 1 delivered"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("holds members [1] that joined a running group"), "{err}");
    let logs: Vec<String> = std::fs::read_dir(&dir)
        .expect("the log directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        logs.iter().all(|f| !f.contains("set-aside")),
        "nothing set aside: {logs:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
