//! The RTPS gateway: a participant that also speaks DDSI-RTPS (UDP, CDR),
//! so that Spindle's DDS exchanges samples with other DDS implementations
//! (Cyclone DDS, Fast DDS, RTI Connext, OpenDDS, ROS 2 nodes).
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use spindle::dds::rtps::RtpsConfig;
//! use spindle::dds::{DomainParticipant, Keyed, ReaderQos, WriterQos};
//! use std::time::Duration;
//!
//! #[derive(Serialize, Deserialize, Clone, Debug)]
//! struct Reading { sensor: u32, celsius: f64 }
//! impl Keyed for Reading {
//!     type Key = u32;
//!     fn key(&self) -> u32 { self.sensor }
//! }
//!
//! let participant = DomainParticipant::builder(0)
//!     .participants(1)
//!     .rtps(RtpsConfig::new(0).loopback_only(true))
//!     .join()?;
//! let topic = participant.create_topic::<Reading>("sensors/temperature")?;
//! // Samples of this topic now cross between the group and RTPS, once each.
//! let _bridge = participant.bridge_rtps(
//!     &topic,
//!     WriterQos::default().reliable(Duration::from_secs(1)),
//!     ReaderQos::default().reliable(Duration::from_secs(1)),
//! )?;
//! let writer = participant.create_writer(&topic, WriterQos::default())?;
//! writer.write(&Reading { sensor: 1, celsius: 21.5 })?; // Spindle and RTPS readers get it
//! # Ok::<(), spindle::dds::DdsError>(())
//! ```
//!
//! ## How a bridge works
//!
//! Spindle keeps its own fast path (the group layer) between Spindle
//! participants; RTPS is for everyone else. A bridge of a topic, in one
//! participant of the domain (the gateway), runs one thread that moves:
//!
//! - **group → RTPS**: a Spindle reader of the topic takes every sample
//!   of every Spindle writer and an RTPS writer (CDR) writes it: RTPS
//!   readers get each sample once. That Spindle reader exists only while
//!   at least one RTPS reader is matched with the bridge's RTPS writer: it
//!   joins the topic when the first one matches (a transient-local one
//!   starts from the history the participants keep, so a late RTPS reader
//!   still gets it) and leaves when the last one goes. A topic bridged out
//!   with no RTPS reader anywhere therefore costs its Spindle writers
//!   nothing: they do not wait for a reader that has no one to serve
//!   ([`BridgeCounts::group_reader_starts`] counts its joins).
//! - **RTPS → group**: an RTPS reader takes every sample of every RTPS
//!   writer and a Spindle writer, the bridge's *injector*, writes it into
//!   the group: every Spindle reader (this participant's too) gets it once.
//!   rustdds's reader acknowledges a sample when it arrives and drops the
//!   oldest untaken ones past its cache's limit, so an RTPS writer faster
//!   than the bridge can lose samples there even when both sides are
//!   reliable. The bridge sees each RTPS writer's sequence numbers and
//!   counts what it never got ([`BridgeCounts::rtps_samples_lost`], with a
//!   log line): such a loss is reported, not silent.
//!
//! No loop: the injector's writer id lies in a reserved range
//! ([`INJECTOR_LOCAL_BIT`]), and the group → RTPS side never forwards a
//! sample of an injector; the RTPS reader drops samples of this
//! participant's own RTPS writers. One bridge per topic per domain: a
//! bridge that sees another participant's injector on its topic stops
//! with [`RtpsBridge::failure`] saying so (two gateways would duplicate
//! every sample).
//!
//! ## Types and QoS
//!
//! A bridged type is any [`RtpsType`]: serde, the Spindle [`Keyed`] trait
//! with a key RTPS can hash (integers, strings, tuples of them), and
//! `Clone`. The RTPS side serializes it as XCDR1 (plain CDR) in field
//! order, so a Rust struct whose fields follow the IDL struct's order and
//! widths (`u32` for `unsigned long`, `Vec<u8>` for `sequence<octet>`,
//! `String` for `string`) meets an IDL type of the same name. The type
//! name on the wire is [`TopicType::type_name`] (the Rust name without its
//! module path); [`KeyedSeq`] is Cyclone `ddsperf`'s type.
//!
//! QoS map one to one: reliability, history (keep-last depth, keep-all)
//! and durability (volatile, transient-local; a transient-local bridge
//! replays its RTPS writer's history to late RTPS readers). The RTPS
//! writer takes the bridge's `WriterQos`, the RTPS reader its `ReaderQos`.
//!
//! ## Why rustdds
//!
//! The wire protocol comes from [`rustdds`] (Atostek; Apache-2.0; on
//! crates.io since 2020, releases every few months, 0.15 in 2026). It
//! covers SPDP/SEDP discovery, reliable and best-effort writers and
//! readers with HEARTBEAT/ACKNACK, fragmentation of large samples, keyed
//! topics with key hashes, transient-local durability and CDR through
//! serde, and its published interoperability runs (the OMG dds-rtps
//! suite) pass against Cyclone DDS, Fast DDS, Connext and OpenDDS.
//! `dust_dds` was the other candidate: it also interoperates, but asks
//! for its own type derive instead of serde. Missing from rustdds (so
//! from the gateway): XCDR2 and XTypes type objects (types match by name),
//! content-filtered topics, partitions on the RTPS side, DDS Security
//! unless its `security` feature is built. It owns threads (its event
//! loop): that is why the gateway lives here, in the runtime crate, and
//! not in the sans-IO `spindle-dds`.
//!
//! ## Loopback-only
//!
//! [`RtpsConfig::loopback_only`] keeps RTPS on 127.0.0.1: only the
//! loopback interface is advertised, and discovery reaches same-host
//! participants through their well-known unicast ports (no multicast
//! needed). The matching Cyclone DDS setting is
//! [`CYCLONE_LOOPBACK_URI`] in `CYCLONEDDS_URI`.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustdds::policy;
use rustdds::with_key::Sample as RtpsSample;
use rustdds::{QosPolicies, QosPolicyBuilder, RTPSEntity, StatusEvented, TopicKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use spindle_dds::qos::{Durability, History, ReaderQos, Reliability, WriterQos};
use spindle_dds::types::{endpoint_id, Keyed, TopicType, WriterId};

use super::participant::{DomainParticipant, Topic};
pub use super::rtps_log::malformed_datagrams;
use super::DdsError;

/// Bit 47 of an endpoint's local index marks an RTPS bridge's injector
/// (the writer that carries RTPS samples into the group): no bridge
/// forwards its samples back out.
pub const INJECTOR_LOCAL_BIT: u64 = 1 << 47;

/// Samples a bridge moves per side per pass before it looks at the other.
pub const BRIDGE_BATCH_SAMPLES: usize = 256;

/// Idle passes a bridge spins, then yields, before it sleeps.
const BRIDGE_SPIN_PASSES: u32 = 64;
const BRIDGE_YIELD_PASSES: u32 = 64;
/// The longest sleep of an idle bridge.
const BRIDGE_SLEEP_MAX: Duration = Duration::from_millis(1);
/// How many of each kind of error a bridge logs (it counts them all).
const BRIDGE_LOG_LINES_MAX: u64 = 20;

/// The Cyclone DDS configuration (for `CYCLONEDDS_URI`) that keeps a
/// Cyclone process on loopback, as [`RtpsConfig::loopback_only`] keeps
/// Spindle: the loopback interface, no multicast, unicast discovery of
/// same-host participants.
pub const CYCLONE_LOOPBACK_URI: &str = "<CycloneDDS><Domain><General><Interfaces><NetworkInterface name=\"lo\"/></Interfaces><AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto</ParticipantIndex><Peers><Peer address=\"127.0.0.1\"/></Peers></Discovery></Domain></CycloneDDS>";

/// Whether `writer` is an RTPS bridge's injector.
pub const fn is_injector(writer: WriterId) -> bool {
    writer.0 & INJECTOR_LOCAL_BIT != 0
}

/// How a participant speaks RTPS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RtpsConfig {
    /// The RTPS domain id (its UDP ports: 7400 + 250 × domain; 0..=232).
    pub domain_id: u16,
    /// Advertise and use the loopback interface only (tests, one host).
    pub loopback_only: bool,
}

/// The largest RTPS domain id whose ports fit in 16 bits.
pub const RTPS_DOMAIN_ID_MAX: u16 = 232;

