//! [`DomainParticipant`]: a member of a domain's group, its progress
//! thread, and the upcalls that route samples to readers.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spindle_dds::discovery::{Discovery, Event, Unmatch};
use spindle_dds::history::WriterHistory;
use spindle_dds::napa::NapaConfig;
use spindle_dds::qos::{Durability, History, Partition, ReaderQos, Reliability, WriterQos};
use spindle_dds::types::{endpoint_id, IdHashMap, ReaderId, SampleMeta, TopicType, WriterId};
use spindle_dds::wire::{self, Announce, SampleHeader, MSG_READER, MSG_RETIRE, MSG_SAMPLE, MSG_WRITER};
use spindle_group::{Delivery, GroupConfig, SenderSet, Upcalls, View};
use spindle_runtime::{monotonic_ns, realtime_ns, IdleStrategy};

use super::reader::{DataReader, ReaderShared};
use super::writer::{DataWriter, WriterShared};
use super::DdsError;
use crate::group::Group;
use crate::transport::Transport;
use crate::{GroupBuilder, Sender};

/// Settings of a participant; every one has a safe default.
pub struct ParticipantBuilder {
    domain_id: u32,
    participants: usize,
    rank: usize,
    transport: Transport,
    initial_members: Option<Vec<usize>>,
    max_sample_bytes: usize,
    /// 0: derived from the slot size ([`WINDOW_BYTES_DEFAULT`]).
    window_slots: usize,
    ack_every: u32,
    suspect_timeout: Duration,
    join_timeout: Duration,
    idle: IdleStrategy,
    snapshot_bytes_max: usize,
    #[cfg(feature = "rtps")]
    rtps: Option<super::rtps::RtpsConfig>,
}

/// The largest sample a participant's slots carry by default.
pub const MAX_SAMPLE_BYTES_DEFAULT: usize = 64 << 10;
/// The send window's size in bytes by default: the window holds as many
/// slots (a power of two, [`WINDOW_SLOTS_MIN`]..=[`WINDOW_SLOTS_MAX`]) as
/// fit (64 slots of 64 KiB samples, 1024 slots of small ones).
pub const WINDOW_BYTES_DEFAULT: usize = 8 << 20;
/// The fewest slots a derived window has.
pub const WINDOW_SLOTS_MIN: usize = 16;
/// The most slots a derived window has.
pub const WINDOW_SLOTS_MAX: usize = 1024;
/// Readers acknowledge at least every this many samples by default (K).
pub const ACK_EVERY_DEFAULT: u32 = 10;

impl ParticipantBuilder {
    /// How many participants the domain holds (the group's ranks; default 2).
    pub fn participants(mut self, n: usize) -> Self {
        self.participants = n;
        self
    }

    /// This participant's rank (`0..participants`; default 0).
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// Shared memory (the default) or tcp.
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// The participants that start the domain together (default: all);
    /// the others join it later.
    pub fn initial_members(mut self, ranks: Vec<usize>) -> Self {
        self.initial_members = Some(ranks);
        self
    }

    /// The largest serialized sample any writer of this participant
    /// writes (default 64 KiB; every participant of a domain must agree).
    pub fn max_sample_bytes(mut self, bytes: usize) -> Self {
        self.max_sample_bytes = bytes;
        self
    }

    /// Slots of the send window (a power of two; by default as many as
    /// fit in 8 MiB, between 16 and 1024).
    pub fn window_slots(mut self, slots: usize) -> Self {
        self.window_slots = slots;
        self
    }

    /// Readers acknowledge at least every `k` samples (default 10).
    pub fn ack_every(mut self, k: u32) -> Self {
        self.ack_every = k;
        self
    }

    /// A participant silent this long is gone (default 500 ms): the
    /// shortest liveliness lease a writer may offer.
    pub fn suspect_timeout(mut self, timeout: Duration) -> Self {
        self.suspect_timeout = timeout;
        self
    }

    /// How long `join` waits for the other initial participants.
    pub fn join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// How the progress thread waits when idle.
    pub fn idle(mut self, idle: IdleStrategy) -> Self {
        self.idle = idle;
        self
    }

    /// The largest state a joining participant receives (discovery and
    /// the transient-local histories; default 1 MiB).
    pub fn snapshot_bytes_max(mut self, bytes: usize) -> Self {
        self.snapshot_bytes_max = bytes;
        self
    }

    /// Speak DDSI-RTPS too (off by default): topics bridged with
    /// [`DomainParticipant::bridge_rtps`] reach, and hear from, other DDS
    /// implementations (Cyclone DDS, Fast DDS, RTI Connext, ROS 2) over
    /// UDP; see [`super::rtps`].
    #[cfg(feature = "rtps")]
    pub fn rtps(mut self, config: super::rtps::RtpsConfig) -> Self {
        self.rtps = Some(config);
        self
    }

