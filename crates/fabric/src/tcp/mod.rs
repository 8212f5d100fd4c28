//! The tcp fabric: a group across hosts. Every member keeps a local copy
//! of each peer's row; a push sends `(region, offset, bytes)` frames
//! ([`frame`]) over one TCP connection per pair of members, and the peer's
//! receive thread applies them to its copy in order (so pushes to one peer
//! become visible in order, and a guard pushed after data makes the data
//! visible, exactly as on shm).
//!
//! ```text
//!  member 0                                   member 1
//!  own row ──push(range)──▶ sendmsg ──TCP──▶ recv thread ──atomic stores──▶ copy of row 0
//!  copy of row 1 ◀──atomic stores── recv thread ◀──TCP── sendmsg ◀──push── own row
//! ```
//!
//! - **Connections**: member `r` listens on `addresses[r]`; **the higher
//!   rank always dials the lower one**, at `open` and afterwards, so each
//!   pair has exactly one dialer. `open` waits for the peers in
//!   [`TcpOptions::wait_for`] (all by default); after it, the link thread
//!   (`link`) keeps accepting from higher ranks that are not connected
//!   and keeps re-dialing lower ranks that are not (backoff 20–500 ms), so
//!   a member that starts late, or a restarted process that takes a lost
//!   member's rank, joins the running ones. Before a (re)connected peer's
//!   first frame is applied, the local copy of its row is zeroed (a new
//!   incarnation starts from zeros). Each connection starts with the
//!   [`handshake`]: both ends prove the group key (HMAC-SHA256) and agree
//!   on the group name and layout before any group data flows; the
//!   listener also checks the source address against the claimed rank's
//!   configured address ([`TcpOptions::check_source_addr`]).
//! - **Strangers** (module `accept`): the listener handshakes every accepted
//!   connection concurrently, each on its own deadline
//!   ([`TcpOptions::handshake_timeout`]), in a set bounded in total and
//!   per source address; a connection that fails (random bytes, an HTTP
//!   request, a silent or closed connection, a wrong key) is closed and
//!   counted ([`TcpFabric::handshake_stats`], `spindle stat`) and never
//!   fails `open` or the running member.
//! - **Threads**: the caller's thread pushes: one `sendmsg` per push and
//!   peer (headers and row bytes gathered without a copy; one for all the
//!   ranges of a [`Fabric::push_vectored`]), or, with
//!   [`TcpOptions::coalesce`], one per progress pass (small pushes copied
//!   into a per-peer buffer, flushed at a doorbell ring or by
//!   [`Fabric::flush`], which the group layer calls at the end of every
//!   pass). Receiving happens on whichever thread waits for it:
//!   - a progress loop receives on its own thread at every pass
//!     ([`Fabric::receive_now`]: one non-blocking `recv` per peer, no
//!     `poll`), so a spinning loop sees a frame without any other thread
//!     waking, like a busy-polling reader of a raw socket;
//!   - a loop parked on the doorbell polls the same sockets (`ppoll`,
//!     nanosecond timeout) and receives itself, so a frame wakes it
//!     directly, and it takes what has arrived before it parks;
//!   - one receive thread per process serves every peer with `poll`
//!     (`recv`) when no loop does: while loops receive or park, it naps
//!     (longer and longer, up to 8 ms, while they keep receiving), so it
//!     never takes a core from them.
//!
//!   The receive thread never sends (it can never block on a full socket
//!   while its peer waits for it to read). The link thread makes late
//!   connections (above).
//! - **TLS** (optional, [`TcpOptions::tls`], [`tls`]): each connection
//!   runs a rustls handshake with mutual authentication against the
//!   group's CA first, then the group-key handshake and every frame inside
//!   the session (a copy and an encryption per byte; no zero-copy send).
//! - **Stat file**: with [`TcpOptions::stat_dir`], the rows live in a
//!   shared mapping of `<dir>/spindle@tcp-<group>@<rank>` ([`stat`]), so
//!   `spindle stat` on the same host shows this member's view.
//! - **Liveness**: a clean close sends a `LEAVE` frame (`PeerLeft`); a
//!   closed, reset or timed-out connection is `PeerGone`; a bad frame
//!   closes the connection and is reported as `BadFrame`, naming the
//!   fault. TCP keepalive and `TCP_USER_TIMEOUT` bound how long a silent
//!   peer (a cut network) goes unnoticed: `peer_timeout`.
//!   [`Fabric::lost_peers`] lists every lost peer at once; a peer that
//!   never connected yet is [`PeerStatus::Waiting`], not lost, and
//!   [`Fabric::joined`] is this member and its connected peers.
//!
//! ```no_run
//! use spindle_fabric::{Fabric, PeerSet, tcp::{TcpFabric, TcpOptions}};
//! let addresses = vec!["127.0.0.1:7100".parse().unwrap(), "127.0.0.1:7101".parse().unwrap()];
//! let options = TcpOptions::new("doc-tcp", 4096, 0, addresses, b"shared secret".to_vec());
//! let fabric = TcpFabric::open(&options, 0).unwrap(); // member 1 opens with rank 1
//! fabric.row(0).u64_at(0).store(7, std::sync::atomic::Ordering::Release);
//! fabric.push(0..8, PeerSet::all_except(0, 2)).unwrap();
//! ```

