//! The ofi fabric: one-sided RMA writes through libfabric (feature `ofi`).
//! Verbs (InfiniBand, RoCE), EFA, CXI (Slingshot), or on any machine the
//! software providers `tcp` (with `ofi_rxm`) and `sockets`.
//!
//! ```text
//!  member 0                                               member 1
//!  rows: [own row 0][copy of row 1]            rows: [copy of row 0][own row 1]
//!         └── fi_mr_reg (one registration) ──┘        └── fi_mr_reg ──┘
//!  push(range) ── fi_write(own row 0 + range) ──NIC──▶ copy of row 0 + range
//!                                                     (no code runs on member 1)
//!  completion queue ◀── completion ──┘
//! ```
//!
//! - **Rows**: every member allocates `member_count` rows in one
//!   allocation and registers it once (`fi_mr_reg`, local and remote
//!   write). Row `r` of member `m`'s allocation is `m`'s copy of `r`'s
//!   row; a push writes bytes of the own row into the same offsets of
//!   each peer's copy with `fi_write`, straight from the own row (zero
//!   copies on the sending side, no receiving thread on the other).
//! - **Ordering** (the [`Fabric`] contract): the endpoint is opened with
//!   `FI_ORDER_WAW` (RMA write after write) when the provider grants it,
//!   so writes to one peer land in issue order and a guard pushed after
//!   data lands after it. A provider that does not grant it gets
//!   `FI_DELIVERY_COMPLETE` and every push waits until the previous
//!   writes to that peer have completed (correct, slower). Providers
//!   seen to break the order they grant are listed in
//!   [`endpoint::PROVIDERS_BREAKING_ORDER`] (opened unordered) and
//!   [`endpoint::PROVIDERS_SERIALIZED`] (one write in flight per peer:
//!   libfabric 1.17's `tcp`, see `tests/ofi_order.rs`).
//! - **Control plane**: addresses and keys travel over a
//!   [`TcpFabric`] on the members' configured addresses (module
//!   `control`): its handshake proves the group key (HMAC) and checks the
//!   group name and layout before anything is exchanged, and its
//!   connection states are the membership: a peer whose control
//!   connection closes is gone (`PeerLeft` on a clean close), exactly as
//!   on tcp. A peer that connects late, or a restarted process taking a
//!   lost rank (a new incarnation), is picked up by the progress thread.
//! - **Completions**: one completion queue. A progress thread waits on it
//!   (`fi_cq_sread`, which also drives the provider's progress: software
//!   providers apply incoming writes only when someone does) and
//!   [`Fabric::receive_now`] reads it on the calling thread. A failed
//!   write (a wrong key or address, a peer gone) marks that peer faulty:
//!   [`Fabric::lost_peers`] reports it, so the group's view change
//!   removes it, and the log names the peer and the operation.
//! - **Doorbell**: a one-sided write wakes nobody on the target, so a
//!   parked loop sleeps at most [`PARK_NAP`] at a time and re-checks.
//! - **Bounds**: at most `cq_depth / 2` writes outstanding; a push that
//!   finds the queue full drives completions until there is room, for at
//!   most [`OfiOptions::send_stall_max`], then declares that peer gone.
//!
//! ```no_run
//! use spindle_fabric::{Fabric, PeerSet, ofi::{OfiFabric, OfiOptions}};
//! let addresses = vec!["127.0.0.1:7100".parse().unwrap(), "127.0.0.1:7101".parse().unwrap()];
//! let options = OfiOptions::new("doc-ofi", 4096, 0, addresses, b"shared secret".to_vec(), "tcp");
//! let fabric = OfiFabric::open(&options, 0).unwrap(); // member 1 opens with rank 1
//! fabric.row(0).u64_at(0).store(7, std::sync::atomic::Ordering::Release);
//! fabric.push(0..8, PeerSet::all_except(0, 2)).unwrap();
//! ```

mod control;
pub mod endpoint;

use std::net::{SocketAddr, TcpListener};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::doorbell::{Doorbell, FutexDoorbell};
use crate::tcp::{rows::RowsAlloc, TcpFabric, TcpOptions};
use crate::{check_range, Fabric, FabricError, PeerSet, RowRef, CACHE_LINE_BYTES, MEMBERS_MAX};
use control::Announce;
use endpoint::{ofi_error, Endpoint, Registration};