    /// The group layer's configuration this participant runs on.
    pub fn group_config(&self) -> GroupConfig {
        let mut config = GroupConfig::new(&format!("dds-{}", self.domain_id), self.participants);
        config.senders = SenderSet::All;
        config.slot_payload_max = (wire::SAMPLE_HEADER_BYTES + self.max_sample_bytes).max(wire::ANNOUNCE_BYTES_MAX);
        config.window_slots = match self.window_slots {
            0 => {
                let fit = WINDOW_BYTES_DEFAULT / spindle_group::layout::slot_stride(config.slot_payload_max);
                let pow2 = if fit.is_power_of_two() {
                    fit
                } else {
                    fit.next_power_of_two() / 2
                };
                pow2.clamp(WINDOW_SLOTS_MIN, WINDOW_SLOTS_MAX)
            }
            slots => slots,
        };
        config.ack_every_slots = self.ack_every;
        config.track_acks = true;
        config.suspect_timeout = self.suspect_timeout;
        config.peer_check_interval = (self.suspect_timeout / 5).max(Duration::from_millis(1));
        config.join_timeout = self.join_timeout;
        config.idle = self.idle;
        config.initial_members = self.initial_members.clone();
        config.snapshot_bytes_max = self.snapshot_bytes_max;
        config
    }

    /// Join the domain (waits for the other initial participants, or is
    /// admitted to the running domain for a rank outside the initial
    /// ones) and start the progress thread.
    pub fn join(self) -> Result<DomainParticipant, DdsError> {
        if self.max_sample_bytes == 0
            || self.max_sample_bytes > spindle_group::config::defaults::SLOT_PAYLOAD_MAX_MAX - wire::SAMPLE_HEADER_BYTES
        {
            return Err(DdsError::Config(format!(
                "max_sample_bytes = {} must be in 1..={}",
                self.max_sample_bytes,
                spindle_group::config::defaults::SLOT_PAYLOAD_MAX_MAX - wire::SAMPLE_HEADER_BYTES
            )));
        }
        let config = self.group_config();
        let shared = Arc::new(ParticipantShared {
            domain_id: self.domain_id,
            rank: self.rank,
            max_sample_bytes: self.max_sample_bytes,
            suspect_timeout: self.suspect_timeout,
            ack_every: self.ack_every,
            window_slots: config.window_slots,
            pace_gap_ns_min: pace_gap_ns_min(&self.transport),
            participants: self.participants,
            next_local_id: AtomicU64::new(1),
            registry: Mutex::new(Registry::default()),
            stopped: AtomicBool::new(false),
            failure: Mutex::new(None),
            sender: Mutex::new(None),
            view: Mutex::new(View::default()),
        });
        let app = DdsApp::new(shared.clone());
        let group = GroupBuilder::from_config(config)
            .rank(self.rank)
            .transport(self.transport)
            .app(app)
            .join()?;
        let sender = group
            .sender()
            .ok_or_else(|| DdsError::Config("every participant sends".into()))?;
        *shared.sender.lock().expect("sender lock") = Some(sender);
        *shared.view.lock().expect("view lock") = group.view();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("dds-{}-p{}", self.domain_id, self.rank))
            .spawn(move || progress_loop(group, thread_shared))
            .map_err(|e| DdsError::Config(format!("cannot start the progress thread: {e}")))?;
        Ok(DomainParticipant {
            shared,
            thread: Mutex::new(Some(thread)),
            #[cfg(feature = "rtps")]
            rtps: super::rtps::RtpsSlot::new(self.rtps),
        })
    }
}

/// What every handle of a participant shares with its progress thread.
pub(crate) struct ParticipantShared {
    pub(crate) domain_id: u32,
    pub(crate) rank: usize,
    pub(crate) max_sample_bytes: usize,
    pub(crate) suspect_timeout: Duration,
    pub(crate) ack_every: u32,
    pub(crate) window_slots: usize,
    /// NAPA gaps shorter than this are not enforced on this transport
    /// (see [`pace_gap_ns_min`]).
    pub(crate) pace_gap_ns_min: u64,
    /// The domain's ranks (every one may send).
    pub(crate) participants: usize,
    next_local_id: AtomicU64,
    /// Local endpoints by id (the progress thread looks them up when their
    /// announcements are delivered).
    registry: Mutex<Registry>,
    stopped: AtomicBool,
    failure: Mutex<Option<String>>,
    sender: Mutex<Option<Sender>>,
    view: Mutex<View>,
}

