//! `spindle dds pub` / `spindle dds sub`: a writer or a reader of one
//! topic, scriptable, that with `--rtps` meets other DDS implementations
//! over RTPS (Cyclone DDS `ddsperf`, the `cyclonedds` Python package).
//!
//! ```text
//! spindle dds sub --rtps --topic DDSPerfRDataKS --type KeyedSeq --seconds 10 --json sub.json
//! spindle dds pub --rtps --topic DDSPerfRDataKS --type KeyedSeq --size 16 --rate 1000 --seconds 5
//! ```
//!
//! The type is Cyclone `ddsperf`'s `KeyedSeq` (`seq: uint32`, `keyval:
//! uint32` (key), `baggage: sequence<octet>`); `--size` counts its whole
//! serialized value as `ddsperf` does (12 bytes of fixed part, then the
//! baggage). The RTPS domain is `--domain` (default: `$ROS_DOMAIN_ID`,
//! else 0); `--loopback-only` (or `SPINDLE_RTPS_LOOPBACK=1`) keeps RTPS on
//! 127.0.0.1 — the Cyclone side then needs
//! `CYCLONEDDS_URI` = [`spindle::dds::rtps::CYCLONE_LOOPBACK_URI`]
//! (printed by `spindle dds sub --print-cyclone-uri`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;
use spindle::dds::rtps::{BridgeCounts, BridgeDirection, KeyedSeq, RtpsConfig, CYCLONE_LOOPBACK_URI};
use spindle::dds::{DomainParticipant, ReaderQos, ResourceLimits, WriterQos, WINDOW_SLOTS_MAX, WINDOW_SLOTS_MIN};

use crate::report::Machine;

/// The types `dds pub` / `dds sub` know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
pub enum SampleType {
    /// Cyclone ddsperf's `KeyedSeq` (`-T KS`).
    #[value(name = "KeyedSeq")]
    KeyedSeq,
}

/// What `dds pub` and `dds sub` share.
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// Speak RTPS too (meet Cyclone DDS, Fast DDS, Connext, ROS 2).
    #[arg(long)]
    pub rtps: bool,
    /// The topic name (ddsperf's reliable keyed topic by default).
    #[arg(long, default_value = "DDSPerfRDataKS")]
    pub topic: String,
    /// The sample type.
    #[arg(long = "type", value_enum, default_value_t = SampleType::KeyedSeq)]
    pub sample_type: SampleType,
    /// The RTPS domain id (default: `$ROS_DOMAIN_ID`, else 0).
    #[arg(long)]
    pub domain: Option<u16>,
    /// Keep RTPS on 127.0.0.1 (also `SPINDLE_RTPS_LOOPBACK=1`).
    #[arg(long)]
    pub loopback_only: bool,
    /// The Spindle domain (the group of Spindle participants; default: one
    /// of this process alone).
    #[arg(long)]
    pub spindle_domain: Option<u32>,
    /// Best effort instead of reliable.
    #[arg(long)]
    pub best_effort: bool,
    /// Transient-local durability (a late reader gets the history).
    #[arg(long)]
    pub transient_local: bool,
    /// Keep the last N samples per key (0: keep all).
    #[arg(long, default_value_t = 0)]
    pub keep_last: u32,
    /// How long to run (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// How long to wait for the first RTPS match (seconds).
    #[arg(long, default_value_t = 20.0)]
    pub match_wait_s: f64,
    /// Print the CYCLONEDDS_URI that keeps Cyclone on loopback, and exit.
    #[arg(long)]
    pub print_cyclone_uri: bool,
    /// Send-window slots of the Spindle participant (a power of two,
    /// 16..=1024). Default: `dds pub` as many as fit in 8 MiB of its
    /// slots (sized for `--size`); `dds sub` 1024: its
    /// slots are sized for the largest sample it may get (64 KiB), and
    /// every sample its bridge takes in from RTPS goes through that window.
    #[arg(long = "window")]
    pub window_slots: Option<usize>,
}

