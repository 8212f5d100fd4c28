//! `spindle dds perf`: DDS throughput and latency in the manner of
//! ddsperf and RTI Perftest, with NAPA's window occupancy and gap over
//! time.
//!
//! ```text
//! spindle dds perf pair --size 102400 --napa on --seconds 5 --json r.json --svg r.svg
//! spindle dds perf pair --latency --size 16 --transport tcp
//! spindle dds perf pub --rank 0 --transport tcp --peers 10.0.0.1:7400,10.0.0.2:7400 --key-file k
//! spindle dds perf sub --rank 1 --transport tcp --peers 10.0.0.1:7400,10.0.0.2:7400 --key-file k
//! ```
//!
//! Roles: `pub` writes samples as fast as its window and NAPA allow (or
//! at `--rate`), `sub` takes them and measures one-way latency (the
//! reader's reception time minus the writer's source timestamp: one
//! clock on one host, `CLOCK_REALTIME`) and throughput; `ping` writes one
//! sample at a time and waits for `pong`'s echo (round-trip latency).
//! `pair` runs both roles of a test as two processes of this host and
//! merges their results.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use spindle::dds::rtps::{BridgeDirection, RtpsBridge, RtpsConfig};
use spindle::dds::{
    DdsError, DomainParticipant, Keyed, NapaConfig, NapaTrace, ReaderQos, ResourceLimits, Topic, WriterQos,
};
use spindle::{IdleStrategy, TcpTransport, Transport};

use crate::report::{Machine, Percentiles};

/// `spindle dds …`.
#[derive(Subcommand, Debug)]
pub enum DdsCommand {
    /// Throughput and latency between a publisher and a subscriber (or a
    /// ping and a pong), like ddsperf.
    Perf(PerfArgs),
    /// A writer of one topic (with `--rtps`: meets Cyclone's `ddsperf sub`).
    Pub(crate::dds_rtps::PubArgs),
    /// A reader of one topic (with `--rtps`: meets Cyclone's `ddsperf pub`).
    Sub(crate::dds_rtps::SubArgs),
    /// NAPA in the deterministic simulator: seeds with invariants, or the
    /// seed paper's size sweep.
    Sim(crate::dds_sim::DdsSimArgs),
}

/// Run a `spindle dds` command.
pub fn run(command: DdsCommand) -> Result<(), String> {
    match command {
        DdsCommand::Perf(args) => perf(args),
        DdsCommand::Pub(args) => crate::dds_rtps::publish(args),
        DdsCommand::Sub(args) => crate::dds_rtps::sub(args),
        DdsCommand::Sim(args) => crate::dds_sim::run(args),
    }
}

/// A perf role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Role {
    /// Both roles of the test, as two processes of this host.
    Pair,
    /// Write samples (throughput).
    Pub,
    /// Take samples, measure one-way latency and throughput.
    Sub,
    /// Write one sample at a time, wait for its echo (round trip).
    Ping,
    /// Echo every sample back.
    Pong,
}

/// The transport of a perf run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum PerfTransport {
    /// Shared memory (one host).
    Shm,
    /// Tcp (loopback in `pair`, or `--peers`).
    Tcp,
}

/// On or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// Where ping and pong answer a sample (ddsperf's `listener` and
/// `waitset` triggering modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Trigger {
    /// In the reader's data-available listener, on the participant's
    /// progress thread (ddsperf's default): a sample is answered where it
    /// is delivered, with no wake-up of an application thread.
    #[default]
    Listener,
    /// On the application thread, woken by `wait_for_data`.
    Waitset,
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Trigger::Listener => "listener",
            Trigger::Waitset => "waitset",
        }
    }
}

