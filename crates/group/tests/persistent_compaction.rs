//! Log compaction (persistent mode): a member's log is replaced, every
//! `compact_log_bytes`, by its application's snapshot and the records
//! after it; a restart restores the snapshot, then replays the rest.
//!
//! The application is a [`StateMachine`] whose state is the number of
//! messages applied, a hash chain over them (the digest after message `n`
//! names the whole history up to `n`), and each sender's next counter (it
//! checks that every sender's messages come 0, 1, 2, … with no gap and no
//! repeat: nothing invented, nothing applied twice, across snapshots).
//!
//! - In-process: two runs of three members over the same logs; the second
//!   starts from the snapshots and ends in the same state everywhere.
//! - Processes: every member killed with SIGKILL at a random moment while
//!   its log is being compacted, then restarted; every count → digest seen
//!   anywhere (deliveries before the kill, restored snapshots, replays,
//!   final states) must agree, and no member delivered more before the
//!   kill than the restarted group holds.
//!
//! `SPINDLE_COMPACTION_ROUNDS` sets the process test's rounds (default 3).

mod child_process;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use spindle_group::counters::{LOG_COMPACTIONS, SNAPSHOTS_RESTORED};
use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, Replicated, SendError, StateMachine};

const MEMBERS: usize = 3;
const ENV_ROLE: &str = "SPINDLE_COMPACTION_ROLE";
/// The smallest the configuration allows: many compactions per run.
const COMPACT_LOG_BYTES: u64 = 4096;

fn config(name: &str, dir: &Path) -> GroupConfig {
    let mut c = GroupConfig::new(name, MEMBERS);
    c.mode = DeliveryMode::Persistent;
    c.persist_dir = Some(dir.join("logs"));
    c.compact_log_bytes = COMPACT_LOG_BYTES;
    c.window_slots = 128;
    c.slot_payload_max = 64;
    c.join_timeout = Duration::from_secs(20);
    c
}

/// The replicated state (see the module docs), and where it reports each
/// step (not part of the state).
#[derive(Default)]
struct Chain {
    count: u64,
    digest: u64,
    /// (round, sender rank) → the counter its next message must carry.
    next: BTreeMap<(u8, u8), u32>,
    /// One line per applied message: `count digest`.
    out: Option<std::fs::File>,
    restored: Option<(u64, u64)>,
}

impl Chain {
    fn line(&mut self) {
        if let Some(out) = self.out.as_mut() {
            // One write per message: a kill loses at most this line.
            out.write_all(format!("{} {:016x}\n", self.count, self.digest).as_bytes())
                .expect("record");
        }
    }
}

impl StateMachine for Chain {
    fn apply(&mut self, d: &Delivery<'_>) {
        let p = d.payload;
        assert_eq!(
            p.len(),
            6,
            "a payload of {} bytes at view {} seq {}",
            p.len(),
            d.view,
            d.seq
        );
        let c = u32::from_le_bytes([p[2], p[3], p[4], p[5]]);
        let want = self.next.entry((p[0], p[1])).or_insert(0);
        assert_eq!(
            c, *want,
            "no gap, no repeat: round {} member {}'s counter {c} where {want} comes next (view {} seq {})",
            p[0], p[1], d.view, d.seq
        );
        *want += 1;
        self.count += 1;
        self.digest = (self.digest ^ u64::from_le_bytes([p[0], p[1], p[2], p[3], p[4], p[5], 0, 0]))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(23);
        self.line();
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.digest.to_le_bytes());
        for (&(round, rank), &next) in &self.next {
            out.extend_from_slice(&[round, rank]);
            out.extend_from_slice(&next.to_le_bytes());
        }
    }

    fn restore(&mut self, s: &[u8]) -> Result<(), String> {
        if s.len() < 16 || !(s.len() - 16).is_multiple_of(6) {
            return Err(format!("a chain snapshot of {} bytes", s.len()));
        }
        self.count = u64::from_le_bytes(s[..8].try_into().expect("8"));
        self.digest = u64::from_le_bytes(s[8..16].try_into().expect("8"));
        self.next = s[16..]
            .chunks(6)
            .map(|e| ((e[0], e[1]), u32::from_le_bytes([e[2], e[3], e[4], e[5]])))
            .collect();
        self.restored = Some((self.count, self.digest));
        Ok(())
    }
}

fn send_all(
    sender: &spindle_group::Sender<spindle_fabric::shm::ShmFabric>,
    round: u8,
    rank: usize,
    counter: &mut u32,
    until: u32,
) {
    while *counter < until {
        let c = counter.to_le_bytes();
        match sender.send(&[round, rank as u8, c[0], c[1], c[2], c[3]]) {
            Ok(()) => *counter += 1,
            Err(SendError::WouldBlock) => break,
            Err(e) => panic!("send: {e}"),
        }
    }
}

fn fresh_dir(test: &str) -> (String, PathBuf) {
    let name = format!("cmp-{}-{test}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test dir");
    (name, dir)
}