impl RtpsConfig {
    /// RTPS domain `domain_id`, on every interface.
    pub fn new(domain_id: u16) -> RtpsConfig {
        RtpsConfig {
            domain_id,
            loopback_only: false,
        }
    }

    /// Keep RTPS on 127.0.0.1 (see the module docs).
    pub fn loopback_only(mut self, on: bool) -> RtpsConfig {
        self.loopback_only = on;
        self
    }
}

/// A type a bridge carries: serde both ways (CDR on RTPS, postcard in the
/// group), a key RTPS can hash, and `Clone` (an RTPS write takes the
/// value). Implemented for every type that has these.
pub trait RtpsType:
    TopicType
    + Keyed<Key: rustdds::Key + DeserializeOwned + Send + Sync>
    + Serialize
    + DeserializeOwned
    + Clone
    + Send
    + 'static
{
}

impl<T> RtpsType for T where
    T: TopicType
        + Keyed<Key: rustdds::Key + DeserializeOwned + Send + Sync>
        + Serialize
        + DeserializeOwned
        + Clone
        + Send
        + 'static
{
}

/// A value as rustdds sees it: the same serde form, rustdds's key trait.
#[derive(Serialize, Deserialize, Clone)]
#[serde(transparent)]
struct OnWire<T>(T);

impl<T: RtpsType> rustdds::Keyed for OnWire<T> {
    type K = <T as Keyed>::Key;
    fn key(&self) -> Self::K {
        Keyed::key(&self.0)
    }
}

/// Cyclone DDS `ddsperf`'s keyed type (`-T KS`, topic `DDSPerfRDataKS`
/// reliable, `DDSPerfUDataKS` best-effort):
///
/// ```text
/// struct KeyedSeq { unsigned long seq; @key unsigned long keyval; sequence<octet> baggage; };
/// ```
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KeyedSeq {
    /// The writer's sequence number (per key).
    pub seq: u32,
    /// The key.
    pub keyval: u32,
    /// Payload.
    #[serde(with = "serde_bytes_compat")]
    pub baggage: Vec<u8>,
}

impl Keyed for KeyedSeq {
    type Key = u32;
    fn key(&self) -> u32 {
        self.keyval
    }
}

/// `Vec<u8>` as serde bytes (one length and a copy, not a sequence of
/// one-byte elements): CDR writes both the same way (a `u32` length and
/// the octets), postcard too (a varint length and the bytes).
mod serde_bytes_compat {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence of octets")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                // Bounded by the input: each element consumes a byte of it.
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(Visitor)
    }
}

/// A participant's RTPS side: its settings, and two rustdds participants
/// (each made at the first bridge that needs it): one for the bridges'
/// RTPS writers (group → RTPS), one for their RTPS readers (RTPS →
/// group). In one rustdds participant a two-way bridge's reader was
/// matched with its own writer and never acknowledged it: the writer
/// stalled once its history filled (8,192 samples). Apart, the reader
/// acknowledges like any other, and skips its twin writer's samples by
/// GUID prefix.
pub(crate) struct RtpsSlot {
    config: Option<RtpsConfig>,
    participant: Mutex<Option<rustdds::DomainParticipant>>,
    participant_in: Mutex<Option<rustdds::DomainParticipant>>,
    bridged: Arc<Mutex<HashSet<String>>>,
}

impl RtpsSlot {
    pub(crate) fn new(config: Option<RtpsConfig>) -> RtpsSlot {
        RtpsSlot {
            config,
            participant: Mutex::new(None),
            participant_in: Mutex::new(None),
            bridged: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// The rustdds participant of the bridges' RTPS writers.
    fn participant(&self) -> Result<rustdds::DomainParticipant, DdsError> {
        self.made(&self.participant)
    }

    /// The rustdds participant of the bridges' RTPS readers.
    fn participant_in(&self) -> Result<rustdds::DomainParticipant, DdsError> {
        self.made(&self.participant_in)
    }

    fn made(&self, slot: &Mutex<Option<rustdds::DomainParticipant>>) -> Result<rustdds::DomainParticipant, DdsError> {
        let config = self.config.as_ref().ok_or_else(|| {
            DdsError::Config(
                "bridge_rtps needs a participant built with ParticipantBuilder::rtps(RtpsConfig::new(domain_id))"
                    .into(),
            )
        })?;
        let mut slot = slot.lock().expect("rtps participant lock");
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        if config.domain_id > RTPS_DOMAIN_ID_MAX {
            return Err(DdsError::Config(format!(
                "RTPS domain id {} out of range 0..={RTPS_DOMAIN_ID_MAX} (its UDP ports would pass 65535)",
                config.domain_id
            )));
        }
        // Count the datagrams rustdds drops unparsed (it keeps no count).
        super::rtps_log::install();
        let mut builder = rustdds::DomainParticipantBuilder::new(config.domain_id).same_host_loopback(true);
        if config.loopback_only {
            builder = builder.with_only_networks([std::net::Ipv4Addr::LOCALHOST]);
        }
        let p = builder.build().map_err(|e| {
            DdsError::Config(format!(
                "cannot start the RTPS participant of domain {}: {e:?}",
                config.domain_id
            ))
        })?;
        *slot = Some(p.clone());
        Ok(p)
    }
}

fn rtps_reliability(r: Reliability) -> policy::Reliability {
    match r {
        Reliability::BestEffort => policy::Reliability::BestEffort,
        Reliability::Reliable { max_blocking_time_ns } => policy::Reliability::Reliable {
            max_blocking_time: rustdds::Duration::from_nanos(max_blocking_time_ns as i64),
        },
    }
}

fn rtps_history(h: History) -> policy::History {
    match h {
        History::KeepLast(depth) => policy::History::KeepLast {
            depth: depth.min(i32::MAX as u32) as i32,
        },
        History::KeepAll => policy::History::KeepAll,
    }
}

fn rtps_durability(d: Durability) -> policy::Durability {
    match d {
        Durability::Volatile => policy::Durability::Volatile,
        Durability::TransientLocal => policy::Durability::TransientLocal,
    }
}

/// The RTPS QoS of a bridge's writer.
fn rtps_writer_qos(qos: &WriterQos) -> QosPolicies {
    QosPolicyBuilder::new()
        .reliability(rtps_reliability(qos.reliability))
        .history(rtps_history(qos.history))
        .durability(rtps_durability(qos.durability))
        .build()
}

/// Samples a bridge's rustdds reader caches before it drops the oldest
/// untaken (rustdds acknowledges a sample when it arrives, so under
/// keep-all a full cache loses samples: counted in
/// [`BridgeCounts::rtps_samples_lost`]). rustdds's default is 64; the
/// bridge's `ReaderQos` limits its Spindle reader, not this one (the CLI
/// gives that 65,536, and rustdds slows down as its cache grows).
/// Unpaced `ddsperf pub` into `spindle dds sub --rtps` (2026-12-03, 2
/// vCPUs, `dds sub` with a 1024-slot window, 5 s runs): 16 B 107-142 k
/// samples/s taken with 64, 127-220 k with 1,024-4,096, 29-77 k with
/// 16,384-65,536; 1 KiB 152-167 k with 64 (264-311 k lost), 181-203 k
/// with 1,024, 228 k with 2,048 (58-1,960 lost), 118 k with 16,384 (one or
/// two runs each). At most this many samples of
/// the topic's size are held (128 MiB of 64 KiB samples).
pub const RTPS_READER_CACHE_SAMPLES: i32 = 2048;

/// The RTPS QoS of a bridge's reader.
fn rtps_reader_qos(qos: &ReaderQos) -> QosPolicies {
    QosPolicyBuilder::new()
        .reliability(rtps_reliability(qos.reliability))
        .history(rtps_history(qos.history))
        .durability(rtps_durability(qos.durability))
        .resource_limits(policy::ResourceLimits {
            max_samples: RTPS_READER_CACHE_SAMPLES,
            max_instances: RTPS_READER_CACHE_SAMPLES,
            max_samples_per_instance: RTPS_READER_CACHE_SAMPLES,
        })
        .build()
}

/// An RTPS write error without the rejected value.
fn write_error_text<D>(e: &rustdds::dds::result::WriteError<D>) -> String {
    use rustdds::dds::result::WriteError;
    match e {
        WriteError::Serialization { reason, .. } => format!("serialization: {reason}"),
        WriteError::Poisoned { reason, .. } => format!("poisoned: {reason}"),
        WriteError::Io(e) => format!("i/o: {e}"),
        WriteError::WouldBlock { .. } => "would block: the RTPS send buffer is full (a reliable reader lags)".into(),
        WriteError::Internal { reason } => format!("internal: {reason}"),
    }
}

/// Which way a bridge carries samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BridgeDirection {
    /// Group → RTPS and RTPS → group.
    Both,
    /// Group → RTPS only (no RTPS reader).
    ToRtps,
    /// RTPS → group only (no RTPS writer).
    FromRtps,
}

impl BridgeDirection {
    fn carries_out(self) -> bool {
        matches!(self, BridgeDirection::Both | BridgeDirection::ToRtps)
    }
    fn carries_in(self) -> bool {
        matches!(self, BridgeDirection::Both | BridgeDirection::FromRtps)
    }
}

/// What a bridge has moved and dropped so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BridgeCounts {
    /// Samples of Spindle writers written to RTPS.
    pub to_rtps: u64,
    /// Samples of RTPS writers written into the group.
    pub from_rtps: u64,
    /// RTPS samples dropped: not a value of the type (bad CDR), or a read
    /// error (each logged, the first few).
    pub rtps_dropped: u64,
    /// RTPS samples that were this participant's own (not re-injected).
    pub own_skipped: u64,
    /// RTPS writes that failed (a reliable RTPS reader did not keep up
    /// within the writer's `max_blocking_time`).
    pub rtps_write_errors: u64,
    /// Times the bridge's Spindle reader joined the topic: once each time
    /// the RTPS readers matched went from none to some (see the module
    /// docs).
    pub group_reader_starts: u64,
    /// Waits for the RTPS readers' acknowledgments after
    /// [`RTPS_IN_FLIGHT_BYTES_MAX`] bytes went out.
    pub rtps_window_waits: u64,
    /// Those waits that ended without every acknowledgment.
    pub rtps_window_timeouts: u64,
    /// Samples of RTPS writers that the bridge never took, with a
    /// reliable keep-all reader QoS (under keep-last or best-effort a
    /// missing sample is what the QoS allows, and nothing is counted): a
    /// gap in a writer's sequence numbers between two samples it took
    /// (rustdds's reader dropped them from its cache). A sample rustdds
    /// took but could not decode counts in `rtps_dropped` and may count
    /// here too; a writer with keep-last history that replaced a sample
    /// before sending it counts here. At most `MATCHED_ENDPOINTS_MAX` (4,096)
    /// writers matched at once are followed.
    pub rtps_samples_lost: u64,
}

