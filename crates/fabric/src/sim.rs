//! The deterministic simulated fabric: every member of a group in one
//! process, a seeded scheduler, simulated time and injected faults
//! (STYLE.md, principle 2: simulate early; after TigerBeetle's VOPR).
//!
//! A [`SimWorld`] owns the network; [`SimWorld::open`] gives each member a
//! [`SimFabric`] that implements [`Fabric`], so protocol code runs on it
//! unchanged. Like a network fabric (tcp, ofi), every member keeps its own
//! local copy of every row:
//!
//! ```text
//!  member 0's memory          member 1's memory           links (src → dst), FIFO each
//!  ┌ row 0 (original) ┐       ┌ row 0 (copy)     ┐        0→1: [chunk][chunk][chunk]…
//!  │ row 1 (copy)     │       │ row 1 (original) │        1→0: [chunk]…
//!  └ row 2 (copy)     ┘       └ row 2 (copy)     ┘        0→2, 2→0, 1→2, 2→1 …
//! ```
//!
//! `push(range, peers)` snapshots the bytes and enqueues, per destination,
//! the push cut into 1..=`split_chunks_max` chunks (cuts on 8-byte
//! boundaries: an aligned `u64` is never torn) in a random order, each with
//! a random delivery time. [`SimWorld::deliver_due`] applies the chunks
//! whose time has come, in FIFO order per link, so the [`Fabric`] ordering
//! contract holds: pushes on one link arrive in order; bytes within one
//! push arrive in any order; different links interleave freely.
//!
//! ## Driving contract
//!
//! In the deterministic mode there is one thread: the simulator calls
//! [`SimWorld::advance`], [`SimWorld::deliver_due`] and the members' own
//! `step`s in turn, so no read of a local copy ever races with a delivery.
//! Copies are still written with atomics (`Release` per word), which makes
//! the threaded mode ([`SimWorld::spawn_pump`], for the conformance suite,
//! not deterministic) sound as well. Everything the scheduler decides comes
//! from one seeded [`SimRng`]: the same seed and the same calls give the
//! same run, event for event ([`SimWorld::trace_digest`]).
//!
//! ## Faults
//!
//! - delays and splits: per link `delay_ns_max`, per push 1..=`split_chunks_max` chunks;
//! - crash ([`SimWorld::crash`], [`SimWorld::crash_at_push`]): a crash armed
//!   at a push lands *inside* it: the push reaches a random subset of its
//!   peers; every outgoing link keeps a random prefix of what was in flight;
//! - partitions ([`SimWorld::partition`]): traffic across the cut is held
//!   (delivered after [`SimWorld::heal`]) or dropped (the links break for
//!   good, like a reset connection);
//! - failure detection: [`Fabric::check_peers`] reports a crashed or exited
//!   peer, a broken link, or a link held for `detect_timeout_ns` of
//!   simulated time, as `PeerGone`; a dropped fabric as `PeerLeft`;
//! - sabotage ([`Sabotage`]): breaks the fabric contract on purpose, to
//!   show that the checkers above catch a broken fabric.

mod event;
mod memory;
mod rng;

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::doorbell::{Doorbell, FutexDoorbell};
use crate::{check_range, Fabric, FabricError, PeerSet, RowRef, CACHE_LINE_BYTES, MEMBERS_MAX};

use event::Fnv;
pub use event::SimEvent;
use memory::MemberMemory;
pub use rng::SimRng;

// ---- options ------------------------------------------------------------------

/// Breaks the fabric contract on purpose (tests of the checkers only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sabotage {
    /// Pushes on one link may overtake each other (breaks rule 1).
    ReorderPushes,
    /// About one chunk in 64 of 32 bytes or more gets one byte flipped.
    CorruptBytes,
}

