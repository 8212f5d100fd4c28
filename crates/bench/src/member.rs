//! One member process of a demo or bench run (`spindle member`, hidden):
//! joins the group, sends its share (writing every byte), delivers
//! everything (reading every byte), and writes its results for the
//! coordinator.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use spindle::config::TlsFiles;
use spindle::TcpTransport;
use spindle_fabric::tcp::TcpFabric;
use spindle_fabric::Fabric;
use spindle_group::counters::COUNTER_NAMES;
use spindle_group::delivery_log::DeliveryLog;
use spindle_group::layout::SmcLayout;
use spindle_group::{DeliveryMode, Group, GroupConfig, SendError, SenderSet};
use spindle_runtime::{monotonic_ns, IdleStrategy};

use crate::payload;
use crate::report::MemberResult;

fn default_large_message_max_bytes() -> u64 {
    spindle_group::config::defaults::LARGE_MESSAGE_MAX_BYTES
}

/// Everything a member process needs, passed as JSON by the coordinator.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberSpec {
    pub group: String,
    pub members: usize,
    pub senders: Vec<usize>,
    pub mode: String,
    pub window: usize,
    pub slot_payload_max: usize,
    /// The largest message (above `slot_payload_max` it goes as fragments).
    #[serde(default = "default_large_message_max_bytes")]
    pub large_message_max_bytes: u64,
    /// Take large messages fragment by fragment, in place
    /// (`Upcalls::takes_fragments`), instead of whole.
    #[serde(default)]
    pub large_in_place: bool,
    pub batching: bool,
    pub idle: String,
    /// Payload bytes per message (above the slot: a large message).
    pub size: usize,
    /// Messages per sender (0: no count; the run lasts `seconds`, or
    /// until stopped).
    pub count: u64,
    /// With no count: each sender sends for this long, then ends its
    /// stream (0: until stopped by a signal).
    #[serde(default)]
    pub seconds: u64,
    /// Offered rate per sender, messages/s (0: as fast as the window allows).
    pub rate: u64,
    /// Timestamp every n-th message of each sender.
    pub sample_every: u64,
    /// Senders also read every byte of their own delivered messages (off:
    /// a sender's own deliveries are checked by header only; those bytes
    /// never left its core).
    pub self_check: bool,
    /// Pin member r to CPU (pin_cpu_base + r) mod CPUs.
    #[serde(default)]
    pub pin: bool,
    /// With `pin`: the CPU of rank 0 (a shard of a `--subgroups` run
    /// starts at its first member's top-level rank, so shards do not
    /// share CPUs).
    #[serde(default)]
    pub pin_cpu_base: usize,
    pub delivery_log: Option<PathBuf>,
    /// Persistent mode: the directory of the members' logs.
    #[serde(default)]
    pub persist_dir: Option<PathBuf>,
    /// Persistent mode: `GroupConfig::compact_log_bytes` (0: never).
    #[serde(default)]
    pub compact_log_bytes: u64,
    pub result_dir: PathBuf,
    pub join_timeout_ms: u64,
    /// "shm" (default), "tcp", or "ofi" / `"ofi:<provider>"` (libfabric,
    /// feature `ofi`; its control plane uses the tcp fields below).
    #[serde(default)]
    pub transport: String,
    /// tcp: `host:port` of every member, by rank.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// tcp: listen here instead of `addresses[rank]`.
    #[serde(default)]
    pub listen: Option<String>,
    /// tcp: the group key, hex (the coordinator makes a fresh one per run;
    /// `spindle run` reads it from the key file).
    #[serde(default)]
    pub key_hex: String,
    /// tcp: a peer silent for this long is gone (0: the fabric's default).
    #[serde(default)]
    pub peer_timeout_ms: u64,
    /// Membership changes on (the default) or a static group.
    #[serde(default = "membership_default")]
    pub membership: bool,
    /// Heartbeat suspicion timeout (0: the group layer's default).
    #[serde(default)]
    pub suspect_timeout_ms: u64,
    /// tcp: refuse a connection whose source address is not the
    /// configured address of the member it claims to be
    /// (`group.check_source_addr`).
    #[serde(default = "check_source_addr_default")]
    pub check_source_addr: bool,
    /// tcp: TLS with these PEM files (`group.tls_*`), or plain tcp.
    #[serde(default)]
    pub tls: Option<TlsPaths>,
    /// tcp: how long one accepted connection may take to handshake (0:
    /// the fabric's default).
    #[serde(default)]
    pub handshake_timeout_ms: u64,
    /// tcp: accepted connections handshaking at once (0: the fabric's
    /// default).
    #[serde(default)]
    pub handshakes_pending_max: usize,
    /// Bytes a sender writes before it runs the progress loop again
    /// (0: [`BURST_BYTES`]).
    #[serde(default)]
    pub burst_bytes: usize,
}

