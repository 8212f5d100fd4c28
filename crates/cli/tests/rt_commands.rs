//! End-to-end tests of `spindle rt …`: real member processes on shared
//! memory. Timing is never asserted (this may be a loaded shared VM);
//! what is asserted: the commands run, the JSON has its documented keys,
//! the clock's true time stays inside its reported interval, misses are
//! counted, and bad input fails with a message naming the bad value.

mod common;
use common::{run, spindle, text};

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json written")).expect("valid json")
}

/// A 20-period ring of 20 ms without SCHED_FIFO or calibration, its
/// release jitter declared 0: what admission decides then depends on the
/// flags a test adds, not on the host.
/// `spindle rt ring ARGS` without SCHED_FIFO, a short calibration and no
/// release jitter assumed (the tests declare what they need).
fn quiet_ring(args: &[&str]) -> std::process::Command {
    let mut ring = spindle();
    ring.args(["rt", "ring"]).args(args).args([
        "--no-fifo",
        "--jitter-samples",
        "20",
        "--calibration-ms",
        "0",
        "--declared-jitter-us",
        "0",
    ]);
    ring
}

fn short_ring() -> std::process::Command {
    quiet_ring(&["--periods", "20", "--period-us", "20000"])
}

fn assert_summary(v: &serde_json::Value, key: &str) {
    for q in ["p50", "p99", "max"] {
        assert!(v[key][q].is_u64(), "{key}.{q} missing in {v}");
    }
}

#[test]
fn ring_runs_and_reports_the_documented_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring.json");
    let plot = dir.path().join("ring.svg");
    let record = dir.path().join("state/interference.json");
    let out = run(spindle()
        .args(["rt", "ring", "--periods", "20", "--period-us", "20000", "--no-fifo"])
        .arg("--host-record")
        .arg(&record)
        .args(["--host-warmup-s", "0"])
        // A loaded machine without SCHED_FIFO: budgets that do not depend on it.
        .args([
            "--jitter-samples",
            "20",
            "--calibration-ms",
            "200",
            "--declared-jitter-us",
            "0",
            "--declared-interference-us",
            "0",
            "--clock-budget-us",
            "500",
            "--json",
        ])
        .arg(&path)
        .arg("--plot")
        .arg(&plot));
    assert!(out.status.success(), "ring failed: {}", text(&out));
    let v = json(&path);
    assert_eq!(v["periods"], 20);
    assert!(v["missed"].is_u64() && v["late"].is_u64(), "{v}");
    assert_summary(&v, "latency_ns");
    assert_summary(&v, "jitter_ns");
    assert_summary(&v, "release_jitter_ns");
    assert_eq!(
        v["tasks"].as_array().unwrap().len(),
        9,
        "the 9 tasks of the ring are printed and recorded"
    );
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    // Without --spin-us every node tunes its spin window and says so.
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(n["spin"]["auto"], true, "{n}");
        assert!(n["spin"]["window_ns"].as_u64().unwrap() <= n["spin"]["cap_ns"].as_u64().unwrap());
    }
    assert!(text(&out).contains("spin window"), "{}", text(&out));
    // Every node reports the interference it calibrated and admitted.
    for n in v["nodes"].as_array().unwrap() {
        assert!(n["interference"]["wakeups"].as_u64().unwrap() > 0, "{n}");
        assert_eq!(n["interference"]["interference_admitted_ns"], 0, "declared: {n}");
    }
    assert_eq!(v["outcome"], "ran", "{v}");
    assert!(text(&out).contains("interference: admitted"), "{}", text(&out));
    // What the launcher and the members observed went into the host record.
    let r = json(&record);
    assert_eq!(r["version"], 1, "{r}");
    assert!(r["observations"].as_u64().unwrap() > 0, "{r}");
    assert!(r["host"].is_string() && r["interference_max_ns"].is_u64(), "{r}");
}

