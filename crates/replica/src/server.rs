//! The RESP server (runtime): one thread, one `epoll` loop over the
//! listener and every client (as Redis serves), at most `clients_max`
//! clients (one more is answered `-ERR max number of clients reached`
//! and closed), each request bounded by [`Limits`]; a client that sends
//! no complete request for `idle_timeout` (idle, or a request left
//! half-sent) is closed, so stuck clients cannot hold every slot.
//!
//! A round of the loop: one `epoll_wait` (which does not block for
//! `poll_spin_after_work`, 50 µs by default, after a round with events,
//! so a client's next request is taken without a wake-up); one read from
//! every ready client and every complete request it brought executed (the appends
//! do not wait one by one for the backups' replies (rpc) or echoes
//! (tcp)); then **one commit for the whole round** (one wait for the
//! backups, housekeeping, the lease), so a round's batches, from every
//! client, share it: group commit across clients with no lock and no
//! thread to wake; then every ready client's replies are written. No
//! reply to a request that ran is written before the commit that covers
//! its batch has returned (the refusals that run nothing — too many
//! clients, a request over the bound — go out at once), so no client — this one or another — is answered from a
//! write that not every backup has (a read may see such a write, but its
//! reply waits for the same commit). A reply the socket does not take at
//! once waits for writability, and that client is not read meanwhile.
//!
//! If a commit fails the master cannot tell which writes are
//! replicated: no reply of the round is written, every client is closed
//! and [`serve`] returns [`ServeError::Replication`]; the caller leaves
//! the group (a process exits) and a backup takes over from its log.
//! With a stop flag, [`serve`] stops cleanly once the flag is set: it
//! stops accepting, closes every client, takes the leader back (no write
//! in flight), ends the epoch with every backup's log sealed on disk and
//! returns the leader.
//!
//! Until 2026-11-29 the server ran a thread per client and a commit
//! yielded while other clients' batches queued for the store's lock: 50
//! pipelining clients on 2 CPUs spent 43% of the CPU in those yields
//! (`bench/RESULTS-replica.md`).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::command::{execute, Args, CommandLimits, Context, Flow, Session, REDIS_COMPAT_VERSION};
use crate::driver::Driver;
use crate::keyspace::command_list;
use crate::node::{Leader, Membership};
use crate::resp::{parse_request, reply, Limits};
use crate::store::ObjectMap;

/// How long the loop waits for readiness before it looks at the stop
/// flag (and the idle clients) again.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Default of [`ServeOptions::poll_spin_after_work`]. A client that
/// writes one request at a time sends its next one a few tens of
/// microseconds after its reply; on a virtual machine a blocked thread on
/// an idle CPU then took ~25 µs more to run (bench/RESULTS-replica.md).
pub const POLL_SPIN_AFTER_WORK_DEFAULT: Duration = Duration::from_micros(50);

/// Serving parameters.
#[derive(Clone, Debug)]
pub struct ServeOptions<'a> {
    pub clients_max: usize,
    /// Close a client that sends no complete request and takes none of
    /// its replies for this long (it is closed within 5 ms and one round
    /// after); zero: never.
    pub idle_timeout: Duration,
    /// How long after a round that had events the loop keeps polling
    /// (`epoll_wait` without a timeout) before it blocks again: a bounded
    /// spin, taken only after work (an idle service blocks), that takes
    /// a client's next request without a wake-up. Zero: block at once.
    pub poll_spin_after_work: Duration,
    pub value_bytes_max: usize,
    /// Extra `INFO` lines (role, recovery …).
    pub info_extra: String,
    /// Stop cleanly (and return the leader) once this is set; `None`
    /// serves until a replication failure.
    pub stop: Option<&'a AtomicBool>,
}

/// Why [`serve`] ended without a clean stop.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A batch's writes could not be confirmed on every backup. No reply
    /// of that batch or any later one was sent; the objects hold writes
    /// nobody may see, so this member must leave the group (a backup
    /// takes over from its log).
    #[error("replication failed, the master stopped serving: {0}")]
    Replication(String),
    /// The listener could not be made non-blocking, or `epoll` could not
    /// be set up or waited on.
    #[error("listener: {0}")]
    Listener(std::io::Error),
    /// Ending the epoch (sealing the backups' logs) failed.
    #[error("clean stop failed: {0}")]
    Stop(String),
}