/// NAPA gaps shorter than a paced wait costs cannot be spent: the writer
/// would pay the wait and then be late. On a 2-core host a wait of
/// 15-30 µs that yields to the progress threads returned 39-46 µs late on
/// tcp but 84-105 µs late on shared memory, where those threads spin and
/// hold the core; pacing 100 and 200 kB samples at 10-19 µs there ran at
/// 0.16× and 0.20× the unpaced throughput (bench/RESULTS-dds.md). Over tcp pacing pays
/// even below its wait's cost, because the path itself is the slower part:
/// its floor stays at 10 µs, a wake-up's order.
fn pace_gap_ns_min(transport: &Transport) -> u64 {
    match transport {
        Transport::Shm => 100_000,
        Transport::Tcp(_) | Transport::Ofi(_) => 10_000,
    }
}

#[derive(Default)]
struct Registry {
    readers: HashMap<u64, Arc<ReaderShared>>,
    writers: HashMap<u64, Arc<WriterShared>>,
}

impl ParticipantShared {
    pub(crate) fn sender(&self) -> Result<Sender, DdsError> {
        self.check_running()?;
        Ok(self.sender.lock().expect("sender lock").clone().expect("set at join"))
    }

    /// `Stopped` once the participant stopped or failed.
    pub(crate) fn check_running(&self) -> Result<(), DdsError> {
        if self.stopped.load(Ordering::Acquire) {
            let why = self.failure.lock().expect("failure lock").clone();
            return Err(DdsError::Stopped(why.unwrap_or_else(|| "closed".into())));
        }
        Ok(())
    }