#[test]
fn a_stall_in_the_host_record_makes_admission_reject_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("interference.json");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "unknown-host".to_string()
    } else {
        host
    };
    // A run on this host once lost its CPU for 30 ms: the 20 ms ring
    // (deadlines ≈ 2 ms) cannot promise its deadlines, whatever this
    // run's (zero-length) calibration sees.
    let stall = serde_json::json!({
        "version": 1,
        "host": host,
        "interference_max_ns": 30_000_000u64,
        "interference_seen": {"unix_time_s": 1_764_000_000u64, "source": "spindle rt ring, node B: in the run, longest gap of a dispatcher spin"},
        "release_jitter_max_ns": 0,
        "release_jitter_seen": null,
        "observations": 1,
        // Watched for an hour: no warm-up calibration first.
        "observed_ns": 3_600_000_000_000u64
    });
    std::fs::write(&record, stall.to_string()).unwrap();
    let path = dir.path().join("ring-recorded.json");
    let out = run(short_ring()
        .arg("--host-record")
        .arg(&record)
        .args(["--clock-budget-us", "500", "--json"])
        .arg(&path));
    assert!(
        !out.status.success(),
        "a rejected ring exits with an error: {}",
        text(&out)
    );
    let v = json(&path);
    assert_eq!(v["outcome"], "rejected at commit", "{v}");
    let reason = v["rejected_at_commit"].as_str().unwrap().to_string();
    for needle in ["task 'n", "needs a deadline of at least", "interference 30000000 ns"] {
        assert!(reason.contains(needle), "'{needle}' not in: {reason}");
    }
    let t = text(&out);
    assert!(
        t.contains("30000 µs (spindle rt ring, node B"),
        "the record's source is printed: {t}"
    );
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(n["interference"]["interference_recorded_ns"], 30_000_000u64, "{n}");
    }
    // --no-host-record admits on the run's own calibration (declared 0 here).
    let out = run(short_ring()
        .arg("--host-record")
        .arg(&record)
        .arg("--no-host-record")
        .args(["--clock-budget-us", "500"]));
    assert!(
        text(&out).contains("cannot be used with"),
        "--host-record and --no-host-record conflict: {}",
        text(&out)
    );
    let out =
        run(short_ring()
            .arg("--no-host-record")
            .args(["--declared-interference-us", "0", "--clock-budget-us", "500"]));
    assert!(out.status.success(), "without the record: {}", text(&out));
}

#[test]
fn a_ring_the_host_cannot_promise_is_rejected_at_commit_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring-rejected.json");
    let out = run(short_ring()
        // A host that takes the CPU for 5 ms at once: the 20 ms ring's
        // deadlines (≈ 2 ms) cannot hold.
        .args([
            "--declared-interference-us",
            "5000",
            "--clock-budget-us",
            "500",
            "--json",
        ])
        .arg(&path));
    assert!(
        !out.status.success(),
        "a rejected ring exits with an error: {}",
        text(&out)
    );
    let t = text(&out);
    assert!(t.contains("REJECTED at commit"), "{t}");
    let v = json(&path);
    assert_eq!(v["outcome"], "rejected at commit", "{v}");
    assert_eq!(v["admitted"], false);
    let reason = v["rejected_at_commit"].as_str().unwrap().to_string();
    for needle in [
        "task 'n",
        "needs a deadline of at least",
        "interference 5000000 ns measured",
    ] {
        assert!(reason.contains(needle), "'{needle}' not in: {reason}");
    }
}

