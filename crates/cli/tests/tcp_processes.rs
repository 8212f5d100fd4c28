//! End-to-end tests of the `spindle` binary over the tcp transport on
//! loopback: the bench with its raw TCP baselines, `spindle run` from a
//! configuration file, and the bad inputs a user meets (a wrong key, a
//! member id not in the file, a port in use, an unreachable member, a bad
//! key in the file). Every run is bounded by its own timeouts; ports are
//! loopback ports picked free and released by the processes' exit.

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use spindle_group::invariants;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn free_port() -> u16 {
    spindle_bench::cluster::free_port().expect("a free loopback port")
}

fn write_key(dir: &Path, name: &str, key: &str) {
    common::write_key_file(&dir.join(name), key);
}

/// A group file for `ports.len()` members on loopback.
fn write_config(dir: &Path, file: &str, group: &str, key_file: &str, ports: &[u16], extra: &str) {
    let mut text = format!(
        "[group]\nname = \"{group}\"\nkey_file = \"{key_file}\"\nwindow_slots = 64\njoin_timeout_ms = 5000\n{extra}\n"
    );
    for (id, port) in ports.iter().enumerate() {
        text += &format!("[[members]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\n");
    }
    std::fs::write(dir.join(file), text).unwrap();
}

fn start(config: &Path, member: usize, args: &[&str]) -> Child {
    spindle()
        .args(["run", "--config"])
        .arg(config)
        .args(["--member", &member.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn tcp_bench_reports_the_shared_keys_and_its_logs_pass_the_checkers() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let logs = dir.path().join("logs");
    let out = spindle()
        .args([
            "bench",
            "multicast",
            "--transport",
            "tcp",
            "--members",
            "3",
            "--size",
            "256",
        ])
        .args([
            "--count",
            "2000",
            "--window",
            "64",
            "--pingpong-rounds",
            "200",
            "--json",
        ])
        .arg(&json)
        .arg("--delivery-log")
        .arg(&logs)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "bench failed: {}", text(&out));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in [
        "transport",
        "delivered_gbps_min",
        "delivered_msgs_per_s_min",
        "latency_ns",
        "baseline_gbps",
        "ratio_to_baseline",
        "baseline_pingpong_rtt_ns",
    ] {
        assert!(report.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(report["transport"], "tcp");
    assert!(report["baseline_gbps"].as_f64().unwrap() > 0.0);
    assert!(report["baseline_pingpong_rtt_ns"]["p50"].as_u64().unwrap() > 0);
    assert!(text(&out).contains("raw TCP stream baseline"), "{}", text(&out));
    let logs = invariants::read_logs(&logs).unwrap();
    assert_eq!(logs.len(), 3);
    invariants::check_all(&logs, &BTreeMap::from([(0, 2000), (1, 2000), (2, 2000)]), true).unwrap();
}

/// With `--idle spin` the members never park: each receives on its own
/// progress thread at every pass (`Fabric::receive_now`) while the
/// receive thread naps. Every message still arrives, in total order, and
/// the rate-limited one-sender round trip (the latency benchmark's shape)
/// completes.
#[test]
fn spinning_tcp_members_receive_on_their_own_thread_and_deliver_everything() {
    for (senders, rate) in [("all", "0"), ("one", "5000")] {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        let out = spindle()
            .args(["bench", "multicast", "--transport", "tcp", "--members", "2"])
            .args(["--size", "32", "--count", "2000", "--window", "64", "--idle", "spin"])
            .args(["--senders", senders, "--rate", rate, "--pingpong-rounds", "200"])
            .arg("--delivery-log")
            .arg(&logs)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "bench --senders {senders} failed: {}", text(&out));
        let logs = invariants::read_logs(&logs).unwrap();
        assert_eq!(logs.len(), 2);
        let sent = if senders == "all" {
            BTreeMap::from([(0, 2000), (1, 2000)])
        } else {
            BTreeMap::from([(0, 2000)])
        };
        invariants::check_all(&logs, &sent, true).unwrap();
    }
}

#[test]
fn spindle_run_members_from_one_config_deliver_in_total_order() {
    run_members_deliver_in_total_order("run-ok", "");
}

/// The same group file with `transport = "ofi"` (libfabric's tcp
/// provider; a build with `--features ofi`).
#[cfg(feature = "ofi")]
#[test]
fn spindle_run_members_over_ofi_deliver_in_total_order() {
    run_members_deliver_in_total_order("run-ofi", "transport = \"ofi\"");
}

fn run_members_deliver_in_total_order(group: &str, extra: &str) {
    let dir = tempfile::tempdir().unwrap();
    write_key(dir.path(), "g.key", "0123456789abcdef0123456789abcdef");
    let ports = [free_port(), free_port()];
    write_config(dir.path(), "g.toml", group, "g.key", &ports, extra);
    let logs = dir.path().join("logs");
    let cfg = dir.path().join("g.toml");
    let log_arg = logs.to_str().unwrap();
    let members: Vec<Child> = (0..2)
        .map(|m| start(&cfg, m, &["--count", "500", "--size", "64", "--delivery-log", log_arg]))
        .collect();
    for (m, child) in members.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "member {m}: {}", text(&out));
        assert!(text(&out).contains("delivered 1000 messages"), "{}", text(&out));
    }
    let logs = invariants::read_logs(&logs).unwrap();
    invariants::check_all(&logs, &BTreeMap::from([(0, 500), (1, 500)]), true).unwrap();
}

