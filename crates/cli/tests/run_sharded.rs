//! `spindle run` with `[[subgroups]]` in the group file: each member runs
//! the workload in every shard it is in (each shard its own group and
//! total order), reports per shard, and a member in no shard says so and
//! exits 0.
//!
//! - shm, two overlapping subgroups of one shard of 2: both processes are
//!   in both shards, one thread each;
//! - tcp on loopback, 5 members, 2 shards of 2: each shard's members
//!   agree on its sequence digest, the two shards are different groups,
//!   and member 4 is in no shard;
//! - tcp with a member in two shards is refused with the reason;
//! - SIGTERM stops a member in two shards: it leaves both and exits 0.
//!
//! Every wait is bounded; every child is killed on the way out.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::spindle;

/// Upper bound of every wait (generous: CI machines are loaded).
const WAIT_MAX: Duration = Duration::from_secs(120);

/// Messages each sender of a shard multicasts.
const COUNT: u64 = 300;

/// One group at a time: the machine has 2 cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A group file of `members` members on loopback (fresh ports), its
/// `[group]` table with `group_extra`, then `tail` (the subgroups).
fn write_group(dir: &Path, group: &str, members: usize, group_extra: &str, tail: &str) -> PathBuf {
    let key = dir.join("group.key");
    common::write_key_file(&key, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    let mut text = format!(
        "[group]\nname = \"{group}\"\nkey_file = \"{}\"\nwindow_slots = 64\njoin_timeout_ms = 30000\n{group_extra}\n",
        key.display()
    );
    let base = spindle_bench::cluster::free_ports(members as u16).expect("free loopback ports");
    for id in 0..members {
        text += &format!("[[members]]\nid = {id}\naddress = \"127.0.0.1:{}\"\n", base + id as u16);
    }
    text += tail;
    let path = dir.join("group.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A member process, its output in files; killed if still running when
/// dropped.
struct Member {
    child: Child,
    id: usize,
    out: PathBuf,
}

impl Member {
    /// `spindle run` of member `id`, `COUNT` messages per sender unless
    /// `args` say otherwise.
    fn start(config: &Path, id: usize, dir: &Path, args: &[&str]) -> Member {
        let out = dir.join(format!("out-{id}.txt"));
        let file = std::fs::File::create(&out).unwrap();
        let count = COUNT.to_string();
        let args = if args.is_empty() {
            vec!["--count", &count]
        } else {
            args.to_vec()
        };
        let child = spindle()
            .args(["run", "--config"])
            .arg(config)
            .args(["--member", &id.to_string(), "--size", "64"])
            .args(args)
            .arg("--json")
            .arg(dir.join(format!("result-{id}.json")))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn spindle run");
        Member { child, id, out }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Wait (bounded) for a successful exit; the output.
    fn finish(&mut self) -> String {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let text = self.text();
                assert!(status.success(), "member {} failed ({status}):\n{text}", self.id);
                return text;
            }
            assert!(
                start.elapsed() < WAIT_MAX,
                "member {} did not finish; its output:\n{}",
                self.id,
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Member {
    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) has no memory effects; the pid is our own
        // child's, not yet reaped (it is reaped only in `finish`/drop).
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0, "signal member {}", self.id);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn result(dir: &Path, id: usize) -> serde_json::Value {
    let path = dir.join(format!("result-{id}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Run every member of `config` to its end; each one's output.
fn run_all(config: &Path, members: usize, dir: &Path) -> Vec<String> {
    let mut running: Vec<Member> = (0..members).map(|id| Member::start(config, id, dir, &[])).collect();
    running.iter_mut().map(Member::finish).collect()
}

/// The shard reports of one member's JSON, by group name.
fn shards_of(value: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    assert_eq!(value["errors"], serde_json::json!([]), "{value}");
    value["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("no shards: {value}"))
        .iter()
        .map(|s| (s["group"].as_str().unwrap().to_string(), s.clone()))
        .collect()
}

#[test]
fn on_shm_a_member_in_two_overlapping_shards_runs_both() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let subgroups = "[[subgroups]]\nname = \"a\"\nmembers_per_shard = 2\n\
                     [[subgroups]]\nname = \"b\"\nmembers_per_shard = 2\noverlapping = true\nsenders = [0]\n";
    let config = write_group(dir.path(), "rsh", 2, "transport = \"shm\"", subgroups);
    let outputs = run_all(&config, 2, dir.path());
    let mut digests = std::collections::BTreeMap::new();
    for (id, text) in outputs.iter().enumerate() {
        for shard in ["a.0", "b.0"] {
            assert!(
                text.contains(&format!("member {id} (shard {shard}: rank {id} of 2): delivered")),
                "member {id} reports shard {shard}:\n{text}"
            );
        }
        let shards = shards_of(&result(dir.path(), id));
        let groups: Vec<&str> = shards.iter().map(|(g, _)| g.as_str()).collect();
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert!(groups.contains(&"rsh.a.0") && groups.contains(&"rsh.b.0"), "{groups:?}");
        for (group, shard) in shards {
            // "a": both members send; "b": only shard rank 0 does.
            let senders = if group == "rsh.a.0" { 2 } else { 1 };
            assert_eq!(
                shard["delivered_msgs"],
                COUNT * senders,
                "{group} at member {id}: {shard}"
            );
            assert_eq!(shard["shard_rank"], id, "{shard}");
            digests
                .entry(group)
                .or_insert_with(Vec::new)
                .push(shard["sequence_digest"].clone());
        }
    }
    for (group, d) in &digests {
        assert_eq!(d.len(), 2, "{group}");
        assert_eq!(
            d[0], d[1],
            "total order: both members of {group} delivered one sequence"
        );
    }
}

#[test]
fn on_tcp_each_shard_is_its_own_group_and_a_member_in_none_exits_0() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let subgroups = "[[subgroups]]\nname = \"kv\"\nshards = 2\nmembers_per_shard = 2\n";
    let config = write_group(dir.path(), "rst", 5, "", subgroups);
    let outputs = run_all(&config, 5, dir.path());
    assert!(
        outputs[4].contains("member 4 of group 'rst' is in no shard of its 1 subgroup(s)"),
        "{}",
        outputs[4]
    );
    assert!(
        !dir.path().join("result-4.json").exists(),
        "nothing ran, nothing written"
    );
    // StickyLayout's first view: shards in rank order.
    let mut by_group = std::collections::BTreeMap::new();
    for id in 0..4 {
        let shards = shards_of(&result(dir.path(), id));
        assert_eq!(shards.len(), 1, "member {id}: {shards:?}");
        let (group, shard) = &shards[0];
        assert_eq!(group, &format!("rst.kv.{}", id / 2), "member {id}");
        assert_eq!(shard["shard_members"], serde_json::json!([id / 2 * 2, id / 2 * 2 + 1]));
        assert_eq!(shard["delivered_msgs"], COUNT * 2, "member {id}: {shard}");
        by_group
            .entry(group.clone())
            .or_insert_with(Vec::new)
            .push(shard["sequence_digest"].clone());
    }
    assert_eq!(by_group.len(), 2);
    for (group, d) in &by_group {
        assert_eq!(d[0], d[1], "total order in {group}");
    }
}

#[test]
fn on_tcp_a_member_in_two_shards_is_refused_with_the_reason() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let subgroups = "[[subgroups]]\nname = \"a\"\nmembers_per_shard = 2\n\
                     [[subgroups]]\nname = \"b\"\nmembers_per_shard = 2\noverlapping = true\n";
    let config = write_group(dir.path(), "rsr", 2, "", subgroups);
    let out = common::run(spindle().args(["run", "--config"]).arg(&config).args(["--member", "0"]));
    let text = common::text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("member 0 is in 2 shards") && text.contains("transport = \"shm\""),
        "{text}"
    );
}

/// Whether every shard folder under `logs` has a delivery log with at
/// least `lines` lines for each of `members` members.
fn shard_logs_have(logs: &Path, groups: &[&str], members: usize, lines: usize) -> bool {
    groups.iter().all(|g| {
        let files: Vec<_> = std::fs::read_dir(logs.join(g))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.len() >= members
            && files.iter().all(|f| {
                std::fs::read_to_string(f)
                    .map(|t| t.lines().count() >= lines)
                    .unwrap_or(false)
            })
    })
}

#[test]
fn sigterm_stops_a_member_in_two_shards_and_it_leaves_both() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let subgroups = "[[subgroups]]\nname = \"a\"\nmembers_per_shard = 2\n\
                     [[subgroups]]\nname = \"b\"\nmembers_per_shard = 2\noverlapping = true\n";
    let config = write_group(dir.path(), "rsg", 2, "transport = \"shm\"", subgroups);
    let log_dir = logs.to_str().unwrap();
    let args = ["--service", "--rate", "500", "--delivery-log", log_dir];
    let mut members: Vec<Member> = (0..2).map(|id| Member::start(&config, id, dir.path(), &args)).collect();
    let start = Instant::now();
    while !shard_logs_have(&logs, &["rsg.a.0", "rsg.b.0"], 2, 100) {
        assert!(
            start.elapsed() < WAIT_MAX,
            "no deliveries in both shards; outputs:\n{}\n{}",
            members[0].text(),
            members[1].text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in [1usize, 0] {
        members[id].signal(libc::SIGTERM);
        let text = members[id].finish();
        assert!(text.contains("left the group"), "member {id}:\n{text}");
        let shards = shards_of(&result(dir.path(), id));
        assert_eq!(shards.len(), 2, "member {id}: {shards:?}");
        for (group, shard) in shards {
            assert!(
                shard["delivered_msgs"].as_u64().unwrap() >= 100,
                "{group} at member {id}: {shard}"
            );
        }
    }
}
