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
//!   ([`link`]) keeps accepting from higher ranks that are not connected
//!   and keeps re-dialing lower ranks that are not (backoff 20–500 ms), so
//!   a member that starts late, or a restarted process that takes a lost
//!   member's rank, joins the running ones. Before a (re)connected peer's
//!   first frame is applied, the local copy of its row is zeroed (a new
//!   incarnation starts from zeros). Each connection starts with the
//!   [`handshake`]: both ends prove the group key (HMAC-SHA256) and agree
//!   on the group name and layout before any group data flows; the
//!   listener also checks the source address against the claimed rank's
//!   configured address ([`TcpOptions::check_source_addr`]).
//! - **Threads**: the caller's thread pushes: one `sendmsg` per push and
//!   peer (headers and row bytes gathered without a copy), or, with
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
//!     ([`recv`]) when no loop does: while loops receive or park, it naps
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

pub mod frame;
pub mod handshake;
mod link;
mod recv;
pub mod stat;
pub mod tls;

use std::alloc::Layout;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::doorbell::{Doorbell, FutexDoorbell};
use crate::{check_range, Fabric, FabricError, PeerSet, RowRef, CACHE_LINE_BYTES, MEMBERS_MAX};
use frame::{encode_leave, encode_write, FRAME_HEADER_BYTES, FRAME_PAYLOAD_MAX};
use handshake::{ExpectRank, Handshake, HandshakeError, Hello, HELLO_BYTES, REPLY_BYTES};

/// Frames gathered into one `sendmsg` (two iovecs each).
const FRAMES_PER_SEND_MAX: usize = 16;
/// Largest row: bounded like shm.
const ROW_BYTES_MAX: usize = 1 << 34;
/// How long one handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// One connect attempt's timeout; attempts repeat until `join_timeout`.
const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a closing member waits for its peers' own close.
const LINGER: Duration = Duration::from_millis(200);

/// What a member needs to open (or join) a group over TCP.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    pub group: String,
    /// Bytes per row; rounded up to a cache line.
    pub row_len_bytes: usize,
    /// A fingerprint of the layer above's row layout (checked in the
    /// handshake, like shm's layout tag).
    pub layout_tag: u64,
    /// `addresses[r]`: where member `r` listens. The member count is its
    /// length.
    pub addresses: Vec<SocketAddr>,
    /// Listen here instead of `addresses[rank]` (e.g. `0.0.0.0:port`).
    pub listen: Option<SocketAddr>,
    /// The group's shared secret (every member must have the same).
    pub key: Vec<u8>,
    /// How long to wait for every peer to connect.
    pub join_timeout: Duration,
    /// A peer that acknowledges nothing for this long is gone.
    pub peer_timeout: Duration,
    /// The longest a push may wait for one peer's socket to take its bytes
    /// (the send buffer full: the peer is cut off, stopped or far behind).
    /// Past it the peer is declared gone, so that one stuck peer never
    /// stalls the pushes to the others (and their heartbeats) for long.
    /// Keep it well below the group's suspicion timeout.
    pub send_stall_max: Duration,
    /// Coalesce pushes: small pushes (up to [`COALESCE_PUSH_BYTES_MAX`])
    /// are copied into a per-peer buffer and sent together at the next
    /// [`Doorbell::ring`] of this fabric's doorbell, the next large push,
    /// [`Fabric::flush`], a park on the doorbell, or when the buffer
    /// fills. One `sendmsg` per progress pass instead of one per push. For
    /// users that ring (or flush) after their pushes, as the group layer
    /// does: nothing else sends them. Off by default (every push is sent
    /// at once).
    pub coalesce: bool,
    /// With `coalesce`: whether a doorbell ring flushes. Off, pushes go out
    /// only at [`Fabric::flush`], before a park, when the buffer fills
    /// or with a large push: for a caller that flushes once per progress
    /// pass (the group layer does), one `sendmsg` per pass however many
    /// times the layer above rings. On by default.
    pub flush_on_ring: bool,
    /// The peers [`TcpFabric::open`] waits for (`None`: every peer, the
    /// default). The others may connect later: a member that starts late,
    /// or a restarted process taking a lost member's rank. Until then
    /// their status is [`PeerStatus::Waiting`] and [`Fabric::joined`]
    /// leaves them out.
    pub wait_for: Option<PeerSet>,
    /// Refuse a connection whose source address is not the configured
    /// address (`addresses[r]`) of the rank `r` it claims. On by default;
    /// turn it off behind NAT or when members dial from another interface
    /// than the one they listen on.
    pub check_source_addr: bool,
    /// Keep the rows in a stat file in this directory (`None`, the
    /// default: on the heap), so that `spindle stat` on this host sees
    /// this member's rows and connections ([`stat`]); `spindle run` and
    /// the bench use `/dev/shm`. A member killed with SIGKILL leaves its
    /// file behind (`spindle stat` shows it as crashed).
    pub stat_dir: Option<std::path::PathBuf>,
    /// The layer above's description of its row layout (shown by `spindle
    /// stat`, which rebuilds the layout from it). The group layer's
    /// `SmcLayout` summary; by default just the sizes and tag.
    pub layout_description: String,
    /// Run every connection inside TLS (rustls), with mutual
    /// authentication against the group's CA ([`tls`]). `None` (the
    /// default): plain TCP, authenticated by the group key only.
    pub tls: Option<tls::TlsConfig>,
}

