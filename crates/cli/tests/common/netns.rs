//! Hosts as network namespaces, for end-to-end tests that cut links.
//!
//! ```text
//!   root namespace (the test, its clients)   <prefix>.254 on the bridge
//!        │
//!   ─────┴──────── bridge kvbr<tag> ─────────┬──────────────┬─────
//!                  │                         │              │
//!           veth kvv<tag>-0           kvv<tag>-1     …  kvv<tag>-(n-1)
//!                  │                         │              │
//!   namespace kvn<tag>-0: eth0      kvn<tag>-1: eth0    …
//!             <prefix>.1                  <prefix>.2
//! ```
//!
//! A link between two hosts is cut with iptables DROP rules inside one of
//! them, on the other's address only (both directions): traffic from the
//! root namespace (the clients) still flows. [`Hosts`] removes everything
//! it created (namespaces and their rules, veths, the bridge and its
//! address) when dropped, however the test ends.
//!
//! Needs root, iproute2 and iptables; [`unavailable`] says why not, so a
//! test can print it and skip.

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};

/// Run a command to completion (no standard input).
pub fn sh(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn try_sh(cmd: &[&str]) -> Result<(), String> {
    let out = sh(cmd);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why network namespaces cannot be used here (not root, no iproute2, no
/// iptables and apt-get could not install it), or `None`.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and no memory effects.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    let has = |tool: &str| sh(&["sh", "-c", &format!("command -v {tool}")]).status.success();
    if !has("ip") {
        return Some("iproute2 (`ip`) is not installed".into());
    }
    if !has("iptables") {
        eprintln!("iptables is missing: installing it with apt-get");
        let _ = sh(&[
            "sh",
            "-c",
            "DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq iptables >/dev/null 2>&1 || \
             (timeout 300 apt-get update -qq >/dev/null 2>&1 && \
              DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq iptables >/dev/null 2>&1)",
        ]);
        if !has("iptables") {
            return Some("iptables is not installed and apt-get could not install it".into());
        }
    }
    None
}

/// `count` hosts (network namespaces) on a private bridge; see the module
/// docs. Names carry this process's id and a lane, so test binaries and
/// the tests of one binary never collide.
pub struct Hosts {
    tag: String,
    prefix: String,
    count: usize,
}

impl Hosts {
    /// Create the bridge, the namespaces and their links, on a /24 of
    /// `10.<second_octet>.x` that no route of the root namespace uses yet.
    /// On an error, what was created is removed.
    pub fn create(second_octet: u8, lane: u32, count: usize) -> Result<Hosts, String> {
        assert!((1..=200).contains(&count), "hosts: {count}");
        let pid = std::process::id();
        let routes = String::from_utf8_lossy(&sh(&["ip", "-4", "route", "show"]).stdout).into_owned();
        let start = (pid.wrapping_mul(37) + lane * 11) % 250;
        let third = (0..250)
            .map(|i| (start + i) % 250 + 1)
            .find(|t| !routes.contains(&format!("10.{second_octet}.{t}.")))
            .ok_or_else(|| format!("no free 10.{second_octet}.x.0/24 in the root namespace's routes"))?;
        let hosts = Hosts {
            tag: format!("{}{lane}", pid % 100_000),
            prefix: format!("10.{second_octet}.{third}"),
            count,
        };
        // From here on, drop removes whatever was made.
        hosts.build()?;
        Ok(hosts)
    }

    fn build(&self) -> Result<(), String> {
        let bridge = self.bridge();
        try_sh(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        try_sh(&["ip", "addr", "add", &format!("{}/24", self.host_addr()), "dev", &bridge])?;
        try_sh(&["ip", "link", "set", &bridge, "up"])?;
        for i in 0..self.count {
            let (ns, veth) = (self.ns(i), self.veth(i));
            try_sh(&["ip", "netns", "add", &ns])?;
            try_sh(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            try_sh(&["ip", "link", "set", &veth, "master", &bridge, "up"])?;
            try_sh(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", self.addr(i)),
                "dev",
                "eth0",
            ])?;
            try_sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            try_sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    pub fn count(&self) -> usize {
        self.count
    }
    /// Host `i`'s namespace.
    pub fn ns(&self, i: usize) -> String {
        format!("kvn{}-{i}", self.tag)
    }
    fn bridge(&self) -> String {
        format!("kvbr{}", self.tag)
    }
    fn veth(&self, i: usize) -> String {
        format!("kvv{}-{i}", self.tag)
    }
    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 1)
    }
    /// The root namespace's address on the bridge (where clients run).
    pub fn host_addr(&self) -> String {
        format!("{}.254", self.prefix)
    }

    /// `program` inside host `i`'s namespace, under `timeout` (a process
    /// that hangs is ended after `timeout_s` even if the test's own
    /// cleanup never runs).
    pub fn command(&self, i: usize, timeout_s: u32, program: &OsStr) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), "timeout", &timeout_s.to_string()])
            .arg(program);
        c
    }

    /// Cut the link between hosts `a` and `b`: inside `a`, drop what comes
    /// from `b` and what goes to it. Traffic with every other address,
    /// the root namespace's included, still flows.
    pub fn cut(&self, a: usize, b: usize) -> Result<(), String> {
        self.rules(a, b, "-A")
    }

    /// Undo [`Hosts::cut`]`(a, b)`.
    pub fn heal(&self, a: usize, b: usize) -> Result<(), String> {
        self.rules(a, b, "-D")
    }

    fn rules(&self, a: usize, b: usize, op: &str) -> Result<(), String> {
        assert!(a != b && a < self.count && b < self.count, "link {a}–{b}");
        let (ns, peer) = (self.ns(a), self.addr(b));
        try_sh(&[
            "ip", "netns", "exec", &ns, "iptables", op, "INPUT", "-s", &peer, "-j", "DROP",
        ])?;
        try_sh(&[
            "ip", "netns", "exec", &ns, "iptables", op, "OUTPUT", "-d", &peer, "-j", "DROP",
        ])
    }

    /// Cut every link of host `a` to the other hosts (the root namespace
    /// still reaches it).
    pub fn isolate(&self, a: usize) -> Result<(), String> {
        (0..self.count).filter(|b| *b != a).try_for_each(|b| self.cut(a, b))
    }

    /// Undo [`Hosts::isolate`]`(a)`.
    pub fn rejoin(&self, a: usize) -> Result<(), String> {
        (0..self.count).filter(|b| *b != a).try_for_each(|b| self.heal(a, b))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 0..self.count {
            // Deleting a namespace removes its iptables rules and its end
            // of the veth (the other end goes with it).
            let _ = sh(&["ip", "netns", "del", &self.ns(i)]);
            let _ = sh(&["ip", "link", "del", &self.veth(i)]);
        }
        // The bridge's address and route go with it.
        let _ = sh(&["ip", "link", "del", &self.bridge()]);
    }
}

/// Processes (pid, command line) whose command line contains `needle` as
/// one argument: what a test started, found even where it is not the
/// test's child (`ip netns exec … timeout … program`: the program is a
/// grandchild).
pub fn processes_with_arg(needle: &str) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.iter().any(|a| a == needle).then(|| (pid, args.join(" ")))
        })
        .collect()
}
