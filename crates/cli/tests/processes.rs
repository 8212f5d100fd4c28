//! End-to-end tests of the `spindle` binary: real member processes on
//! shared memory, as a user runs them.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;
use common::{run, spindle, text};

use spindle_group::invariants;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[test]
fn demo_members_deliver_the_same_sequence_and_logs_pass_the_checkers() {
    let dir = tempdir();
    let out = run(spindle()
        .args(["demo", "--count", "3000", "--size", "64", "--delivery-log"])
        .arg(dir.path()));
    assert!(out.status.success(), "demo failed: {}", text(&out));
    assert!(
        text(&out).contains("delivered the same 9000 messages in the same total order"),
        "{}",
        text(&out)
    );
    let logs = invariants::read_logs(dir.path()).expect("logs");
    assert_eq!(logs.len(), 3, "one log per member");
    let expected = BTreeMap::from([(0, 3000), (1, 3000), (2, 3000)]);
    invariants::check_all(&logs, &expected, true).expect("total order, FIFO, no duplication, no gaps");
    assert!(logs.values().all(|l| l.len() == 9000));
}

#[test]
fn demo_persistence_act_kills_every_member_and_loses_nothing_delivered() {
    let out = run(spindle().args(["demo", "--act", "persistence"]));
    let t = text(&out);
    assert!(out.status.success(), "demo --act persistence failed: {t}");
    assert!(t.contains("every member killed with SIGKILL"), "{t}");
    assert!(
        t.contains("all 3 restarted from their logs and agreed on the history"),
        "{t}"
    );
    assert!(t.contains("OK: nothing delivered before the kill was lost"), "{t}");
    let e = run(spindle().args(["demo", "--act", "nap"]));
    assert!(!e.status.success() && text(&e).contains("--act nap: expected persistence or membership"));
}

