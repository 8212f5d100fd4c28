//! `spindle bench multicast`: one process per member on shared memory,
//! every byte written and read, plus the raw shm baseline in the same run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use hdrhistogram::Histogram;
use spindle_group::config::defaults;
use spindle_group::counters::DELIVERED_MSGS;
use spindle_group::layout::SmcLayout;
use spindle_group::SenderSet;

use crate::cluster::{read_results, Cluster};
use crate::member::{read_samples, MemberSpec};
use crate::payload::PAYLOAD_BYTES_MIN;
use crate::report::{BenchReport, Machine, MemberResult, Percentiles};
use crate::tempdir;

#[derive(Args, Debug, Clone)]
pub struct MulticastArgs {
    /// Members (one process each).
    #[arg(long, default_value_t = 2)]
    pub members: usize,
    /// Which members send: all, half or one.
    #[arg(long, default_value = "all")]
    pub senders: String,
    /// Payload bytes per message (at least 16: a timestamp and a counter).
    #[arg(long, default_value_t = 10_240)]
    pub size: usize,
    /// Messages per sender.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Delivery mode: ordered, unordered or persistent (ordered, and
    /// delivered once every member has it on disk; the run also measures a
    /// plain write + fdatasync loop on the same disk).
    #[arg(long, default_value = "ordered")]
    pub mode: String,
    /// Persistent mode: the directory of the members' logs (default: a
    /// fresh one under the current directory, removed after the run; not
    /// /tmp or /dev/shm, which may be memory).
    #[arg(long)]
    pub persist_dir: Option<PathBuf>,
    /// Persistent mode: compact each member's log to its snapshot every
    /// this many bytes (`group.compact_log_bytes`; 0: never).
    #[arg(long, default_value_t = 0)]
    pub compact_log_bytes: u64,
    /// Slots in each sender's ring (a power of two).
    #[arg(long, default_value_t = defaults::WINDOW_SLOTS)]
    pub window: usize,
    /// Slot payload size (default: --size up to 1 MiB, 256 KiB above).
    /// A message larger than the slot goes through the large-message path
    /// (fragments of one slot each, reassembled at every member); its raw
    /// baseline moves the same bytes through a ring of the same slots.
    #[arg(long)]
    pub slot_size: Option<usize>,
    /// How members take a message larger than the slot: `whole` (copied
    /// together into one buffer, delivered as one `&[u8]`) or `in-place`
    /// (each fragment read where it lies, `Upcalls::takes_fragments`:
    /// no copy).
    #[arg(long, default_value = "whole", value_parser = ["whole", "in-place"])]
    pub large_delivery: String,
    /// Turn the Spindle batching techniques off (to see what they buy).
    #[arg(long)]
    pub no_batching: bool,
    /// Idle strategy: spin (never park; on tcp each member reads its
    /// sockets itself at every pass: the lowest latency, with a core per
    /// member), backoff, park (short spin, then park on the doorbell), or
    /// auto (backoff on shm, park on tcp).
    #[arg(long, default_value = "auto")]
    pub idle: String,
    /// Offered rate per sender in messages/s (0: as fast as possible). Use a
    /// low rate to measure latency without queueing.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write each member's delivery log (JSON lines) into this directory.
    #[arg(long)]
    pub delivery_log: Option<PathBuf>,
    /// Senders also read every byte of their own delivered messages (by
    /// default a sender checks its own deliveries by header only: those
    /// bytes never left its core, so reading them again is not data
    /// movement; receivers always read every byte).
    #[arg(long)]
    pub self_check: bool,
    /// Pin member r to CPU r mod (number of CPUs) (and the baseline's
    /// producer and consumer to CPUs 0 and 1).
    #[arg(long)]
    pub pin: bool,
    /// Skip the raw baseline (shm ring, or TCP stream and ping-pong).
    #[arg(long)]
    pub no_baseline: bool,
    /// Transport: shm (one host, shared memory), tcp (loopback here; the
    /// members are separate processes connected by TCP, with a fresh group
    /// key per run), or ofi / ofi:PROVIDER (libfabric RMA writes, built
    /// with `--features ofi`; `ofi` is libfabric's tcp provider; the
    /// control plane is tcp on loopback as for tcp; no raw baseline).
    #[arg(long, default_value = "shm")]
    pub transport: String,
    /// tcp: round trips of the raw TCP ping-pong baseline (32 B).
    #[arg(long, default_value_t = 20_000)]
    pub pingpong_rounds: u64,
    /// Lay the members out into this many shards of `members / N` each
    /// (one subgroup, `spindle_group::subgroup::StickyLayout`): every
    /// shard is its own group (own rings, senders and total order) and
    /// all of them run at once. Reports each shard and the aggregate,
    /// and then runs one shard of `members / N` alone as the reference
    /// (the ratio is in the JSON). No raw baseline. With
    /// `--delivery-log DIR`, each shard's logs go to `DIR/all-shard-S`
    /// and the reference's to `DIR/one-shard-0`.
    #[arg(long, default_value_t = 1)]
    pub subgroups: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

impl MulticastArgs {
    /// The idle strategy's name, `auto` resolved: `park` on tcp, `backoff` on shm.
    fn idle_name(&self) -> String {
        match (self.idle.as_str(), self.transport.as_str()) {
            ("auto", "tcp") => "park".into(),
            ("auto", t) if crate::member::is_ofi(t) => "park".into(),
            ("auto", _) => "backoff".into(),
            (other, _) => other.into(),
        }
    }

