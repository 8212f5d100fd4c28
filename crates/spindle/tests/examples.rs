//! Every example of the `spindle` crate runs and exits 0 (cargo builds the
//! examples before it runs the tests). Each run is bounded: a hung example
//! is killed and the test fails with its output. The examples run one at
//! a time (the rt ring's releases need the CPUs of this 2-core machine).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest an example may run before it counts as hung.
const EXAMPLE_RUN_MAX: Duration = Duration::from_secs(120);

/// `target/<profile>/examples/<name>`, found from this test's own path
/// (`target/<profile>/deps/examples-<hash>`).
fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    profile_dir.join("examples").join(name)
}

/// Run example `name` with `env`, wait (bounded), and return its stdout;
/// panics with the output unless it exits 0.
fn run_example(name: &str, args: &[&str], env: &[(String, String)]) -> String {
    run_example_exiting(name, args, env, &[0]).1
}

/// As [`run_example`], accepting any exit code in `codes`: the code and
/// stdout, stderr.
fn run_example_exiting(name: &str, args: &[&str], env: &[(String, String)], codes: &[i32]) -> (i32, String, String) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let path = example_path(name);
    assert!(path.exists(), "example {name} was not built at {}", path.display());
    let mut child = Command::new(&path)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start example {name}: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break Some(status);
        }
        if started.elapsed() > EXAMPLE_RUN_MAX {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().expect("the example's output");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    match status.map(|s| (s, s.code())) {
        Some((_, Some(code))) if codes.contains(&code) => (code, stdout, stderr),
        Some((s, _)) => panic!("example {name} failed ({s}):\n{stdout}\n{stderr}"),
        None => panic!("example {name} ran longer than {EXAMPLE_RUN_MAX:?}:\n{stdout}\n{stderr}"),
    }
}

/// Three free loopback ports (bound, then released for the example).
fn free_ports() -> Vec<u16> {
    let listeners: Vec<_> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("address").port())
        .collect()
}

#[test]
fn hello_shm_delivers_three_messages_in_one_order() {
    let out = run_example("hello_shm", &[], &[]);
    assert!(out.contains("OK: 3 members delivered the same 3 messages"), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("seq ")).count(), 3, "{out}");
}

#[test]
fn persistent_shm_logs_hold_exactly_what_was_delivered() {
    let out = run_example("persistent_shm", &[], &[]);
    assert_eq!(out.matches("holds the same 300, in order").count(), 3, "{out}");
    assert!(out.contains("OK: every message was on every member's disk"), "{out}");
}

#[test]
fn hello_tcp_opens_a_three_member_group_from_its_config_file() {
    let dir = tempfile::tempdir().expect("a directory for the key");
    let mut env: Vec<(String, String)> = free_ports()
        .iter()
        .enumerate()
        .map(|(id, port)| (format!("SPINDLE_MEMBER_{id}_ADDRESS"), format!("127.0.0.1:{port}")))
        .collect();
    let key = dir.path().join("hello.key");
    env.push(("SPINDLE_GROUP_KEY_FILE".into(), key.display().to_string()));
    let out = run_example("hello_tcp", &[], &env);
    assert!(
        out.contains("OK: member(s) [0, 1, 2] delivered the same 3 messages"),
        "{out}"
    );
    for id in 0..3 {
        assert!(
            out.contains(&format!("from member {id}: hello from member {id}")),
            "{out}"
        );
    }
}

#[test]
fn replicated_map_survives_a_kill_and_a_join() {
    let out = run_example("replicated_map", &[], &[]);
    assert!(out.contains("killing member 2"), "{out}");
    assert!(out.contains("all members hold the same map"), "{out}");
}

#[test]
fn kv_client_talks_to_the_replicated_store_through_the_redis_crate() {
    let out = run_example("kv_client", &[], &[]);
    assert!(out.contains("stopped cleanly"), "{out}");
}