    pub(crate) fn new_endpoint_id(&self) -> u64 {
        endpoint_id(self.rank, self.next_local_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Multicast an announcement (waiting out a full window, bounded).
    pub(crate) fn announce(&self, a: &Announce) -> Result<(), DdsError> {
        let mut msg = Vec::new();
        a.encode(&mut msg).map_err(|e| DdsError::Config(e.to_string()))?;
        let sender = self.sender()?;
        let started = Instant::now();
        let timeout = Duration::from_secs(5);
        loop {
            match sender.send(&msg) {
                Ok(()) => return Ok(()),
                Err(spindle_group::SendError::WouldBlock) if started.elapsed() < timeout => {
                    self.check_running()?;
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(spindle_group::SendError::WouldBlock) => {
                    return Err(DdsError::Timeout {
                        waiting_for: "room in the send window for an endpoint announcement".into(),
                        waited_ms: timeout.as_millis() as u64,
                    })
                }
                Err(e) => return Err(DdsError::Group(e.into())),
            }
        }
    }

    pub(crate) fn retire(&self, id: u64) {
        let a = Announce::retire(id);
        // A participant that stopped has no one to tell.
        let _ = self.announce(&a);
        let mut registry = self.registry.lock().expect("registry lock");
        registry.readers.remove(&id);
        registry.writers.remove(&id);
    }
}

/// A member of a DDS domain: creates topics, writers and readers, and
/// runs the progress thread that delivers their samples. Dropping it
/// leaves the domain cleanly.
pub struct DomainParticipant {
    shared: Arc<ParticipantShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    #[cfg(feature = "rtps")]
    pub(crate) rtps: super::rtps::RtpsSlot,
}

impl DomainParticipant {
    /// A builder for a participant of domain `domain_id` (shared memory,
    /// 2 participants, rank 0).
    pub fn builder(domain_id: u32) -> ParticipantBuilder {
        ParticipantBuilder {
            domain_id,
            participants: 2,
            rank: 0,
            transport: Transport::Shm,
            initial_members: None,
            max_sample_bytes: MAX_SAMPLE_BYTES_DEFAULT,
            window_slots: 0,
            ack_every: ACK_EVERY_DEFAULT,
            suspect_timeout: Duration::from_millis(spindle_group::config::defaults::SUSPECT_TIMEOUT_MS),
            join_timeout: Duration::from_millis(spindle_group::config::defaults::JOIN_TIMEOUT_MS),
            idle: IdleStrategy::DEFAULT_BACKOFF,
            snapshot_bytes_max: 1 << 20,
            #[cfg(feature = "rtps")]
            rtps: None,
        }
    }

    /// The domain id.
    pub fn domain_id(&self) -> u32 {
        self.shared.domain_id
    }

    /// This participant's rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// A fresh local endpoint index (the low 48 bits of an endpoint id).
    #[cfg(feature = "rtps")]
    pub(crate) fn new_local_index(&self) -> u64 {
        self.shared.new_endpoint_id() & ((1 << 48) - 1)
    }

    /// Slots of this participant's send window.
    pub fn window_slots(&self) -> usize {
        self.shared.window_slots
    }

    /// The participants currently in the domain (the group's view).
    pub fn participants(&self) -> Vec<usize> {
        self.shared.view.lock().expect("view lock").members.clone()
    }

    /// A typed topic (local: its name and type meet other participants'
    /// through their writers' and readers' announcements).
    pub fn create_topic<T: TopicType>(&self, name: &str) -> Result<Topic<T>, DdsError> {
        if name.is_empty() || name.len() > wire::NAME_BYTES_MAX || name.contains('\0') {
            return Err(DdsError::Config(format!(
                "topic name {name:?} must be 1..={} bytes without NUL",
                wire::NAME_BYTES_MAX
            )));
        }
        Ok(Topic {
            name: name.to_string(),
            type_name: T::type_name().to_string(),
            _type: PhantomData,
        })
    }

    /// A publisher whose writers publish in `partitions`.
    pub fn create_publisher(&self, partitions: &[&str]) -> Publisher<'_> {
        Publisher {
            participant: self,
            partition: Partition {
                names: partitions.iter().map(|s| s.to_string()).collect(),
            },
        }
    }

    /// A subscriber whose readers read from `partitions`.
    pub fn create_subscriber(&self, partitions: &[&str]) -> Subscriber<'_> {
        Subscriber {
            participant: self,
            partition: Partition {
                names: partitions.iter().map(|s| s.to_string()).collect(),
            },
        }
    }

    /// A writer of `topic` with `qos` (in the default publisher: the
    /// partitions `qos` names), sending as fast as its window allows. For
    /// NAPA's pacing, see [`DomainParticipant::create_writer_with_napa`].
    pub fn create_writer<T: TopicType>(&self, topic: &Topic<T>, qos: WriterQos) -> Result<DataWriter<T>, DdsError> {
        self.create_writer_with_napa(topic, qos, None)
    }

    /// A writer paced by NAPA with these settings (`Some(NapaConfig::default())`
    /// for the defaults; it applies to reliable writers only), or `None`:
    /// as fast as the window allows. NAPA is off by default: on this
    /// project's 2-core machines it lowers the one-way latency of 100 and
    /// 200 KB samples over loopback tcp 10–15×, but at 0.82–1.20× the
    /// throughput, and it costs 50 KB samples 0.53–0.63× of theirs
    /// (docs/napa.md, bench/RESULTS-dds.md).
    pub fn create_writer_with_napa<T: TopicType>(
        &self,
        topic: &Topic<T>,
        qos: WriterQos,
        napa: Option<NapaConfig>,
    ) -> Result<DataWriter<T>, DdsError> {
        self.create_writer_as(topic, qos, napa, None)
    }

    /// A writer with the id `id` (an RTPS bridge's injector takes one in
    /// its reserved range), or a new one.
    pub(crate) fn create_writer_as<T: TopicType>(
        &self,
        topic: &Topic<T>,
        qos: WriterQos,
        napa: Option<NapaConfig>,
        id: Option<WriterId>,
    ) -> Result<DataWriter<T>, DdsError> {
        self.shared.check_running()?;
        qos.validate()?;
        if qos.max_sample_bytes as usize > self.shared.max_sample_bytes {
            return Err(DdsError::Config(format!(
                "the writer's max_sample_bytes = {} exceeds the participant's slots of {} bytes (ParticipantBuilder::max_sample_bytes)",
                qos.max_sample_bytes, self.shared.max_sample_bytes
            )));
        }
        if let Some(lease_ns) = qos.liveliness.lease_ns {
            let detect_ns = self.shared.suspect_timeout.as_nanos() as u64;
            if lease_ns < detect_ns {
                return Err(DdsError::Config(format!(
                    "liveliness lease {} ms is shorter than the domain's failure detection ({} ms, ParticipantBuilder::suspect_timeout): a dead writer could not be noticed within it",
                    lease_ns / 1_000_000,
                    detect_ns / 1_000_000
                )));
            }
        }
        let id = id.unwrap_or_else(|| WriterId(self.shared.new_endpoint_id()));
        let shared = Arc::new(WriterShared::new(
            id,
            topic.name.clone(),
            qos.clone(),
            self.shared.clone(),
            napa,
            self.shared.ack_every,
        )?);
        self.shared
            .registry
            .lock()
            .expect("registry lock")
            .writers
            .insert(id.0, shared.clone());
        let announce = Announce {
            msg: MSG_WRITER,
            endpoint: id.0,
            topic: topic.name.clone(),
            type_name: topic.type_name.clone(),
            partitions: qos.partition.names.clone(),
            qos: qos.to_wire().as_bytes().to_vec(),
        };
        if let Err(e) = self.shared.announce(&announce) {
            self.shared
                .registry
                .lock()
                .expect("registry lock")
                .writers
                .remove(&id.0);
            return Err(e);
        }
        Ok(DataWriter::new(shared))
    }

    /// A reader of `topic` with `qos` (in the default subscriber).
    pub fn create_reader<T: TopicType>(&self, topic: &Topic<T>, qos: ReaderQos) -> Result<DataReader<T>, DdsError> {
        create_reader_in(&self.shared, topic, qos)
    }

    /// What creates readers of `topic` with `qos` later, from another
    /// thread (an RTPS bridge's, when an RTPS reader matches). The QoS is
    /// checked now, so that a bad one is refused at the caller's call.
    #[cfg(feature = "rtps")]
    pub(crate) fn reader_maker<T: TopicType + 'static>(
        &self,
        topic: &Topic<T>,
        qos: ReaderQos,
    ) -> Result<impl FnMut() -> Result<DataReader<T>, DdsError> + Send + 'static, DdsError> {
        check_reader_qos(&self.shared, &qos)?;
        let shared = self.shared.clone();
        let topic = topic.clone();
        Ok(move || create_reader_in(&shared, &topic, qos.clone()))
    }

    /// Leave the domain: the others install a view without this
    /// participant (its writers' liveliness ends at once, not after a
    /// timeout). Also what dropping it does.
    pub fn close(self) -> Result<(), DdsError> {
        self.stop()
    }

    fn stop(&self) -> Result<(), DdsError> {
        self.shared.stopped.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().expect("thread lock").take() {
            t.join()
                .map_err(|_| DdsError::Stopped("the progress thread panicked".into()))?;
        }
        match self.shared.failure.lock().expect("failure lock").clone() {
            Some(why) => Err(DdsError::Stopped(why)),
            None => Ok(()),
        }
    }
}