/// A member's end of a run: its final (count, digest), the state it
/// restored (if any), its log compactions and snapshots restored.
type RunEnd = ((u64, u64), Option<(u64, u64)>, u64, u64);

/// One in-process run: every member sends `per_member` messages of
/// `round` and finishes with the others.
fn run_threads(name: &str, dir: &Path, round: u8, per_member: u32) -> Vec<RunEnd> {
    let threads: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let config = config(name, dir);
            std::thread::spawn(move || {
                let mut group = Group::join_shm(config, rank).expect("join");
                let sender = group.sender().expect("every member sends");
                let mut app = Replicated::new(Chain::default());
                let mut counter = 0u32;
                let want = |app: &Replicated<Chain>| {
                    app.state
                        .next
                        .iter()
                        .filter(|(k, _)| k.0 == round)
                        .map(|(_, n)| *n as u64)
                        .sum::<u64>()
                };
                while counter < per_member || want(&app) < MEMBERS as u64 * per_member as u64 {
                    send_all(&sender, round, rank, &mut counter, per_member);
                    group.poll_or_idle(&mut app).expect("poll");
                }
                group
                    .finish_together(&mut app, Duration::from_secs(30))
                    .expect("finish");
                let c = &group.core().counters().values;
                (
                    (app.state.count, app.state.digest),
                    app.state.restored,
                    c[LOG_COMPACTIONS],
                    c[SNAPSHOTS_RESTORED],
                )
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("member")).collect()
}

#[test]
fn a_compacted_log_restarts_from_its_snapshot_and_the_records_after_it() {
    let (name, dir) = fresh_dir("threads");
    let first = run_threads(&name, &dir, 1, 1500);
    for (rank, (state, restored, compactions, _)) in first.iter().enumerate() {
        assert_eq!(
            *state, first[0].0,
            "total order: member {rank} ends in member 0's state"
        );
        assert_eq!(state.0, 3 * 1500);
        assert!(restored.is_none(), "a first start restores nothing");
        assert!(*compactions > 0, "member {rank} never compacted its log");
        let path = spindle_group::persist::log_path(&dir.join("logs"), &name, rank);
        let log = spindle_group::persist::recover(&path).expect("log reads back");
        assert!(log.dropped.is_none(), "{:?}", log.dropped);
        let snap = log.snapshot().expect("a compacted log starts with a snapshot");
        assert!(snap.seq > 0 || snap.view > 0);
        // Recovery reads the snapshot and the records after it, not the
        // 4,500 messages; the disk holds only those (the records before
        // are a hole, where the file system punches one: ext4, xfs, tmpfs).
        assert!(
            log.records.len() < 4500 / 2,
            "member {rank} reads {} records",
            log.records.len()
        );
        let meta = std::fs::metadata(&path).expect("log");
        let allocated = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
        eprintln!(
            "member {rank}: log {} B long, {allocated} B allocated, {} records read back",
            meta.len(),
            log.records.len()
        );
    }
    // The second run starts from each member's snapshot plus the records
    // after it: every member is back in the first run's final state
    // before the new messages, and all end alike.
    let second = run_threads(&name, &dir, 2, 500);
    for (rank, (state, restored, _, snapshots_restored)) in second.iter().enumerate() {
        assert_eq!(*snapshots_restored, 1, "member {rank} restored its snapshot");
        let (count, _) = restored.expect("restored");
        assert!(count <= first[rank].0 .0, "a snapshot holds only what was delivered");
        assert_eq!(
            *state, second[0].0,
            "total order: member {rank} ends in member 0's state"
        );
        assert_eq!(state.0, 3 * 1500 + 3 * 500, "nothing lost, nothing applied twice");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One observation: after `count` messages the digest was `digest`.
fn read_lines(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (c, d) = l.split_once(' ')?;
            Some((c.parse().ok()?, u64::from_str_radix(d, 16).ok()?))
        })
        .collect()
}

/// The child: `run` sends and delivers until killed, writing a line per
/// applied message; `check` restarts, replays, finishes with the others
/// and writes what it restored and where it ended.
fn child(role: &str) {
    let mut words = role.split(':');
    let (what, name, dir, rank, round) = (
        words.next().expect("what"),
        words.next().expect("name").to_string(),
        PathBuf::from(words.next().expect("dir")),
        words.next().expect("rank").parse::<usize>().expect("rank"),
        words.next().expect("round").parse::<u8>().expect("round"),
    );
    let mut group = Group::join_shm(config(&name, &dir), rank).expect("join");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{what}-{round}-{rank}")))
        .expect("record file");
    let mut app = Replicated::new(Chain {
        out: Some(out),
        ..Chain::default()
    });
    match what {
        "run" => {
            let sender = group.sender().expect("every member sends");
            let mut counter = 0u32;
            let mut ready = false;
            loop {
                if !ready && !group.core().is_replaying() {
                    std::fs::write(dir.join(format!("ready-{round}-{rank}")), b"").expect("ready file");
                    ready = true;
                }
                send_all(&sender, round, rank, &mut counter, u32::MAX);
                group.poll_or_idle(&mut app).expect("poll");
            }
        }
        "check" => {
            group
                .finish_together(&mut app, Duration::from_secs(30))
                .expect("finish");
            let s = &app.state;
            let restored = s.restored.map_or("none".to_string(), |(c, d)| format!("{c} {d:016x}"));
            std::fs::write(
                dir.join(format!("end-{round}-{rank}")),
                format!("{} {:016x}\n{restored}\n", s.count, s.digest),
            )
            .expect("end file");
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: String) -> Child {
    child_process::spawn_member(ENV_ROLE, role)
}

/// Not a test of its own: the body of a child process.
#[test]
fn member_process() {
    if let Ok(role) = std::env::var(ENV_ROLE) {
        child(&role);
    }
}

#[test]
fn every_member_killed_while_compacting_and_restarted_agrees_and_loses_nothing() {
    let rounds: u8 = std::env::var("SPINDLE_COMPACTION_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let (name, dir) = fresh_dir("kill");
    let mut seed = std::process::id() as u64 ^ 0x2545_F491_4F6C_DD1D;
    // count → digest, from every observation of every member and round.
    let mut seen: BTreeMap<u64, (u64, String)> = BTreeMap::new();
    let mut observe = |count: u64, digest: u64, what: String| {
        let (d, first) = seen.entry(count).or_insert((digest, what.clone()));
        assert_eq!(
            *d, digest,
            "total order: after {count} messages {what} has digest {digest:016x}, {first} had {d:016x}"
        );
    };
    let mut snapshots_restored = 0;
    for round in 1..=rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let run_ms = 100 + seed % 500;
        let mut members: Vec<Child> = (0..MEMBERS)
            .map(|r| spawn(format!("run:{name}:{}:{r}:{round}", dir.display())))
            .collect();
        let ready = |r: usize| dir.join(format!("ready-{round}-{r}")).exists();
        let waited = Instant::now();
        while !(0..MEMBERS).all(ready) {
            std::thread::sleep(Duration::from_millis(5));
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "round {round}: the members did not restart within 60 s"
            );
            if let Some(r) = members.iter_mut().position(|c| c.try_wait().expect("wait").is_some()) {
                panic!("round {round}: member {r} exited on its own");
            }
        }
        std::thread::sleep(Duration::from_millis(run_ms));
        for c in &mut members {
            c.kill().expect("SIGKILL");
        }
        for c in &mut members {
            let _ = c.wait();
        }
        let checks: Vec<Child> = (0..MEMBERS)
            .map(|r| spawn(format!("check:{name}:{}:{r}:{round}", dir.display())))
            .collect();
        for (r, mut c) in checks.into_iter().enumerate() {
            let status = c.wait().expect("wait");
            assert!(
                status.success(),
                "round {round}: the restarted member {r} failed: {status}"
            );
        }
        let mut ends = Vec::new();
        for r in 0..MEMBERS {
            let before = read_lines(&dir.join(format!("run-{round}-{r}")));
            for &(c, d) in &before {
                observe(c, d, format!("member {r} before the kill of round {round}"));
            }
            for &(c, d) in &read_lines(&dir.join(format!("check-{round}-{r}"))) {
                observe(c, d, format!("member {r}'s replay after round {round}"));
            }
            let end = std::fs::read_to_string(dir.join(format!("end-{round}-{r}"))).expect("end file");
            let mut lines = end.lines();
            let (c, d) = lines.next().and_then(|l| l.split_once(' ')).expect("end state");
            let end_state = (
                c.parse::<u64>().expect("count"),
                u64::from_str_radix(d, 16).expect("digest"),
            );
            observe(
                end_state.0,
                end_state.1,
                format!("member {r}'s state after round {round}"),
            );
            if let Some((c, d)) = lines.next().and_then(|l| l.split_once(' ')) {
                snapshots_restored += 1;
                observe(
                    c.parse().expect("count"),
                    u64::from_str_radix(d, 16).expect("digest"),
                    format!("member {r}'s snapshot restored after round {round}"),
                );
            }
            let delivered = before.last().map_or(0, |l| l.0);
            assert!(
                delivered <= end_state.0,
                "nothing lost: member {r} applied {delivered} messages before the kill of round {round}, \
                 the restarted group holds {}",
                end_state.0
            );
            ends.push(end_state);
        }
        assert!(
            ends.iter().all(|e| *e == ends[0]),
            "round {round}: the members end apart: {ends:?}"
        );
        eprintln!(
            "round {round}: killed {run_ms} ms after the restart; the group holds {} messages",
            ends[0].0
        );
    }
    assert!(
        snapshots_restored > 0,
        "no restart restored a snapshot: the logs were never compacted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
