//! The listener's side of the handshake: every accepted connection is
//! handshaked concurrently with the others, each with its own deadline,
//! in one bounded set polled by the thread that accepts (the acceptor of
//! `open`, then the link thread). A stranger (a port scanner, an HTTP
//! client, a silent or half-open connection, random bytes) costs one slot
//! of the set until its deadline; it never blocks a member's handshake
//! and never fails the member.
//!
//! ```text
//!  listener ──accept──▶ [ pending handshakes, oldest first ]──▶ a member's connection
//!                        │  non-blocking sockets, one poll(2)     (installed by the caller)
//!                        │  each: HELLO → PROOF → verdict, deadline
//!                        └─▶ failed: closed, counted (`handshakes_failed`), logged at debug
//! ```
//!
//! **Bounds** ([`super::TcpOptions::handshakes_pending_max`] in total,
//! [`super::TcpOptions::handshakes_pending_per_source_max`] per source IP
//! address): a new connection over a bound closes the *oldest* pending
//! handshake (from the same source address for the per-source bound),
//! never the new one. So a flood of silent connections can never keep a
//! member out: the newest connection always gets its turn, and a member's
//! handshake takes a few round trips, far less than the time a flood needs
//! to push it out again. Every connection that does not complete (bad
//! bytes, wrong key, group or layout, closed, deadline passed, TLS failure,
//! pushed out by a bound) is counted once in
//! [`HandshakeCounters::failed`].
//!
//! A refused peer that spoke the protocol is told why (a REFUSE message,
//! or a TLS alert) and given a short linger to read it before the close.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::handshake::{ExpectRank, Handshake, HandshakeError, Hello, Reason, HELLO_BYTES, REPLY_BYTES};
use super::stat::StatHeader;
use super::tls::{Session, TlsContext};
use super::TcpOptions;

/// Connections accepted per pass, at most (the rest wait in the backlog).
const ACCEPTS_PER_PASS_MAX: usize = 64;
/// I/O rounds per pending handshake per pass, at most.
const ROUNDS_PER_PASS_MAX: usize = 16;
/// How long a refused peer may take to read the refusal before the close.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);
/// After `accept` failed for lack of file descriptors, how long the
/// listener is left alone (the pending handshakes still progress).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// The handshake counters of one member, shared by its acceptor and its
/// fabric (and mirrored into its stat file for `spindle stat`).
#[derive(Debug, Default)]
pub struct HandshakeCounters {
    /// Accepted connections that did not complete the handshake.
    pub failed: AtomicU64,
    /// Accepted connections whose handshake is in progress now.
    pub pending: AtomicU64,
}

/// A connection whose handshake completed on the listener's side.
pub struct Accepted {
    pub peer: usize,
    pub stream: TcpStream,
    pub session: Option<Session>,
    pub from: SocketAddr,
}

/// A failed handshake of a peer that spoke the protocol (its HELLO was a
/// Spindle HELLO, or TLS refused its certificate): the likely reason why
/// a member that was expected never connected.
#[derive(Clone, Debug)]
pub struct MemberFailure {
    pub who: String,
    pub fault: String,
}

/// Which message a pending handshake waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Hello,
    Proof,
    Verdict,
    /// Both verdicts exchanged; the last bytes are still being sent.
    Flush,
    /// Refused: the refusal is being sent, then read until the peer closes.
    Linger,
}

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Hello => "hello",
            Step::Proof => "proof",
            _ => "verdict",
        }
    }
}

struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    ip: IpAddr,
    deadline: Instant,
    hs: Handshake,
    tls: Option<rustls::Connection>,
    /// Plain-TCP bytes to send, and how many are sent.
    out: Vec<u8>,
    out_sent: usize,
    input: [u8; HELLO_BYTES],
    want: usize,
    got: usize,
    step: Step,
    /// Counted in `failed` already (a refusal that lingers).
    counted: bool,
    write_shut: bool,
}

/// What one pass did to one pending handshake.
enum Outcome {
    Waiting,
    Done(usize),
    /// Failed: the message, and whether the peer spoke the protocol.
    Failed(String, bool),
    /// A lingering refusal is over.
    Closed,
}