mod accept;
mod connect;
mod doorbell;
pub mod frame;
pub mod handshake;
mod link;
mod options;
mod recv;
pub(crate) mod rows;
mod send;
pub mod stat;
pub mod tls;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::doorbell::{Doorbell, FutexDoorbell};
use crate::{check_range, Fabric, FabricError, PeerSet, RowRef, CACHE_LINE_BYTES, MEMBERS_MAX};
use frame::encode_leave;
use handshake::{ExpectRank, Handshake, HandshakeError, Hello, HELLO_BYTES, REPLY_BYTES};
use rows::RowsAlloc;
use send::PeerWriter;

pub use doorbell::Sleepers;
use options::PENDING_BYTES;
pub use options::{
    TcpOptions, COALESCE_PUSH_BYTES_MAX, HANDSHAKES_PENDING_MAX, HANDSHAKES_PENDING_MAX_DEFAULT,
    HANDSHAKES_PENDING_PER_SOURCE_MAX_DEFAULT, HANDSHAKE_TIMEOUT_DEFAULT, SEND_STALL_MAX_DEFAULT,
};

/// Largest row: bounded like shm.
const ROW_BYTES_MAX: usize = 1 << 34;
/// One connect attempt's timeout; attempts repeat until `join_timeout`.
const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a closing member waits for its peers' own close.
const LINGER: Duration = Duration::from_millis(200);

/// See [`TcpFabric::handshake_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandshakeStats {
    /// Accepted connections that failed the handshake (counted once each).
    pub failed: u64,
    /// Accepted connections in handshake now.
    pub pending: u64,
}

/// A peer connection's state, as the receive thread last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PeerStatus {
    Connected = 0,
    /// Sent LEAVE: closed cleanly.
    Left = 1,
    /// The connection closed or broke without a LEAVE.
    Gone = 2,
    /// It sent a bad frame; the connection was closed.
    Fault = 3,
    /// Not connected yet: a peer that [`TcpOptions::wait_for`] left out
    /// and that has not connected since (not a loss).
    Waiting = 4,
}

/// What the fabric and its receive thread share.
pub(crate) struct Inner {
    rank: usize,
    rows: RowsAlloc,
    row_len_bytes: usize,
    doorbell: FutexDoorbell,
    status: Vec<AtomicU8>,
    why: Vec<Mutex<Option<String>>>,
    stop: AtomicBool,
    /// By rank; `None` for this member. Locked by the pushing thread and by
    /// doorbell rings and parks (the same thread, in the group layer); the
    /// receive thread never sends, so it can never block on a full socket
    /// while its peer waits for it to read.
    writers: Vec<Option<Mutex<PeerWriter>>>,
    coalesce: bool,
    flush_on_ring: bool,
    /// The range declared by [`Fabric::declare_payload_region`]: frames
    /// inside it are applied with one memory copy.
    payload_region: std::sync::OnceLock<Range<usize>>,
    /// The receive state; see [`recv::Rx`].
    rx: Mutex<recv::Rx>,
    /// The peers' sockets by rank (-1: none yet), and which are open
    /// (bit = rank). Written by the link thread under the `rx` lock when a
    /// peer (re)connects ([`recv::Rx::install`]).
    rx_fds: Vec<AtomicI32>,
    open_mask: std::sync::atomic::AtomicU64,
    /// Tells the link thread to stop (set first when the fabric drops).
    link_stop: AtomicBool,
    /// The last connection that the link thread refused or failed to
    /// make, for diagnostics ([`TcpFabric::last_link_error`]).
    link_error: Mutex<Option<String>>,
    /// An eventfd that wakes a progress thread parked in [`recv::park`].
    wake_fd: i32,
    /// Progress threads between `prepare_park` and the end of `park`.
    sleepers: Sleepers,
    /// Parks of progress loops (counted in `prepare_park`). While it
    /// moves, a loop parks on the sockets regularly and receives there, so
    /// the receive thread naps instead of competing for the same frames
    /// (one wake-up per arrival, not two); a busy loop that never parks
    /// leaves the receiving to the receive thread, in parallel.
    parks: std::sync::atomic::AtomicU64,
    /// Calls of [`Fabric::receive_now`] (by any thread). While it moves,
    /// a loop receives on its own thread each pass, and the receive
    /// thread naps, as for `parks`.
    driven: std::sync::atomic::AtomicU64,
    /// Accepted connections that failed the handshake, and those in
    /// handshake now (written by the acceptor; see [`accept`]).
    handshakes: Arc<accept::HandshakeCounters>,
}

