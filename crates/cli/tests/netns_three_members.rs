//! Three members in three network namespaces (as if on three hosts),
//! joined by veth pairs on a private bridge: they multicast and their
//! delivery logs pass the invariant checkers; then one member is cut off
//! with iptables: it stops with a clear error (a minority), and the other
//! two install a view without it and go on. Everything created (namespaces, veths, bridge, iptables rules
//! inside the cut namespace, processes, files) is removed by a guard,
//! however the test ends; every process runs under a bounded timeout.
//!
//! Needs root, iproute2 and iptables (installed with apt-get if missing).
//! Where network namespaces are truly unavailable it prints why and
//! returns without failing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use spindle_group::invariants;

mod common;

/// Liveness bound for the cut-off phase (never a speed assertion).
const STOP_WAIT_MAX: Duration = Duration::from_secs(60);

fn sh(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn must(cmd: &[&str]) {
    let out = sh(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Namespaces, links and processes of one test, removed on drop.
struct Net {
    tag: String,
    prefix: String,
    children: Vec<Child>,
}

impl Net {
    fn ns(&self, i: usize) -> String {
        format!("sp{}-{i}", self.tag)
    }
    fn bridge(&self) -> String {
        format!("spbr{}", self.tag)
    }
    fn veth(&self, i: usize) -> String {
        format!("spv{}-{i}", self.tag)
    }
    fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 1)
    }

    fn create() -> Result<Net, String> {
        let pid = std::process::id();
        let net = Net {
            tag: format!("{}", pid % 100_000),
            prefix: format!("10.{}.{}", 200 + pid % 50, pid / 50 % 250),
            children: Vec::new(),
        };
        let try_ = |cmd: &[&str]| {
            let out = sh(cmd);
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{cmd:?}: {}", text(&out).trim()))
            }
        };
        try_(&["ip", "link", "add", &net.bridge(), "type", "bridge"])?;
        try_(&["ip", "link", "set", &net.bridge(), "up"])?;
        for i in 0..3 {
            let (ns, veth, inner) = (net.ns(i), net.veth(i), format!("eth{i}"));
            try_(&["ip", "netns", "add", &ns])?;
            try_(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", &inner, "netns", &ns,
            ])?;
            try_(&["ip", "link", "set", &veth, "master", &net.bridge(), "up"])?;
            try_(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.addr(i)),
                "dev",
                &inner,
            ])?;
            try_(&["ip", "-n", &ns, "link", "set", &inner, "up"])?;
            try_(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Start `spindle run` for member `id` inside its namespace.
    fn start(&mut self, config: &Path, id: usize, args: &[&str]) {
        self.start_to(config, id, args, Stdio::piped());
    }

    /// As [`Net::start`], with standard error going to `stderr`.
    fn start_to(&mut self, config: &Path, id: usize, args: &[&str], stderr: Stdio) {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(id),
                "timeout",
                "120",
                env!("CARGO_BIN_EXE_spindle"),
                "run",
            ])
            .arg("--config")
            .arg(config)
            .args(["--member", &id.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start a member");
        self.children.push(child);
    }

    fn wait_all(&mut self) -> Vec<Output> {
        self.children
            .drain(..)
            .map(|c| c.wait_with_output().expect("wait"))
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in 0..3 {
            // Deleting the namespace removes its iptables rules and its veth end.
            let _ = sh(&["ip", "netns", "del", &self.ns(i)]);
            let _ = sh(&["ip", "link", "del", &self.veth(i)]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge()]);
    }
}