/// Default of [`TcpOptions::send_stall_max`]: no bound beyond
/// `peer_timeout`. A group with membership sets it below its suspicion
/// timeout (`spindle run` uses a quarter of it).
pub const SEND_STALL_MAX_DEFAULT: Duration = Duration::MAX;

/// Largest push that coalescing copies (larger ones go straight from the
/// row, after the pending bytes, in the same `sendmsg`).
pub const COALESCE_PUSH_BYTES_MAX: usize = 4096;
/// Pending bytes per peer before a flush is forced.
const PENDING_BYTES: usize = 64 << 10;
const _: () = assert!(COALESCE_PUSH_BYTES_MAX + FRAME_HEADER_BYTES <= PENDING_BYTES);

impl TcpOptions {
    pub fn new(
        group: &str,
        row_len_bytes: usize,
        layout_tag: u64,
        addresses: Vec<SocketAddr>,
        key: Vec<u8>,
    ) -> TcpOptions {
        let layout_description = format!(
            "members={} row_len_bytes={row_len_bytes} tag={layout_tag:#x}",
            addresses.len()
        );
        TcpOptions {
            group: group.to_string(),
            row_len_bytes,
            layout_tag,
            addresses,
            listen: None,
            key,
            join_timeout: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(3),
            send_stall_max: SEND_STALL_MAX_DEFAULT,
            coalesce: false,
            flush_on_ring: true,
            wait_for: None,
            check_source_addr: true,
            stat_dir: None,
            layout_description,
            tls: None,
        }
    }

    /// The peers `open` must wait for, as a mask (never `rank` itself).
    fn required(&self, rank: usize) -> u64 {
        let all = PeerSet::all(self.addresses.len()).0;
        self.wait_for.map(|w| w.0).unwrap_or(all) & all & !(1u64 << rank)
    }

    fn validate(&self, rank: usize) -> Result<(), FabricError> {
        crate::shm::validate_group_name(&self.group)?;
        let member_count = self.addresses.len();
        if member_count == 0 || member_count > MEMBERS_MAX {
            return Err(FabricError::InvalidOption(format!(
                "{member_count} member addresses given; a group has 1..={MEMBERS_MAX} members"
            )));
        }
        if rank >= member_count {
            return Err(FabricError::RankOutOfRange { rank, member_count });
        }
        if self.row_len_bytes == 0 || self.row_len_bytes > ROW_BYTES_MAX {
            return Err(FabricError::InvalidOption(format!(
                "row_len_bytes {} must be in 1..={ROW_BYTES_MAX}",
                self.row_len_bytes
            )));
        }
        if let Some(w) = self.wait_for {
            let all = PeerSet::all(member_count).0;
            if w.0 & !all != 0 {
                return Err(FabricError::InvalidOption(format!(
                    "wait_for names ranks {:?}, but the group has {member_count} members",
                    PeerSet(w.0 & !all).iter().collect::<Vec<_>>()
                )));
            }
        }
        if self.peer_timeout < Duration::from_millis(100) {
            return Err(FabricError::InvalidOption(format!(
                "peer_timeout {} ms must be at least 100 ms",
                self.peer_timeout.as_millis()
            )));
        }
        Ok(())
    }
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
    sleepers: std::sync::atomic::AtomicU32,
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
}