/// The longest a parked loop sleeps before it looks at its rows again
/// (remote writes ring no doorbell).
pub const PARK_NAP: Duration = Duration::from_micros(200);
/// How long a push may wait for room (or, on serialized providers, for
/// the previous write's completion) by default: finite, so one stuck peer
/// is declared gone rather than stalling the pusher. The group sets a
/// quarter of its suspicion timeout.
pub const SEND_STALL_MAX_DEFAULT: Duration = Duration::from_secs(5);
/// Completion queue entries by default.
pub const CQ_DEPTH_DEFAULT: usize = 1024;
/// How long the progress thread blocks in one completion wait.
const WAIT_MS: i32 = 2;
/// How often the progress thread looks for new, returned or lost peers.
const REFRESH_INTERVAL: Duration = Duration::from_millis(5);
/// After the rows, a line that peers' first writes land in (see
/// [`Shared::admit`]); never read.
const SCRATCH_BYTES: usize = CACHE_LINE_BYTES;
/// How long the first write to a new peer may take to complete.
const FIRST_WRITE_MAX: Duration = Duration::from_secs(10);
/// How long a closing member waits for its outstanding writes.
const DRAIN_MAX: Duration = Duration::from_millis(500);
/// Lost peers' addresses kept in the address vector (see
/// [`Shared::retire_address`]).
const RETIRED_ADDRESSES_MAX: usize = 256;
/// Mixed into the control plane's layout tag, so that an ofi member and a
/// tcp member of a group with the same name never accept each other.
const CONTROL_TAG: u64 = u64::from_le_bytes(*b"SPNDLOFI");

/// What a member needs to open (or join) a group over libfabric.
#[derive(Clone, Debug)]
pub struct OfiOptions {
    /// The control plane: group name, row length, layout tag, members'
    /// addresses (where their control connections listen), group key,
    /// timeouts. Its `row_len_bytes` and `layout_tag` are the data rows';
    /// the control fabric's own are derived from them.
    pub tcp: TcpOptions,
    /// The libfabric provider: "verbs", "efa", "cxi", "tcp", "sockets",
    /// ... (`fi_info -l` lists them).
    pub provider: String,
    /// Completion queue entries; at most half as many writes are
    /// outstanding at once.
    pub cq_depth: usize,
    /// Every write completes only once its bytes are in the target's
    /// memory (`FI_DELIVERY_COMPLETE`), so that
    /// [`Fabric::pushes_completed`] reports delivery: what the one-sided
    /// replica acknowledges on. Off by default: the group needs only the
    /// ordering, and on providers that emulate it (`tcp`) every write
    /// then waits for the target's acknowledgement.
    pub delivery_complete: bool,
    /// The longest a push may wait for room in the transmit queue (or for
    /// the previous write's completion, where writes are serialized)
    /// before the peer it writes to is declared gone
    /// ([`SEND_STALL_MAX_DEFAULT`]).
    pub send_stall_max: Duration,
}

impl OfiOptions {
    /// A group of `addresses.len()` members with rows of `row_len_bytes`
    /// over `provider`, with the tcp control plane's defaults.
    pub fn new(
        group: &str,
        row_len_bytes: usize,
        layout_tag: u64,
        addresses: Vec<SocketAddr>,
        key: Vec<u8>,
        provider: &str,
    ) -> OfiOptions {
        let tcp = TcpOptions::new(group, row_len_bytes, layout_tag, addresses, key);
        OfiOptions {
            send_stall_max: SEND_STALL_MAX_DEFAULT,
            tcp,
            provider: provider.to_string(),
            cq_depth: CQ_DEPTH_DEFAULT,
            delivery_complete: false,
        }
    }

    fn validate(&self, rank: usize) -> Result<(), FabricError> {
        self.tcp.validate(rank)?;
        if self.provider.is_empty() {
            return Err(FabricError::InvalidOption("the ofi provider name is empty".into()));
        }
        if !(4..=1 << 20).contains(&self.cq_depth) {
            return Err(FabricError::InvalidOption(format!(
                "cq_depth {} outside 4..=1048576",
                self.cq_depth
            )));
        }
        Ok(())
    }

