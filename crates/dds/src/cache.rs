//! A DataReader's history: the [`ReaderCache`].
//!
//! It holds the samples a reader has received and not taken, per
//! instance, with the DDS sample, view and instance states, and enforces
//! the reader-side policies: history (keep-last N replaces the instance's
//! oldest sample, keep-all rejects at the limits), resource limits,
//! lifespan, deadline, exclusive ownership and liveliness.
//!
//! # Driving contract
//!
//! A pure data structure: no threads, clocks or I/O. The engine calls
//! [`ReaderCache::insert`] for each delivered sample (in the group's total
//! order), [`ReaderCache::writer_matched`] / [`ReaderCache::writer_lost`]
//! when discovery or liveliness says so, [`ReaderCache::set_writer_lifespan`]
//! with each matched writer's lifespan QoS, and [`ReaderCache::expire`] and
//! [`ReaderCache::check_deadlines`] from its progress loop; the application
//! reads and takes. Time is always passed in (`now_ns`, the reader's
//! clock, the same base as the samples' source timestamps).
//!
//! # Memory
//!
//! Samples live in a slab that grows up to `max_samples` slots and is then
//! reused: a freed slot keeps its payload buffer, so once the cache has
//! warmed up an insert copies the payload into an existing buffer and
//! allocates nothing (unless the payload outgrows that buffer). Samples
//! are on two intrusive lists (reception order, and per instance), so
//! removal anywhere is O(1).
//!
//! ```
//! use spindle_dds::cache::{Insert, ReaderCache, StateMask};
//! use spindle_dds::qos::ReaderQos;
//! use spindle_dds::types::{InstanceHandle, SampleKind, SampleMeta, WriterId};
//!
//! let mut cache = ReaderCache::new(&ReaderQos::default().keep_last(2));
//! let meta = |seq| SampleMeta {
//!     writer: WriterId(1),
//!     seq,
//!     source_timestamp_ns: seq,
//!     instance: InstanceHandle(7),
//!     kind: SampleKind::Data,
//!     strength: 0,
//! };
//! cache.writer_matched(WriterId(1), 0, 0);
//! for seq in 1..=3 {
//!     cache.insert(&meta(seq), &[seq as u8], seq);
//! }
//! let mut got = Vec::new();
//! cache.take_with(usize::MAX, StateMask::ANY, |info, bytes| got.push((info.seq, bytes[0])));
//! assert_eq!(got, vec![(2, 2), (3, 3)]); // keep-last 2
//! ```

use crate::qos::{History, Ownership, ReaderQos, SAMPLE_BYTES_LIMIT};
use crate::types::{IdHashMap, InstanceHandle, SampleKind, SampleMeta, WriterId};

/// The most writers one cache tracks (live ones, and lost ones kept for
/// duplicate detection until their entry is needed).
pub const MATCHED_WRITERS_MAX: usize = 1024;

/// No slot: the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

// ---------------------------------------------------------------------------
// The store: a bounded slab of samples on two intrusive lists.
// ---------------------------------------------------------------------------

/// The ends and length of one per-instance list of a [`SampleStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    head: u32,
    tail: u32,
    len: u32,
}

impl Chain {
    pub(crate) const EMPTY: Chain = Chain {
        head: NIL,
        tail: NIL,
        len: 0,
    };

    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    pub(crate) fn first(&self) -> u32 {
        self.head
    }
}

#[derive(Debug)]
struct Slot<M> {
    meta: M,
    payload: Vec<u8>,
    /// Store order (reception order); also the free list's link.
    prev: u32,
    next: u32,
    /// The slot's instance chain.
    chain_prev: u32,
    chain_next: u32,
}

/// A slab of at most `capacity` samples, each on the store's order list
/// and on one [`Chain`] (its instance's). Freed slots keep their payload
/// buffer for reuse.
#[derive(Debug)]
pub(crate) struct SampleStore<M> {
    slots: Vec<Slot<M>>,
    free: u32,
    order: Chain,
    capacity: u32,
}

impl<M: Copy> SampleStore<M> {
    pub(crate) fn new(capacity: u32) -> Self {
        assert!(capacity > 0, "a store of no samples");
        SampleStore {
            slots: Vec::new(),
            free: NIL,
            order: Chain::EMPTY,
            capacity,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.order.len as usize
    }

    pub(crate) fn is_full(&self) -> bool {
        self.order.len >= self.capacity
    }

    /// Appends at the tail of the store order and of `chain`; `None` when
    /// full.
    pub(crate) fn push_back(&mut self, chain: &mut Chain, meta: M, payload: &[u8]) -> Option<u32> {
        if self.is_full() {
            return None;
        }
        let idx = if self.free != NIL {
            let idx = self.free;
            let slot = &mut self.slots[idx as usize];
            self.free = slot.next;
            slot.meta = meta;
            slot.payload.clear();
            slot.payload.extend_from_slice(payload);
            idx
        } else {
            debug_assert!(self.slots.len() < self.capacity as usize);
            self.slots.push(Slot {
                meta,
                payload: payload.to_vec(),
                prev: NIL,
                next: NIL,
                chain_prev: NIL,
                chain_next: NIL,
            });
            (self.slots.len() - 1) as u32
        };
        let (order_tail, chain_tail) = (self.order.tail, chain.tail);
        {
            let slot = &mut self.slots[idx as usize];
            slot.prev = order_tail;
            slot.next = NIL;
            slot.chain_prev = chain_tail;
            slot.chain_next = NIL;
        }
        if order_tail == NIL {
            self.order.head = idx;
        } else {
            self.slots[order_tail as usize].next = idx;
        }
        self.order.tail = idx;
        self.order.len += 1;
        if chain_tail == NIL {
            chain.head = idx;
        } else {
            self.slots[chain_tail as usize].chain_next = idx;
        }
        chain.tail = idx;
        chain.len += 1;
        debug_assert!(self.order.len <= self.capacity);
        Some(idx)
    }

    /// Unlinks `idx` from the store order and from `chain` (its chain) and
    /// frees it.
    pub(crate) fn remove(&mut self, chain: &mut Chain, idx: u32) {
        assert!(chain.len > 0 && self.order.len > 0, "remove from an empty list");
        let (prev, next, chain_prev, chain_next) = {
            let s = &self.slots[idx as usize];
            (s.prev, s.next, s.chain_prev, s.chain_next)
        };
        match prev {
            NIL => self.order.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.order.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        self.order.len -= 1;
        match chain_prev {
            NIL => chain.head = chain_next,
            p => self.slots[p as usize].chain_next = chain_next,
        }
        match chain_next {
            NIL => chain.tail = chain_prev,
            n => self.slots[n as usize].chain_prev = chain_prev,
        }
        chain.len -= 1;
        let slot = &mut self.slots[idx as usize];
        slot.prev = NIL;
        slot.next = self.free;
        self.free = idx;
    }

    /// The oldest sample in store order (`NIL` when empty).
    pub(crate) fn first(&self) -> u32 {
        self.order.head
    }

    /// The sample after `idx` in store order.
    pub(crate) fn next(&self, idx: u32) -> u32 {
        self.slots[idx as usize].next
    }

    /// The sample after `idx` in its chain.
    pub(crate) fn chain_next(&self, idx: u32) -> u32 {
        self.slots[idx as usize].chain_next
    }

    pub(crate) fn meta(&self, idx: u32) -> &M {
        &self.slots[idx as usize].meta
    }

    pub(crate) fn meta_mut(&mut self, idx: u32) -> &mut M {
        &mut self.slots[idx as usize].meta
    }

    pub(crate) fn payload(&self, idx: u32) -> &[u8] {
        &self.slots[idx as usize].payload
    }
}

// ---------------------------------------------------------------------------
// States, masks, sample info, status.
// ---------------------------------------------------------------------------

/// Whether the application has read a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleState {
    /// Returned by a `read` before.
    Read,
    /// Never returned.
    NotRead,
}

/// Whether the application has seen this instance (in this generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViewState {
    /// First access to the instance, or first since it was revived.
    New,
    /// Accessed before.
    NotNew,
}

/// Whether an instance exists and has writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstanceState {
    /// Written by at least one live writer.
    Alive,
    /// A writer disposed of it.
    NotAliveDisposed,
    /// Every writer unregistered it or lost its liveliness.
    NotAliveNoWriters,
}

impl SampleState {
    /// This state's bit in [`StateMask::sample`].
    pub const fn bit(self) -> u8 {
        match self {
            SampleState::Read => 1,
            SampleState::NotRead => 2,
        }
    }
}

impl ViewState {
    /// This state's bit in [`StateMask::view`].
    pub const fn bit(self) -> u8 {
        match self {
            ViewState::New => 1,
            ViewState::NotNew => 2,
        }
    }
}

