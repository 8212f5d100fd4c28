//! The tcp fabric's send side: one `sendmsg` per push and peer (frame
//! headers and row bytes gathered without a copy), or, when coalescing,
//! small pushes copied into a per-peer buffer and flushed together (at a
//! doorbell ring, [`crate::Fabric::flush`], a park, or when it fills).

use std::io;
use std::net::TcpStream;
use std::ops::Range;
use std::os::fd::AsRawFd;

use super::frame::{encode_write, FRAME_HEADER_BYTES, FRAME_PAYLOAD_MAX};
use super::{tls, Inner, PeerStatus, TcpFabric, COALESCE_PUSH_BYTES_MAX};

/// Frames gathered into one `sendmsg` (two iovecs each).
pub(super) const FRAMES_PER_SEND_MAX: usize = 16;

/// One peer's send side: the socket and the pushes copied since the last
/// flush (coalescing mode).
pub(super) struct PeerWriter {
    /// `None` until the peer first connects.
    pub(super) stream: Option<TcpStream>,
    /// The connection's TLS session, and the ciphertext of one send.
    pub(super) tls: Option<tls::Session>,
    pub(super) tls_out: Vec<u8>,
    pub(super) pending: Box<[u8]>,
    pub(super) pending_len: usize,
}

impl Inner {
    /// Send every peer's pending pushes.
    pub(super) fn flush_all(&self) {
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
            if let Err(e) = self.send_frames(peer, &mut w, &[]) {
                // Under the writer lock: a reconnection installs its stream
                // (and then Connected) only after this.
                self.set_status(peer, PeerStatus::Gone, Some(format!("sending to it failed: {e}")));
            }
        }
    }

    /// Send `w`'s pending bytes, then `ranges` of the own row, in order,
    /// as frames straight from the row, in as few `sendmsg` calls as the
    /// iovec budget allows.
    pub(super) fn send_frames(&self, peer: usize, w: &mut PeerWriter, ranges: &[Range<usize>]) -> io::Result<()> {
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
        // The next range to frame, and where in it the next frame starts.
        let mut next = 0;
        let (mut at, mut end) = (0, 0);
        loop {
            let mut frames = 0;
            while frames < FRAMES_PER_SEND_MAX {
                if at >= end {
                    match ranges.get(next) {
                        Some(r) => (at, end) = (r.start, r.end),
                        None => break,
                    }
                    next += 1;
                    continue;
                }
                let len = (end - at).min(FRAME_PAYLOAD_MAX);
                headers[frames] = encode_write(at as u64, len as u32);
                iov[n_iov] = libc::iovec {
                    iov_base: headers[frames].as_mut_ptr() as *mut libc::c_void,
                    iov_len: FRAME_HEADER_BYTES,
                };
                iov[n_iov + 1] = libc::iovec {
                    // SAFETY: at + len <= row_len_bytes (every range is
                    // checked by push or push_vectored).
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
            if at >= end && next >= ranges.len() {
                break;
            }
        }
        Ok(())
    }
}

impl TcpFabric {
    /// Send pushes of `ranges` (already range-checked), in order, to one
    /// peer: when coalescing, each small one is copied into the pending
    /// buffer (a large one is sent now, after the pending bytes); else all
    /// are sent now, after the pending bytes, in one `sendmsg` as far as
    /// the iovec budget allows.
    pub(super) fn send_push(&self, peer: usize, ranges: &[Range<usize>]) -> io::Result<()> {
        let Some(writer) = &self.inner.writers[peer] else {
            return Ok(());
        };
        let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
        let result = if self.inner.coalesce {
            // An empty range would be an empty WRITE frame: a fault.
            ranges
                .iter()
                .filter(|range| !range.is_empty())
                .try_for_each(|range| self.send_push_locked(peer, &mut w, range))
        } else {
            self.inner.send_frames(peer, &mut w, ranges)
        };
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
                self.inner.send_frames(peer, w, &[])?;
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
        self.inner.send_frames(peer, w, std::slice::from_ref(range))
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