    /// The control plane's options: the same group and members, a control
    /// row, and a layout tag that covers the data rows' length and tag.
    fn control(&self) -> TcpOptions {
        let mut tcp = self.tcp.clone();
        let row_len_bytes = self.tcp.row_len_bytes.next_multiple_of(CACHE_LINE_BYTES) as u64;
        tcp.row_len_bytes = control::CONTROL_ROW_BYTES;
        tcp.layout_tag = self.tcp.layout_tag ^ row_len_bytes.rotate_left(17) ^ CONTROL_TAG;
        tcp.coalesce = false;
        tcp.stat_dir = None;
        tcp
    }
}

/// A peer's state, as the progress thread last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PeerState {
    /// Its announcement has not arrived (not connected yet).
    Waiting = 0,
    /// Its address is in the address vector: pushes reach it.
    Ready = 1,
    /// A write to it failed, or its announcement is unusable.
    Fault = 2,
}

/// Where pushes to one peer go.
#[derive(Clone, Copy, Debug)]
struct Remote {
    fi_addr: u64,
    /// Remote address of this member's row in the peer's registration.
    row_addr: u64,
    key: u64,
    incarnation: u64,
    /// Remote address of the peer's scratch line.
    scratch_addr: u64,
}

struct Peer {
    state: AtomicU8,
    /// Copied out by a push (never held across a write).
    remote: Mutex<Option<Remote>>,
    /// Writes issued to the peer and not completed yet.
    outstanding: AtomicU64,
    why: Mutex<Option<String>>,
}

/// What the fabric and its progress thread share. Fields drop in order:
/// the control plane first (peers see this member leave), then the
/// registration, the endpoint, and last the rows they point into.
struct Shared {
    rank: usize,
    row_len_bytes: usize,
    control: TcpFabric,
    peers: Vec<Peer>,
    /// Which peers were sent this member's announcement (bit = rank);
    /// refreshes are serialized by this lock.
    announced: Mutex<u64>,
    /// Addresses of lost or replaced peers, oldest first, still in the
    /// address vector (at most [`RETIRED_ADDRESSES_MAX`]).
    retired: Mutex<std::collections::VecDeque<u64>>,
    /// Writes issued and not completed, over all peers.
    outstanding: AtomicU64,
    outstanding_max: u64,
    send_stall_max: Duration,
    stop: AtomicBool,
    doorbell: FutexDoorbell,
    mr: Registration,
    endpoint: Endpoint,
    rows: RowsAlloc,
}

/// One member of a group over libfabric. See the module docs.
pub struct OfiFabric {
    rank: usize,
    member_count: usize,
    shared: Arc<Shared>,
    progress: Option<JoinHandle<()>>,
    description: String,
}

impl OfiFabric {
    /// Open member `rank`: open the provider's endpoint, register the
    /// rows, connect the control plane (listening on its address), and
    /// wait until the peers of [`TcpOptions::wait_for`] have announced
    /// themselves.
    pub fn open(options: &OfiOptions, rank: usize) -> Result<OfiFabric, FabricError> {
        options.validate(rank)?;
        let listen = options.tcp.listen.unwrap_or(options.tcp.addresses[rank]);
        let listener = TcpListener::bind(listen)
            .map_err(|e| FabricError::io(format!("member {rank}: listen on {listen} (ofi control plane)"), e))?;
        OfiFabric::open_with_listener(options, rank, listener)
    }

