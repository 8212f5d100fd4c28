//! A backup: flushes closed segments to disk in the background (and, in
//! rpc mode, receives, copies and replies), and seals its log when its
//! master dies.
//!
//! In one-sided mode no backup thread is on the write path: the flusher
//! only looks at segments the master has closed, and the master waits on
//! it only when the ring of `segments_max` segments is full (flow control).
//! The exception is a fabric whose push is not a completion (tcp): there
//! an echo thread reports the guard it sees applied
//! ([`crate::layout::Completion::Echo`]), copying no record bytes.
//!
//! The flusher appends the log to the segment files in place
//! ([`SegmentAppender`], as the disk syncer below does): a closed segment's
//! rest at once, with one `fdatasync`, before it publishes
//! `flushed_segments`; and every [`OPEN_SEGMENT_FLUSH_INTERVAL`] the
//! complete part of the open segment, so a total failure (every process
//! killed, nothing sealed) loses at most that much time of writes. Each
//! byte is written once while the epoch runs (the seal writes the open
//! segment whole once more). Until 2026-12-02 each closed segment, and
//! every 50 ms the open segment's whole prefix, went through a temporary
//! file, a sync and a rename: per million one-key SETs the disk took 327
//! MB against 242 MB now, and 392 syncs against 309.
//!
//! With [`Durability::Disk`] the flusher is replaced by a *syncer*: it
//! writes whatever arrived since its last round straight into the open
//! segment's file ([`SegmentAppender`]), calls `fdatasync` once for all of
//! it (group commit), then publishes `durable` (and `flushed_segments`)
//! and rings the doorbell: the master acknowledges a write once every
//! backup's `durable` has passed it. It loops while there is work and
//! idles on the doorbell (spin, yield, park) when there is none. In rpc
//! mode the same thread copies the request first; over tcp no echo thread
//! runs (`durable` is the completion).
//!
//! ```text
//!  master                          syncer (each backup)                   master
//!  records, guard (Release) ──▶    g = guard (Acquire)
//!  ring (group commit: once        pwrite log[durable..g], fdatasync
//!  per batch)                      durable = g (Release), push, ring ──▶  durable ≥ end (Acquire):
//!                                                                          acknowledge
//! ```
//!
//! Once everything up to the master's `snapshot_end` of this epoch is on
//! this backup's disk, older epochs are deleted (log cleaning: the disk
//! holds at most the previous epoch and the current one).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use spindle_fabric::{Fabric, PeerSet};
use spindle_runtime::{IdleStrategy, Idler};

use crate::disk::{SegmentAppender, SegmentDisk};
use crate::layout::{
    Completion, Durability, ReplicaLayout, COUNTER_RPC_COPIES, COUNTER_SEGMENTS_FLUSHED, COUNTER_SYNCS, ROLE_BACKUP,
};
use crate::master::Mode;

/// A backup following one master in one epoch, with its threads.
pub struct Backup<F: Fabric> {
    shared: Arc<Shared<F>>,
    threads: Vec<JoinHandle<Result<(), String>>>,
}

struct Shared<F: Fabric> {
    fabric: Arc<F>,
    layout: ReplicaLayout,
    mode: Mode,
    disk: SegmentDisk,
    master: usize,
    epoch: u64,
    stop: AtomicBool,
    idle: IdleStrategy,
    /// Older epochs deleted (this epoch's snapshot is on disk).
    cleaned: AtomicBool,
}

impl<F: Fabric> Shared<F> {
    fn me(&self) -> usize {
        self.fabric.member_rank()
    }

    /// The position up to which this backup's log is complete: the
    /// master's guard (one-sided) or its own copy (rpc).
    fn durable_head(&self) -> u64 {
        let owner = self.log_owner();
        // Partner: the Release store of head[me] by the master (one-sided)
        // or by our own copier (rpc).
        self.fabric
            .row(owner)
            .u64_at(self.layout.head.offset(self.me()))
            .load(Ordering::Acquire)
    }

    /// Whose row holds this backup's log: the master's (one-sided) or ours.
    fn log_owner(&self) -> usize {
        match self.mode {
            Mode::OneSided => self.master,
            Mode::Rpc => self.me(),
        }
    }