/// A simulated group: its shape, the seed, and the network's behaviour.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub member_count: usize,
    /// Rounded up to a cache line.
    pub row_len_bytes: usize,
    pub seed: u64,
    /// Each chunk arrives `0..=delay_ns_max` after its push (per link
    /// overrides: [`SimWorld::set_link_delay`]), never before an earlier
    /// push on the same link.
    pub delay_ns_max: u64,
    /// A push is cut into `1..=split_chunks_max` chunks.
    pub split_chunks_max: usize,
    /// How long a crash, an exit or a held link goes unnoticed by `check_peers`.
    pub detect_timeout_ns: u64,
    /// Bytes in flight per link; beyond it the oldest chunk is delivered
    /// at once (a held link breaks instead).
    pub link_queue_bytes_max: usize,
    /// Events kept for the trace (the digest covers all of them).
    pub trace_events_max: usize,
    pub sabotage: Option<Sabotage>,
}

impl SimOptions {
    pub fn new(member_count: usize, row_len_bytes: usize, seed: u64) -> SimOptions {
        SimOptions {
            member_count,
            row_len_bytes,
            seed,
            delay_ns_max: 0,
            split_chunks_max: 1,
            detect_timeout_ns: 1_000_000,
            link_queue_bytes_max: 16 << 20,
            trace_events_max: 256,
            sabotage: None,
        }
    }
}

// ---- the network --------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Absent,
    Running,
    Crashed { at_ns: u64 },
    Exited { at_ns: u64 },
    Left,
}

struct Chunk {
    push: u64,
    offset: usize,
    bytes: Vec<u8>,
    due_ns: u64,
}

#[derive(Default)]
struct Link {
    queue: VecDeque<Chunk>,
    queued_bytes: usize,
    delay_ns_max: u64,
    last_due_ns: u64,
    /// Held by a partition since this time.
    held_since_ns: Option<u64>,
    /// Broken (dropped traffic, overflow while held) since this time.
    broken_since_ns: Option<u64>,
}

struct Member {
    status: Status,
    pushes: u64,
    crash_at_push: Option<u64>,
}

struct Net {
    options: SimOptions,
    now_ns: u64,
    rng: SimRng,
    members: Vec<Member>,
    /// `src * member_count + dst`.
    links: Vec<Link>,
    memory: Vec<Arc<MemberMemory>>,
    next_push: u64,
    trace: VecDeque<SimEvent>,
    digest: Fnv,
    events: u64,
}

impl Net {
    fn record(&mut self, event: SimEvent) {
        event.hash(&mut self.digest);
        self.events += 1;
        if self.options.trace_events_max == 0 {
            return;
        }
        if self.trace.len() == self.options.trace_events_max {
            self.trace.pop_front();
        }
        self.trace.push_back(event);
    }

    fn link(&mut self, src: usize, dst: usize) -> &mut Link {
        &mut self.links[src * self.options.member_count + dst]
    }

    fn push(&mut self, src: usize, range: Range<usize>, peers: PeerSet) {
        if self.members[src].status != Status::Running {
            return; // a dead member's writes go nowhere
        }
        self.members[src].pushes += 1;
        let crash_here = self.members[src].crash_at_push == Some(self.members[src].pushes);
        let n = self.options.member_count;
        let mut targets = PeerSet(peers.0 & PeerSet::all_except(src, n).0);
        if crash_here {
            targets.0 &= self.rng.next_u64(); // the crash lands inside this push
        }
        let push = self.next_push;
        self.next_push += 1;
        if !range.is_empty() {
            let snapshot = MemberMemory::read(self.memory[src].row(src), range.clone());
            let mut chunks_max = 0;
            for dst in targets.iter() {
                chunks_max = chunks_max.max(self.enqueue(src, dst, push, range.start, &snapshot));
            }
            let at_ns = self.now_ns;
            let (offset, len) = (range.start, range.len());
            self.record(SimEvent::Push {
                at_ns,
                push,
                src,
                peers: targets.0,
                offset,
                len,
                chunks: chunks_max,
            });
        }
        if crash_here {
            self.crash(src, Some(push), targets.0);
        }
    }

