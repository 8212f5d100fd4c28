//! The tcp fabric's one receive thread: waits on every peer's connection
//! with `poll`, decodes frames and applies them to the local copies of the
//! peers' rows, then rings the local doorbell once per batch of reads.
//!
//! ## Applying a frame so that the guard protocol holds
//!
//! Local readers `Acquire`-load guards through `RowRef::u64_at` while this
//! thread writes the row copy, so every write here is atomic (no data race
//! on a word that someone loads atomically): whole aligned words with
//! `AtomicU64` stores, the odd bytes at a frame's edges with `AtomicU8`.
//! Before the first byte of each frame (a push) comes a `Release` fence:
//! a reader whose `Acquire` load sees any word of push *k + 1* (the guard)
//! sees every byte of pushes `..=k` (the data). The decoder never splits a
//! word across two reads, so a guard is never seen torn.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::frame::{Event, FrameDecoder};
use super::{Inner, PeerStatus};

/// Bytes one `recv` may bring in (allocated once per process).
pub const RECV_BUFFER_BYTES: usize = 256 << 10;
/// Reads from one peer per wake-up before the others get their turn.
const READS_PER_PEER_MAX: usize = 8;
/// The receive thread's first nap while a progress thread is parked on
/// the sockets or drives the fabric (it receives then); the naps grow
/// while it still does (see [`RECV_NAP_PARKED_MAX_US`] and
/// [`RECV_NAP_DRIVEN_MAX_US`]).
const RECV_NAP_US: u64 = 500;
/// The longest nap while loops keep receiving on their own threads
/// ([`receive_now`]): how long frames may wait once every loop stops.
const RECV_NAP_DRIVEN_MAX_US: u64 = 8_000;
/// The longest nap while a thread stays parked on the sockets (it
/// receives then): the nap doubles from [`RECV_NAP_US`] while it does, so
/// that an idle process's receive thread does not wake 2,000 times a
/// second; also how long frames may wait once the last parker goes.
const RECV_NAP_PARKED_MAX_US: u64 = 2_000;
/// Longest single park (the caller's timeout is capped to it).
const PARK_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// How often a blocked `poll` looks at the stop flag.
const POLL_TIMEOUT_MS: i32 = 50;

/// One peer's read side.
pub struct PeerReader {
    pub rank: usize,
    pub stream: std::net::TcpStream,
    decoder: FrameDecoder,
    carry: [u8; FrameDecoder::CARRY_MAX],
    carry_len: usize,
    open: bool,
    /// The connection's TLS session (frames arrive inside it).
    tls: Option<super::tls::TlsReader>,
}

impl PeerReader {
    pub fn new(
        rank: usize,
        stream: std::net::TcpStream,
        row_len_bytes: usize,
        tls: Option<super::tls::Session>,
    ) -> PeerReader {
        PeerReader {
            rank,
            stream,
            decoder: FrameDecoder::new(row_len_bytes),
            carry: [0; FrameDecoder::CARRY_MAX],
            carry_len: 0,
            open: true,
            tls: tls.map(super::tls::TlsReader::new),
        }
    }

    /// Bytes of the frame stream into `buf`, without blocking.
    fn receive(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = self.stream.as_raw_fd();
        match &mut self.tls {
            None => recv_nonblocking(fd, buf),
            Some(t) => t.read(buf, |b| recv_nonblocking(fd, b)),
        }
    }
}

/// The receive state: every peer's reader (by rank; `None` for this
/// member and for peers never connected) and the read buffer. Whoever
/// holds its lock receives: the receive thread, or a progress thread
/// parked on the fabric's doorbell (see [`park`]). The link thread takes
/// it to install a (re)connected peer's reader ([`Rx::install`]).
pub struct Rx {
    pub readers: Vec<Option<PeerReader>>,
    buf: Box<[u8]>,
}

impl Rx {
    pub fn new(readers: Vec<Option<PeerReader>>) -> Rx {
        Rx {
            readers,
            buf: vec![0u8; RECV_BUFFER_BYTES].into_boxed_slice(),
        }
    }

    /// Read and apply what the peers `ready` (by rank) says sent. Returns
    /// whether anything changed.
    fn drain(&mut self, inner: &Inner, ready: impl Fn(usize) -> bool) -> bool {
        let mut changed = false;
        for rank in 0..self.readers.len() {
            if let Some(reader) = &mut self.readers[rank] {
                if reader.open && ready(rank) {
                    changed |= read_peer(inner, reader, &mut self.buf);
                }
            }
        }
        changed
    }