struct BridgeShared {
    stop: AtomicBool,
    to_rtps: AtomicU64,
    from_rtps: AtomicU64,
    rtps_dropped: AtomicU64,
    own_skipped: AtomicU64,
    rtps_write_errors: AtomicU64,
    group_reader_starts: AtomicU64,
    rtps_window_waits: AtomicU64,
    rtps_window_timeouts: AtomicU64,
    rtps_samples_lost: AtomicU64,
    /// RTPS readers matched with the bridge's RTPS writer (refreshed every
    /// [`MATCH_REFRESH_PASSES`] passes).
    readers_matched: AtomicU64,
    /// RTPS writers matched with the bridge's RTPS reader.
    writers_matched: AtomicU64,
    /// A flush asked for: wait this long (ns, 0: none asked) for every
    /// matched reliable RTPS reader to acknowledge what was written.
    flush_wait_ns: AtomicU64,
    /// The answer: 0 pending, [`FLUSH_ACKED`] or [`FLUSH_TIMED_OUT`].
    flush_result: AtomicU64,
    failure: Mutex<Option<String>>,
}

/// Passes between two refreshes of the match counts.
const MATCH_REFRESH_PASSES: u32 = 64;
/// Status events read per refresh at most.
const STATUS_EVENTS_MAX: usize = 64;
const FLUSH_ACKED: u64 = 1;
const FLUSH_TIMED_OUT: u64 = 2;

/// A topic bridged between the group and RTPS (see the module docs).
/// Dropping it stops the bridge.
pub struct RtpsBridge<T> {
    topic: String,
    shared: Arc<BridgeShared>,
    bridged: Arc<Mutex<HashSet<String>>>,
    thread: Option<JoinHandle<()>>,
    _type: PhantomData<fn() -> T>,
}

impl<T> RtpsBridge<T> {
    /// What the bridge has moved and dropped so far.
    pub fn counts(&self) -> BridgeCounts {
        // Relaxed: monotone counters read for reporting.
        BridgeCounts {
            to_rtps: self.shared.to_rtps.load(Ordering::Relaxed),
            from_rtps: self.shared.from_rtps.load(Ordering::Relaxed),
            rtps_dropped: self.shared.rtps_dropped.load(Ordering::Relaxed),
            own_skipped: self.shared.own_skipped.load(Ordering::Relaxed),
            rtps_write_errors: self.shared.rtps_write_errors.load(Ordering::Relaxed),
            group_reader_starts: self.shared.group_reader_starts.load(Ordering::Relaxed),
            rtps_window_waits: self.shared.rtps_window_waits.load(Ordering::Relaxed),
            rtps_window_timeouts: self.shared.rtps_window_timeouts.load(Ordering::Relaxed),
            rtps_samples_lost: self.shared.rtps_samples_lost.load(Ordering::Relaxed),
        }
    }