    fn segment_bytes(&self, k: u64) -> &[u8] {
        let at = self.layout.segment_offset(self.me(), k);
        // SAFETY:
        // - the range lies in the row (layout arithmetic, asserted in bytes);
        // - segment k is closed (the head passed its end, Acquire above)
        //   or the writer is gone (seal), and the writer does not reuse its
        //   slot before `flushed_segments` passes k (flow control), so no
        //   one writes these bytes while we read them.
        unsafe {
            self.fabric
                .row(self.log_owner())
                .bytes(at, self.layout.geometry.segment_bytes)
        }
    }

    /// The bytes of log positions `from..to`, within one segment and
    /// below the guard.
    fn log_range(&self, from: u64, to: u64) -> &[u8] {
        let geometry = self.layout.geometry;
        assert!(from <= to, "log range {from}..{to}");
        assert!(
            from == to || geometry.segment_of(from) == geometry.segment_of(to - 1),
            "log range {from}..{to} crosses a segment's end"
        );
        let at = self.layout.area_offset(self.me(), from);
        // SAFETY:
        // - the range lies in the row (layout arithmetic, asserted in bytes);
        // - the caller took `to` from the guard (Acquire in durable_head):
        //   every byte below it was written before the guard's Release
        //   store, and the writer appends only past the guard and reuses
        //   the slot only after `flushed_segments` passes this segment, so
        //   no one writes these bytes while we read them (the master may
        //   write past them: they are not part of this slice).
        unsafe { self.fabric.row(self.log_owner()).bytes(at, (to - from) as usize) }
    }