/// One peer's send side: the socket and the pushes copied since the last
/// flush (coalescing mode).
struct PeerWriter {
    /// `None` until the peer first connects.
    stream: Option<TcpStream>,
    /// The connection's TLS session, and the ciphertext of one send.
    tls: Option<tls::Session>,
    tls_out: Vec<u8>,
    pending: Box<[u8]>,
    pending_len: usize,
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

    /// Send every peer's pending pushes.
    fn flush_all(&self) {
        for (peer, writer) in self.writers.iter().enumerate() {
            let Some(writer) = writer else { continue };
            let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
            if w.pending_len == 0 {
                continue;
            }
            if self.status(peer) != PeerStatus::Connected {
                w.pending_len = 0;
                continue;
            }
            if let Err(e) = self.send_frames(peer, &mut w, None) {
                // Under the writer lock: a reconnection installs its stream
                // (and then Connected) only after this.
                self.set_status(peer, PeerStatus::Gone, Some(format!("sending to it failed: {e}")));
            }
        }
    }

    /// Send `w`'s pending bytes, then (if given) `range` of the own row as
    /// frames straight from the row, in as few `sendmsg` calls as the
    /// iovec budget allows.
    fn send_frames(&self, peer: usize, w: &mut PeerWriter, range: Option<&Range<usize>>) -> io::Result<()> {
        let base = self.row_ptr(self.rank);
        let Some(fd) = w.stream.as_ref().map(|s| s.as_raw_fd()) else {
            w.pending_len = 0;
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("member {peer} has not connected yet"),
            ));
        };
        let mut headers = [[0u8; FRAME_HEADER_BYTES]; FRAMES_PER_SEND_MAX];
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2 * FRAMES_PER_SEND_MAX + 1];
        let mut n_iov = 0;
        if w.pending_len > 0 {
            iov[0] = libc::iovec {
                iov_base: w.pending.as_mut_ptr() as *mut libc::c_void,
                iov_len: w.pending_len,
            };
            n_iov = 1;
        }
        let (mut at, end) = range.map(|r| (r.start, r.end)).unwrap_or((0, 0));
        loop {
            let mut frames = 0;
            while frames < FRAMES_PER_SEND_MAX && at < end {
                let len = (end - at).min(FRAME_PAYLOAD_MAX);
                headers[frames] = encode_write(at as u64, len as u32);
                iov[n_iov] = libc::iovec {
                    iov_base: headers[frames].as_mut_ptr() as *mut libc::c_void,
                    iov_len: FRAME_HEADER_BYTES,
                };
                iov[n_iov + 1] = libc::iovec {
                    // SAFETY: at + len <= row_len_bytes (range checked by push).
                    iov_base: unsafe { base.add(at) } as *mut libc::c_void,
                    iov_len: len,
                };
                n_iov += 2;
                at += len;
                frames += 1;
            }
            if n_iov == 0 {
                break;
            }
            let sent = match &w.tls {
                None => send_all(fd, &mut iov[..n_iov]),
                Some(session) => {
                    let parts: Vec<&[u8]> = iov[..n_iov]
                        .iter()
                        // SAFETY: each iovec points to memory valid for
                        // reads of its length (see send_all), alive here.
                        .map(|v| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) })
                        .collect();
                    let mut out = std::mem::take(&mut w.tls_out);
                    let sealed = tls::seal(session, &parts, &mut out);
                    let sent = sealed.and_then(|()| {
                        let mut one = [libc::iovec {
                            iov_base: out.as_mut_ptr() as *mut libc::c_void,
                            iov_len: out.len(),
                        }];
                        send_all(fd, &mut one)
                    });
                    w.tls_out = out;
                    sent
                }
            };
            w.pending_len = 0;
            sent?;
            n_iov = 0;
            if at >= end {
                break;
            }
        }
        Ok(())
    }
}

