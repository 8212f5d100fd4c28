//! The RESP server (runtime): one thread per client, at most
//! `clients_max` clients (one more is answered `-ERR max number of
//! clients reached` and closed), each request bounded by [`Limits`]; a
//! client that sends no complete request for `idle_timeout` (idle, or a
//! request left half-sent) is closed, so stuck clients cannot hold every
//! slot; pipelined
//! requests are handled in batches (every complete request in what one
//! read brought, under one lock), with one write of all their replies.
//! A batch's appends do not wait one by one for the backups' replies
//! (rpc) or echoes (tcp). Where the master waits for the backups at all,
//! group commit spans clients: a batch is executed under the lock and
//! takes a ticket; the lock is then let go so that other clients' batches
//! execute too, and one commit (one wait for the backups, under the lock)
//! covers every batch executed before it started. No reply of a batch is
//! written before a commit covering its ticket has returned, so no client
//! — this one or another — is answered from a write that not every backup
//! has (a read may see such a write, but its reply waits for the same
//! commit). Where a push is already the completion (shm, one-sided,
//! memory durability), a batch commits in the same lock hold, as before.
//! If a commit fails the master cannot tell which writes are
//! replicated: the service is marked failed under the lock, the batch's
//! replies are dropped, no later batch runs, every client is closed and
//! [`serve`] returns [`ServeError::Replication`]; the caller leaves the
//! group (a process exits) and a backup takes over from its log.
//! After each batch the leader's housekeeping runs under the same lock
//! ([`Leader::maintain`]: replacing dead backups, cleaning the log).
//! With a stop flag, [`serve`] stops cleanly once the flag is set: it
//! stops accepting, closes every client, takes the leader back (no write
//! in flight), ends the epoch with every backup's log sealed on disk and
//! returns the leader.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant, SystemTime};

use crate::command::{execute, Args, CommandLimits, Context, Flow, Session, REDIS_COMPAT_VERSION};
use crate::driver::Driver;
use crate::keyspace::command_list;
use crate::node::{Leader, Membership};
use crate::resp::{parse_request, reply, Limits};
use crate::store::ObjectMap;

/// How long an idle accept loop sleeps before it looks at the stop flag
/// (and for new clients) again.
const ACCEPT_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Serving parameters.
#[derive(Clone, Debug)]
pub struct ServeOptions<'a> {
    pub clients_max: usize,
    /// Close a client that sends no complete request for this long (it
    /// is closed after between one and two of these); zero: never.
    pub idle_timeout: Duration,
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
    /// The listener could not be made non-blocking.
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
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// What the batches share, under one lock.
struct Guarded<F: Membership> {
    leader: Leader<F>,
    /// Set by the batch whose replication failed; no batch runs after it.
    failure: Option<String>,
    /// Tests: one line per answered batch that wrote (see [`ACK_LOG_ENV`]).
    ack_log: Option<std::fs::File>,
    /// Tickets of the batches executed so far (the last one handed out).
    tickets_executed: u64,
    /// Every batch whose ticket is at most this is replicated (and this
    /// master was still allowed to answer when that was known).
    tickets_committed: u64,
}

/// Tests: with this environment variable set to a directory, the master
/// appends `<CLOCK_MONOTONIC ns> <rank> <epoch>` to `<dir>/acks-<rank>.log`
/// for every batch with a write that it answered, so that a test can check
/// that no two masters ever answered at once (the clock is one for every
/// process of the host, network namespaces included).
pub const ACK_LOG_ENV: &str = "SPINDLE_KV_ACK_LOG";

/// The service's state, shared by the accept loop and the client threads.
struct Service<'a, F: Membership> {
    guarded: Mutex<Guarded<F>>,
    /// Mirrors `Guarded::failure` for the accept loop, which does not take
    /// the lock.
    failed: AtomicBool,
    /// Clients with a batch read and waiting for the lock to execute it:
    /// a commit lets them execute first (boundedly) so that it covers
    /// their batches too.
    batches_queued: AtomicUsize,
    stop: Option<&'a AtomicBool>,
    /// The master's failover driver: once it stepped down, serving ends.
    driver: std::sync::Arc<Driver<F>>,
    info_extra: String,
    limits: Limits,
    command_limits: CommandLimits,
    idle_timeout: Duration,
}

impl<F: Membership> Service<'_, F> {
    fn stopping(&self) -> bool {
        // Partner (first load): the Release store of the stop flag by its
        // owner (a signal handler, `KvService::shutdown`). Partner
        // (second): the Release store of `failed` in `handle_batch`.
        self.stop.is_some_and(|s| s.load(Ordering::Acquire))
            || self.failed.load(Ordering::Acquire)
            || self.driver.stepped_down().is_some()
    }
}

