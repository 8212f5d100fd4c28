//! The replica's two-sided baseline over libfabric *messages*
//! (`fi_send` / `fi_recv`), on the same provider as the one-sided path:
//! the RAMCloud seed's RPC, next to its one-sided writes.
//!
//! ```text
//!  master                                   backup b (one thread, blocked on its CQ)
//!  encode record ─ fi_send(request) ──────▶ recv completion: copy the record into
//!   (to every backup)                        its log, fi_send(reply: log end) ──┐
//!  recv completions: one reply per backup ◀──────────────────────────────────────┘
//!  = acknowledged
//! ```
//!
//! Each member opens its own endpoint (`Endpoint::open_messaging`) and
//! registers one buffer; addresses are exchanged in this process. A
//! request is `[len u64][record]`; a reply is the backup's log end (u64).
//! Every wait is bounded ([`REPLY_WAIT_MAX`]); the master's next request
//! reuses its buffer only after the sends of the previous one completed
//! (waited outside the timed region).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use spindle_fabric::ofi::endpoint::{Endpoint, Registration};
use spindle_replica::record::{encode_into, encoded_len, RecordFields, RecordKind};
use spindle_runtime::monotonic_ns;

use crate::report::Percentiles;

/// Receive buffers each member keeps posted.
const RECV_SLOTS: usize = 4;
/// Bytes of a reply.
const REPLY_BYTES: usize = 8;
/// A backup's log (a ring the requests are copied into).
const LOG_BYTES: usize = 4 << 20;
/// Completion-queue depth of every endpoint.
const CQ_DEPTH: usize = 256;
/// How long the master waits for the replies to one request, or for its
/// sends to complete, before the run fails.
const REPLY_WAIT_MAX: Duration = Duration::from_secs(10);
/// Contexts: a receive slot `k` is `RECV_CONTEXT + k`; sends are `SEND_CONTEXT`.
const RECV_CONTEXT: usize = 1_000;
const SEND_CONTEXT: usize = 1;

/// One member's endpoint and its registered buffer. Fields drop in
/// order: the registration, then the endpoint (posted receives end with
/// it), then the buffer they pointed into.
struct Member {
    mr: Registration,
    ep: Endpoint,
    buf: Vec<u8>,
}

impl Member {
    fn open(provider: &str, bytes: usize, key: u64) -> Result<Member, String> {
        let ep = Endpoint::open_messaging(provider, CQ_DEPTH).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; bytes];
        let base = NonNull::new(buf.as_mut_ptr()).expect("a Vec's pointer is not null");
        // SAFETY: `buf` is never resized and drops after the registration
        // and the endpoint (field order), so it outlives them.
        let mr = unsafe { ep.register(base, bytes, key) }.map_err(|e| e.to_string())?;
        Ok(Member { mr, ep, buf })
    }

    fn ptr(&mut self, offset: usize) -> *mut u8 {
        assert!(offset < self.buf.len());
        // SAFETY: in bounds (asserted).
        unsafe { self.buf.as_mut_ptr().add(offset) }
    }

    /// Post receive slot `k`: `len` bytes at `offset`.
    fn post(&mut self, offset: usize, len: usize, k: usize) -> Result<(), String> {
        let at = self.ptr(offset);
        let started = Instant::now();
        loop {
            // SAFETY: the slot lies in the registered buffer, which lives
            // until the endpoint is closed (field order); nothing touches
            // it until its completion is read.
            match unsafe { self.ep.recv(at, len, &self.mr, RECV_CONTEXT + k) } {
                Ok(true) => return Ok(()),
                Ok(false) if started.elapsed() < REPLY_WAIT_MAX => std::hint::spin_loop(),
                Ok(false) => return Err("fi_recv: the receive queue stayed full".into()),
                Err(code) => return Err(format!("fi_recv: {}", spindle_fabric::ofi::endpoint::strerror(code))),
            }
        }
    }

    /// Read completions (spinning: the latency path), handing each
    /// context to `each` until it returns true, for at most
    /// [`REPLY_WAIT_MAX`].
    fn wait_for(&mut self, what: &str, mut each: impl FnMut(usize) -> bool) -> Result<(), String> {
        let started = Instant::now();
        let mut done = false;
        loop {
            self.ep
                .poll(|c| done |= each(c))
                .map_err(|e| format!("waiting for {what}: {}", e.fault))?;
            if done {
                return Ok(());
            }
            if started.elapsed() > REPLY_WAIT_MAX {
                return Err(format!("no {what} within {} s", REPLY_WAIT_MAX.as_secs()));
            }
            std::hint::spin_loop();
        }
    }

    /// Send `len` bytes at `offset` to `dest`, retrying while the queue is full.
    fn send(&mut self, offset: usize, len: usize, dest: u64, to: &str) -> Result<(), String> {
        let at = self.ptr(offset) as *const u8;
        let started = Instant::now();
        loop {
            // SAFETY: the bytes lie in the registered buffer; the caller
            // does not rewrite them before the send's completion is read.
            match unsafe { self.ep.send(at, len, &self.mr, dest, SEND_CONTEXT) } {
                Ok(true) => return Ok(()),
                Ok(false) if started.elapsed() < REPLY_WAIT_MAX => {
                    std::hint::spin_loop();
                }
                Ok(false) => return Err(format!("fi_send to {to}: the transmit queue stayed full")),
                Err(code) => {
                    return Err(format!(
                        "fi_send to {to}: {}",
                        spindle_fabric::ofi::endpoint::strerror(code)
                    ))
                }
            }
        }
    }
}