    fn validate(&self) -> Result<(SenderSet, Vec<usize>, usize), String> {
        if self.members == 0 || self.members > 64 {
            return Err(format!("--members {} must be in 1..=64", self.members));
        }
        let set = SenderSet::parse(&self.senders).map_err(|e| format!("--senders: {e}"))?;
        let ranks = set.ranks(self.members);
        spindle_group::DeliveryMode::parse(&self.mode).map_err(|e| format!("--mode: {e}"))?;
        spindle::config::parse_idle(&self.idle_name()).map_err(|e| format!("--idle: {e}"))?;
        if self.size < PAYLOAD_BYTES_MIN {
            return Err(format!(
                "--size {} must be at least {PAYLOAD_BYTES_MIN} (the bench carries a timestamp and a counter)",
                self.size
            ));
        }
        let slot = self
            .slot_size
            .unwrap_or(if self.size <= defaults::SLOT_PAYLOAD_MAX_MAX {
                self.size
            } else {
                LARGE_SLOT_BYTES_DEFAULT
            });
        if slot > defaults::SLOT_PAYLOAD_MAX_MAX {
            return Err(format!(
                "--slot-size {slot} is larger than {} (a larger message goes as fragments: keep the slot smaller)",
                defaults::SLOT_PAYLOAD_MAX_MAX
            ));
        }
        if self.size > slot && self.size as u64 > defaults::LARGE_MESSAGE_MAX_BYTES {
            return Err(format!(
                "--size {} is larger than the largest message, {} bytes",
                self.size,
                defaults::LARGE_MESSAGE_MAX_BYTES
            ));
        }
        if self.size > slot && slot < spindle_group::large::FRAGMENT_HEADER_BYTES + 8 {
            return Err(format!(
                "--slot-size {slot} is too small to carry fragments of a --size {} message",
                self.size
            ));
        }
        if self.count == 0 {
            return Err("--count must be at least 1".into());
        }
        if self.transport != "shm" && self.transport != "tcp" && !crate::member::is_ofi(&self.transport) {
            return Err(format!(
                "--transport {}: expected shm, tcp, ofi or ofi:<provider>",
                self.transport
            ));
        }
        if self.subgroups == 0 {
            return Err("--subgroups 0: at least 1 (one shard is the plain group)".into());
        }
        if !self.members.is_multiple_of(self.subgroups) {
            return Err(format!(
                "--subgroups {} must divide --members {} (shards of equal size)",
                self.subgroups, self.members
            ));
        }
        if !self.window.is_power_of_two() || self.window < 2 {
            return Err(format!("--window {} must be a power of two ≥ 2", self.window));
        }
        Ok((set, ranks, slot))
    }
}

/// Slot payload of a run whose messages are larger than 1 MiB.
const LARGE_SLOT_BYTES_DEFAULT: usize = 256 << 10;
/// A large-message run keeps each sender's ring within this (the window
/// is lowered to fit): enough to pipeline, small enough to stay in cache.
const LARGE_RING_BYTES_MAX: usize = 16 << 20;

/// The window of a run: `--window`, lowered for a large-message run so
/// the ring stays within [`LARGE_RING_BYTES_MAX`].
fn window_for(args: &MulticastArgs, slot: usize) -> usize {
    if args.size <= slot {
        return args.window;
    }
    let fit = (LARGE_RING_BYTES_MAX / spindle_group::layout::slot_stride(slot)).max(2);
    args.window.min(1 << fit.ilog2())
}

pub fn run(args: MulticastArgs) -> Result<(), String> {
    if args.subgroups > 1 {
        return run_subgroups(&args);
    }
    let (report, tcp_baseline, fsync_loop) = measure_with_tcp(&args)?;
    print_report(&report);
    if let Some(f) = &fsync_loop {
        println!(
            "fdatasync loop on the same disk ({} B writes, one sync each): {:.0} syncs/s, {:.2} MB/s, sync p50 {} ns p99 {} ns; \
             persistent delivered / loop = {:.1}x the messages; the disk streams {:.0} MB/s (1 MiB writes, a sync per 64 MiB), \
             the members wrote {:.0} MB/s together",
            f.size,
            f.syncs_per_s,
            f.mb_per_s,
            f.sync_ns.p50,
            f.sync_ns.p99,
            report.delivered_msgs_per_s_min / f.syncs_per_s.max(1e-9),
            f.streaming_mb_per_s,
            report.delivered_gbps_min * 1e3 * report.members as f64
        );
    }
    if let Some(b) = &tcp_baseline {
        print_tcp_baseline(&report, b);
    }
    if let Some(path) = &args.json {
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        if let (Some(b), Some(map)) = (&tcp_baseline, value.as_object_mut()) {
            // Extra keys on tcp; the shared keys keep their meaning.
            map.insert(
                "baseline_kind".into(),
                "raw TCP stream (1 producer → 1 consumer process)".into(),
            );
            map.insert(
                "baseline_pingpong_rtt_ns".into(),
                serde_json::to_value(b.pingpong_rtt_ns).map_err(|e| e.to_string())?,
            );
            map.insert(
                "baseline_pingpong_blocking_rtt_ns".into(),
                serde_json::to_value(b.pingpong_blocking_rtt_ns).map_err(|e| e.to_string())?,
            );
            map.insert(
                "baseline_pingpong_spin_rtt_ns".into(),
                serde_json::to_value(b.pingpong_spin_rtt_ns).map_err(|e| e.to_string())?,
            );
            map.insert("ratio_rtt_own_p50_to_pingpong_p50".into(), rtt_ratio(&report, b).into());
        }
        if let (Some(f), Some(map)) = (&fsync_loop, value.as_object_mut()) {
            map.insert("fsync_loop".into(), serde_json::to_value(f).map_err(|e| e.to_string())?);
            map.insert(
                "ratio_msgs_to_fsync_loop_syncs".into(),
                (report.delivered_msgs_per_s_min / f.syncs_per_s.max(1e-9)).into(),
            );
        }
        let json = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        crate::plot::write_bench_plot(path, &report)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// Round trip through ordered delivery (commit → the sender's own
/// delivery, which waits for every member's receipt) over the better of
/// the raw TCP ping-pongs (blocking or busy-polling reads), both at p50.
fn rtt_ratio(report: &BenchReport, b: &crate::baseline::tcp::TcpBaseline) -> f64 {
    if b.pingpong_rtt_ns.p50 == 0 {
        0.0
    } else {
        report.latency_own_ns.p50 as f64 / b.pingpong_rtt_ns.p50 as f64
    }
}

fn print_tcp_baseline(r: &BenchReport, b: &crate::baseline::tcp::TcpBaseline) {
    let (blocking, spin) = (b.pingpong_blocking_rtt_ns, b.pingpong_spin_rtt_ns);
    println!(
        "raw TCP ping-pong (32 B): blocking reads p50 {} ns p99 {} ns, busy-polling reads p50 {} ns p99 {} ns ({} samples each); \
         own-delivery latency p50 / the better ping-pong p50 = {:.2}",
        blocking.p50,
        blocking.p99,
        spin.p50,
        spin.p99,
        spin.samples,
        rtt_ratio(r, b)
    );
}

/// Run the members and the baseline (the raw shm ring, or on tcp the raw
/// TCP stream and ping-pong); gather the report.
#[allow(clippy::type_complexity)]
pub fn measure_with_tcp(
    args: &MulticastArgs,
) -> Result<
    (
        BenchReport,
        Option<crate::baseline::tcp::TcpBaseline>,
        Option<crate::baseline::FsyncLoop>,
    ),
    String,
> {
    let (set, ranks, slot) = args.validate()?;
    let window = window_for(args, slot);
    let result_dir = tempdir("bench")?;
    let persistent = args.mode == "persistent";
    // A fresh directory per run (the logs of an earlier run are refused);
    // removed afterwards unless the caller named it.
    let persist_dir = persistent.then(|| {
        let base = args.persist_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        base.join(format!(
            "spindle-persist-{}-{}",
            std::process::id(),
            spindle_runtime::monotonic_ns()
        ))
    });
    let tcp = args.transport == "tcp";
    let ofi = crate::member::is_ofi(&args.transport);
    let spec = member_spec(
        args,
        format!("bench-{}", std::process::id()),
        args.members,
        ranks.clone(),
        (window, slot),
        persist_dir.clone(),
        result_dir.clone(),
    )?;
    let total = args.count * ranks.len() as u64;
    let results = run_members(&spec, Duration::from_secs(args.timeout_s), None);
    let results = results.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&result_dir);
        if let Some(d) = &persist_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    })?;
    // The disk's own limit, on the same directory: write + fdatasync of
    // one message at a time.
    let fsync_loop = match &persist_dir {
        Some(d) => {
            // What the logs take on disk at the end (compaction bounds
            // it: what it dropped is a hole in the file).
            let log_bytes: Vec<u64> = (0..args.members)
                .map(|r| {
                    let path = spindle_group::persist::log_path(d, &spec.group, r);
                    std::fs::metadata(path).map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
                })
                .collect();
            let compactions: Vec<u64> = results
                .iter()
                .map(|r| r.counters.get("log_compactions").copied().unwrap_or(0))
                .collect();
            println!("persistent logs at the end (bytes on disk per member): {log_bytes:?}; log compactions per member: {compactions:?}");
            let r = crate::baseline::fsync_loop(d, args.size, Duration::from_secs(2));
            let _ = std::fs::remove_dir_all(d);
            Some(r?)
        }
        None => None,
    };
    let (latency_ns, latency_own_ns) = latencies(&result_dir, args.members)?;
    let _ = std::fs::remove_dir_all(&result_dir);
    check_agreement(&results, args.mode != "unordered", total)?;
    let mut tcp_baseline = None;
    let (baseline_gbps, baseline_msgs_per_s) = if args.no_baseline || ofi {
        (0.0, 0.0)
    } else if tcp {
        let b = crate::baseline::tcp::measure(args.size, total, args.pingpong_rounds, args.pin)?;
        tcp_baseline = Some(b);
        (b.gbps, b.msgs_per_s)
    } else if args.size > slot {
        // The same bytes through a raw ring of the same slots.
        let bytes = args.size as u64 * total;
        let b = crate::baseline::measure(slot, bytes.div_ceil(slot as u64), window, args.pin)?;
        (b.gbps, b.gbps * 1e9 / args.size as f64)
    } else {
        let b = crate::baseline::measure(args.size, total, args.window, args.pin)?;
        (b.gbps, b.msgs_per_s)
    };
    let slowest = results
        .iter()
        .min_by(|a, b| a.delivered_gbps.total_cmp(&b.delivered_gbps))
        .expect("at least one member");
    let report = BenchReport {
        transport: args.transport.clone(),
        mode: args.mode.clone(),
        members: args.members,
        senders: set.as_str(),
        sender_count: ranks.len(),
        size: args.size,
        count: args.count,
        window,
        large_delivery: args.large_delivery.clone(),
        batching: !args.no_batching,
        self_check: args.self_check,
        pinned: args.pin,
        idle: args.idle_name(),
        rate: args.rate,
        delivered_gbps_min: slowest.delivered_gbps,
        delivered_msgs_per_s_min: results
            .iter()
            .map(|r| r.delivered_msgs_per_s)
            .fold(f64::INFINITY, f64::min),
        latency_ns,
        latency_own_ns,
        baseline_gbps,
        baseline_msgs_per_s,
        ratio_to_baseline: if baseline_gbps > 0.0 {
            slowest.delivered_gbps / baseline_gbps
        } else {
            0.0
        },
        member_results: results,
        machine: Machine::detect(),
        unix_time_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    Ok((report, tcp_baseline, fsync_loop))
}

/// The spec of a run's members: `members` processes of group `group`,
/// `senders` sending, with `(window, slot)`; on tcp or ofi, fresh
/// loopback addresses and a fresh group key.
fn member_spec(
    args: &MulticastArgs,
    group: String,
    members: usize,
    senders: Vec<usize>,
    (window, slot): (usize, usize),
    persist_dir: Option<PathBuf>,
    result_dir: PathBuf,
) -> Result<MemberSpec, String> {
    let (addresses, key_hex) = if args.transport == "tcp" || crate::member::is_ofi(&args.transport) {
        let addresses = (0..members)
            .map(|_| crate::baseline::tcp::free_loopback_addr())
            .collect::<Result<Vec<_>, _>>()?;
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
            .map_err(|e| format!("make a group key: {e}"))?;
        (addresses, spindle::config::hex_encode(&key))
    } else {
        (Vec::new(), String::new())
    };
    Ok(MemberSpec {
        group,
        members,
        senders,
        mode: args.mode.clone(),
        window,
        slot_payload_max: slot,
        large_message_max_bytes: spindle_group::config::defaults::LARGE_MESSAGE_MAX_BYTES,
        large_in_place: args.large_delivery == "in-place",
        batching: !args.no_batching,
        idle: args.idle_name(),
        size: args.size,
        count: args.count,
        seconds: 0,
        rate: args.rate,
        sample_every: if args.rate > 0 {
            1
        } else {
            (args.count / 100_000).max(1)
        },
        self_check: args.self_check,
        pin: args.pin,
        pin_cpu_base: 0,
        delivery_log: args.delivery_log.clone(),
        persist_dir,
        compact_log_bytes: args.compact_log_bytes,
        result_dir,
        join_timeout_ms: defaults::JOIN_TIMEOUT_MS,
        transport: args.transport.clone(),
        addresses,
        listen: None,
        key_hex,
        peer_timeout_ms: 0,
        membership: spindle_group::config::defaults::MEMBERSHIP,
        suspect_timeout_ms: 0,
        check_source_addr: true,
        tls: None,
        handshake_timeout_ms: 0,
        handshakes_pending_max: 0,
        burst_bytes: crate::member::BURST_BYTES,
    })
}

/// Spawn one process per member, wait for all (calling `progress` with
/// the messages delivered so far, summed over members), and read their
/// results. A member that fails stops the run with its error.
pub fn run_members(
    spec: &MemberSpec,
    timeout: Duration,
    progress: Option<&mut dyn FnMut(u64)>,
) -> Result<Vec<MemberResult>, String> {
    let json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
    // The files that killed members cannot remove are removed on drop.
    let mut procs = Cluster::new(spec.members)?.owns_group(&spec.group, spec.members);
    procs.start_each(spec.members, |rank| {
        vec![
            "member".into(),
            "--rank".into(),
            rank.to_string(),
            "--spec".into(),
            json.clone(),
        ]
    })?;
    let config = spec.group_config()?;
    let layout = SmcLayout::new(&config);
    // Without a progress display the coordinator stays off the cores the
    // members spin on. A failed member fails the run: the others (which
    // would go on in a new view) are stopped after the grace period.
    let grace = Duration::from_millis(500);
    match progress {
        Some(report) => {
            let mut tick = || report(delivered_so_far(&spec.group, &layout));
            procs.wait_all(timeout, grace, Duration::from_millis(20), &mut tick)?
        }
        None => procs.wait_all(timeout, grace, Duration::from_millis(100), &mut || {})?,
    };
    read_results(spec.members, |rank| MemberSpec::result_path(&spec.result_dir, rank))
}

/// Messages delivered so far, summed over members, read from the group's
/// shared memory (0 until the group exists).
fn delivered_so_far(group: &str, layout: &SmcLayout) -> u64 {
    let Ok(file) = spindle_fabric::shm::GroupFile::open(Path::new("/dev/shm"), group) else {
        return 0;
    };
    if file.header().row_len_bytes.load(std::sync::atomic::Ordering::Relaxed) as usize != layout.row.row_len_bytes() {
        return 0;
    }
    (0..file.member_count())
        .map(|r| {
            file.row(r)
                .u64_at(layout.counters.offset(DELIVERED_MSGS))
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum()
}

/// Latency to the slowest member (per message: max over members) and to
/// the sender's own member.
fn latencies(dir: &Path, members: usize) -> Result<(Percentiles, Percentiles), String> {
    let mut slowest: HashMap<(u32, u64), u32> = HashMap::new();
    let mut own = Histogram::<u64>::new(3).expect("histogram");
    for rank in 0..members {
        for (sender, counter, ns) in read_samples(dir, rank)? {
            let e = slowest.entry((sender, counter)).or_insert(0);
            *e = (*e).max(ns);
            if sender as usize == rank {
                own.record(ns.max(1) as u64).map_err(|e| e.to_string())?;
            }
        }
    }
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for ns in slowest.values() {
        all.record((*ns).max(1) as u64).map_err(|e| e.to_string())?;
    }
    Ok((Percentiles::from_histogram(&all), Percentiles::from_histogram(&own)))
}

/// Every member delivered every message, read exactly the bytes each
/// sender wrote (checked against the sender's closed-form checksum), and
/// (ordered) delivered them in the same order.
pub fn check_agreement(results: &[MemberResult], ordered: bool, total: u64) -> Result<(), String> {
    let first = &results[0];
    for r in results {
        if r.delivered_msgs != total {
            return Err(format!(
                "member {} delivered {} messages, expected {total}",
                r.rank, r.delivered_msgs
            ));
        }
        for (sender, read) in &r.checksum_by_sender {
            let wrote = results.iter().find(|m| m.rank == *sender).map(|m| m.sent_checksum);
            if wrote != Some(*read) {
                return Err(format!(
                    "integrity: member {} read different bytes from sender {sender} than it wrote",
                    r.rank
                ));
            }
        }
        if ordered && r.sequence_digest != first.sequence_digest {
            return Err(format!(
                "total order violated: members {} and {} delivered different sequences",
                first.rank, r.rank
            ));
        }
    }
    Ok(())
}

fn print_report(r: &BenchReport) {
    println!(
        "spindle bench multicast: {} {}, {} members, senders={} ({}), {} B × {} per sender, window {}, batching {}, self-check {}, idle {}{}",
        r.transport,
        r.mode,
        r.members,
        r.senders,
        r.sender_count,
        r.size,
        r.count,
        r.window,
        if r.batching { "on" } else { "off" },
        if r.self_check { "on" } else { "off" },
        r.idle,
        if r.rate > 0 { format!(", offered {} msgs/s per sender", r.rate) } else { String::new() }
    );
    println!(
        "{:>6} {:>12} {:>9} {:>13} {:>10} {:>10} {:>12} {:>10} {:>8}",
        "member", "delivered", "GB/s", "msgs/s", "pub batch", "recv batch", "deliv batch", "null runs", "parks"
    );
    for m in &r.member_results {
        let c = |k: &str| m.counters.get(k).copied().unwrap_or(0);
        let mean = |a: &str, b: &str| if c(b) > 0 { c(a) as f64 / c(b) as f64 } else { 0.0 };
        println!(
            "{:>6} {:>12} {:>9.3} {:>13.0} {:>10.1} {:>10.1} {:>12.1} {:>10} {:>8}",
            m.rank,
            m.delivered_msgs,
            m.delivered_gbps,
            m.delivered_msgs_per_s,
            mean("publish_batch_slots", "publish_batches"),
            mean("received_msgs", "receive_batches"),
            mean("delivered_msgs", "delivery_batches"),
            c("null_runs"),
            c("parks"),
        );
    }
    println!(
        "slowest member: {:.3} GB/s, {:.0} msgs/s",
        r.delivered_gbps_min, r.delivered_msgs_per_s_min
    );
    if r.baseline_gbps > 0.0 && r.transport == "tcp" {
        println!(
            "raw TCP stream baseline (1 producer → 1 consumer process, same payloads, every byte written and read): {:.3} GB/s, {:.0} msgs/s; ratio to baseline {:.2}",
            r.baseline_gbps, r.baseline_msgs_per_s, r.ratio_to_baseline
        );
    } else if r.baseline_gbps > 0.0 {
        println!(
            "raw shm ring baseline (1 producer → 1 consumer, same payloads): {:.3} GB/s, {:.0} msgs/s; ratio to baseline {:.2}",
            r.baseline_gbps, r.baseline_msgs_per_s, r.ratio_to_baseline
        );
    }
    println!("latency send-commit → delivery (ns)     p50      p99    p99.9      max  samples");
    for (name, p) in [
        ("to the sender's own member", r.latency_own_ns),
        ("to the slowest member", r.latency_ns),
    ] {
        println!(
            "  {:<34} {:>8} {:>8} {:>8} {:>8} {:>8}",
            name, p.p50, p.p99, p.p999, p.max, p.samples
        );
    }
}

/// One shard of a `--subgroups` run.
#[derive(Clone, Debug, serde::Serialize)]
struct ShardResult {
    shard: usize,
    /// Its members' top-level ranks, in shard-rank order.
    members: Vec<usize>,
    group: String,
    /// Messages ordered in the shard (every member delivered each).
    messages: u64,
    delivered_msgs_per_s_min: f64,
    delivered_gbps_min: f64,
    t0_ns: u64,
    t_last_ns: u64,
}

/// What a set of shards running at once achieved together: every
/// shard's messages over the span from the first member's start to the
/// last member's last delivery (one host clock).
#[derive(Clone, Debug, serde::Serialize)]
struct ShardsTogether {
    shards: Vec<ShardResult>,
    span_ns: u64,
    aggregate_msgs_per_s: f64,
    aggregate_gbps: f64,
}

/// `spindle bench multicast --subgroups N`: the members laid out into
/// N shards by the default subgroup layout, all shards at once, then one
/// shard alone as the reference.
fn run_subgroups(args: &MulticastArgs) -> Result<(), String> {
    use spindle_group::subgroup::{LayoutFunction, StickyLayout, SubgroupSpec};
    let (set, _, slot) = args.validate()?;
    let window = window_for(args, slot);
    let per_shard = args.members / args.subgroups;
    let mut spec = SubgroupSpec::new("bench", args.subgroups, per_shard);
    spec.mode = spindle_group::DeliveryMode::parse(&args.mode)?;
    spec.senders = set.clone();
    let view: Vec<usize> = (0..args.members).collect();
    let layout = StickyLayout
        .layout(&[spec], 0, &view, None)
        .map_err(|e| format!("--subgroups: {e}"))?;
    let shards = layout.shards[0].clone();
    println!(
        "spindle bench multicast --subgroups {}: {} members as {} shards of {} ({}), {} {}, {} B × {} per sender, senders={} per shard, window {}, idle {}",
        args.subgroups,
        args.members,
        args.subgroups,
        per_shard,
        shards.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>().join(" "),
        args.transport,
        args.mode,
        args.size,
        args.count,
        set.as_str(),
        window,
        args.idle_name()
    );
    let together = run_shards(args, &set, &shards, (window, slot), "all")?;
    print_shards(&format!("{} shards at once", shards.len()), &together);
    let alone = run_shards(args, &set, &shards[..1], (window, slot), "one")?;
    print_shards("one shard alone (the reference)", &alone);
    let ratio = together.aggregate_msgs_per_s / alone.aggregate_msgs_per_s.max(1e-9);
    println!(
        "aggregate with {} shards / one shard alone = {ratio:.2}x ({} CPUs; {} member processes at once)",
        shards.len(),
        Machine::detect().cpus,
        args.members
    );
    if let Some(path) = &args.json {
        let value = serde_json::json!({
            "transport": args.transport,
            "mode": args.mode,
            "members": args.members,
            "subgroups": args.subgroups,
            "members_per_shard": per_shard,
            "senders": set.as_str(),
            "size": args.size,
            "count": args.count,
            "window": window,
            "idle": args.idle_name(),
            "pinned": args.pin,
            "layout": "StickyLayout (first view: shards in rank order)",
            "all_shards": together,
            "one_shard": alone,
            "ratio_aggregate_to_one_shard": ratio,
            "machine": Machine::detect(),
            "unix_time_s": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            "command": std::env::args().collect::<Vec<_>>().join(" "),
        });
        let json = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

/// Run `shards` (top-level ranks of each) at once, each its own group,
/// and check each shard's agreement (every member delivered every
/// message of its shard, the same bytes, in one order when ordered).
fn run_shards(
    args: &MulticastArgs,
    set: &SenderSet,
    shards: &[Vec<usize>],
    (window, slot): (usize, usize),
    tag: &str,
) -> Result<ShardsTogether, String> {
    let persistent = args.mode == "persistent";
    let pid = std::process::id();
    let mut specs = Vec::with_capacity(shards.len());
    for (s, members) in shards.iter().enumerate() {
        let senders = set.ranks(members.len());
        let persist_dir = persistent.then(|| {
            let base = args.persist_dir.clone().unwrap_or_else(|| PathBuf::from("."));
            base.join(format!(
                "spindle-persist-{pid}-{tag}-{s}-{}",
                spindle_runtime::monotonic_ns()
            ))
        });
        let mut spec = member_spec(
            args,
            spindle_group::subgroup::shard_group_name(&format!("bench-{pid}-{tag}"), "bench", s),
            members.len(),
            senders,
            (window, slot),
            persist_dir,
            tempdir(&format!("bench-shard{s}"))?,
        )?;
        spec.pin_cpu_base = members[0];
        spec.delivery_log = args.delivery_log.as_ref().map(|d| d.join(format!("{tag}-shard-{s}")));
        if let Some(d) = &spec.delivery_log {
            std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
        }
        specs.push(spec);
    }
    let timeout = Duration::from_secs(args.timeout_s);
    let outcomes: Vec<Result<Vec<MemberResult>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .iter()
            .map(|spec| scope.spawn(move || run_members(spec, timeout, None)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a shard's coordinator panicked".into()))
            })
            .collect()
    });
    for spec in &specs {
        let _ = std::fs::remove_dir_all(&spec.result_dir);
        if let Some(d) = &spec.persist_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    let mut results = Vec::with_capacity(shards.len());
    for (s, (outcome, spec)) in outcomes.into_iter().zip(&specs).enumerate() {
        let members = outcome.map_err(|e| format!("shard {s}: {e}"))?;
        let messages = args.count * spec.senders.len() as u64;
        check_agreement(&members, args.mode != "unordered", messages).map_err(|e| format!("shard {s}: {e}"))?;
        results.push(ShardResult {
            shard: s,
            members: shards[s].clone(),
            group: spec.group.clone(),
            messages,
            delivered_msgs_per_s_min: members
                .iter()
                .map(|m| m.delivered_msgs_per_s)
                .fold(f64::INFINITY, f64::min),
            delivered_gbps_min: members.iter().map(|m| m.delivered_gbps).fold(f64::INFINITY, f64::min),
            t0_ns: members.iter().map(|m| m.t0_ns).min().unwrap_or(0),
            t_last_ns: members.iter().map(|m| m.t_last_ns).max().unwrap_or(0),
        });
    }
    let t0 = results.iter().map(|r| r.t0_ns).min().unwrap_or(0);
    let t_last = results.iter().map(|r| r.t_last_ns).max().unwrap_or(0);
    let span_ns = t_last.saturating_sub(t0).max(1);
    let messages: u64 = results.iter().map(|r| r.messages).sum();
    Ok(ShardsTogether {
        shards: results,
        span_ns,
        aggregate_msgs_per_s: messages as f64 * 1e9 / span_ns as f64,
        aggregate_gbps: (messages * args.size as u64) as f64 / span_ns as f64,
    })
}

fn print_shards(title: &str, t: &ShardsTogether) {
    println!("{title}:");
    println!(
        "{:>6} {:>16} {:>10} {:>14} {:>9}",
        "shard", "members", "messages", "msgs/s (min)", "GB/s"
    );
    for r in &t.shards {
        println!(
            "{:>6} {:>16} {:>10} {:>14.0} {:>9.3}",
            r.shard,
            format!("{:?}", r.members),
            r.messages,
            r.delivered_msgs_per_s_min,
            r.delivered_gbps_min
        );
    }
    println!(
        "  aggregate over {:.3} s (first start to last delivery): {:.0} msgs/s, {:.3} GB/s",
        t.span_ns as f64 / 1e9,
        t.aggregate_msgs_per_s,
        t.aggregate_gbps
    );
}