/// `spindle dds perf` arguments.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
pub struct PerfArgs {
    /// pair, pub, sub, ping or pong.
    #[arg(value_enum)]
    pub role: Role,
    /// Serialized sample size in bytes (16 B – 200 KB).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Reliable delivery (the default); `--best-effort` for best effort.
    #[arg(long, default_value_t = false)]
    pub best_effort: bool,
    /// NAPA pacing of the reliable writer (off: the library's default).
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub napa: OnOff,
    /// How long the writer writes.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Offered samples per second (0: as fast as possible: a saturating
    /// load).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Readers acknowledge at least every K samples.
    #[arg(long, default_value_t = 10)]
    pub ack_every: u32,
    /// Send-window slots (a power of two; 0: the participant's default,
    /// as many as fit in 8 MiB, 16..=1024).
    #[arg(long, default_value_t = 0)]
    pub window: usize,
    /// With `pair`: ping/pong (round-trip latency) instead of pub/sub.
    #[arg(long, default_value_t = false)]
    pub latency: bool,
    /// shm or tcp.
    #[arg(long, value_enum, default_value_t = PerfTransport::Shm)]
    pub transport: PerfTransport,
    /// The domain id (two perf runs at once need different ones).
    #[arg(long, default_value_t = 0)]
    pub domain: u32,
    /// This participant's rank (pub/ping 0, sub/pong 1).
    #[arg(long)]
    pub rank: Option<usize>,
    /// tcp: both participants' `host:port`, rank 0 first.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<SocketAddr>,
    /// tcp: the domain key file (at least 16 bytes).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Plot latency and NAPA's occupancy and gap over time (SVG) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// ping and pong: answer each sample in the reader's listener, on the
    /// progress thread (ddsperf's default: `listener`), or on the
    /// application thread (`waitset`).
    #[arg(long, value_enum)]
    #[serde(default)]
    pub trigger: Option<Trigger>,
    /// The participants' progress threads when idle: backoff (spin, yield,
    /// park; the default) or spin.
    #[arg(long, default_value = "backoff")]
    pub idle: String,
    /// With `pair`: run role 0 and role 1 in these two network namespaces
    /// (`ip netns exec`; needs `--transport tcp` and `--peers` with each
    /// namespace's address).
    #[arg(long, value_delimiter = ',')]
    pub netns: Vec<String>,
    /// Run every participant with its RTPS gateway (loopback only, RTPS
    /// domain `--domain`, 0..=232): the fast path between Spindle
    /// participants, measured with the gateway present.
    #[arg(long, default_value_t = false)]
    #[serde(default)]
    pub rtps: bool,
    /// With `--rtps`: also bridge each topic to RTPS in the participant
    /// that writes it. No RTPS reader is matched here, so the bridge's
    /// Spindle reader never joins: this measures what a bridged topic
    /// costs the fast path while nobody reads it over RTPS.
    #[arg(long, default_value_t = false, requires = "rtps")]
    #[serde(default)]
    pub rtps_bridge: bool,
    /// (internal) where a role writes its part of the result.
    #[arg(long, hide = true)]
    pub part_file: Option<PathBuf>,
}

/// The sample type of every perf topic.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct PerfSample {
    /// Sequence number of the writer.
    pub seq: u64,
    /// Filler up to the sample size.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

impl Keyed for PerfSample {
    type Key = ();
    fn key(&self) {}
}

/// Bytes postcard adds around the filler (seq varint ≤ 10, length ≤ 5).
const SAMPLE_OVERHEAD_BYTES_MAX: usize = 15;

/// One point of NAPA's trace.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct TracePoint {
    /// Seconds since the writer started.
    pub t_s: f64,
    /// The window's occupancy (slots not yet acknowledged).
    pub occupancy: u64,
    /// NAPA's inter-sample gap (ns).
    pub gap_ns: u64,
    /// NAPA's high threshold W.
    pub high_threshold: u32,
    /// NAPA's RTT estimate (ns).
    pub rtt_ns: u64,
}

/// What one role measured (the `pair` parent merges two).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Part {
    /// Samples written (pub, ping).
    pub written: u64,
    /// Samples taken (sub) or echoes (ping).
    pub received: u64,
    /// Bytes of samples taken.
    pub received_bytes: u64,
    /// Seconds between the first and the last sample taken.
    pub received_span_s: f64,
    /// One-way (sub) or round-trip (ping) latency.
    pub latency_ns: Percentiles,
    /// Writes that waited for a full window.
    pub writes_blocked: u64,
    /// NAPA over time (pub).
    pub trace: Vec<TracePoint>,
}