    /// Queue one push for one link; returns the number of chunks.
    fn enqueue(&mut self, src: usize, dst: usize, push: u64, start: usize, bytes: &[u8]) -> usize {
        if !matches!(self.members[dst].status, Status::Running | Status::Absent) {
            return 0;
        }
        if self.link(src, dst).broken_since_ns.is_some() {
            return 0;
        }
        // Cut points on 8-byte row boundaries, then a random arrival order.
        let mut cuts = vec![start, start + bytes.len()];
        for _ in 1..self.options.split_chunks_max.max(1) {
            let at = start + self.rng.below(bytes.len() as u64 + 1) as usize;
            cuts.push(at - at % 8);
        }
        cuts.retain(|c| *c >= start);
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces: Vec<Range<usize>> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
        self.rng.shuffle(&mut pieces);
        let reorder = self.options.sabotage == Some(Sabotage::ReorderPushes);
        let corrupt = self.options.sabotage == Some(Sabotage::CorruptBytes);
        let now = self.now_ns;
        let count = pieces.len();
        for piece in pieces {
            let delay_max = self.link(src, dst).delay_ns_max;
            let delay = self.rng.below(delay_max + 1);
            let mut chunk_bytes = bytes[piece.start - start..piece.end - start].to_vec();
            if corrupt && chunk_bytes.len() >= 32 && self.rng.chance(16) {
                let i = self.rng.below(chunk_bytes.len() as u64) as usize;
                chunk_bytes[i] ^= 0x5A;
            }
            let link = self.link(src, dst);
            let due_ns = if reorder {
                now + delay
            } else {
                (now + delay).max(link.last_due_ns)
            };
            link.last_due_ns = due_ns;
            let chunk = Chunk {
                push,
                offset: piece.start,
                bytes: chunk_bytes,
                due_ns,
            };
            link.queued_bytes += chunk.bytes.len();
            if reorder {
                let at = link.queue.partition_point(|c| c.due_ns <= due_ns);
                link.queue.insert(at, chunk);
            } else {
                link.queue.push_back(chunk);
            }
            self.bound_queue(src, dst);
        }
        count
    }

    /// Keep a link within `link_queue_bytes_max`: deliver its oldest chunk
    /// at once, or break it when it is held.
    fn bound_queue(&mut self, src: usize, dst: usize) {
        let max = self.options.link_queue_bytes_max;
        while self.link(src, dst).queued_bytes > max {
            if self.link(src, dst).held_since_ns.is_some() {
                self.break_link(src, dst);
                return;
            }
            self.deliver_head(src, dst);
        }
    }

    fn break_link(&mut self, src: usize, dst: usize) {
        let now = self.now_ns;
        let link = self.link(src, dst);
        if link.broken_since_ns.is_none() {
            link.broken_since_ns = Some(now);
            link.queue.clear();
            link.queued_bytes = 0;
            self.record(SimEvent::LinkBroken { at_ns: now, src, dst });
        }
    }

    fn deliver_head(&mut self, src: usize, dst: usize) {
        let Some(chunk) = self.link(src, dst).queue.pop_front() else {
            return;
        };
        self.link(src, dst).queued_bytes -= chunk.bytes.len();
        MemberMemory::write(self.memory[dst].row(src), chunk.offset, &chunk.bytes);
        let (at_ns, push, offset, len) = (self.now_ns, chunk.push, chunk.offset, chunk.bytes.len());
        self.record(SimEvent::Deliver {
            at_ns,
            push,
            src,
            dst,
            offset,
            len,
        });
    }

    fn deliver_due(&mut self) -> usize {
        let n = self.options.member_count;
        let mut delivered = 0;
        for src in 0..n {
            for dst in 0..n {
                loop {
                    let now = self.now_ns;
                    let link = self.link(src, dst);
                    let due = link.held_since_ns.is_none() && link.queue.front().is_some_and(|c| c.due_ns <= now);
                    if !due {
                        break;
                    }
                    self.deliver_head(src, dst);
                    delivered += 1;
                }
            }
        }
        delivered
    }

    fn crash(&mut self, rank: usize, in_push: Option<u64>, reached: u64) {
        if !matches!(self.members[rank].status, Status::Running) {
            return;
        }
        let at_ns = self.now_ns;
        self.members[rank].status = Status::Crashed { at_ns };
        // What was in flight: every outgoing link keeps a random prefix.
        for dst in 0..self.options.member_count {
            let len = self.link(rank, dst).queue.len() as u64;
            let keep = self.rng.below(len + 1) as usize;
            let link = self.link(rank, dst);
            link.queue.truncate(keep);
            link.queued_bytes = link.queue.iter().map(|c| c.bytes.len()).sum();
        }
        self.record(SimEvent::Crash {
            at_ns,
            rank,
            in_push,
            reached,
        });
    }