/// The TLS files of a tcp member (see [`spindle::config::TlsFiles`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TlsPaths {
    /// This member's certificate chain (PEM).
    pub cert: PathBuf,
    /// This member's private key (PEM).
    pub key: PathBuf,
    /// The group's CA certificate (PEM).
    pub ca: PathBuf,
}

fn check_source_addr_default() -> bool {
    true
}

fn membership_default() -> bool {
    spindle_group::config::defaults::MEMBERSHIP
}

impl MemberSpec {
    pub fn group_config(&self) -> Result<GroupConfig, String> {
        let mut config = GroupConfig::new(&self.group, self.members);
        config.senders = SenderSet::Ranks(self.senders.clone());
        config.mode = DeliveryMode::parse(&self.mode)?;
        config.persist_dir = self.persist_dir.clone();
        config.compact_log_bytes = self.compact_log_bytes;
        config.window_slots = self.window;
        config.slot_payload_max = self.slot_payload_max;
        config.large_message_max_bytes = self.large_message_max_bytes;
        config.batching = self.batching;
        config.idle = parse_idle(&self.idle).map_err(|e| e.to_string())?;
        config.join_timeout = Duration::from_millis(self.join_timeout_ms);
        config.membership = self.membership;
        if self.suspect_timeout_ms > 0 {
            config.suspect_timeout = Duration::from_millis(self.suspect_timeout_ms);
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// The tcp transport of this run (addresses, key, TLS, checks).
    pub fn tcp_transport(&self) -> Result<TcpTransport, String> {
        let addresses = self
            .addresses
            .iter()
            .enumerate()
            .map(|(r, a)| spindle::config::resolve(a).map_err(|e| format!("address of member {r}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let key = spindle::config::hex_decode(&self.key_hex).map_err(|e| format!("group key: {e}"))?;
        let mut tcp = TcpTransport::new(addresses, key);
        tcp.listen = match &self.listen {
            Some(l) => Some(spindle::config::resolve(l).map_err(|e| format!("listen address: {e}"))?),
            None => None,
        };
        tcp.check_source_addr = self.check_source_addr;
        tcp.tls = self.tls.as_ref().map(|t| TlsFiles {
            cert: t.cert.clone(),
            key: t.key.clone(),
            ca: t.ca.clone(),
        });
        if self.peer_timeout_ms > 0 {
            tcp.peer_timeout = Duration::from_millis(self.peer_timeout_ms);
        }
        if self.handshake_timeout_ms > 0 {
            tcp.handshake_timeout = Duration::from_millis(self.handshake_timeout_ms);
        }
        if self.handshakes_pending_max > 0 {
            tcp.handshakes_pending_max = self.handshakes_pending_max;
        }
        Ok(tcp)
    }

    pub fn result_path(dir: &Path, rank: usize) -> PathBuf {
        dir.join(format!("member-{rank}.json"))
    }

    pub fn latency_path(dir: &Path, rank: usize) -> PathBuf {
        dir.join(format!("latency-{rank}.bin"))
    }
}

pub use spindle::config::parse_idle;

/// Bytes a sender writes before it runs the progress loop again (by
/// default).
pub const BURST_BYTES: usize = 64 << 10;

/// One latency sample: (sender rank, sender's counter, ns).
pub type Sample = (u32, u64, u32);

#[derive(Args, Debug)]
pub struct MemberArgs {
    /// The run's specification (JSON).
    #[arg(long)]
    spec: String,
    /// This member's rank.
    #[arg(long)]
    rank: usize,
}

pub fn run(args: MemberArgs) -> Result<(), String> {
    let spec: MemberSpec = serde_json::from_str(&args.spec).map_err(|e| format!("bad --spec: {e}"))?;
    let rank = args.rank;
    run_member(&spec, rank).map_err(|e| format!("member {rank}: {e}"))
}

/// What the delivery callback accumulates.
struct Tally {
    delivered_msgs: u64,
    delivered_bytes: u64,
    checksums: Vec<u64>,
    samples: Vec<Sample>,
    /// Order-sensitive hash chain over (sender, index, len).
    digest: u64,
    log: Option<DeliveryLog>,
    log_error: Option<String>,
    /// Data messages delivered from each sender rank, across views.
    delivered_by_rank: [u64; spindle_fabric::MEMBERS_MAX],
    /// Sender ranks whose end marker was delivered (runs without a count).
    ended_ranks: u64,
    /// Messages of an earlier run handed over again from this member's
    /// persistent log at a restart (views before the first view of this
    /// run): history, not this run's traffic, so not in the figures above.
    replayed_msgs: u64,
    /// Messages this member's state covers, across runs: what a
    /// persistent log compacts to (`group.compact_log_bytes`): the
    /// member's only state is how much history it has applied.
    history_msgs: u64,
}

/// The counter field of a sender's last message in a run without a count
/// (`--seconds`, or a service stopped by a signal): it says "nothing
/// follows from me". Not counted as a delivery, not in the checksums.
pub const END_MARKER_COUNTER: u64 = u64::MAX;

/// Whether a run is over for this member (see [`drive`]).
fn run_complete<F: Fabric>(group: &Group<F>, spec: &MemberSpec, tally: &Tally) -> bool {
    let view = group.core();
    view.sender_ranks().iter().all(|&r| {
        if spec.count > 0 {
            tally.delivered_by_rank[r] >= spec.count
        } else {
            tally.ended_ranks & (1 << r) != 0
        }
    })
}

/// The member's upcalls: deliveries (checked and counted), nulls and view
/// installations (into the delivery log).
struct Deliverer<'a> {
    tally: &'a mut Tally,
    rank: usize,
    self_check: bool,
    views_logged: u64,
    /// The view this run started in: a delivery from an earlier view is
    /// the history a persistent restart replays.
    first_view: u64,
    /// Large messages are taken in place (`MemberSpec::large_in_place`):
    /// per sender rank, what the fragments of its message so far add up
    /// to. Made before the run (nothing is allocated as fragments come).
    staged: Option<Vec<StagedLarge>>,
}

/// A large message taken in place, fragment by fragment: its header
/// (from its first fragment), the checksum of its bytes so far, and, with
/// a delivery log, their hash so far.
struct StagedLarge {
    message_id: u64,
    header: Option<(u64, u64)>,
    sum: u64,
    hasher: Option<Box<xxhash_rust::xxh3::Xxh3>>,
}

/// One message delivered, whole or put together in place.
struct Delivered {
    view: u64,
    sender_rank: usize,
    sender_index: usize,
    index: u64,
    seq: u64,
    len: u64,
    /// Its (send timestamp, counter), when it is long enough for them.
    header: Option<(u64, u64)>,
}

impl Deliverer<'_> {
    fn new<'a>(tally: &'a mut Tally, spec: &MemberSpec, rank: usize, first_view: u64) -> Deliverer<'a> {
        let logging = tally.log.is_some();
        let staged = spec.large_in_place.then(|| {
            (0..spindle_fabric::MEMBERS_MAX)
                .map(|_| StagedLarge {
                    message_id: 0,
                    header: None,
                    sum: 0,
                    hasher: logging.then(|| Box::new(xxhash_rust::xxh3::Xxh3::new())),
                })
                .collect()
        });
        Deliverer {
            tally,
            rank,
            self_check: spec.self_check,
            views_logged: 0,
            first_view,
            staged,
        }
    }

    /// Whether this member reads every byte of `sender_rank`'s messages.
    #[inline]
    fn checks(&self, sender_rank: usize) -> bool {
        sender_rank != self.rank || self.self_check
    }

    /// Count one delivered message (its bytes' checksum `sum`; `xxh3`
    /// gives their hash for the delivery log, asked only when there is
    /// one).
    #[inline]
    fn account(&mut self, d: Delivered, sum: u64, xxh3: impl FnOnce() -> u64) {
        let tally = &mut *self.tally;
        tally.history_msgs += 1;
        if d.view < self.first_view {
            tally.replayed_msgs += 1;
            return;
        }
        if let Some(log) = tally.log.as_mut() {
            if let Err(e) = log.record_hashed(d.view, d.sender_rank, d.index, d.seq, d.len, xxh3()) {
                tally.log_error.get_or_insert(e.to_string());
            }
        }
        if let Some((ts, counter)) = d.header {
            if counter == END_MARKER_COUNTER {
                tally.ended_ranks |= 1 << d.sender_rank;
                return;
            }
            if ts != 0 && tally.samples.len() < tally.samples.capacity() {
                let ns = monotonic_ns().saturating_sub(ts).min(u32::MAX as u64) as u32;
                tally.samples.push((d.sender_rank as u32, counter, ns));
            }
        }
        tally.checksums[d.sender_index] = tally.checksums[d.sender_index].wrapping_add(sum);
        tally.delivered_msgs += 1;
        tally.delivered_bytes += d.len;
        tally.delivered_by_rank[d.sender_rank] += 1;
        tally.digest = (tally.digest ^ ((d.sender_rank as u64) << 56 ^ d.index ^ d.len << 40))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

/// The (send timestamp, counter) at the head of a bench payload.
#[inline]
fn header_of(bytes: &[u8]) -> Option<(u64, u64)> {
    (bytes.len() >= payload::PAYLOAD_BYTES_MIN).then(|| payload::header(bytes))
}

impl spindle_group::Upcalls for Deliverer<'_> {
    #[inline]
    fn deliver(&mut self, d: &spindle_group::Delivery<'_>) {
        let sum = if self.checks(d.sender_rank) {
            payload::checksum(d.payload)
        } else {
            0
        };
        let delivered = Delivered {
            view: d.view,
            sender_rank: d.sender_rank,
            sender_index: d.sender_index,
            index: d.index,
            seq: d.seq,
            len: d.payload.len() as u64,
            header: header_of(d.payload),
        };
        self.account(delivered, sum, || xxhash_rust::xxh3::xxh3_64(d.payload));
    }

    fn takes_fragments(&self) -> bool {
        self.staged.is_some()
    }

    /// A fragment, read where it lies: its checksum (and hash) is added
    /// to its message's, which is counted at its last fragment. The
    /// checksum sums 8-byte words, and every fragment but the last holds
    /// a multiple of 8 bytes, so the sum is the whole message's.
    #[inline]
    fn deliver_fragment(&mut self, f: &spindle_group::FragmentDelivery<'_>) {
        let checks = self.checks(f.sender_rank);
        let staged = self.staged.as_mut().expect("fragments only when taken in place");
        let st = &mut staged[f.sender_rank];
        if f.offset == 0 {
            st.message_id = f.message_id;
            st.header = header_of(f.data);
            st.sum = 0;
            if let Some(h) = st.hasher.as_mut() {
                h.reset();
            }
        }
        debug_assert_eq!(
            st.message_id, f.message_id,
            "no gaps: the fragments of one message at a time"
        );
        if checks {
            st.sum = st.sum.wrapping_add(payload::checksum(f.data));
        }
        if let Some(h) = st.hasher.as_mut() {
            h.update(f.data);
        }
        if !f.is_last() {
            return;
        }
        let (sum, header) = (st.sum, st.header);
        let hash = st.hasher.as_ref().map_or(0, |h| h.digest());
        let delivered = Delivered {
            view: f.view,
            sender_rank: f.sender_rank,
            sender_index: f.sender_index,
            index: f.index,
            seq: f.seq,
            len: f.total_len,
            header,
        };
        self.account(delivered, sum, || hash);
    }

    fn null_passed(&mut self, view: u64, sender_rank: usize, index: u64) {
        if let Some(log) = self.tally.log.as_mut() {
            if let Err(e) = log.record_null(view, sender_rank, index) {
                self.tally.log_error.get_or_insert(e.to_string());
            }
        }
    }

    fn snapshot(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.tally.history_msgs.to_le_bytes());
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let bytes: [u8; 8] = snapshot
            .try_into()
            .map_err(|_| format!("a run member's snapshot is 8 bytes, not {}", snapshot.len()))?;
        self.tally.history_msgs = u64::from_le_bytes(bytes);
        Ok(())
    }

    fn takes_snapshots(&self) -> bool {
        true
    }

    fn view_installed(&mut self, view: &spindle_group::View) {
        if self.views_logged > 0 {
            eprintln!(
                "member {}: view {} installed: members {:?}",
                self.rank, view.id, view.members
            );
        }
        self.views_logged += 1;
        if let Some(log) = self.tally.log.as_mut() {
            // Every view change is on disk before the view's first delivery.
            if let Err(e) = log.record_view(view.id, &view.members).and_then(|()| log.flush()) {
                self.tally.log_error.get_or_insert(e.to_string());
            }
        }
    }
}

pub fn run_member(spec: &MemberSpec, rank: usize) -> Result<(), String> {
    run_member_until(spec, rank, &AtomicBool::new(false))
}

/// [`run_member`] that also ends when `stop` is set (a signal): it stops
/// sending, leaves the group (the others install a view without it at
/// once) and writes its results.
pub fn run_member_until(spec: &MemberSpec, rank: usize, stop: &AtomicBool) -> Result<(), String> {
    let config = spec.group_config()?;
    if spec.pin {
        pin_to_cpu(spec.pin_cpu_base + rank)?;
    }
    let senders = spec.senders.len() as u64;
    let samples_max = if spec.count > 0 {
        (spec.count / spec.sample_every.max(1) + 1) * senders
    } else {
        SAMPLES_MAX_UNBOUNDED
    };
    let log = match &spec.delivery_log {
        Some(dir) => {
            Some(DeliveryLog::create(dir, rank).map_err(|e| format!("delivery log in {}: {e}", dir.display()))?)
        }
        None => None,
    };
    let tally = Tally {
        delivered_msgs: 0,
        delivered_bytes: 0,
        checksums: vec![0; spec.senders.len()],
        samples: Vec::with_capacity(samples_max as usize),
        digest: 0,
        log,
        log_error: None,
        delivered_by_rank: [0; spindle_fabric::MEMBERS_MAX],
        ended_ranks: 0,
        replayed_msgs: 0,
        history_msgs: 0,
    };
    match spec.transport.as_str() {
        "" | "shm" => {
            let group = Group::join_shm(config, rank).map_err(|e| e.to_string())?;
            drive(group, spec, rank, tally, stop)
        }
        "tcp" => {
            // The one recipe for a tcp group's options (row layout, send
            // stall below the suspicion timeout, coalescing, stat file).
            let layout = SmcLayout::new(&config);
            let options = spindle::transport::tcp_options(&spec.tcp_transport()?, &config, &layout, rank, false)
                .map_err(|e| e.to_string())?;
            let fabric = TcpFabric::open(&options, rank).map_err(|e| e.to_string())?;
            let group = Group::join(Arc::new(fabric), config).map_err(|e| e.to_string())?;
            drive(group, spec, rank, tally, stop)
        }
        other if is_ofi(other) => ofi_member(spec, config, rank, tally, stop),
        other => Err(format!(
            "unknown transport '{other}': expected shm, tcp, ofi or ofi:<provider>"
        )),
    }
}

/// Whether `transport` names the ofi fabric: `ofi` (libfabric's `tcp`
/// provider) or `ofi:<provider>` (`ofi:verbs`, `ofi:efa`, ...).
pub use spindle::config::is_ofi;

/// The provider an `ofi[:<provider>]` transport names.
pub fn ofi_provider(transport: &str) -> &str {
    transport.strip_prefix("ofi:").unwrap_or("tcp")
}

/// A member over the ofi fabric: the tcp recipe's options (row layout,
/// send stall, addresses and key) become the control plane's.
#[cfg(feature = "ofi")]
fn ofi_member(
    spec: &MemberSpec,
    config: GroupConfig,
    rank: usize,
    tally: Tally,
    stop: &AtomicBool,
) -> Result<(), String> {
    let layout = SmcLayout::new(&config);
    let tcp = spindle::transport::tcp_options(&spec.tcp_transport()?, &config, &layout, rank, false)
        .map_err(|e| e.to_string())?;
    let options = spindle::transport::ofi_options(tcp, ofi_provider(&spec.transport));
    let fabric = spindle_fabric::ofi::OfiFabric::open(&options, rank).map_err(|e| e.to_string())?;
    let group = Group::join(Arc::new(fabric), config).map_err(|e| e.to_string())?;
    drive(group, spec, rank, tally, stop)
}

#[cfg(not(feature = "ofi"))]
fn ofi_member(
    spec: &MemberSpec,
    _config: GroupConfig,
    _rank: usize,
    _tally: Tally,
    _stop: &AtomicBool,
) -> Result<(), String> {
    Err(format!(
        "--transport {}: this spindle was built without libfabric support; rebuild with \
         `cargo build --release -p spindle-cli --features ofi` (needs libfabric-dev)",
        spec.transport
    ))
}

/// Latency samples kept by a run without a count (the first ones).
const SAMPLES_MAX_UNBOUNDED: u64 = 1 << 20;

/// How long a member stopped by a signal waits for the others to install
/// a view without it.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Send this member's share and deliver everything, then write the results.
///
/// When it ends:
/// - with a count: once every sender of the *current* view has had
///   `count` messages delivered here. A sender removed by a view change
///   is not waited for (its messages up to the ragged edge were delivered
///   before the view was installed); a sender that stays gets every one
///   of its messages delivered (what a ragged edge trimmed, it publishes
///   again in the next view);
/// - without a count (`seconds`, or none: until stopped): each sender
///   ends its stream with an end marker when its time is up, and the run
///   is over once every current sender's marker was delivered;
/// - when `stop` is set: at once, by leaving the group.
fn drive<F: Fabric>(
    mut group: Group<F>,
    spec: &MemberSpec,
    rank: usize,
    mut tally: Tally,
    stop: &AtomicBool,
) -> Result<(), String> {
    let sender = group.sender();
    let interval_ns = 1_000_000_000u64.checked_div(spec.rate).unwrap_or(0);
    let t0 = monotonic_ns();
    let deadline_ns = if spec.seconds > 0 {
        t0 + spec.seconds * 1_000_000_000
    } else {
        u64::MAX
    };
    let mut next_send_ns = t0;
    let mut t_last = t0;
    let mut sent = 0u64;
    // Runs without a count end their stream with a marker.
    let mut end_marker_sent = spec.count > 0;
    // Sender bursts are sized in bytes so that the member's own delivery
    // of a burst still finds it in its L2 cache.
    let burst_bytes = if spec.burst_bytes > 0 {
        spec.burst_bytes
    } else {
        BURST_BYTES
    };
    let burst_msgs = (burst_bytes / spec.size.max(1)).clamp(1, 64) as u64;
    let mut sent_checksum = 0u64;
    // The large message being sent: its fragments, timestamp and counter.
    let mut large_tx: Option<LargeInFlight<F>> = None;
    let mut deliverer = Deliverer::new(&mut tally, spec, rank, 0);
    // A persistent member that a restart left out comes back joining
    // (its log set aside): it runs once admitted, from the state sent to
    // it.
    group.wait_admitted(&mut deliverer).map_err(|e| e.to_string())?;
    deliverer.first_view = group.view().id;
    // On tcp a rate-limited sender waiting for its next send time parks on
    // the doorbell until then (a peer's progress wakes it at once); on shm
    // it keeps polling (counted as work) so the idle strategy never parks
    // past it. A member told to spin (`--idle spin`) never parks.
    let park_until_send = spec.transport == "tcp" && group.config().idle != IdleStrategy::BusySpin;
    let mut stopped = false;
    loop {
        if stop.load(Ordering::Relaxed) {
            stopped = true;
            break;
        }
        let mut app_work = 0u32;
        let mut wait_ns = 0u64;
        // Whether this member's stream is still open: messages left to
        // send, or (no count) the end marker not sent yet.
        let sending = if spec.count > 0 {
            sent < spec.count
        } else {
            !end_marker_sent
        };
        if let (Some(s), true) = (&sender, sending) {
            let now = if interval_ns > 0 || spec.count == 0 {
                monotonic_ns()
            } else {
                0
            };
            if spec.count == 0 && now >= deadline_ns {
                end_marker_sent = send_end_marker(s, spec)?;
                app_work += 1;
            } else if interval_ns == 0 || now >= next_send_ns {
                if spec.size > spec.slot_payload_max {
                    // Bigger than a slot: fragments, as many per pass as
                    // the window has room for; the pace counts messages.
                    let (n, progressed) = send_large_step(s, spec, sent, &mut large_tx, &mut sent_checksum)?;
                    sent += n;
                    app_work += progressed as u32;
                    if interval_ns > 0 && n > 0 {
                        next_send_ns += interval_ns;
                    }
                } else {
                    let burst = if interval_ns > 0 { 1 } else { burst_msgs };
                    let n = send_burst(s, spec, sent, burst, &mut sent_checksum)?;
                    sent += n;
                    app_work += n as u32;
                    if interval_ns > 0 {
                        next_send_ns += interval_ns;
                    }
                }
            } else if park_until_send {
                wait_ns = (next_send_ns - now).min(deadline_ns.saturating_sub(now));
            } else {
                app_work += 1;
            }
        } else if sender.is_none() && spec.count == 0 && !end_marker_sent && monotonic_ns() >= deadline_ns {
            // A member that does not send has no stream to end.
            end_marker_sent = true;
        }
        let before = group.core().counters().values[spindle_group::counters::DELIVERED_MSGS];
        let work = group.poll(&mut deliverer).map_err(|e| e.to_string())?;
        if wait_ns > 0 && work == 0 {
            let bell = group.core().fabric().doorbell();
            let ticket = bell.prepare_park();
            if group.core().has_work() {
                bell.cancel_park();
            } else {
                bell.park(ticket, Duration::from_nanos(wait_ns));
            }
        } else {
            group.idle(work + app_work);
        }
        let after = group.core().counters().values[spindle_group::counters::DELIVERED_MSGS];
        if after != before {
            t_last = monotonic_ns();
        }
        if let Some(log) = deliverer.tally.log.as_mut() {
            // A crash loses at most the last FLUSH_INTERVAL_NS of the log.
            if let Err(e) = log.flush_if_due(monotonic_ns()) {
                deliverer.tally.log_error.get_or_insert(e.to_string());
            }
        }
        let own_stream_done = end_marker_sent && (spec.count == 0 || sent >= spec.count || sender.is_none());
        if own_stream_done && run_complete(&group, spec, deliverer.tally) {
            break;
        }
    }
    // Alone in the view, there is nobody to tell.
    if stopped && group.config().membership && group.view().members.len() > 1 {
        // Leave: the others install a view without this member at once
        // (no suspicion timeout), and deliver what it sent up to the edge.
        let view = group.view().id;
        group.leave(&mut deliverer, LEAVE_TIMEOUT).map_err(|e| e.to_string())?;
        if let Some(log) = deliverer.tally.log.as_mut() {
            if let Err(e) = log.record_left(view) {
                deliverer.tally.log_error.get_or_insert(e.to_string());
            }
        }
    } else if !stopped {
        group
            .finish_together(&mut deliverer, Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
    }
    let counters: BTreeMap<String, u64> = COUNTER_NAMES
        .iter()
        .zip(group.core().counters().values.iter())
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    let current = group.view();
    let views_logged = deliverer.views_logged;
    drop(group);
    if let Some(e) = tally.log_error.take() {
        return Err(format!("writing the delivery log: {e}"));
    }
    if let Some(log) = tally.log.as_mut() {
        if views_logged == 0 {
            log.record_view(current.id, &current.members)
                .map_err(|e| format!("write the delivery log: {e}"))?;
        }
        log.flush().map_err(|e| format!("flush delivery log: {e}"))?;
    }
    let elapsed_ns = (t_last - t0).max(1);
    let result = MemberResult {
        rank,
        delivered_msgs: tally.delivered_msgs,
        delivered_bytes: tally.delivered_bytes,
        elapsed_ns,
        t0_ns: t0,
        t_last_ns: t_last,
        delivered_gbps: tally.delivered_bytes as f64 / elapsed_ns as f64,
        delivered_msgs_per_s: tally.delivered_msgs as f64 * 1e9 / elapsed_ns as f64,
        checksum_by_sender: spec
            .senders
            .iter()
            .copied()
            .zip(tally.checksums.iter().copied())
            .filter(|(s, _)| *s != rank || spec.self_check)
            .collect(),
        sent_checksum,
        sequence_digest: format!("{:016x}", tally.digest),
        counters,
    };
    write_results(spec, rank, &result, &tally.samples)
}

/// Commit this sender's end marker; returns whether it went (a full
/// window: not yet).
fn send_end_marker<F: Fabric>(s: &spindle_group::Sender<F>, spec: &MemberSpec) -> Result<bool, String> {
    match s.reserve(spec.size) {
        Ok(mut slot) => {
            payload::fill(slot.payload_mut(), 0, END_MARKER_COUNTER);
            slot.commit();
            Ok(true)
        }
        Err(SendError::WouldBlock) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// A large message being sent: (its fragments, send timestamp, counter).
type LargeInFlight<F> = (spindle_group::LargeSend<F>, u64, u64);

/// Send the next fragments of message `sent` (bigger than a slot), filled
/// in place in the ring; returns (messages completed: 0 or 1, whether any
/// fragment went).
fn send_large_step<F: Fabric>(
    s: &spindle_group::Sender<F>,
    spec: &MemberSpec,
    sent: u64,
    large_tx: &mut Option<LargeInFlight<F>>,
    sent_checksum: &mut u64,
) -> Result<(u64, bool), String> {
    if large_tx.is_none() {
        let ts = if sent.is_multiple_of(spec.sample_every) {
            monotonic_ns()
        } else {
            0
        };
        let tx = s.send_large(spec.size).map_err(|e| e.to_string())?;
        *large_tx = Some((tx, ts, sent));
    }
    let (tx, ts, counter) = large_tx.as_mut().expect("started above");
    let (ts, counter, size) = (*ts, *counter, spec.size);
    let before = tx.sent_bytes();
    let done = tx
        .push_with(|offset, out| payload::fill_at(out, offset, size, ts, counter))
        .map_err(|e| e.to_string())?;
    let progressed = tx.sent_bytes() > before;
    if !done {
        return Ok((0, progressed));
    }
    *large_tx = None;
    *sent_checksum = sent_checksum.wrapping_add(payload::expected_checksum(size, ts, counter));
    Ok((1, true))
}

/// Send up to `burst` messages; returns how many were committed. The
/// slots are reserved together (one atomic for the burst, not one per
/// message), and no more are reserved than are sent.
#[inline]
fn send_burst<F: Fabric>(
    s: &spindle_group::Sender<F>,
    spec: &MemberSpec,
    sent: u64,
    burst: u64,
    sent_checksum: &mut u64,
) -> Result<u64, String> {
    let want = if spec.count == 0 {
        burst
    } else {
        burst.min(spec.count.saturating_sub(sent))
    };
    if want == 0 {
        return Ok(0);
    }
    let mut batch = match s.reserve_batch(want as usize, spec.size) {
        Ok(batch) => batch,
        Err(SendError::WouldBlock) => return Ok(0),
        Err(e) => return Err(e.to_string()),
    };
    let mut n = 0;
    while let Some(mut slot) = batch.next_slot() {
        let counter = sent + n;
        let ts = if counter.is_multiple_of(spec.sample_every) {
            monotonic_ns()
        } else {
            0
        };
        payload::fill(slot.payload_mut(), ts, counter);
        slot.commit();
        *sent_checksum = sent_checksum.wrapping_add(payload::expected_checksum(spec.size, ts, counter));
        n += 1;
    }
    debug_assert!(n >= 1 && n <= want, "a burst sends what its batch reserved, no more");
    Ok(n)
}

fn write_results(spec: &MemberSpec, rank: usize, result: &MemberResult, samples: &[Sample]) -> Result<(), String> {
    let path = MemberSpec::result_path(&spec.result_dir, rank);
    let json = serde_json::to_vec_pretty(result).map_err(|e| e.to_string())?;
    std::fs::write(&path, json).map_err(|e| format!("write {}: {e}", path.display()))?;
    let path = MemberSpec::latency_path(&spec.result_dir, rank);
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?);
    for (sender, counter, ns) in samples {
        out.write_all(&sender.to_le_bytes())
            .and_then(|_| out.write_all(&counter.to_le_bytes()))
            .and_then(|_| out.write_all(&ns.to_le_bytes()))
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    out.flush().map_err(|e| format!("write {}: {e}", path.display()))
}

/// Pin the calling thread to CPU `index mod CPUs`.
pub fn pin_to_cpu(index: usize) -> Result<(), String> {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let cpu = index % cpus;
    // SAFETY: cpu_set_t is plain data (all-zero is the empty set); CPU_SET
    // writes inside it (cpu < CPU_SETSIZE since cpus is small), and
    // sched_setaffinity reads it for the duration of the call.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!("pin to CPU {cpu}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Read a member's latency samples.
pub fn read_samples(dir: &Path, rank: usize) -> Result<Vec<Sample>, String> {
    let path = MemberSpec::latency_path(dir, rank);
    let bytes = std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    if bytes.len() % 16 != 0 {
        return Err(format!("{} is truncated", path.display()));
    }
    Ok(bytes
        .chunks_exact(16)
        .map(|c| {
            let sender = u32::from_le_bytes(c[0..4].try_into().expect("4"));
            let counter = u64::from_le_bytes(c[4..12].try_into().expect("8"));
            let ns = u32::from_le_bytes(c[12..16].try_into().expect("4"));
            (sender, counter, ns)
        })
        .collect())
}