    /// A peer (re)connected: zero the local copy of its row (a new
    /// incarnation starts from zeros), then make `reader` its reader and
    /// its socket pollable. The caller holds the `rx` lock, so no frame of
    /// the old or the new connection is applied meanwhile; the old reader
    /// (closed, or a `LEAVE` seen) is dropped, closing its socket.
    pub fn install(&mut self, inner: &Inner, reader: PeerReader) {
        let rank = reader.rank;
        zero_row(inner, rank);
        let fd = reader.stream.as_raw_fd();
        self.readers[rank] = Some(reader);
        inner.rx_fds[rank].store(fd, Ordering::Relaxed);
        // Partner: the Acquire loads of open_mask before polling (which
        // then see the fd stored above).
        inner.open_mask.fetch_or(1u64 << rank, Ordering::Release);
    }
}

/// Fill `fds` with the open peers' sockets; `order[k]` is the rank of
/// `fds[k]`.
fn open_fds(inner: &Inner, fds: &mut Vec<libc::pollfd>, order: &mut Vec<usize>) {
    fds.clear();
    order.clear();
    let open = inner.open_mask.load(Ordering::Acquire);
    for (rank, fd) in inner.rx_fds.iter().enumerate() {
        if open & (1 << rank) != 0 {
            fds.push(libc::pollfd {
                fd: fd.load(Ordering::Relaxed),
                events: libc::POLLIN,
                revents: 0,
            });
            order.push(rank);
        }
    }
}

/// The receive loop; returns when `inner.stop` is set. With no peer
/// connected it naps (a peer may connect later, see the link thread).
pub fn run(inner: Arc<Inner>) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(inner.rx_fds.len());
    let mut order: Vec<usize> = Vec::with_capacity(inner.rx_fds.len());
    let mut parks_seen = inner.parks.load(Ordering::Relaxed);
    let mut driven_seen = inner.driven.load(Ordering::Relaxed);
    let mut nap_us = RECV_NAP_US;
    let mut parked_nap_us = RECV_NAP_US;
    while !inner.stop.load(Ordering::Acquire) {
        let parks = inner.parks.load(Ordering::Relaxed);
        let driven = inner.driven.load(Ordering::Relaxed);
        if driven != driven_seen {
            // A loop receives on its own thread every pass (a spinning
            // loop may never park): nap longer each time it still does, so
            // that this thread's wake-ups do not take the core from it.
            driven_seen = driven;
            parks_seen = parks;
            parked_nap_us = RECV_NAP_US;
            std::thread::park_timeout(std::time::Duration::from_micros(nap_us));
            nap_us = (nap_us * 2).min(RECV_NAP_DRIVEN_MAX_US);
            continue;
        }
        nap_us = RECV_NAP_US;
        if inner.sleepers.any() || parks != parks_seen {
            // A progress thread is parked in `park`, polling the same
            // sockets, or parked since our last look (it will again): it
            // receives, and this thread stays out of its way (one wake-up
            // per arrival, not two, on a machine with few cores; no
            // contention for the receive state). Nobody unparks us: we
            // look again after a nap, longer each time it still does (up
            // to RECV_NAP_PARKED_MAX_US).
            parks_seen = parks;
            std::thread::park_timeout(std::time::Duration::from_micros(parked_nap_us));
            parked_nap_us = (parked_nap_us * 2).min(RECV_NAP_PARKED_MAX_US);
            continue;
        }
        parked_nap_us = RECV_NAP_US;
        open_fds(&inner, &mut fds, &mut order);
        if fds.is_empty() {
            std::thread::park_timeout(std::time::Duration::from_millis(POLL_TIMEOUT_MS as u64));
            continue;
        }
        // SAFETY: `fds` is a valid array of initialized pollfd of the given
        // length, alive across the call; the kernel writes only `revents`.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_TIMEOUT_MS) };
        if rc <= 0 {
            continue; // timeout or EINTR: look at the stop flag again
        }
        let applied = {
            let mut rx = inner.rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.drain(&inner, |rank| {
                fds.iter().zip(&order).any(|(f, o)| *o == rank && f.revents != 0)
            })
        };
        if applied {
            inner.wake_local();
        }
    }
}