    fn lost_peers(&self, me: usize) -> PeerSet {
        let mut lost = 0u64;
        for rank in (0..self.options.member_count).filter(|r| *r != me) {
            if self.members[rank].status == Status::Absent {
                continue;
            }
            if self.check_peer(me, rank).is_err() {
                lost |= 1 << rank;
            }
        }
        PeerSet(lost)
    }

    fn check_peers(&self, me: usize) -> Result<(), FabricError> {
        for rank in (0..self.options.member_count).filter(|r| *r != me) {
            self.check_peer(me, rank)?;
        }
        Ok(())
    }

    fn check_peer(&self, me: usize, rank: usize) -> Result<(), FabricError> {
        let timeout = self.options.detect_timeout_ns;
        let expired = |since: Option<u64>| since.is_some_and(|t| self.now_ns.saturating_sub(t) >= timeout);
        let n = self.options.member_count;
        match self.members[rank].status {
            Status::Left => return Err(FabricError::PeerLeft { rank }),
            Status::Crashed { at_ns } | Status::Exited { at_ns } if expired(Some(at_ns)) => {
                return Err(FabricError::PeerGone { rank })
            }
            _ => {}
        }
        for (src, dst) in [(rank, me), (me, rank)] {
            let link = &self.links[src * n + dst];
            if expired(link.broken_since_ns) || expired(link.held_since_ns) {
                return Err(FabricError::PeerGone { rank });
            }
        }
        Ok(())
    }
}

// ---- the world ------------------------------------------------------------------

struct Shared {
    net: Mutex<Net>,
    doorbell: FutexDoorbell,
    member_count: usize,
    row_len_bytes: usize,
}

impl Shared {
    fn net(&self) -> MutexGuard<'_, Net> {
        // A panic while the network was locked leaves it consistent enough
        // to read the trace: recover the guard.
        self.net.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The simulated network of one group: members' memories, links, simulated
/// time, faults and the trace. Cheap to clone (a handle).
#[derive(Clone)]
pub struct SimWorld {
    shared: Arc<Shared>,
}

impl SimWorld {
    pub fn new(options: SimOptions) -> Result<SimWorld, FabricError> {
        let n = options.member_count;
        if n == 0 || n > MEMBERS_MAX {
            return Err(FabricError::InvalidOption(format!(
                "member_count {n} must be in 1..={MEMBERS_MAX}"
            )));
        }
        if options.row_len_bytes == 0 || options.row_len_bytes > (1 << 30) {
            return Err(FabricError::InvalidOption(format!(
                "row_len_bytes {} must be in 1..=1 GiB for the simulator",
                options.row_len_bytes
            )));
        }
        let row_len_bytes = options.row_len_bytes.next_multiple_of(CACHE_LINE_BYTES);
        let links = (0..n * n)
            .map(|_| Link {
                delay_ns_max: options.delay_ns_max,
                ..Link::default()
            })
            .collect();
        let net = Net {
            now_ns: 0,
            rng: SimRng::new(options.seed),
            members: (0..n)
                .map(|_| Member {
                    status: Status::Absent,
                    pushes: 0,
                    crash_at_push: None,
                })
                .collect(),
            links,
            memory: (0..n).map(|_| Arc::new(MemberMemory::new(n, row_len_bytes))).collect(),
            next_push: 0,
            trace: VecDeque::with_capacity(options.trace_events_max.min(1 << 16)),
            digest: Fnv(0xCBF2_9CE4_8422_2325),
            events: 0,
            options,
        };
        Ok(SimWorld {
            shared: Arc::new(Shared {
                net: Mutex::new(net),
                doorbell: FutexDoorbell::new_local(),
                member_count: n,
                row_len_bytes,
            }),
        })
    }

