//! `spindle demo`: a 3-member group on shared memory with no
//! configuration: every member multicasts, all deliver, the run checks
//! that every member delivered the same sequence, and prints throughput
//! and latency.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use spindle_group::config::defaults;
use spindle_group::invariants;

use crate::member::MemberSpec;
use crate::multicast::{check_agreement, run_members};
use crate::tempdir;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Members (one process each).
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Messages each member sends.
    #[arg(long, default_value_t = 200_000)]
    count: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Keep each member's delivery log (JSON lines) in this directory.
    #[arg(long)]
    delivery_log: Option<PathBuf>,
    /// Skip the membership act (a member killed, the view change, a join).
    #[arg(long)]
    no_failure: bool,
    /// Run only this act: `persistence` (a persistent group, every member
    /// killed with SIGKILL and restarted from its log: nothing delivered is
    /// lost) or `membership` (the membership act alone).
    #[arg(long)]
    act: Option<String>,
}

pub fn run(args: DemoArgs) -> Result<(), String> {
    match args.act.as_deref() {
        None => {}
        Some("persistence") => return crate::persist_demo::demo_act(),
        Some("membership") => return crate::failover::demo_act(),
        Some(other) => return Err(format!("--act {other}: expected persistence or membership")),
    }
    if !(1..=16).contains(&args.members) {
        return Err(format!("--members {} must be in 1..=16 for the demo", args.members));
    }
    if args.size < crate::payload::PAYLOAD_BYTES_MIN || args.size > defaults::SLOT_PAYLOAD_MAX {
        return Err(format!(
            "--size {} must be in {}..={}",
            args.size,
            crate::payload::PAYLOAD_BYTES_MIN,
            defaults::SLOT_PAYLOAD_MAX
        ));
    }
    if args.count == 0 {
        return Err("--count must be at least 1".into());
    }
    let work_dir = tempdir("demo")?;
    let log_dir = args
        .delivery_log
        .clone()
        .unwrap_or_else(|| work_dir.join("delivery-log"));
    let spec = MemberSpec {
        group: format!("demo-{}", std::process::id()),
        members: args.members,
        senders: (0..args.members).collect(),
        mode: "ordered".into(),
        window: defaults::WINDOW_SLOTS,
        slot_payload_max: args.size,
        large_message_max_bytes: spindle_group::config::defaults::LARGE_MESSAGE_MAX_BYTES,
        large_in_place: false,
        batching: true,
        idle: "backoff".into(),
        size: args.size,
        count: args.count,
        seconds: 0,
        rate: 0,
        sample_every: (args.count / 50_000).max(1),
        self_check: true,
        pin: false,
        pin_cpu_base: 0,
        delivery_log: Some(log_dir.clone()),
        persist_dir: None,
        compact_log_bytes: 0,
        result_dir: work_dir.clone(),
        join_timeout_ms: defaults::JOIN_TIMEOUT_MS,
        transport: "shm".into(),
        addresses: Vec::new(),
        listen: None,
        key_hex: String::new(),
        peer_timeout_ms: 0,
        membership: spindle_group::config::defaults::MEMBERSHIP,
        suspect_timeout_ms: 0,
        check_source_addr: true,
        tls: None,
        handshake_timeout_ms: 0,
        handshakes_pending_max: 0,
        burst_bytes: crate::member::BURST_BYTES,
    };
    let total = args.count * args.members as u64;
    println!(
        "Spindle demo: {} member processes on shared memory (/dev/shm/spindle-{}), each multicasting {} messages of {} B, ordered delivery",
        args.members, spec.group, args.count, args.size
    );
    let bar = ProgressBar::new(total * args.members as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {percent:>3}% delivered {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    let mut show = |n: u64| {
        bar.set_position(n);
        bar.set_message(format!("{n} deliveries"));
    };
    let result = run_members(&spec, Duration::from_secs(600), Some(&mut show));
    bar.finish_and_clear();
    let results = result.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&work_dir);
    })?;
    check_agreement(&results, true, total)?;
    let logs = invariants::read_logs(&log_dir)?;
    let expected: BTreeMap<usize, u64> = spec.senders.iter().map(|r| (*r, args.count)).collect();
    invariants::check_all(&logs, &expected, true).map_err(|v| v.to_string())?;
    println!("member  delivered  msgs/s        GB/s    sequence digest");
    for r in &results {
        println!(
            "{:>6}  {:>9}  {:>12.0}  {:>6.3}  {}",
            r.rank, r.delivered_msgs, r.delivered_msgs_per_s, r.delivered_gbps, r.sequence_digest
        );
    }
    let samples = crate::member::read_samples(&work_dir, 0).unwrap_or_default();
    let mut own: Vec<u32> = samples.iter().filter(|s| s.0 == 0).map(|s| s.2).collect();
    own.sort_unstable();
    if !own.is_empty() {
        let pct = |q: f64| own[((own.len() - 1) as f64 * q) as usize];
        println!(
            "latency send → delivery at member 0 (its own messages, under full load): p50 {} ns, p99 {} ns ({} samples)",
            pct(0.5),
            pct(0.99),
            own.len()
        );
    }
    println!(
        "OK: all {} members delivered the same {} messages in the same total order (checked: total order, per-sender FIFO, no duplication, no gaps, integrity)",
        args.members, total
    );
    if args.delivery_log.is_some() {
        println!("delivery logs kept in {}", log_dir.display());
    }
    let _ = std::fs::remove_dir_all(&work_dir);
    if args.no_failure {
        return Ok(());
    }
    crate::failover::demo_act()
}