/// The bounded set of pending handshakes (see the module docs).
pub struct Acceptor {
    rank: usize,
    key: Vec<u8>,
    hello: Hello,
    addresses: Option<Vec<SocketAddr>>,
    tls: Option<Arc<TlsContext>>,
    timeout: Duration,
    pending_max: usize,
    per_source_max: usize,
    pending: Vec<Pending>,
    counters: Arc<HandshakeCounters>,
    last_member_failure: Option<MemberFailure>,
    accept_paused_until: Option<Instant>,
    pollfds: Vec<libc::pollfd>,
    /// By pending handshake: whether its socket polled ready this pass.
    ready: Vec<bool>,
}

impl Acceptor {
    pub fn new(options: &TcpOptions, rank: usize, hello: &Hello, tls: Option<Arc<TlsContext>>) -> Acceptor {
        assert!(
            options.handshakes_pending_max >= 1,
            "bounded pending set: at least one slot"
        );
        assert!(
            options.handshakes_pending_per_source_max >= 1,
            "per-source bound: at least one slot"
        );
        Acceptor {
            rank,
            key: options.key.clone(),
            hello: hello.clone(),
            addresses: options.check_source_addr.then(|| options.addresses.clone()),
            tls,
            timeout: options.handshake_timeout,
            pending_max: options.handshakes_pending_max,
            per_source_max: options.handshakes_pending_per_source_max,
            pending: Vec::with_capacity(options.handshakes_pending_max.min(1024)),
            counters: Arc::new(HandshakeCounters::default()),
            last_member_failure: None,
            accept_paused_until: None,
            pollfds: Vec::new(),
            ready: Vec::new(),
        }
    }

    pub fn counters(&self) -> &Arc<HandshakeCounters> {
        &self.counters
    }

    /// The last failure of a peer that spoke the protocol, if any.
    pub fn last_member_failure(&self) -> Option<&MemberFailure> {
        self.last_member_failure.as_ref()
    }