/// `spindle bench multicast ARGS` with a JSON report and delivery logs
/// in a fresh directory: (the directory, the report, the logs' folder).
fn bench_with_logs(args: &[&str]) -> (tempfile::TempDir, serde_json::Value, std::path::PathBuf) {
    let dir = tempdir();
    let json = dir.path().join("r.json");
    let logs_dir = dir.path().join("logs");
    let out = run(spindle()
        .args(["bench", "multicast"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--delivery-log")
        .arg(&logs_dir));
    assert!(out.status.success(), "bench failed: {}", text(&out));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (dir, report, logs_dir)
}

#[test]
fn bench_writes_json_with_the_documented_keys_and_unordered_logs_pass() {
    let (_dir, report, logs_dir) = bench_with_logs(&[
        "--members",
        "3",
        "--senders",
        "half",
        "--size",
        "100",
        "--count",
        "2000",
        "--mode",
        "unordered",
        "--window",
        "64",
    ]);
    for key in [
        "transport",
        "mode",
        "members",
        "senders",
        "size",
        "count",
        "delivered_gbps_min",
        "delivered_msgs_per_s_min",
        "latency_ns",
        "baseline_gbps",
        "ratio_to_baseline",
    ] {
        assert!(report.get(key).is_some(), "missing key {key}");
    }
    for p in ["p50", "p99", "p999"] {
        assert!(report["latency_ns"].get(p).is_some(), "missing latency_ns.{p}");
    }
    assert_eq!(report["transport"], "shm");
    assert_eq!(report["mode"], "unordered");
    assert!(report["baseline_gbps"].as_f64().unwrap() > 0.0);
    let logs = invariants::read_logs(&logs_dir).unwrap();
    // senders=half of 3 members: ranks 0 and 1.
    invariants::check_all(&logs, &BTreeMap::from([(0, 2000), (1, 2000)]), false).unwrap();
}

/// Messages bigger than the slot take the large-message path: every
/// member delivers each whole (its checksum matches what the sender
/// wrote), in one order, and the delivery logs (fragments before the last
/// pass as nulls) pass the checkers.
#[test]
fn bench_messages_larger_than_the_slot_arrive_whole_in_one_order() {
    large_messages_in_one_order("whole");
}

/// The same, with every member taking the large messages in place,
/// fragment by fragment (`--large-delivery in-place`): the checksums of
/// the fragments add up to what the sender wrote, and the delivery logs
/// (each message hashed across its fragments) pass the checkers.
#[test]
fn bench_messages_taken_in_place_arrive_whole_in_one_order() {
    large_messages_in_one_order("in-place");
}

fn large_messages_in_one_order(large_delivery: &str) {
    let (_dir, report, logs_dir) = bench_with_logs(&[
        "--members",
        "3",
        "--size",
        "50000",
        "--slot-size",
        "4096",
        "--count",
        "40",
        "--window",
        "16",
        "--large-delivery",
        large_delivery,
    ]);
    assert_eq!(report["size"], 50000);
    assert_eq!(report["large_delivery"], large_delivery);
    assert!(
        report["baseline_gbps"].as_f64().unwrap() > 0.0,
        "the raw ring of the same slots ran"
    );
    for m in report["member_results"].as_array().unwrap() {
        assert_eq!(m["delivered_msgs"], 120, "{m}");
        assert_eq!(m["counters"]["large_msgs"], 120, "{m}");
        assert_eq!(m["counters"]["large_msgs_cut"], 0, "{m}");
    }
    let logs = invariants::read_logs(&logs_dir).unwrap();
    invariants::check_all(&logs, &BTreeMap::from([(0, 40), (1, 40), (2, 40)]), true)
        .expect("total order, FIFO, no duplication, no gaps");
}

#[test]
fn bench_subgroups_runs_each_shard_in_its_own_order_beside_one_shard_alone() {
    let (_dir, report, logs_dir) =
        bench_with_logs(&["--members", "4", "--subgroups", "2", "--size", "64", "--count", "3000"]);
    assert_eq!(report["subgroups"], 2);
    assert_eq!(report["members_per_shard"], 2);
    let shards = report["all_shards"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2);
    assert_eq!(shards[0]["members"], serde_json::json!([0, 1]));
    assert_eq!(shards[1]["members"], serde_json::json!([2, 3]));
    assert!(report["all_shards"]["aggregate_msgs_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(report["one_shard"]["shards"].as_array().unwrap().len(), 1);
    assert!(report["ratio_aggregate_to_one_shard"].as_f64().unwrap() > 0.0);
    // Each shard (and the reference shard) passes the checkers on its own:
    // its 2 members delivered the 2 × 3000 messages of that shard only.
    for shard in ["all-shard-0", "all-shard-1", "one-shard-0"] {
        let logs = invariants::read_logs(&logs_dir.join(shard)).unwrap();
        assert_eq!(logs.len(), 2, "{shard}: one log per member of the shard");
        assert!(logs.values().all(|l| l.len() == 6000), "{shard}");
        invariants::check_all(&logs, &BTreeMap::from([(0, 3000), (1, 3000)]), true)
            .unwrap_or_else(|e| panic!("{shard}: {e}"));
    }
}

#[test]
fn a_killed_member_stops_the_bench_with_a_clear_error() {
    // A long run; kill -9 one member process and expect the coordinator to
    // stop the run with a clear error, not hang.
    let child = spindle()
        .args([
            "bench",
            "multicast",
            "--members",
            "3",
            "--size",
            "64",
            "--count",
            "100000000",
            "--no-baseline",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let coordinator = child.id();
    let victim = wait_for_member_pid(coordinator, Duration::from_secs(60)).expect("member processes appear");
    // SAFETY: kill(2) on a pid we just read from /proc; at worst it has exited.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let all = text(&out);
    assert!(!out.status.success(), "the run must fail: {all}");
    assert!(
        all.contains("is gone") || all.contains("failed"),
        "clear error expected: {all}"
    );
    // With membership the survivors would go on in a new view; the bench
    // itself fails the run and names the member it lost.
    assert!(all.contains("member"), "the error names the member: {all}");
}

/// The pid of a `spindle member` child of `parent`, once the group is running.
fn wait_for_member_pid(parent: u32, timeout: Duration) -> Option<u32> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if ppid == Some(parent) && cmdline.contains("member") && cmdline.contains("--rank\u{0}1") {
                // Give the group time to start moving messages.
                std::thread::sleep(Duration::from_millis(500));
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn bad_arguments_name_the_bad_value() {
    for (args, needle) in [
        (vec!["bench", "multicast", "--senders", "most"], "most"),
        (vec!["bench", "multicast", "--mode", "chaotic"], "chaotic"),
        (vec!["bench", "multicast", "--window", "100"], "--window 100"),
        (vec!["bench", "multicast", "--size", "8"], "--size 8"),
        (
            vec!["bench", "multicast", "--size", "2000", "--slot-size", "2000000"],
            "--slot-size 2000000 is larger than 1048576",
        ),
        (
            vec!["bench", "multicast", "--size", "2000000000"],
            "larger than the largest message, 1073741824 bytes",
        ),
        (
            vec!["bench", "multicast", "--size", "2000", "--slot-size", "20"],
            "too small to carry fragments",
        ),
        (vec!["bench", "multicast", "--members", "0"], "--members 0"),
        (
            vec!["bench", "multicast", "--members", "4", "--subgroups", "3"],
            "--subgroups 3 must divide --members 4",
        ),
        (vec!["bench", "multicast", "--idle", "nap"], "nap"),
        (vec!["demo", "--members", "99"], "--members 99"),
        (vec!["stat", "--group", "no-such-group-here"], "no-such-group-here"),
    ] {
        let out = run(spindle().args(&args));
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(
            text(&out).contains(needle),
            "{args:?}: error must name '{needle}': {}",
            text(&out)
        );
        assert!(
            !text(&out).contains("panicked"),
            "{args:?}: no panic trace: {}",
            text(&out)
        );
    }
}

#[test]
fn the_shm_file_is_removed_after_a_clean_run() {
    let out = run(spindle().args([
        "bench",
        "multicast",
        "--members",
        "2",
        "--size",
        "32",
        "--count",
        "1000",
        "--no-baseline",
    ]));
    assert!(out.status.success(), "{}", text(&out));
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("spindle-bench-") || n.starts_with("spindlebase-"))
        .filter(|n| !Path::new("/proc").join(n.rsplit('-').next().unwrap_or("")).exists())
        .collect();
    assert!(leftovers.is_empty(), "files left in /dev/shm: {leftovers:?}");
}