impl Inner {
    fn row_ptr(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.status.len(), "rank {rank} out of range");
        // SAFETY: the allocation holds member_count rows of row_len_bytes.
        unsafe { self.rows.ptr.as_ptr().add(rank * self.row_len_bytes) }
    }

    fn status(&self, rank: usize) -> PeerStatus {
        // Partner: the Release store in set_status.
        match self.status[rank].load(Ordering::Acquire) {
            0 => PeerStatus::Connected,
            1 => PeerStatus::Left,
            2 => PeerStatus::Gone,
            3 => PeerStatus::Fault,
            _ => PeerStatus::Waiting,
        }
    }

    fn set_status(&self, rank: usize, status: PeerStatus, why: Option<String>) {
        if let Some(why) = why {
            let mut slot = self.why[rank].lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(why);
        }
        // Partner: the Acquire load in status(): whoever sees the new
        // status sees the reason.
        self.status[rank].store(status as u8, Ordering::Release);
        self.mirror_status(rank, status);
        self.wake_local();
    }

    /// Show `rank`'s status in the stat file (for `spindle stat`).
    fn mirror_status(&self, rank: usize, status: PeerStatus) {
        if let Some(s) = self.rows.stat() {
            s.header().peer_status[rank].store(status as u8, Ordering::Relaxed);
        }
    }

    fn why(&self, rank: usize) -> Option<String> {
        self.why[rank].lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the eventfd was created in open_with_listener, is owned
        // by Inner alone and closed once, here.
        unsafe { libc::close(self.wake_fd) };
    }
}

/// One member of a group over TCP. See the module docs.
pub struct TcpFabric {
    rank: usize,
    member_count: usize,
    inner: Arc<Inner>,
    receiver: Option<JoinHandle<()>>,
    linker: Option<JoinHandle<()>>,
    /// Accepts and handshakes the higher ranks' connections (and
    /// strangers'), beside the link thread's dials.
    accepter: Option<JoinHandle<()>>,
    description: String,
}