/// A client's thread and a second handle of its socket, to close it when
/// the service stops.
struct Client<'scope> {
    thread: ScopedJoinHandle<'scope, ()>,
    socket: TcpStream,
}

/// Serve clients on `listener` (made non-blocking) until the stop flag
/// is set or a batch's replication fails. Every client thread has ended
/// when it returns: on a stop, with the epoch ended cleanly and the
/// leader handed back; on a failure, with [`ServeError::Replication`].
pub fn serve<F: Membership>(
    listener: &TcpListener,
    leader: Leader<F>,
    options: ServeOptions<'_>,
) -> Result<Leader<F>, ServeError> {
    listener.set_nonblocking(true).map_err(ServeError::Listener)?;
    let ack_log = std::env::var_os(ACK_LOG_ENV).and_then(|dir| {
        let path = std::path::Path::new(&dir).join(format!("acks-{}.log", leader.master_rank()));
        std::fs::OpenOptions::new().create(true).append(true).open(path).ok()
    });
    let driver = leader.driver().clone();
    let service = Service {
        guarded: Mutex::new(Guarded {
            leader,
            failure: None,
            ack_log,
            tickets_executed: 0,
            tickets_committed: 0,
        }),
        failed: AtomicBool::new(false),
        batches_queued: AtomicUsize::new(0),
        stop: options.stop,
        driver,
        info_extra: options.info_extra,
        limits: Limits::for_values(options.value_bytes_max),
        command_limits: CommandLimits {
            value_bytes_max: options.value_bytes_max,
        },
        idle_timeout: options.idle_timeout,
    };
    std::thread::scope(|scope| {
        let mut clients: Vec<Client<'_>> = Vec::new();
        let mut next_id = 1u64;
        while !service.stopping() {
            match listener.accept() {
                Ok((stream, _)) => {
                    admit(scope, &service, stream, &mut clients, options.clients_max, next_id);
                    next_id += 1;
                }
                // Nothing pending (non-blocking) or a connection aborted
                // before it was accepted.
                Err(_) => std::thread::sleep(ACCEPT_POLL_INTERVAL),
            }
        }
        // Wake every client blocked in a read or a write; a batch in
        // flight ends first (it holds the lock), its replies are lost.
        for client in &clients {
            let _ = client.socket.shutdown(Shutdown::Both);
        }
        for client in clients {
            let _ = client.thread.join();
        }
    });
    let stepped_down = service.driver.stepped_down();
    let Guarded {
        mut leader, failure, ..
    } = service.guarded.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = failure {
        return Err(ServeError::Replication(e));
    }
    if let Some(why) = stepped_down {
        return Err(ServeError::Replication(format!("the master stepped down: {why}")));
    }
    leader.stop().map_err(ServeError::Stop)?;
    Ok(leader)
}

/// Start a thread for a new client, unless `clients_max` are served.
fn admit<'scope, 'env, F: Membership>(
    scope: &'scope Scope<'scope, 'env>,
    service: &'scope Service<'env, F>,
    mut stream: TcpStream,
    clients: &mut Vec<Client<'scope>>,
    clients_max: usize,
    id: u64,
) {
    reap(clients);
    if clients.len() >= clients_max {
        let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
        return;
    }
    // Out of descriptors or threads: the stream is dropped (closed).
    let Ok(socket) = stream.try_clone() else { return };
    let spawned = std::thread::Builder::new()
        .name("kv-client".into())
        .spawn_scoped(scope, move || {
            let _ = handle_client(&mut stream, service, id);
            // End the connection now: the accept loop's clone of the
            // socket would keep it open until the thread is reaped.
            let _ = stream.shutdown(Shutdown::Both);
        });
    if let Ok(thread) = spawned {
        clients.push(Client { thread, socket });
    }
}

/// Join the clients whose threads have ended.
fn reap(clients: &mut Vec<Client<'_>>) {
    let mut i = 0;
    while i < clients.len() {
        if clients[i].thread.is_finished() {
            let _ = clients.swap_remove(i).thread.join();
        } else {
            i += 1;
        }
    }
}