impl Drop for DomainParticipant {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Refuse a reader QoS that is invalid, or that would stop its
/// participant receiving.
fn check_reader_qos(shared: &ParticipantShared, qos: &ReaderQos) -> Result<(), DdsError> {
    qos.validate()?;
    let reliable_keep_all = matches!(qos.reliability, Reliability::Reliable { .. }) && qos.history == History::KeepAll;
    // Back-pressure pauses receiving while the history has less room
    // than one pass can deliver (every sender's window): a smaller
    // history would stop this participant receiving for good.
    let pass_samples = shared.window_slots * shared.participants;
    if reliable_keep_all && (qos.resource_limits.max_samples as usize) < pass_samples {
        return Err(DdsError::Config(format!(
            "a reliable keep-all reader needs max_samples >= participants x window_slots = {pass_samples} (has {}): a smaller history would stop its participant receiving; raise max_samples or lower ParticipantBuilder::window_slots",
            qos.resource_limits.max_samples
        )));
    }
    Ok(())
}

/// A reader of `topic` with `qos` in the participant of `shared`: it is
/// matched once its announcement is delivered, in the domain's total
/// order.
fn create_reader_in<T: TopicType>(
    shared: &Arc<ParticipantShared>,
    topic: &Topic<T>,
    qos: ReaderQos,
) -> Result<DataReader<T>, DdsError> {
    shared.check_running()?;
    check_reader_qos(shared, &qos)?;
    let id = ReaderId(shared.new_endpoint_id());
    let reader = Arc::new(ReaderShared::new(id, qos.clone()));
    shared
        .registry
        .lock()
        .expect("registry lock")
        .readers
        .insert(id.0, reader.clone());
    let announce = Announce {
        msg: MSG_READER,
        endpoint: id.0,
        topic: topic.name.clone(),
        type_name: topic.type_name.clone(),
        partitions: qos.partition.names.clone(),
        qos: qos.to_wire().as_bytes().to_vec(),
    };
    if let Err(e) = shared.announce(&announce) {
        shared.registry.lock().expect("registry lock").readers.remove(&id.0);
        return Err(e);
    }
    Ok(DataReader::new(reader, shared.clone()))
}

/// A typed topic: a name and the type `T` of its samples.
pub struct Topic<T> {
    pub(crate) name: String,
    pub(crate) type_name: String,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for Topic<T> {
    fn clone(&self) -> Self {
        Topic {
            name: self.name.clone(),
            type_name: self.type_name.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> Topic<T> {
    /// The topic's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The type name writers and readers compare.
    pub fn type_name(&self) -> &str {
        &self.type_name
    }
}

/// Writers that publish in a set of partitions.
pub struct Publisher<'p> {
    participant: &'p DomainParticipant,
    partition: Partition,
}

impl Publisher<'_> {
    /// A writer in this publisher's partitions.
    pub fn create_writer<T: TopicType>(&self, topic: &Topic<T>, mut qos: WriterQos) -> Result<DataWriter<T>, DdsError> {
        qos.partition = self.partition.clone();
        self.participant.create_writer(topic, qos)
    }
}

/// Readers that read from a set of partitions.
pub struct Subscriber<'p> {
    participant: &'p DomainParticipant,
    partition: Partition,
}

impl Subscriber<'_> {
    /// A reader in this subscriber's partitions.
    pub fn create_reader<T: TopicType>(&self, topic: &Topic<T>, mut qos: ReaderQos) -> Result<DataReader<T>, DdsError> {
        qos.partition = self.partition.clone();
        self.participant.create_reader(topic, qos)
    }
}

// ---- the progress thread and the upcalls -------------------------------

/// How often the progress thread checks deadlines and lifespans.
const TICK_NS: u64 = 1_000_000;
/// Busy polls between two looks at the clock (a poll that found no work,
/// and may have idled, always looks): a clock read per poll was a fifth
/// of a busy progress thread; 64 busy polls take microseconds, well
/// inside a tick.
const BUSY_POLLS_PER_CLOCK: u32 = 64;

fn progress_loop(mut group: Group<DdsApp>, shared: Arc<ParticipantShared>) {
    let mut last_tick_ns = 0;
    let mut busy_polls = 0u32;
    let result = (|| -> Result<(), crate::Error> {
        while !shared.stopped.load(Ordering::Acquire) {
            let app = group.app_mut();
            let pause = app.must_pause();
            app.pass_clock_ns = None; // a new pass reads the clock again
            group.pause_receive(pause);
            let work = group.poll_or_idle()?;
            busy_polls += 1;
            if work > 0 && busy_polls < BUSY_POLLS_PER_CLOCK {
                continue;
            }
            busy_polls = 0;
            let now = monotonic_ns();
            if now.saturating_sub(last_tick_ns) >= TICK_NS {
                last_tick_ns = now;
                group.app_mut().tick(realtime_ns());
                // Copied only when it changed: a copy allocates (its
                // member lists), and this runs every tick.
                let view_id = group.inner().core().view();
                let mut view = shared.view.lock().expect("view lock");
                if view.id != view_id {
                    *view = group.view();
                }
            }
        }
        group.pause_receive(false);
        Ok(())
    })();
    match result {
        Ok(()) => {
            // A clean leave: the others see this participant go at once.
            if let Err(e) = group.leave(Duration::from_secs(2)) {
                tracing_stop(&shared, format!("leaving the domain: {e}"));
            }
        }
        Err(e) => {
            tracing_stop(&shared, e.to_string());
            // The participant is out of the domain (removed, or left in a
            // minority: in a 2-participant domain the survivor of a crash
            // is one): every writer it heard from is lost to its readers.
            group.app_mut().all_writers_lost(realtime_ns());
        }
    }
    shared.stopped.store(true, Ordering::Release);
    let registry = shared.registry.lock().expect("registry lock");
    for r in registry.readers.values() {
        r.wake_all();
    }
}

fn tracing_stop(shared: &ParticipantShared, why: String) {
    let mut failure = shared.failure.lock().expect("failure lock");
    if failure.is_none() {
        *failure = Some(why);
    }
}

/// The participant's upcalls: discovery, routing samples to the local
/// readers that match their writer, transient-local histories.
pub(crate) struct DdsApp {
    shared: Arc<ParticipantShared>,
    discovery: Discovery,
    /// Local readers matched to each writer (the delivery path's only
    /// lookup).
    routes: IdHashMap<u64, Vec<Arc<ReaderShared>>>,
    /// The last samples per instance of every transient-local writer of
    /// the domain.
    histories: IdHashMap<u64, WriterHistory>,
    events: Vec<Event>,
    /// Local reliable keep-all readers (back-pressure).
    keep_all: Vec<Arc<ReaderShared>>,
    /// The most samples one pass can deliver to a reader.
    pass_samples_max: usize,
    /// The wall clock read at this pass's first delivered sample: every
    /// sample of a pass is received at it (a clock read per sample was 6%
    /// of a 16 B subscriber's progress thread). `None` between passes.
    pass_clock_ns: Option<u64>,
    bad_messages: u64,
}

impl DdsApp {
    fn new(shared: Arc<ParticipantShared>) -> DdsApp {
        DdsApp {
            shared,
            discovery: Discovery::new(),
            routes: IdHashMap::default(),
            histories: IdHashMap::default(),
            pass_clock_ns: None,
            events: Vec::new(),
            keep_all: Vec::new(),
            pass_samples_max: 0,
            bad_messages: 0,
        }
    }

