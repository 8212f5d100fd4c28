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
/// How long the receive thread naps while a progress thread is parked on
/// the sockets (it receives then).
const RECV_NAP_US: u64 = 500;
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
}

impl PeerReader {
    pub fn new(rank: usize, stream: std::net::TcpStream, row_len_bytes: usize) -> PeerReader {
        PeerReader {
            rank,
            stream,
            decoder: FrameDecoder::new(row_len_bytes),
            carry: [0; FrameDecoder::CARRY_MAX],
            carry_len: 0,
            open: true,
        }
    }
}

/// The receive state: every peer's reader and the read buffer. Whoever
/// holds its lock receives: the receive thread, or a progress thread
/// parked on the fabric's doorbell (see [`park`]).
pub struct Rx {
    pub readers: Vec<PeerReader>,
    buf: Box<[u8]>,
}

impl Rx {
    pub fn new(readers: Vec<PeerReader>) -> Rx {
        Rx {
            readers,
            buf: vec![0u8; RECV_BUFFER_BYTES].into_boxed_slice(),
        }
    }

    /// Read and apply what the peers `ready` says sent. Returns whether
    /// anything changed.
    fn drain(&mut self, inner: &Inner, ready: impl Fn(usize) -> bool) -> bool {
        let mut changed = false;
        for i in 0..self.readers.len() {
            if self.readers[i].open && ready(i) {
                changed |= read_peer(inner, &mut self.readers[i], &mut self.buf);
            }
        }
        changed
    }
}

/// Fill `fds` with the open peers' sockets (index = reader index).
fn open_fds(inner: &Inner, fds: &mut Vec<libc::pollfd>, order: &mut Vec<usize>) {
    fds.clear();
    order.clear();
    let open = inner.open_mask.load(Ordering::Acquire);
    for (i, fd) in inner.rx_fds.iter().enumerate() {
        if open & (1 << i) != 0 {
            fds.push(libc::pollfd {
                fd: *fd,
                events: libc::POLLIN,
                revents: 0,
            });
            order.push(i);
        }
    }
}

/// The receive loop; returns when `inner.stop` is set or no peer is left.
pub fn run(inner: Arc<Inner>) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(inner.rx_fds.len());
    let mut order: Vec<usize> = Vec::with_capacity(inner.rx_fds.len());
    while !inner.stop.load(Ordering::Acquire) {
        if inner.sleepers.load(Ordering::SeqCst) > 0 {
            // A progress thread is parked in `park`, polling the same
            // sockets: it receives, and this thread stays out of its way
            // (one wake-up per arrival, not two, on a machine with few
            // cores). Nobody unparks us: we look again after a short nap.
            std::thread::park_timeout(std::time::Duration::from_micros(RECV_NAP_US));
            continue;
        }
        open_fds(&inner, &mut fds, &mut order);
        if fds.is_empty() {
            return;
        }
        // SAFETY: `fds` is a valid array of initialized pollfd of the given
        // length, alive across the call; the kernel writes only `revents`.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_TIMEOUT_MS) };
        if rc <= 0 {
            continue; // timeout or EINTR: look at the stop flag again
        }
        let applied = {
            let mut rx = inner.rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.drain(&inner, |i| {
                fds.iter().zip(&order).any(|(f, o)| *o == i && f.revents != 0)
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
    for (i, fd) in inner.rx_fds.iter().enumerate() {
        if open & (1 << i) != 0 {
            fds[n].fd = *fd;
            order[n - 1] = i;
            n += 1;
        }
    }
    let timeout_ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: the first `n` entries of `fds` are initialized pollfd, alive
    // across the call; the kernel writes only `revents`.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
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
        let n = match recv_nonblocking(peer.stream.as_raw_fd(), &mut buf[carried..]) {
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
    if let Some(i) = inner.rx_fds.iter().position(|fd| *fd == peer.stream.as_raw_fd()) {
        // Partner: the Acquire loads of open_mask before polling.
        inner.open_mask.fetch_and(!(1u64 << i), Ordering::Release);
    }
    let _ = peer.stream.shutdown(std::net::Shutdown::Both);
    if inner.status(peer.rank) != PeerStatus::Left || status == PeerStatus::Fault {
        inner.set_status(peer.rank, status, why);
    }
}

/// Write `bytes` at `offset` of `rank`'s row copy with atomic stores.
fn apply(inner: &Inner, rank: usize, offset: usize, bytes: &[u8]) {
    let row = inner.row_ptr(rank);
    debug_assert!(
        offset + bytes.len() <= inner.row_len_bytes,
        "decoder checked the bounds"
    );
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