    /// As [`OfiFabric::open`], on a listener the caller bound already.
    pub fn open_with_listener(
        options: &OfiOptions,
        rank: usize,
        listener: TcpListener,
    ) -> Result<OfiFabric, FabricError> {
        options.validate(rank)?;
        let member_count = options.tcp.addresses.len();
        let row_len_bytes = options.tcp.row_len_bytes.next_multiple_of(CACHE_LINE_BYTES);
        let total = row_len_bytes
            .checked_mul(member_count)
            .ok_or_else(|| FabricError::InvalidOption("rows overflow".into()))?;
        // The endpoint and registration first: a missing provider or a
        // memlock limit fails before any peer is contacted.
        let endpoint = Endpoint::open(&options.provider, options.cq_depth, options.delivery_complete)?;
        let rows = RowsAlloc::new(total + SCRATCH_BYTES)?;
        let incarnation = incarnation()?;
        // SAFETY: the rows live in `Shared` after the registration and are
        // dropped after it (field order), so they outlive it.
        let mr = unsafe { endpoint.register(rows.ptr, total + SCRATCH_BYTES, incarnation)? };
        let me = Announce {
            incarnation,
            row_len_bytes: row_len_bytes as u64,
            mr_key: mr.key,
            rows_base: if endpoint.granted.virt_addr {
                rows.ptr.as_ptr() as u64
            } else {
                0
            },
            addr: endpoint.name()?,
        };
        let control = TcpFabric::open_with_listener(&options.control(), rank, listener)?;
        control::write_own(&control, &me);
        drop(me);
        let description = format!(
            "ofi:{}#{rank}@{} ({}{}{})",
            options.tcp.group,
            options.tcp.addresses[rank],
            endpoint.describe(),
            if endpoint.granted.ordered {
                ""
            } else {
                ", unordered: waits per push"
            },
            if options.delivery_complete {
                ", delivery complete"
            } else {
                ""
            }
        );
        let shared = Arc::new(Shared {
            rank,
            row_len_bytes,
            control,
            peers: (0..member_count)
                .map(|_| Peer {
                    state: AtomicU8::new(PeerState::Waiting as u8),
                    remote: Mutex::new(None),
                    outstanding: AtomicU64::new(0),
                    why: Mutex::new(None),
                })
                .collect(),
            announced: Mutex::new(0),
            retired: Mutex::new(std::collections::VecDeque::with_capacity(RETIRED_ADDRESSES_MAX)),
            outstanding: AtomicU64::new(0),
            outstanding_max: (options.cq_depth / 2) as u64,
            send_stall_max: options.send_stall_max,
            stop: AtomicBool::new(false),
            doorbell: FutexDoorbell::new_local(),
            mr,
            endpoint,
            rows,
        });
        shared.wait_announced(options)?;
        let progress = if member_count > 1 {
            let s = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name(format!("spindle-ofi-{rank}"))
                    .spawn(move || s.run_progress())
                    .map_err(|e| FabricError::io("start the ofi progress thread", e))?,
            )
        } else {
            None
        };
        Ok(OfiFabric {
            rank,
            member_count,
            shared,
            progress,
            description,
        })
    }

    /// `rank`'s state and why it faulted, if it did.
    pub fn peer_state(&self, rank: usize) -> (PeerState, Option<String>) {
        let peer = &self.shared.peers[rank];
        (peer.state(), peer.why.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Whether `rank` is this member, or a peer whose writes land
    /// (announced, no failed write) and whose control connection is up.
    pub fn peer_alive(&self, rank: usize) -> bool {
        rank == self.rank
            || (rank < self.member_count
                && self.shared.peers[rank].state() == PeerState::Ready
                && self.shared.control.peer_status(rank).0 == crate::tcp::PeerStatus::Connected)
    }

    /// Whether the provider orders writes to one peer (`FI_ORDER_WAW`);
    /// without it every push waits for the previous one's completion.
    pub fn provider_orders_writes(&self) -> bool {
        self.shared.endpoint.granted.ordered
    }
}

/// A random non-zero number naming this process's announcement.
fn incarnation() -> Result<u64, FabricError> {
    let nonce = crate::tcp::handshake::random_nonce().map_err(|e| FabricError::io("read /dev/urandom", e))?;
    Ok(u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes")) | 1)
}

impl Peer {
    fn state(&self) -> PeerState {
        // Partner: the Release stores in `set_state`: whoever sees Ready
        // sees the remote it was set with, and Fault its reason.
        match self.state.load(Ordering::Acquire) {
            1 => PeerState::Ready,
            2 => PeerState::Fault,
            _ => PeerState::Waiting,
        }
    }

    fn set_state(&self, state: PeerState) {
        // Partner: the Acquire load in `state`.
        self.state.store(state as u8, Ordering::Release);
    }
}

impl Shared {
    /// Mark `rank` faulty (once), naming the operation that failed.
    fn fault(&self, rank: usize, why: String) {
        let peer = &self.peers[rank];
        {
            let mut slot = peer.why.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                tracing::warn!(member = self.rank, peer = rank, "{why}");
                *slot = Some(why);
            }
        }
        peer.set_state(PeerState::Fault);
        self.doorbell.ring();
    }

    /// Take the completions there are, without blocking (or blocking up
    /// to `wait_ms` when it is not 0); returns how many.
    fn complete(&self, wait_ms: i32) -> usize {
        let done = |context: usize| {
            let Some(rank) = context.checked_sub(1).filter(|r| *r < self.peers.len()) else {
                debug_assert!(false, "completion with an unknown context {context}");
                return;
            };
            // Relaxed: counts only; the completion itself is the event.
            self.peers[rank].outstanding.fetch_sub(1, Ordering::Relaxed);
            self.outstanding.fetch_sub(1, Ordering::Relaxed);
        };
        let result = if wait_ms > 0 {
            self.endpoint.wait(wait_ms, done)
        } else {
            self.endpoint.poll(done)
        };
        match result {
            Ok(n) => n,
            Err(e) => {
                if let Some(rank) = e.context.checked_sub(1).filter(|r| *r < self.peers.len()) {
                    self.peers[rank].outstanding.fetch_sub(1, Ordering::Relaxed);
                    self.outstanding.fetch_sub(1, Ordering::Relaxed);
                    self.fault(rank, format!("fi_write to member {rank} failed: {}", e.fault));
                } else {
                    tracing::warn!(member = self.rank, "ofi completion queue: {}", e.fault);
                }
                1
            }
        }
    }

    /// A lost (or replaced) peer's address leaves the address vector only
    /// after [`RETIRED_ADDRESSES_MAX`] later losses: removing it at once
    /// (`fi_av_remove`) while the provider still held writes to it made
    /// libfabric 1.17's `tcp` provider (through `ofi_rxm`) crash with
    /// SIGSEGV, or stall, in its own progress thread (the KV service's
    /// failover under load, `kv_service` tests). Bounded: a peer that
    /// restarts forever costs at most that many entries.
    fn retire_address(&self, fi_addr: u64) {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        if retired.len() == RETIRED_ADDRESSES_MAX {
            if let Some(oldest) = retired.pop_front() {
                self.endpoint.remove(oldest);
            }
        }
        retired.push_back(fi_addr);
    }

    /// Look for peers that connected, came back or were lost, and send
    /// this member's announcement to new ones.
    fn refresh(&self) {
        let mut announced = self.announced.lock().unwrap_or_else(|p| p.into_inner());
        let joined = self.control.joined();
        let lost = self.control.lost_peers();
        let mut announce_to = 0u64;
        for (rank, peer) in self.peers.iter().enumerate() {
            if rank == self.rank {
                continue;
            }
            let bit = 1u64 << rank;
            if lost.contains(rank) || !joined.contains(rank) {
                *announced &= !bit;
                let old = peer.remote.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(old) = old {
                    self.retire_address(old.fi_addr);
                }
                if peer.state() == PeerState::Ready {
                    peer.set_state(PeerState::Waiting);
                }
                continue;
            }
            if *announced & bit == 0 {
                announce_to |= bit;
            }
            if let Some(fresh) = self.admit(rank, peer) {
                // A new incarnation never saw this member's announcement.
                if fresh {
                    announce_to |= bit;
                }
            }
        }
        if announce_to != 0 {
            // A failed push shows in the control fabric's states.
            let _ = control::push_own(&self.control, PeerSet(announce_to));
            *announced |= announce_to;
        }
    }

    /// Insert `rank`'s announced address if it is new (or a new
    /// incarnation); `Some(true)` if it replaced an older incarnation.
    fn admit(&self, rank: usize, peer: &Peer) -> Option<bool> {
        let announce = match control::read_peer(&self.control, rank, self.row_len_bytes) {
            Ok(Some(a)) => a,
            Ok(None) => return None,
            Err(why) => {
                if peer.state() != PeerState::Fault {
                    self.fault(rank, format!("member {rank}'s ofi announcement is unusable: {why}"));
                }
                return None;
            }
        };
        let mut remote = peer.remote.lock().unwrap_or_else(|p| p.into_inner());
        let replaced = match *remote {
            Some(r) if r.incarnation == announce.incarnation => return None,
            Some(r) => {
                self.retire_address(r.fi_addr);
                true
            }
            None => false,
        };
        *remote = None;
        let fi_addr = match self.endpoint.insert(rank, &announce.addr) {
            Ok(a) => a,
            Err(e) => {
                drop(remote);
                self.fault(rank, e.to_string());
                return None;
            }
        };
        let fresh = Remote {
            fi_addr,
            row_addr: announce.rows_base + (self.rank * self.row_len_bytes) as u64,
            key: announce.mr_key,
            incarnation: announce.incarnation,
            scratch_addr: announce.rows_base + (self.peers.len() * self.row_len_bytes) as u64,
        };
        *remote = Some(fresh);
        drop(remote);
        if let Err(why) = self.first_write(rank, &fresh) {
            self.fault(rank, why);
            return None;
        }
        *peer.why.lock().unwrap_or_else(|p| p.into_inner()) = None;
        peer.set_state(PeerState::Ready);
        self.doorbell.ring();
        Some(replaced)
    }

    /// Write 8 bytes into `rank`'s scratch line and wait for the
    /// completion, before any push goes to it: a wrong memory key or
    /// address in its announcement fails here, as an error naming the
    /// peer and `fi_write`, not later as a guard that never lands; and
    /// connection-based providers (`ofi_rxm`) set up their connection
    /// here, before the first push.
    fn first_write(&self, rank: usize, remote: &Remote) -> Result<(), String> {
        let total = self.peers.len() * self.row_len_bytes;
        // SAFETY: the scratch line follows the rows inside the registered
        // allocation, which lives as long as `self`.
        let local = unsafe { self.rows.ptr.as_ptr().add(total) };
        // The connection is set up here (`ofi_rxm` answers "try again"
        // until it is): allow it the first write's bound, not a push's.
        self.issue(rank, remote, local, 8, remote.scratch_addr, FIRST_WRITE_MAX)?;
        let peer = &self.peers[rank];
        let started = Instant::now();
        // Relaxed: a count; the completion was read on this thread or the
        // progress thread, and nothing is published through it.
        while peer.outstanding.load(Ordering::Relaxed) > 0 {
            if peer.state() == PeerState::Fault {
                return Err(peer
                    .why
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .unwrap_or_default());
            }
            if started.elapsed() > FIRST_WRITE_MAX {
                return Err(format!(
                    "the first fi_write to member {rank} did not complete within {} s",
                    FIRST_WRITE_MAX.as_secs()
                ));
            }
            if self.complete(0) == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        Ok(())
    }

    /// At `open`: refresh until every peer `open` waits for is ready.
    fn wait_announced(&self, options: &OfiOptions) -> Result<(), FabricError> {
        let required = options.tcp.required(self.rank) & !(1u64 << self.rank);
        let deadline = Instant::now() + options.tcp.join_timeout;
        loop {
            self.refresh();
            self.complete(0);
            let ready = self
                .peers
                .iter()
                .enumerate()
                .filter(|(_, p)| p.state() == PeerState::Ready)
                .fold(0u64, |m, (r, _)| m | 1u64 << r);
            if ready & required == required {
                return Ok(());
            }
            if let Some((rank, why)) = self
                .peers
                .iter()
                .enumerate()
                .find(|(r, p)| required & (1u64 << r) != 0 && p.state() == PeerState::Fault)
                .map(|(r, p)| (r, p.why.lock().unwrap_or_else(|p| p.into_inner()).clone()))
            {
                return Err(ofi_error("connect", Some(rank), why.unwrap_or_default()));
            }
            if Instant::now() >= deadline {
                return Err(FabricError::JoinTimeout {
                    group: options.tcp.group.clone(),
                    missing: PeerSet(required & !ready).iter().collect(),
                    waited_ms: options.tcp.join_timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The progress thread: wait on the completion queue (driving the
    /// provider), and refresh the peers every [`REFRESH_INTERVAL`].
    fn run_progress(&self) {
        let mut refreshed = Instant::now();
        let mut nap_us = 10u64;
        // Partner: the Release store of `stop` in OfiFabric::drop.
        while !self.stop.load(Ordering::Acquire) {
            let n = self.complete(WAIT_MS);
            if !self.endpoint.granted.waitable {
                // No wait object: nap, longer while nothing completes.
                nap_us = if n > 0 { 10 } else { (nap_us * 2).min(1_000) };
                std::thread::sleep(Duration::from_micros(nap_us));
            }
            if refreshed.elapsed() >= REFRESH_INTERVAL {
                self.refresh();
                refreshed = Instant::now();
            }
        }
    }

    /// Wait for room for one more write, driving completions; `Err` after
    /// `send_stall_max` without room.
    fn wait_for_room(&self, started: &mut Option<Instant>, rank: usize, stall_max: Duration) -> Result<(), String> {
        self.complete(0);
        let since = *started.get_or_insert_with(Instant::now);
        if since.elapsed() > stall_max {
            return Err(format!(
                "fi_write to member {rank}: no room in the transmit queue for {} ms",
                stall_max.as_millis()
            ));
        }
        std::hint::spin_loop();
        Ok(())
    }

    /// Write `range` of the own row to `rank`'s copy.
    fn write_to(&self, rank: usize, range: &Range<usize>) {
        let peer = &self.peers[rank];
        let Some(remote) = *peer.remote.lock().unwrap_or_else(|p| p.into_inner()) else {
            return;
        };
        // SAFETY: the own row lies inside the registered rows (checked
        // range, row `self.rank`), which live until the endpoint is closed
        // after the last completion was drained (OfiFabric::drop).
        let local = unsafe { self.rows.ptr.as_ptr().add(self.rank * self.row_len_bytes + range.start) };
        if let Err(why) = self.issue(
            rank,
            &remote,
            local,
            range.len(),
            remote.row_addr + range.start as u64,
            self.send_stall_max,
        ) {
            self.fault(rank, why);
        }
    }

    /// Issue one write of `len` bytes at `local` (inside the registration)
    /// to `remote_addr` at `rank`, after the ordering and the bound on
    /// outstanding writes allow it, waiting at most `stall_max` for room;
    /// `Err` names what failed.
    fn issue(
        &self,
        rank: usize,
        remote: &Remote,
        local: *const u8,
        len: usize,
        remote_addr: u64,
        stall_max: Duration,
    ) -> Result<(), String> {
        let peer = &self.peers[rank];
        let mut started = None;
        if !self.endpoint.granted.ordered || self.endpoint.granted.serialized {
            // Unordered provider: the previous writes to this peer must
            // have landed (delivery complete) before this one is issued;
            // serialized provider: they must have completed.
            // Relaxed: a count, re-read until it drains; the completion
            // itself is the event (read by `complete`).
            while peer.outstanding.load(Ordering::Relaxed) > 0 {
                self.wait_for_room(&mut started, rank, stall_max)?;
            }
        }
        while self.outstanding.load(Ordering::Relaxed) >= self.outstanding_max {
            self.wait_for_room(&mut started, rank, stall_max)?;
        }
        // Relaxed: counts only (see `complete`).
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        peer.outstanding.fetch_add(1, Ordering::Relaxed);
        let result = loop {
            // SAFETY: `local..local + len` is inside the registration
            // (callers' contract), which lives until the last completion
            // was drained (OfiFabric::drop).
            let issued = unsafe {
                self.endpoint
                    .write(local, len, &self.mr, remote.fi_addr, remote_addr, remote.key, rank + 1)
            };
            match issued {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    if let Err(why) = self.wait_for_room(&mut started, rank, stall_max) {
                        break Err(why);
                    }
                }
                Err(code) => {
                    break Err(format!(
                        "fi_write of {len} bytes to member {rank} (remote address {remote_addr:#x}): {}",
                        endpoint::strerror(code)
                    ))
                }
            }
        };
        // Not issued: nothing will complete.
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        peer.outstanding.fetch_sub(1, Ordering::Relaxed);
        result
    }
}

impl Fabric for OfiFabric {
    fn member_rank(&self) -> usize {
        self.rank
    }

    fn member_count(&self) -> usize {
        self.member_count
    }

    fn row_len_bytes(&self) -> usize {
        self.shared.row_len_bytes
    }

    #[inline(always)]
    fn row(&self, rank: usize) -> RowRef<'_> {
        assert!(rank < self.member_count, "rank {rank} >= {}", self.member_count);
        // SAFETY: row `rank` lies inside the 64-aligned allocation (rows
        // are multiples of 64 bytes), which lives as long as self (Arc).
        unsafe {
            RowRef::new(
                NonNull::new_unchecked(self.shared.rows.ptr.as_ptr().add(rank * self.shared.row_len_bytes)),
                self.shared.row_len_bytes,
            )
        }
    }

    fn push(&self, range: Range<usize>, peers: PeerSet) -> Result<(), FabricError> {
        check_range(&range, self.shared.row_len_bytes)?;
        if range.is_empty() {
            return Ok(());
        }
        // The provider (a thread, or the NIC by DMA) reads the row after
        // this call returns; order the caller's stores before the writes.
        // Partner: the Acquire loads of guards by the peers' readers, once
        // the bytes have landed in their copies.
        fence(Ordering::Release);
        for rank in peers.iter().filter(|p| *p < self.member_count && *p != self.rank) {
            if self.shared.peers[rank].state() == PeerState::Ready {
                self.shared.write_to(rank, &range);
            }
        }
        Ok(())
    }

    fn check_peers(&self) -> Result<(), FabricError> {
        self.shared.control.check_peers()?;
        match self.shared.peers.iter().position(|p| p.state() == PeerState::Fault) {
            Some(rank) => Err(FabricError::PeerGone { rank }),
            None => Ok(()),
        }
    }

    fn lost_peers(&self) -> PeerSet {
        let faulty = self
            .shared
            .peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state() == PeerState::Fault)
            .fold(0u64, |m, (r, _)| m | 1u64 << (r % MEMBERS_MAX));
        PeerSet(self.shared.control.lost_peers().0 | faulty)
    }

    fn joined(&self) -> PeerSet {
        let mut joined = 1u64 << self.rank;
        for (rank, peer) in self.shared.peers.iter().enumerate() {
            if peer.state() == PeerState::Ready {
                joined |= 1u64 << rank;
            }
        }
        PeerSet(joined)
    }

    fn doorbell(&self) -> &dyn Doorbell {
        &*self.shared
    }

    /// Read the completion queue once on the calling thread: software
    /// providers apply incoming writes while someone drives them.
    fn receive_now(&self) -> bool {
        self.shared.complete(0);
        false
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    /// With [`OfiOptions::delivery_complete`]: no write to `rank` is
    /// outstanding (every one issued so far reported its delivery on the
    /// completion queue) and `rank` is ready (a push to a peer that is not
    /// skips it, so nothing was delivered). Without it: `None`, a write's
    /// completion only says the bytes left.
    fn pushes_completed(&self, rank: usize) -> Option<bool> {
        if !self.shared.endpoint.granted.delivery_complete {
            return None;
        }
        let peer = self.shared.peers.get(rank)?;
        self.shared.complete(0);
        // Relaxed: a count that the completion's reader decremented; the
        // completion is the event, and nothing is read through it.
        Some(peer.state() == PeerState::Ready && peer.outstanding.load(Ordering::Relaxed) == 0)
    }
}

/// Ringing wakes local parked loops; parking drives the provider once,
/// then sleeps on the local doorbell at most [`PARK_NAP`] (a remote write
/// rings nothing here).
impl Doorbell for Shared {
    fn ring(&self) {
        self.doorbell.ring();
    }
    fn prepare_park(&self) -> u32 {
        self.complete(0);
        self.doorbell.prepare_park()
    }
    fn park(&self, ticket: u32, timeout: Duration) {
        self.doorbell.park(ticket, timeout.min(PARK_NAP));
    }
    fn cancel_park(&self) {
        self.doorbell.cancel_park();
    }
}

impl Drop for OfiFabric {
    fn drop(&mut self) {
        // Partner: the Acquire load of `stop` in `run_progress`.
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
        // The provider reads the own row until a write completes: wait for
        // the outstanding ones (bounded), before the rows are freed.
        let started = Instant::now();
        while self.shared.outstanding.load(Ordering::Relaxed) > 0 && started.elapsed() < DRAIN_MAX {
            self.shared.complete(0);
            std::thread::yield_now();
        }
        // The rest happens when `shared` drops (see its field order).
    }
}
