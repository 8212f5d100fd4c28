//! The link and accept threads: after `open`, they make the connections that are still
//! missing (peers that [`super::TcpOptions::wait_for`] left out) or were
//! lost (a peer that crashed, left or sent a bad frame, then came back as
//! a new process with the same rank).
//!
//! ## Who dials whom
//!
//! One rule, at `open` and after: **the higher rank dials the lower one**;
//! the lower one accepts. So every pair of members has exactly one dialer
//! and two members never connect to each other twice.
//!
//! - At `open`, member `r` dials the lower ranks it waits for and accepts
//!   the higher ones (see `connect`).
//! - After `open`, two threads per member:
//!   - the accept thread ([`Accepting`]) keeps accepting on the
//!     listening socket from any higher rank whose connection is not
//!     [`PeerStatus::Connected`] (a higher rank still connected is refused
//!     as *busy*, and its dialer tries again), every accepted connection
//!     handshaked concurrently with the others by the [`Acceptor`] that
//!     `open` started (strangers never delay a member's handshake);
//!   - the link thread ([`Link`]) dials every lower rank that is not
//!     connected (a dial blocks up to the handshake timeout, which is why
//!     accepting has a thread of its own), with a backoff of
//!     [`REDIAL_MIN`] doubling to [`REDIAL_MAX`] per rank.
//!
//! So a member that starts late, or restarts with a lost member's rank,
//! dials the lower ranks itself and is dialed by the higher ones within
//! [`REDIAL_MAX`] of listening. Each connection runs the full handshake
//! (group key, group name, layout tag, source address).
//!
//! ## Installing a connection
//!
//! Before any frame of a (re)connected peer is applied, the local copy of
//! its row is zeroed (a new incarnation starts from zeros, as the
//! [`crate::Fabric::row`] contract says); then its reader and writer are
//! installed and it is marked Connected, so [`crate::Fabric::joined`] and
//! pushes include it. Nothing pushed before that reaches it: the rows of
//! the members already running reach it only as they push again (the
//! layer above re-pushes what a joiner needs).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::accept::Acceptor;
use super::connect::{handshake_io, tune};
use super::handshake::Hello;
use super::tls::{Session, TlsContext};
use super::{recv, FabricError, Inner, PeerStatus, TcpOptions};
use std::sync::Arc;

/// First wait before dialing a lost lower rank again.
pub const REDIAL_MIN: Duration = Duration::from_millis(20);
/// Longest wait between two dials of a missing lower rank.
pub const REDIAL_MAX: Duration = Duration::from_millis(500);
/// One dial attempt's connect timeout (short: the thread also accepts).
const DIAL_TIMEOUT: Duration = Duration::from_millis(300);
/// How long one `poll` of the listener waits at most (the stop flag is
/// looked at between polls).
const POLL_MS_MAX: u64 = 50;

/// How an installed connection is set up.
#[derive(Clone, Copy)]
struct Tuning {
    peer_timeout: Duration,
    send_stall_max: Duration,
    row_len_bytes: usize,
}

/// What the link thread owns: it dials the lower ranks.
pub struct Link {
    rank: usize,
    addresses: Vec<SocketAddr>,
    key: Vec<u8>,
    handshake_timeout: Duration,
    tuning: Tuning,
    hello: Hello,
    tls: Option<Arc<TlsContext>>,
    /// By lower rank: when to dial next, and the current backoff.
    next_dial: Vec<(Instant, Duration)>,
}

/// What the accept thread owns: the listener and the pending handshakes
/// (carried over from `open`). A thread of its own, so that a dial that
/// waits for a slow lower rank never holds up the handshakes of the
/// connections that higher ranks (and strangers) make meanwhile.
pub struct Accepting {
    rank: usize,
    listener: TcpListener,
    acceptor: Acceptor,
    tuning: Tuning,
}

impl Link {
    pub fn new(
        options: &TcpOptions,
        rank: usize,
        listener: TcpListener,
        hello: Hello,
        tls: Option<Arc<TlsContext>>,
        acceptor: Acceptor,
    ) -> Result<(Link, Accepting), FabricError> {
        listener
            .set_nonblocking(true)
            .map_err(|e| FabricError::io(format!("member {rank}: listener"), e))?;
        let now = Instant::now();
        let tuning = Tuning {
            peer_timeout: options.peer_timeout,
            send_stall_max: options.send_stall_max,
            row_len_bytes: hello.row_len_bytes as usize,
        };
        let link = Link {
            rank,
            addresses: options.addresses.clone(),
            key: options.key.clone(),
            handshake_timeout: options.handshake_timeout,
            tuning,
            hello,
            tls,
            next_dial: (0..rank).map(|_| (now, REDIAL_MIN)).collect(),
        };
        let accepting = Accepting {
            rank,
            listener,
            acceptor,
            tuning,
        };
        Ok((link, accepting))
    }