#[test]
fn the_default_ring_is_admitted_only_with_headroom_over_the_interference() {
    // Plain defaults (no period, no deadline) on a host that takes 2 ms
    // at once: deadlines of 3 × 2 ms do not fit the longest default period
    // (50 ms for 9 tasks: 5.4 ms each), and admission charges 300% of the
    // interference, so the ring is rejected at commit, saying so.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring-defaults.json");
    let defaults = || {
        let mut ring = quiet_ring(&["--periods", "10", "--no-host-record"]);
        ring.args(["--declared-interference-us", "2000", "--clock-budget-us", "500"]);
        ring
    };
    let out = run(defaults().arg("--json").arg(&path));
    assert!(!out.status.success(), "rejected: {}", text(&out));
    let t = text(&out);
    assert!(t.contains("charging 300% of the interference"), "{t}");
    assert!(
        t.contains("hint: this host has shown stalls of 2000 µs") && t.contains("--interference-headroom-pct 300"),
        "the rejection says what would run: {t}"
    );
    let v = json(&path);
    assert_eq!(v["outcome"], "rejected at commit", "{v}");
    assert_eq!(v["interference_headroom_pct"], 300, "{v}");
    let reason = v["rejected_at_commit"].as_str().unwrap().to_string();
    for needle in [
        "needs a deadline of at least",
        "interference 6000000 ns (300% of the 2000000 ns measured on this host",
    ] {
        assert!(reason.contains(needle), "'{needle}' not in: {reason}");
    }
    // As measured (100%), the same 5.4 ms deadlines absorb 2 ms: admitted,
    // and the run says what its promise covers.
    let path = dir.path().join("ring-as-measured.json");
    let out = run(defaults()
        .args(["--interference-headroom-pct", "100", "--json"])
        .arg(&path));
    let v = json(&path);
    assert_eq!(v["admitted"], true, "{}", text(&out));
    assert_eq!(v["interference_headroom_pct"], 100, "{v}");
    assert!(
        text(&out).contains("the promise: every job meets its deadline while the host takes at most 2000 µs"),
        "{}",
        text(&out)
    );
}

/// The number after `key` in `line` ("max 49 ns" → 49).
fn number_after(line: &str, key: &str) -> u64 {
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("'{key}' not in {line}")) + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_members_admit_with_what_the_launchers_calibration_just_recorded() {
    // A new host's first run: the launcher's calibration is the record's
    // first observation, and every member's admission takes at least it
    // (the members read the record after it, not before).
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("new-host.json");
    let path = dir.path().join("ring-new-host.json");
    let out = run(short_ring()
        .arg("--host-record")
        .arg(&record)
        .args(["--host-warmup-s", "0", "--clock-budget-us", "500", "--force", "--json"])
        .arg(&path));
    let t = text(&out);
    let here = t
        .lines()
        .find(|l| l.starts_with("this machine ("))
        .unwrap_or_else(|| panic!("no calibration line: {t}"));
    let (jitter_part, interference_part) = here.split_once("; interference").unwrap();
    let floor = number_after(jitter_part, ", max ").max(number_after(interference_part, ", max "));
    let v = json(&path);
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(
            n["interference"]["interference_recorded_ns"].as_u64(),
            Some(floor),
            "node {n}: the launcher's calibration ({here}) is the floor"
        );
    }
}

#[test]
fn statistical_admission_reports_the_miss_rate_against_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring-statistical.json");
    let out = run(short_ring()
        .args(["--admission", "statistical", "--miss-budget", "1e-2"])
        .args(["--declared-interference-us", "0", "--clock-budget-us", "500", "--json"])
        .arg(&path));
    assert!(out.status.success(), "ring failed: {}", text(&out));
    let v = json(&path);
    assert_eq!(v["admission_mode"], "statistical", "{v}");
    assert_eq!(v["miss_budget"], 1e-2);
    assert!(v["miss_rate"].is_f64() && v["within_budget"].is_boolean(), "{v}");
    assert!(text(&out).contains("miss budget"), "{}", text(&out));
}

#[test]
fn clock_keeps_the_true_time_inside_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clock.json");
    let out = run(spindle()
        .args([
            "rt",
            "clock",
            "--members",
            "3",
            "--duration-s",
            "1",
            "--sample-ms",
            "5",
            "--no-fifo",
        ])
        .args(["--jumps", "2:500:300", "--json"])
        .arg(&path));
    assert!(out.status.success(), "clock failed: {}", text(&out));
    let v = json(&path);
    assert_summary(&v, "error_ns");
    assert!(v["bound_ns_max"].is_u64(), "{v}");
    assert_eq!(v["outside_bound"], 0, "true time outside the reported interval: {v}");
    assert!(v["samples"].as_u64().unwrap() > 0);
}

#[test]
fn table_5_1_is_judged_and_run_anyway() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t51.json");
    let out = run(spindle()
        .args(["rt", "ring", "--params", "table-5.1", "--periods", "10", "--no-fifo"])
        .args([
            "--jitter-samples",
            "10",
            "--calibration-ms",
            "0",
            "--clock-budget-us",
            "500",
            "--json",
        ])
        .arg(&path));
    assert!(out.status.success(), "table-5.1 ring failed: {}", text(&out));
    let v = json(&path);
    // Receive tasks start before their send's deadline: admission says so.
    assert_eq!(v["admitted"], false, "{v}");
    let verdicts = v["verdicts"].to_string();
    assert!(verdicts.contains("rejected"), "{verdicts}");
}