/// Write latency (call to the last reply) of `count` appends of `size`
/// bytes to `backups` backups over `provider`'s messages, after a warm-up.
pub fn measure(
    provider: &str,
    backups: usize,
    size: usize,
    count: usize,
    warmup: usize,
) -> Result<Percentiles, String> {
    let request_bytes = (8 + encoded_len(16, size)).next_multiple_of(64);
    let mut master = Member::open(provider, request_bytes + RECV_SLOTS * 64, 1)?;
    let mut members = Vec::new();
    for b in 0..backups {
        members.push(Member::open(
            provider,
            RECV_SLOTS * request_bytes + 64 + LOG_BYTES,
            2 + b as u64,
        )?);
    }
    let master_name = master.ep.name().map_err(|e| e.to_string())?;
    let mut dests = Vec::new();
    for (b, m) in members.iter().enumerate() {
        let name = m.ep.name().map_err(|e| e.to_string())?;
        dests.push(master.ep.insert(b + 1, &name).map_err(|e| e.to_string())?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for (b, mut m) in members.into_iter().enumerate() {
        let to_master = m.ep.insert(0, &master_name).map_err(|e| e.to_string())?;
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            serve(&mut m, b + 1, to_master, request_bytes, &stop)
        }));
    }
    let result = run_master(&mut master, &dests, size, request_bytes, count, warmup);
    // Partner: the Acquire loads in `serve`.
    stop.store(true, Ordering::Release);
    let mut first_err = result.as_ref().err().cloned();
    for (b, t) in threads.into_iter().enumerate() {
        match t.join().unwrap_or_else(|_| Err("rpc backup thread panicked".into())) {
            // Every request was answered (the master counted a reply
            // from each backup), so each backup served each one once.
            Ok(served) if result.is_ok() && served != warmup + count => {
                first_err.get_or_insert(format!(
                    "backup {} served {served} requests of {}",
                    b + 1,
                    warmup + count
                ));
            }
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => result,
    }
}

fn run_master(
    master: &mut Member,
    dests: &[u64],
    size: usize,
    request_bytes: usize,
    count: usize,
    warmup: usize,
) -> Result<Percentiles, String> {
    for k in 0..RECV_SLOTS {
        master.post(request_bytes + k * 64, 64, k)?;
    }
    let value = vec![0x5au8; size];
    let mut key = *b"object-000000000";
    let mut h = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let mut position = 0u64;
    let mut sends_pending = 0usize;
    for i in 0..warmup + count {
        // The previous request's buffer is free once its sends completed
        // (outside the timed region).
        if sends_pending > 0 {
            master.wait_for("the previous request's sends to complete", |c| {
                sends_pending -= usize::from(c == SEND_CONTEXT);
                sends_pending == 0
            })?;
        }
        key[7..].copy_from_slice(format!("{:09}", i % 1_000_000_000).as_bytes());
        let t0 = monotonic_ns();
        let len = encode_into(
            &mut master.buf[8..request_bytes],
            &RecordFields::single(RecordKind::Put, 0, position, i as u64 + 1, &key, &value),
        );
        master.buf[..8].copy_from_slice(&(len as u64).to_le_bytes());
        position += len as u64;
        for (b, &dest) in dests.iter().enumerate() {
            master.send(0, 8 + len, dest, &format!("backup {}", b + 1))?;
        }
        sends_pending += dests.len();
        let mut replies = 0;
        let mut reposts = [0usize; RECV_SLOTS];
        master.wait_for("every backup's reply", |c| {
            if c == SEND_CONTEXT {
                sends_pending -= 1;
            } else if let Some(k) = c.checked_sub(RECV_CONTEXT).filter(|k| *k < RECV_SLOTS) {
                reposts[replies] = k;
                replies += 1;
            }
            replies == dests.len()
        })?;
        let t1 = monotonic_ns();
        for &k in &reposts[..replies] {
            master.post(request_bytes + k * 64, 64, k)?;
        }
        if i >= warmup {
            h.record((t1 - t0).max(1)).map_err(|e| e.to_string())?;
        }
    }
    Ok(Percentiles::from_histogram(&h))
}