/// `spindle dds sub` arguments.
#[derive(Args, Debug, Clone)]
pub struct SubArgs {
    #[command(flatten)]
    pub common: EndpointArgs,
    /// Stop after this many samples (0: run `--seconds`).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Write the result (samples, in_order, …) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `spindle dds pub` arguments.
#[derive(Args, Debug, Clone)]
pub struct PubArgs {
    #[command(flatten)]
    pub common: EndpointArgs,
    /// Serialized sample size in bytes, as ddsperf counts it (the 12-byte
    /// fixed part included; at least 12).
    #[arg(long, default_value_t = 16)]
    pub size: usize,
    /// Samples per second (0: as fast as the readers take them).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Stop after this many samples (0: run `--seconds`).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Key values to cycle through (ddsperf `-n`).
    #[arg(long, default_value_t = 1)]
    pub keys: u32,
    /// RTPS readers to wait for before writing (with `--rtps`; 0: write
    /// at once, for readers that join later: see `--linger-s`).
    #[arg(long, default_value_t = 1)]
    pub readers: u64,
    /// After the last write (and its acknowledgements), keep the writer
    /// and its bridge up this many seconds: a late-joining reader of a
    /// `--transient-local` topic gets the history meanwhile (0..=3600).
    #[arg(long, default_value_t = 0.0)]
    pub linger_s: f64,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What `dds sub` measured.
#[derive(Serialize, Debug, Default)]
pub struct SubResult {
    /// Samples taken.
    pub samples: u64,
    /// Whether every key's `seq` increased by one each time.
    pub in_order: bool,
    /// Keys seen.
    pub keys: usize,
    /// Samples whose `seq` was not the key's previous one plus one (the
    /// first few: key, previous, got).
    pub out_of_order: Vec<(u32, u32, u32)>,
    /// Payload bytes (the serialized size as ddsperf counts it).
    pub bytes: u64,
    /// From the first sample to the last (s).
    pub seconds: f64,
    /// Samples per second over `seconds`.
    pub samples_per_s: f64,
    /// The bridge's counters (with `--rtps`).
    pub bridge: Option<Counts>,
    /// The machine.
    pub machine: Machine,
}

/// What `dds pub` did.
#[derive(Serialize, Debug, Default)]
pub struct PubResult {
    /// Samples written.
    pub samples: u64,
    /// Serialized size (ddsperf's count).
    pub size: usize,
    /// From the first write to the last acknowledgment (s).
    pub seconds: f64,
    /// Samples per second over `seconds`.
    pub samples_per_s: f64,
    /// Whether every matched reliable RTPS reader acknowledged everything.
    pub acked: bool,
    /// The bridge's counters (with `--rtps`).
    pub bridge: Option<Counts>,
    /// The machine.
    pub machine: Machine,
}

/// [`BridgeCounts`], serializable.
#[derive(Serialize, Debug, Default)]
pub struct Counts {
    /// Samples of Spindle writers written to RTPS.
    pub to_rtps: u64,
    /// Samples of RTPS writers written into the group.
    pub from_rtps: u64,
    /// RTPS samples dropped as undecodable.
    pub rtps_dropped: u64,
    /// Own RTPS samples skipped.
    pub own_skipped: u64,
    /// Failed RTPS writes.
    pub rtps_write_errors: u64,
    /// Times the bridge's Spindle reader joined the topic (when the RTPS
    /// readers matched went from none to some).
    pub group_reader_starts: u64,
    /// Waits for the RTPS readers' acknowledgments (one per MiB out).
    pub rtps_window_waits: u64,
    /// Those waits that timed out.
    pub rtps_window_timeouts: u64,
    /// Samples of RTPS writers the bridge never took (gaps in their
    /// sequence numbers: lost in rustdds's reader cache).
    pub rtps_samples_lost: u64,
    /// RTPS datagrams this process dropped as malformed (rustdds could
    /// not parse them; `null` when another `log` logger was installed).
    pub malformed_datagrams: Option<u64>,
}

impl From<BridgeCounts> for Counts {
    fn from(c: BridgeCounts) -> Counts {
        Counts {
            to_rtps: c.to_rtps,
            from_rtps: c.from_rtps,
            rtps_dropped: c.rtps_dropped,
            own_skipped: c.own_skipped,
            rtps_write_errors: c.rtps_write_errors,
            group_reader_starts: c.group_reader_starts,
            rtps_window_waits: c.rtps_window_waits,
            rtps_window_timeouts: c.rtps_window_timeouts,
            rtps_samples_lost: c.rtps_samples_lost,
            malformed_datagrams: spindle::dds::rtps::malformed_datagrams(),
        }
    }
}

/// The fixed part of a `KeyedSeq` as ddsperf counts it (seq, keyval, the
/// baggage's length).
pub const KEYED_SEQ_FIXED_BYTES: usize = 12;
/// The largest `--size`.
pub const SIZE_MAX_BYTES: usize = 1 << 20;
/// Room for the group's serialization around the baggage.
const SLOT_OVERHEAD_BYTES: usize = 64;
/// The default slot size of `dds sub` (a 64 KiB ddsperf sample fits).
const SUB_SAMPLE_BYTES_MAX: usize = (64 << 10) + 4096;
/// `dds sub`'s send window: the widest. With slots of
/// [`SUB_SAMPLE_BYTES_MAX`], the participant's default (what fits in 8
/// MiB) is 64 slots, and the bridge's writes into the group waited on
/// that window: unpaced `ddsperf pub` into `dds sub --rtps`
/// (2026-12-03, `bench/peers/cyclone-rtps-compare.sh`, two alternated
/// pairs) took 59.6-82.5 k samples/s of 16 B with 64 slots, 102-141 k
/// with 1024; 1 KiB 79-85 k → 186-199 k; 64 KiB unchanged. The cost is
/// the ring: 1024 slots of 68 KiB, and `dds sub`'s resident memory went
/// from 31 MB to 101 MB.
const SUB_WINDOW_SLOTS: usize = WINDOW_SLOTS_MAX;

fn rtps_config(c: &EndpointArgs) -> Result<RtpsConfig, String> {
    let domain = match c.domain {
        Some(d) => d,
        None => match std::env::var("ROS_DOMAIN_ID") {
            Ok(v) if !v.is_empty() => v
                .parse()
                .map_err(|_| format!("ROS_DOMAIN_ID={v:?} is not a domain id (0..=232)"))?,
            _ => 0,
        },
    };
    let loopback = c.loopback_only || std::env::var("SPINDLE_RTPS_LOOPBACK").is_ok_and(|v| v == "1");
    Ok(RtpsConfig::new(domain).loopback_only(loopback))
}

/// The participant of `dds pub` or `dds sub`: `window_slots` is the
/// command's own default, which `--window` overrides.
fn participant(
    c: &EndpointArgs,
    max_sample_bytes: usize,
    window_slots: Option<usize>,
) -> Result<DomainParticipant, String> {
    // A domain of this process alone unless told otherwise: two runs on
    // one host must not meet in one shm group by accident.
    let spindle_domain = c.spindle_domain.unwrap_or(0x4000_0000 | std::process::id());
    let mut builder = DomainParticipant::builder(spindle_domain)
        .participants(1)
        .max_sample_bytes(max_sample_bytes);
    if let Some(slots) = c.window_slots.or(window_slots) {
        if !(WINDOW_SLOTS_MIN..=WINDOW_SLOTS_MAX).contains(&slots) || !slots.is_power_of_two() {
            return Err(format!(
                "--window {slots}: expected a power of two in {WINDOW_SLOTS_MIN}..={WINDOW_SLOTS_MAX}"
            ));
        }
        builder = builder.window_slots(slots);
    }
    if c.rtps {
        builder = builder.rtps(rtps_config(c)?);
    }
    builder.join().map_err(|e| e.to_string())
}

/// History, reliability and durability from the flags: the same calls on
/// a `WriterQos` or a `ReaderQos`.
macro_rules! with_flags {
    ($qos:expr, $c:expr) => {{
        let c: &EndpointArgs = $c;
        let qos = $qos;
        let qos = if c.keep_last > 0 {
            qos.keep_last(c.keep_last)
        } else {
            qos.keep_all()
        };
        let qos = if c.best_effort {
            qos.best_effort()
        } else {
            qos.reliable(Duration::from_secs(10))
        };
        if c.transient_local {
            qos.transient_local()
        } else {
            qos
        }
    }};
}

fn writer_qos(c: &EndpointArgs, max_sample_bytes: usize) -> WriterQos {
    with_flags!(WriterQos::default().max_sample_bytes(max_sample_bytes as u32), c)
}

fn reader_qos(c: &EndpointArgs, window_slots: usize) -> ReaderQos {
    let samples = (4 * window_slots as u32).max(1 << 16);
    with_flags!(
        ReaderQos::default().resource_limits(ResourceLimits {
            max_samples: samples,
            max_instances: 1 << 12,
            max_samples_per_instance: samples,
        }),
        c
    )
}

fn write_json<T: Serialize>(path: &Option<PathBuf>, value: &T) -> Result<(), String> {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Per-key order check: every key's `seq` one more than its last.
#[derive(Default)]
struct OrderCheck {
    last: HashMap<u32, u32>,
    out_of_order: Vec<(u32, u32, u32)>,
    broken: u64,
}

/// Out-of-order samples listed in the result at most.
const OUT_OF_ORDER_LISTED_MAX: usize = 16;
/// How long `dds pub` waits at the end for its samples to be acknowledged
/// in the group, and then by the RTPS readers.
const FLUSH_WAIT: Duration = Duration::from_secs(30);

impl OrderCheck {
    fn see(&mut self, key: u32, seq: u32) {
        if let Some(prev) = self.last.insert(key, seq) {
            if seq != prev.wrapping_add(1) {
                self.broken += 1;
                if self.out_of_order.len() < OUT_OF_ORDER_LISTED_MAX {
                    self.out_of_order.push((key, prev, seq));
                }
            }
        }
    }
}

/// `spindle dds sub`.
pub fn sub(args: SubArgs) -> Result<(), String> {
    let c = &args.common;
    if c.print_cyclone_uri {
        println!("{CYCLONE_LOOPBACK_URI}");
        return Ok(());
    }
    let p = participant(c, SUB_SAMPLE_BYTES_MAX, Some(SUB_WINDOW_SLOTS))?;
    let topic = p.create_topic::<KeyedSeq>(&c.topic).map_err(|e| e.to_string())?;
    let reader = p
        .create_reader(&topic, reader_qos(c, p.window_slots()))
        .map_err(|e| e.to_string())?;
    let bridge = if c.rtps {
        let b = p
            .bridge_rtps_one_way(
                &topic,
                writer_qos(c, SUB_SAMPLE_BYTES_MAX),
                reader_qos(c, p.window_slots()),
                BridgeDirection::FromRtps,
            )
            .map_err(|e| e.to_string())?;
        println!(
            "spindle dds sub: topic {:?} bridged to RTPS; waiting for a writer",
            c.topic
        );
        b.wait_for_rtps_writers(1, Duration::from_secs_f64(c.match_wait_s))
            .map_err(|e| e.to_string())?;
        println!("spindle dds sub: matched an RTPS writer");
        Some(b)
    } else {
        None
    };
    let run_for = Duration::from_secs_f64(c.seconds);
    let started = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut samples = 0u64;
    let mut bytes = 0u64;
    let mut order = OrderCheck::default();
    while started.elapsed() < run_for && (args.count == 0 || samples < args.count) {
        if let Some(why) = bridge.as_ref().and_then(|b| b.failure()) {
            return Err(why);
        }
        reader.wait_for_data(Duration::from_millis(20));
        for s in reader.take(1024).map_err(|e| e.to_string())? {
            let Some(v) = s.data else { continue };
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            samples += 1;
            bytes += (KEYED_SEQ_FIXED_BYTES + v.baggage.len()) as u64;
            order.see(v.keyval, v.seq);
        }
    }
    let seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    let result = SubResult {
        samples,
        in_order: order.broken == 0,
        keys: order.last.len(),
        out_of_order: order.out_of_order,
        bytes,
        seconds,
        samples_per_s: if seconds > 0.0 { samples as f64 / seconds } else { 0.0 },
        bridge: bridge.as_ref().map(|b| b.counts().into()),
        machine: Machine::detect(),
    };
    println!(
        "spindle dds sub: {} samples, {} keys, in order: {}, {:.0} samples/s over {:.3} s",
        result.samples, result.keys, result.in_order, result.samples_per_s, result.seconds
    );
    if let Some(lost) = result.bridge.as_ref().map(|c| c.rtps_samples_lost).filter(|n| *n > 0) {
        println!(
            "spindle dds sub: {lost} samples of the RTPS writers were lost before the bridge took them \
             (rustdds's reader cache; see docs/dds.md, \"Known limits\")"
        );
    }
    write_json(&args.json, &result)
}

/// `spindle dds pub`.
pub fn publish(args: PubArgs) -> Result<(), String> {
    let c = &args.common;
    if c.print_cyclone_uri {
        println!("{CYCLONE_LOOPBACK_URI}");
        return Ok(());
    }
    if !(KEYED_SEQ_FIXED_BYTES..=SIZE_MAX_BYTES).contains(&args.size) {
        return Err(format!(
            "--size {} must be in {KEYED_SEQ_FIXED_BYTES}..={SIZE_MAX_BYTES} (the KeyedSeq's fixed part is {KEYED_SEQ_FIXED_BYTES} bytes)",
            args.size
        ));
    }
    if args.keys == 0 {
        return Err("--keys must be at least 1".into());
    }
    if !(0.0..=3600.0).contains(&args.linger_s) {
        return Err(format!("--linger-s {}: expected 0..=3600 seconds", args.linger_s));
    }
    let max_sample_bytes = args.size + SLOT_OVERHEAD_BYTES;
    let p = participant(c, max_sample_bytes, None)?;
    let topic = p.create_topic::<KeyedSeq>(&c.topic).map_err(|e| e.to_string())?;
    let bridge = if c.rtps {
        let b = p
            .bridge_rtps_one_way(
                &topic,
                writer_qos(c, max_sample_bytes),
                reader_qos(c, p.window_slots()),
                BridgeDirection::ToRtps,
            )
            .map_err(|e| e.to_string())?;
        if args.readers > 0 {
            println!(
                "spindle dds pub: topic {:?} bridged to RTPS; waiting for {} reader(s)",
                c.topic, args.readers
            );
            b.wait_for_rtps_readers(args.readers, Duration::from_secs_f64(c.match_wait_s))
                .map_err(|e| e.to_string())?;
        }
        Some(b)
    } else {
        None
    };
    let writer = p
        .create_writer(&topic, writer_qos(c, max_sample_bytes))
        .map_err(|e| e.to_string())?;
    let mut value = KeyedSeq {
        seq: 0,
        keyval: 0,
        baggage: vec![0xa5; args.size - KEYED_SEQ_FIXED_BYTES],
    };
    let mut seqs = vec![0u32; args.keys as usize];
    let run_for = Duration::from_secs_f64(c.seconds);
    let started = Instant::now();
    let mut written = 0u64;
    while started.elapsed() < run_for && (args.count == 0 || written < args.count) {
        if let Some(why) = bridge.as_ref().and_then(|b| b.failure()) {
            return Err(why);
        }
        if args.rate > 0 {
            let due = started + Duration::from_secs_f64(written as f64 / args.rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let key = (written % args.keys as u64) as usize;
        value.keyval = key as u32;
        value.seq = seqs[key];
        seqs[key] = seqs[key].wrapping_add(1);
        writer.write(&value).map_err(|e| e.to_string())?;
        written += 1;
    }
    let acked = match &bridge {
        Some(b) => {
            // What was written has reached the bridge's Spindle reader
            // (if an RTPS reader is matched) once every participant
            // acknowledged it; then the bridge moves it out.
            writer.wait_for_acknowledgments(FLUSH_WAIT).map_err(|e| e.to_string())?;
            b.flush(FLUSH_WAIT).map_err(|e| e.to_string())?
        }
        None => true,
    };
    let seconds = started.elapsed().as_secs_f64();
    if args.linger_s > 0.0 {
        println!(
            "spindle dds pub: {written} samples written; serving late readers for {} s",
            args.linger_s
        );
        // Bounded: the bridge thread serves readers that match meanwhile.
        let until = Instant::now() + Duration::from_secs_f64(args.linger_s);
        while Instant::now() < until {
            if let Some(why) = bridge.as_ref().and_then(|b| b.failure()) {
                return Err(why);
            }
            std::thread::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now())));
        }
    }
    let result = PubResult {
        samples: written,
        size: args.size,
        seconds,
        samples_per_s: written as f64 / seconds.max(1e-9),
        acked,
        bridge: bridge.as_ref().map(|b| b.counts().into()),
        machine: Machine::detect(),
    };
    println!(
        "spindle dds pub: {} samples of {} B, {:.0} samples/s, acknowledged by every RTPS reader: {}",
        result.samples, result.size, result.samples_per_s, result.acked
    );
    write_json(&args.json, &result)
}
