//! Connection set-up at `open`: dial the lower ranks it waits for,
//! accept the higher ones (and any other higher rank that dials
//! meanwhile), handshake. After `open` the link thread ([`super::link`])
//! makes the connections that are still missing or were lost.

use super::accept::Acceptor;
use super::*;

/// A connection after its handshake: the socket, and the TLS session
/// over it when the group uses TLS.
pub type Conn = (TcpStream, Option<tls::Session>);

/// Connect to every peer that `options` says to wait for; `result.0[r]`
/// is the connection to member `r` (`None` for this member and for
/// peers left to the link thread). The acceptor goes on to the link
/// thread with the handshakes still pending and the counters.
/// Strangers' connections never fail this call (see [`super::accept`]);
/// a member that does not come within `join_timeout` does.
pub fn connect_all(
    options: &TcpOptions,
    rank: usize,
    listener: &TcpListener,
    hello: &Hello,
    tls: Option<&Arc<tls::TlsContext>>,
    stat: Option<&stat::StatHeader>,
) -> Result<(Vec<Option<Conn>>, Acceptor), FabricError> {
    let member_count = options.addresses.len();
    let required = options.required(rank);
    let deadline = Instant::now() + options.join_timeout;
    let abort = &AtomicBool::new(false);
    let mut acceptor = Acceptor::new(options, rank, hello, tls.cloned());
    let accepted = std::thread::scope(|s| {
        let acceptor = &mut acceptor;
        let accepting = s.spawn(move || accept_higher(options, rank, listener, acceptor, stat, deadline, abort));
        let dialed = (0..rank)
            .filter(|peer| required & (1u64 << peer) != 0)
            .map(|peer| dial(options, peer, hello, tls.map(|t| &**t), deadline, abort).map(|s| (peer, s)))
            .collect::<Result<Vec<_>, _>>();
        if dialed.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        let accepted = accepting.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
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
    Ok((streams, acceptor))
}

/// Accept the higher ranks `open` waits for, handshaking every accepted
/// connection concurrently ([`Acceptor`]) until they are all connected.
fn accept_higher(
    options: &TcpOptions,
    rank: usize,
    listener: &TcpListener,
    acceptor: &mut Acceptor,
    stat: Option<&stat::StatHeader>,
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
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = PeerSet(required_higher & !got_mask).iter().collect();
            let waited_ms = options.join_timeout.as_millis() as u64;
            // A member that tried and was refused is the likely cause:
            // name its fault rather than only the timeout.
            return Err(match acceptor.last_member_failure() {
                Some(f) => FabricError::Handshake {
                    peer: f.who.clone(),
                    fault: format!(
                        "{} (then members {missing:?} of group '{}' did not join within {waited_ms} ms)",
                        f.fault, options.group
                    ),
                },
                None => FabricError::JoinTimeout {
                    group: options.group.clone(),
                    missing,
                    waited_ms,
                },
            });
        }
        // Short waits: the abort flag is looked at between passes.
        let wait = (deadline - now).min(Duration::from_millis(10));
        for a in acceptor.pass(listener, got_mask, wait, stat) {
            if got_mask & (1u64 << a.peer) != 0 {
                // Completed alongside an earlier connection of its rank.
                acceptor.refuse_completed(a, "a second connection of a member already connected", stat);
                continue;
            }
            got_mask |= 1u64 << a.peer;
            got.push((a.peer, (a.stream, a.session)));
        }
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
                    peer,
                    options.handshake_timeout,
                    tls.map(|t| (t, addr.ip())),
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

/// The dialer's handshake over `stream` with member `peer` (blocking,
/// each read and write bounded by `timeout`); the peer's rank on
/// success, else the error and whether the peer refused this member as
/// busy (it still holds a connection of this rank: worth another try).
/// With `tls`, the TLS handshake runs first (as the client checking the
/// certificate for the dialed address), then the group-key handshake
/// inside the session, which is returned. (The listener's side is
/// [`super::accept`], which never blocks.)
pub(super) fn handshake_io(
    stream: &TcpStream,
    key: &[u8],
    hello: &Hello,
    peer: usize,
    timeout: Duration,
    tls: Option<(&tls::TlsContext, std::net::IpAddr)>,
    who: &str,
) -> Result<(usize, Option<tls::Session>), (FabricError, bool)> {
    let expect = ExpectRank::Exactly(peer as u32);
    let mut busy = false;
    let fail = |fault: String| FabricError::Handshake {
        peer: who.to_string(),
        fault,
    };
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .and_then(|_| stream.set_nodelay(true))
        .map_err(|e| (fail(format!("socket options: {e}")), false))?;
    match tls {
        None => {
            let mut io = stream;
            handshake_steps(&mut io, stream, key, hello, expect, timeout, who, &mut busy)
                .map(|r| (r, None))
                .map_err(|e| (e, busy))
        }
        Some((context, dialed)) => {
            let mut conn = context.handshake(stream, Some(dialed)).map_err(|e| (fail(e), false))?;
            let mut io = tls::TlsIo {
                conn: &mut conn,
                stream,
            };
            let rank =
                handshake_steps(&mut io, stream, key, hello, expect, timeout, who, &mut busy).map_err(|e| (e, busy))?;
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
    timeout: Duration,
    who: &str,
    busy: &mut bool,
) -> Result<usize, FabricError> {
    let fail = |fault: String| FabricError::Handshake {
        peer: who.to_string(),
        fault,
    };
    let mut hs = Handshake::new(key, hello.clone(), expect);
    let io_fault = |what: &str, e: io::Error| {
        if e.kind() == io::ErrorKind::InvalidData && e.to_string().starts_with("TLS") {
            // TLS 1.3: a client learns that its certificate was refused
            // only at its first read after the handshake.
            format!("TLS handshake failed: {e} (are both members' certificates signed by the same group CA, tls_ca?)")
        } else if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
            format!(
                "no {what} within {} ms (handshake_timeout_ms; is it a Spindle member?)",
                timeout.as_millis()
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
            who.to_string()
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
fn refuse(s: &mut dyn ReadWrite, stream: &TcpStream, refusal: &[u8; REPLY_BYTES], error: FabricError) -> FabricError {
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
    // Linux refuses more than 127 keepalive probes (EINVAL): a long
    // timeout probes less often instead (interval × count ≈ the timeout).
    let probes = secs.min(KEEPALIVE_PROBES_MAX);
    let interval_secs = (secs / probes).max(1);
    let ms = peer_timeout.as_millis().min(u32::MAX as u128) as libc::c_uint;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval_secs)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probes)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms as libc::c_int)?;
    Ok(())
}

/// The most keepalive probes Linux accepts (`TCP_KEEPCNT`).
const KEEPALIVE_PROBES_MAX: libc::c_int = 127;

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
