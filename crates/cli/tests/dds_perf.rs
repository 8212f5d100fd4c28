//! `spindle dds perf pair --latency`: ping and pong answer in the reader's
//! listener (ddsperf's default) or on the application thread, saturating
//! or at a rate, over shm and tcp: every ping is echoed once and timed.

use std::process::Command;

mod common;

/// The longest one perf pair may run (its roles bound their own waits).
const PAIR_TIMEOUT_S: &str = "120";

/// Run `spindle dds perf pair --latency` with `args` and return its JSON.
fn latency_pair(domain: u32, args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("perf.json");
    let mut command = Command::new("timeout");
    command
        .args([PAIR_TIMEOUT_S, env!("CARGO_BIN_EXE_spindle")])
        .args(["dds", "perf", "pair", "--latency", "--size", "16", "--seconds", "0.5"])
        .args(["--domain", &domain.to_string()])
        .args(args)
        .arg("--json")
        .arg(&json);
    let out = common::run(&mut command);
    assert!(out.status.success(), "dds perf pair {args:?}: {}", common::text(&out));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

#[test]
fn ping_and_pong_answer_every_sample_once_in_the_listener_and_on_the_application_thread() {
    let runs: [(&[&str], &str); 5] = [
        (&["--trigger", "listener"], "listener"),
        (&[], "listener"),
        (&["--trigger", "waitset"], "waitset"),
        (&["--trigger", "listener", "--rate", "2000"], "listener"),
        (&["--trigger", "listener", "--transport", "tcp"], "listener"),
    ];
    for (i, (args, trigger)) in runs.into_iter().enumerate() {
        let result = latency_pair(470 + i as u32, args);
        assert_eq!(result["test"], "ping-pong", "{result}");
        assert_eq!(
            result["trigger"], trigger,
            "the JSON says where pings were answered: {result}"
        );
        let written = result["written"].as_u64().unwrap();
        let received = result["received"].as_u64().unwrap();
        assert!(received > 0, "{args:?}: some round trips: {result}");
        assert_eq!(received, written, "{args:?}: every ping echoed once: {result}");
        assert_eq!(
            result["latency_ns"]["samples"].as_u64().unwrap(),
            received,
            "{args:?}: every round trip timed: {result}"
        );
        if args.contains(&"--rate") {
            // 2,000 pings a second for half a second, one at a time.
            assert!(received <= 1_100, "{args:?}: paced by --rate: {result}");
        }
    }
}

#[test]
fn a_bad_trigger_is_refused_with_the_choices() {
    let out = common::run(common::spindle().args(["dds", "perf", "pair", "--latency", "--trigger", "poll"]));
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(text.contains("listener") && text.contains("waitset"), "{text}");
    // A trigger for pub/sub, which has none.
    let out = common::run(common::spindle().args(["dds", "perf", "pair", "--trigger", "waitset"]));
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(text.contains("--trigger applies to ping and pong"), "{text}");
    // NAPA's pacing sleeps: not in a listener on the progress thread.
    let out = common::run(common::spindle().args(["dds", "perf", "pair", "--latency", "--napa", "on"]));
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(text.contains("--trigger waitset"), "{text}");
}