/// Park a progress thread: sleep in `poll` on the peers' sockets and the
/// wake-up eventfd until either is readable or `timeout` passes, then
/// receive what arrived on this thread (if the receive thread is not
/// already at it). Data wakes the parked loop directly, without a hop
/// through the receive thread. The caller announced itself in
/// `sleepers` (the doorbell protocol) before re-checking for work.
pub fn park(inner: &Inner, timeout: std::time::Duration) {
    let mut fds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; crate::MEMBERS_MAX + 1];
    let mut order = [0usize; crate::MEMBERS_MAX];
    fds[0].fd = inner.wake_fd;
    let open = inner.open_mask.load(Ordering::Acquire);
    let mut n = 1;
    for (rank, fd) in inner.rx_fds.iter().enumerate() {
        if open & (1 << rank) != 0 {
            fds[n].fd = fd.load(Ordering::Relaxed);
            order[n - 1] = rank;
            n += 1;
        }
    }
    // `ppoll`: the timeout to the nanosecond (a rate-limited sender parks
    // until its next send time, often well under a millisecond).
    let timeout = timeout.min(PARK_MAX);
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the first `n` entries of `fds` are initialized pollfd, alive
    // across the call; the kernel writes only `revents`; `ts` is a valid
    // timespec read for the call; a null sigmask leaves the mask as it is.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if rc <= 0 {
        return;
    }
    if fds[0].revents != 0 {
        drain_eventfd(inner.wake_fd);
    }
    if fds[1..n].iter().any(|f| f.revents != 0) {
        if let Ok(mut rx) = inner.rx.try_lock() {
            let ready = |i: usize| (1..n).any(|k| order[k - 1] == i && fds[k].revents != 0);
            if rx.drain(inner, ready) {
                // Partner: loads by this very thread; the fence orders the
                // applied words before whatever the caller reads next.
                fence(Ordering::Acquire);
            }
        }
    }
}

/// Receive on the calling (progress) thread without blocking: one `poll`
/// with a zero timeout over the open sockets, then read and apply what is
/// there. Skipped when another thread holds the receive state. Returns
/// whether anything changed. Called before a park, so that the caller's
/// re-check sees what has arrived and does not park at all.
pub fn try_receive(inner: &Inner) -> bool {
    let mut fds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; crate::MEMBERS_MAX];
    let mut order = [0usize; crate::MEMBERS_MAX];
    let open = inner.open_mask.load(Ordering::Acquire);
    if open == 0 {
        return false;
    }
    let mut n = 0;
    for (rank, fd) in inner.rx_fds.iter().enumerate() {
        if open & (1 << rank) != 0 {
            fds[n].fd = fd.load(Ordering::Relaxed);
            order[n] = rank;
            n += 1;
        }
    }
    // SAFETY: the first `n` entries of `fds` are initialized pollfd, alive
    // across the call; the kernel writes only `revents`.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, 0) };
    if rc <= 0 {
        return false;
    }
    let Ok(mut rx) = inner.rx.try_lock() else {
        return false;
    };
    let ready = |rank: usize| (0..n).any(|k| order[k] == rank && fds[k].revents != 0);
    let changed = rx.drain(inner, ready);
    drop(rx);
    if changed {
        // Partner: loads by this very thread; the fence orders the applied
        // words before whatever the caller reads next.
        fence(Ordering::Acquire);
        // Other threads parked on this fabric may wait for what we took
        // off their sockets.
        inner.wake_local();
    }
    changed
}