impl TcpFabric {
    /// Open member `rank`: listen on its address, connect to every peer
    /// (each proving the group key), and start the receive thread.
    pub fn open(options: &TcpOptions, rank: usize) -> Result<TcpFabric, FabricError> {
        options.validate(rank)?;
        let listen = options.listen.unwrap_or(options.addresses[rank]);
        let listener = TcpListener::bind(listen).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AddrInUse {
                " (the port is in use: another member or program listens there)"
            } else {
                ""
            };
            FabricError::io(format!("member {rank}: listen on {listen}{hint}"), e)
        })?;
        TcpFabric::open_with_listener(options, rank, listener)
    }

    /// As [`TcpFabric::open`], on a listener the caller bound already
    /// (tests bind port 0 first to learn free ports).
    pub fn open_with_listener(
        options: &TcpOptions,
        rank: usize,
        listener: TcpListener,
    ) -> Result<TcpFabric, FabricError> {
        options.validate(rank)?;
        let member_count = options.addresses.len();
        let row_len_bytes = options.row_len_bytes.next_multiple_of(CACHE_LINE_BYTES);
        let total = row_len_bytes
            .checked_mul(member_count)
            .ok_or_else(|| FabricError::InvalidOption("rows overflow".into()))?;
        let mut hello = Hello {
            rank: rank as u32,
            member_count: member_count as u32,
            row_len_bytes: row_len_bytes as u64,
            layout_tag: options.layout_tag,
            group: options.group.clone(),
            nonce: [0; handshake::NONCE_BYTES],
        };
        hello.nonce = handshake::random_nonce().map_err(|e| FabricError::io("read /dev/urandom", e))?;
        let mut stat_note = String::new();
        let rows = match &options.stat_dir {
            Some(dir) => {
                let id = stat::StatIdentity {
                    group: &options.group,
                    rank,
                    member_count,
                    row_len_bytes,
                    layout_tag: options.layout_tag,
                    description: &options.layout_description,
                };
                match stat::StatFile::create(dir, &id) {
                    Ok(f) => RowsAlloc::in_stat_file(f),
                    Err(e) => {
                        // No stat file (the directory is not writable, or
                        // another process on this host runs this rank of
                        // a group with this name): `spindle stat` will not
                        // list this member; the group works the same.
                        stat_note = format!(" (no stat file: {e})");
                        RowsAlloc::new(total)?
                    }
                }
            }
            None => RowsAlloc::new(total)?,
        };
        let tls_context = match &options.tls {
            Some(config) => Some(Arc::new(tls::TlsContext::new(config)?)),
            None => None,
        };
        let stat_header = rows.stat().map(|s| s.header());
        let (streams, acceptor) =
            connect::connect_all(options, rank, &listener, &hello, tls_context.as_ref(), stat_header)?;
        let mut writers = Vec::with_capacity(member_count);
        let mut readers = Vec::with_capacity(member_count);
        let mut status = Vec::with_capacity(member_count);
        let mut rx_fds = Vec::with_capacity(member_count);
        let mut open_mask = 0u64;
        for (peer, stream) in streams.into_iter().enumerate() {
            let pending = vec![0u8; if options.coalesce { PENDING_BYTES } else { 0 }].into_boxed_slice();
            match stream {
                Some((s, session)) => {
                    let read_half = s
                        .try_clone()
                        .map_err(|e| FabricError::io(format!("clone the socket of member {peer}"), e))?;
                    rx_fds.push(AtomicI32::new(read_half.as_raw_fd()));
                    open_mask |= 1u64 << peer;
                    readers.push(Some(recv::PeerReader::new(
                        peer,
                        read_half,
                        row_len_bytes,
                        session.clone(),
                    )));
                    writers.push(Some(Mutex::new(PeerWriter {
                        stream: Some(s),
                        tls: session,
                        tls_out: Vec::new(),
                        pending,
                        pending_len: 0,
                    })));
                    status.push(AtomicU8::new(PeerStatus::Connected as u8));
                }
                None if peer == rank => {
                    rx_fds.push(AtomicI32::new(-1));
                    readers.push(None);
                    writers.push(None);
                    status.push(AtomicU8::new(PeerStatus::Connected as u8));
                }
                None => {
                    rx_fds.push(AtomicI32::new(-1));
                    readers.push(None);
                    writers.push(Some(Mutex::new(PeerWriter {
                        stream: None,
                        tls: None,
                        tls_out: Vec::new(),
                        pending,
                        pending_len: 0,
                    })));
                    status.push(AtomicU8::new(PeerStatus::Waiting as u8));
                }
            }
        }
        // SAFETY: eventfd has no memory preconditions; the fd is owned by
        // Inner and closed in its Drop.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake_fd < 0 {
            return Err(FabricError::io("create an eventfd", io::Error::last_os_error()));
        }
        let inner = Arc::new(Inner {
            rank,
            rows,
            row_len_bytes,
            doorbell: FutexDoorbell::new_local(),
            status,
            why: (0..member_count).map(|_| Mutex::new(None)).collect(),
            stop: AtomicBool::new(false),
            writers,
            coalesce: options.coalesce,
            flush_on_ring: options.flush_on_ring,
            payload_region: std::sync::OnceLock::new(),
            rx: Mutex::new(recv::Rx::new(readers)),
            rx_fds,
            open_mask: std::sync::atomic::AtomicU64::new(open_mask),
            link_stop: AtomicBool::new(false),
            link_error: Mutex::new(None),
            wake_fd,
            sleepers: Sleepers::new(),
            parks: std::sync::atomic::AtomicU64::new(0),
            driven: std::sync::atomic::AtomicU64::new(0),
            handshakes: Arc::clone(acceptor.counters()),
        });
        let mut fabric = TcpFabric {
            rank,
            member_count,
            inner,
            receiver: None,
            linker: None,
            accepter: None,
            description: format!("tcp:{}#{rank}@{}{stat_note}", options.group, options.addresses[rank]),
        };
        for peer in 0..member_count {
            fabric.inner.mirror_status(peer, fabric.inner.status(peer));
        }
        if member_count > 1 {
            let inner = Arc::clone(&fabric.inner);
            fabric.receiver = Some(
                std::thread::Builder::new()
                    .name(format!("spindle-tcp-recv-{rank}"))
                    .spawn(move || recv::run(inner))
                    .map_err(|e| FabricError::io("start the receive thread", e))?,
            );
            let (link, accepting) = link::Link::new(options, rank, listener, hello, tls_context, acceptor)?;
            let inner = Arc::clone(&fabric.inner);
            fabric.linker = Some(
                std::thread::Builder::new()
                    .name(format!("spindle-tcp-link-{rank}"))
                    .spawn(move || link.run(&inner))
                    .map_err(|e| FabricError::io("start the link thread", e))?,
            );
            let inner = Arc::clone(&fabric.inner);
            fabric.accepter = Some(
                std::thread::Builder::new()
                    .name(format!("spindle-tcp-accept-{rank}"))
                    .spawn(move || accepting.run(&inner))
                    .map_err(|e| FabricError::io("start the accept thread", e))?,
            );
        }
        Ok(fabric)
    }

    /// Why the link thread last refused a connection or failed to make
    /// one (after `open`), if it did.
    pub fn last_link_error(&self) -> Option<String> {
        self.inner.link_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The listener's handshake counters: accepted connections that failed
    /// the handshake since `open` began (strangers, wrong keys, timeouts,
    /// connections pushed out by the pending bounds), and those in
    /// handshake now. Also in the stat file, for `spindle stat`.
    pub fn handshake_stats(&self) -> HandshakeStats {
        HandshakeStats {
            failed: self.inner.handshakes.failed.load(Ordering::Relaxed),
            pending: self.inner.handshakes.pending.load(Ordering::Relaxed),
        }
    }

    /// The state of the connection to `rank`, and why it closed.
    pub fn peer_status(&self, rank: usize) -> (PeerStatus, Option<String>) {
        (self.inner.status(rank), self.inner.why(rank))
    }
}