    /// One pass: wait up to `wait` for the listener or a pending socket,
    /// accept what is waiting (bounded), advance every pending handshake
    /// that can move or whose deadline passed. Returns the handshakes that
    /// completed; `busy` (a bit per rank) is refused as still connected.
    /// `stat`, when set, mirrors the counters for `spindle stat`.
    pub fn pass(
        &mut self,
        listener: &TcpListener,
        busy: u64,
        wait: Duration,
        stat: Option<&StatHeader>,
    ) -> Vec<Accepted> {
        let now = Instant::now();
        let listen = self.accept_paused_until.is_none_or(|t| now >= t);
        let earliest = self.pending.iter().map(|p| p.deadline).min();
        let wait = earliest.map_or(wait, |d| wait.min(d.saturating_duration_since(now)));
        self.poll(listener, listen, wait);
        self.ready.clear();
        self.ready.extend(self.pollfds[1..].iter().map(|p| p.revents != 0));
        if listen && self.pollfds[0].revents != 0 {
            self.accept_some(listener);
        }
        debug_assert_eq!(
            self.ready.len(),
            self.pending.len(),
            "one readiness flag per pending handshake"
        );
        let now = Instant::now();
        let expect = ExpectRank::AboveFree {
            rank: self.rank as u32,
            busy,
        };
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let outcome = if now >= self.pending[i].deadline {
                timeout_outcome(&self.pending[i], self.timeout)
            } else if self.ready[i] {
                advance(&mut self.pending[i], expect)
            } else {
                Outcome::Waiting
            };
            match outcome {
                Outcome::Waiting => i += 1,
                Outcome::Done(peer) => match self.remove(i).finish() {
                    Ok(a) => done.push(Accepted { peer, ..a }),
                    Err(e) => self.fail_detached(&e.from.clone(), e.to_string()),
                },
                Outcome::Failed(fault, spoke) => {
                    self.count_failure(i, &fault, spoke);
                    if self.pending[i].step == Step::Linger {
                        i += 1;
                    } else {
                        self.remove(i);
                    }
                }
                Outcome::Closed => {
                    self.remove(i);
                }
            }
        }
        self.publish(stat);
        done
    }

    /// Count a connection that the caller refused after its handshake
    /// completed (its rank got connected meanwhile); it is closed by drop.
    pub fn refuse_completed(&mut self, a: Accepted, why: &str, stat: Option<&StatHeader>) {
        self.fail_detached(&a.from, why.to_string());
        drop(a);
        self.publish(stat);
    }

    fn poll(&mut self, listener: &TcpListener, listen: bool, wait: Duration) {
        self.pollfds.clear();
        self.pollfds.push(libc::pollfd {
            fd: if listen { listener.as_raw_fd() } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        });
        for p in &self.pending {
            let writing = match &p.tls {
                Some(c) => c.wants_write(),
                None => p.out_sent < p.out.len(),
            };
            self.pollfds.push(libc::pollfd {
                fd: p.stream.as_raw_fd(),
                events: libc::POLLIN | if writing { libc::POLLOUT } else { 0 },
                revents: 0,
            });
        }
        let ms = wait.as_millis().min(1000) as libc::c_int;
        // SAFETY: `pollfds` is an initialized array of its length, alive
        // across the call; the kernel writes only the `revents` fields.
        let rc = unsafe { libc::poll(self.pollfds.as_mut_ptr(), self.pollfds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            // EINTR (or ENOMEM): advance everything once; deadlines still hold.
            for p in &mut self.pollfds {
                p.revents = libc::POLLIN;
            }
        }
    }

    fn accept_some(&mut self, listener: &TcpListener) {
        for _ in 0..ACCEPTS_PER_PASS_MAX {
            let (stream, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE or a connection reset before accept:
                    // leave the listener alone for a moment.
                    tracing::debug!(rank = self.rank, "accept failed: {e}");
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            };
            self.admit(stream, from);
        }
    }

    /// Add an accepted connection, closing the oldest pending handshake
    /// over a bound (see the module docs).
    fn admit(&mut self, stream: TcpStream, from: SocketAddr) {
        let ip = canonical(from.ip());
        let from_source = self.pending.iter().filter(|p| p.ip == ip).count();
        if from_source >= self.per_source_max {
            let oldest = self.pending.iter().position(|p| p.ip == ip).expect("counted above");
            let fault = format!(
                "closed: more than {} pending handshakes from {ip} (handshakes_pending_per_source_max)",
                self.per_source_max
            );
            self.evict(oldest, &fault);
        }
        if self.pending.len() >= self.pending_max {
            let fault = format!(
                "closed: more than {} pending handshakes (handshakes_pending_max)",
                self.pending_max
            );
            self.evict(0, &fault);
        }
        assert!(
            self.pending.len() < self.pending_max,
            "bounded pending set: a slot is free before a connection is added"
        );
        let mut hs = Handshake::new(
            &self.key,
            self.hello.clone(),
            ExpectRank::AboveFree {
                rank: self.rank as u32,
                busy: 0,
            },
        );
        if let Some(addresses) = &self.addresses {
            hs.check_source(from.ip(), addresses);
        }
        let tls = match &self.tls {
            Some(t) => match t.server_connection() {
                Ok(c) => Some(c),
                Err(e) => {
                    self.fail_detached(&from, e);
                    return;
                }
            },
            None => None,
        };
        let mut p = Pending {
            stream,
            from,
            ip,
            deadline: Instant::now() + self.timeout,
            hs,
            tls,
            out: Vec::with_capacity(HELLO_BYTES + 2 * REPLY_BYTES),
            out_sent: 0,
            input: [0; HELLO_BYTES],
            want: HELLO_BYTES,
            got: 0,
            step: Step::Hello,
            counted: false,
            write_shut: false,
        };
        if let Err(e) = p.stream.set_nonblocking(true).and_then(|_| p.stream.set_nodelay(true)) {
            self.fail_detached(&from, format!("socket options: {e}"));
            return;
        }
        let hello = p.hs.hello();
        p.queue(&hello);
        self.pending.push(p);
        self.ready.push(true);
        assert!(self.pending.len() <= self.pending_max, "bounded pending set");
    }

    fn evict(&mut self, index: usize, fault: &str) {
        let p = self.remove(index);
        if !p.counted {
            self.fail_detached(&p.from, fault.to_string());
        }
    }

    /// Take a handshake out of the set (its readiness flag with it).
    fn remove(&mut self, index: usize) -> Pending {
        self.ready.remove(index);
        self.pending.remove(index)
    }

    fn count_failure(&mut self, index: usize, fault: &str, spoke: bool) {
        let p = &mut self.pending[index];
        debug_assert!(!p.counted, "each connection counted once");
        p.counted = true;
        let who = p.who();
        if spoke {
            self.last_member_failure = Some(MemberFailure {
                who: who.clone(),
                fault: fault.to_string(),
            });
        }
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(rank = self.rank, "handshake with {who} failed: {fault}");
    }

    fn fail_detached(&mut self, from: &SocketAddr, fault: String) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(rank = self.rank, "handshake with {from} failed: {fault}");
    }

    fn publish(&self, stat: Option<&StatHeader>) {
        let pending = self.pending.iter().filter(|p| p.step != Step::Linger).count() as u64;
        self.counters.pending.store(pending, Ordering::Relaxed);
        if let Some(h) = stat {
            h.handshakes_failed
                .store(self.counters.failed.load(Ordering::Relaxed), Ordering::Relaxed);
            h.handshakes_pending.store(pending, Ordering::Relaxed);
        }
    }
}