/// What a backup's completions have told it: requests arrived and not
/// answered yet (receive slots, in arrival order: at most one per posted
/// slot), and whether its last reply's send is still in flight.
#[derive(Default)]
struct Inbox {
    arrived: [usize; RECV_SLOTS],
    arrived_len: usize,
    reply_pending: bool,
}

impl Inbox {
    /// One completion: a reply sent, or a request received in slot `k`.
    fn take(&mut self, context: usize) {
        if context == SEND_CONTEXT {
            self.reply_pending = false;
        } else if let Some(k) = context.checked_sub(RECV_CONTEXT).filter(|k| *k < RECV_SLOTS) {
            self.arrived[self.arrived_len] = k;
            self.arrived_len += 1;
        }
    }

    /// The oldest request to answer, if its reply buffer is free.
    fn next(&mut self) -> Option<usize> {
        if self.arrived_len == 0 || self.reply_pending {
            return None;
        }
        let k = self.arrived[0];
        self.arrived.copy_within(1.., 0);
        self.arrived_len -= 1;
        Some(k)
    }
}

/// A backup: wait on the completion queue; copy each request into the
/// log and reply with the log's end. Returns the requests it served.
fn serve(
    m: &mut Member,
    rank: usize,
    to_master: u64,
    request_bytes: usize,
    stop: &AtomicBool,
) -> Result<usize, String> {
    for k in 0..RECV_SLOTS {
        m.post(k * request_bytes, request_bytes, k)?;
    }
    let reply_at = RECV_SLOTS * request_bytes;
    let log_at = reply_at + 64;
    let mut log_end = 0usize;
    let mut inbox = Inbox::default();
    let mut served = 0usize;
    // Partner: the Release store of `stop` in `measure`.
    while !stop.load(Ordering::Acquire) {
        // The reply buffer is reused only after its send completed.
        let Some(k) = inbox.next() else {
            m.ep.wait(2, |c| inbox.take(c))
                .map_err(|e| format!("backup {rank}: completion queue: {}", e.fault))?;
            continue;
        };
        let slot = k * request_bytes;
        let len = u64::from_le_bytes(m.buf[slot..slot + 8].try_into().expect("8 bytes")) as usize;
        if len > request_bytes - 8 {
            return Err(format!(
                "backup {rank}: a request of {len} bytes (at most {})",
                request_bytes - 8
            ));
        }
        if log_end + len > LOG_BYTES {
            log_end = 0;
        }
        m.buf.copy_within(slot + 8..slot + 8 + len, log_at + log_end);
        log_end += len;
        m.buf[reply_at..reply_at + REPLY_BYTES].copy_from_slice(&(log_end as u64).to_le_bytes());
        m.post(slot, request_bytes, k)?;
        m.send(reply_at, REPLY_BYTES, to_master, "the master")?;
        inbox.reply_pending = true;
        served += 1;
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    /// The rpc baseline over libfabric's tcp provider on loopback: every
    /// request is answered by every backup (`measure` fails otherwise:
    /// a missing reply times out, a backup that served a request twice
    /// or not at all is named), and every timed append is recorded.
    #[test]
    fn rpc_over_messages_answers_every_request_from_every_backup() {
        let latency = super::measure("tcp", 2, 512, 300, 20).expect("300 appends to 2 backups over fi_send");
        assert_eq!(latency.samples, 300, "one sample per timed append");
        assert!(latency.p50 > 0 && latency.p50 <= latency.max);
    }
}