/// `node X: received R/200, missed deadlines M, …` of the rt ring's output.
fn ring_node(out: &str, node: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("node {node}: received ")))
        .unwrap_or_else(|| panic!("no line for node {node}:\n{out}"));
    let number_after = |key: &str| -> u64 {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key:?} in {line:?}")) + key.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (number_after("received "), number_after("missed deadlines "))
}

/// Every message goes around the ring, or the example says which were
/// lost to missed deadlines (exit 2): a time-driven channel drops a
/// message only when a channel misses two jobs in a row, which a loaded
/// 2-vCPU host can make happen (CI did, 2026-12-03: 1 of 200 at each node,
/// 26-36 missed deadlines each; once on an idle one: 3 lost, 3-5 missed
/// each); no loss beyond what the misses explain. The catch-up after one
/// miss is checked deterministically in `crates/rt/tests/receive_catch_up.rs`.
#[test]
fn rt_ring_moves_every_message_around_the_ring() {
    let (code, out, err) = run_example_exiting("rt_ring", &[], &[], &[0, 2]);
    let nodes = ["A", "B", "C"];
    let counts: Vec<(u64, u64)> = nodes.iter().map(|n| ring_node(&out, n)).collect();
    if code == 0 {
        for (node, (received, _)) in nodes.iter().zip(&counts) {
            assert_eq!(*received, 200, "node {node}:\n{out}");
        }
        return;
    }
    assert!(err.contains("messages lost to missed deadlines"), "{out}\n{err}");
    assert!(counts.iter().any(|c| c.0 < 200), "exit 2 with nothing lost:\n{out}");
    for (k, (received, missed)) in counts.iter().enumerate() {
        // Node k receives what node k - 1 sends.
        let sender_missed = counts[(k + 2) % 3].1;
        assert!(
            2 * (200 - received) <= missed + sender_missed,
            "node {}: {} lost with {missed} + {sender_missed} missed deadlines:\n{out}\n{err}",
            nodes[k],
            200 - received
        );
    }
    eprintln!("rt_ring lost messages to missed deadlines on this host (allowed):\n{out}{err}");
}

#[test]
fn dds_sensor_monitor_sees_every_reading_and_the_dispose() {
    let out = run_example("dds_sensor", &[], &[]);
    assert!(
        out.contains("readings per sensor [20, 20, 20]; sensor 2 NotAliveDisposed"),
        "{out}"
    );
    assert!(out.contains("OK"), "{out}");
}

#[test]
fn dds_late_join_reader_gets_the_last_three_per_sensor() {
    let out = run_example("dds_late_join", &[], &[]);
    assert!(out.contains("OK"), "{out}");
}

#[test]
fn dds_ownership_fails_over_to_the_backup() {
    let out = run_example("dds_ownership", &[], &[]);
    assert!(
        out.contains(r#"after failover the monitor sees ["backup#4", "backup#5", "backup#6"]"#),
        "{out}"
    );
}

#[test]
fn large_shm_delivers_4_mib_messages_whole_in_one_order() {
    let out = run_example("large_shm", &[], &[]);
    assert!(out.contains("OK: 3 members delivered the same"), "{out}");
    assert_eq!(out.matches("delivered whole at every member").count(), 3, "{out}");
}

#[test]
fn elastic_shards_replaces_a_failed_member_with_the_spare_and_its_state() {
    let out = run_example("elastic_shards", &[], &[]);
    assert!(
        out.contains("OK: member 4 took member 1's place in kv shard 0"),
        "{out}"
    );
    assert!(out.contains("member 4: joined kv shard 0 holding 200 keys"), "{out}");
}

#[test]
fn sharded_map_keeps_each_shard_replicated_and_the_shards_disjoint() {
    let out = run_example("sharded_map", &[], &[]);
    assert!(out.contains("OK: each shard's 2 members hold the same map"), "{out}");
    assert_eq!(out.matches("kv shard 0 (rank").count(), 2, "{out}");
    assert_eq!(out.matches("kv shard 1 (rank").count(), 2, "{out}");
}