/// A completed handshake whose socket could not be made blocking again.
struct FinishError {
    from: SocketAddr,
    error: io::Error,
}

impl std::fmt::Display for FinishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "socket options after the handshake: {}", self.error)
    }
}

impl Pending {
    fn who(&self) -> String {
        match self.hs.peer_rank() {
            Some(r) => format!("member {r} (connecting from {})", self.from),
            None => format!("connecting from {}", self.from),
        }
    }

    /// Queue bytes for the peer (inside TLS when on).
    fn queue(&mut self, bytes: &[u8]) {
        match &mut self.tls {
            // The session buffers plaintext until its handshake is done
            // (no buffer limit is set on it).
            Some(c) => {
                let _ = c.writer().write_all(bytes);
            }
            None => {
                if self.out_sent == self.out.len() {
                    self.out.clear();
                    self.out_sent = 0;
                }
                self.out.extend_from_slice(bytes);
            }
        }
    }

    /// Send what is queued without blocking; whether all of it went out.
    fn flush(&mut self) -> io::Result<bool> {
        match &mut self.tls {
            Some(c) => {
                while c.wants_write() {
                    match c.write_tls(&mut self.stream) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            }
            None => {
                while self.out_sent < self.out.len() {
                    match self.stream.write(&self.out[self.out_sent..]) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => self.out_sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            }
        }
    }

    /// Read into `input[got..want]` without blocking: `Ok(0)` is the end
    /// of the stream; `WouldBlock` when nothing is there.
    fn read_some(&mut self) -> io::Result<usize> {
        let (got, want) = (self.got, self.want);
        let dst = &mut self.input[got..want];
        match &mut self.tls {
            None => self.stream.read(dst),
            Some(c) => {
                for _ in 0..ROUNDS_PER_PASS_MAX {
                    match c.reader().read(dst) {
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if c.read_tls(&mut self.stream)? == 0 {
                        return Ok(0);
                    }
                    if let Err(e) = c.process_new_packets() {
                        // Send the alert that says why (best effort).
                        let _ = c.write_tls(&mut self.stream);
                        return Err(io::Error::new(io::ErrorKind::InvalidData, TlsFailure(e)));
                    }
                }
                Err(io::ErrorKind::WouldBlock.into())
            }
        }
    }

    /// The handshake completed: the socket back to blocking, with the
    /// session (if any) ready for frames.
    fn finish(self) -> Result<Accepted, FinishError> {
        let from = self.from;
        self.stream
            .set_nonblocking(false)
            .map_err(|error| FinishError { from, error })?;
        Ok(Accepted {
            peer: usize::MAX,
            stream: self.stream,
            session: self.tls.map(|c| Arc::new(Mutex::new(c))),
            from,
        })
    }
}

/// A TLS failure, kept typed so that a refused certificate is told apart.
#[derive(Debug)]
struct TlsFailure(rustls::Error);

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TLS handshake failed: {} (are both members' certificates signed by the same group CA, tls_ca?)",
            self.0
        )
    }
}

impl std::error::Error for TlsFailure {}

fn timeout_outcome(p: &Pending, timeout: Duration) -> Outcome {
    if p.step == Step::Linger {
        return Outcome::Closed;
    }
    Outcome::Failed(
        format!(
            "no {} within {} ms (handshake_timeout_ms; is it a Spindle member?)",
            p.step.what(),
            timeout.as_millis()
        ),
        false,
    )
}

/// Move one pending handshake as far as its socket allows (bounded).
fn advance(p: &mut Pending, expect: ExpectRank) -> Outcome {
    for _ in 0..ROUNDS_PER_PASS_MAX {
        let flushed = match p.flush() {
            Ok(f) => f,
            Err(e) if p.step == Step::Linger => {
                let _ = e;
                return Outcome::Closed;
            }
            Err(e) => return Outcome::Failed(format!("connection broken while sending ({e})"), false),
        };
        match p.step {
            Step::Flush if flushed => return Outcome::Done(p.hs.peer_rank().expect("handshake complete")),
            Step::Flush => return Outcome::Waiting,
            Step::Linger => return linger(p, flushed),
            _ => {}
        }
        match p.read_some() {
            Ok(0) => {
                return Outcome::Failed(
                    format!(
                        "connection closed while waiting for its {} (is it a Spindle member of this group?)",
                        p.step.what()
                    ),
                    p.step != Step::Hello,
                )
            }
            Ok(n) => p.got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Reading may have made TLS handshake records to send.
                return match p.flush() {
                    Ok(_) => Outcome::Waiting,
                    Err(e) => Outcome::Failed(format!("connection broken while sending ({e})"), false),
                };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let spoke = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<TlsFailure>())
                    .is_some_and(|t| refused_certificate(&t.0));
                let fault = match e.get_ref().and_then(|i| i.downcast_ref::<TlsFailure>()) {
                    Some(t) => t.to_string(),
                    None => format!("connection broken while waiting for its {} ({e})", p.step.what()),
                };
                return Outcome::Failed(fault, spoke || p.step != Step::Hello);
            }
        }
        debug_assert!(p.got <= p.want, "read no further than the message");
        if p.got == p.want {
            if let Some(failed) = on_message(p, expect) {
                return failed;
            }
        }
    }
    Outcome::Waiting
}