    /// Whether a reliable keep-all reader has too little room left for
    /// one more pass of deliveries: pause receiving (back-pressure).
    fn must_pause(&self) -> bool {
        self.keep_all.iter().any(|r| r.free_samples() < self.pass_samples_max)
    }

    /// Every matched writer's liveliness is lost at every local reader.
    fn all_writers_lost(&mut self, now_ns: u64) {
        for (writer, readers) in self.routes.drain() {
            for r in readers {
                r.writer_lost(WriterId(writer), true, now_ns);
            }
        }
    }

    fn tick(&mut self, now_ns: u64) {
        let registry = self.shared.registry.lock().expect("registry lock");
        for r in registry.readers.values() {
            r.tick(now_ns);
        }
    }

    fn handle_sample(&mut self, payload: &[u8]) {
        let Ok((h, value)) = SampleHeader::parse(payload) else {
            self.bad_messages += 1;
            return;
        };
        let meta = h.meta();
        if let Some(history) = self.histories.get_mut(&meta.writer.0) {
            // A full history drops its oldest (keep-last); a refusal here
            // only narrows what a late reader gets.
            let _ = history.record(&meta, value);
        }
        if let Some(readers) = self.routes.get(&meta.writer.0) {
            let now = *self.pass_clock_ns.get_or_insert_with(realtime_ns);
            for r in readers {
                if h.target_reader == 0 || h.target_reader == r.id.0 {
                    r.insert(&meta, value, now);
                }
            }
        }
    }