#[test]
fn a_member_with_the_wrong_key_is_refused_and_both_sides_say_why() {
    let dir = tempfile::tempdir().unwrap();
    write_key(dir.path(), "right.key", "the right key, long enough......");
    write_key(dir.path(), "wrong.key", "a wrong key, also long enough...");
    let ports = [free_port(), free_port()];
    write_config(dir.path(), "a.toml", "keyed", "right.key", &ports, "");
    write_config(dir.path(), "b.toml", "keyed", "wrong.key", &ports, "");
    let a = start(&dir.path().join("a.toml"), 0, &["--count", "10"]);
    let b = start(&dir.path().join("b.toml"), 1, &["--count", "10"]);
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(!a.status.success() && !b.status.success(), "{}\n{}", text(&a), text(&b));
    assert!(
        text(&a).contains("did not prove the group key"),
        "member 0: {}",
        text(&a)
    );
    // Each side checks the other's proof, so each names the key.
    assert!(text(&b).contains("group key"), "member 1: {}", text(&b));
    for o in [&a, &b] {
        assert!(!text(o).contains("panicked"), "{}", text(o));
        assert!(
            !text(o).contains("delivered"),
            "no group data with a wrong key: {}",
            text(o)
        );
    }
}

#[test]
fn bad_configurations_and_addresses_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_key(dir.path(), "g.key", "0123456789abcdef0123456789abcdef");
    write_key(dir.path(), "short.key", "short");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let unreachable = free_port();
    write_config(dir.path(), "ok.toml", "bad-input", "g.key", &[free_port()], "");
    write_config(dir.path(), "taken.toml", "bad-input", "g.key", &[taken_port], "");
    write_config(dir.path(), "short.toml", "bad-input", "short.key", &[free_port()], "");
    write_config(
        dir.path(),
        "badval.toml",
        "bad-input",
        "g.key",
        &[free_port()],
        "mode = \"fast\"",
    );
    write_config(
        dir.path(),
        "unreachable.toml",
        "bad-input",
        "g.key",
        &[unreachable, free_port()],
        "",
    );
    let cfg = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![cfg("ok.toml"), "7".into()],
            "--member 7 is not in the configuration",
        ),
        (vec![cfg("taken.toml"), "0".into()], "in use"),
        (vec![cfg("short.toml"), "0".into()], "at least 16 are needed"),
        (vec![cfg("badval.toml"), "0".into()], "group.mode = \"fast\""),
        (vec![cfg("nope.toml"), "0".into()], "nope.toml"),
    ];
    for (args, needle) in cases {
        let out = spindle()
            .args(["run", "--config", &args[0], "--member", &args[1]])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(
            text(&out).contains(needle),
            "{args:?}: expected '{needle}' in: {}",
            text(&out)
        );
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
    }
    // Member 1 of a group whose member 0 never starts: a bounded wait,
    // then an error naming member 0 and its address.
    std::fs::write(
        dir.path().join("unreachable.toml"),
        std::fs::read_to_string(dir.path().join("unreachable.toml"))
            .unwrap()
            .replace("join_timeout_ms = 5000", "join_timeout_ms = 800"),
    )
    .unwrap();
    let out = spindle()
        .args(["run", "--config", &cfg("unreachable.toml"), "--member", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("could not connect to member 0 at 127.0.0.1:{unreachable}")),
        "{}",
        text(&out)
    );
    drop(taken);
}