    fn count(&self, id: usize) {
        let c = self.fabric.row(self.me()).u64_at(self.layout.counters.offset(id));
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    fn flushed(&self) -> u64 {
        self.fabric
            .row(self.me())
            .u64_at(self.layout.flushed_segments.offset())
            .load(Ordering::Relaxed)
    }

    /// Delete older epochs once this epoch's snapshot is on disk up to
    /// `durable_end` (bytes of this epoch's log that are on disk).
    fn clean_older(&self, durable_end: u64) -> Result<(), String> {
        if self.cleaned.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Partner: the Release store in Master::append_snapshot_done.
        let end = self
            .fabric
            .row(self.master)
            .u64_at(self.layout.snapshot_end.offset())
            .load(Ordering::Acquire);
        if end == 0 || durable_end < end {
            return Ok(());
        }
        self.disk.remove_epochs_before(self.epoch)?;
        self.cleaned.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Append the log from `flusher.appended` up to `to` to the segment
    /// files (in place, [`SegmentAppender`]), without syncing. `to` is the
    /// guard, or the end of a closed segment.
    fn append_to(&self, flusher: &mut Flusher, to: u64) -> Result<(), String> {
        let segment_bytes = self.layout.geometry.segment_bytes as u64;
        while flusher.appended < to {
            let k = self.layout.geometry.segment_of(flusher.appended);
            let offset = (flusher.appended % segment_bytes) as usize;
            let end = to.min((k + 1) * segment_bytes);
            let bytes = if end == (k + 1) * segment_bytes {
                // A closed segment: the rest of its slot, pad included.
                &self.segment_bytes(k)[offset..]
            } else {
                self.log_range(flusher.appended, end)
            };
            flusher.appender.write(k, offset, bytes)?;
            flusher.appended = end;
        }
        Ok(())
    }

    /// Put every closed segment on disk: append what of them is not in
    /// the files yet, sync once, then publish `flushed_segments` (the
    /// master may reuse their slots). Returns how many it closed.
    fn flush_closed(&self, flusher: &mut Flusher) -> Result<u32, String> {
        let closed = self.layout.geometry.closed_segments(self.durable_head());
        let flushed = self.flushed();
        if flushed >= closed {
            return Ok(0);
        }
        let end = closed * self.layout.geometry.segment_bytes as u64;
        self.append_to(flusher, end)?;
        flusher.appender.sync()?;
        let me = self.me();
        let cell = self.layout.flushed_segments.offset();
        // Partner: the Acquire load of `flushed_segments` in the master's
        // flow control: it reuses the slots only after this (and after the
        // sync above).
        self.fabric.row(me).u64_at(cell).store(closed, Ordering::Release);
        self.fabric
            .push(cell..cell + 8, PeerSet(1 << self.master))
            .map_err(|e| e.to_string())?;
        for _ in flushed..closed {
            self.count(COUNTER_SEGMENTS_FLUSHED);
        }
        self.clean_older(end)?;
        Ok((closed - flushed) as u32)
    }

    /// Append the complete part of the open segment (up to the guard) and
    /// sync it, at most every [`OPEN_SEGMENT_FLUSH_INTERVAL`] and only when
    /// it grew. Replay reads a segment file shorter than a segment as its
    /// prefix, and drops a torn record at its end.
    fn flush_open(&self, flusher: &mut Flusher) -> Result<(), String> {
        let head = self.durable_head();
        if head <= flusher.appended || flusher.synced_at.elapsed() < OPEN_SEGMENT_FLUSH_INTERVAL {
            return Ok(());
        }
        let geometry = self.layout.geometry;
        if self.flushed() < geometry.closed_segments(head) {
            // A segment closed since the last look: flush_closed first.
            return Ok(());
        }
        self.append_to(flusher, head)?;
        flusher.appender.sync()?;
        flusher.synced_at = std::time::Instant::now();
        self.clean_older(head)?;
        Ok(())
    }

    /// This backup's `durable` position (only the syncer writes it).
    fn durable(&self) -> u64 {
        self.fabric
            .row(self.me())
            .u64_at(self.layout.durable.offset())
            .load(Ordering::Relaxed)
    }

    /// Disk durability, one round of the syncer: write the log from
    /// `durable` up to the guard into the segment files, fdatasync once
    /// for all of it, then publish `durable` (and `flushed_segments` for
    /// the segments this closed) to the master and ring. Returns 1 when
    /// it synced, 0 when there was nothing new.
    fn sync(&self, appender: &mut SegmentAppender) -> Result<u32, String> {
        let me = self.me();
        let row = self.fabric.row(me);
        let durable_cell = self.layout.durable.offset();
        let guard = self.fabric.row(self.log_owner()).u64_at(self.layout.head.offset(me));
        let geometry = self.layout.geometry;
        let segment_bytes = geometry.segment_bytes as u64;
        // The orderings and their partners: see `crate::durable`.
        let stepped = crate::durable::step(guard, row.u64_at(durable_cell), |from, to| {
            let mut at = from;
            while at < to {
                let k = geometry.segment_of(at);
                let end = to.min((k + 1) * segment_bytes);
                appender.write(k, (at % segment_bytes) as usize, self.log_range(at, end))?;
                at = end;
            }
            appender.sync()
        })?;
        let Some(head) = stepped else { return Ok(0) };
        let master = PeerSet(1 << self.master);
        let closed = geometry.closed_segments(head);
        let flushed = self.flushed();
        if closed > flushed {
            let flushed_cell = self.layout.flushed_segments.offset();
            // Partner: the Acquire load of `flushed_segments` in the
            // master's flow control: it reuses the slots only after this.
            row.u64_at(flushed_cell).store(closed, Ordering::Release);
            self.fabric
                .push(flushed_cell..flushed_cell + 8, master)
                .map_err(|e| e.to_string())?;
            for _ in flushed..closed {
                self.count(COUNTER_SEGMENTS_FLUSHED);
            }
        }
        self.fabric
            .push(durable_cell..durable_cell + 8, master)
            .map_err(|e| e.to_string())?;
        // Wake a master parked on `durable` (tcp: send the pushes now).
        self.fabric.doorbell().ring();
        self.count(COUNTER_SYNCS);
        self.clean_older(head)?;
        Ok(1)
    }

    /// How far the master has published to this backup: `head[me]` in our
    /// copy of its row.
    fn master_head(&self) -> u64 {
        // Partner: the Release store of head[me] by the master; on tcp the
        // frames are applied in order, so the record bytes pushed before
        // it are applied too.
        self.fabric
            .row(self.master)
            .u64_at(self.layout.head.offset(self.me()))
            .load(Ordering::Acquire)
    }

    /// One-sided with `Completion::Echo`: report the guard we see applied
    /// in our copy of the master's row. Returns 1 when it moved.
    fn echo(&self) -> Result<u32, String> {
        let me = self.me();
        let seen = self.fabric.row(self.master).u64_at(self.layout.head.offset(me));
        let cell = self.layout.head.offset(me);
        // The orderings and their partners: see `crate::echo`.
        if crate::echo::step(seen, self.fabric.row(me).u64_at(cell)).is_none() {
            return Ok(0);
        }
        self.fabric
            .push(cell..cell + 8, PeerSet(1 << self.master))
            .map_err(|e| e.to_string())?;
        Ok(1)
    }

    /// RPC: copy everything the master published into our own area and
    /// reply by storing our own head. Returns bytes copied.
    fn copy_requests(&self) -> Result<u32, String> {
        let me = self.me();
        let target = self.master_head();
        let own = self.fabric.row(me);
        let cell = self.layout.head.offset(me);
        let mut copied = own.u64_at(cell).load(Ordering::Relaxed);
        if target <= copied {
            return Ok(0);
        }
        let geometry = self.layout.geometry;
        let start = copied;
        while copied < target {
            let n = geometry.segment_remaining(copied).min((target - copied) as usize);
            let at = self.layout.area_offset(me, copied);
            // SAFETY: the source bytes lie below the master's head[me]
            // (Acquire above), which it never rewrites before we flush;
            // the destination is our own row past our published head, read
            // by nobody until the Release store below; the two rows are
            // distinct, so the slices do not overlap.
            unsafe {
                let src = self.fabric.row(self.master).bytes(at, n);
                own.bytes_mut(at, n).copy_from_slice(src);
            }
            copied += n as u64;
        }
        // Partner: the Acquire load in the master's wait_replies (shm)
        // or wait_parked (tcp).
        own.u64_at(cell).store(copied, Ordering::Release);
        self.fabric
            .push(cell..cell + 8, PeerSet(1 << self.master))
            .map_err(|e| e.to_string())?;
        self.count(COUNTER_RPC_COPIES);
        Ok((copied - start).min(u32::MAX as u64) as u32)
    }
}

impl<F: Fabric> Backup<F> {
    /// Follow `master` in `epoch`: reset this member's backup state,
    /// announce it (`ready_epoch`), start the flusher (and the rpc copier).
    pub fn follow(
        fabric: Arc<F>,
        layout: ReplicaLayout,
        mode: Mode,
        disk: SegmentDisk,
        master: usize,
        epoch: u64,
        idle: IdleStrategy,
    ) -> Result<Backup<F>, String> {
        let me = fabric.member_rank();
        assert_ne!(me, master, "a backup follows another member");
        let row = fabric.row(me);
        row.u64_at(layout.flushed_segments.offset()).store(0, Ordering::Relaxed);
        row.u64_at(layout.durable.offset()).store(0, Ordering::Relaxed);
        row.u64_at(layout.head.offset(me)).store(0, Ordering::Relaxed);
        row.u64_at(layout.epoch.offset()).store(epoch, Ordering::Relaxed);
        row.u64_at(layout.master_rank.offset())
            .store(master as u64, Ordering::Relaxed);
        row.u64_at(layout.role.offset()).store(ROLE_BACKUP, Ordering::Relaxed);
        // Partner: the Acquire load of `ready_epoch` in Master::start:
        // the master sees our reset counters before writing to us.
        row.u64_at(layout.ready_epoch.offset())
            .store(epoch + 1, Ordering::Release);
        fabric
            .push(0..layout.areas.offset(), PeerSet(1 << master))
            .map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            fabric,
            layout,
            mode,
            disk,
            master,
            epoch,
            stop: AtomicBool::new(false),
            idle,
            cleaned: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        if shared.layout.durability == Durability::Disk {
            // The syncer also copies (rpc) and is the completion (tcp).
            let s = shared.clone();
            let appender = SegmentAppender::new(s.disk.clone(), epoch);
            threads.push(spawn(&format!("syncer-{me}"), move || syncer_loop(&s, appender)));
            return Ok(Backup { shared, threads });
        }
        let s = shared.clone();
        threads.push(spawn(&format!("flusher-{me}"), move || flusher_loop(&s)));
        if mode == Mode::Rpc {
            let s = shared.clone();
            threads.push(spawn(&format!("rpc-{me}"), move || {
                copier_loop(&s, Shared::copy_requests)
            }));
        } else if s_completion(&shared) == Completion::Echo {
            let s = shared.clone();
            threads.push(spawn(&format!("echo-{me}"), move || copier_loop(&s, Shared::echo)));
        }
        Ok(Backup { shared, threads })
    }

    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }
    pub fn master(&self) -> usize {
        self.shared.master
    }

    /// Whether a thread stopped on its own (an error).
    pub fn failed(&self) -> bool {
        self.threads.iter().any(|t| t.is_finished())
    }

    /// Stop the threads; the first error any hit.
    pub fn stop(&mut self) -> Result<(), String> {
        // Partner: the Acquire loads in the loops and in their re-checks
        // before a park.
        self.shared.stop.store(true, Ordering::Release);
        // Wake a thread parked on the doorbell now: with the re-check of
        // the flag after announcing its park (the doorbell protocol), it
        // sees the flag at once, however long its park.
        self.shared.fabric.doorbell().ring();
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t.join().unwrap_or_else(|_| Err("backup thread panicked".into()));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The master is gone: stop, then put this epoch's whole log on disk —
    /// every unflushed segment, including the open one and whatever the
    /// master wrote past its guard — and record the guard. Returns it.
    pub fn seal(mut self) -> Result<u64, String> {
        self.stop()?;
        let s = &self.shared;
        let guard = s.durable_head();
        let geometry = s.layout.geometry;
        let flushed = s.flushed();
        let last = (geometry.segment_of(guard) + 1).min(flushed + geometry.segments_max as u64 - 1);
        for k in flushed..=last {
            s.disk.write_segment(s.epoch, k, s.segment_bytes(k))?;
        }
        s.disk.seal(s.epoch, guard)?;
        s.clean_older(guard)?;
        let me = s.me();
        let cell = s.layout.sealed_epoch.offset();
        // Partner: the Acquire load of `sealed_epoch` in Master::end_epoch.
        s.fabric.row(me).u64_at(cell).store(s.epoch + 1, Ordering::Release);
        // The master may be gone (failover): nobody to tell then.
        let _ = s.fabric.push(cell..cell + 8, PeerSet(1 << s.master));
        Ok(guard)
    }
}

impl<F: Fabric> Drop for Backup<F> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn spawn(name: &str, f: impl FnOnce() -> Result<(), String> + Send + 'static) -> JoinHandle<Result<(), String>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .expect("spawn backup thread")
}

/// How often a backup writes the complete prefix of its open segment to
/// disk (when it grew): what a total failure — every process killed at
/// once, nothing sealed — can lose is bounded by this much time of writes.
pub const OPEN_SEGMENT_FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// The memory-durability flusher's state: what of this epoch's log is in
/// the segment files, and when it last synced.
struct Flusher {
    appender: SegmentAppender,
    /// Log position up to which the files hold this epoch's log.
    appended: u64,
    synced_at: std::time::Instant,
}

fn flusher_loop<F: Fabric>(s: &Shared<F>) -> Result<(), String> {
    let mut flusher = Flusher {
        appender: SegmentAppender::new(s.disk.clone(), s.epoch),
        appended: 0,
        synced_at: std::time::Instant::now(),
    };
    let mut nap = FLUSHER_NAP_MIN;
    // Partner: the Release store in Backup::stop.
    while !s.stop.load(Ordering::Acquire) {
        if s.flush_closed(&mut flusher)? == 0 {
            s.flush_open(&mut flusher)?;
            // Off the write path: poll gently, and less often the longer
            // there is nothing to flush (an idle service's flushers were
            // 4% of a core each at a fixed 200 µs).
            std::thread::sleep(nap);
            nap = (nap * 2).min(FLUSHER_NAP_MAX);
        } else {
            nap = FLUSHER_NAP_MIN;
        }
    }
    Ok(())
}

/// The flusher's nap after a pass that flushed a segment; it doubles with
/// every pass that flushes none, up to [`FLUSHER_NAP_MAX`]. So a closed
/// segment may be noticed up to that much later, under load too. The
/// master waits on the flusher only when all `segments_max` segments are
/// full (with the defaults, 3 segments of 2 MiB not yet flushed), which
/// takes far longer than that at any rate the backups keep up with.
const FLUSHER_NAP_MIN: Duration = Duration::from_micros(200);
/// The flusher's longest nap: the most a closed segment waits to be
/// noticed.
const FLUSHER_NAP_MAX: Duration = Duration::from_millis(2);

/// Disk durability: sync while there is work (each round covers all that
/// arrived during the previous one: group commit); idle on the doorbell
/// when there is none, as the echo thread does ([`reply_idle`]: spin
/// briefly on shm, park at once on tcp; a yielding syncer would receive
/// nothing on tcp).
fn syncer_loop<F: Fabric>(s: &Shared<F>, mut appender: SegmentAppender) -> Result<(), String> {
    let mut idler = Idler::new(reply_idle(s.idle, &*s.fabric));
    let doorbell = s.fabric.doorbell();
    // Partner: the Release store in Backup::stop.
    while !s.stop.load(Ordering::Acquire) {
        let mut work = 0;
        if s.mode == Mode::Rpc {
            work += s.copy_requests()?.min(1);
        }
        work += s.sync(&mut appender)?;
        // Work: the master published past what is on our disk.
        // Partner of the stop flag: the Release store in Backup::stop.
        idler.idle(work, doorbell, || {
            s.master_head() != s.durable() || s.stop.load(Ordering::Acquire)
        });
    }
    Ok(())
}

/// Spin passes of the echo thread, the rpc copier and the disk syncer
/// before they park.
const REPLY_SPINS_MAX: u32 = 200;
/// The shortest longest park of the echo thread, the rpc copier and the
/// disk syncer: the frame or the master's ring that brings work wakes
/// them, and `Backup::stop` rings, so a longer park only saves wake-ups
/// while idle.
const REPLY_PARK_MIN: Duration = Duration::from_millis(10);

/// The idle strategy of the echo thread, the rpc copier and the disk
/// syncer: the
/// configured one, but a backoff spins at most [`REPLY_SPINS_MAX`] passes
/// (none on a fabric that receives by system calls, tcp), does not yield
/// (see [`copier_loop`]) and parks up to [`REPLY_PARK_MIN`] or longer.
/// Busy spinning stays as configured (a core of its own).
///
/// On tcp nobody receives while these threads spin (the receive thread
/// naps while a thread of the process has parked lately; the parked
/// thread itself receives), so a spin only holds a core that the master
/// and the other backups need: three backups' echo threads spinning 200
/// passes after every echo made a write one at a time take 115-125 µs
/// against 101-107 µs without (2 vCPUs, 3 backups; RESULTS-replica.md).
fn reply_idle<F: Fabric>(configured: IdleStrategy, fabric: &F) -> IdleStrategy {
    match configured {
        IdleStrategy::BusySpin => IdleStrategy::BusySpin,
        IdleStrategy::Backoff { spins, park, .. } => IdleStrategy::Backoff {
            spins: if fabric.receive_makes_system_calls() {
                0
            } else {
                spins.min(REPLY_SPINS_MAX)
            },
            yields: 0,
            park: park.max(REPLY_PARK_MIN),
        },
    }
}

fn s_completion<F: Fabric>(s: &Shared<F>) -> Completion {
    s.layout.completion
}

/// The rpc copier and the echo thread: `step` once per pass, idling on the
/// doorbell while the master's guard for us has not moved. Neither
/// receives while it spins: on tcp the frame that moves the guard is
/// taken by the fabric's receive thread, or by this thread once it parks
/// on the sockets. So it does not spin there, and never yields (a
/// yielding thread receives nothing, and the receive thread naps while
/// this one has parked lately): see [`reply_idle`].
fn copier_loop<F: Fabric>(s: &Shared<F>, step: fn(&Shared<F>) -> Result<u32, String>) -> Result<(), String> {
    let mut idler = Idler::new(reply_idle(s.idle, &*s.fabric));
    let doorbell = s.fabric.doorbell();
    // Partner: the Release store in Backup::stop.
    while !s.stop.load(Ordering::Acquire) {
        let work = step(s)?;
        idler.idle(work, doorbell, || {
            s.fabric
                .row(s.master)
                .u64_at(s.layout.head.offset(s.me()))
                .load(Ordering::Acquire)
                != s.fabric
                    .row(s.me())
                    .u64_at(s.layout.head.offset(s.me()))
                    .load(Ordering::Relaxed)
                // Partner: the Release store in Backup::stop.
                || s.stop.load(Ordering::Acquire)
        });
    }
    Ok(())
}