    fn handle_announce(&mut self, payload: &[u8]) {
        let a = match Announce::decode(payload) {
            Ok(a) => a,
            Err(_) => {
                self.bad_messages += 1;
                return;
            }
        };
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        if let Err(e) = self.discovery.handle_announce(&a, &mut events) {
            tracing_discovery_error(&e.to_string());
            self.bad_messages += 1;
        }
        if a.msg == MSG_WRITER {
            if let Some(ep) = self.discovery.endpoint(a.endpoint) {
                if let spindle_dds::discovery::EndpointQos::Writer(q) = &ep.qos {
                    if q.durability == Durability::TransientLocal {
                        self.histories.insert(a.endpoint, WriterHistory::new(q));
                    }
                }
            }
        }
        if a.msg == MSG_READER && spindle_dds::types::endpoint_participant(a.endpoint) == self.shared.rank {
            self.reader_announced(a.endpoint);
        }
        self.apply(&events);
        if a.msg == MSG_RETIRE {
            self.histories.remove(&a.endpoint);
            self.keep_all.retain(|r| r.id.0 != a.endpoint);
        }
        self.events = events;
    }

    fn reader_announced(&mut self, id: u64) {
        let registry = self.shared.registry.lock().expect("registry lock");
        if let Some(r) = registry.readers.get(&id) {
            if r.is_reliable_keep_all() {
                self.keep_all.push(r.clone());
            }
        }
    }

    fn apply(&mut self, events: &[Event]) {
        let now = realtime_ns();
        for e in events {
            match e {
                Event::Matched { writer, reader } => {
                    let strength = match self.discovery.endpoint(writer.0).map(|ep| &ep.qos) {
                        Some(spindle_dds::discovery::EndpointQos::Writer(q)) => q.ownership_strength,
                        _ => 0,
                    };
                    let lifespan = match self.discovery.endpoint(writer.0).map(|ep| &ep.qos) {
                        Some(spindle_dds::discovery::EndpointQos::Writer(q)) => q.lifespan.duration_ns,
                        _ => None,
                    };
                    let registry = self.shared.registry.lock().expect("registry lock");
                    if let Some(r) = registry.readers.get(&reader.0).cloned() {
                        drop(registry);
                        r.writer_matched(*writer, strength, lifespan, now);
                        if r.qos.durability == Durability::TransientLocal {
                            if let Some(history) = self.histories.get(&writer.0) {
                                // The history holds exactly what was delivered
                                // before this reader's announcement: the late
                                // reader starts from it, then the live samples.
                                history.replay(|meta: &SampleMeta, value: &[u8]| r.insert(meta, value, now));
                            }
                        }
                        self.routes.entry(writer.0).or_default().push(r);
                    } else {
                        drop(registry);
                    }
                    if let Some(w) = self.local_writer(writer.0) {
                        w.reader_matched(*reader);
                    }
                }
                Event::Unmatched { writer, reader, why } => {
                    if let Some(readers) = self.routes.get_mut(&writer.0) {
                        if let Some(at) = readers.iter().position(|r| r.id == *reader) {
                            let r = readers.swap_remove(at);
                            r.writer_lost(*writer, *why == Unmatch::ParticipantGone, now);
                        }
                        if readers.is_empty() {
                            self.routes.remove(&writer.0);
                        }
                    }
                    if let Some(w) = self.local_writer(writer.0) {
                        w.reader_unmatched(*reader);
                    }
                }
                Event::IncompatibleQos {
                    writer,
                    reader,
                    policies,
                } => {
                    if let Some(w) = self.local_writer(writer.0) {
                        w.incompatible(*reader, policies.clone());
                    }
                    if let Some(r) = self.local_reader(reader.0) {
                        r.incompatible(*writer, policies.clone());
                    }
                }
                Event::InconsistentTopic {
                    writer,
                    reader,
                    writer_type,
                    reader_type,
                } => {
                    let why = format!("writer type {writer_type}, reader type {reader_type}");
                    if let Some(w) = self.local_writer(writer.0) {
                        w.inconsistent(*reader, why.clone());
                    }
                    if let Some(r) = self.local_reader(reader.0) {
                        r.inconsistent(*writer, why);
                    }
                }
            }
        }
    }