/// The JSON a perf run writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PerfResult {
    /// Serialized sample bytes.
    pub size: usize,
    /// Reliable delivery.
    pub reliable: bool,
    /// NAPA on.
    pub napa: bool,
    /// shm or tcp.
    pub transport: String,
    /// pub/sub (throughput, one-way latency) or ping/pong (round trip).
    pub test: String,
    /// Offered rate (0: saturating).
    pub rate: u64,
    /// K.
    pub ack_every: u32,
    /// Send-window slots.
    pub window: usize,
    /// One-way latency (pub/sub) or round-trip latency (ping/pong), ns.
    pub latency_ns: Percentiles,
    /// Samples per second taken by the subscriber.
    pub throughput_samples_per_s: f64,
    /// Megabits per second of sample bytes taken by the subscriber.
    pub throughput_mbps: f64,
    /// Samples written.
    pub written: u64,
    /// Samples received.
    pub received: u64,
    /// Writes that waited for a full window.
    pub writes_blocked: u64,
    /// NAPA's window occupancy and gap over time.
    pub trace: Vec<TracePoint>,
    /// ping/pong: where each sample was answered (`listener` or `waitset`).
    #[serde(default)]
    pub trigger: String,
    /// The participants ran their RTPS gateway (`--rtps`), and each topic
    /// was bridged out (`--rtps-bridge`).
    #[serde(default)]
    pub rtps: bool,
    #[serde(default)]
    pub rtps_bridge: bool,
    /// Where it ran.
    pub machine: Machine,
}

fn perf(args: PerfArgs) -> Result<(), String> {
    if !(16..=200 * 1024).contains(&args.size) {
        return Err(format!("--size {} must be in 16..=204800 bytes", args.size));
    }
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(format!("--seconds {} must be in (0, 3600]", args.seconds));
    }
    let round_trip = matches!(args.role, Role::Ping | Role::Pong) || (args.role == Role::Pair && args.latency);
    if args.trigger.is_some() && !round_trip {
        return Err("--trigger applies to ping and pong (pair --latency) only".into());
    }
    if round_trip && args.napa == OnOff::On && args.trigger.unwrap_or_default() == Trigger::Listener {
        return Err(
            "--napa on paces each write with a sleep, which in the listener would stop the progress thread: \
             use --trigger waitset with --napa on"
                .into(),
        );
    }
    match args.role {
        Role::Pair => pair(&args),
        role => {
            let part = run_role(role, &args).map_err(|e| format!("dds perf {role:?}: {e}"))?;
            match &args.part_file {
                Some(path) => std::fs::write(path, serde_json::to_vec(&part).expect("a part serializes"))
                    .map_err(|e| format!("write {}: {e}", path.display())),
                None => {
                    println!("{}", serde_json::to_string_pretty(&part).expect("a part serializes"));
                    Ok(())
                }
            }
        }
    }
}