#[test]
fn bad_input_names_the_bad_value() {
    for (args, needle) in [
        (vec!["rt", "ring", "--size", "0"], "--size 0"),
        (vec!["rt", "ring", "--params", "fast"], "'fast'"),
        (vec!["rt", "latency", "--sizes", "4"], "4"),
        (vec!["rt", "latency", "--sizes", "8,x"], "'x'"),
        (vec!["rt", "compare", "--period-us", "100"], "--period-us 100"),
        (vec!["rt", "clock", "--jumps", "0:10:5"], "node 0"),
        (vec!["rt", "clock", "--drift-ppm", "0,900"], "900"),
        (vec!["rt", "ring", "--transport", "udp"], "'udp'"),
        (vec!["rt", "clock", "--netns", "a,b,c"], "--transport tcp"),
        (
            vec![
                "rt",
                "clock",
                "--transport",
                "tcp",
                "--addresses",
                "127.0.0.1:1,nowhere,127.0.0.1:3",
            ],
            "'nowhere'",
        ),
        (vec!["rt", "jitter", "--samples", "1"], "--samples 1"),
        (vec!["rt", "jitter", "--spin-us", "900"], "--spin-us 900"),
        (vec!["rt", "ring", "--admission", "optimistic"], "'optimistic'"),
        (vec!["rt", "ring", "--admission", "statistical"], "--miss-budget"),
        (
            vec!["rt", "ring", "--admission", "statistical", "--miss-budget", "3"],
            "--miss-budget 3",
        ),
        (vec!["rt", "ring", "--miss-budget", "1e-4"], "statistical only"),
        (
            vec!["rt", "ring", "--interference-headroom-pct", "50"],
            "--interference-headroom-pct 50",
        ),
        (
            vec!["rt", "ring", "--calibration-ms", "999999999"],
            "--calibration-ms 999999999",
        ),
        (
            vec!["rt", "ring", "--host-record", "/proc/version"],
            "host record /proc/version: not a valid record",
        ),
    ] {
        let out = run(spindle().args(&args));
        assert!(!out.status.success(), "{args:?} should fail");
        let t = text(&out);
        assert!(t.contains(needle), "{args:?}: '{needle}' not in: {t}");
        assert!(!t.contains("panicked"), "{args:?} panicked: {t}");
        assert!(!t.contains("spawn"), "{args:?} got as far as spawning members: {t}");
    }
}

#[test]
fn jitter_measures_each_spin_window() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jitter.json");
    let out = run(spindle()
        .args([
            "rt",
            "jitter",
            "--samples",
            "50",
            "--spin-us",
            "0,50",
            "--no-fifo",
            "--json",
        ])
        .arg(&path));
    assert!(out.status.success(), "jitter failed: {}", text(&out));
    let v = json(&path);
    assert_eq!(v["fifo_granted"], false, "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for r in rows {
        assert_summary(r, "late_ns");
        assert!(r["p999_ns"].is_u64() && r["over_10us"].is_u64(), "{r}");
    }
}

#[test]
fn ring_runs_over_tcp_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring-tcp.json");
    let out = run(spindle()
        .args([
            "rt",
            "ring",
            "--transport",
            "tcp",
            "--periods",
            "10",
            "--period-us",
            "20000",
        ])
        .args(["--no-fifo", "--jitter-samples", "10", "--declared-jitter-us", "0"])
        .args(["--calibration-ms", "0", "--declared-interference-us", "0"])
        .args(["--deadline-us", "1500", "--clock-budget-us", "500", "--json"])
        .arg(&path));
    assert!(out.status.success(), "ring over tcp failed: {}", text(&out));
    let v = json(&path);
    assert_eq!(v["transport"], "tcp", "{v}");
    assert!(v["missed"].is_u64() && v["late"].is_u64(), "{v}");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 3);
}
