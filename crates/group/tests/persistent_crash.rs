//! Restart after a total failure, with real processes: three members of a
//! persistent group run as child processes (this test binary started
//! again), sending and delivering; at a random moment every one of them is
//! killed with SIGKILL; then all three start again over their logs.
//!
//! Checked at every round:
//! - **nothing delivered is lost**: what each member recorded as delivered
//!   before the kill (one `write` per delivery, right after the callback)
//!   is a prefix of the history the restarted members replay;
//! - **nothing is invented**: the members replay the same history, and in
//!   it each sender's messages of each round are its counters 0, 1, 2, …
//!   with no gap and no repeat (every message was sent, once).
//!
//! `SPINDLE_CRASH_ROUNDS` sets the number of rounds (default 5; the
//! measurement in bench/RESULTS.md ran 20).

mod child_process;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, SendError};

const MEMBERS: usize = 3;
const ENV_ROLE: &str = "SPINDLE_CRASH_ROLE";

/// One delivery as recorded: view, seq, payload (round, rank, counter).
type Entry = (u64, u64, Vec<u8>);

fn config(name: &str, dir: &Path) -> GroupConfig {
    let mut c = GroupConfig::new(name, MEMBERS);
    c.mode = DeliveryMode::Persistent;
    c.persist_dir = Some(dir.join("logs"));
    c.window_slots = 256;
    c.slot_payload_max = 64;
    c.join_timeout = Duration::from_secs(20);
    c
}

fn encode(e: &Entry) -> String {
    let hex: String = e.2.iter().map(|b| format!("{b:02x}")).collect();
    format!("{} {} {hex}\n", e.0, e.1)
}

fn decode(line: &str) -> Entry {
    let mut it = line.split(' ');
    let view = it.next().expect("view").parse().expect("view");
    let seq = it.next().expect("seq").parse().expect("seq");
    let hex = it.next().expect("payload");
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    (view, seq, bytes)
}

fn read_entries(path: &Path) -> Vec<Entry> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(decode)
        .collect()
}