/// A whole message arrived: feed it to the handshake, queue the answer.
/// `Some` when the handshake failed.
fn on_message(p: &mut Pending, expect: ExpectRank) -> Option<Outcome> {
    let step = p.step;
    p.got = 0;
    p.want = REPLY_BYTES;
    match step {
        Step::Hello => {
            p.hs.set_expect(expect);
            let hello: [u8; HELLO_BYTES] = p.input;
            match p.hs.on_hello(&hello) {
                Ok(proof) => {
                    p.queue(&proof);
                    p.step = Step::Proof;
                    None
                }
                Err((refusal, e)) => {
                    let spoke = !matches!(
                        e,
                        HandshakeError::Refused {
                            reason: Reason::Malformed | Reason::Version,
                            ..
                        }
                    );
                    Some(refuse(p, &refusal, e.to_string(), spoke))
                }
            }
        }
        Step::Proof => {
            let reply: [u8; REPLY_BYTES] = p.input[..REPLY_BYTES].try_into().expect("reply length");
            match p.hs.on_proof(&reply) {
                Ok(accept) => {
                    p.queue(&accept);
                    p.step = Step::Verdict;
                    None
                }
                Err((refusal, e @ HandshakeError::Refused { .. })) => Some(refuse(p, &refusal, e.to_string(), true)),
                Err((_, e)) => Some(Outcome::Failed(e.to_string(), true)),
            }
        }
        Step::Verdict => {
            let reply: [u8; REPLY_BYTES] = p.input[..REPLY_BYTES].try_into().expect("reply length");
            match p.hs.on_verdict(&reply) {
                Ok(()) => {
                    p.step = Step::Flush;
                    None
                }
                Err(e) => Some(Outcome::Failed(e.to_string(), true)),
            }
        }
        Step::Flush | Step::Linger => unreachable!("no message is read in step {step:?}"),
    }
}

/// Queue the refusal and linger so that the peer can read it.
fn refuse(p: &mut Pending, refusal: &[u8; REPLY_BYTES], fault: String, spoke: bool) -> Outcome {
    p.queue(refusal);
    p.step = Step::Linger;
    p.deadline = p.deadline.min(Instant::now() + REFUSAL_LINGER);
    Outcome::Failed(fault, spoke)
}

/// A refusal is on its way: once sent, shut the write side and read
/// until the peer closes (closing with unread bytes would reset the
/// connection before the peer reads the refusal).
fn linger(p: &mut Pending, flushed: bool) -> Outcome {
    if !flushed {
        return Outcome::Waiting;
    }
    if !p.write_shut {
        if let Some(c) = &mut p.tls {
            c.send_close_notify();
            if !matches!(p.flush(), Ok(true)) {
                return Outcome::Waiting;
            }
        }
        let _ = p.stream.shutdown(Shutdown::Write);
        p.write_shut = true;
    }
    let mut sink = [0u8; 512];
    for _ in 0..ROUNDS_PER_PASS_MAX {
        match p.stream.read(&mut sink) {
            Ok(0) => return Outcome::Closed,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Outcome::Waiting,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Outcome::Closed,
        }
    }
    Outcome::Waiting
}

/// Whether TLS refused the peer's certificate (a member with the wrong
/// CA, not a stranger's bytes).
fn refused_certificate(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented | rustls::Error::AlertReceived(_)
    )
}

/// An IPv4 address mapped into IPv6 counts as the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}