/// The `INFO` reply (the fields `spindle kv serve` reports).
/// It says the server is Spindle, which Redis version its replies follow
/// (`redis_version`, which some clients read) and which Redis commands
/// it implements (`redis_commands`); everything else is an unknown
/// command.
fn info_text(store_mode: &str, epoch: u64, backups: usize, head: u64, objects: &ObjectMap, extra: &str) -> String {
    format!(
        "# Server\r\nserver_name:spindle\r\nspindle_version:{}\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nredis_compatibility:a subset of Redis {REDIS_COMPAT_VERSION}: strings only, one database, no persistence commands, no pub/sub, no transactions\r\nredis_commands:{}\r\nredis_mode:standalone\r\n# Replication\r\nrole:master\r\nreplication_mode:{store_mode}\r\nepoch:{epoch}\r\nconnected_slaves:{backups}\r\nlog_head:{head}\r\n{extra}# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\n# Keyspace\r\ndb0:keys={},expires={},avg_ttl=0\r\n",
        env!("CARGO_PKG_VERSION"),
        command_list(),
        objects.bytes(),
        objects.bytes_max(),
        objects.len(),
        objects.expiring()
    )
}

/// Serve one client: read, answer every complete request of what one read
/// brought as one batch (one group commit), write the replies. Ends at
/// the client's close, at a stop or failure (between batches), when the
/// accept loop shuts the socket down, or when no complete request came
/// for the idle timeout.
fn handle_client<F: Membership>(stream: &mut TcpStream, service: &Service<'_, F>, id: u64) -> std::io::Result<()> {
    // Accepted from a non-blocking listener: make sure reads block.
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let idle = service.idle_timeout;
    if !idle.is_zero() {
        // A read waits at most this long: then the idle check below runs.
        stream.set_read_timeout(Some(idle))?;
    }
    let mut session = Session {
        id,
        ..Session::default()
    };
    let mut last_request = Instant::now();
    // A request is at most a few bulk strings over the value bound.
    let buffer_max = service.limits.bulk_bytes_max * 2 + 64 * 1024;
    let mut buf: Vec<u8> = vec![0; 16 * 1024];
    let (mut filled, mut out) = (0usize, Vec::with_capacity(16 * 1024));
    while !service.stopping() {
        if filled == buf.len() {
            if buf.len() >= buffer_max {
                reply::error(&mut out, "ERR Protocol error: request larger than the server's bound");
                return stream.write_all(&out);
            }
            buf.resize((buf.len() * 2).min(buffer_max), 0);
        }
        let n = match stream.read(&mut buf[filled..]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => 0,
            Err(e) => return Err(e),
        };
        filled += n;
        let (used, close) = if n > 0 {
            handle_batch(&buf[..filled], service, &mut session, &mut out)
        } else {
            (0, false)
        };
        if used > 0 {
            last_request = Instant::now();
        } else if !idle.is_zero() && last_request.elapsed() >= idle {
            // Idle, or a request left half-sent: free the slot.
            return Ok(());
        }
        buf.copy_within(used..filled, 0);
        filled -= used;
        if !out.is_empty() {
            stream.write_all(&out)?;
            out.clear();
        }
        if close {
            return Ok(());
        }
    }
    Ok(())
}

/// How many times a commit yields the CPU, at most, while other clients
/// still have batches queued for the lock (each yield lets them execute
/// theirs, so the commit covers them): bounded, so a steady stream of
/// batches never postpones a commit for long.
const COMMIT_YIELDS_MAX: u32 = 64;

/// Execute every complete request at the front of `buf`, then wait for a
/// commit that covers them; returns the bytes used and whether to close
/// the connection. No reply is left in `out` unless every write of the
/// batch (and every write it read) is on every backup.
fn handle_batch<F: Membership>(
    buf: &[u8],
    service: &Service<'_, F>,
    session: &mut Session,
    out: &mut Vec<u8>,
) -> (usize, bool) {
    // Relaxed: a hint for committers (see `commit_covering`), not a
    // synchronization.
    service.batches_queued.fetch_add(1, Ordering::Relaxed);
    let mut guard = service.guarded.lock().unwrap_or_else(|p| p.into_inner());
    service.batches_queued.fetch_sub(1, Ordering::Relaxed);
    if guard.failure.is_some() || service.stopping() {
        // No batch after a failure (its objects hold unreplicated
        // writes) nor after the stop flag.
        return (0, true);
    }
    let (used, close, wrote) = execute_batch(buf, &mut guard, service, session, out);
    guard.tickets_executed += 1;
    let ticket = guard.tickets_executed;
    if guard.leader.master.waits_for_backups() {
        // Let other clients' batches join this commit.
        drop(guard);
        guard = commit_covering(ticket, service);
    } else {
        commit(&mut guard, service);
    }
    let guarded = &mut *guard;
    if guarded.tickets_committed < ticket {
        // Applied but not known to be replicated (or no longer
        // answerable): drop the replies; no batch runs after this one.
        debug_assert!(guarded.failure.is_some(), "an uncommitted batch only after a failure");
        out.clear();
        return (used, true);
    }
    if let (true, Some(log)) = (wrote && !out.is_empty(), guarded.ack_log.as_mut()) {
        let line = format!(
            "{} {} {}\n",
            spindle_runtime::monotonic_ns(),
            guarded.leader.master_rank(),
            guarded.leader.master.epoch()
        );
        let _ = log.write_all(line.as_bytes());
    }
    (used, close)
}