/// The child: `run <round>` sends and delivers until killed, recording
/// every delivery; `check` restarts, records the replayed history, and
/// finishes with the others.
fn child(role: &str) {
    let mut words = role.split(':');
    let (what, name, dir, rank) = (
        words.next().expect("what"),
        words.next().expect("name").to_string(),
        PathBuf::from(words.next().expect("dir")),
        words.next().expect("rank").parse::<usize>().expect("rank"),
    );
    let round: u8 = words.next().map_or(0, |r| r.parse().expect("round"));
    let mut group = Group::join_shm(config(&name, &dir), rank).expect("join");
    let first_view = group.view().id;
    match what {
        "run" => {
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("delivered-{round}-{rank}")))
                .expect("record file");
            let mut record = |d: &Delivery<'_>| {
                // One write per delivery: a kill loses at most this record.
                out.write_all(encode(&(d.view, d.seq, d.payload.to_vec())).as_bytes())
                    .expect("record");
            };
            let sender = group.sender().expect("every member sends");
            let mut counter = 0u32;
            let mut ready = false;
            loop {
                if !ready && !group.core().is_replaying() {
                    // The history is handed over: the parent may now kill
                    // this member while new messages flow.
                    std::fs::write(dir.join(format!("ready-{round}-{rank}")), b"").expect("ready file");
                    ready = true;
                }
                loop {
                    let c = counter.to_le_bytes();
                    match sender.send(&[round, rank as u8, c[0], c[1], c[2], c[3]]) {
                        Ok(()) => counter += 1,
                        Err(SendError::WouldBlock) => break,
                        Err(e) => panic!("send: {e}"),
                    }
                }
                group.poll_or_idle(&mut record).expect("poll");
            }
        }
        "check" => {
            let mut replayed: Vec<Entry> = Vec::new();
            let mut record = |d: &Delivery<'_>| {
                assert!(d.view < first_view, "only the history is delivered in a check run");
                replayed.push((d.view, d.seq, d.payload.to_vec()));
            };
            group
                .finish_together(&mut record, Duration::from_secs(30))
                .expect("finish");
            let text: String = replayed.iter().map(encode).collect();
            std::fs::write(dir.join(format!("replayed-{round}-{rank}")), text).expect("write replayed");
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
fn every_member_killed_and_restarted_loses_nothing_delivered_and_invents_nothing() {
    let rounds: u8 = std::env::var("SPINDLE_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let name = format!("crash-{}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test dir");
    let mut seed = std::process::id() as u64 ^ 0x9E37_79B9_7F4A_7C15;
    let mut lost_total = 0usize;
    for round in 1..=rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // One round in four is killed at any moment from the start (while
        // the group forms or replays its history); the others once every
        // member has replayed it, while new messages flow.
        let from_start = seed.is_multiple_of(4);
        let run_ms = if from_start { 50 + seed % 700 } else { seed % 400 };
        let mut members: Vec<Child> = (0..MEMBERS)
            .map(|r| spawn(format!("run:{name}:{}:{r}:{round}", dir.display())))
            .collect();
        let ready = |r: usize| dir.join(format!("ready-{round}-{r}")).exists();
        let mut started = Instant::now();
        let mut waiting_ready = !from_start;
        while waiting_ready || started.elapsed() < Duration::from_millis(run_ms) {
            std::thread::sleep(Duration::from_millis(5));
            if let Some((r, s)) = members
                .iter_mut()
                .enumerate()
                .find_map(|(r, c)| c.try_wait().expect("wait").map(|s| (r, s)))
            {
                panic!("round {round}: member {r} exited on its own ({s})");
            }
            if waiting_ready && (0..MEMBERS).all(ready) {
                waiting_ready = false;
                started = Instant::now();
            }
            assert!(
                !waiting_ready || started.elapsed() < Duration::from_secs(60),
                "round {round}: the members did not replay their history within 60 s"
            );
        }
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
        let replayed: Vec<Vec<Entry>> = (0..MEMBERS)
            .map(|r| read_entries(&dir.join(format!("replayed-{round}-{r}"))))
            .collect();
        for (r, h) in replayed.iter().enumerate() {
            let differ = h.iter().zip(&replayed[0]).position(|(a, b)| a != b);
            assert!(
                h.len() == replayed[0].len() && differ.is_none(),
                "round {round}: member {r} replays another history than member 0: {} and {} messages, first difference at {differ:?}",
                h.len(),
                replayed[0].len()
            );
        }
        let history = &replayed[0];
        // Nothing lost: every member's deliveries before the kill are a
        // prefix of the history.
        for r in 0..MEMBERS {
            let before = read_entries(&dir.join(format!("delivered-{round}-{r}")));
            let differ = before.iter().zip(history).position(|(a, b)| a != b);
            assert!(
                before.len() <= history.len() && differ.is_none(),
                "round {round}: member {r} delivered {} messages before the kill; the restarted history ({}) does not start with them (first difference at {differ:?})",
                before.len(),
                history.len()
            );
            lost_total += before.len().saturating_sub(history.len());
        }
        // Nothing invented: per round and sender, counters 0, 1, 2, ….
        let mut next = std::collections::HashMap::<(u8, u8), u32>::new();
        for (view, seq, p) in history {
            assert_eq!(
                p.len(),
                6,
                "round {round}: a payload of {} bytes in view {view} seq {seq}",
                p.len()
            );
            let c = u32::from_le_bytes([p[2], p[3], p[4], p[5]]);
            let want = next.entry((p[0], p[1])).or_insert(0);
            assert_eq!(
                c, *want,
                "round {round}: round {} member {}'s counter {c} where {want} comes next (view {view} seq {seq})",
                p[0], p[1]
            );
            *want += 1;
        }
        eprintln!(
            "round {round}: killed {run_ms} ms after {}; history {} messages; delivered before the kill: {:?}",
            if from_start {
                "the start"
            } else {
                "the history was replayed"
            },
            history.len(),
            (0..MEMBERS)
                .map(|r| read_entries(&dir.join(format!("delivered-{round}-{r}"))).len())
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(lost_total, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