/// Receive on the calling thread without blocking and without `poll`:
/// one `recv` per open peer (the common case of a spinning loop finds
/// nothing, and a `poll` first would be a second system call). Skipped
/// when another thread holds the receive state. Returns whether anything
/// changed. See [`crate::Fabric::receive_now`].
pub fn receive_now(inner: &Inner) -> bool {
    let open = inner.open_mask.load(Ordering::Acquire);
    if open == 0 {
        return false;
    }
    // Tells the receive thread to nap (see `run`): it only needs to see
    // the count move, so a plain store (no locked read-modify-write on
    // every pass of a spinning loop) is enough, even when two loops race.
    inner
        .driven
        .store(inner.driven.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    let Ok(mut rx) = inner.rx.try_lock() else {
        return false;
    };
    let changed = rx.drain(inner, |rank| open & (1 << rank) != 0);
    drop(rx);
    if changed {
        // Partner: loads by this very thread; the fence orders the applied
        // words before whatever the caller reads next.
        fence(Ordering::Acquire);
        // Other threads parked on this fabric may wait for what we took
        // off their sockets.
        inner.wake_local();
    }
    changed
}

fn drain_eventfd(fd: RawFd) {
    let mut value = 0u64;
    // SAFETY: reads 8 bytes into a local u64 from a non-blocking eventfd.
    unsafe { libc::read(fd, &mut value as *mut u64 as *mut libc::c_void, 8) };
}

/// Read what `peer` sent and apply it. Returns whether anything changed
/// (bytes applied or the peer's status moved).
fn read_peer(inner: &Inner, peer: &mut PeerReader, buf: &mut [u8]) -> bool {
    let mut changed = false;
    for _ in 0..READS_PER_PEER_MAX {
        let carried = peer.carry_len;
        buf[..carried].copy_from_slice(&peer.carry[..carried]);
        let n = match peer.receive(&mut buf[carried..]) {
            Ok(0) => {
                let why = if inner.status(peer.rank) == PeerStatus::Left {
                    None
                } else {
                    Some("it closed the connection without leaving (its process exited or crashed)".to_string())
                };
                close(inner, peer, PeerStatus::Gone, why);
                return true;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return changed,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                close(inner, peer, PeerStatus::Gone, Some(format!("connection broke: {e}")));
                return true;
            }
        };
        let filled = carried + n;
        let mut input = &buf[..filled];
        loop {
            match peer.decoder.next(&mut input) {
                Ok(Some(Event::Write {
                    offset,
                    bytes,
                    frame_start,
                })) => {
                    if frame_start {
                        // Partner: the Acquire loads of guards by readers of
                        // this row copy (see the module docs).
                        fence(Ordering::Release);
                    }
                    apply(inner, peer.rank, offset, bytes);
                    changed = true;
                }
                Ok(Some(Event::Leave)) => {
                    inner.set_status(peer.rank, PeerStatus::Left, None);
                    changed = true;
                }
                Ok(None) => break,
                Err(fault) => {
                    let fault = format!("frame {}: {fault}", peer.decoder.frames() + 1);
                    close(inner, peer, PeerStatus::Fault, Some(fault));
                    return true;
                }
            }
        }
        assert!(
            input.len() <= FrameDecoder::CARRY_MAX,
            "decoder progress: it leaves less than a header unconsumed"
        );
        peer.carry_len = input.len();
        peer.carry[..input.len()].copy_from_slice(input);
        if filled < buf.len() {
            return changed; // drained what the kernel had
        }
    }
    changed
}

fn close(inner: &Inner, peer: &mut PeerReader, status: PeerStatus, why: Option<String>) {
    peer.open = false;
    // Partner: the Acquire loads of open_mask before polling.
    inner.open_mask.fetch_and(!(1u64 << peer.rank), Ordering::Release);
    let _ = peer.stream.shutdown(std::net::Shutdown::Both);
    if inner.status(peer.rank) != PeerStatus::Left || status == PeerStatus::Fault {
        inner.set_status(peer.rank, status, why);
    }
}

/// Zero `rank`'s row copy with atomic word stores (rows are cache-line
/// multiples), then a `Release` fence: a reader that sees a word of the
/// new incarnation's first push sees the zeros before it.
fn zero_row(inner: &Inner, rank: usize) {
    let row = inner.row_ptr(rank);
    for at in (0..inner.row_len_bytes).step_by(8) {
        // SAFETY: `at` is 8-aligned inside the row copy (64-aligned base,
        // length a multiple of 64); every access to row memory is atomic.
        unsafe { (*(row.add(at) as *const AtomicU64)).store(0, Ordering::Relaxed) };
    }
    // Partner: the Acquire loads of guards by readers of this row copy.
    fence(Ordering::Release);
}

/// Write `bytes` at `offset` of `rank`'s row copy: with atomic stores, or
/// with one memory copy inside the payload region.
fn apply(inner: &Inner, rank: usize, offset: usize, bytes: &[u8]) {
    let row = inner.row_ptr(rank);
    debug_assert!(
        offset + bytes.len() <= inner.row_len_bytes,
        "decoder checked the bounds"
    );
    let in_region = inner
        .payload_region
        .get()
        .is_some_and(|r| offset >= r.start && offset + bytes.len() <= r.end);
    if in_region {
        // SAFETY: the range lies inside the row copy (bounds checked by
        // the decoder) and does not overlap `bytes` (the read buffer). No
        // thread reads these bytes meanwhile: the payload region's
        // contract (`Fabric::declare_payload_region`) is that readers read it
        // only behind a guard that this peer pushes after these bytes
        // (applied later, after the Release fence at its frame's start)
        // and never while its owner may rewrite it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), row.add(offset), bytes.len()) };
        return;
    }
    let mut i = 0;
    // Odd bytes up to the first aligned word.
    while i < bytes.len() && !(offset + i).is_multiple_of(8) {
        store_u8(row, offset + i, bytes[i]);
        i += 1;
    }
    while i + 8 <= bytes.len() {
        let word = u64::from_ne_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        // SAFETY: offset + i is 8-aligned (loop above) inside the row copy
        // (bounds checked by the decoder), the row base is 64-aligned, and
        // every access to row memory is atomic (module docs).
        unsafe { (*(row.add(offset + i) as *const AtomicU64)).store(word, Ordering::Relaxed) };
        i += 8;
    }
    while i < bytes.len() {
        store_u8(row, offset + i, bytes[i]);
        i += 1;
    }
}

#[inline]
fn store_u8(row: *mut u8, at: usize, value: u8) {
    // SAFETY: `at` lies inside the row copy (bounds checked by the decoder)
    // and the byte is only accessed atomically while this thread writes it.
    unsafe { (*(row.add(at) as *const AtomicU8)).store(value, Ordering::Relaxed) };
}

fn recv_nonblocking(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length for the call; the
    // fd is open (owned by the PeerReader).
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
