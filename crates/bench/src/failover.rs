//! Membership runs with real processes: `spindle bench failover` and the
//! failure act of `spindle demo`. Members are `spindle view-member`
//! processes (see `view_member.rs`); this side starts them, injects the
//! fault (SIGKILL, or SIGSTOP for a member that hangs), and reads the
//! members' event files for when each installed which view.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use spindle_group::invariants;
use spindle_runtime::monotonic_ns;

use crate::cluster::{free_ports, Cluster, Output};
use crate::report::{Machine, Percentiles};
use crate::view_member::{events_path, state_path};

/// One group of `spindle view-member` processes.
pub struct ViewRun {
    pub dir: PathBuf,
    ranks: usize,
    common: Vec<String>,
    members: Cluster,
}

/// What a member's event file says.
#[derive(Default, Debug)]
pub struct Events {
    /// (t_ns, view, members) per install.
    pub installs: Vec<(u64, u64, Vec<usize>)>,
    /// (t_ns, delivered so far).
    pub delivered: Vec<(u64, u64)>,
}

impl ViewRun {
    /// Start `ranks` members in one view. `transport` is shm, tcp or
    /// `ofi[:<provider>]` (loopback ports from a free range).
    pub fn start(
        dir: &Path,
        ranks: usize,
        initial: usize,
        transport: &str,
        rate: u64,
        suspect_timeout_ms: u64,
    ) -> Result<ViewRun, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let group = format!("membership-{}-{}", std::process::id(), monotonic_ns() % 1_000_000);
        let mut common: Vec<String> = vec![
            "view-member".into(),
            "--group".into(),
            group.clone(),
            "--ranks".into(),
            ranks.to_string(),
            "--dir".into(),
            dir.display().to_string(),
            "--rate".into(),
            rate.to_string(),
            "--suspect-timeout-ms".into(),
            suspect_timeout_ms.to_string(),
            "--transport".into(),
            transport.into(),
            "--initial".into(),
            (0..initial).map(|r| r.to_string()).collect::<Vec<_>>().join(","),
        ];
        if transport == "tcp" || crate::member::is_ofi(transport) {
            common.push("--base-port".into());
            common.push(free_ports(ranks as u16)?.to_string());
        }
        let members = Cluster::new(ranks)?
            .streams(Output::Null, Output::Capture)
            .owns_group(&group, ranks);
        let mut run = ViewRun {
            dir: dir.to_path_buf(),
            ranks,
            common,
            members,
        };
        for rank in 0..initial {
            run.spawn(rank, false)?;
        }
        Ok(run)
    }

    fn spawn(&mut self, rank: usize, join: bool) -> Result<(), String> {
        let mut args = self.common.clone();
        args.extend(["--rank".to_string(), rank.to_string()]);
        if join {
            args.push("--join".into());
        }
        self.members.start(rank, args)?;
        Ok(())
    }

    /// Start a new process that joins the running group as `rank`.
    pub fn join(&mut self, rank: usize) -> Result<(), String> {
        self.spawn(rank, true)
    }

    /// SIGKILL `rank` (and reap it). Returns the time of the kill.
    pub fn kill(&mut self, rank: usize) -> Result<u64, String> {
        Ok(self.members.kill(rank)?)
    }

    /// Send `signal` to `rank`. Returns the time it was sent.
    pub fn signal(&mut self, rank: usize, signal: i32) -> Result<u64, String> {
        Ok(self.members.signal(rank, signal)?)
    }

    pub fn events(&self, rank: usize) -> Events {
        read_events(&events_path(&self.dir, rank))
    }

    /// Wait until every rank in `who` has installed a view with exactly
    /// `members`; the latest install time among them.
    pub fn wait_view(&mut self, who: &[usize], members: &[usize], timeout: Duration) -> Result<u64, String> {
        let started = Instant::now();
        loop {
            let times: Vec<Option<u64>> = who
                .iter()
                .map(|r| {
                    self.events(*r)
                        .installs
                        .iter()
                        .find(|(_, _, m)| m == members)
                        .map(|(t, _, _)| *t)
                })
                .collect();
            if times.iter().all(Option::is_some) {
                return Ok(times.into_iter().flatten().max().unwrap_or(0));
            }
            self.members.check_alive(who)?;
            if started.elapsed() > timeout {
                return Err(format!(
                    "members {who:?} did not all install a view of {members:?} within {} ms",
                    timeout.as_millis()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait until `rank` has delivered `count` messages.
    pub fn wait_delivered(&mut self, rank: usize, count: u64, timeout: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if self.events(rank).delivered.last().is_some_and(|d| d.1 >= count) {
                return Ok(());
            }
            self.members.check_alive(&[rank])?;
            if started.elapsed() > timeout {
                return Err(format!(
                    "member {rank} did not deliver {count} messages within {} ms",
                    timeout.as_millis()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Ask everyone to stop and wait: survivors must exit cleanly; a
    /// member in `removed` must fail with a removal error.
    pub fn stop(&mut self, removed: &[usize], timeout: Duration) -> Result<(), String> {
        std::fs::write(self.dir.join("stop"), b"").map_err(|e| format!("write stop file: {e}"))?;
        let started = Instant::now();
        for rank in 0..self.ranks {
            if self.members.pid(rank).is_none() {
                continue;
            }
            let left = timeout.saturating_sub(started.elapsed());
            let exit = self.members.wait_exit(rank, left)?;
            if removed.contains(&rank) {
                if exit.status.success() || !exit.output.contains("removed from the group") {
                    return Err(format!(
                        "member {rank} should have stopped as removed: {} {}",
                        exit.status, exit.output
                    ));
                }
            } else if !exit.status.success() {
                return Err(format!("member {rank} failed: {}", exit.output.trim()));
            }
        }
        Ok(())
    }

    /// Check every delivery log (and its view lines) and that the members
    /// that ended cleanly agree on the replicated state.
    pub fn check(&self) -> Result<String, String> {
        let lines = invariants::read_lines(&self.dir)?;
        invariants::check_lines(&lines, true).map_err(|v| v.to_string())?;
        let mut digests = Vec::new();
        for rank in 0..self.ranks {
            if let Ok(text) = std::fs::read_to_string(state_path(&self.dir, rank)) {
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                digests.push((rank, v["view"].as_u64(), v["digest"].as_str().unwrap_or("").to_string()));
            }
        }
        if digests.windows(2).any(|w| w[0].1 != w[1].1 || w[0].2 != w[1].2) {
            return Err(format!("the survivors' replicated states differ: {digests:?}"));
        }
        Ok(digests.first().map(|d| d.2.clone()).unwrap_or_default())
    }
}

pub fn read_events(path: &Path) -> Events {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut events = Events::default();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let t = v["t_ns"].as_u64().unwrap_or(0);
        if let Some(members) = v["members"].as_array() {
            let members = members.iter().filter_map(|m| m.as_u64()).map(|m| m as usize).collect();
            events.installs.push((t, v["view"].as_u64().unwrap_or(0), members));
        } else if let Some(d) = v["delivered"].as_u64() {
            events.delivered.push((t, d));
        }
    }
    events
}

/// Messages per second delivered between `from` and `to` (ns).
pub fn rate_between(events: &Events, from: u64, to: u64) -> f64 {
    let inside: Vec<&(u64, u64)> = events
        .delivered
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .collect();
    match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) as f64 * 1e9 / (b.0 - a.0) as f64,
        _ => 0.0,
    }
}

// ---- spindle bench failover --------------------------------------------------

#[derive(Args, Debug)]
pub struct FailoverArgs {
    /// shm, tcp (loopback), or `ofi` / `ofi:PROVIDER` (libfabric, a build
    /// with `--features ofi`; its control plane on loopback).
    #[arg(long, default_value = "shm")]
    transport: String,
    /// kill: SIGKILL a member (its process is gone); stop: SIGSTOP it (it
    /// hangs: only the heartbeat timeout finds it).
    #[arg(long, default_value = "kill")]
    fault: String,
    /// Repetitions (a fresh group each).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Members per group.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Messages per second each member sends.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    /// Heartbeat suspicion timeout.
    #[arg(long, default_value_t = 100)]
    suspect_timeout_ms: u64,
    /// Write the summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct FailoverReport {
    transport: String,
    fault: String,
    members: usize,
    runs: usize,
    rate_per_member: u64,
    /// What detection waits for: the heartbeat timeout (stop), or the
    /// fabric's liveness check interval (kill: the process is gone).
    detection_timeout_ms: u64,
    suspect_timeout_ms: u64,
    peer_check_interval_ms: u64,
    failover_ns: Percentiles,
    failover_over_detection_timeout_p99: f64,
    delivered_msgs_per_s_before: f64,
    delivered_msgs_per_s_after: f64,
    /// What the members offer: every member before, the survivors after.
    offered_msgs_per_s_before: u64,
    offered_msgs_per_s_after: u64,
    machine: Machine,
}

pub fn bench(args: FailoverArgs) -> Result<(), String> {
    if !matches!(args.transport.as_str(), "shm" | "tcp") && !crate::member::is_ofi(&args.transport) {
        return Err(format!(
            "--transport {}: expected shm, tcp, ofi or ofi:<provider>",
            args.transport
        ));
    }
    if !matches!(args.fault.as_str(), "kill" | "stop") {
        return Err(format!("--fault {}: expected kill or stop", args.fault));
    }
    if !(3..=16).contains(&args.members) {
        return Err(format!(
            "--members {} must be in 3..=16 (a majority must survive)",
            args.members
        ));
    }
    if args.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let peer_check_ms = 10u64;
    let detection_ms = if args.fault == "kill" {
        peer_check_ms
    } else {
        args.suspect_timeout_ms
    };
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let victim = args.members - 1;
    let survivors: Vec<usize> = (0..victim).collect();
    for run in 0..args.runs {
        let dir = crate::tempdir("failover")?;
        let result = (|| -> Result<(u64, f64, f64), String> {
            let mut group = ViewRun::start(
                &dir,
                args.members,
                args.members,
                &args.transport,
                args.rate,
                args.suspect_timeout_ms,
            )?;
            let all: Vec<usize> = (0..args.members).collect();
            group.wait_view(&all, &all, Duration::from_secs(15))?;
            group.wait_delivered(0, args.rate / 2, Duration::from_secs(15))?;
            std::thread::sleep(Duration::from_millis(300));
            let t_fault = if args.fault == "kill" {
                group.kill(victim)?
            } else {
                group.signal(victim, libc::SIGSTOP)?
            };
            let t_view = group.wait_view(&survivors, &survivors, Duration::from_secs(15))?;
            std::thread::sleep(Duration::from_millis(400));
            let events = group.events(0);
            let rate_before = rate_between(&events, t_fault.saturating_sub(300_000_000), t_fault);
            let rate_after = rate_between(&events, t_view, t_view + 300_000_000);
            if args.fault == "stop" {
                // The stopped member is out of the group; reap it.
                group.kill(victim)?;
            }
            let removed: Vec<usize> = Vec::new();
            group.stop(&removed, Duration::from_secs(15))?;
            Ok((t_view - t_fault, rate_before, rate_after))
        })();
        let _ = std::fs::remove_dir_all(&dir);
        let (ns, b, a) = result.map_err(|e| format!("run {run}: {e}"))?;
        histogram.record(ns.max(1)).map_err(|e| e.to_string())?;
        before.push(b);
        after.push(a);
        eprintln!(
            "run {run}: failover {:.2} ms, delivered/s at member 0 before {b:.0}, after {a:.0}",
            ns as f64 / 1e6
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let failover = Percentiles::from_histogram(&histogram);
    let report = FailoverReport {
        transport: args.transport.clone(),
        fault: args.fault.clone(),
        members: args.members,
        runs: args.runs,
        rate_per_member: args.rate,
        detection_timeout_ms: detection_ms,
        suspect_timeout_ms: args.suspect_timeout_ms,
        peer_check_interval_ms: peer_check_ms,
        failover_over_detection_timeout_p99: histogram.value_at_quantile(0.99) as f64 / (detection_ms as f64 * 1e6),
        failover_ns: failover,
        delivered_msgs_per_s_before: mean(&before),
        delivered_msgs_per_s_after: mean(&after),
        offered_msgs_per_s_before: args.members as u64 * args.rate,
        offered_msgs_per_s_after: (args.members as u64 - 1) * args.rate,
        machine: Machine::detect(),
    };
    println!(
        "failover ({} {}, {} members, {} runs): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; detection timeout {} ms (p99 = {:.2}× it); \
         delivered/s at member 0: {:.0} before, {:.0} right after",
        report.transport,
        report.fault,
        report.members,
        report.runs,
        histogram.value_at_quantile(0.5) as f64 / 1e6,
        histogram.value_at_quantile(0.99) as f64 / 1e6,
        histogram.max() as f64 / 1e6,
        detection_ms,
        report.failover_over_detection_timeout_p99,
        report.delivered_msgs_per_s_before,
        report.delivered_msgs_per_s_after
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

// ---- the failure act of `spindle demo` ------------------------------------------

/// Kill a member of a running 3-member group, show the view change, let a
/// new process join, and check everything.
pub fn demo_act() -> Result<(), String> {
    let dir = crate::tempdir("demo-failure")?;
    let result = (|| -> Result<(), String> {
        println!();
        println!("Membership: 3 members multicast 2,000 msgs/s each; member 2 will be killed with SIGKILL");
        let mut group = ViewRun::start(&dir, 4, 3, "shm", 2000, 300)?;
        group.wait_view(&[0, 1, 2], &[0, 1, 2], Duration::from_secs(15))?;
        group.wait_delivered(0, 2000, Duration::from_secs(15))?;
        let t_kill = group.kill(2)?;
        println!("  killed member 2 (kill -9)");
        let t_view = group.wait_view(&[0, 1], &[0, 1], Duration::from_secs(15))?;
        let v1 = group.events(0).installs.last().map(|i| i.1).unwrap_or(0);
        println!(
            "  view {v1} installed at members 0 and 1: members [0, 1], {:.1} ms after the kill (ragged edge cleaned up, nothing lost)",
            (t_view - t_kill) as f64 / 1e6
        );
        std::thread::sleep(Duration::from_millis(500));
        let rate = rate_between(&group.events(0), t_view, t_view + 500_000_000);
        println!("  members 0 and 1 go on: {rate:.0} deliveries/s at member 0 in the new view");
        let t_ask = monotonic_ns();
        group.join(3)?;
        println!("  a new process joins as member 3");
        let t_join = group.wait_view(&[0, 1, 3], &[0, 1, 3], Duration::from_secs(15))?;
        let v2 = group.events(3).installs.last().map(|i| i.1).unwrap_or(0);
        println!(
            "  view {v2} installed: members [0, 1, 3], {:.1} ms after the joiner started; it got the replicated state as a snapshot",
            (t_join.saturating_sub(t_ask)) as f64 / 1e6
        );
        std::thread::sleep(Duration::from_millis(500));
        group.stop(&[], Duration::from_secs(15))?;
        let digest = group.check()?;
        println!(
            "OK: every member's log passes the checkers (total order, virtual synchrony, no loss, view chain, delivery in the sending view); \
             the survivors' replicated state is identical (digest {digest})"
        );
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