#[test]
fn a_killed_tcp_member_leaves_the_others_in_a_new_view() {
    let dir = tempfile::tempdir().unwrap();
    write_key(dir.path(), "g.key", "0123456789abcdef0123456789abcdef");
    let ports = [free_port(), free_port(), free_port()];
    write_config(
        dir.path(),
        "g.toml",
        "tcp-kill",
        "g.key",
        &ports,
        "peer_timeout_ms = 2000",
    );
    let cfg = dir.path().join("g.toml");
    let args = ["--count", "100000000", "--size", "64", "--rate", "5000"];
    let mut members: Vec<Child> = (0..3).map(|m| start(&cfg, m, &args)).collect();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let mut victim = members.pop().unwrap();
    victim.kill().unwrap();
    victim.wait().unwrap();
    // A killed member cannot unlink its stat file: remove it for it.
    let _ = std::fs::remove_file("/dev/shm/spindle@tcp-tcp-kill@2");
    // Members 0 and 1 (a majority) install a view without member 2 and go
    // on: `spindle stat` reads their view from their stat files.
    let started = std::time::Instant::now();
    loop {
        let stat = spindle()
            .args(["stat", "--json"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if common::survivors_in_new_view(&String::from_utf8_lossy(&stat.stdout), "tcp-kill", &[0, 1]) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "members 0 and 1 did not install a new view"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for (m, child) in members.iter_mut().enumerate() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "member {m} stopped although a majority remained"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
    for m in 0..2 {
        let _ = std::fs::remove_file(format!("/dev/shm/spindle@tcp-tcp-kill@{m}"));
    }
}

/// Wait for `child`, killing it (and failing) if it outlives `limit`: a
/// liveness bound, never a speed assertion.
fn wait_bounded(mut child: Child, limit: std::time::Duration) -> Output {
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "a member still ran after {} s (a hang): {}",
                limit.as_secs(),
                text(&out)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn spindle_stat_lists_the_running_tcp_members_of_this_host() {
    let dir = tempfile::tempdir().unwrap();
    write_key(dir.path(), "g.key", "0123456789abcdef0123456789abcdef");
    let group = format!("tcp-stat-{}", std::process::id());
    let ports = [free_port(), free_port()];
    write_config(dir.path(), "g.toml", &group, "g.key", &ports, "");
    let cfg = dir.path().join("g.toml");
    // About 4 s of traffic: long enough to look at, bounded.
    let args = ["--count", "2000", "--size", "64", "--rate", "500"];
    let members: Vec<Child> = (0..2).map(|m| start(&cfg, m, &args)).collect();
    let started = std::time::Instant::now();
    let mut seen = String::new();
    while started.elapsed() < std::time::Duration::from_secs(30) {
        let out = spindle().args(["stat", "--group", &group]).output().unwrap();
        seen = text(&out);
        if out.status.success() && seen.contains("as member 0 sees it") && seen.contains("as member 1 sees it") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let json = spindle().args(["stat", "--group", &group, "--json"]).output().unwrap();
    for (m, child) in members.into_iter().enumerate() {
        let out = wait_bounded(child, std::time::Duration::from_secs(60));
        assert!(out.status.success(), "member {m}: {}", text(&out));
    }
    assert!(seen.contains("as member 0 sees it, live"), "{seen}");
    assert!(seen.contains("as member 1 sees it, live"), "{seen}");
    assert!(seen.contains("connected"), "{seen}");
    assert!(seen.contains("delivered msgs"), "{seen}");
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap_or(serde_json::Value::Null);
    if doc != serde_json::Value::Null {
        let groups = doc["groups"].as_array().cloned().unwrap_or_default();
        assert!(groups.iter().all(|g| g["transport"] == "tcp"), "{doc}");
    }
    // Members that closed leave no stat file.
    let after = spindle().args(["stat", "--group", &group]).output().unwrap();
    assert!(!after.status.success(), "{}", text(&after));
    assert!(
        text(&after).contains("no tcp member of it runs here"),
        "{}",
        text(&after)
    );
}

/// Make a CA and a member certificate for 127.0.0.1 with the openssl
/// command; false (and the test returns) where openssl is missing.
fn openssl_certs(dir: &Path, ca: &str, member: &str) -> bool {
    let run = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
    };
    if run(&["version"]).is_err() {
        eprintln!("openssl is not installed: skipping the TLS process test");
        return false;
    }
    std::fs::write(
        dir.join("member.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let steps: [Vec<String>; 3] = [
        format!("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {ca}.key -out {ca}.pem -days 2 -subj /CN={ca}"),
        format!("req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {member}.key -out {member}.csr -subj /CN={member}"),
        format!("x509 -req -in {member}.csr -CA {ca}.pem -CAkey {ca}.key -CAcreateserial -out {member}.pem -days 2 -extfile member.ext"),
    ]
    .map(|s| s.split(' ').map(str::to_string).collect());
    for step in &steps {
        if std::fs::metadata(dir.join(format!("{ca}.pem"))).is_ok() && step[0] == "req" && step[1] == "-x509" {
            continue; // the CA exists already
        }
        let args: Vec<&str> = step.iter().map(String::as_str).collect();
        let out = run(&args).unwrap();
        assert!(out.status.success(), "openssl {step:?}: {}", text(&out));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join(format!("{member}.key")),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    true
}

#[test]
fn spindle_run_over_tls_delivers_and_a_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_key(dir.path(), "g.key", "0123456789abcdef0123456789abcdef");
    if !openssl_certs(dir.path(), "ca", "m")
        || !openssl_certs(dir.path(), "ca", "m1")
        || !openssl_certs(dir.path(), "otherca", "rogue")
    {
        return;
    }
    let ports = [free_port(), free_port()];
    let tls = "tls_cert = \"m.pem\"\ntls_key = \"m.key\"\ntls_ca = \"ca.pem\"";
    write_config(dir.path(), "g.toml", "tcp-tls", "g.key", &ports, tls);
    let cfg = dir.path().join("g.toml");
    let args = ["--count", "200", "--size", "64"];
    let members: Vec<Child> = (0..2).map(|m| start(&cfg, m, &args)).collect();
    for (m, child) in members.into_iter().enumerate() {
        let out = wait_bounded(child, std::time::Duration::from_secs(60));
        assert!(out.status.success(), "member {m}: {}", text(&out));
        assert!(
            text(&out).contains("delivered 400 messages"),
            "member {m}: {}",
            text(&out)
        );
    }

    // Member 1 with a certificate from another CA (given per member with
    // the environment, as on a real host).
    let ports = [free_port(), free_port()];
    write_config(dir.path(), "r.toml", "tcp-tls-refused", "g.key", &ports, tls);
    let cfg = dir.path().join("r.toml");
    let m0 = start(&cfg, 0, &args);
    let m1 = spindle()
        .args(["run", "--config"])
        .arg(&cfg)
        .args(["--member", "1"])
        .args(args)
        .env("SPINDLE_GROUP_TLS_CERT", "rogue.pem")
        .env("SPINDLE_GROUP_TLS_KEY", "rogue.key")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (m, child) in [m0, m1].into_iter().enumerate() {
        let out = wait_bounded(child, std::time::Duration::from_secs(60));
        assert!(!out.status.success(), "member {m} must fail: {}", text(&out));
        assert!(
            text(&out).contains("TLS handshake failed"),
            "member {m}: {}",
            text(&out)
        );
    }
}