impl Inner {
    /// Wake local loops parked on this fabric's doorbell (after applying
    /// frames or a status change).
    fn wake_local(&self) {
        self.doorbell.ring();
        // Partner: the SeqCst increment of `sleepers` in prepare_park (a
        // Dekker pair, as in the futex doorbell): either the parker's
        // re-check sees the applied data, or this load sees the parker.
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a local u64 to our eventfd.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }
}

/// The fabric's doorbell. Ringing it first sends the pushes coalesced
/// since the last ring (the group layer rings after each batch of
/// pushes), then wakes local parked loops. Parking sleeps in `poll` on
/// the peers' sockets and an eventfd, and receives on the parked thread
/// ([`recv::park`]): a frame wakes the progress loop directly.
impl Doorbell for Inner {
    fn ring(&self) {
        if self.coalesce && self.flush_on_ring {
            self.flush_all();
        }
        self.wake_local();
    }
    fn prepare_park(&self) -> u32 {
        if self.coalesce {
            // Never sleep on unsent pushes.
            self.flush_all();
        }
        // Take what has arrived: the caller's re-check then sees it and
        // does not park at all.
        recv::try_receive(self);
        self.parks.fetch_add(1, Ordering::Relaxed);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        0
    }
    fn park(&self, _ticket: u32, timeout: Duration) {
        recv::park(self, timeout);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
    fn cancel_park(&self) {
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The rows of every member: one zeroed, cache-line-aligned allocation,
/// on the heap or in the member's stat file ([`stat`]).
struct RowsAlloc {
    ptr: NonNull<u8>,
    backing: Backing,
}

enum Backing {
    Heap(Layout),
    Stat(stat::StatFile),
}

// SAFETY: the allocation is plain memory; all shared access goes through
// atomics (RowRef, the receive thread) or the guard protocol.
unsafe impl Send for RowsAlloc {}
// SAFETY: as for Send.
unsafe impl Sync for RowsAlloc {}

impl RowsAlloc {
    fn new(bytes: usize) -> Result<RowsAlloc, FabricError> {
        let layout = Layout::from_size_align(bytes.max(CACHE_LINE_BYTES), CACHE_LINE_BYTES)
            .map_err(|e| FabricError::InvalidOption(format!("rows of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| FabricError::InvalidOption(format!("cannot allocate {bytes} bytes of rows")))?;
        Ok(RowsAlloc {
            ptr,
            backing: Backing::Heap(layout),
        })
    }

    /// The rows in a stat file (zeroed by its creation).
    fn in_stat_file(file: stat::StatFile) -> RowsAlloc {
        RowsAlloc {
            ptr: file.rows_ptr(),
            backing: Backing::Stat(file),
        }
    }

    fn stat(&self) -> Option<&stat::StatFile> {
        match &self.backing {
            Backing::Stat(s) => Some(s),
            Backing::Heap(_) => None,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the eventfd was created in open_with_listener, is owned
        // by Inner alone and closed once, here.
        unsafe { libc::close(self.wake_fd) };
    }
}

impl Drop for RowsAlloc {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
        // A stat file unmaps (and unlinks) itself.
    }
}

/// One member of a group over TCP. See the module docs.
pub struct TcpFabric {
    rank: usize,
    member_count: usize,
    inner: Arc<Inner>,
    receiver: Option<JoinHandle<()>>,
    linker: Option<JoinHandle<()>>,
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
        let streams = connect::connect_all(options, rank, &listener, &hello, tls_context.as_deref())?;
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
            sleepers: std::sync::atomic::AtomicU32::new(0),
            parks: std::sync::atomic::AtomicU64::new(0),
            driven: std::sync::atomic::AtomicU64::new(0),
        });
        let mut fabric = TcpFabric {
            rank,
            member_count,
            inner,
            receiver: None,
            linker: None,
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
            let link = link::Link::new(options, rank, listener, hello, tls_context)?;
            let inner = Arc::clone(&fabric.inner);
            fabric.linker = Some(
                std::thread::Builder::new()
                    .name(format!("spindle-tcp-link-{rank}"))
                    .spawn(move || link.run(&inner))
                    .map_err(|e| FabricError::io("start the link thread", e))?,
            );
        }
        Ok(fabric)
    }

    /// Why the link thread last refused a connection or failed to make
    /// one (after `open`), if it did.
    pub fn last_link_error(&self) -> Option<String> {
        self.inner.link_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The state of the connection to `rank`, and why it closed.
    pub fn peer_status(&self, rank: usize) -> (PeerStatus, Option<String>) {
        (self.inner.status(rank), self.inner.why(rank))
    }

    /// Send one push (already range-checked) to one peer: copied into the
    /// pending buffer when coalescing and small, else sent now (after the
    /// pending bytes, in the same `sendmsg`).
    fn send_push(&self, peer: usize, range: &Range<usize>) -> io::Result<()> {
        let Some(writer) = &self.inner.writers[peer] else {
            return Ok(());
        };
        let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.send_push_locked(peer, &mut w, range);
        if let Err(e) = &result {
            // A broken connection is the peer's loss, reported by
            // check_peers; the push to the others goes on. Under the writer
            // lock: a reconnection installs its stream only after this.
            self.inner
                .set_status(peer, PeerStatus::Gone, Some(format!("sending to it failed: {e}")));
        }
        result
    }

    fn send_push_locked(&self, peer: usize, w: &mut PeerWriter, range: &Range<usize>) -> io::Result<()> {
        let len = range.len();
        if self.inner.coalesce && len <= COALESCE_PUSH_BYTES_MAX {
            if w.pending_len + FRAME_HEADER_BYTES + len > w.pending.len() {
                self.inner.send_frames(peer, w, None)?;
            }
            let at = w.pending_len;
            w.pending[at..at + FRAME_HEADER_BYTES].copy_from_slice(&encode_write(range.start as u64, len as u32));
            let src = self.inner.row_ptr(self.rank);
            // SAFETY: the range lies in the own row (checked by push); only
            // this member writes its row, and the bytes of a range being
            // pushed are not being written (the caller's contract); the
            // destination has room (checked above) and does not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(range.start),
                    w.pending.as_mut_ptr().add(at + FRAME_HEADER_BYTES),
                    len,
                )
            };
            w.pending_len = at + FRAME_HEADER_BYTES + len;
            return Ok(());
        }
        self.inner.send_frames(peer, w, Some(range))
    }
}

/// `sendmsg` until every iovec is sent (blocking, bounded by SO_SNDTIMEO).
fn send_all(fd: i32, mut iov: &mut [libc::iovec]) -> io::Result<()> {
    while !iov.is_empty() {
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: every iovec points to memory valid for reads of its length
        // for the call (frame headers on the caller's stack, bytes of the
        // own row, which nobody writes while it is being pushed: the range
        // is published or about to be); MSG_NOSIGNAL: EPIPE, not SIGPIPE.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut n = n as usize;
        while n > 0 && !iov.is_empty() {
            if n >= iov[0].iov_len {
                n -= iov[0].iov_len;
                iov = &mut iov[1..];
            } else {
                // SAFETY: n < iov_len, so the advanced pointer stays inside.
                iov[0].iov_base = unsafe { (iov[0].iov_base as *mut u8).add(n) } as *mut libc::c_void;
                iov[0].iov_len -= n;
                n = 0;
            }
        }
        while !iov.is_empty() && iov[0].iov_len == 0 {
            iov = &mut iov[1..];
        }
    }
    Ok(())
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
        check_range(&range, self.inner.row_len_bytes)?;
        if range.is_empty() {
            return Ok(());
        }
        // The writes below read the row; order the caller's stores first.
        fence(Ordering::Release);
        for peer in peers.iter().filter(|p| *p < self.member_count && *p != self.rank) {
            if self.inner.status(peer) != PeerStatus::Connected {
                continue; // reported by check_peers
            }
            // An error marked the peer Gone (see send_push).
            let _ = self.send_push(peer, &range);
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

mod connect {
    //! Connection set-up at `open`: dial the lower ranks it waits for,
    //! accept the higher ones (and any other higher rank that dials
    //! meanwhile), handshake. After `open` the link thread ([`super::link`])
    //! makes the connections that are still missing or were lost.

    use super::*;

    /// A connection after its handshake: the socket, and the TLS session
    /// over it when the group uses TLS.
    pub type Conn = (TcpStream, Option<tls::Session>);

    /// Connect to every peer that `options` says to wait for; `result[r]`
    /// is the connection to member `r` (`None` for this member and for
    /// peers left to the link thread).
    pub fn connect_all(
        options: &TcpOptions,
        rank: usize,
        listener: &TcpListener,
        hello: &Hello,
        tls: Option<&tls::TlsContext>,
    ) -> Result<Vec<Option<Conn>>, FabricError> {
        let member_count = options.addresses.len();
        let required = options.required(rank);
        let deadline = Instant::now() + options.join_timeout;
        let abort = AtomicBool::new(false);
        let accepted = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_higher(options, rank, listener, hello, tls, deadline, &abort));
            let dialed = (0..rank)
                .filter(|peer| required & (1u64 << peer) != 0)
                .map(|peer| dial(options, peer, hello, tls, deadline, &abort).map(|s| (peer, s)))
                .collect::<Result<Vec<_>, _>>();
            if dialed.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            let accepted = acceptor.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            match (dialed, accepted) {
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(d), Ok(a)) => Ok((d, a)),
            }
        })?;
        let (dialed, accepted) = accepted;
        let mut streams: Vec<Option<Conn>> = (0..member_count).map(|_| None).collect();
        for (peer, s) in dialed.into_iter().chain(accepted) {
            streams[peer] = Some(s);
        }
        for (peer, s) in streams.iter().enumerate() {
            if let Some((s, _)) = s {
                tune(s, options.peer_timeout, options.send_stall_max)
                    .map_err(|e| FabricError::io(format!("set socket options for member {peer}"), e))?;
            }
        }
        assert!(
            streams
                .iter()
                .enumerate()
                .all(|(r, s)| (r != rank || s.is_none()) && (required & (1u64 << r) == 0 || s.is_some())),
            "connectivity: one connection to every required peer, none to itself"
        );
        Ok(streams)
    }