    /// Open member `rank` (once per rank).
    pub fn open(&self, rank: usize) -> Result<SimFabric, FabricError> {
        let n = self.shared.member_count;
        if rank >= n {
            return Err(FabricError::RankOutOfRange { rank, member_count: n });
        }
        let mut net = self.shared.net();
        if net.members[rank].status != Status::Absent {
            return Err(FabricError::RankTaken {
                group: "sim".into(),
                rank,
                pid: std::process::id(),
            });
        }
        net.members[rank].status = Status::Running;
        Ok(SimFabric {
            rank,
            memory: Arc::clone(&net.memory[rank]),
            shared: Arc::clone(&self.shared),
        })
    }

    pub fn member_count(&self) -> usize {
        self.shared.member_count
    }

    /// Simulated time, in ns since the world began.
    pub fn now_ns(&self) -> u64 {
        self.shared.net().now_ns
    }

    /// Move simulated time forward.
    pub fn advance(&self, dt_ns: u64) {
        let mut net = self.shared.net();
        net.now_ns = net.now_ns.saturating_add(dt_ns);
    }

    /// Apply every chunk whose delivery time has come (FIFO per link).
    /// Returns how many chunks were applied.
    pub fn deliver_due(&self) -> usize {
        let delivered = self.shared.net().deliver_due();
        if delivered > 0 {
            self.shared.doorbell.ring();
        }
        delivered
    }

    /// The earliest delivery time of a chunk that is not held, if any.
    pub fn next_due_ns(&self) -> Option<u64> {
        let net = self.shared.net();
        net.links
            .iter()
            .filter(|l| l.held_since_ns.is_none())
            .filter_map(|l| l.queue.front().map(|c| c.due_ns))
            .min()
    }

    /// Bytes in flight on every link (held ones included).
    pub fn in_flight_bytes(&self) -> usize {
        self.shared.net().links.iter().map(|l| l.queued_bytes).sum()
    }

    /// Set one link's delay bound (a slow link).
    pub fn set_link_delay(&self, src: usize, dst: usize, delay_ns_max: u64) {
        self.shared.net().link(src, dst).delay_ns_max = delay_ns_max;
    }

    /// Crash `rank` now: it stops, and each outgoing link keeps a random
    /// prefix of what was in flight.
    pub fn crash(&self, rank: usize) {
        self.shared.net().crash(rank, None, 0);
    }

    /// Crash `rank` inside its `push`-th push (counted from 1): that push
    /// reaches a random subset of its peers.
    pub fn crash_at_push(&self, rank: usize, push: u64) {
        assert!(push > 0, "pushes are counted from 1");
        self.shared.net().members[rank].crash_at_push = Some(push);
    }

    /// The process of `rank` exited (it stopped on an error): what it had
    /// pushed is still delivered; peers notice after the detection timeout.
    pub fn exit(&self, rank: usize) {
        let mut net = self.shared.net();
        if net.members[rank].status == Status::Running {
            let at_ns = net.now_ns;
            net.members[rank].status = Status::Exited { at_ns };
            net.record(SimEvent::Exit { at_ns, rank });
        }
    }

    /// Whether `rank` has crashed.
    pub fn is_crashed(&self, rank: usize) -> bool {
        matches!(self.shared.net().members[rank].status, Status::Crashed { .. })
    }

    /// How many pushes `rank` has made.
    pub fn pushes(&self, rank: usize) -> u64 {
        self.shared.net().members[rank].pushes
    }

    /// Cut the links between `side` and the other members. `hold`: traffic
    /// waits for [`SimWorld::heal`]; otherwise it is dropped and the links
    /// break for good.
    pub fn partition(&self, side: PeerSet, hold: bool) {
        let mut net = self.shared.net();
        let n = net.options.member_count;
        let now = net.now_ns;
        for src in 0..n {
            for dst in (0..n).filter(|d| side.contains(src) != side.contains(*d)) {
                if hold {
                    let link = net.link(src, dst);
                    link.held_since_ns.get_or_insert(now);
                } else {
                    net.break_link(src, dst);
                }
            }
        }
        net.record(SimEvent::Partition {
            at_ns: now,
            side: side.0,
            hold,
        });
    }