/// Run the two roles as two processes of this binary and merge.
fn pair(args: &PerfArgs) -> Result<(), String> {
    let dir = tempfile_dir()?;
    let (first, second) = if args.latency {
        (Role::Ping, Role::Pong)
    } else {
        (Role::Pub, Role::Sub)
    };
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let mut common: Vec<String> = vec![
        "--size".into(),
        args.size.to_string(),
        "--napa".into(),
        if args.napa == OnOff::On { "on" } else { "off" }.into(),
        "--seconds".into(),
        args.seconds.to_string(),
        "--rate".into(),
        args.rate.to_string(),
        "--ack-every".into(),
        args.ack_every.to_string(),
        "--window".into(),
        args.window.to_string(),
        "--domain".into(),
        args.domain.to_string(),
        "--idle".into(),
        args.idle.clone(),
    ];
    if let Some(trigger) = args.trigger {
        common.extend(["--trigger".into(), trigger.name().into()]);
    }
    if args.best_effort {
        common.push("--best-effort".into());
    }
    if args.rtps {
        common.push("--rtps".into());
    }
    if args.rtps_bridge {
        common.push("--rtps-bridge".into());
    }
    if !args.netns.is_empty()
        && (args.netns.len() != 2 || args.transport != PerfTransport::Tcp || args.peers.len() != 2)
    {
        return Err("--netns takes two namespaces and needs --transport tcp and --peers (one address in each)".into());
    }
    if args.transport == PerfTransport::Tcp {
        let peers = if args.peers.is_empty() {
            let base = crate::cluster::free_ports(2)?;
            format!("127.0.0.1:{},127.0.0.1:{}", base, base + 1)
        } else {
            args.peers.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
        };
        let key = dir.join("domain.key");
        std::fs::write(&key, b"spindle-dds-perf-key-0123456789").map_err(|e| format!("key file: {e}"))?;
        common.extend([
            "--transport".into(),
            "tcp".into(),
            "--peers".into(),
            peers,
            "--key-file".into(),
            key.display().to_string(),
        ]);
    }
    let mut children = Vec::new();
    for (rank, role) in [(0usize, first), (1, second)] {
        let part = dir.join(format!("part{rank}.json"));
        let role_name = format!("{role:?}").to_lowercase();
        let mut command = match args.netns.get(rank) {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let child = command
            .args(["dds", "perf", &role_name, "--rank", &rank.to_string(), "--part-file"])
            .arg(&part)
            .args(&common)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("start the {role_name} process: {e}"))?;
        children.push((child, part, role_name));
    }
    let mut parts = Vec::new();
    let mut failures = Vec::new();
    for (mut child, part, role) in children {
        let status = child.wait().map_err(|e| format!("wait for {role}: {e}"))?;
        if !status.success() {
            failures.push(format!("{role} exited with {status}"));
            continue;
        }
        let bytes = std::fs::read(&part).map_err(|e| format!("{role}'s result: {e}"))?;
        parts.push(serde_json::from_slice::<Part>(&bytes).map_err(|e| format!("{role}'s result: {e}"))?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    let (writer, reader) = (&parts[0], &parts[1]);
    let measured = if args.latency { writer } else { reader };
    let span = reader.received_span_s.max(1e-9);
    let result = PerfResult {
        trigger: if args.latency {
            args.trigger.unwrap_or_default().name().into()
        } else {
            String::new()
        },
        size: args.size,
        reliable: !args.best_effort,
        napa: args.napa == OnOff::On && !args.best_effort,
        transport: if args.netns.is_empty() {
            format!("{:?}", args.transport).to_lowercase()
        } else {
            "tcp-netns".into()
        },
        test: if args.latency { "ping-pong" } else { "pub-sub" }.into(),
        rate: args.rate,
        ack_every: args.ack_every,
        window: args.window,
        latency_ns: measured.latency_ns,
        throughput_samples_per_s: if args.latency {
            writer.received as f64 / args.seconds
        } else {
            reader.received as f64 / span
        },
        throughput_mbps: if args.latency {
            (writer.received as f64 * args.size as f64 * 8.0) / args.seconds / 1e6
        } else {
            reader.received_bytes as f64 * 8.0 / span / 1e6
        },
        written: writer.written,
        received: measured.received,
        writes_blocked: writer.writes_blocked,
        trace: writer.trace.clone(),
        rtps: args.rtps,
        rtps_bridge: args.rtps_bridge,
        machine: Machine::detect(),
    };
    println!(
        "dds perf {} {} B, {}, napa {}: latency p50 {:.1} µs p99 {:.1} µs ({}), {:.0} samples/s, {:.1} Mb/s ({} written, {} received, {} writes blocked)",
        result.test,
        result.size,
        if result.reliable { "reliable" } else { "best-effort" },
        if result.napa { "on" } else { "off" },
        result.latency_ns.p50 as f64 / 1e3,
        result.latency_ns.p99 as f64 / 1e3,
        if args.latency { "round trip" } else { "one way" },
        result.throughput_samples_per_s,
        result.throughput_mbps,
        result.written,
        result.received,
        result.writes_blocked,
    );
    if let Some(path) = &args.json {
        let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(
            serde_json::to_string_pretty(&result)
                .expect("a result serializes")
                .as_bytes(),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        crate::plot::write_napa_plot(path, &result)?;
    }
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("spindle-dds-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn participant(args: &PerfArgs, rank: usize) -> Result<DomainParticipant, DdsError> {
    let mut builder = DomainParticipant::builder(args.domain)
        .participants(2)
        .rank(rank)
        .window_slots(args.window)
        .ack_every(args.ack_every)
        .max_sample_bytes(args.size + SAMPLE_OVERHEAD_BYTES_MAX)
        .join_timeout(Duration::from_secs(30))
        .idle(IdleStrategy::parse(&args.idle).map_err(|e| DdsError::Config(format!("--idle: {e}")))?);
    if args.rtps {
        let domain = u16::try_from(args.domain).ok().filter(|d| *d <= 232).ok_or_else(|| {
            DdsError::Config(format!(
                "--rtps: --domain {} is not an RTPS domain id (0..=232)",
                args.domain
            ))
        })?;
        builder = builder.rtps(RtpsConfig::new(domain).loopback_only(true));
    }
    if args.transport == PerfTransport::Tcp {
        let key_file = args
            .key_file
            .as_deref()
            .ok_or_else(|| DdsError::Config("--transport tcp needs --key-file".into()))?;
        let key = std::fs::read(key_file).map_err(|e| DdsError::Config(format!("{}: {e}", key_file.display())))?;
        if args.peers.len() != 2 {
            return Err(DdsError::Config(format!(
                "--peers needs both participants' addresses (2), got {}",
                args.peers.len()
            )));
        }
        builder = builder.transport(Transport::Tcp(TcpTransport::new(args.peers.clone(), key)));
    }
    builder.join()
}

/// With `--rtps-bridge`: bridge `topic` out to RTPS (its writer's
/// participant does). The bridge's Spindle reader joins the topic only
/// while an RTPS reader is matched, so with none (as here) the writer
/// waits for the one Spindle reader as without the bridge.
/// Returns the bridge (kept for the role's life) and the readers to wait
/// for.
fn bridge_out(
    p: &DomainParticipant,
    topic: &Topic<PerfSample>,
    args: &PerfArgs,
) -> Result<(Option<RtpsBridge<PerfSample>>, usize), DdsError> {
    if !args.rtps_bridge {
        return Ok((None, 1));
    }
    let bridge = p.bridge_rtps_one_way(
        topic,
        writer_qos(args),
        reader_qos(args, p.window_slots()),
        BridgeDirection::ToRtps,
    )?;
    Ok((Some(bridge), 1))
}

fn writer_qos(args: &PerfArgs) -> WriterQos {
    let qos = WriterQos::default()
        .keep_all()
        .max_sample_bytes((args.size + SAMPLE_OVERHEAD_BYTES_MAX) as u32);
    if args.best_effort {
        qos.best_effort()
    } else {
        qos.reliable(Duration::from_secs(10))
    }
}

fn reader_qos(args: &PerfArgs, window_slots: usize) -> ReaderQos {
    // Room for the back-pressure rule (participants × window) and more.
    let samples = (4 * window_slots as u32).max(4096);
    let qos = ReaderQos::default().keep_all().resource_limits(ResourceLimits {
        max_samples: samples,
        max_instances: 16,
        max_samples_per_instance: samples,
    });
    if args.best_effort {
        qos.best_effort()
    } else {
        qos.reliable(Duration::from_secs(10))
    }
}

fn napa(args: &PerfArgs) -> Option<NapaConfig> {
    (args.napa == OnOff::On).then(NapaConfig::default)
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(100, 60_000_000_000, 3).expect("valid histogram bounds")
}

fn filler(size: usize) -> PerfSample {
    PerfSample {
        seq: 0,
        payload: vec![0x5a; size.saturating_sub(10)],
    }
}

/// pub at a saturating load reads the clock once per this many samples.
const PUB_CLOCK_READ_EVERY: u64 = 16;

/// How long a role waits for its peer to show up.
const MATCH_WAIT: Duration = Duration::from_secs(30);

fn run_role(role: Role, args: &PerfArgs) -> Result<Part, DdsError> {
    let rank = args.rank.unwrap_or(match role {
        Role::Pub | Role::Ping => 0,
        _ => 1,
    });
    let p = participant(args, rank)?;
    let run_for = Duration::from_secs_f64(args.seconds);
    let mut part = Part::default();
    match role {
        Role::Pub => {
            let topic = p.create_topic::<PerfSample>("perf/data")?;
            let (_bridge, readers) = bridge_out(&p, &topic, args)?;
            let writer = p.create_writer_with_napa(&topic, writer_qos(args), napa(args))?;
            writer.wait_for_readers(readers, MATCH_WAIT)?;
            let mut sample = filler(args.size);
            let started = Instant::now();
            let mut next_trace = Duration::ZERO;
            let period = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
            let mut elapsed = Duration::ZERO;
            loop {
                // At a saturating load the clock is read once per
                // PUB_CLOCK_READ_EVERY samples (a read is ~30 ns here, a
                // tenth of a small sample's write); at a rate, every time.
                if period.is_some() || sample.seq.is_multiple_of(PUB_CLOCK_READ_EVERY) {
                    elapsed = started.elapsed();
                    if elapsed >= run_for {
                        break;
                    }
                }
                if let Some(period) = period {
                    let due = period * (sample.seq as u32);
                    if let Some(wait) = due.checked_sub(elapsed) {
                        std::thread::sleep(wait);
                    }
                }
                sample.seq += 1;
                writer.write(&sample)?;
                if elapsed >= next_trace {
                    next_trace += Duration::from_millis(10);
                    let (gap_ns, high_threshold, rtt_ns) = writer
                        .status()
                        .napa
                        .map_or((0, 0, 0), |n: NapaTrace| (n.gap_ns, n.high_threshold, n.rtt_ns));
                    part.trace.push(TracePoint {
                        t_s: elapsed.as_secs_f64(),
                        occupancy: writer.window_occupancy(),
                        gap_ns,
                        high_threshold,
                        rtt_ns,
                    });
                }
            }
            writer.wait_for_acknowledgments(Duration::from_secs(30))?;
            let status = writer.status();
            part.written = status.samples_written;
            part.writes_blocked = status.writes_blocked;
            // Let the subscriber see every sample before the writer goes.
            std::thread::sleep(Duration::from_millis(200));
        }
        Role::Sub => {
            let topic = p.create_topic::<PerfSample>("perf/data")?;
            let reader = p.create_reader(&topic, reader_qos(args, p.window_slots()))?;
            reader.wait_for_writers(1, MATCH_WAIT)?;
            let mut h = histogram();
            let (mut first, mut last) = (None, Instant::now());
            let deadline = Instant::now() + run_for + Duration::from_secs(40);
            // Until the writer leaves (its participant closes) or the
            // deadline: the writer's last samples are acknowledged first.
            while Instant::now() < deadline {
                let taken = reader.take_raw(256, |info, bytes| {
                    if info.valid_data {
                        let _ = h.record(
                            info.reception_timestamp_ns
                                .saturating_sub(info.source_timestamp_ns)
                                .max(1),
                        );
                        part.received += 1;
                        part.received_bytes += bytes.len() as u64;
                    }
                });
                if taken > 0 {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = now;
                } else if reader.status().matched_writers == 0 && part.received > 0 {
                    break;
                } else {
                    // Latency is stamped on reception (the progress
                    // thread), so this thread only drains the history: a
                    // short sleep, not a wake-up per sample.
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            part.received_span_s = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
            part.latency_ns = Percentiles::from_histogram(&h);
        }
        Role::Ping => match args.trigger.unwrap_or_default() {
            Trigger::Waitset => ping_waitset(&p, args, run_for, &mut part)?,
            Trigger::Listener => ping_listener(&p, args, run_for, &mut part)?,
        },
        Role::Pong => match args.trigger.unwrap_or_default() {
            Trigger::Waitset => pong_waitset(&p, args, run_for, &mut part)?,
            Trigger::Listener => pong_listener(&p, args, run_for, &mut part)?,
        },
        Role::Pair => unreachable!("pair runs two roles"),
    }
    p.close()?;
    Ok(part)
}

/// Read a perf result written by `--json`.
pub fn read_result(path: &Path) -> Result<PerfResult, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// ping, woken on the application thread (`--trigger waitset`): write one
/// sample, wait for its echo in `wait_for_data`, record the round trip.
fn ping_waitset(p: &DomainParticipant, args: &PerfArgs, run_for: Duration, part: &mut Part) -> Result<(), DdsError> {
    let ping = p.create_topic::<PerfSample>("perf/ping")?;
    let pong = p.create_topic::<PerfSample>("perf/pong")?;
    let (_bridge, readers) = bridge_out(p, &ping, args)?;
    let writer = p.create_writer_with_napa(&ping, writer_qos(args), napa(args))?;
    let reader = p.create_reader(&pong, reader_qos(args, p.window_slots()))?;
    writer.wait_for_readers(readers, MATCH_WAIT)?;
    reader.wait_for_writers(1, MATCH_WAIT)?;
    let mut h = histogram();
    let mut sample = filler(args.size);
    let started = Instant::now();
    let period = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
    while started.elapsed() < run_for {
        sample.seq += 1;
        let sent = Instant::now();
        writer.write(&sample)?;
        let mut echoed = false;
        let wait_until = Instant::now() + Duration::from_secs(5);
        while !echoed {
            reader.take_raw(16, |info, _| echoed |= info.valid_data);
            if !echoed {
                if Instant::now() > wait_until {
                    return Err(DdsError::Timeout {
                        waiting_for: format!("the echo of ping {}", sample.seq),
                        waited_ms: 5000,
                    });
                }
                reader.wait_for_data(Duration::from_millis(1));
            }
        }
        let _ = h.record((sent.elapsed().as_nanos() as u64).max(1));
        part.received += 1;
        if let Some(period) = period {
            if let Some(wait) = period.checked_sub(sent.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    part.written = writer.status().samples_written;
    part.latency_ns = Percentiles::from_histogram(&h);
    Ok(())
}

/// pong, woken on the application thread (`--trigger waitset`).
fn pong_waitset(p: &DomainParticipant, args: &PerfArgs, run_for: Duration, part: &mut Part) -> Result<(), DdsError> {
    let ping = p.create_topic::<PerfSample>("perf/ping")?;
    let pong = p.create_topic::<PerfSample>("perf/pong")?;
    let reader = p.create_reader(&ping, reader_qos(args, p.window_slots()))?;
    let (_bridge, _readers) = bridge_out(p, &pong, args)?;
    let writer = p.create_writer_with_napa(&pong, writer_qos(args), napa(args))?;
    reader.wait_for_writers(1, MATCH_WAIT)?;
    let deadline = Instant::now() + run_for + Duration::from_secs(40);
    let mut echo = filler(args.size);
    while Instant::now() < deadline {
        let mut got = None;
        reader.take_raw(16, |info, bytes| {
            if info.valid_data {
                got = Some(bytes.len());
            }
        });
        match got {
            Some(_) => {
                echo.seq += 1;
                writer.write(&echo)?;
                part.received += 1;
            }
            None if reader.status().matched_writers == 0 && part.received > 0 => break,
            None => {
                reader.wait_for_data(Duration::from_millis(1));
            }
        }
    }
    part.written = writer.status().samples_written;
    Ok(())
}

/// How long ping waits for an echo before it gives up.
const ECHO_WAIT: Duration = Duration::from_secs(5);

/// Clears a reader's listener when dropped: the listener holds the reader
/// (and a writer), so it must go before they can, on every path out.
struct ListenerReset<'r>(&'r spindle::dds::DataReader<PerfSample>);

impl Drop for ListenerReset<'_> {
    fn drop(&mut self) {
        self.0.on_data_available(|| {});
    }
}

/// What ping's listener shares with its application thread.
struct PingState {
    h: hdrhistogram::Histogram<u64>,
    /// Pings written (the last one's sequence number).
    written: u64,
    /// Echoes received.
    echoed: u64,
    /// Echoes that came with no ping waiting for one (pong answered a
    /// ping twice): an error at the end.
    stray: u64,
    /// When the last ping was written.
    sent: Instant,
    /// The run is over (time is up, or a write failed).
    done: bool,
    error: Option<DdsError>,
}

/// ping, answered in the pong reader's listener (`--trigger listener`,
/// ddsperf's default): the listener records the round trip and, at a
/// saturating load, writes the next ping right there, on the progress
/// thread, without waking this thread. With `--rate` this thread writes
/// each ping at its time and the listener records the echo.
fn ping_listener(p: &DomainParticipant, args: &PerfArgs, run_for: Duration, part: &mut Part) -> Result<(), DdsError> {
    let ping = p.create_topic::<PerfSample>("perf/ping")?;
    let pong = p.create_topic::<PerfSample>("perf/pong")?;
    let (_bridge, readers) = bridge_out(p, &ping, args)?;
    let writer = Arc::new(p.create_writer_with_napa(&ping, writer_qos(args), napa(args))?);
    let reader = Arc::new(p.create_reader(&pong, reader_qos(args, p.window_slots()))?);
    writer.wait_for_readers(readers, MATCH_WAIT)?;
    reader.wait_for_writers(1, MATCH_WAIT)?;
    let shared = Arc::new((
        Mutex::new(PingState {
            h: histogram(),
            written: 0,
            echoed: 0,
            stray: 0,
            sent: Instant::now(),
            done: false,
            error: None,
        }),
        Condvar::new(),
    ));
    let chained = args.rate == 0;
    let started = Instant::now();
    {
        let (writer, listened, shared) = (writer.clone(), reader.clone(), shared.clone());
        let mut sample = filler(args.size);
        reader.on_data_available(move || {
            let mut echoes = 0u64;
            listened.take_raw(16, |info, _| echoes += info.valid_data as u64);
            if echoes == 0 {
                return;
            }
            let (lock, changed) = &*shared;
            let mut st = lock.lock().expect("ping state lock");
            // One ping in flight: one echo per ping, the rest are strays.
            let expected = (st.written - st.echoed).min(echoes);
            st.stray += echoes - expected;
            if st.done || expected == 0 {
                return;
            }
            let rtt_ns = (st.sent.elapsed().as_nanos() as u64).max(1);
            let _ = st.h.record(rtt_ns);
            st.echoed += 1;
            if !chained {
                // The application thread waits for this echo to write the
                // next ping at its time.
                changed.notify_all();
            } else if started.elapsed() < run_for {
                st.written += 1;
                sample.seq = st.written;
                st.sent = Instant::now();
                // One ping in flight: the window has room, so this write
                // does not wait (it would wait on this very thread).
                if let Err(e) = writer.write(&sample) {
                    st.error = Some(e);
                    st.done = true;
                    changed.notify_all();
                }
            } else {
                st.done = true;
                changed.notify_all();
            }
        });
    }
    let _reset = ListenerReset(&reader);
    let (lock, changed) = &*shared;
    let mut sample = filler(args.size);
    let period = (!chained).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
    loop {
        let mut st = lock.lock().expect("ping state lock");
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        if st.done || (!chained && started.elapsed() >= run_for && st.echoed == st.written) {
            break;
        }
        if st.echoed == st.written && (chained || st.written == 0 || period.is_some_and(|p| st.sent.elapsed() >= p)) {
            // The first ping (or, with --rate, the next one at its time).
            st.written += 1;
            sample.seq = st.written;
            st.sent = Instant::now();
            drop(st);
            writer.write(&sample)?;
            continue;
        }
        if st.echoed < st.written && st.sent.elapsed() > ECHO_WAIT {
            return Err(DdsError::Timeout {
                waiting_for: format!("the echo of ping {}", st.written),
                waited_ms: ECHO_WAIT.as_millis() as u64,
            });
        }
        // Chained, the listener notifies only at the end (no wake-up per
        // round trip): look at the echo timeout every 10 ms meanwhile.
        let wait = match period {
            Some(p) if st.echoed == st.written => p.saturating_sub(st.sent.elapsed()),
            _ => Duration::from_millis(10),
        };
        drop(
            changed
                .wait_timeout(st, wait.max(Duration::from_micros(1)))
                .expect("ping state lock"),
        );
    }
    let st = lock.lock().expect("ping state lock");
    if st.stray > 0 {
        return Err(DdsError::Config(format!(
            "{} echoes came with no ping waiting for one (pong answered a ping more than once)",
            st.stray
        )));
    }
    part.received = st.echoed;
    part.written = writer.status().samples_written;
    part.latency_ns = Percentiles::from_histogram(&st.h);
    Ok(())
}

/// pong, answered in the ping reader's listener (`--trigger listener`):
/// each ping is echoed on the progress thread that delivers it.
fn pong_listener(p: &DomainParticipant, args: &PerfArgs, run_for: Duration, part: &mut Part) -> Result<(), DdsError> {
    let ping = p.create_topic::<PerfSample>("perf/ping")?;
    let pong = p.create_topic::<PerfSample>("perf/pong")?;
    let reader = Arc::new(p.create_reader(&ping, reader_qos(args, p.window_slots()))?);
    let (_bridge, _readers) = bridge_out(p, &pong, args)?;
    let writer = Arc::new(p.create_writer_with_napa(&pong, writer_qos(args), napa(args))?);
    let echoed = Arc::new(AtomicU64::new(0));
    let failure: Arc<Mutex<Option<DdsError>>> = Arc::new(Mutex::new(None));
    // Take every ping there is and echo each: from the listener, and from
    // this thread now and then (a ping delivered before the listener was
    // set would wait for nobody otherwise). Writes of one writer are
    // serialized, so the two never interleave an echo.
    let echo_all = {
        let (writer, reader, echoed, failure) = (writer.clone(), reader.clone(), echoed.clone(), failure.clone());
        let echo = Mutex::new(filler(args.size));
        move || {
            let mut pings = 0u64;
            reader.take_raw(16, |info, _| pings += info.valid_data as u64);
            if pings == 0 {
                return;
            }
            let mut echo = echo.lock().expect("echo lock");
            for _ in 0..pings {
                echo.seq += 1;
                // One ping in flight: the window has room (no wait on the
                // progress thread).
                if let Err(e) = writer.write(&*echo) {
                    failure.lock().expect("failure lock").get_or_insert(e);
                    return;
                }
                echoed.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let echo_all = Arc::new(echo_all);
    {
        let echo_all = echo_all.clone();
        reader.on_data_available(move || echo_all());
    }
    let _reset = ListenerReset(&reader);
    reader.wait_for_writers(1, MATCH_WAIT)?;
    let deadline = Instant::now() + run_for + Duration::from_secs(40);
    loop {
        if let Some(e) = failure.lock().expect("failure lock").take() {
            return Err(e);
        }
        if Instant::now() >= deadline || (reader.status().matched_writers == 0 && echoed.load(Ordering::Relaxed) > 0) {
            break;
        }
        echo_all();
        std::thread::sleep(Duration::from_millis(10));
    }
    part.received = echoed.load(Ordering::Relaxed);
    part.written = writer.status().samples_written;
    Ok(())
}