    fn accept_higher(
        options: &TcpOptions,
        rank: usize,
        listener: &TcpListener,
        hello: &Hello,
        tls: Option<&tls::TlsContext>,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<Vec<(usize, Conn)>, FabricError> {
        let higher = if rank + 1 >= MEMBERS_MAX {
            0
        } else {
            u64::MAX << (rank + 1)
        };
        let required_higher = options.required(rank) & higher;
        let mut got: Vec<(usize, Conn)> = Vec::new();
        let mut got_mask = 0u64;
        listener
            .set_nonblocking(true)
            .map_err(|e| FabricError::io("listener", e))?;
        while got_mask & required_higher != required_higher {
            if abort.load(Ordering::Relaxed) {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                let missing: Vec<usize> = PeerSet(required_higher & !got_mask).iter().collect();
                return Err(FabricError::JoinTimeout {
                    group: options.group.clone(),
                    missing,
                    waited_ms: options.join_timeout.as_millis() as u64,
                });
            }
            let (stream, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(FabricError::io(format!("member {rank}: accept"), e)),
            };
            stream
                .set_nonblocking(false)
                .map_err(|e| FabricError::io("accepted socket", e))?;
            let source = options
                .check_source_addr
                .then_some((from, options.addresses.as_slice()));
            let (peer, session) = handshake_io(
                &stream,
                &options.key,
                hello,
                ExpectRank::Above(rank as u32),
                source,
                tls.map(|t| (t, None)),
                &format!("connecting from {from}"),
            )
            .map_err(|(e, _)| e)?;
            if got_mask & (1u64 << peer) != 0 {
                return Err(FabricError::Handshake {
                    peer: format!("member {peer} at {from}"),
                    fault:
                        "a second connection for a member already connected (two processes with the same member id?)"
                            .into(),
                });
            }
            got_mask |= 1u64 << peer;
            got.push((peer, (stream, session)));
        }
        Ok(got)
    }

    fn dial(
        options: &TcpOptions,
        peer: usize,
        hello: &Hello,
        tls: Option<&tls::TlsContext>,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<Conn, FabricError> {
        let addr = options.addresses[peer];
        let mut backoff = Duration::from_millis(10);
        let mut last_error = String::from("none");
        loop {
            if abort.load(Ordering::Relaxed) {
                return Err(FabricError::InvalidOption("connection set-up aborted".into()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(FabricError::ConnectTimeout {
                    rank: peer,
                    addr: addr.to_string(),
                    waited_ms: options.join_timeout.as_millis() as u64,
                    last_error,
                });
            }
            let attempt = CONNECT_ATTEMPT_TIMEOUT.min(deadline - now);
            match TcpStream::connect_timeout(&addr, attempt) {
                Ok(stream) => {
                    match handshake_io(
                        &stream,
                        &options.key,
                        hello,
                        ExpectRank::Exactly(peer as u32),
                        None,
                        tls.map(|t| (t, Some(addr.ip()))),
                        &format!("member {peer} at {addr}"),
                    ) {
                        Ok((id, session)) => {
                            debug_assert_eq!(id, peer);
                            return Ok((stream, session));
                        }
                        // It still has the old connection of this rank
                        // (a restart): try again until the deadline.
                        Err((e, true)) => last_error = e.to_string(),
                        Err((e, false)) => return Err(e),
                    }
                    std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(e) => {
                    last_error = e.to_string();
                    std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// Run the handshake over `stream`; the peer's rank on success, else
    /// the error and whether the peer refused this member as busy (it
    /// still holds a connection of this rank: worth another try). With
    /// `source` (the listener side), the connection's source address
    /// must be the configured address of the rank the peer claims.
    /// With `tls`, the TLS handshake runs first (as the client checking
    /// the certificate for the dialed address when one is given, else as
    /// the server), then the group-key handshake inside the session,
    /// which is returned.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handshake_io(
        stream: &TcpStream,
        key: &[u8],
        hello: &Hello,
        expect: ExpectRank,
        source: Option<(SocketAddr, &[SocketAddr])>,
        tls: Option<(&tls::TlsContext, Option<std::net::IpAddr>)>,
        who: &str,
    ) -> Result<(usize, Option<tls::Session>), (FabricError, bool)> {
        let mut busy = false;
        let fail = |fault: String| FabricError::Handshake {
            peer: who.to_string(),
            fault,
        };
        stream
            .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .and_then(|_| stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
            .and_then(|_| stream.set_nodelay(true))
            .map_err(|e| (fail(format!("socket options: {e}")), false))?;
        match tls {
            None => {
                let mut io = stream;
                handshake_steps(&mut io, stream, key, hello, expect, source, who, &mut busy)
                    .map(|r| (r, None))
                    .map_err(|e| (e, busy))
            }
            Some((context, dialed)) => {
                let mut conn = context.handshake(stream, dialed).map_err(|e| (fail(e), false))?;
                let mut io = tls::TlsIo {
                    conn: &mut conn,
                    stream,
                };
                let rank = handshake_steps(&mut io, stream, key, hello, expect, source, who, &mut busy)
                    .map_err(|e| (e, busy))?;
                Ok((rank, Some(Arc::new(Mutex::new(conn)))))
            }
        }
    }

    /// Both directions of a connection during the handshake: the socket,
    /// or a TLS session over it.
    trait ReadWrite: Read + Write {}
    impl<T: Read + Write> ReadWrite for T {}

    #[allow(clippy::too_many_arguments)]
    fn handshake_steps(
        s: &mut dyn ReadWrite,
        stream: &TcpStream,
        key: &[u8],
        hello: &Hello,
        expect: ExpectRank,
        source: Option<(SocketAddr, &[SocketAddr])>,
        who: &str,
        busy: &mut bool,
    ) -> Result<usize, FabricError> {
        let fail = |fault: String| FabricError::Handshake {
            peer: who.to_string(),
            fault,
        };
        let mut hs = Handshake::new(key, hello.clone(), expect);
        if let Some((from, addresses)) = source {
            hs.check_source(from.ip(), addresses);
        }
        let io_fault = |what: &str, e: io::Error| {
            if e.kind() == io::ErrorKind::InvalidData && e.to_string().starts_with("TLS") {
                // TLS 1.3: a client learns that its certificate was refused
                // only at its first read after the handshake.
                format!(
                    "TLS handshake failed: {e} (are both members' certificates signed by the same group CA, tls_ca?)"
                )
            } else if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                format!(
                    "no {what} within {} s (is it a Spindle member?)",
                    HANDSHAKE_TIMEOUT.as_secs()
                )
            } else {
                format!("connection closed while waiting for its {what} ({e}; is it a Spindle member of this group?)")
            }
        };
        // Step 1: HELLO both ways.
        let _ = s.write_all(&hs.hello());
        let mut their_hello = [0u8; HELLO_BYTES];
        s.read_exact(&mut their_hello).map_err(|e| fail(io_fault("hello", e)))?;
        let who = match hs.on_hello(&their_hello) {
            Ok(proof) => {
                let _ = s.write_all(&proof);
                match expect {
                    ExpectRank::Above(_) | ExpectRank::AboveFree { .. } => {
                        format!("member {} ({who})", hs.peer_rank().expect("hello accepted"))
                    }
                    ExpectRank::Exactly(_) => who.to_string(),
                }
            }
            Err((refusal, e)) => return Err(refuse(s, stream, &refusal, fail(e.to_string()))),
        };
        let fail = |fault: String| FabricError::Handshake {
            peer: who.clone(),
            fault,
        };
        // Step 2: PROOF both ways (or a refusal).
        let mut reply = [0u8; REPLY_BYTES];
        s.read_exact(&mut reply).map_err(|e| fail(io_fault("proof", e)))?;
        match hs.on_proof(&reply) {
            Ok(accept) => {
                let _ = s.write_all(&accept);
            }
            Err((refusal, e @ HandshakeError::Refused { .. })) => {
                return Err(refuse(s, stream, &refusal, fail(e.to_string())))
            }
            Err((_, e)) => {
                *busy = e == HandshakeError::RefusedByPeer(handshake::Reason::Busy);
                return Err(fail(e.to_string()));
            }
        }
        // Step 3: verdicts.
        s.read_exact(&mut reply).map_err(|e| fail(io_fault("verdict", e)))?;
        hs.on_verdict(&reply).map_err(|e| {
            *busy = e == HandshakeError::RefusedByPeer(handshake::Reason::Busy);
            fail(e.to_string())
        })?;
        Ok(hs.peer_rank().expect("handshake complete"))
    }

    /// Send a refusal, then let the peer read it before the socket closes
    /// (closing with unread bytes would reset the connection first).
    fn refuse(
        s: &mut dyn ReadWrite,
        stream: &TcpStream,
        refusal: &[u8; REPLY_BYTES],
        error: FabricError,
    ) -> FabricError {
        let _ = s.write_all(refusal);
        let _ = s.flush();
        let _ = stream.shutdown(Shutdown::Write);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let mut sink = [0u8; 256];
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(500) {
            match s.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        error
    }

    /// Data-phase socket options: no Nagle delay, blocking writes bounded
    /// by `send_stall_max` (a peer that cannot take a push for that long is
    /// gone: one stuck peer must not stall the pusher's traffic to the
    /// others), and keepalive/user timeout so a silent peer is noticed
    /// within about `peer_timeout`.
    pub(super) fn tune(stream: &TcpStream, peer_timeout: Duration, send_stall_max: Duration) -> io::Result<()> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(Some(send_stall_max.min(peer_timeout)))?;
        let fd = stream.as_raw_fd();
        let secs = peer_timeout.as_secs().clamp(1, 3600) as libc::c_int;
        let ms = peer_timeout.as_millis().min(u32::MAX as u128) as libc::c_uint;
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1)?;
        setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1)?;
        setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, secs)?;
        setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms as libc::c_int)?;
        Ok(())
    }

    fn setsockopt(fd: i32, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
        // SAFETY: `value` is a c_int that lives across the call and its size
        // is passed; the fd is an open socket.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