/// Bind `addr` for a master, retrying while it is taken.
///
/// The listener is bound with `SO_REUSEPORT` (and `SO_REUSEADDR`, as std
/// does): a SIGKILLed master's listener can outlive the moment its
/// backups see it dead (its main thread is a zombie while its other
/// threads are still exiting; the shared file table, listener included,
/// closes with the last one — under load that took longer than the 10 s
/// this wait used to allow, every backup in turn failed to bind and the
/// service died). With `SO_REUSEPORT` on both, the new master binds at
/// once. A process outside the service still holds the address against
/// it (it did not set `SO_REUSEPORT`), and `spindle kv serve` refuses to
/// start on an address anything listens on.
pub fn bind(addr: &str, wait: Duration) -> Result<TcpListener, String> {
    let started = std::time::Instant::now();
    let parsed: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| format!("bind {addr}: expected an address such as 127.0.0.1:6380"))?;
    loop {
        match bind_reuse_port(parsed) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("bind {addr}: {e}")),
        }
    }
}

/// A listener on `addr` with `SO_REUSEADDR` and `SO_REUSEPORT` set
/// before the bind (std's `TcpListener::bind` sets only the first).
fn bind_reuse_port(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) takes no pointers; the descriptor it returns is
    // owned by `socket` right below, which closes it on every path.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own alone.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    for option in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from `&one`,
        // which lives across the call; the descriptor is open.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: an all-zero sockaddr_storage is a valid (unspecified)
    // address; the fields for the address family are filled in below.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        std::net::SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in (the socket API's guarantee).
            let sin = unsafe { &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in6 (the socket API's guarantee).
            let sin6 = unsafe { &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: `storage` holds a valid address of `len` bytes for the
    // socket's family and lives across the call.
    let r = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listen(2) takes no pointers; the descriptor is open.
    if unsafe { libc::listen(socket.as_raw_fd(), 128) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(TcpListener::from(socket))
}

/// Tests: with this environment variable set to a directory, the master
/// appends `<CLOCK_MONOTONIC ns> <rank> <epoch>` to `<dir>/acks-<rank>.log`
/// for every batch with a write that it answered, so that a test can check
/// that no two masters ever answered at once (the clock is one for every
/// process of the host, network namespaces included).
pub const ACK_LOG_ENV: &str = "SPINDLE_KV_ACK_LOG";

/// Readiness events taken from `epoll_wait` per round (more wait for the
/// next round: the interest is level-triggered).
const EVENTS_PER_ROUND_MAX: usize = 256;

/// Connections accepted per round, at most (the rest in the next round).
const ACCEPTS_PER_ROUND_MAX: usize = 64;

/// The listener's `epoll` token; a client's is its slot + 1.
const LISTENER_TOKEN: u64 = 0;

/// A client's read buffer to start with (it grows up to the request bound).
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// The service's state: the leader and what every batch reads.
struct Service<'a, F: Membership> {
    leader: Leader<F>,
    /// Tests: one line per answered batch that wrote (see [`ACK_LOG_ENV`]).
    ack_log: Option<std::fs::File>,
    stop: Option<&'a AtomicBool>,
    /// The master's failover driver: once it stepped down, serving ends.
    driver: std::sync::Arc<Driver<F>>,
    info_extra: String,
    limits: Limits,
    command_limits: CommandLimits,
    /// A request is at most a few bulk strings over the value bound.
    buffer_bytes_max: usize,
    /// The parsed request's argument ranges (reused by every batch).
    arg_ranges: Vec<std::ops::Range<usize>>,
}

impl<F: Membership> Service<'_, F> {
    fn stopping(&self) -> bool {
        // Partner: the Release store of the stop flag by its owner (a
        // signal handler, `KvService::shutdown`).
        self.stop.is_some_and(|s| s.load(Ordering::Acquire)) || self.driver.stepped_down().is_some()
    }
}

/// One client of the event loop.
struct Client {
    stream: TcpStream,
    session: Session,
    /// Bytes read and not yet executed: `buf[..filled]`.
    buf: Vec<u8>,
    filled: usize,
    /// Replies of this round (written after its commit), or left over
    /// from an earlier round's write that would have blocked.
    out: Vec<u8>,
    /// Bytes of `out` already written.
    out_sent: usize,
    /// Registered for writability (replies pending) instead of reads.
    want_write: bool,
    /// The last complete request (idle timeout).
    last_request: Instant,
    /// This round's batch wrote (the ack log's line).
    wrote: bool,
    /// Close once `out` is written (QUIT, a protocol error).
    closing: bool,
}

impl Client {
    fn replies_pending(&self) -> bool {
        self.out_sent < self.out.len()
    }
}

/// The loop's `epoll` instance (level-triggered interest).
struct Epoll(OwnedFd);

impl Epoll {
    fn new() -> std::io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn control(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> std::io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` lives across the call; both descriptors are open.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut event) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait(&self, events: &mut [libc::epoll_event], timeout: Duration) -> std::io::Result<usize> {
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: the kernel writes at most `events.len()` entries into
        // `events`, which lives across the call.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(e)
            };
        }
        Ok(n as usize)
    }
}

/// Serve clients on `listener` (made non-blocking) until the stop flag
/// is set or a commit fails: one thread, one `epoll` loop over the
/// listener and every client (module docs). Every client is closed when
/// it returns: on a stop, with the epoch ended cleanly and the leader
/// handed back; on a failure, with [`ServeError::Replication`].
pub fn serve<F: Membership>(
    listener: &TcpListener,
    leader: Leader<F>,
    options: ServeOptions<'_>,
) -> Result<Leader<F>, ServeError> {
    listener.set_nonblocking(true).map_err(ServeError::Listener)?;
    let epoll = Epoll::new().map_err(ServeError::Listener)?;
    epoll
        .control(
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            libc::EPOLLIN as u32,
            LISTENER_TOKEN,
        )
        .map_err(ServeError::Listener)?;
    let ack_log = std::env::var_os(ACK_LOG_ENV).and_then(|dir| {
        let path = std::path::Path::new(&dir).join(format!("acks-{}.log", leader.master_rank()));
        std::fs::OpenOptions::new().create(true).append(true).open(path).ok()
    });
    let limits = Limits::for_values(options.value_bytes_max);
    let mut service = Service {
        driver: leader.driver().clone(),
        leader,
        ack_log,
        stop: options.stop,
        info_extra: options.info_extra,
        buffer_bytes_max: limits.bulk_bytes_max * 2 + 64 * 1024,
        limits,
        command_limits: CommandLimits {
            value_bytes_max: options.value_bytes_max,
        },
        arg_ranges: Vec::with_capacity(16),
    };
    let mut clients: Vec<Option<Client>> = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_ROUND_MAX];
    let mut ready: Vec<usize> = Vec::with_capacity(EVENTS_PER_ROUND_MAX);
    let mut next_id = 1u64;
    let mut idle_checked = Instant::now();
    // Set while the listener's readiness is paused (out of descriptors).
    let mut listener_paused_at: Option<Instant> = None;
    // When the last round with events ended (monotonic ns).
    let mut last_events_ns = 0u64;
    let poll_spin_ns = options.poll_spin_after_work.as_nanos().min(u64::MAX as u128) as u64;
    let served = loop {
        if service.stopping() {
            break Ok(());
        }
        let spinning =
            poll_spin_ns > 0 && spindle_runtime::monotonic_ns().saturating_sub(last_events_ns) < poll_spin_ns;
        let n = match epoll.wait(&mut events, if spinning { Duration::ZERO } else { POLL_INTERVAL }) {
            Ok(n) => n,
            Err(e) => break Err(ServeError::Listener(e)),
        };
        let mut accept_now = false;
        ready.clear();
        for event in &events[..n] {
            match event.u64 {
                LISTENER_TOKEN => accept_now = true,
                token => ready.push((token - 1) as usize),
            }
        }
        // Execute what every ready client sent; the replies wait.
        let mut executed = false;
        for &slot in &ready {
            let Some(client) = clients[slot].as_mut() else { continue };
            if client.replies_pending() || client.closing {
                continue; // writable: its replies go out below
            }
            match read_and_execute(client, &mut service) {
                Ok(ran) => executed |= ran,
                Err(()) => clients[slot] = None, // closed, reset or over the bound
            }
        }
        // One commit covers every batch of the round.
        if executed {
            if let Err(e) = commit(&mut service.leader) {
                // Which writes are replicated is unknown: no reply.
                break Err(ServeError::Replication(e));
            }
            log_acks(&mut service, &mut clients, &ready);
        }
        for &slot in &ready {
            let Some(client) = clients[slot].as_mut() else { continue };
            if write_replies(client, &epoll, slot).is_err() || (client.closing && !client.replies_pending()) {
                clients[slot] = None;
            }
        }
        if n > 0 && poll_spin_ns > 0 {
            last_events_ns = spindle_runtime::monotonic_ns();
        }
        if accept_now && accept_clients(listener, &epoll, &mut clients, options.clients_max, &mut next_id) {
            // Out of descriptors: stop polling the listener for a while.
            if epoll
                .control(libc::EPOLL_CTL_MOD, listener.as_raw_fd(), 0, LISTENER_TOKEN)
                .is_ok()
            {
                listener_paused_at = Some(Instant::now());
            }
        }
        if listener_paused_at.is_some_and(|at| at.elapsed() >= POLL_INTERVAL) {
            let interest = libc::EPOLLIN as u32;
            if epoll
                .control(libc::EPOLL_CTL_MOD, listener.as_raw_fd(), interest, LISTENER_TOKEN)
                .is_ok()
            {
                listener_paused_at = None;
            }
        }
        if !options.idle_timeout.is_zero() && idle_checked.elapsed() >= POLL_INTERVAL {
            idle_checked = Instant::now();
            for slot in clients.iter_mut() {
                // Idle, or a request left half-sent: free the slot.
                if slot
                    .as_ref()
                    .is_some_and(|c| c.last_request.elapsed() >= options.idle_timeout)
                {
                    *slot = None;
                }
            }
        }
    };
    // Close every client; replies not yet written are lost.
    for client in clients.iter().flatten() {
        let _ = client.stream.shutdown(Shutdown::Both);
    }
    drop(clients);
    let stepped_down = service.driver.stepped_down();
    served?;
    let Service { mut leader, .. } = service;
    if let Some(why) = stepped_down {
        return Err(ServeError::Replication(format!("the master stepped down: {why}")));
    }
    leader.stop().map_err(ServeError::Stop)?;
    Ok(leader)
}

/// Accept the connections waiting (bounded per round); one over
/// `clients_max` is answered with an error and closed. Returns whether
/// accepting failed for want of descriptors or memory (the connection
/// stays queued: the caller pauses the listener's readiness, which would
/// otherwise wake every round at once).
fn accept_clients(
    listener: &TcpListener,
    epoll: &Epoll,
    clients: &mut Vec<Option<Client>>,
    clients_max: usize,
    next_id: &mut u64,
) -> bool {
    for _ in 0..ACCEPTS_PER_ROUND_MAX {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                // WouldBlock: none left; ECONNABORTED and the like: that
                // connection is gone, and the next round looks again.
                let starved = matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                );
                return starved;
            }
        };
        if clients.iter().flatten().count() >= clients_max {
            let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
            continue;
        }
        if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
            continue;
        }
        let slot = clients.iter().position(Option::is_none).unwrap_or_else(|| {
            clients.push(None);
            clients.len() - 1
        });
        let token = slot as u64 + 1;
        if epoll
            .control(libc::EPOLL_CTL_ADD, stream.as_raw_fd(), libc::EPOLLIN as u32, token)
            .is_err()
        {
            continue;
        }
        clients[slot] = Some(Client {
            stream,
            session: Session {
                id: *next_id,
                ..Session::default()
            },
            buf: vec![0; READ_BUFFER_BYTES],
            filled: 0,
            out: Vec::with_capacity(READ_BUFFER_BYTES),
            out_sent: 0,
            want_write: false,
            last_request: Instant::now(),
            wrote: false,
            closing: false,
        });
        *next_id += 1;
    }
    false
}

/// One read from a ready client, then every complete request in its
/// buffer executed (no reply written yet). `Ok(true)`: requests ran;
/// `Err(())`: the client is gone (closed, reset) and is dropped.
fn read_and_execute<F: Membership>(client: &mut Client, service: &mut Service<'_, F>) -> Result<bool, ()> {
    if client.filled == client.buf.len() {
        // Below the bound (a full buffer at it was answered when it
        // filled, below).
        let grown = (client.buf.len() * 2).min(service.buffer_bytes_max);
        client.buf.resize(grown, 0);
    }
    let n = match client.stream.read(&mut client.buf[client.filled..]) {
        Ok(0) => return Err(()),
        Ok(n) => n,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return Ok(false),
        Err(_) => return Err(()),
    };
    client.filled += n;
    let (used, close, wrote) = execute_batch(
        &client.buf[..client.filled],
        service,
        &mut client.session,
        &mut client.out,
    );
    if used > 0 {
        client.last_request = Instant::now();
    }
    client.buf.copy_within(used..client.filled, 0);
    client.filled -= used;
    client.wrote = wrote;
    client.closing |= close;
    if !client.closing && client.filled == client.buf.len() && client.buf.len() >= service.buffer_bytes_max {
        // Full at the bound with no complete request: answer now, not
        // at a next read that may never come.
        reply::error(
            &mut client.out,
            "ERR Protocol error: request larger than the server's bound",
        );
        client.closing = true;
    }
    Ok(used > 0 || close)
}

/// Tests: one ack-log line per answered batch that wrote, after the
/// commit that covers it and before its reply.
fn log_acks<F: Membership>(service: &mut Service<'_, F>, clients: &mut [Option<Client>], ready: &[usize]) {
    for &slot in ready {
        let Some(client) = clients[slot].as_mut() else { continue };
        if !std::mem::take(&mut client.wrote) || !client.replies_pending() {
            continue;
        }
        if let Some(log) = service.ack_log.as_mut() {
            let line = format!(
                "{} {} {}\n",
                spindle_runtime::monotonic_ns(),
                service.leader.master_rank(),
                service.leader.master.epoch()
            );
            let _ = log.write_all(line.as_bytes());
        }
    }
}

/// Write what the socket takes of a client's replies; what it does not
/// waits for writability (the client's reads pause meanwhile, so its
/// unread replies stay bounded by one round's).
fn write_replies(client: &mut Client, epoll: &Epoll, slot: usize) -> std::io::Result<()> {
    while client.replies_pending() {
        match client.stream.write(&client.out[client.out_sent..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                client.out_sent += n;
                // A client taking its replies is not idle (as in Redis).
                client.last_request = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    if !client.replies_pending() {
        client.out.clear();
        client.out_sent = 0;
    }
    let want_write = client.replies_pending();
    if want_write != client.want_write {
        let interest = if want_write { libc::EPOLLOUT } else { libc::EPOLLIN };
        epoll.control(
            libc::EPOLL_CTL_MOD,
            client.stream.as_raw_fd(),
            interest as u32,
            slot as u64 + 1,
        )?;
        client.want_write = want_write;
    }
    Ok(())
}

/// Execute every complete request at the front of `buf` (the appends do
/// not wait for the backups: the round's commit does); returns the bytes
/// used, whether to close the connection and whether the batch wrote.
fn execute_batch<F: Membership>(
    buf: &[u8],
    service: &mut Service<'_, F>,
    session: &mut Session,
    out: &mut Vec<u8>,
) -> (usize, bool, bool) {
    let leader = &mut service.leader;
    let head_before = (leader.master.epoch(), leader.master.head());
    leader.master.set_deferred(true);
    // The argument ranges' buffer, kept between batches: no allocation
    // per batch once it has grown to the longest request's argument count.
    let mut ranges = std::mem::take(&mut service.arg_ranges);
    let (mut used, mut close) = (0, false);
    let rolls = Rolls {
        cleanings: leader.cleanings,
        replacements: leader.replacements,
        pause_ns_last: leader.roll_pause_ns_last,
        pause_ns_max: leader.roll_pause_ns_max,
    };
    // The master's clock decides expiry (see the command module).
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    loop {
        let (master, objects) = (&mut leader.master, &mut leader.objects);
        match parse_request(&buf[used..], &service.limits, &mut ranges) {
            Ok(None) => break,
            Ok(Some(consumed)) => {
                let args = Args {
                    buf: &buf[used..],
                    ranges: &ranges,
                };
                let (mode, epoch) = (master.mode().as_str(), master.epoch());
                let (backups, head) = (master.backups().len(), master.head());
                let info = |o: &ObjectMap| info_text(mode, epoch, backups, head, &rolls, o, &service.info_extra);
                let mut ctx = Context {
                    objects,
                    log: master,
                    limits: &service.command_limits,
                    info: &info,
                    now_ms,
                };
                let flow = execute(args, &mut ctx, session, out);
                used += consumed;
                if flow == Flow::Close {
                    close = true;
                    break;
                }
            }
            Err(e) => {
                reply::error(out, &format!("ERR {e}"));
                close = true;
                break;
            }
        }
    }
    leader.master.set_deferred(false);
    let wrote = (leader.master.epoch(), leader.master.head()) != head_before;
    service.arg_ranges = ranges;
    (used, close, wrote)
}

/// One commit: wait until every backup has everything appended so far;
/// then housekeeping (a dropped backup rolls the epoch first); then the
/// lease: no reply, read or write, unless this master may still answer
/// ([`crate::failover`]). On success every batch executed so far is
/// committed; on failure the service ends.
fn commit<F: Membership>(leader: &mut Leader<F>) -> Result<(), String> {
    leader
        .master
        .complete()
        .and_then(|()| leader.maintain())
        .and_then(|()| leader.wait_answerable())
}

/// The master's epoch rolls so far, for `INFO` (copied once per batch).
struct Rolls {
    cleanings: u64,
    replacements: u64,
    pause_ns_last: u64,
    pause_ns_max: u64,
}

/// The `INFO` reply (the fields `spindle kv serve` reports).
/// It says the server is Spindle, which Redis version its replies follow
/// (`redis_version`, which some clients read) and which Redis commands
/// it implements (`redis_commands`); everything else is an unknown
/// command.
fn info_text(
    store_mode: &str,
    epoch: u64,
    backups: usize,
    head: u64,
    rolls: &Rolls,
    objects: &ObjectMap,
    extra: &str,
) -> String {
    format!(
        "# Server\r\nserver_name:spindle\r\nspindle_version:{}\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nredis_compatibility:a subset of Redis {REDIS_COMPAT_VERSION}: strings only, one database, no persistence commands, no pub/sub, no transactions\r\nredis_commands:{}\r\nredis_mode:standalone\r\n# Replication\r\nrole:master\r\nreplication_mode:{store_mode}\r\nepoch:{epoch}\r\nconnected_slaves:{backups}\r\nlog_head:{head}\r\nlog_cleanings:{}\r\nbackup_replacements:{}\r\nroll_pause_us_last:{}\r\nroll_pause_us_max:{}\r\n{extra}# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\n# Keyspace\r\ndb0:keys={},expires={},avg_ttl=0\r\n",
        env!("CARGO_PKG_VERSION"),
        command_list(),
        rolls.cleanings,
        rolls.replacements,
        rolls.pause_ns_last / 1_000,
        rolls.pause_ns_max / 1_000,
        objects.bytes(),
        objects.bytes_max(),
        objects.len(),
        objects.expiring()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Durability;
    use crate::log::LogGeometry;
    use crate::node::{Node, NodeConfig};
    use crate::Mode;
    use spindle_runtime::IdleStrategy;
    use std::path::Path;
    use std::sync::Arc;

    fn node_config(group: &str, dir: &Path) -> NodeConfig {
        NodeConfig {
            group: group.to_string(),
            members: 2,
            backups: 1,
            mode: Mode::OneSided,
            geometry: LogGeometry {
                segment_bytes: 16 * 1024,
                segments_max: 4,
            },
            value_bytes_max: 2048,
            memory_bytes_max: 64 << 20,
            clean_slack_segments: crate::node::CLEAN_SLACK_SEGMENTS_DEFAULT,
            data_dir: dir.to_path_buf(),
            idle: IdleStrategy::DEFAULT_BACKOFF,
            join_timeout: Duration::from_secs(30),
            lease: crate::node::LEASE_DEFAULT,
        }
    }

    /// A master's listener shares its port with a lingering one of the
    /// service (both `SO_REUSEPORT`), never with a foreign listener.
    #[test]
    fn a_new_master_binds_beside_a_lingering_listener_only() {
        let first = bind("127.0.0.1:0", Duration::ZERO).unwrap();
        let addr = first.local_addr().unwrap().to_string();
        let second = bind(&addr, Duration::ZERO).expect("beside a lingering master listener");
        assert_eq!(second.local_addr().unwrap(), first.local_addr().unwrap());
        drop((first, second));
        let foreign = TcpListener::bind("127.0.0.1:0").unwrap();
        let foreign_addr = foreign.local_addr().unwrap().to_string();
        let err = bind(&foreign_addr, Duration::ZERO).unwrap_err();
        assert!(err.contains("Address already in use"), "{err}");
        assert!(bind("localhost:1", Duration::ZERO)
            .unwrap_err()
            .contains("expected an address"));
    }

    /// Send one request, read one line of reply.
    fn request(stream: &mut TcpStream, request: &[u8]) -> Vec<u8> {
        stream.write_all(request).unwrap();
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n") {
            assert_eq!(stream.read(&mut byte).unwrap(), 1, "the server closed mid-reply");
            reply.push(byte[0]);
        }
        reply
    }

    /// Run `serve` with a leader of a 2-member group (one backup thread)
    /// on a loopback listener, hand its address to `body`, then stop it
    /// and check the clean stop: the backup's log sealed (the backup
    /// returns by itself) and the leader handed back with `objects`
    /// objects. `body` gets the address and the stop flag.
    fn with_server(clients_max: usize, objects: usize, body: impl FnOnce(std::net::SocketAddr)) {
        with_server_on(Durability::Memory, clients_max, objects, body)
    }

    /// [`with_server`] with writes acknowledged as `durability` says
    /// (disk: every commit waits for the backup's syncer).
    fn with_server_on(
        durability: Durability,
        clients_max: usize,
        objects: usize,
        body: impl FnOnce(std::net::SocketAddr),
    ) {
        static GROUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let group = format!(
            "rserve-{}-{}",
            std::process::id(),
            GROUPS.fetch_add(1, Ordering::Relaxed)
        );
        let backup_stop = Arc::new(AtomicBool::new(false));
        let backup = {
            let (config, stop) = (node_config(&group, dir.path()), backup_stop.clone());
            std::thread::spawn(move || -> Result<bool, String> {
                let node = Node::open_with(config, 1, durability)?;
                Ok(node.run_until_master(&stop)?.is_some())
            })
        };
        let node = Node::open_with(node_config(&group, dir.path()), 0, durability).unwrap();
        let leader = node
            .run_until_master(&AtomicBool::new(false))
            .unwrap()
            .expect("rank 0 leads");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                let options = ServeOptions {
                    clients_max,
                    idle_timeout: Duration::ZERO,
                    poll_spin_after_work: POLL_SPIN_AFTER_WORK_DEFAULT,
                    value_bytes_max: 2048,
                    info_extra: String::new(),
                    stop: Some(&stop),
                };
                serve(&listener, leader, options)
            });
            // A failing body still stops the server (else the scope
            // would wait for it for ever); its panic is raised after.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(addr)));
            // Release: pairs with the Acquire load in `Service::stopping`.
            stop.store(true, Ordering::Release);
            let served = server.join().unwrap();
            if let Err(panic) = outcome {
                backup_stop.store(true, Ordering::Release);
                std::panic::resume_unwind(panic);
            }
            let leader = served.expect("a clean stop");
            assert_eq!(leader.objects.len(), objects);
            // Sealed: the backup returns without being stopped, never leading.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !backup.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let returned = backup.is_finished();
            // Let a stuck backup go. Release: pairs with the Acquire
            // loads of the flag in `run_until_master`.
            backup_stop.store(!returned, Ordering::Release);
            assert!(returned, "the backup did not return after the seal");
            assert_eq!(backup.join().unwrap(), Ok(false));
            drop((leader, node));
        });
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &group));
    }

    /// Connect, `SET k v`, then `GET k`, reading the GET's first reply
    /// line only (`$1`; "v\r\n" stays unread).
    fn connect_set_get(addr: std::net::SocketAddr) -> TcpStream {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(
            request(&mut c, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"),
            b"+OK\r\n"
        );
        assert_eq!(request(&mut c, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"), b"$1\r\n");
        c
    }

    /// Read `n` RESP integer replies (`:N\r\n`).
    fn read_integers(stream: &mut std::io::BufReader<TcpStream>, n: usize) -> Vec<i64> {
        use std::io::BufRead;
        let mut line = String::new();
        (0..n)
            .map(|_| {
                line.clear();
                stream.read_line(&mut line).unwrap();
                let digits = line.strip_prefix(':').and_then(|l| l.strip_suffix("\r\n"));
                digits
                    .unwrap_or_else(|| panic!("not an integer reply: {line:?}"))
                    .parse()
                    .unwrap()
            })
            .collect()
    }

    /// Group commit across clients (disk durability: every commit waits
    /// for the backup's syncer, so many clients' batches share a round):
    /// 8 clients each pipeline batches of `INCR shared` / `INCR own<c>`.
    /// No reply is lost, duplicated or out of order: every client's own
    /// counter counts 1, 2, 3, … in its replies, the shared counter's
    /// replies are distinct across all clients and cover 1..=total, and
    /// its value at the end is the total; each client sees the shared
    /// counter only grow. A GET pipelined right behind a client's INCRs,
    /// in the same write, sees them.
    #[test]
    fn pipelining_clients_get_every_reply_once_in_order() {
        use std::io::BufRead;
        const CLIENTS: usize = 8;
        const BATCHES: usize = 40;
        const PER_BATCH: usize = 16;
        let total = (CLIENTS * BATCHES * PER_BATCH) as i64;
        with_server_on(Durability::Disk, CLIENTS + 1, CLIENTS + 1, |addr| {
            let shared_seen: Vec<Vec<i64>> = std::thread::scope(|s| {
                let clients: Vec<_> = (0..CLIENTS)
                    .map(|c| {
                        s.spawn(move || {
                            let stream = TcpStream::connect(addr).unwrap();
                            stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                            let mut writer = stream.try_clone().unwrap();
                            let mut reader = std::io::BufReader::new(stream);
                            let own = format!("own{c}");
                            let mut batch = Vec::new();
                            for _ in 0..PER_BATCH / 2 {
                                batch.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$6\r\nshared\r\n");
                                batch.extend_from_slice(
                                    format!("*2\r\n$4\r\nINCR\r\n${}\r\n{own}\r\n", own.len()).as_bytes(),
                                );
                            }
                            let mut shared = Vec::new();
                            let mut own_expected = 1;
                            let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{own}\r\n", own.len());
                            for b in 0..BATCHES {
                                // Two writes: a batch may span rounds. The
                                // last batch carries a GET right behind
                                // its INCRs, in the same write.
                                writer.write_all(&batch).unwrap();
                                if b + 1 == BATCHES {
                                    let mut last = batch.clone();
                                    last.extend_from_slice(get.as_bytes());
                                    writer.write_all(&last).unwrap();
                                } else {
                                    writer.write_all(&batch).unwrap();
                                }
                                for pair in read_integers(&mut reader, PER_BATCH * 2).chunks(2) {
                                    shared.push(pair[0]);
                                    assert_eq!(pair[1], own_expected, "client {c}: its own counter, in order");
                                    own_expected += 1;
                                }
                            }
                            assert!(
                                shared.windows(2).all(|w| w[0] < w[1]),
                                "client {c}: the shared counter only grows in its replies"
                            );
                            let mut line = String::new();
                            reader.read_line(&mut line).unwrap(); // $len
                            line.clear();
                            reader.read_line(&mut line).unwrap();
                            assert_eq!(
                                line.trim_end(),
                                (own_expected - 1).to_string(),
                                "client {c} reads its writes"
                            );
                            shared
                        })
                    })
                    .collect();
                clients.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let mut all: Vec<i64> = shared_seen.into_iter().flatten().collect();
            all.sort_unstable();
            assert_eq!(all, (1..=total).collect::<Vec<_>>(), "no lost or duplicated INCR");
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let digits = total.to_string();
            assert_eq!(
                request(&mut c, b"*2\r\n$3\r\nGET\r\n$6\r\nshared\r\n"),
                format!("${}\r\n", digits.len()).into_bytes()
            );
            assert_eq!(request(&mut c, b""), format!("{digits}\r\n").into_bytes());
        });
    }

    /// The stop flag ends `serve` in this process (it used to exit it):
    /// a connected client is closed, the epoch ends with the backup's log
    /// sealed and the leader comes back.
    #[test]
    fn a_stop_flag_returns_the_leader_and_closes_idle_clients() {
        let mut client = None;
        with_server(4, 1, |addr| {
            client = Some(connect_set_get(addr));
        });
        // The rest of the GET reply ("v\r\n") then the close.
        let mut rest = Vec::new();
        client.unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"v\r\n");
    }

    /// One loop serves every client: a client whose replies the socket
    /// cannot take (it pipelined 16,000 GETs of a 2 KB value, 32 MB of
    /// replies, and reads nothing yet) waits for writability while
    /// another client is answered; then it gets every reply, in order.
    /// A client over `clients_max` is refused with an error.
    #[test]
    fn a_client_that_does_not_read_blocks_no_other() {
        with_server(2, 2, |addr| {
            let value = vec![b'x'; 2048];
            let mut set = format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${}\r\n", value.len()).into_bytes();
            set.extend_from_slice(&value);
            set.extend_from_slice(b"\r\n");
            let mut slow = TcpStream::connect(addr).unwrap();
            slow.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            assert_eq!(request(&mut slow, &set), b"+OK\r\n");
            const GETS: usize = 16_000;
            let gets = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(GETS);
            let writer = {
                let mut w = slow.try_clone().unwrap();
                std::thread::spawn(move || w.write_all(&gets))
            };
            // Served while `slow` reads nothing.
            let _other = connect_set_get(addr); // held: it counts against clients_max
                                                // A third client: over the limit.
            let mut third = TcpStream::connect(addr).unwrap();
            third.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut refused = String::new();
            third.read_to_string(&mut refused).unwrap();
            assert_eq!(refused, "-ERR max number of clients reached\r\n");
            // Now every reply of `slow`, in order.
            let mut reply = format!("${}\r\n", value.len()).into_bytes();
            reply.extend_from_slice(&value);
            reply.extend_from_slice(b"\r\n");
            let mut got = vec![0u8; reply.len() * GETS];
            slow.read_exact(&mut got).unwrap();
            writer.join().unwrap().unwrap();
            assert!(
                got.chunks(reply.len()).all(|r| r == reply.as_slice()),
                "a reply out of order or torn"
            );
        });
    }
}
