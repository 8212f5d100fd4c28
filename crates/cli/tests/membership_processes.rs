//! Membership with real processes: members are killed with SIGKILL,
//! stopped with SIGSTOP and resumed, and join a running group; the
//! survivors install new views and keep delivering, and every delivery log
//! (with its view lines) passes the checkers. Each test bounds its run and
//! kills what it started.

use std::path::Path;
use std::time::{Duration, Instant};

use spindle_bench::cluster::{free_ports, Cluster, Output};
use spindle_group::invariants::{self, read_lines};

/// Member processes of one scenario (`spindle view-member`), killed on
/// drop with the group's shm file and tcp stat files (which killed
/// members cannot remove).
fn members(ranks: usize, group: &str) -> Cluster {
    Cluster::with_exe(env!("CARGO_BIN_EXE_spindle"), ranks)
        .streams(Output::Capture, Output::Capture)
        .owns_group(group, ranks)
        .fail_on_panics()
}

/// Wait (bounded) for a member to exit; its status and output.
fn wait(m: &mut Cluster, rank: usize, timeout: Duration) -> (bool, String) {
    let exit = m.wait_exit(rank, timeout).unwrap_or_else(|e| panic!("{e}"));
    (exit.status.success(), exit.output)
}

/// The views `rank` installed so far (from its delivery log).
fn views(dir: &Path, rank: usize) -> Vec<(u64, Vec<usize>)> {
    let text = std::fs::read_to_string(dir.join(format!("member-{rank}.jsonl"))).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("\"members\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            let members = v["members"]
                .as_array()
                .map(|a| a.iter().filter_map(|m| m.as_u64()).map(|m| m as usize).collect())
                .unwrap_or_default();
            (v["view"].as_u64().unwrap_or(0), members)
        })
        .collect()
}

/// Wait (bounded) until `rank` has installed a view with exactly `members`.
fn wait_for_view(dir: &Path, rank: usize, members: &[usize], timeout: Duration) -> u64 {
    let started = Instant::now();
    loop {
        if let Some((id, _)) = views(dir, rank).iter().find(|(_, m)| m == members) {
            return *id;
        }
        assert!(
            started.elapsed() < timeout,
            "member {rank} did not install a view of {members:?} within {timeout:?}; its views: {:?}",
            views(dir, rank)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deliveries `rank` logged in view `view`.
fn delivered_in(dir: &Path, rank: usize, view: u64) -> usize {
    let text = std::fs::read_to_string(dir.join(format!("member-{rank}.jsonl"))).unwrap_or_default();
    let tag = format!("\"view\":{view},\"sender\"");
    text.lines().filter(|l| l.contains(&tag)).count()
}

fn wait_for_deliveries(dir: &Path, rank: usize, view: u64, at_least: usize, timeout: Duration) {
    let started = Instant::now();
    while delivered_in(dir, rank, view) < at_least {
        assert!(
            started.elapsed() < timeout,
            "member {rank} delivered only {} messages in view {view} within {timeout:?}; its views: {:?}",
            delivered_in(dir, rank, view),
            views(dir, rank)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn end_state(dir: &Path, rank: usize) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(format!("state-{rank}.json"))).expect("state file");
    serde_json::from_str(&text).expect("state JSON")
}

/// Every log in `dir` passes every checker (views included).
fn check_logs(dir: &Path) {
    let lines = read_lines(dir).expect("read logs");
    invariants::check_lines(&lines, true).expect("membership invariants and total order");
}

fn args(group: &str, dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--group",
        group,
        "--ranks",
        "4",
        "--initial",
        "0,1,2",
        "--dir",
        dir.to_str().unwrap(),
        "--rate",
        "1500",
        "--suspect-timeout-ms",
        "300",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Kill, join and stop in one group: three members start (rank 3 free),
/// member 2 is SIGKILLed, rank 3 joins, member 1 is SIGSTOPped past the
/// suspicion timeout and resumed. `transport`: extra member arguments;
/// `removed_errors`: what the resumed member may say.
fn kill_join_and_stop(group: &str, transport: &[&str], removed_errors: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let t = Duration::from_secs(20);
    let mut m = members(4, group);
    let member_args = |rank: usize, extra: &[&str]| {
        let mut a = vec!["view-member".to_string(), "--rank".into(), rank.to_string()];
        a.extend(args(group, d, transport));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    for r in 0..3 {
        m.start(r, member_args(r, &[])).expect("start a member");
    }
    wait_for_deliveries(d, 0, 0, 200, t);

    // SIGKILL member 2 during traffic (on tcp its connections reset): 0
    // and 1 go on without it.
    m.kill(2).expect("SIGKILL member 2");
    let v1 = wait_for_view(d, 0, &[0, 1], t);
    wait_for_view(d, 1, &[0, 1], t);
    wait_for_deliveries(d, 1, v1, 200, t);

    // A new process joins as rank 3 (on tcp the others accept its
    // connections after open): it gets the state and delivers.
    m.start(3, member_args(3, &["--join"])).expect("start the joiner");
    let v2 = wait_for_view(d, 3, &[0, 1, 3], t);
    wait_for_deliveries(d, 3, v2, 200, t);

    // SIGSTOP member 1 past the suspicion timeout (only its heartbeat
    // tells): 0 and 3 remove it.
    m.signal(1, libc::SIGSTOP).expect("SIGSTOP member 1");
    let v3 = wait_for_view(d, 0, &[0, 3], t);
    wait_for_deliveries(d, 3, v3, 200, t);
    // Resumed, it learns it was removed and stops with a clear error.
    m.signal(1, libc::SIGCONT).expect("SIGCONT member 1");
    let (ok, out) = wait(&mut m, 1, t);
    assert!(!ok, "the removed member must fail");
    assert!(removed_errors.iter().any(|e| out.contains(e)), "{out}");

    std::fs::write(d.join("stop"), b"").unwrap();
    for r in [0, 3] {
        let (ok, out) = wait(&mut m, r, t);
        assert!(ok, "member {r} failed: {out}");
    }
    // The survivors applied the same messages (the joiner from a snapshot).
    let (s0, s3) = (end_state(d, 0), end_state(d, 3));
    assert_eq!(s0["view"], s3["view"]);
    assert_eq!(s0["digest"], s3["digest"], "{s0} vs {s3}");
    assert_eq!(s0["applied"], s3["applied"]);
    check_logs(d);
}

#[test]
fn shm_kill_join_and_stop_each_give_a_new_view_and_the_logs_agree() {
    let group = format!("mship-shm-{}", std::process::id());
    kill_join_and_stop(&group, &[], &["was removed from the group"]);
}

#[test]
fn tcp_kill_join_and_stop_each_give_a_new_view_and_the_logs_agree() {
    let group = format!("mship-tcp-{}", std::process::id());
    let port = free_ports(4).expect("free loopback ports").to_string();
    kill_join_and_stop(
        &group,
        &["--transport", "tcp", "--base-port", &port],
        &["was removed from the group", "minority partition"],
    );
}

/// The same over libfabric (its tcp provider; a build with `--features
/// ofi`): a killed member's control connection resets and its writes
/// fail, a stopped one misses heartbeats.
#[cfg(feature = "ofi")]
#[test]
fn ofi_kill_join_and_stop_each_give_a_new_view_and_the_logs_agree() {
    let group = format!("mship-ofi-{}", std::process::id());
    let port = free_ports(4).expect("free loopback ports").to_string();
    kill_join_and_stop(
        &group,
        &["--transport", "ofi", "--base-port", &port],
        &["was removed from the group", "minority partition"],
    );
}