impl InstanceState {
    /// This state's bit in [`StateMask::instance`].
    pub const fn bit(self) -> u8 {
        match self {
            InstanceState::Alive => 1,
            InstanceState::NotAliveDisposed => 2,
            InstanceState::NotAliveNoWriters => 4,
        }
    }
}

/// Which samples a read or take returns: a sample matches when its
/// sample, view and instance states each have their bit set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateMask {
    /// [`SampleState::bit`]s.
    pub sample: u8,
    /// [`ViewState::bit`]s.
    pub view: u8,
    /// [`InstanceState::bit`]s.
    pub instance: u8,
}

impl StateMask {
    const SAMPLE_ANY: u8 = 1 | 2;
    const VIEW_ANY: u8 = 1 | 2;
    const INSTANCE_ANY: u8 = 1 | 2 | 4;

    /// Every sample.
    pub const ANY: StateMask = StateMask {
        sample: Self::SAMPLE_ANY,
        view: Self::VIEW_ANY,
        instance: Self::INSTANCE_ANY,
    };
    /// Samples not read before.
    pub const NOT_READ: StateMask = StateMask {
        sample: SampleState::NotRead.bit(),
        ..Self::ANY
    };
    /// Samples read before.
    pub const READ: StateMask = StateMask {
        sample: SampleState::Read.bit(),
        ..Self::ANY
    };
    /// Samples of instances not accessed before (in this generation).
    pub const NEW_VIEW: StateMask = StateMask {
        view: ViewState::New.bit(),
        ..Self::ANY
    };
    /// Samples of alive instances.
    pub const ALIVE: StateMask = StateMask {
        instance: InstanceState::Alive.bit(),
        ..Self::ANY
    };
    /// Samples of disposed or writerless instances.
    pub const NOT_ALIVE: StateMask = StateMask {
        instance: InstanceState::NotAliveDisposed.bit() | InstanceState::NotAliveNoWriters.bit(),
        ..Self::ANY
    };

    /// Whether the three states match.
    pub fn matches(&self, sample: SampleState, view: ViewState, instance: InstanceState) -> bool {
        self.sample & sample.bit() != 0 && self.view & view.bit() != 0 && self.instance & instance.bit() != 0
    }
}

/// What a read or take says about each sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleInfo {
    /// Read before or not.
    pub sample_state: SampleState,
    /// The instance's view state at this read.
    pub view_state: ViewState,
    /// The instance's state now.
    pub instance_state: InstanceState,
    /// `false` for the sample that announces an instance-state change
    /// (dispose, unregister, writer lost): its bytes are whatever the
    /// dispose or unregister carried (empty for a writer-lost notice).
    pub valid_data: bool,
    /// The writer's clock at `write` (a writer-lost notice: the reader's
    /// `now_ns` when the loss was reported).
    pub source_timestamp_ns: u64,
    /// The reader's `now_ns` at insertion.
    pub reception_timestamp_ns: u64,
    /// The writer.
    pub writer: WriterId,
    /// The writer's sequence number (0 for a writer-lost notice, which the
    /// reader made).
    pub seq: u64,
    /// The instance.
    pub instance: InstanceHandle,
    /// How many times the instance had been revived from disposed when
    /// the sample arrived.
    pub disposed_generation_count: u32,
    /// How many times the instance had been revived from no-writers when
    /// the sample arrived.
    pub no_writers_generation_count: u32,
}

/// What [`ReaderCache::insert`] did with a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Insert {
    /// Stored (or, for a dispose/unregister, applied).
    Accepted,
    /// Stored; keep-last replaced the instance's oldest sample.
    AcceptedReplacedOldest,
    /// Keep-all (or a new instance) at `max_samples`; nothing changed.
    RejectedSamplesLimit,
    /// A new instance at `max_instances`; nothing changed.
    RejectedInstancesLimit,
    /// Keep-all at `max_samples_per_instance`; nothing changed.
    RejectedPerInstanceLimit,
    /// Exclusive ownership: a stronger live writer owns the instance.
    NotOwner,
    /// The writer's `seq` was accepted before (or an older one was).
    Duplicate,
    /// The sample's lifespan ended before it arrived.
    Expired,
}

/// Why the last sample was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// `max_samples`.
    SamplesLimit,
    /// `max_instances`.
    InstancesLimit,
    /// `max_samples_per_instance` (keep-all).
    SamplesPerInstanceLimit,
    /// A payload above [`SAMPLE_BYTES_LIMIT`].
    SampleTooLarge,
    /// An unknown writer while [`MATCHED_WRITERS_MAX`] live writers are
    /// tracked.
    WritersLimit,
}

/// The reader's liveliness counts: matched writers alive and not alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LivelinessChanged {
    /// Writers alive.
    pub alive_count: u32,
    /// Writers that lost their liveliness (and were not unmatched).
    pub not_alive_count: u32,
    /// How many times either count changed.
    pub changes_total: u64,
}

/// The reader's counters (monotonic, except the gauges `liveliness_changed`,
/// `instances` and `samples`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReaderStatus {
    /// Samples never received: gaps in a writer's sequence numbers.
    pub samples_lost: u64,
    /// Samples rejected by a resource limit.
    pub samples_rejected: u64,
    /// Why the last one was.
    pub last_reject_reason: Option<RejectReason>,
    /// The instance of the last one.
    pub last_rejected_instance: InstanceHandle,
    /// Deadline periods missed, over all instances.
    pub deadline_missed_total: u64,
    /// The instance of the last miss.
    pub last_instance_missed: InstanceHandle,
    /// Liveliness counts.
    pub liveliness_changed: LivelinessChanged,
    /// Instances held now.
    pub instances: usize,
    /// Samples held now.
    pub samples: usize,
    /// Samples keep-last replaced (dropped silently, as DDS does).
    pub replaced: u64,
    /// Samples dropped by lifespan (on arrival or in [`ReaderCache::expire`]).
    pub expired: u64,
    /// Duplicates ignored.
    pub duplicates: u64,
    /// Samples refused by exclusive ownership.
    pub not_owner: u64,
}

// ---------------------------------------------------------------------------
// The cache.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Stored {
    writer: WriterId,
    seq: u64,
    source_timestamp_ns: u64,
    reception_timestamp_ns: u64,
    /// `source_timestamp_ns + lifespan`; `u64::MAX` = never.
    expiry_ns: u64,
    instance: u32,
    valid_data: bool,
    read: bool,
    disposed_generation_count: u32,
    no_writers_generation_count: u32,
}

#[derive(Debug)]
struct Instance {
    handle: InstanceHandle,
    chain: Chain,
    state: InstanceState,
    /// New since creation or revival; becomes not-new after the first
    /// read/take call that accesses it (`viewed_call`).
    view_new: bool,
    /// The read/take call that first accessed it in this generation (0 =
    /// none yet).
    viewed_call: u64,
    disposed_generation_count: u32,
    no_writers_generation_count: u32,
    /// The live writers that write it (registered and not unregistered).
    writers: Vec<WriterId>,
    /// Exclusive ownership: the writer whose samples are accepted.
    owner: Option<WriterId>,
    /// Reception time of the last data sample (the deadline's base).
    last_data_ns: u64,
    /// Deadline periods counted since `last_data_ns`.
    deadline_missed: u64,
    in_use: bool,
    next_free: u32,
}

impl Instance {
    fn view_state(&self, call: u64) -> ViewState {
        if self.view_new && (self.viewed_call == 0 || self.viewed_call == call) {
            ViewState::New
        } else {
            ViewState::NotNew
        }
    }