    fn local_writer(&self, id: u64) -> Option<Arc<WriterShared>> {
        self.shared
            .registry
            .lock()
            .expect("registry lock")
            .writers
            .get(&id)
            .cloned()
    }

    fn local_reader(&self, id: u64) -> Option<Arc<ReaderShared>> {
        self.shared
            .registry
            .lock()
            .expect("registry lock")
            .readers
            .get(&id)
            .cloned()
    }
}

fn tracing_discovery_error(why: &str) {
    eprintln!("spindle dds: discovery: {why}");
}

impl Upcalls for DdsApp {
    fn deliver(&mut self, d: &Delivery<'_>) {
        match wire::message_kind(d.payload) {
            Some(MSG_SAMPLE) => self.handle_sample(d.payload),
            Some(MSG_WRITER | MSG_READER | MSG_RETIRE) => self.handle_announce(d.payload),
            _ => self.bad_messages += 1,
        }
    }

    fn view_installed(&mut self, view: &View) {
        self.pass_samples_max = self.pass_samples_max.max(
            view.senders.len()
                * self
                    .shared
                    .sender
                    .lock()
                    .expect("sender lock")
                    .as_ref()
                    .map_or(0, |s| s.window_slots() as usize),
        );
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        for &rank in &view.departed {
            self.discovery.handle_participant_gone(rank, &mut events);
            self.histories
                .retain(|&id, _| spindle_dds::types::endpoint_participant(id) != rank);
        }
        self.apply(&events);
        self.events = events;
    }

    fn snapshot(&mut self, out: &mut Vec<u8>) {
        self.discovery.snapshot(out);
        out.extend_from_slice(&(self.histories.len() as u32).to_le_bytes());
        let mut ids: Vec<u64> = self.histories.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let history = &self.histories[&id];
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&(history.len() as u32).to_le_bytes());
            history.replay(|meta, value| {
                let mut h = [0u8; wire::SAMPLE_HEADER_BYTES];
                SampleHeader::new(meta, value.len() as u32, None).write_to(&mut h);
                out.extend_from_slice(&h);
                out.extend_from_slice(value);
            });
        }
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let (discovery, mut at) = Discovery::restore(snapshot).map_err(|e| e.to_string())?;
        let bad = |what: &str| format!("transient-local snapshot: truncated {what}");
        let n = u32::from_le_bytes(
            snapshot
                .get(at..at + 4)
                .ok_or_else(|| bad("count"))?
                .try_into()
                .expect("4"),
        );
        at += 4;
        for _ in 0..n {
            let id = u64::from_le_bytes(
                snapshot
                    .get(at..at + 8)
                    .ok_or_else(|| bad("writer"))?
                    .try_into()
                    .expect("8"),
            );
            let count = u32::from_le_bytes(
                snapshot
                    .get(at + 8..at + 12)
                    .ok_or_else(|| bad("length"))?
                    .try_into()
                    .expect("4"),
            );
            at += 12;
            let Some(spindle_dds::discovery::EndpointQos::Writer(q)) = discovery.endpoint(id).map(|ep| &ep.qos) else {
                return Err(format!("transient-local snapshot: writer {id:#x} is not in discovery"));
            };
            let mut history = WriterHistory::new(q);
            for _ in 0..count {
                let (h, value) =
                    SampleHeader::parse(snapshot.get(at..).ok_or_else(|| bad("sample"))?).map_err(|e| e.to_string())?;
                at += wire::SAMPLE_HEADER_BYTES + value.len();
                let _ = history.record(&h.meta(), value);
            }
            self.histories.insert(id, history);
        }
        self.discovery = discovery;
        Ok(())
    }
}