fn write_group(dir: &Path, net: &Net, name: &str) -> PathBuf {
    let key = dir.join("group.key");
    common::write_key_file(&key, "netns test key, 32 bytes long....");
    let mut text = format!(
        "[group]\nname = \"{name}\"\nkey_file = \"group.key\"\nwindow_slots = 256\npeer_timeout_ms = 2000\njoin_timeout_ms = 15000\n"
    );
    for i in 0..3 {
        text += &format!("[[members]]\nid = {i}\naddress = \"{}:7100\"\n", net.addr(i));
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn three_members_in_three_namespaces_deliver_in_order_and_go_on_when_one_is_cut_off() {
    // Root, iproute2 and iptables (installed with apt-get if missing).
    if let Some(why) = common::netns::unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let mut net = match Net::create() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED: cannot create network namespaces here: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();

    // 1. Multicast across the namespaces; check the delivery logs.
    let config = write_group(dir.path(), &net, "netns-order");
    let logs = dir.path().join("logs");
    for id in 0..3 {
        net.start(
            &config,
            id,
            &[
                "--count",
                "1000",
                "--size",
                "512",
                "--delivery-log",
                logs.to_str().unwrap(),
            ],
        );
    }
    for (id, out) in net.wait_all().iter().enumerate() {
        assert!(out.status.success(), "member {id}: {}", text(out));
        assert!(
            text(out).contains("delivered 3000 messages"),
            "member {id}: {}",
            text(out)
        );
    }
    let logs = invariants::read_logs(&logs).unwrap();
    assert_eq!(logs.len(), 3, "one log per member");
    invariants::check_all(&logs, &BTreeMap::from([(0, 1000), (1, 1000), (2, 1000)]), true)
        .expect("total order, FIFO, no duplication, no gaps across namespaces");

    // 2. Cut member 2 off while the group runs: alone, it is a minority
    //    and stops with a clear error; members 0 and 1 install a view
    //    without it and go on delivering (no hang on either side).
    let config = write_group(dir.path(), &net, "netns-cut");
    let cut_logs = dir.path().join("cut-logs");
    let err_path = |id: usize| dir.path().join(format!("cut-{id}.err"));
    for id in 0..3 {
        let err = std::fs::File::create(err_path(id)).unwrap();
        net.start_to(
            &config,
            id,
            &[
                "--count",
                "100000000",
                "--size",
                "64",
                "--rate",
                "2000",
                "--delivery-log",
                cut_logs.to_str().unwrap(),
            ],
            Stdio::from(err),
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let ns2 = net.ns(2);
    must(&["ip", "netns", "exec", &ns2, "iptables", "-A", "INPUT", "-j", "DROP"]);
    must(&["ip", "netns", "exec", &ns2, "iptables", "-A", "OUTPUT", "-j", "DROP"]);
    let mut cut = net.children.pop().expect("member 2");
    let started = Instant::now();
    while cut.try_wait().ok().flatten().is_none() {
        assert!(
            started.elapsed() < STOP_WAIT_MAX,
            "member 2 still runs {} s after it was cut off (a hang)",
            STOP_WAIT_MAX.as_secs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = cut.wait().expect("member 2 status");
    let out = std::fs::read_to_string(err_path(2)).unwrap_or_default();
    assert!(!status.success(), "the cut-off member must fail: {out}");
    assert!(
        out.contains("minority partition") || out.contains("removed from the group"),
        "member 2: clear error expected: {out}"
    );
    assert!(!out.contains("panicked"), "{out}");
    // Members 0 and 1 report the view they install without member 2.
    let started = Instant::now();
    loop {
        let moved_on = (0..2).all(|id| {
            std::fs::read_to_string(err_path(id))
                .unwrap_or_default()
                .contains(&format!("member {id}: view 1 installed: members [0, 1]"))
        });
        if moved_on {
            break;
        }
        assert!(
            started.elapsed() < STOP_WAIT_MAX,
            "members 0 and 1 did not install a new view within {} s: {:?}",
            STOP_WAIT_MAX.as_secs(),
            (0..2)
                .map(|id| std::fs::read_to_string(err_path(id)).unwrap_or_default())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And they stay up: pushes to the cut-off member (its TCP send buffer
    // full) must not stall their heartbeats to each other until they
    // suspect each other (each alone would then be a minority).
    std::thread::sleep(Duration::from_secs(8));
    for (id, child) in net.children.iter_mut().enumerate() {
        assert!(
            child.try_wait().ok().flatten().is_none(),
            "member {id} stopped although a majority remained: {}",
            std::fs::read_to_string(err_path(id)).unwrap_or_default()
        );
    }
}