/// Execute every complete request at the front of `buf` (group commit
/// on: the appends do not wait for the backups); returns the bytes used,
/// whether to close the connection and whether the batch wrote.
fn execute_batch<F: Membership>(
    buf: &[u8],
    guarded: &mut Guarded<F>,
    service: &Service<'_, F>,
    session: &mut Session,
    out: &mut Vec<u8>,
) -> (usize, bool, bool) {
    let leader = &mut guarded.leader;
    let head_before = (leader.master.epoch(), leader.master.head());
    leader.master.set_deferred(true);
    let (mut used, mut close, mut ranges) = (0, false, Vec::new());
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
                let info = |o: &ObjectMap| info_text(mode, epoch, backups, head, o, &service.info_extra);
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
    (used, close, wrote)
}

/// Take the lock back once a commit covers `ticket`: commit here unless
/// another client's commit already did (or the service failed). Before
/// committing, yield (boundedly) while other clients have batches queued,
/// so that this one wait for the backups covers theirs too.
fn commit_covering<'s, 'a, F: Membership>(
    ticket: u64,
    service: &'s Service<'a, F>,
) -> std::sync::MutexGuard<'s, Guarded<F>> {
    let mut yields = 0;
    while yields < COMMIT_YIELDS_MAX && service.batches_queued.load(Ordering::Relaxed) > 0 {
        std::thread::yield_now();
        yields += 1;
    }
    let mut guard = service.guarded.lock().unwrap_or_else(|p| p.into_inner());
    if guard.tickets_committed < ticket && guard.failure.is_none() {
        commit(&mut guard, service);
    }
    guard
}

/// One commit, under the lock: wait until every backup has everything
/// appended so far; then housekeeping (a dropped backup rolls the epoch
/// first); then the lease: no reply, read or write, unless this master
/// may still answer ([`crate::failover`]). On success every ticket handed
/// out so far is committed; on failure the service is marked failed.
fn commit<F: Membership>(guarded: &mut Guarded<F>, service: &Service<'_, F>) {
    debug_assert!(guarded.failure.is_none(), "no commit after a failure");
    let covered = guarded.tickets_executed;
    let leader = &mut guarded.leader;
    let answerable = leader
        .master
        .complete()
        .and_then(|()| leader.maintain())
        .and_then(|()| leader.wait_answerable());
    match answerable {
        Ok(()) => {
            debug_assert!(covered >= guarded.tickets_committed, "tickets commit in order");
            guarded.tickets_committed = covered;
        }
        Err(e) => {
            guarded.failure = Some(e);
            // Release: pairs with the Acquire load in `Service::stopping`.
            service.failed.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// The stop flag ends `serve` in this process (it used to exit it):
    /// an idle client is closed, the epoch ends with the backup's log
    /// sealed (the backup then returns by itself) and the leader comes back.
    #[test]
    fn a_stop_flag_returns_the_leader_and_closes_idle_clients() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let group = format!("rserve-{}", std::process::id());
        let backup_stop = Arc::new(AtomicBool::new(false));
        let backup = {
            let (config, stop) = (node_config(&group, dir.path()), backup_stop.clone());
            std::thread::spawn(move || -> Result<bool, String> {
                let node = Node::open(config, 1)?;
                Ok(node.run_until_master(&stop)?.is_some())
            })
        };
        let node = Node::open(node_config(&group, dir.path()), 0).unwrap();
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
                    clients_max: 4,
                    idle_timeout: Duration::ZERO,
                    value_bytes_max: 2048,
                    info_extra: String::new(),
                    stop: Some(&stop),
                };
                serve(&listener, leader, options)
            });
            let mut client = TcpStream::connect(addr).unwrap();
            assert_eq!(
                request(&mut client, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"),
                b"+OK\r\n"
            );
            assert_eq!(request(&mut client, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"), b"$1\r\n");
            // Release: pairs with the Acquire load in `Service::stopping`.
            stop.store(true, Ordering::Release);
            let leader = server.join().unwrap().expect("a clean stop");
            assert_eq!(leader.objects.len(), 1);
            // The rest of the GET reply ("v\r\n") then the close.
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).unwrap();
            assert_eq!(rest, b"v\r\n");
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
}