    /// The loop; returns when `inner.link_stop` is set.
    pub fn run(mut self, inner: &Inner) {
        // Partner: the Release store of `link_stop` in TcpFabric::drop.
        while !inner.link_stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let mut wait = Duration::from_millis(POLL_MS_MAX);
            for peer in 0..self.rank {
                if inner.status(peer) == PeerStatus::Connected {
                    self.next_dial[peer] = (now, REDIAL_MIN);
                    continue;
                }
                let (at, backoff) = self.next_dial[peer];
                if now >= at {
                    let ok = self.dial(inner, peer);
                    let backoff = if ok { REDIAL_MIN } else { (backoff * 2).min(REDIAL_MAX) };
                    self.next_dial[peer] = (Instant::now() + backoff, backoff);
                }
                wait = wait.min(self.next_dial[peer].0.saturating_duration_since(Instant::now()));
            }
            std::thread::sleep(wait.max(Duration::from_millis(1)));
        }
    }

    /// One attempt to connect to lower rank `peer`; whether it connected.
    fn dial(&self, inner: &Inner, peer: usize) -> bool {
        let addr = self.addresses[peer];
        let stream = match TcpStream::connect_timeout(&addr, DIAL_TIMEOUT) {
            Ok(s) => s,
            Err(e) => {
                note(inner, format!("dial member {peer} at {addr}: {e}"));
                return false;
            }
        };
        match handshake_io(
            &stream,
            &self.key,
            &self.hello,
            peer,
            self.handshake_timeout,
            self.tls.as_deref().map(|t| (t, addr.ip())),
            &format!("member {peer} at {addr}"),
        ) {
            Ok((_, session)) => {
                install(inner, self.tuning, peer, stream, session);
                true
            }
            Err((e, _)) => {
                note(inner, e.to_string());
                false
            }
        }
    }
}

impl Accepting {
    /// The loop; returns when `inner.link_stop` is set.
    pub fn run(mut self, inner: &Inner) {
        // Partner: the Release store of `link_stop` in TcpFabric::drop.
        while !inner.link_stop.load(Ordering::Acquire) {
            self.accept(inner, Duration::from_millis(POLL_MS_MAX));
        }
    }

    /// One pass of the acceptor (waiting up to `wait`); install the
    /// members whose handshake completed.
    fn accept(&mut self, inner: &Inner, wait: Duration) {
        let connected = (0..inner.status.len())
            .filter(|r| *r != self.rank && inner.status(*r) == PeerStatus::Connected)
            .fold(0u64, |m, r| m | 1u64 << r);
        let stat = inner.rows.stat().map(|s| s.header());
        for a in self.acceptor.pass(&self.listener, connected, wait, stat) {
            if inner.status(a.peer) == PeerStatus::Connected {
                // Completed alongside another connection of its rank.
                self.acceptor
                    .refuse_completed(a, "a second connection of a member already connected", stat);
                continue;
            }
            install(inner, self.tuning, a.peer, a.stream, a.session);
        }
    }
}

/// Make `stream` the connection to `peer`: zero its row copy, install
/// reader and writer, mark it Connected, wake local loops. The link thread
/// installs lower ranks, the accept thread higher ones: never the same
/// peer from two threads.
fn install(inner: &Inner, tuning: Tuning, peer: usize, stream: TcpStream, session: Option<Session>) {
    let read_half = match tune(&stream, tuning.peer_timeout, tuning.send_stall_max).and_then(|_| stream.try_clone()) {
        Ok(r) => r,
        Err(e) => {
            note(inner, format!("set up the connection of member {peer}: {e}"));
            return;
        }
    };
    // The writer first: pushes skip the peer until it is Connected
    // (below), and a push that failed on the old stream marked it Gone
    // under this lock before we get it.
    if let Some(writer) = &inner.writers[peer] {
        let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
        w.stream = Some(stream);
        w.tls = session.clone();
        w.pending_len = 0;
    }
    {
        let mut rx = inner.rx.lock().unwrap_or_else(|p| p.into_inner());
        rx.install(
            inner,
            recv::PeerReader::new(peer, read_half, tuning.row_len_bytes, session),
        );
        *inner.why[peer].lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Under the rx lock: a close of the new connection by the
        // receive thread comes after this, never before.
        // Partner: the Acquire load in Inner::status.
        inner.status[peer].store(PeerStatus::Connected as u8, Ordering::Release);
    }
    inner.mirror_status(peer, PeerStatus::Connected);
    inner.wake_local();
}

/// Remember the link thread's last failure (diagnostics only: a missing
/// peer shows in `joined`, a lost one in `lost_peers`).
fn note(inner: &Inner, what: String) {
    *inner.link_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
}
