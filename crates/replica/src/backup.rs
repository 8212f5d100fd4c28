//! A backup: flushes closed segments to disk in the background (and, in
//! rpc mode, receives, copies and replies), and seals its log when its
//! master dies.
//!
//! In one-sided mode no backup thread is on the write path: the flusher
//! only looks at segments the master has closed, and the master waits on
//! it only when the ring of `segments_max` segments is full (flow control).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use spindle_fabric::{Fabric, PeerSet};
use spindle_sst::{IdleStrategy, Idler};

use crate::disk::SegmentDisk;
use crate::layout::{ReplicaLayout, COUNTER_RPC_COPIES, COUNTER_SEGMENTS_FLUSHED, ROLE_BACKUP};
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

    /// Flush every closed segment; returns how many it wrote.
    fn flush_closed(&self) -> Result<u32, String> {
        let closed = self.layout.geometry.closed_segments(self.durable_head());
        let mut flushed = self.flushed();
        let mut work = 0;
        while flushed < closed {
            self.disk
                .write_segment(self.epoch, flushed, self.segment_bytes(flushed))?;
            flushed += 1;
            let me = self.me();
            let cell = self.layout.flushed_segments.offset();
            // Partner: the Acquire load of `flushed_segments` in the
            // master's flow control: it reuses the slot only after this.
            self.fabric.row(me).u64_at(cell).store(flushed, Ordering::Release);
            self.fabric
                .push(cell..cell + 8, PeerSet(1 << self.master))
                .map_err(|e| e.to_string())?;
            self.count(COUNTER_SEGMENTS_FLUSHED);
            work += 1;
        }
        Ok(work)
    }

    /// RPC: copy everything the master published into our own area and
    /// reply by storing our own head. Returns bytes copied.
    fn copy_requests(&self) -> Result<u32, String> {
        let me = self.me();
        // Partner: the Release store of head[me] by the master.
        let target = self
            .fabric
            .row(self.master)
            .u64_at(self.layout.head.offset(me))
            .load(Ordering::Acquire);
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
        // Partner: the Acquire load in the master's wait_replies.
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
        });
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(spawn(&format!("flusher-{me}"), move || flusher_loop(&s)));
        if mode == Mode::Rpc {
            let s = shared.clone();
            threads.push(spawn(&format!("rpc-{me}"), move || copier_loop(&s)));
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
        // Partner: the Acquire loads in the loops.
        self.shared.stop.store(true, Ordering::Release);
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
        let me = s.me();
        s.fabric
            .row(me)
            .u64_at(s.layout.sealed_epoch.offset())
            .store(s.epoch + 1, Ordering::Release);
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

fn flusher_loop<F: Fabric>(s: &Shared<F>) -> Result<(), String> {
    // Partner: the Release store in Backup::stop.
    while !s.stop.load(Ordering::Acquire) {
        if s.flush_closed()? == 0 {
            // Off the write path: poll gently.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

fn copier_loop<F: Fabric>(s: &Shared<F>) -> Result<(), String> {
    let mut idler = Idler::new(s.idle);
    let doorbell = s.fabric.doorbell();
    // Partner: the Release store in Backup::stop.
    while !s.stop.load(Ordering::Acquire) {
        let work = s.copy_requests()?;
        idler.idle(work, doorbell, || {
            s.fabric
                .row(s.master)
                .u64_at(s.layout.head.offset(s.me()))
                .load(Ordering::Acquire)
                > s.fabric
                    .row(s.me())
                    .u64_at(s.layout.head.offset(s.me()))
                    .load(Ordering::Relaxed)
        });
    }
    Ok(())
}