    fn mark_viewed(&mut self, call: u64) {
        if self.view_new && self.viewed_call == 0 {
            self.viewed_call = call;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Liveness {
    /// Known (a lifespan was set, or it was unmatched) but not counted.
    Unmatched,
    Alive,
    NotAlive,
}

#[derive(Clone, Copy, Debug)]
struct WriterEntry {
    id: WriterId,
    strength: i32,
    liveness: Liveness,
    lifespan_ns: Option<u64>,
    /// The last seq accepted or finally refused (not owner, expired):
    /// anything at or below is a duplicate. 0 = none.
    last_seq_done: u64,
    /// The highest seq seen at all (gaps above it are lost samples).
    last_seq_seen: u64,
}

/// `a` is stronger than `b` under exclusive ownership: higher strength,
/// then the lower writer id.
fn stronger(a: (i32, WriterId), b: (i32, WriterId)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// A DataReader's history (see the module docs for the driving contract).
#[derive(Debug)]
pub struct ReaderCache {
    /// KeepLast depth; `None` = keep all.
    depth: Option<u32>,
    max_instances: u32,
    max_samples_per_instance: u32,
    exclusive: bool,
    deadline_ns: Option<u64>,
    store: SampleStore<Stored>,
    instances: Vec<Instance>,
    instance_free: u32,
    instance_index: IdHashMap<InstanceHandle, u32>,
    writers: Vec<WriterEntry>,
    writer_index: IdHashMap<WriterId, u32>,
    /// Read/take calls so far (view states).
    call: u64,
    status: ReaderStatus,
    /// No sample in the store expires before this (`u64::MAX`: none has a
    /// lifespan), so [`ReaderCache::expire`] walks the store only once a
    /// lifespan may have ended: the progress thread calls it every
    /// millisecond, and a walk of a full history (65,536 samples) per call
    /// took 29% of a publisher's CPU (`spindle dds pub --rtps`, perf).
    /// Lower than the truth after a take (a cheap extra walk then), never
    /// higher.
    next_expiry_ns: u64,
}

impl ReaderCache {
    /// An empty cache for a reader with this QoS (which must validate).
    /// Nothing is preallocated; storage grows up to the resource limits.
    pub fn new(qos: &ReaderQos) -> ReaderCache {
        if let Err(e) = qos.validate() {
            panic!("ReaderCache::new with an invalid QoS: {e}");
        }
        let limits = qos.resource_limits;
        let depth = match qos.history {
            History::KeepLast(n) => Some(n),
            History::KeepAll => None,
        };
        ReaderCache {
            depth,
            max_instances: limits.max_instances,
            max_samples_per_instance: limits.max_samples_per_instance,
            exclusive: qos.ownership == Ownership::Exclusive,
            deadline_ns: qos.deadline.period_ns,
            store: SampleStore::new(limits.max_samples),
            instances: Vec::new(),
            instance_free: NIL,
            instance_index: IdHashMap::default(),
            writers: Vec::new(),
            writer_index: IdHashMap::default(),
            call: 0,
            status: ReaderStatus::default(),
            next_expiry_ns: u64::MAX,
        }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    /// Keep-all and at `max_samples`: the engine stops accepting (reliable
    /// back-pressure) until the application takes.
    pub fn is_full(&self) -> bool {
        self.depth.is_none() && self.store.is_full()
    }

    /// The counters.
    pub fn status(&self) -> ReaderStatus {
        ReaderStatus {
            instances: self.instance_index.len(),
            samples: self.store.len(),
            ..self.status
        }
    }

    /// The state of an instance the cache holds.
    pub fn instance_state(&self, instance: InstanceHandle) -> Option<InstanceState> {
        self.instance_index
            .get(&instance)
            .map(|&i| self.instances[i as usize].state)
    }

    // ----- writers -----

    /// The writer's entry, made if unknown (evicting a writer that is not
    /// alive when the table is full); `None` when every entry is alive.
    fn writer_entry(&mut self, id: WriterId) -> Option<u32> {
        if let Some(&w) = self.writer_index.get(&id) {
            return Some(w);
        }
        let entry = WriterEntry {
            id,
            strength: 0,
            liveness: Liveness::Unmatched,
            lifespan_ns: None,
            last_seq_done: 0,
            last_seq_seen: 0,
        };
        let w = if self.writers.len() < MATCHED_WRITERS_MAX {
            self.writers.push(entry);
            (self.writers.len() - 1) as u32
        } else {
            let victim = self.writers.iter().position(|e| e.liveness != Liveness::Alive)?;
            let old = self.writers[victim];
            if old.liveness == Liveness::NotAlive {
                self.status.liveliness_changed.not_alive_count -= 1;
                self.status.liveliness_changed.changes_total += 1;
            }
            self.writer_index.remove(&old.id);
            self.writers[victim] = entry;
            victim as u32
        };
        self.writer_index.insert(id, w);
        Some(w)
    }

    fn set_alive(&mut self, w: u32) {
        let entry = &mut self.writers[w as usize];
        let live = &mut self.status.liveliness_changed;
        match entry.liveness {
            Liveness::Alive => return,
            Liveness::NotAlive => live.not_alive_count -= 1,
            Liveness::Unmatched => {}
        }
        entry.liveness = Liveness::Alive;
        live.alive_count += 1;
        live.changes_total += 1;
    }

    /// A writer matched (or regained its liveliness): it counts as alive.
    /// Returns `false` when [`MATCHED_WRITERS_MAX`] live writers are
    /// already tracked (the writer is then not tracked).
    pub fn writer_matched(&mut self, writer: WriterId, strength: i32, _now_ns: u64) -> bool {
        let Some(w) = self.writer_entry(writer) else {
            return false;
        };
        self.writers[w as usize].strength = strength;
        self.set_alive(w);
        true
    }

    /// The lifespan of a writer's samples (its Lifespan QoS, a writer
    /// policy): call it when the writer matches. Samples inserted after
    /// are dropped once `source_timestamp_ns + lifespan_ns ≤ now_ns`.
    pub fn set_writer_lifespan(&mut self, writer: WriterId, lifespan_ns: Option<u64>) {
        if let Some(w) = self.writer_entry(writer) {
            self.writers[w as usize].lifespan_ns = lifespan_ns;
        }
    }

    /// A writer lost its liveliness: it counts as not alive, it leaves
    /// every instance it wrote (ownership passes to the next strongest
    /// live writer; an instance left with no writer becomes
    /// not-alive-no-writers, announced by a `valid_data = false` sample).
    /// A later sample or [`ReaderCache::writer_matched`] revives it.
    pub fn writer_lost(&mut self, writer: WriterId, now_ns: u64) {
        let Some(&w) = self.writer_index.get(&writer) else {
            return;
        };
        let entry = &mut self.writers[w as usize];
        if entry.liveness == Liveness::Alive {
            entry.liveness = Liveness::NotAlive;
            let live = &mut self.status.liveliness_changed;
            live.alive_count -= 1;
            live.not_alive_count += 1;
            live.changes_total += 1;
        }
        self.leave_instances(writer, now_ns);
    }

    /// A writer was deleted or unmatched: as [`ReaderCache::writer_lost`],
    /// but it leaves the liveliness counts altogether. Its last sequence
    /// number is kept (duplicates stay refused).
    pub fn writer_removed(&mut self, writer: WriterId, now_ns: u64) {
        let Some(&w) = self.writer_index.get(&writer) else {
            return;
        };
        let entry = &mut self.writers[w as usize];
        let live = &mut self.status.liveliness_changed;
        match entry.liveness {
            Liveness::Alive => live.alive_count -= 1,
            Liveness::NotAlive => live.not_alive_count -= 1,
            Liveness::Unmatched => {}
        }
        if entry.liveness != Liveness::Unmatched {
            live.changes_total += 1;
        }
        entry.liveness = Liveness::Unmatched;
        self.leave_instances(writer, now_ns);
    }

    fn leave_instances(&mut self, writer: WriterId, now_ns: u64) {
        for i in 0..self.instances.len() as u32 {
            let inst = &self.instances[i as usize];
            if inst.in_use && inst.writers.contains(&writer) {
                let notice = Stored {
                    writer,
                    seq: 0,
                    source_timestamp_ns: now_ns,
                    reception_timestamp_ns: now_ns,
                    expiry_ns: u64::MAX,
                    instance: i,
                    valid_data: false,
                    read: false,
                    disposed_generation_count: 0,
                    no_writers_generation_count: 0,
                };
                let forced = self.unregister(i, writer, notice, &[], true);
                debug_assert!(forced.is_ok());
                self.maybe_reclaim(i);
            }
        }
    }

    /// The strongest live writer among `inst`'s writers.
    fn strongest_writer(&self, inst: u32) -> Option<WriterId> {
        let mut best: Option<(i32, WriterId)> = None;
        for &id in &self.instances[inst as usize].writers {
            let Some(&w) = self.writer_index.get(&id) else { continue };
            let e = &self.writers[w as usize];
            if e.liveness == Liveness::Alive && best.is_none_or(|b| stronger((e.strength, id), b)) {
                best = Some((e.strength, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Exclusive ownership: whether `writer` (with `strength`) may update
    /// the instance: it owns it, or nobody live does, or it is stronger.
    fn may_own(&self, inst: u32, writer: WriterId, strength: i32) -> bool {
        let Some(owner) = self.instances[inst as usize].owner else {
            return true;
        };
        if owner == writer {
            return true;
        }
        match self.writer_index.get(&owner).map(|&w| self.writers[w as usize]) {
            Some(e) if e.liveness == Liveness::Alive => stronger((strength, writer), (e.strength, owner)),
            _ => true,
        }
    }

    // ----- instances -----

    fn new_instance(&mut self, handle: InstanceHandle, now_ns: u64) -> u32 {
        assert!(
            (self.instance_index.len() as u32) < self.max_instances,
            "instance limit checked before"
        );
        let fresh = |writers: Vec<WriterId>| Instance {
            handle,
            chain: Chain::EMPTY,
            state: InstanceState::Alive,
            view_new: true,
            viewed_call: 0,
            disposed_generation_count: 0,
            no_writers_generation_count: 0,
            writers,
            owner: None,
            last_data_ns: now_ns,
            deadline_missed: 0,
            in_use: true,
            next_free: NIL,
        };
        let i = if self.instance_free != NIL {
            let i = self.instance_free;
            let slot = &mut self.instances[i as usize];
            self.instance_free = slot.next_free;
            let mut writers = std::mem::take(&mut slot.writers);
            writers.clear();
            *slot = fresh(writers);
            i
        } else {
            self.instances.push(fresh(Vec::new()));
            (self.instances.len() - 1) as u32
        };
        self.instance_index.insert(handle, i);
        i
    }

    /// Frees an instance that is not alive, holds no sample and has no
    /// writer: DDS lets the middleware forget it (a later sample makes a
    /// fresh instance).
    fn maybe_reclaim(&mut self, i: u32) {
        let inst = &mut self.instances[i as usize];
        if inst.in_use && inst.state != InstanceState::Alive && inst.chain.len() == 0 && inst.writers.is_empty() {
            inst.in_use = false;
            inst.next_free = self.instance_free;
            self.instance_free = i;
            let removed = self.instance_index.remove(&inst.handle);
            debug_assert_eq!(removed, Some(i));
        }
    }

    /// Room for one more sample in instance `i` (or in a new instance when
    /// `i` is `None`): `Ok(true)` when keep-last must replace the oldest.
    fn room(&self, i: Option<u32>) -> Result<bool, RejectReason> {
        let len = i.map_or(0, |i| self.instances[i as usize].chain.len());
        match self.depth {
            Some(depth) if len >= depth => Ok(true),
            None if len >= self.max_samples_per_instance => Err(RejectReason::SamplesPerInstanceLimit),
            _ if self.store.is_full() => Err(RejectReason::SamplesLimit),
            _ => Ok(false),
        }
    }

    /// Stores a sample in instance `i`, replacing its oldest when `replace`.
    fn store(&mut self, i: u32, sample: Stored, payload: &[u8], replace: bool) {
        let mut chain = self.instances[i as usize].chain;
        if replace {
            let oldest = chain.first();
            self.store.remove(&mut chain, oldest);
            self.status.replaced += 1;
        }
        let stored = self.store.push_back(&mut chain, sample, payload);
        assert!(stored.is_some(), "room was checked");
        self.instances[i as usize].chain = chain;
    }

    /// `writer` leaves instance `i` (unregister or loss); ownership passes
    /// to the strongest live writer left; an alive instance left with no
    /// writer becomes not-alive-no-writers and `notice` announces it. Without
    /// room for the notice this refuses (nothing changes), unless `force`
    /// (a loss, which cannot be refused): the state then changes silently.
    fn unregister(
        &mut self,
        i: u32,
        writer: WriterId,
        mut notice: Stored,
        payload: &[u8],
        force: bool,
    ) -> Result<(), RejectReason> {
        let inst = &self.instances[i as usize];
        let Some(pos) = inst.writers.iter().position(|&w| w == writer) else {
            return Ok(());
        };
        let becomes_writerless = inst.writers.len() == 1 && inst.state == InstanceState::Alive;
        let room = if becomes_writerless {
            Some(self.room(Some(i)))
        } else {
            None
        };
        if let Some(Err(reason)) = room {
            if !force {
                return Err(reason);
            }
        }
        let inst = &mut self.instances[i as usize];
        inst.writers.swap_remove(pos);
        if inst.owner == Some(writer) {
            let next_owner = self.strongest_writer(i);
            self.instances[i as usize].owner = next_owner;
        }
        if becomes_writerless {
            let inst = &mut self.instances[i as usize];
            inst.state = InstanceState::NotAliveNoWriters;
            notice.instance = i;
            notice.disposed_generation_count = inst.disposed_generation_count;
            notice.no_writers_generation_count = inst.no_writers_generation_count;
            if let Some(Ok(replace)) = room {
                self.store(i, notice, payload, replace);
            }
        }
        Ok(())
    }

    fn reject(&mut self, reason: RejectReason, instance: InstanceHandle) -> Insert {
        self.status.samples_rejected += 1;
        self.status.last_reject_reason = Some(reason);
        self.status.last_rejected_instance = instance;
        match reason {
            RejectReason::InstancesLimit => Insert::RejectedInstancesLimit,
            RejectReason::SamplesPerInstanceLimit => Insert::RejectedPerInstanceLimit,
            RejectReason::SamplesLimit | RejectReason::SampleTooLarge | RejectReason::WritersLimit => {
                Insert::RejectedSamplesLimit
            }
        }
    }

    // ----- insert -----

    /// Offers a received sample (data, dispose or unregister) at `now_ns`.
    /// A rejected sample (`Rejected*`) changes nothing, so the engine may
    /// offer it again; every other outcome is final for that `(writer,
    /// seq)`.
    pub fn insert(&mut self, meta: &SampleMeta, payload: &[u8], now_ns: u64) -> Insert {
        let Some(w) = self.writer_entry(meta.writer) else {
            return self.reject(RejectReason::WritersLimit, meta.instance);
        };
        let entry = &mut self.writers[w as usize];
        if meta.seq <= entry.last_seq_done {
            self.status.duplicates += 1;
            return Insert::Duplicate;
        }
        if entry.last_seq_seen != 0 && meta.seq > entry.last_seq_seen.saturating_add(1) {
            self.status.samples_lost += meta.seq - entry.last_seq_seen - 1;
        }
        entry.last_seq_seen = entry.last_seq_seen.max(meta.seq);
        entry.strength = meta.strength;
        let expiry_ns = entry
            .lifespan_ns
            .map_or(u64::MAX, |l| meta.source_timestamp_ns.saturating_add(l));
        // A sample asserts its writer's liveliness.
        self.set_alive(w);
        if payload.len() > SAMPLE_BYTES_LIMIT as usize {
            return self.reject(RejectReason::SampleTooLarge, meta.instance);
        }
        if meta.kind == SampleKind::Data && expiry_ns <= now_ns {
            self.writers[w as usize].last_seq_done = meta.seq;
            self.status.expired += 1;
            return Insert::Expired;
        }
        let outcome = self.apply(meta, payload, now_ns, expiry_ns);
        if !matches!(
            outcome,
            Insert::RejectedSamplesLimit | Insert::RejectedInstancesLimit | Insert::RejectedPerInstanceLimit
        ) {
            self.writers[w as usize].last_seq_done = meta.seq;
        }
        outcome
    }

    fn apply(&mut self, meta: &SampleMeta, payload: &[u8], now_ns: u64, expiry_ns: u64) -> Insert {
        // Before it is known whether the sample is kept: never too late.
        self.next_expiry_ns = self.next_expiry_ns.min(expiry_ns);
        let existing = self.instance_index.get(&meta.instance).copied();
        let mut sample = Stored {
            writer: meta.writer,
            seq: meta.seq,
            source_timestamp_ns: meta.source_timestamp_ns,
            reception_timestamp_ns: now_ns,
            expiry_ns,
            instance: existing.unwrap_or(NIL),
            valid_data: meta.kind == SampleKind::Data,
            read: false,
            disposed_generation_count: 0,
            no_writers_generation_count: 0,
        };
        if meta.kind == SampleKind::Unregister {
            let Some(i) = existing else { return Insert::Accepted };
            return match self.unregister(i, meta.writer, sample, payload, false) {
                Ok(()) => {
                    self.maybe_reclaim(i);
                    Insert::Accepted
                }
                Err(reason) => self.reject(reason, meta.instance),
            };
        }
        if let Some(i) = existing {
            if self.exclusive && !self.may_own(i, meta.writer, meta.strength) {
                // A writer of the instance all the same: a candidate owner.
                let writers = &mut self.instances[i as usize].writers;
                if !writers.contains(&meta.writer) {
                    writers.push(meta.writer);
                }
                self.status.not_owner += 1;
                return Insert::NotOwner;
            }
        } else if self.instance_index.len() as u32 >= self.max_instances {
            return self.reject(RejectReason::InstancesLimit, meta.instance);
        }
        let replace = match self.room(existing) {
            Ok(replace) => replace,
            Err(reason) => return self.reject(reason, meta.instance),
        };
        let i = match existing {
            Some(i) => i,
            None => self.new_instance(meta.instance, now_ns),
        };
        sample.instance = i;
        let inst = &mut self.instances[i as usize];
        if !inst.writers.contains(&meta.writer) {
            inst.writers.push(meta.writer);
        }
        if self.exclusive {
            inst.owner = Some(meta.writer);
        }
        match meta.kind {
            SampleKind::Data => {
                match inst.state {
                    InstanceState::Alive => {}
                    InstanceState::NotAliveDisposed => inst.disposed_generation_count += 1,
                    InstanceState::NotAliveNoWriters => inst.no_writers_generation_count += 1,
                }
                if inst.state != InstanceState::Alive {
                    inst.state = InstanceState::Alive;
                    inst.view_new = true;
                    inst.viewed_call = 0;
                }
                inst.last_data_ns = now_ns;
                inst.deadline_missed = 0;
            }
            SampleKind::Dispose => {
                if inst.state == InstanceState::NotAliveDisposed {
                    // Already disposed: nothing new to announce.
                    return Insert::Accepted;
                }
                inst.state = InstanceState::NotAliveDisposed;
            }
            SampleKind::Unregister => unreachable!("handled above"),
        }
        sample.disposed_generation_count = inst.disposed_generation_count;
        sample.no_writers_generation_count = inst.no_writers_generation_count;
        self.store(i, sample, payload, replace);
        if replace {
            Insert::AcceptedReplacedOldest
        } else {
            Insert::Accepted
        }
    }

    // ----- time -----

    /// Counts the deadline periods that ended without a sample, per alive
    /// instance, since its last sample: one miss per period, each counted
    /// once. Returns the misses new since the last call.
    pub fn check_deadlines(&mut self, now_ns: u64) -> u32 {
        let Some(period_ns) = self.deadline_ns else { return 0 };
        let mut missed_new = 0u64;
        for inst in self
            .instances
            .iter_mut()
            .filter(|i| i.in_use && i.state == InstanceState::Alive)
        {
            let periods = now_ns.saturating_sub(inst.last_data_ns) / period_ns;
            if periods > inst.deadline_missed {
                missed_new += periods - inst.deadline_missed;
                inst.deadline_missed = periods;
                self.status.last_instance_missed = inst.handle;
            }
        }
        self.status.deadline_missed_total += missed_new;
        u32::try_from(missed_new).unwrap_or(u32::MAX)
    }

    /// Drops the samples whose lifespan has ended
    /// (`source_timestamp_ns + lifespan_ns ≤ now_ns`), read or not.
    /// Returns how many.
    pub fn expire(&mut self, now_ns: u64) -> u32 {
        if now_ns < self.next_expiry_ns {
            return 0;
        }
        let mut expired = 0u32;
        let mut next_expiry_ns = u64::MAX;
        let mut idx = self.store.first();
        while idx != NIL {
            let next = self.store.next(idx);
            let s = *self.store.meta(idx);
            if s.expiry_ns > now_ns {
                next_expiry_ns = next_expiry_ns.min(s.expiry_ns);
            } else {
                let mut chain = self.instances[s.instance as usize].chain;
                self.store.remove(&mut chain, idx);
                self.instances[s.instance as usize].chain = chain;
                self.maybe_reclaim(s.instance);
                expired += 1;
            }
            idx = next;
        }
        self.next_expiry_ns = next_expiry_ns;
        self.status.expired += u64::from(expired);
        expired
    }

    // ----- read / take -----

    /// Calls `f` for up to `max` samples matching `mask`, oldest first
    /// (reception order), and marks them read; they stay in the cache.
    /// Returns how many.
    pub fn read_with(&mut self, max: usize, mask: StateMask, f: impl FnMut(&SampleInfo, &[u8])) -> usize {
        self.visit(max, mask, None, false, f)
    }

    /// As [`ReaderCache::read_with`], but removes the samples.
    pub fn take_with(&mut self, max: usize, mask: StateMask, f: impl FnMut(&SampleInfo, &[u8])) -> usize {
        self.visit(max, mask, None, true, f)
    }

    /// Takes up to `max` samples of one instance, whatever their states.
    pub fn take_instance_with(
        &mut self,
        instance: InstanceHandle,
        max: usize,
        f: impl FnMut(&SampleInfo, &[u8]),
    ) -> usize {
        match self.instance_index.get(&instance) {
            Some(&i) => self.visit(max, StateMask::ANY, Some(i), true, f),
            None => 0,
        }
    }

    /// As [`ReaderCache::take_instance_with`], but reads.
    pub fn read_instance_with(
        &mut self,
        instance: InstanceHandle,
        max: usize,
        f: impl FnMut(&SampleInfo, &[u8]),
    ) -> usize {
        match self.instance_index.get(&instance) {
            Some(&i) => self.visit(max, StateMask::ANY, Some(i), false, f),
            None => 0,
        }
    }

    fn visit(
        &mut self,
        max: usize,
        mask: StateMask,
        only: Option<u32>,
        take: bool,
        mut f: impl FnMut(&SampleInfo, &[u8]),
    ) -> usize {
        self.call += 1;
        let call = self.call;
        let mut count = 0usize;
        let mut idx = match only {
            Some(i) => self.instances[i as usize].chain.first(),
            None => self.store.first(),
        };
        while idx != NIL && count < max {
            let next = if only.is_some() {
                self.store.chain_next(idx)
            } else {
                self.store.next(idx)
            };
            let s = *self.store.meta(idx);
            let inst = &self.instances[s.instance as usize];
            let sample_state = if s.read {
                SampleState::Read
            } else {
                SampleState::NotRead
            };
            let view_state = inst.view_state(call);
            if mask.matches(sample_state, view_state, inst.state) {
                let info = SampleInfo {
                    sample_state,
                    view_state,
                    instance_state: inst.state,
                    valid_data: s.valid_data,
                    source_timestamp_ns: s.source_timestamp_ns,
                    reception_timestamp_ns: s.reception_timestamp_ns,
                    writer: s.writer,
                    seq: s.seq,
                    instance: inst.handle,
                    disposed_generation_count: s.disposed_generation_count,
                    no_writers_generation_count: s.no_writers_generation_count,
                };
                f(&info, self.store.payload(idx));
                self.instances[s.instance as usize].mark_viewed(call);
                if take {
                    let mut chain = self.instances[s.instance as usize].chain;
                    self.store.remove(&mut chain, idx);
                    self.instances[s.instance as usize].chain = chain;
                    self.maybe_reclaim(s.instance);
                } else {
                    self.store.meta_mut(idx).read = true;
                }
                count += 1;
            }
            idx = next;
        }
        count
    }

    /// Checks the cache's invariants (tests and debug builds): the limits
    /// hold and the lists agree.
    pub fn check_invariants(&self) {
        let in_use: Vec<&Instance> = self.instances.iter().filter(|i| i.in_use).collect();
        assert_eq!(in_use.len(), self.instance_index.len());
        assert!(in_use.len() as u32 <= self.max_instances);
        let per_instance_max = self.depth.unwrap_or(self.max_samples_per_instance);
        let mut total = 0usize;
        for inst in &in_use {
            assert!(inst.chain.len() <= per_instance_max, "instance over its limit");
            let mut n = 0u32;
            let mut idx = inst.chain.first();
            while idx != NIL {
                assert_eq!(self.store.meta(idx).instance, self.instance_index[&inst.handle]);
                n += 1;
                idx = self.store.chain_next(idx);
            }
            assert_eq!(n, inst.chain.len());
            total += n as usize;
        }
        assert_eq!(total, self.store.len());
        assert!(self.store.len() <= self.store.capacity as usize);
        assert!(self.writers.len() <= MATCHED_WRITERS_MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::qos::ResourceLimits;

    const W1: WriterId = WriterId(1);
    const W2: WriterId = WriterId(2);
    const W3: WriterId = WriterId(3);
    const K1: InstanceHandle = InstanceHandle(101);
    const K2: InstanceHandle = InstanceHandle(102);
    const K3: InstanceHandle = InstanceHandle(103);

    fn limits(max_samples: u32, max_instances: u32, max_samples_per_instance: u32) -> ResourceLimits {
        ResourceLimits {
            max_samples,
            max_instances,
            max_samples_per_instance,
        }
    }

    /// A reader cache fed by simulated writers: each writer's seq counts
    /// up; time is `now`, source timestamps are the time of the write.
    struct Rig {
        cache: ReaderCache,
        seqs: HashMap<WriterId, u64>,
        strengths: HashMap<WriterId, i32>,
        now: u64,
    }

    type Got = Vec<(SampleInfo, Vec<u8>)>;

    impl Rig {
        fn new(qos: ReaderQos) -> Rig {
            Rig {
                cache: ReaderCache::new(&qos),
                seqs: HashMap::new(),
                strengths: HashMap::new(),
                now: 1,
            }
        }

        fn matched(&mut self, w: WriterId, strength: i32) {
            self.strengths.insert(w, strength);
            assert!(self.cache.writer_matched(w, strength, self.now));
        }

        fn send(&mut self, w: WriterId, k: InstanceHandle, kind: SampleKind, byte: u8) -> Insert {
            let seq = self.seqs.entry(w).or_insert(0);
            *seq += 1;
            let meta = SampleMeta {
                writer: w,
                seq: *seq,
                source_timestamp_ns: self.now,
                instance: k,
                kind,
                strength: self.strengths.get(&w).copied().unwrap_or(0),
            };
            let outcome = self.cache.insert(&meta, &[byte], self.now);
            if matches!(
                outcome,
                Insert::RejectedSamplesLimit | Insert::RejectedInstancesLimit | Insert::RejectedPerInstanceLimit
            ) {
                // Not consumed: the writer offers it again.
                *self.seqs.get_mut(&w).unwrap() -= 1;
            }
            self.cache.check_invariants();
            outcome
        }

        fn write(&mut self, w: WriterId, k: InstanceHandle, byte: u8) -> Insert {
            self.send(w, k, SampleKind::Data, byte)
        }

        fn dispose(&mut self, w: WriterId, k: InstanceHandle) -> Insert {
            self.send(w, k, SampleKind::Dispose, 0)
        }

        fn unregister(&mut self, w: WriterId, k: InstanceHandle) -> Insert {
            self.send(w, k, SampleKind::Unregister, 0)
        }

        fn take(&mut self) -> Got {
            let mut got = Vec::new();
            self.cache
                .take_with(usize::MAX, StateMask::ANY, |i, b| got.push((*i, b.to_vec())));
            self.cache.check_invariants();
            got
        }

        fn read(&mut self, mask: StateMask) -> Got {
            let mut got = Vec::new();
            self.cache
                .read_with(usize::MAX, mask, |i, b| got.push((*i, b.to_vec())));
            got
        }
    }

    fn bytes(got: &Got) -> Vec<u8> {
        got.iter().filter(|(i, _)| i.valid_data).map(|(_, b)| b[0]).collect()
    }

    #[test]
    fn keep_last_keeps_the_newest_n_per_instance() {
        let mut rig = Rig::new(ReaderQos::default().keep_last(2));
        rig.matched(W1, 0);
        assert_eq!(rig.write(W1, K1, 1), Insert::Accepted);
        assert_eq!(rig.write(W1, K1, 2), Insert::Accepted);
        assert_eq!(rig.write(W1, K2, 20), Insert::Accepted);
        for b in 3..=5 {
            assert_eq!(rig.write(W1, K1, b), Insert::AcceptedReplacedOldest);
        }
        assert_eq!(rig.cache.status().replaced, 3);
        assert_eq!(rig.cache.len(), 3);
        // Reception order across instances; the last 2 of K1.
        assert_eq!(bytes(&rig.take()), vec![20, 4, 5]);
        assert!(!rig.cache.is_full(), "keep-last is never full");
    }

    #[test]
    fn keep_all_rejects_at_the_per_instance_and_sample_limits_and_accepts_the_retry() {
        let mut rig = Rig::new(ReaderQos::default().keep_all().resource_limits(limits(4, 2, 3)));
        rig.matched(W1, 0);
        for b in 1..=3 {
            assert_eq!(rig.write(W1, K1, b), Insert::Accepted);
        }
        assert_eq!(rig.write(W1, K1, 4), Insert::RejectedPerInstanceLimit);
        let st = rig.cache.status();
        assert_eq!(
            (st.samples_rejected, st.last_reject_reason),
            (1, Some(RejectReason::SamplesPerInstanceLimit))
        );
        assert_eq!(st.last_rejected_instance, K1);
        assert_eq!(rig.write(W1, K2, 10), Insert::Accepted);
        assert!(rig.cache.is_full());
        assert_eq!(rig.write(W1, K2, 11), Insert::RejectedSamplesLimit);
        assert_eq!(rig.cache.status().last_reject_reason, Some(RejectReason::SamplesLimit));
        assert_eq!(rig.cache.len(), 4);
        // The application takes one of K1: the refused sample is accepted
        // when offered again (same seq: not a duplicate), nothing was lost.
        assert_eq!(rig.cache.take_instance_with(K1, 1, |_, _| {}), 1);
        assert!(!rig.cache.is_full());
        assert_eq!(rig.write(W1, K2, 11), Insert::Accepted);
        assert_eq!(bytes(&rig.take()), vec![2, 3, 10, 11]);
        assert_eq!(rig.cache.status().samples_lost, 0);
    }

    #[test]
    fn keep_last_still_bounds_the_total_and_the_instances() {
        let mut rig = Rig::new(ReaderQos::default().keep_last(2).resource_limits(limits(2, 2, 2)));
        rig.matched(W1, 0);
        rig.write(W1, K1, 1);
        rig.write(W1, K1, 2);
        // K2 would need a third slot.
        assert_eq!(rig.write(W1, K2, 3), Insert::RejectedSamplesLimit);
        // K1 replaces within itself.
        assert_eq!(rig.write(W1, K1, 4), Insert::AcceptedReplacedOldest);
        rig.take();
        assert_eq!(rig.write(W1, K2, 3), Insert::Accepted);
        assert_eq!(rig.write(W1, K3, 5), Insert::RejectedInstancesLimit);
        assert_eq!(
            rig.cache.status().last_reject_reason,
            Some(RejectReason::InstancesLimit)
        );
        assert_eq!(rig.cache.status().instances, 2);
    }

    #[test]
    fn a_disposed_unregistered_and_taken_instance_frees_its_place() {
        let mut rig = Rig::new(ReaderQos::default().resource_limits(limits(8, 1, 8)));
        rig.matched(W1, 0);
        rig.write(W1, K1, 1);
        assert_eq!(rig.write(W1, K2, 2), Insert::RejectedInstancesLimit);
        rig.dispose(W1, K1);
        rig.unregister(W1, K1);
        assert_eq!(rig.cache.status().instances, 1, "still holds samples");
        rig.take();
        assert_eq!(rig.cache.status().instances, 0);
        assert_eq!(rig.write(W1, K2, 2), Insert::Accepted);
    }

    #[test]
    fn lifespan_drops_samples_when_their_time_is_up() {
        let mut rig = Rig::new(ReaderQos::default().keep_all());
        rig.matched(W1, 0);
        rig.matched(W2, 0);
        rig.cache.set_writer_lifespan(W1, Some(100));
        rig.now = 1000;
        rig.write(W1, K1, 1); // expires at 1100
        rig.write(W2, K1, 2); // never
        rig.now = 1050;
        rig.write(W1, K2, 3); // expires at 1150
        assert_eq!(rig.cache.expire(1099), 0);
        assert_eq!(rig.cache.expire(1100), 1);
        assert_eq!(rig.cache.len(), 2);
        assert_eq!(rig.cache.expire(5000), 1);
        assert_eq!(bytes(&rig.take()), vec![2]);
        // A sample already past its lifespan on arrival.
        let meta = SampleMeta {
            writer: W1,
            seq: 10,
            source_timestamp_ns: 1000,
            instance: K1,
            kind: SampleKind::Data,
            strength: 0,
        };
        assert_eq!(rig.cache.insert(&meta, &[9], 1100), Insert::Expired);
        assert_eq!(rig.cache.insert(&meta, &[9], 1100), Insert::Duplicate);
        assert_eq!(rig.cache.status().expired, 3);
    }

    #[test]
    fn deadline_counts_one_miss_per_elapsed_period_once() {
        let mut rig = Rig::new(ReaderQos::default().deadline(std::time::Duration::from_nanos(100)));
        rig.matched(W1, 0);
        rig.now = 0;
        rig.write(W1, K1, 1);
        rig.now = 50;
        rig.write(W1, K2, 2);
        assert_eq!(rig.cache.check_deadlines(99), 0);
        assert_eq!(rig.cache.check_deadlines(100), 1); // K1
        assert_eq!(rig.cache.status().last_instance_missed, K1);
        assert_eq!(rig.cache.check_deadlines(150), 1); // K2
        assert_eq!(
            rig.cache.check_deadlines(150),
            0,
            "the same period is not counted again"
        );
        assert_eq!(rig.cache.check_deadlines(350), 4); // K1: periods 2,3; K2: periods 2,3
        rig.now = 360;
        rig.write(W1, K1, 3); // K1 on time again
        assert_eq!(rig.cache.check_deadlines(400), 0);
        assert_eq!(rig.cache.check_deadlines(460), 2); // K1 period 1, K2 period 4
        assert_eq!(rig.cache.status().deadline_missed_total, 8);
        // A disposed instance has no deadline.
        rig.dispose(W1, K1);
        rig.dispose(W1, K2);
        assert_eq!(rig.cache.check_deadlines(10_000), 0);
        // No deadline policy: nothing is ever missed.
        let mut none = Rig::new(ReaderQos::default());
        none.matched(W1, 0);
        none.write(W1, K1, 1);
        assert_eq!(none.cache.check_deadlines(u64::MAX), 0);
    }

    #[test]
    fn exclusive_ownership_accepts_the_strongest_and_fails_over_on_loss() {
        let mut rig = Rig::new(ReaderQos::default().exclusive().keep_all());
        rig.matched(W1, 10);
        rig.matched(W2, 20);
        assert_eq!(rig.write(W1, K1, 1), Insert::Accepted);
        assert_eq!(rig.write(W2, K1, 2), Insert::Accepted, "stronger takes over");
        assert_eq!(rig.write(W1, K1, 3), Insert::NotOwner);
        assert_eq!(rig.dispose(W1, K1), Insert::NotOwner, "only the owner disposes");
        // Per instance: W1 owns K2 while W2 does not write it.
        assert_eq!(rig.write(W1, K2, 4), Insert::Accepted);
        assert_eq!(rig.cache.status().not_owner, 2);
        // The owner is lost: the next strongest live writer's next sample is accepted.
        rig.cache.writer_lost(W2, rig.now);
        assert_eq!(
            rig.cache.instance_state(K1),
            Some(InstanceState::Alive),
            "W1 still writes K1"
        );
        assert_eq!(rig.write(W1, K1, 5), Insert::Accepted);
        // W2 comes back and is stronger again.
        assert_eq!(rig.write(W2, K1, 6), Insert::Accepted);
        assert_eq!(rig.write(W1, K1, 7), Insert::NotOwner);
        // The owner unregisters: ownership passes as well.
        rig.unregister(W2, K1);
        assert_eq!(rig.write(W1, K1, 8), Insert::Accepted);
        assert_eq!(bytes(&rig.take()), vec![1, 2, 4, 5, 6, 8]);
    }

    #[test]
    fn exclusive_ownership_ties_go_to_the_lower_writer_id() {
        let mut rig = Rig::new(ReaderQos::default().exclusive().keep_all());
        rig.matched(W3, 5);
        rig.matched(W1, 5);
        assert_eq!(rig.write(W3, K1, 1), Insert::Accepted);
        assert_eq!(rig.write(W1, K1, 2), Insert::Accepted);
        assert_eq!(rig.write(W3, K1, 3), Insert::NotOwner);
        // Failover picks the strongest live registered writer, not the first to write.
        let mut rig = Rig::new(ReaderQos::default().exclusive().keep_all());
        rig.matched(W1, 1);
        rig.matched(W2, 2);
        rig.matched(W3, 3);
        rig.write(W3, K1, 1);
        assert_eq!(rig.write(W1, K1, 2), Insert::NotOwner);
        assert_eq!(rig.write(W2, K1, 3), Insert::NotOwner);
        rig.cache.writer_lost(W3, rig.now);
        assert_eq!(rig.write(W1, K1, 4), Insert::NotOwner, "W2 is stronger and writes K1");
        assert_eq!(rig.write(W2, K1, 5), Insert::Accepted);
    }

    #[test]
    fn shared_ownership_accepts_every_writer() {
        let mut rig = Rig::new(ReaderQos::default().keep_all());
        rig.matched(W1, 10);
        rig.matched(W2, 20);
        for (w, b) in [(W1, 1), (W2, 2), (W1, 3), (W2, 4)] {
            assert_eq!(rig.write(w, K1, b), Insert::Accepted);
        }
        assert_eq!(bytes(&rig.take()), vec![1, 2, 3, 4]);
        assert_eq!(rig.cache.status().not_owner, 0);
    }

    #[test]
    fn liveliness_counts_follow_matches_losses_and_samples() {
        let mut rig = Rig::new(ReaderQos::default());
        let live = |rig: &Rig| {
            let l = rig.cache.status().liveliness_changed;
            (l.alive_count, l.not_alive_count)
        };
        rig.matched(W1, 0);
        rig.matched(W2, 0);
        rig.matched(W2, 0);
        assert_eq!(live(&rig), (2, 0));
        rig.cache.writer_lost(W1, 5);
        rig.cache.writer_lost(W1, 6);
        assert_eq!(live(&rig), (1, 1));
        rig.write(W1, K1, 1); // a sample asserts liveliness
        assert_eq!(live(&rig), (2, 0));
        rig.cache.writer_removed(W2, 7);
        assert_eq!(live(&rig), (1, 0));
        rig.write(W3, K1, 2); // an unannounced writer counts once it writes
        assert_eq!(live(&rig), (2, 0));
        assert_eq!(rig.cache.status().liveliness_changed.changes_total, 6);
    }

    #[test]
    fn dispose_and_unregister_change_the_instance_state_and_are_delivered_once() {
        let mut rig = Rig::new(ReaderQos::default().keep_all());
        rig.matched(W1, 0);
        rig.matched(W2, 0);
        rig.write(W1, K1, 1);
        assert_eq!(rig.dispose(W1, K1), Insert::Accepted);
        assert_eq!(rig.dispose(W1, K1), Insert::Accepted);
        let got = rig.read(StateMask::NOT_READ);
        assert_eq!(got.len(), 2, "the data and one dispose notice: {got:?}");
        assert!(got
            .iter()
            .all(|(i, _)| i.instance_state == InstanceState::NotAliveDisposed));
        assert!(got[0].0.valid_data && !got[1].0.valid_data);
        assert_eq!(got[1].1, vec![0], "the dispose's bytes (the rig sends [0])");
        assert!(rig.read(StateMask::NOT_READ).is_empty(), "delivered once");
        rig.take();
        // A new sample revives it: view new again, generation bumped.
        rig.write(W1, K1, 2);
        let got = rig.take();
        assert_eq!(got.len(), 1);
        let info = got[0].0;
        assert_eq!(
            (info.instance_state, info.view_state, info.disposed_generation_count),
            (InstanceState::Alive, ViewState::New, 1)
        );
        // Unregister: alive while another writer remains, then no writers.
        rig.write(W1, K2, 3);
        rig.write(W2, K2, 4);
        rig.unregister(W1, K2);
        assert_eq!(rig.cache.instance_state(K2), Some(InstanceState::Alive));
        rig.unregister(W2, K2);
        assert_eq!(rig.cache.instance_state(K2), Some(InstanceState::NotAliveNoWriters));
        let got = rig.take();
        assert_eq!(got.len(), 3);
        assert!(!got[2].0.valid_data && got[2].0.writer == W2);
        assert_eq!(rig.cache.instance_state(K2), None, "reclaimed once empty");
        // A writer lost: its instances with no other writer (K1 and K3)
        // lose their writers, each announced once.
        rig.write(W1, K3, 5);
        rig.cache.writer_lost(W1, 77);
        let got = rig.take();
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].0.valid_data && got[0].0.instance == K3);
        let mut notices: Vec<InstanceHandle> = got[1..].iter().map(|(i, _)| i.instance).collect();
        notices.sort();
        assert_eq!(notices, vec![K1, K3]);
        for (info, _) in &got {
            assert_eq!(info.instance_state, InstanceState::NotAliveNoWriters);
        }
        for (info, _) in &got[1..] {
            assert_eq!(
                (info.valid_data, info.writer, info.seq, info.source_timestamp_ns),
                (false, W1, 0, 77)
            );
        }
        rig.write(W1, K3, 6);
        assert_eq!(rig.cache.instance_state(K3), Some(InstanceState::Alive));
    }

    #[test]
    fn an_unregister_without_room_for_its_notice_is_refused_whole() {
        let mut rig = Rig::new(ReaderQos::default().keep_all().resource_limits(limits(2, 2, 2)));
        rig.matched(W1, 0);
        rig.write(W1, K1, 1);
        rig.write(W1, K1, 2);
        assert_eq!(rig.unregister(W1, K1), Insert::RejectedPerInstanceLimit);
        assert_eq!(
            rig.cache.instance_state(K1),
            Some(InstanceState::Alive),
            "nothing changed"
        );
        assert_eq!(rig.cache.take_instance_with(K1, 1, |_, _| {}), 1);
        assert_eq!(rig.unregister(W1, K1), Insert::Accepted, "offered again");
        assert_eq!(rig.cache.instance_state(K1), Some(InstanceState::NotAliveNoWriters));
        let got = rig.take();
        assert_eq!((got.len(), got[1].0.valid_data, got[1].1.clone()), (2, false, vec![0]));
    }

    #[test]
    fn sample_and_view_states_follow_the_reads() {
        let mut rig = Rig::new(ReaderQos::default().keep_all());
        rig.matched(W1, 0);
        rig.write(W1, K1, 1);
        rig.write(W1, K1, 2);
        let got = rig.read(StateMask::ANY);
        assert!(got
            .iter()
            .all(|(i, _)| i.view_state == ViewState::New && i.sample_state == SampleState::NotRead));
        rig.write(W1, K1, 3);
        assert!(rig.read(StateMask::NEW_VIEW).is_empty());
        let got = rig.read(StateMask::ANY);
        let states: Vec<SampleState> = got.iter().map(|(i, _)| i.sample_state).collect();
        assert_eq!(states, vec![SampleState::Read, SampleState::Read, SampleState::NotRead]);
        assert!(got.iter().all(|(i, _)| i.view_state == ViewState::NotNew));
        assert_eq!(rig.read(StateMask::READ).len(), 3);
        assert_eq!(rig.read(StateMask::NOT_ALIVE).len(), 0);
        assert_eq!(
            rig.cache.read_with(2, StateMask::ALIVE, |_, _| {}),
            2,
            "max is honoured"
        );
    }

    #[test]
    fn duplicates_are_refused_and_gaps_counted_as_lost() {
        let mut rig = Rig::new(ReaderQos::default().keep_all());
        let meta = |seq| SampleMeta {
            writer: W1,
            seq,
            source_timestamp_ns: seq,
            instance: K1,
            kind: SampleKind::Data,
            strength: 0,
        };
        assert_eq!(rig.cache.insert(&meta(1), &[1], 1), Insert::Accepted);
        assert_eq!(rig.cache.insert(&meta(1), &[1], 2), Insert::Duplicate);
        assert_eq!(rig.cache.insert(&meta(4), &[4], 3), Insert::Accepted);
        assert_eq!(
            rig.cache.insert(&meta(3), &[3], 4),
            Insert::Duplicate,
            "older than the last accepted"
        );
        let st = rig.cache.status();
        assert_eq!((st.duplicates, st.samples_lost), (2, 2));
        assert_eq!(bytes(&rig.take()), vec![1, 4]);
    }

    #[test]
    fn a_freed_slot_reuses_its_payload_buffer() {
        let mut store: SampleStore<u32> = SampleStore::new(2);
        let mut chain = Chain::EMPTY;
        let a = store.push_back(&mut chain, 1, &[7u8; 100]).unwrap();
        let ptr = store.payload(a).as_ptr();
        store.remove(&mut chain, a);
        let b = store.push_back(&mut chain, 2, &[8u8; 60]).unwrap();
        assert_eq!((a, store.payload(b).as_ptr(), store.payload(b).len()), (b, ptr, 60));
        store.push_back(&mut chain, 3, &[]).unwrap();
        assert!(store.push_back(&mut chain, 4, &[]).is_none(), "bounded");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write { w: u8, k: u8, gap: bool, repeat: bool },
        Dispose { w: u8, k: u8 },
        Unregister { w: u8, k: u8 },
        Read { max: usize, mask: u8 },
        Take { max: usize, mask: u8 },
        TakeInstance { k: u8, max: usize },
        Lost { w: u8 },
        Matched { w: u8 },
        Advance { dt: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..3u8, 0..4u8, any::<bool>(), proptest::bool::weighted(0.1))
                .prop_map(|(w, k, gap, repeat)| Op::Write { w, k, gap, repeat }),
            1 => (0..3u8, 0..4u8).prop_map(|(w, k)| Op::Dispose { w, k }),
            1 => (0..3u8, 0..4u8).prop_map(|(w, k)| Op::Unregister { w, k }),
            2 => (0..4usize, 0..6u8).prop_map(|(max, mask)| Op::Read { max, mask }),
            2 => (0..4usize, 0..6u8).prop_map(|(max, mask)| Op::Take { max, mask }),
            1 => (0..4u8, 0..3usize).prop_map(|(k, max)| Op::TakeInstance { k, max }),
            1 => (0..3u8).prop_map(|w| Op::Lost { w }),
            1 => (0..3u8).prop_map(|w| Op::Matched { w }),
            1 => (0..50u64).prop_map(|dt| Op::Advance { dt }),
        ]
    }

    fn qos() -> impl Strategy<Value = ReaderQos> {
        (
            1..8u32,
            1..4u32,
            1..8u32,
            prop_oneof![Just(None), (1..4u32).prop_map(Some)],
            any::<bool>(),
        )
            .prop_map(|(max_samples, max_instances, per, depth, exclusive)| {
                let per = per.min(max_samples);
                let mut q = ReaderQos::default()
                    .resource_limits(limits(max_samples, max_instances, per))
                    .deadline(std::time::Duration::from_nanos(7));
                q = match depth {
                    Some(d) => q.keep_last(d.min(per)),
                    None => q.keep_all(),
                };
                if exclusive {
                    q = q.exclusive();
                }
                q
            })
    }

    const MASKS: [StateMask; 6] = [
        StateMask::ANY,
        StateMask::NOT_READ,
        StateMask::READ,
        StateMask::NEW_VIEW,
        StateMask::ALIVE,
        StateMask::NOT_ALIVE,
    ];

    proptest! {
        #[test]
        fn random_inserts_and_takes_keep_the_limits_and_never_deliver_twice(
            qos in qos(),
            ops in proptest::collection::vec(op(), 1..120),
            lifespan in prop_oneof![Just(None), (1..40u64).prop_map(Some)],
        ) {
            let mut cache = ReaderCache::new(&qos);
            let writers = [W1, W2, W3];
            let mut next_seq = [1u64; 3];
            cache.set_writer_lifespan(W2, lifespan);
            let mut now = 1u64;
            let mut accepted: HashSet<(WriterId, u64)> = HashSet::new();
            let mut first_reads: HashSet<(WriterId, u64)> = HashSet::new();
            let mut taken: HashSet<(WriterId, u64)> = HashSet::new();
            for op in ops {
                let mut check = |info: &SampleInfo, take: bool| {
                    if !info.valid_data {
                        return;
                    }
                    let key = (info.writer, info.seq);
                    assert!(accepted.contains(&key), "delivered a sample never accepted: {key:?}");
                    assert!(!taken.contains(&key), "delivered a taken sample again: {key:?}");
                    if info.sample_state == SampleState::NotRead {
                        assert!(first_reads.insert(key), "NotRead twice: {key:?}");
                    }
                    if take {
                        taken.insert(key);
                    }
                };
                match op {
                    Op::Write { w, k, gap, repeat } => {
                        let wi = w as usize;
                        let seq = if repeat { next_seq[wi].saturating_sub(1).max(1) } else { next_seq[wi] + u64::from(gap) };
                        let meta = SampleMeta {
                            writer: writers[wi],
                            seq,
                            source_timestamp_ns: now,
                            instance: InstanceHandle(u64::from(k)),
                            kind: SampleKind::Data,
                            strength: i32::from(w),
                        };
                        let before = accepted.contains(&(meta.writer, seq));
                        let outcome = cache.insert(&meta, &[w, k], now);
                        if matches!(outcome, Insert::Accepted | Insert::AcceptedReplacedOldest) {
                            assert!(!before, "accepted twice: {meta:?}");
                            accepted.insert((meta.writer, seq));
                        }
                        if !repeat && !matches!(outcome, Insert::RejectedSamplesLimit | Insert::RejectedInstancesLimit | Insert::RejectedPerInstanceLimit) {
                            next_seq[wi] = seq + 1;
                        }
                    }
                    Op::Dispose { w, k } | Op::Unregister { w, k } => {
                        let wi = w as usize;
                        let kind = if matches!(op, Op::Dispose { .. }) { SampleKind::Dispose } else { SampleKind::Unregister };
                        let meta = SampleMeta {
                            writer: writers[wi],
                            seq: next_seq[wi],
                            source_timestamp_ns: now,
                            instance: InstanceHandle(u64::from(k)),
                            kind,
                            strength: i32::from(w),
                        };
                        let outcome = cache.insert(&meta, &[], now);
                        if !matches!(outcome, Insert::RejectedSamplesLimit | Insert::RejectedInstancesLimit | Insert::RejectedPerInstanceLimit) {
                            next_seq[wi] += 1;
                        }
                    }
                    Op::Read { max, mask } => {
                        let n = cache.read_with(max, MASKS[mask as usize], |i, _| check(i, false));
                        prop_assert!(n <= max);
                    }
                    Op::Take { max, mask } => {
                        let n = cache.take_with(max, MASKS[mask as usize], |i, _| check(i, true));
                        prop_assert!(n <= max);
                    }
                    Op::TakeInstance { k, max } => {
                        cache.take_instance_with(InstanceHandle(u64::from(k)), max, |i, _| check(i, true));
                    }
                    Op::Lost { w } => cache.writer_lost(writers[w as usize], now),
                    Op::Matched { w } => {
                        cache.writer_matched(writers[w as usize], i32::from(w), now);
                    }
                    Op::Advance { dt } => {
                        now += dt;
                        cache.expire(now);
                        cache.check_deadlines(now);
                        // Lifespan: nothing whose time is up is left, and
                        // the walk's lower bound holds.
                        let mut idx = cache.store.first();
                        while idx != NIL {
                            let expiry_ns = cache.store.meta(idx).expiry_ns;
                            prop_assert!(expiry_ns > now, "a sample past its lifespan is kept");
                            prop_assert!(expiry_ns >= cache.next_expiry_ns);
                            idx = cache.store.next(idx);
                        }
                    }
                }
                cache.check_invariants();
                let st = cache.status();
                prop_assert!(st.samples <= qos.resource_limits.max_samples as usize);
                prop_assert!(st.instances <= qos.resource_limits.max_instances as usize);
            }
        }
    }
}