    /// End every held partition: held traffic flows again (broken links stay broken).
    pub fn heal(&self) {
        let mut net = self.shared.net();
        for link in net.links.iter_mut() {
            link.held_since_ns = None;
        }
        let at_ns = net.now_ns;
        net.record(SimEvent::Heal { at_ns });
    }

    /// Record an event of the simulator above (steps, sends, notes).
    pub fn record(&self, event: SimEvent) {
        self.shared.net().record(event);
    }

    /// The last `trace_events_max` events, oldest first.
    pub fn trace(&self) -> Vec<SimEvent> {
        self.shared.net().trace.iter().cloned().collect()
    }

    /// A digest of every event so far: equal digests, equal runs.
    pub fn trace_digest(&self) -> u64 {
        self.shared.net().digest.finish()
    }

    /// How many events have been recorded.
    pub fn events(&self) -> u64 {
        self.shared.net().events
    }

    /// Threaded mode (not deterministic): a thread that moves simulated
    /// time by 1 µs per round and delivers what is due, so members running
    /// on their own threads see each other's pushes. Stops when dropped.
    pub fn spawn_pump(&self) -> SimPump {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let thread = {
            let (world, stop, rounds) = (self.clone(), Arc::clone(&stop), Arc::clone(&rounds));
            std::thread::spawn(move || {
                // Partner: the Release store in SimPump::drop.
                while !stop.load(Ordering::Acquire) {
                    world.advance(1_000);
                    let delivered = world.deliver_due();
                    rounds.fetch_add(1, Ordering::Relaxed);
                    if delivered == 0 && world.in_flight_bytes() == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    } else if delivered == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        SimPump {
            stop,
            rounds,
            thread: Some(thread),
        }
    }
}

/// The delivery thread of the threaded mode; stops and joins when dropped.
pub struct SimPump {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimPump {
    /// Rounds run so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
}

impl Drop for SimPump {
    fn drop(&mut self) {
        // Partner: the Acquire load in the pump loop.
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---- a member's handle -------------------------------------------------------------

/// One member's fabric in a [`SimWorld`]. Dropping it is a clean leave.
pub struct SimFabric {
    rank: usize,
    memory: Arc<MemberMemory>,
    shared: Arc<Shared>,
}

impl SimFabric {
    /// The world this member lives in.
    pub fn world(&self) -> SimWorld {
        SimWorld {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Fabric for SimFabric {
    fn member_rank(&self) -> usize {
        self.rank
    }

    fn member_count(&self) -> usize {
        self.shared.member_count
    }

    fn row_len_bytes(&self) -> usize {
        self.shared.row_len_bytes
    }

    fn row(&self, rank: usize) -> RowRef<'_> {
        self.memory.row(rank)
    }

    fn push(&self, range: Range<usize>, peers: PeerSet) -> Result<(), FabricError> {
        check_range(&range, self.shared.row_len_bytes)?;
        self.shared.net().push(self.rank, range, peers);
        Ok(())
    }

    fn check_peers(&self) -> Result<(), FabricError> {
        self.shared.net().check_peers(self.rank)
    }

    fn lost_peers(&self) -> PeerSet {
        self.shared.net().lost_peers(self.rank)
    }

    fn joined(&self) -> PeerSet {
        let net = self.shared.net();
        let mut set = 0u64;
        for (rank, m) in net.members.iter().enumerate() {
            if m.status != Status::Absent {
                set |= 1 << rank;
            }
        }
        PeerSet(set)
    }

    fn doorbell(&self) -> &dyn Doorbell {
        &self.shared.doorbell
    }

    fn describe(&self) -> String {
        let net = self.shared.net();
        format!("sim:seed={}:member={}", net.options.seed, self.rank)
    }
}

impl Drop for SimFabric {
    fn drop(&mut self) {
        let mut net = self.shared.net();
        if net.members[self.rank].status == Status::Running {
            net.members[self.rank].status = Status::Left;
            let at_ns = net.now_ns;
            net.record(SimEvent::Leave { at_ns, rank: self.rank });
        }
    }
}