impl Fabric for TcpFabric {
    fn member_rank(&self) -> usize {
        self.rank
    }

    fn member_count(&self) -> usize {
        self.member_count
    }

    fn row_len_bytes(&self) -> usize {
        self.inner.row_len_bytes
    }

    #[inline(always)]
    fn row(&self, rank: usize) -> RowRef<'_> {
        assert!(rank < self.member_count, "rank {rank} >= {}", self.member_count);
        // SAFETY: row_ptr is inside the 64-aligned allocation (row_len is a
        // multiple of 64), which lives as long as self (Arc).
        unsafe {
            RowRef::new(
                NonNull::new_unchecked(self.inner.row_ptr(rank)),
                self.inner.row_len_bytes,
            )
        }
    }

    fn push(&self, range: Range<usize>, peers: PeerSet) -> Result<(), FabricError> {
        self.push_vectored(std::slice::from_ref(&range), peers)
    }

    /// One `sendmsg` per peer for all of `ranges` (the iovec budget
    /// allowing: 16 frames per call); with
    /// coalescing, each range as [`Fabric::push`] would.
    fn push_vectored(&self, ranges: &[Range<usize>], peers: PeerSet) -> Result<(), FabricError> {
        for range in ranges {
            check_range(range, self.inner.row_len_bytes)?;
        }
        if ranges.iter().all(|r| r.is_empty()) {
            return Ok(());
        }
        // The writes below read the row; order the caller's stores first.
        fence(Ordering::Release);
        for peer in peers.iter().filter(|p| *p < self.member_count && *p != self.rank) {
            if self.inner.status(peer) != PeerStatus::Connected {
                continue; // reported by check_peers
            }
            // An error marked the peer Gone (see send_push).
            let _ = self.send_push(peer, ranges);
        }
        Ok(())
    }

    fn check_peers(&self) -> Result<(), FabricError> {
        for rank in (0..self.member_count).filter(|r| *r != self.rank) {
            match self.inner.status(rank) {
                PeerStatus::Connected | PeerStatus::Waiting => {}
                PeerStatus::Left => return Err(FabricError::PeerLeft { rank }),
                PeerStatus::Gone => return Err(FabricError::PeerGone { rank }),
                PeerStatus::Fault => {
                    return Err(FabricError::BadFrame {
                        rank,
                        fault: self.inner.why(rank).unwrap_or_default(),
                    })
                }
            }
        }
        Ok(())
    }

    /// The peers whose connection was lost: closed, reset, timed out, left
    /// or faulted (not [`PeerStatus::Connected`], and not still
    /// [`PeerStatus::Waiting`] for a first connection). Never an error; a
    /// lost peer that reconnects (a restarted process with its rank) leaves
    /// the set again.
    fn lost_peers(&self) -> PeerSet {
        let mut lost = 0u64;
        for rank in (0..self.member_count).filter(|r| *r != self.rank) {
            if matches!(
                self.inner.status(rank),
                PeerStatus::Left | PeerStatus::Gone | PeerStatus::Fault
            ) {
                lost |= 1u64 << rank;
            }
        }
        PeerSet(lost)
    }

    fn joined(&self) -> PeerSet {
        // This member and the peers connected now.
        let mut joined = 1u64 << self.rank;
        for rank in (0..self.member_count).filter(|r| *r != self.rank) {
            if self.inner.status(rank) == PeerStatus::Connected {
                joined |= 1u64 << rank;
            }
        }
        PeerSet(joined)
    }

    fn doorbell(&self) -> &dyn Doorbell {
        &*self.inner
    }

    /// One non-blocking `recv` per open peer on the calling thread (no
    /// `poll`), skipped if another thread is receiving. While loops call
    /// it, the receive thread naps (`recv::run`): one receiver per
    /// arrival, and no lock contention between the two.
    fn receive_now(&self) -> bool {
        recv::receive_now(&self.inner)
    }

    /// Yes: one non-blocking `recv` per open peer.
    fn receive_makes_system_calls(&self) -> bool {
        true
    }

    /// Send the pushes coalesced so far (see [`TcpOptions::coalesce`]).
    fn flush(&self) {
        self.inner.flush_all();
    }

    fn declare_payload_region(&self, range: Range<usize>) {
        assert!(
            range.end <= self.inner.row_len_bytes,
            "payload region {range:?} outside the row"
        );
        let held = self.inner.payload_region.get_or_init(|| range.clone());
        debug_assert_eq!(*held, range, "one payload region per fabric");
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        // No new connections from here on. Partner: the Acquire load of
        // `link_stop` in the link loop.
        self.inner.link_stop.store(true, Ordering::Release);
        if let Some(t) = self.linker.take() {
            let _ = t.join();
        }
        if let Some(t) = self.accepter.take() {
            let _ = t.join();
        }
        self.inner.flush_all();
        let leave = encode_leave();
        for (peer, writer) in self.inner.writers.iter().enumerate() {
            let Some(writer) = writer else { continue };
            let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
            let w = &mut *w;
            let Some(stream) = w.stream.as_mut() else { continue };
            if self.inner.status(peer) == PeerStatus::Connected || self.inner.status(peer) == PeerStatus::Left {
                match &w.tls {
                    None => {
                        let _ = stream.write_all(&leave);
                    }
                    Some(session) => {
                        if tls::seal(session, &[&leave], &mut w.tls_out).is_ok() {
                            let _ = stream.write_all(&w.tls_out);
                        }
                    }
                }
            }
            let _ = stream.shutdown(Shutdown::Write);
        }
        // Let the peers' own LEAVE arrive, so closing with unread bytes does
        // not reset connections that still carry their last frames.
        let started = Instant::now();
        while started.elapsed() < LINGER
            && (0..self.member_count).any(|r| r != self.rank && self.inner.status(r) == PeerStatus::Connected)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        // Partner: the Acquire load of `stop` in the receive loop.
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.receiver.take() {
            let _ = t.join();
        }
    }
}
