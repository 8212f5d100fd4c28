//! `spindle rt clock` and `spindle rt ring` with the members in three
//! network namespaces (as if on three hosts), joined by veth pairs on a
//! private bridge, over the tcp fabric: a short version of
//! scripts/rt-netns.sh. Asserted: both commands succeed, the reports say
//! `tcp-netns`, the true time stays inside the clock's reported interval
//! in every sample, and every ring message is delivered or counted. No
//! timing is asserted. Everything created (namespaces, veths, bridge) is
//! removed by a guard however the test ends; every command runs under
//! `timeout`.
//!
//! Needs root and iproute2: without them it prints why and returns.

mod common;
use common::text;

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Liveness bound of each spindle command (never a speed assertion).
const COMMAND_TIMEOUT_S: &str = "240";

fn sh(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

/// Three namespaces on a bridge; removed on drop.
struct Net {
    tag: String,
    prefix: String,
}

impl Net {
    fn ns(&self, i: usize) -> String {
        format!("sprt{}-{i}", self.tag)
    }
    fn veth(&self, i: usize) -> String {
        format!("sprtv{}-{i}", self.tag)
    }
    fn bridge(&self) -> String {
        format!("sprtb{}", self.tag)
    }

    fn create() -> Result<Net, String> {
        let pid = std::process::id();
        let net = Net {
            tag: format!("{}", pid % 100_000),
            prefix: format!("10.{}.{}", 150 + pid % 50, pid / 50 % 250),
        };
        let try_ = |cmd: &[&str]| {
            let out = sh(cmd);
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{cmd:?}: {}", text(&out)))
            }
        };
        let br = net.bridge();
        try_(&["ip", "link", "add", &br, "type", "bridge"])?;
        try_(&["ip", "link", "set", &br, "up"])?;
        for i in 0..3 {
            let (ns, veth, eth) = (net.ns(i), net.veth(i), format!("eth{i}"));
            let addr = format!("{}.{}/24", net.prefix, i + 1);
            try_(&["ip", "netns", "add", &ns])?;
            try_(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", &eth, "netns", &ns,
            ])?;
            try_(&["ip", "link", "set", &veth, "master", &br, "up"])?;
            try_(&["ip", "-n", &ns, "addr", "add", &addr, "dev", &eth])?;
            try_(&["ip", "-n", &ns, "link", "set", &eth, "up"])?;
            try_(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn netns_arg(&self) -> String {
        (0..3).map(|i| self.ns(i)).collect::<Vec<_>>().join(",")
    }
    fn addresses(&self, port: u16) -> String {
        (0..3)
            .map(|i| format!("{}.{}:{port}", self.prefix, i + 1))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..3 {
            let _ = sh(&["ip", "netns", "del", &self.ns(i)]);
            let _ = sh(&["ip", "link", "del", &self.veth(i)]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge()]);
    }
}

fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need CAP_SYS_ADMIN".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` (iproute2) on PATH".into());
    }
    None
}

fn spindle_rt(net: &Net, args: &[&str], json: &Path) -> Output {
    let netns = net.netns_arg();
    let mut cmd: Vec<&str> = vec!["timeout", COMMAND_TIMEOUT_S, env!("CARGO_BIN_EXE_spindle"), "rt"];
    cmd.extend_from_slice(args);
    cmd.extend_from_slice(&["--transport", "tcp", "--netns", &netns]);
    // Never this host's record of interference (nor adding to it).
    cmd.push("--no-host-record");
    cmd.extend_from_slice(&["--json", json.to_str().unwrap()]);
    sh(&cmd)
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json written")).expect("valid json")
}

#[test]
fn clock_and_ring_across_three_network_namespaces() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let net = match Net::create() {
        Ok(net) => net,
        Err(e) => {
            // Root but no namespaces (e.g. a container without CAP_NET_ADMIN).
            println!("skipped: cannot create network namespaces: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();

    let clock = dir.path().join("clock.json");
    let addresses = net.addresses(7400);
    let out = spindle_rt(
        &net,
        &[
            "clock",
            "--duration-s",
            "2",
            "--sample-ms",
            "5",
            "--addresses",
            &addresses,
        ],
        &clock,
    );
    assert!(out.status.success(), "clock across namespaces failed: {}", text(&out));
    let v = json(&clock);
    assert_eq!(v["transport"], "tcp-netns", "{v}");
    assert!(v["samples"].as_u64().unwrap() > 0, "{v}");
    assert!(v["bound_ns_max"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["outside_bound"], 0, "true time outside the reported interval: {v}");

    let ring = dir.path().join("ring.json");
    // Deadlines far above any stall this kind of VM has shown: the test is
    // about messages crossing namespaces on an admitted schedule. A CI
    // host that stalled 1.1 ms in a member's calibration rejected 1.5 ms
    // deadlines, one that stalled 19.8 ms (2026-12-03) rejected 20 ms
    // (rightly, with the reason). A rejection for the interference a
    // member measured is admission control doing its job: the ring is
    // tried once more with a 4x wider schedule before the test fails.
    let schedules = [("250000", "20000"), ("1000000", "80000")];
    let mut out = None;
    for (attempt, (period_us, deadline_us)) in schedules.iter().enumerate() {
        let addresses = net.addresses(7410 + 10 * attempt as u16);
        let o = spindle_rt(
            &net,
            &[
                "ring",
                "--periods",
                "10",
                "--period-us",
                period_us,
                "--deadline-us",
                deadline_us,
                "--jitter-samples",
                "20",
                "--declared-jitter-us",
                "0",
                "--clock-budget-us",
                "500",
                "--addresses",
                &addresses,
            ],
            &ring,
        );
        let said = text(&o);
        let rejected_for_interference =
            !o.status.success() && said.contains("REJECTED at commit") && said.contains("interference");
        if rejected_for_interference && attempt + 1 < schedules.len() {
            println!(
                "deadline {deadline_us} µs rejected for this host's interference, trying a wider schedule: {said}"
            );
            continue;
        }
        out = Some(o);
        break;
    }
    let out = out.expect("a last attempt");
    assert!(out.status.success(), "ring across namespaces failed: {}", text(&out));
    let v = json(&ring);
    assert_eq!(v["transport"], "tcp-netns", "{v}");
    assert_eq!(v["admitted"], true, "{v}");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    // Messages crossed the namespaces, and every miss is counted.
    assert!(
        v["latency_ns"]["samples"].as_u64().unwrap() > 0,
        "no message crossed: {v}"
    );
    assert!(v["missed"].is_u64() && v["late"].is_u64(), "{v}");
    for n in nodes {
        assert!(n["messages_moved"].as_u64().unwrap() > 0, "{n}");
    }
    drop(net);
}