    /// Why the bridge stopped on its own (`None` while it runs).
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().expect("bridge failure lock").clone()
    }

    /// The bridged topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// RTPS readers matched with the bridge's RTPS writer (counted once
    /// the bridge's Spindle reader has joined the topic for them: a
    /// Spindle writer created after this count rose reaches them).
    pub fn rtps_readers_matched(&self) -> u64 {
        // Relaxed: a count refreshed by the bridge thread, read to poll.
        self.shared.readers_matched.load(Ordering::Relaxed)
    }

    /// RTPS writers matched with the bridge's RTPS reader.
    pub fn rtps_writers_matched(&self) -> u64 {
        self.shared.writers_matched.load(Ordering::Relaxed)
    }

    /// Wait up to `timeout` until at least `n` RTPS readers matched, then
    /// [`RTPS_MATCH_SETTLE`] more so that those readers have matched this
    /// writer too; the count matched. Call it before the first write that
    /// a volatile reader must get.
    pub fn wait_for_rtps_readers(&self, n: u64, timeout: Duration) -> Result<u64, DdsError> {
        let matched = self.wait_matched(n, timeout, "RTPS readers", |s| {
            s.readers_matched.load(Ordering::Relaxed)
        })?;
        if n > 0 {
            let until = std::time::Instant::now() + RTPS_MATCH_SETTLE;
            // Bounded by RTPS_MATCH_SETTLE; a failed bridge ends it early.
            while std::time::Instant::now() < until {
                if let Some(why) = self.failure() {
                    return Err(DdsError::Stopped(why));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(matched)
    }

    /// Wait up to `timeout` until at least `n` RTPS writers matched.
    pub fn wait_for_rtps_writers(&self, n: u64, timeout: Duration) -> Result<u64, DdsError> {
        self.wait_matched(n, timeout, "RTPS writers", |s| {
            s.writers_matched.load(Ordering::Relaxed)
        })
    }

    fn wait_matched(
        &self,
        n: u64,
        timeout: Duration,
        what: &str,
        count: impl Fn(&BridgeShared) -> u64,
    ) -> Result<u64, DdsError> {
        let started = std::time::Instant::now();
        loop {
            let matched = count(&self.shared);
            if matched >= n {
                return Ok(matched);
            }
            if let Some(why) = self.failure() {
                return Err(DdsError::Stopped(why));
            }
            if started.elapsed() >= timeout {
                return Err(DdsError::Timeout {
                    waiting_for: format!("{n} {what} of topic {:?} (matched {matched})", self.topic),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait up to `timeout` until every sample the bridge's Spindle
    /// reader has received went out to RTPS and every matched reliable
    /// RTPS reader acknowledged it. Call it after the Spindle writers'
    /// [`super::DataWriter::wait_for_acknowledgments`], so that what they
    /// wrote has reached the bridge. With no RTPS reader matched nothing
    /// is owed to anyone: `Ok(true)` (a transient-local RTPS reader that
    /// matches later is served from the history). `Ok(false)`: not within
    /// `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<bool, DdsError> {
        let started = std::time::Instant::now();
        // Partner: the Acquire swap in the bridge loop, which answers in
        // `flush_result` (Release) ...
        self.shared.flush_result.store(0, Ordering::Relaxed);
        self.shared
            .flush_wait_ns
            .store(timeout.as_nanos().max(1) as u64, Ordering::Release);
        loop {
            // ... read here (Acquire).
            match self.shared.flush_result.load(Ordering::Acquire) {
                FLUSH_ACKED => return Ok(true),
                FLUSH_TIMED_OUT => return Ok(false),
                _ => {}
            }
            if let Some(why) = self.failure() {
                return Err(DdsError::Stopped(why));
            }
            if started.elapsed() >= timeout + Duration::from_secs(1) {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl<T> Drop for RtpsBridge<T> {
    fn drop(&mut self) {
        // Partner: the Acquire load at the top of the bridge loop.
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.bridged.lock().expect("bridged lock").remove(&self.topic);
    }
}

/// What the bridge thread owns.
struct BridgeWorker<T: RtpsType> {
    shared: Arc<BridgeShared>,
    topic: String,
    me: usize,
    /// This participant's RTPS GUID (its writers share its prefix).
    /// The GUIDs of this participant's rustdds participants (the bridge's
    /// writer's and reader's): endpoints with their prefix are the
    /// bridge's own (not counted as matches; their samples not bridged
    /// back).
    own_participants: [Option<rustdds::GUID>; 2],
    /// Group → RTPS.
    outbound: Option<Outbound<T>>,
    /// RTPS → group: the RTPS reader and the injector.
    inbound: Option<(rustdds::with_key::DataReaderCdr<OnWire<T>>, super::DataWriter<T>)>,
    /// Other participants' RTPS readers matched with our writer.
    remote_readers: HashSet<rustdds::GUID>,
    /// Other participants' RTPS writers matched with our reader.
    remote_writers: HashSet<rustdds::GUID>,
    /// A remote reader matched since the last RTPS write: the next write
    /// waits (bounded) for its acknowledgment before more go out (see
    /// [`RTPS_SYNC_WAIT`]).
    sync_pending: bool,
    /// Serialized bytes written to RTPS since the last wait for the
    /// readers' acknowledgments (see [`RTPS_IN_FLIGHT_BYTES_MAX`]).
    in_flight_bytes: usize,
    /// RTPS → group: each RTPS writer's last sequence number taken.
    seen: SequenceGaps,
}

/// The group → RTPS side of a bridge.
struct Outbound<T: RtpsType> {
    /// The Spindle reader of the topic: `Some` while an RTPS reader is
    /// matched (see the module docs).
    reader: Option<super::DataReader<T>>,
    /// Creates that reader (the bridge's `ReaderQos`, checked when the
    /// bridge was made).
    make_reader: Box<dyn FnMut() -> Result<super::DataReader<T>, DdsError> + Send>,
    rtps_writer: rustdds::with_key::DataWriterCdr<OnWire<T>>,
}

/// Passes a flush drains the bridge's Spindle reader at most (each moves
/// up to [`BRIDGE_BATCH_SAMPLES`]): a bound on the loop while writers
/// keep writing.
const FLUSH_DRAIN_PASSES_MAX: usize = 1 << 12;

/// How long the first write after a new RTPS reader matched waits for
/// every reader's acknowledgment. A volatile Cyclone DDS reader treats
/// everything up to the last sequence number of the first HEARTBEAT it
/// gets from a new writer as history written before it joined, and
/// skips what of it has not arrived yet; rustdds announces in that
/// heartbeat every sample written so far, ahead of the data, so a burst
/// written right after the match lost a block in Cyclone's reader
/// (`bench/results/rtps-unpaced-gaps.json`: from seq 1486, up to 3,360
/// samples, acknowledged all the same). One sample alone, acknowledged,
/// puts the reader in step before the burst.
const RTPS_SYNC_WAIT: Duration = Duration::from_secs(1);

/// The most sample bytes a bridge writes to RTPS before it waits for every
/// matched reader's acknowledgment. rustdds's flow control towards its
/// readers counts samples (8,192 unacknowledged), not bytes, and slides
/// on acknowledgments it does not show (no acknowledged sequence number
/// in its API, so this window waits for all of them): a burst larger
/// than a reader's UDP receive buffer is lost
/// there (`UdpRcvbufErrors`), and rustdds repairs at most 8 KiB per
/// repair round, so 6 datagrams lost from an unpaced burst of 1 KiB
/// samples held a Cyclone DDS reader at ~760 samples/s for the rest of
/// the run (every later sample waits for the gap). Measured on loopback
/// with `ddsperf sub` (2026-11-29, bench/RESULTS-dds.md): a wait every
/// 1 or 2 MiB lost nothing; every 4 MiB lost datagrams again.
pub const RTPS_IN_FLIGHT_BYTES_MAX: usize = 1 << 20;

/// How long a bridge waits for the acknowledgments of one
/// [`RTPS_IN_FLIGHT_BYTES_MAX`]: a reader that does not answer in time
/// (gone, or stalled) slows the bridge to that many bytes per wait, and
/// does not stop it.
const RTPS_IN_FLIGHT_WAIT: Duration = Duration::from_millis(200);

/// How long [`RtpsBridge::wait_for_rtps_readers`] waits after the match.
/// The match it sees is one-sided: this writer learned of the remote
/// reader (its SEDP announcement came in). The remote reader learns of
/// this writer from this participant's announcement, which may come later
/// (it waits for this participant's SPDP, or for a repair on the next SEDP
/// heartbeat, 1 s at the slowest in rustdds), and rustdds does not show
/// when it did. A Cyclone DDS reader drops DATA from a writer it has not
/// matched yet and, volatile, later counts that sample as history written
/// before it joined: the first sample was lost this way (`ddsperf sub`:
/// `total 9999 lost 0`) when the first write followed the match at once.
/// One SEDP heartbeat period and a half covers a repaired announcement.
pub const RTPS_MATCH_SETTLE: Duration = Duration::from_millis(1500);

/// Most matched endpoints a bridge tracks per side.
const MATCHED_ENDPOINTS_MAX: usize = 4096;

/// Sequence numbers `first..=last` of one RTPS writer that were never
/// taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lost {
    first: i64,
    last: i64,
}

impl Lost {
    fn count(&self) -> u64 {
        (self.last - self.first + 1) as u64
    }
}

/// The last sequence number taken of each RTPS writer matched (at most
/// [`MATCHED_ENDPOINTS_MAX`] writers), to find the samples a reliable
/// keep-all reader lost.
#[derive(Default)]
struct SequenceGaps {
    /// Count gaps (a reliable keep-all bridge reader; see `make_bridge`).
    on: bool,
    last: HashMap<rustdds::GUID, i64>,
    /// Gaps logged so far (at most [`BRIDGE_LOG_LINES_MAX`]).
    gaps_logged: u64,
}

impl SequenceGaps {
    /// `writer`'s sample `sequence` was taken: the numbers skipped since
    /// its last one, if any. A writer's first sample counts nothing (a
    /// reader may join late); one at or below the last is no gap.
    /// `writer` unmatched: a match again starts a new count.
    fn forget(&mut self, writer: rustdds::GUID) {
        self.last.remove(&writer);
    }

    fn take(&mut self, writer: rustdds::GUID, sequence: i64) -> Option<Lost> {
        match self.last.get_mut(&writer) {
            Some(last) => {
                let lost = (sequence > *last + 1).then(|| Lost {
                    first: *last + 1,
                    last: sequence - 1,
                });
                *last = (*last).max(sequence);
                lost
            }
            None => {
                if self.last.len() < MATCHED_ENDPOINTS_MAX {
                    self.last.insert(writer, sequence);
                }
                None
            }
        }
    }
}

/// A match (`change` > 0) or unmatch of `endpoint`.
fn note_match(set: &mut HashSet<rustdds::GUID>, endpoint: rustdds::GUID, change: i32) {
    if change > 0 {
        if set.len() < MATCHED_ENDPOINTS_MAX {
            set.insert(endpoint);
        }
    } else if change < 0 {
        set.remove(&endpoint);
    }
}

impl<T: RtpsType> BridgeWorker<T> {
    /// The loop: group → RTPS, RTPS → group, match counts, flushes, and
    /// a backoff when a pass moved nothing (spin, yield, sleep up to
    /// [`BRIDGE_SLEEP_MAX`]). `Err`: why the bridge stopped on its own.
    fn run(&mut self) -> Result<(), String> {
        let mut idle_passes = 0u32;
        let mut passes = 0u32;
        // Partner: the Release store in RtpsBridge::drop.
        while !self.shared.stop.load(Ordering::Acquire) {
            if passes.is_multiple_of(MATCH_REFRESH_PASSES) {
                self.refresh_matches()?;
            }
            passes = passes.wrapping_add(1);
            let moved = self.group_to_rtps()? + self.rtps_to_group()?;
            self.answer_flush()?;
            if moved > 0 {
                idle_passes = 0;
            } else {
                idle_passes = idle_passes.saturating_add(1);
                if idle_passes <= BRIDGE_SPIN_PASSES {
                    std::hint::spin_loop();
                } else if idle_passes <= BRIDGE_SPIN_PASSES + BRIDGE_YIELD_PASSES {
                    std::thread::yield_now();
                } else {
                    let k = (idle_passes - BRIDGE_SPIN_PASSES - BRIDGE_YIELD_PASSES).min(5);
                    std::thread::sleep((Duration::from_micros(32) * (1 << k)).min(BRIDGE_SLEEP_MAX));
                }
            }
        }
        Ok(())
    }

    /// The match counts come as status events (bounded: the statuses
    /// queued since the last look). Only other participants' endpoints
    /// count: this participant's own reader and writer match each other.
    /// The bridge's Spindle reader joins the topic when the first RTPS
    /// reader matched and leaves when the last one went.
    fn refresh_matches(&mut self) -> Result<(), String> {
        let own = self.own_participants;
        let is_own = |guid: rustdds::GUID| own.iter().flatten().any(|p| p.prefix == guid.prefix);
        for _ in 0..STATUS_EVENTS_MAX {
            let Some(out) = &self.outbound else { break };
            let Some(status) = out.rtps_writer.try_recv_status() else {
                break;
            };
            if let rustdds::DataWriterStatus::PublicationMatched { current, reader, .. } = status {
                if !is_own(reader) {
                    note_match(&mut self.remote_readers, reader, current.count_change());
                    self.sync_pending |= current.count_change() > 0;
                }
            }
        }
        for _ in 0..STATUS_EVENTS_MAX {
            let Some((rtps_reader, _)) = &self.inbound else { break };
            let Some(status) = rtps_reader.try_recv_status() else {
                break;
            };
            if let rustdds::DataReaderStatus::SubscriptionMatched { current, writer, .. } = status {
                if !is_own(writer) {
                    note_match(&mut self.remote_writers, writer, current.count_change());
                    if current.count_change() < 0 {
                        // A writer that comes back (a new match) starts a
                        // new count.
                        self.seen.forget(writer);
                    }
                }
            }
        }
        if let Some(out) = &mut self.outbound {
            match (self.remote_readers.is_empty(), out.reader.is_some()) {
                (false, false) => {
                    let reader = (out.make_reader)().map_err(|e| {
                        format!("the Spindle reader for the RTPS readers that matched could not join: {e}")
                    })?;
                    out.reader = Some(reader);
                    // Relaxed: a counter read for reporting.
                    self.shared.group_reader_starts.fetch_add(1, Ordering::Relaxed);
                }
                // Its samples have no one to go to; dropping it retires
                // it, and the topic's writers stop waiting for it.
                (true, true) => out.reader = None,
                _ => {}
            }
        }
        // Relaxed: counts polled by the handle (the reader above is
        // announced before the count that says it is there).
        self.shared
            .readers_matched
            .store(self.remote_readers.len() as u64, Ordering::Relaxed);
        self.shared
            .writers_matched
            .store(self.remote_writers.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A flush asked for: move out what the Spindle reader holds (a
    /// bounded number of passes), then wait for the RTPS readers'
    /// acknowledgments.
    fn answer_flush(&mut self) -> Result<(), String> {
        // Partner: the Release store in RtpsBridge::flush.
        let flush_ns = self.shared.flush_wait_ns.swap(0, Ordering::Acquire);
        if flush_ns > 0 {
            for _ in 0..FLUSH_DRAIN_PASSES_MAX {
                if self.group_to_rtps()? == 0 {
                    break;
                }
            }
            let acked = match &self.outbound {
                Some(out) if out.reader.is_some() => out
                    .rtps_writer
                    .wait_for_acknowledgments(Duration::from_nanos(flush_ns))
                    .unwrap_or(false),
                _ => true,
            };
            // Partner: the Acquire load in RtpsBridge::flush.
            self.shared
                .flush_result
                .store(if acked { FLUSH_ACKED } else { FLUSH_TIMED_OUT }, Ordering::Release);
        }
        Ok(())
    }

    /// Samples of Spindle writers out to RTPS (up to a batch); how many
    /// were taken.
    fn group_to_rtps(&mut self) -> Result<usize, String> {
        let Some(reader) = self.outbound.as_ref().and_then(|out| out.reader.as_ref()) else {
            return Ok(0);
        };
        let samples = reader
            .take_sized(BRIDGE_BATCH_SAMPLES)
            .map_err(|e| format!("the Spindle reader failed: {e}"))?;
        let taken = samples.len();
        for (sample, bytes) in samples {
            if is_injector(sample.info.writer) {
                if sample.info.writer.participant() != self.me {
                    return Err(format!(
                        "participant {} bridges topic {:?} to RTPS too: two bridges of one topic would duplicate every sample (bridge it in one participant of the domain)",
                        sample.info.writer.participant(),
                        self.topic
                    ));
                }
                continue;
            }
            let Some(value) = sample.data else { continue };
            self.write_rtps(OnWire(value), bytes)?;
        }
        Ok(taken)
    }

    /// One RTPS write (of a sample of `bytes` serialized bytes in the
    /// group). A full RTPS send buffer (a reliable reader lags) hands the
    /// value back: retry it, meanwhile draining the RTPS reader (this
    /// participant's own reader is matched with the writer too: left
    /// unread, it would stop acknowledging and hold the writer forever).
    /// Once [`RTPS_IN_FLIGHT_BYTES_MAX`] went out since the last wait, wait
    /// (bounded) for the readers' acknowledgments.
    fn write_rtps(&mut self, value: OnWire<T>, bytes: usize) -> Result<(), String> {
        let mut pending = value;
        loop {
            let Some(Outbound { rtps_writer, .. }) = &self.outbound else {
                return Ok(());
            };
            match rtps_writer.write(pending, None) {
                Ok(()) => {
                    // Relaxed: a counter read for reporting.
                    self.shared.to_rtps.fetch_add(1, Ordering::Relaxed);
                    self.in_flight_bytes += bytes;
                    if std::mem::take(&mut self.sync_pending) {
                        // Bounded; a reader that does not answer in time
                        // (best-effort, or gone) does not hold the bridge.
                        let _ = rtps_writer.wait_for_acknowledgments(RTPS_SYNC_WAIT);
                        self.in_flight_bytes = 0;
                    } else if self.in_flight_bytes >= RTPS_IN_FLIGHT_BYTES_MAX {
                        // Bounded the same way; `Ok(true)` at once for a
                        // best-effort writer.
                        let acked = rtps_writer
                            .wait_for_acknowledgments(RTPS_IN_FLIGHT_WAIT)
                            .unwrap_or(false);
                        self.in_flight_bytes = 0;
                        // Relaxed: counters read for reporting.
                        self.shared.rtps_window_waits.fetch_add(1, Ordering::Relaxed);
                        if !acked {
                            self.shared.rtps_window_timeouts.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    return Ok(());
                }
                Err(rustdds::dds::result::WriteError::WouldBlock { data }) => {
                    // Partner: the Release store in RtpsBridge::drop.
                    if self.shared.stop.load(Ordering::Acquire) {
                        return Ok(());
                    }
                    pending = data;
                    if self.rtps_to_group()? == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Err(e) => {
                    let n = self.shared.rtps_write_errors.fetch_add(1, Ordering::Relaxed);
                    if n < BRIDGE_LOG_LINES_MAX {
                        eprintln!(
                            "spindle rtps: {:?}: an RTPS write failed: {}",
                            self.topic,
                            write_error_text(&e)
                        );
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Samples of RTPS writers into the group (up to a batch); how many
    /// were taken.
    fn rtps_to_group(&mut self) -> Result<usize, String> {
        let mut taken = 0;
        let Some((rtps_reader, injector)) = &mut self.inbound else {
            return Ok(0);
        };
        // One take of a batch (one lock of rustdds's cache, not one per
        // sample).
        let samples = match rtps_reader.take(BRIDGE_BATCH_SAMPLES, rustdds::ReadCondition::not_read()) {
            Ok(samples) => samples,
            Err(e) => {
                let n = self.shared.rtps_dropped.fetch_add(1, Ordering::Relaxed);
                if n < BRIDGE_LOG_LINES_MAX {
                    eprintln!("spindle rtps: {:?}: dropped an RTPS sample: {e:?}", self.topic);
                }
                return Ok(0);
            }
        };
        for sample in samples {
            taken += 1;
            let identity = sample.sample_info().sample_identity();
            let writer = identity.writer_guid;
            if self
                .own_participants
                .iter()
                .flatten()
                .any(|p| p.prefix == writer.prefix)
            {
                self.shared.own_skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let Some(lost) = self
                .seen
                .take(writer, i64::from(identity.sequence_number))
                .filter(|_| self.seen.on)
            {
                self.shared.rtps_samples_lost.fetch_add(lost.count(), Ordering::Relaxed);
                if self.seen.gaps_logged < BRIDGE_LOG_LINES_MAX {
                    self.seen.gaps_logged += 1;
                    eprintln!(
                        "spindle rtps: {:?}: {} samples of RTPS writer {writer:?} lost before the bridge took them \
                         (sequence numbers {}..={}): its reader's cache dropped them",
                        self.topic,
                        lost.count(),
                        lost.first,
                        lost.last
                    );
                }
            }
            // A dispose of a key: the group's readers learn of RTPS
            // writers' instances only through their values.
            let RtpsSample::Value(OnWire(value)) = sample.into_value() else {
                continue;
            };
            injector
                .write(&value)
                .map_err(|e| format!("writing an RTPS sample into the group failed: {e}"))?;
            self.shared.from_rtps.fetch_add(1, Ordering::Relaxed);
        }
        Ok(taken)
    }
}

impl DomainParticipant {
    /// Bridge `topic` between the group and RTPS: samples of Spindle
    /// writers (any participant of the domain) go out to RTPS readers,
    /// samples of RTPS writers come in to every Spindle reader, once
    /// each. `writer_qos` is the QoS of the RTPS writer and of the
    /// injector; `reader_qos` that of the RTPS reader and of the bridge's
    /// Spindle reader. Needs a participant built with
    /// [`super::ParticipantBuilder::rtps`]; one bridge per topic.
    pub fn bridge_rtps<T: RtpsType>(
        &self,
        topic: &Topic<T>,
        writer_qos: WriterQos,
        reader_qos: ReaderQos,
    ) -> Result<RtpsBridge<T>, DdsError> {
        self.bridge_rtps_one_way(topic, writer_qos, reader_qos, BridgeDirection::Both)
    }

    /// [`DomainParticipant::bridge_rtps`] in one direction only (or both).
    pub fn bridge_rtps_one_way<T: RtpsType>(
        &self,
        topic: &Topic<T>,
        writer_qos: WriterQos,
        reader_qos: ReaderQos,
        direction: BridgeDirection,
    ) -> Result<RtpsBridge<T>, DdsError> {
        let rtps_out = if direction.carries_out() {
            Some(self.rtps.participant()?)
        } else {
            None
        };
        let rtps_in = if direction.carries_in() {
            Some(self.rtps.participant_in()?)
        } else {
            None
        };
        let name = topic.name().to_string();
        if !self.rtps.bridged.lock().expect("bridged lock").insert(name.clone()) {
            return Err(DdsError::Config(format!(
                "topic {name:?} is bridged to RTPS already (one bridge per topic)"
            )));
        }
        let made = self.make_bridge(rtps_out.as_ref(), rtps_in.as_ref(), topic, writer_qos, reader_qos);
        if made.is_err() {
            self.rtps.bridged.lock().expect("bridged lock").remove(&name);
        }
        made
    }

    /// The bridge's endpoints: its RTPS writer in `rtps_out` (if it
    /// carries samples out), its RTPS reader in `rtps_in` (if it carries
    /// them in), and the group side of each.
    fn make_bridge<T: RtpsType>(
        &self,
        rtps_out: Option<&rustdds::DomainParticipant>,
        rtps_in: Option<&rustdds::DomainParticipant>,
        topic: &Topic<T>,
        writer_qos: WriterQos,
        reader_qos: ReaderQos,
    ) -> Result<RtpsBridge<T>, DdsError> {
        let name = topic.name().to_string();
        let rtps_error =
            |what: &str, e: &dyn std::fmt::Debug| DdsError::Config(format!("RTPS {what} for topic {name:?}: {e:?}"));
        let w_qos = rtps_writer_qos(&writer_qos);
        let r_qos = rtps_reader_qos(&reader_qos);
        let rtps_topic = |rtps: &rustdds::DomainParticipant| {
            rtps.create_topic(name.clone(), T::type_name().to_string(), &w_qos, TopicKind::WithKey)
                .map_err(|e| rtps_error("topic", &e))
        };
        let outbound = if let Some(rtps) = rtps_out {
            let rtps_topic = rtps_topic(rtps)?;
            let publisher = rtps.create_publisher(&w_qos).map_err(|e| rtps_error("publisher", &e))?;
            let rtps_writer = publisher
                .create_datawriter_cdr::<OnWire<T>>(&rtps_topic, Some(w_qos.clone()))
                .map_err(|e| rtps_error("writer", &e))?;
            Some(Outbound {
                reader: None,
                make_reader: Box::new(self.reader_maker(topic, reader_qos.clone())?),
                rtps_writer,
            })
        } else {
            None
        };
        let inbound = if let Some(rtps) = rtps_in {
            let rtps_topic = rtps_topic(rtps)?;
            let subscriber = rtps
                .create_subscriber(&r_qos)
                .map_err(|e| rtps_error("subscriber", &e))?;
            let rtps_reader = subscriber
                .create_datareader_cdr::<OnWire<T>>(&rtps_topic, Some(r_qos))
                .map_err(|e| rtps_error("reader", &e))?;
            let injector_id = WriterId(endpoint_id(
                self.rank(),
                INJECTOR_LOCAL_BIT | (self.new_local_index() & (INJECTOR_LOCAL_BIT - 1)),
            ));
            Some((
                rtps_reader,
                self.create_writer_as(topic, writer_qos, None, Some(injector_id))?,
            ))
        } else {
            None
        };
        let own_participants = [rtps_out.map(|p| p.guid()), rtps_in.map(|p| p.guid())];
        let me = self.rank();
        let shared = Arc::new(BridgeShared {
            stop: AtomicBool::new(false),
            to_rtps: AtomicU64::new(0),
            from_rtps: AtomicU64::new(0),
            rtps_dropped: AtomicU64::new(0),
            own_skipped: AtomicU64::new(0),
            rtps_write_errors: AtomicU64::new(0),
            group_reader_starts: AtomicU64::new(0),
            rtps_window_waits: AtomicU64::new(0),
            rtps_window_timeouts: AtomicU64::new(0),
            rtps_samples_lost: AtomicU64::new(0),
            readers_matched: AtomicU64::new(0),
            writers_matched: AtomicU64::new(0),
            flush_wait_ns: AtomicU64::new(0),
            flush_result: AtomicU64::new(0),
            failure: Mutex::new(None),
        });
        let mut worker = BridgeWorker {
            shared: shared.clone(),
            topic: name.clone(),
            me,
            own_participants,
            outbound,
            inbound,
            remote_readers: HashSet::new(),
            remote_writers: HashSet::new(),
            sync_pending: false,
            in_flight_bytes: 0,
            seen: SequenceGaps {
                // Under keep-last, or best-effort, rustdds dropping or
                // never getting a sample is what the QoS allows: only a
                // reliable keep-all reader must get every one.
                on: matches!(reader_qos.reliability, Reliability::Reliable { .. })
                    && matches!(reader_qos.history, History::KeepAll),
                ..SequenceGaps::default()
            },
        };
        let thread = std::thread::Builder::new()
            .name(format!("rtps-{name}"))
            .spawn(move || {
                if let Err(why) = worker.run() {
                    eprintln!("spindle rtps: bridge of {:?} stopped: {why}", worker.topic);
                    *worker.shared.failure.lock().expect("bridge failure lock") = Some(why);
                }
            })
            .map_err(|e| DdsError::Config(format!("cannot start the RTPS bridge thread: {e}")))?;
        Ok(RtpsBridge {
            topic: name,
            shared,
            bridged: self.rtps.bridged.clone(),
            thread: Some(thread),
            _type: PhantomData,
        })
    }
}

/// The RTPS/CDR decoding path of a bridged sample, fuzzed (bounded: a
/// fixed number of cases per run, in the workspace tests): a DATA
/// submessage's serialized payload (`SerializedPayload::from_bytes`, the
/// 4-byte encapsulation header) and then the CDR decoding of the bridged
/// type (`CDRDeserializerAdapter`, what rustdds runs for the bridge's
/// reader). Arbitrary bytes, every truncation of a valid sample and a
/// length prefix past the end must give an error, never a panic, an
/// allocation of the announced length or a torn sample.
#[cfg(test)]
mod cdr_decoding_fuzz {
    use proptest::prelude::*;
    use rustdds::no_key::DeserializerAdapter;
    use rustdds::{CDRDeserializerAdapter, RepresentationIdentifier, SerializedPayload};

    use super::{KeyedSeq, OnWire};

    type Adapter = CDRDeserializerAdapter<OnWire<KeyedSeq>>;

    /// A valid DATA payload of `sample`: encapsulation header (CDR, little
    /// endian) and the CDR bytes, as an RTPS writer sends it.
    fn payload(sample: &KeyedSeq) -> Vec<u8> {
        let mut bytes = vec![0x00, 0x01, 0x00, 0x00];
        bytes.extend(rustdds::cdr_encoding::to_vec::<_, byteorder::LittleEndian>(sample).expect("encode"));
        bytes
    }

    /// Decode like the bridge's reader: the payload's header, then the
    /// sample, for an encoding the adapter supports (rustdds checks that
    /// before it decodes).
    fn decode(bytes: &[u8]) -> Option<KeyedSeq> {
        let payload = SerializedPayload::from_bytes(&rustdds::bytes::Bytes::copy_from_slice(bytes)).ok()?;
        let encoding = payload.representation_identifier;
        if !Adapter::supported_encodings().contains(&encoding) {
            return None;
        }
        Adapter::from_bytes(&payload.value, encoding).ok().map(|w| w.0)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn a_valid_sample_round_trips_and_every_truncation_is_refused(
            seq in any::<u32>(),
            keyval in any::<u32>(),
            baggage in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let sample = KeyedSeq { seq, keyval, baggage };
            let bytes = payload(&sample);
            prop_assert_eq!(decode(&bytes), Some(sample.clone()));
            for cut in 0..bytes.len() {
                // The CDR of KeyedSeq ends with the baggage's last octet
                // (no padding after it): any shorter payload is torn.
                prop_assert_eq!(decode(&bytes[..cut]), None, "a payload cut at {} of {} decoded", cut, bytes.len());
            }
        }

        #[test]
        fn a_length_past_the_end_is_refused_without_allocating_it(
            seq in any::<u32>(),
            keyval in any::<u32>(),
            claimed in 1_000u32..=u32::MAX,
            present in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = vec![0x00, 0x01, 0x00, 0x00];
            bytes.extend(seq.to_le_bytes());
            bytes.extend(keyval.to_le_bytes());
            bytes.extend(claimed.to_le_bytes());
            bytes.extend(&present);
            prop_assert_eq!(decode(&bytes), None);
        }
    }

    /// The big-endian encoding too (Cyclone on a big-endian host sends it).
    #[test]
    fn big_endian_samples_decode() {
        let sample = KeyedSeq {
            seq: 7,
            keyval: 3,
            baggage: vec![1, 2, 3],
        };
        let mut bytes = vec![0x00, 0x00, 0x00, 0x00];
        bytes.extend(rustdds::cdr_encoding::to_vec::<_, byteorder::BigEndian>(&sample).expect("encode"));
        assert_eq!(decode(&bytes), Some(sample));
        assert_eq!(
            RepresentationIdentifier::from_bytes(&[0x00, 0x00]).ok(),
            Some(RepresentationIdentifier::CDR_BE)
        );
    }
}

/// A bridge in both directions on a loopback-only participant, with an
/// RTPS reader in another rustdds participant: 10,000 samples written in
/// the group reach the RTPS reader, every one, and the bridge's RTPS
/// writer is acknowledged (before, its own participant's RTPS reader was
/// matched with it and never acknowledged, and the writer stalled at
/// 8,192 samples); the group's reader gets each sample once (nothing
/// comes back in from RTPS).
#[cfg(test)]
mod two_way {
    use std::time::{Duration, Instant};

    use rustdds::policy;
    use rustdds::with_key::Sample;

    use super::{BridgeDirection, KeyedSeq, OnWire, RtpsConfig};
    use crate::dds::{DomainParticipant, ReaderQos, ResourceLimits, WriterQos};

    const SAMPLES: u32 = 10_000;

    /// The RTPS domain of a test (`lane` 0 or 1), picked from the process
    /// id: two test processes at once (two checkouts' CI runs) then rarely
    /// share one (1 in 48), and never within one process. Domains 70..166.
    fn rtps_domain(lane: u16) -> u16 {
        70 + 2 * (std::process::id() % 48) as u16 + lane
    }

    /// A participant of domain `group_domain` alone, with its RTPS gateway
    /// in RTPS domain `rtps_domain`, a topic `name`, and the reliable
    /// keep-all QoS the tests bridge and read it with.
    fn alone_with_rtps(
        group_domain: u32,
        rtps_domain: u16,
        name: &str,
    ) -> (DomainParticipant, crate::dds::Topic<KeyedSeq>, WriterQos, ReaderQos) {
        let p = DomainParticipant::builder(group_domain | std::process::id())
            .participants(1)
            .max_sample_bytes(256)
            .rtps(RtpsConfig::new(rtps_domain).loopback_only(true))
            .join()
            .expect("participant");
        let topic = p.create_topic::<KeyedSeq>(name).expect("topic");
        let wqos = WriterQos::default()
            .keep_all()
            .reliable(Duration::from_secs(10))
            .max_sample_bytes(256);
        let rqos = ReaderQos::default()
            .keep_all()
            .reliable(Duration::from_secs(10))
            .resource_limits(ResourceLimits {
                max_samples: 1 << 16,
                max_instances: 16,
                max_samples_per_instance: 1 << 16,
            });
        (p, topic, wqos, rqos)
    }

    #[test]
    fn a_two_way_bridge_delivers_past_its_history_without_stalling_or_looping() {
        let domain = rtps_domain(0);
        let (p, topic, wqos, rqos) = alone_with_rtps(0x4100_0000, domain, "two-way");
        let bridge = p
            .bridge_rtps_one_way(&topic, wqos.clone(), rqos.clone(), BridgeDirection::Both)
            .expect("a two-way bridge");
        let group_reader = p.create_reader(&topic, rqos).expect("group reader");

        // The RTPS side: another participant (as Cyclone would be).
        let (_outside, mut rtps_reader) = outside_reader(domain, "two-way", 1 << 16);
        bridge
            .wait_for_rtps_readers(1, Duration::from_secs(30))
            .expect("the outside reader matched");

        let writer = p.create_writer(&topic, wqos).expect("group writer");
        writer.wait_for_readers(2, Duration::from_secs(10)).expect("readers");
        for seq in 0..SAMPLES {
            writer
                .write(&KeyedSeq {
                    seq: seq / 4,
                    keyval: seq % 4,
                    baggage: vec![7; 16],
                })
                .expect("write");
        }
        writer
            .wait_for_acknowledgments(Duration::from_secs(60))
            .expect("acknowledged in the group");
        let acked = bridge.flush(Duration::from_secs(60)).expect("flush");
        assert!(acked, "every RTPS reader acknowledged: {:?}", bridge.counts());

        // rustdds's reader cache hands samples over by instance, not in
        // arrival order: check that every (key, seq) came, once.
        let mut seen = std::collections::HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.len() < SAMPLES as usize && Instant::now() < deadline {
            match rtps_reader.take_next_sample() {
                Ok(Some(s)) => {
                    if let Sample::Value(OnWire(v)) = s.into_value() {
                        assert!(seen.insert((v.keyval, v.seq)), "no duplicate: {v:?}");
                        assert_eq!(v.baggage, vec![7; 16], "the right bytes");
                    }
                }
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert_eq!(
            seen.len(),
            SAMPLES as usize,
            "the outside reader got every sample: {:?}",
            bridge.counts()
        );
        assert!((0..SAMPLES).all(|i| seen.contains(&(i % 4, i / 4))));

        // Nothing came back in: the group's reader has each sample once.
        let mut taken = 0u32;
        let deadline = Instant::now() + Duration::from_secs(30);
        while taken < SAMPLES && Instant::now() < deadline {
            taken += group_reader.take(1024).expect("take").len() as u32;
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(500));
        taken += group_reader.take(1024).expect("take").len() as u32;
        assert_eq!(taken, SAMPLES, "each sample once in the group: {:?}", bridge.counts());
        assert_eq!(
            bridge.counts().from_rtps,
            0,
            "no sample of the bridge's own came back in"
        );
    }

    /// An outside RTPS participant of `domain` and its reliable keep-all
    /// reader of `topic`, holding up to `max_samples` untaken.
    fn outside_reader(
        domain: u16,
        topic: &str,
        max_samples: i32,
    ) -> (
        rustdds::DomainParticipant,
        rustdds::with_key::DataReaderCdr<OnWire<KeyedSeq>>,
    ) {
        let outside = rustdds::DomainParticipantBuilder::new(domain)
            .same_host_loopback(true)
            .with_only_networks([std::net::Ipv4Addr::LOCALHOST])
            .build()
            .expect("rustdds participant");
        let qos = rustdds::QosPolicyBuilder::new()
            .reliability(policy::Reliability::Reliable {
                max_blocking_time: rustdds::Duration::from_secs(10),
            })
            .history(policy::History::KeepAll)
            // rustdds evicts past 64 untaken samples when no limit is set.
            .resource_limits(policy::ResourceLimits {
                max_samples,
                max_instances: 16,
                max_samples_per_instance: max_samples,
            })
            .build();
        let rtps_topic = outside
            .create_topic(topic.into(), "KeyedSeq".into(), &qos, rustdds::TopicKind::WithKey)
            .expect("rtps topic");
        let reader = outside
            .create_subscriber(&qos)
            .expect("subscriber")
            .create_datareader_cdr::<OnWire<KeyedSeq>>(&rtps_topic, Some(qos))
            .expect("rtps reader");
        (outside, reader)
    }

    /// Wait (bounded) until `done`; false if it never was.
    fn eventually(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        done()
    }

    /// A topic bridged out to RTPS: while no RTPS reader is matched, the
    /// bridge has no Spindle reader and the topic's writer waits for no
    /// one but its Spindle reader; an RTPS reader that matches makes the
    /// bridge's reader join (the writer then waits for it too) and gets
    /// what is written after, once each; when that reader goes, the
    /// bridge's reader leaves again. With the bridge's reader always
    /// there, the first check fails (the writer matched 2 readers).
    #[test]
    fn a_bridged_topic_holds_its_writers_back_only_while_an_rtps_reader_is_matched() {
        let domain = rtps_domain(1);
        let (p, topic, wqos, rqos) = alone_with_rtps(0x4200_0000, domain, "lazy");
        let bridge = p
            .bridge_rtps_one_way(&topic, wqos.clone(), rqos.clone(), BridgeDirection::ToRtps)
            .expect("a bridge out");
        let group_reader = p.create_reader(&topic, rqos).expect("group reader");
        let writer = p.create_writer(&topic, wqos).expect("group writer");
        writer.wait_for_readers(1, Duration::from_secs(10)).expect("readers");
        let sample = |seq: u32| KeyedSeq {
            seq,
            keyval: 0,
            baggage: vec![3; 8],
        };
        for seq in 0..100 {
            writer.write(&sample(seq)).expect("write");
        }
        writer
            .wait_for_acknowledgments(Duration::from_secs(30))
            .expect("acknowledged");
        assert_eq!(writer.matched_readers(), 1, "no RTPS reader: the bridge reads nothing");
        assert_eq!(bridge.counts().group_reader_starts, 0);
        assert_eq!(bridge.counts().to_rtps, 0);
        assert!(bridge.flush(Duration::from_secs(5)).expect("flush"), "nothing owed");

        let (outside, mut rtps_reader) = outside_reader(domain, "lazy", 1 << 12);
        bridge
            .wait_for_rtps_readers(1, Duration::from_secs(30))
            .expect("the outside reader matched");
        assert_eq!(bridge.counts().group_reader_starts, 1);
        writer
            .wait_for_readers(2, Duration::from_secs(10))
            .expect("the bridge's reader joined the topic");
        for seq in 100..300 {
            writer.write(&sample(seq)).expect("write");
        }
        writer
            .wait_for_acknowledgments(Duration::from_secs(30))
            .expect("acknowledged");
        assert!(
            bridge.flush(Duration::from_secs(30)).expect("flush"),
            "{:?}",
            bridge.counts()
        );
        assert_eq!(
            bridge.counts().to_rtps,
            200,
            "what was written after the match, once each"
        );
        let mut seen = std::collections::BTreeSet::new();
        assert!(
            eventually(Duration::from_secs(30), || {
                while let Ok(Some(s)) = rtps_reader.take_next_sample() {
                    if let Sample::Value(OnWire(v)) = s.into_value() {
                        assert!(seen.insert(v.seq), "no duplicate: {v:?}");
                    }
                }
                seen.len() == 200
            }),
            "the outside reader got {} of 200",
            seen.len()
        );
        assert!(seen.iter().copied().eq(100..300));

        drop(rtps_reader);
        drop(outside);
        assert!(
            eventually(Duration::from_secs(60), || writer.matched_readers() == 1),
            "the bridge's reader left with the last RTPS reader: {:?}",
            bridge.counts()
        );
        assert_eq!(bridge.rtps_readers_matched(), 0);
        let mut taken = 0;
        assert!(eventually(Duration::from_secs(30), || {
            taken += group_reader.take(1024).expect("take").len();
            taken == 300
        }));
        assert_eq!(bridge.failure(), None);
    }
}

#[cfg(test)]
mod sequence_gaps {
    use super::{Lost, SequenceGaps, MATCHED_ENDPOINTS_MAX};

    fn writer(n: u16) -> rustdds::GUID {
        let mut bytes = [0u8; 16];
        bytes[..2].copy_from_slice(&n.to_le_bytes());
        bytes[15] = 0x02; // a writer's entity kind
        rustdds::GUID::from_bytes(bytes)
    }

    #[test]
    fn a_skipped_run_of_sequence_numbers_is_reported_once_per_writer() {
        let mut seen = SequenceGaps::default();
        assert!(!seen.on, "on only for reliable keep-all readers (make_bridge)");
        let (a, b) = (writer(1), writer(2));
        assert_eq!(seen.take(a, 40), None, "a late reader's first sample is no loss");
        assert_eq!(seen.take(a, 41), None);
        assert_eq!(seen.take(b, 1), None, "another writer starts its own count");
        let lost = seen.take(a, 45).expect("no silent loss: 42..=44 were never taken");
        assert_eq!((lost, lost.count()), (Lost { first: 42, last: 44 }, 3));
        assert_eq!(seen.take(a, 45), None, "a repeat is no gap");
        assert_eq!(seen.take(a, 43), None, "an older number neither");
        assert_eq!(seen.take(a, 46), None, "and does not move the count back");
        assert_eq!(seen.take(b, 2), None);
        assert_eq!(seen.take(b, 1_000_002).map(|l| l.count()), Some(999_999));
        seen.forget(b);
        assert_eq!(seen.take(b, 1), None, "a writer matched again starts afresh");
        assert_eq!(seen.take(b, 3).map(|l| l.count()), Some(1));
    }

    #[test]
    fn writers_past_the_bound_are_not_followed() {
        let mut seen = SequenceGaps::default();
        for n in 0..MATCHED_ENDPOINTS_MAX as u16 {
            seen.take(writer(n), 1);
        }
        let extra = writer(MATCHED_ENDPOINTS_MAX as u16);
        assert_eq!(seen.take(extra, 1), None);
        assert_eq!(seen.take(extra, 10), None, "not followed: no count for it");
        assert_eq!(seen.last.len(), MATCHED_ENDPOINTS_MAX, "bounded");
        assert!(seen.take(writer(0), 3).is_some(), "the followed ones still are");
    }
}
