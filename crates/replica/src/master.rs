//! The master's replication path: append a record to every backup's log.
//!
//! **One-sided** (`Mode::OneSided`): for each backup `b` the master copies
//! the record into area `b` of its own row (the segment that backup `b`
//! maps), stores `head[b]` with `Release` and pushes both to `b`. The write
//! is acknowledged when the pushes to all backups have completed. No
//! backup code runs on this path.
//!
//! What "completed" means, honestly, per fabric: on **shm** a push is a
//! `Release` fence over memory the backup already maps, so once `push`
//! returns the bytes are in the backup's mapping, readable by it in place,
//! and they outlive the master's process (the backup holds the mapping).
//! They do not outlive the host: shm is one host, and the backups flush to
//! disk in the background. On **tcp** a push only hands bytes to the
//! kernel: a backup's echo thread reports the guard it sees applied
//! ([`Completion::Echo`]). On **ofi** the fabric's completion queue
//! reports each write delivered into the backup's memory
//! (`FI_DELIVERY_COMPLETE`): the master waits until no write to any
//! backup is outstanding ([`Completion::Queue`]), with no backup code on
//! the path, as with RDMA in the RAMCloud seed.
//!
//! **RPC** (`Mode::Rpc`): the same copy into area `b` is the request; the
//! backup's thread copies it into its own log and stores its own
//! `head[me]` (the reply); the master waits for every reply.
//!
//! **Disk durability** ([`Durability::Disk`], either mode, any fabric): a
//! write is acknowledged only once every backup's `durable` position (its
//! syncer's fdatasync) has passed it. With group commit the master
//! publishes the guard once per batch, when it starts waiting
//! ([`Master::complete`]), so a backup syncs a batch in one round.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use spindle_fabric::{Fabric, PeerSet};
use spindle_runtime::{monotonic_coarse_ns, IdleStrategy, Idler};

use crate::command::Replicator;
use crate::layout::{
    Completion, Durability, ReplicaLayout, COUNTER_APPENDS, COUNTER_FLOW_WAITS, ROLE_MASTER, ROLE_STOPPED,
};
use crate::record::{encode_into, encoded_len, RecordFields, RecordKind, HEADER_BYTES, KEY_BYTES_MAX};

/// How records reach the backups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The master writes into the backups' segments; backups' CPUs idle.
    OneSided,
    /// Two-sided baseline: each backup receives, copies, replies.
    Rpc,
}

impl Mode {
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "one-sided" | "onesided" => Ok(Mode::OneSided),
            "rpc" => Ok(Mode::Rpc),
            other => Err(format!("unknown mode '{other}': expected 'one-sided' or 'rpc'")),
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::OneSided => "one-sided",
            Mode::Rpc => "rpc",
        }
    }
}

/// How long the master waits on a live backup that makes no progress
/// (an fsync on a busy disk can take seconds) before failing the write.
pub const STALL_NS_MAX: u64 = 60_000_000_000;

/// How the master idles while it waits for the backups' fdatasync
/// (`Durability::Disk`): a sync takes from microseconds (page cache, tmpfs)
/// to milliseconds, so spin briefly, then park on the doorbell (the
/// syncers ring it); a park never lasts longer than 1 ms (a lost ring
/// costs at most that).
const DURABLE_WAIT_IDLE: IdleStrategy = IdleStrategy::Backoff {
    spins: 1_000,
    // No yields: a yielding thread receives nothing on tcp (see
    // ECHO_WAIT_IDLE); parked, it is woken by the syncer's frame.
    yields: 0,
    park: Duration::from_millis(1),
};

/// How the master idles while it waits for the backups' echoes or
/// replies over a fabric whose push is not a completion (tcp): spin only
/// briefly, then park on the sockets. The echo frame wakes this thread
/// itself; a yield loop would take the core from the backups that must
/// answer (on 2 shared cores, three backup processes and the master).
const ECHO_WAIT_IDLE: IdleStrategy = IdleStrategy::Backoff {
    spins: 200,
    yields: 0,
    park: Duration::from_millis(1),
};

/// The backup cell a parked wait watches.
#[derive(Clone, Copy)]
enum Watched {
    /// `durable`: positions on the backup's disk.
    Durable,
    /// The backup's own `head[b]`: its echo (one-sided) or reply (rpc).
    Echo,
}

/// Is member `rank` alive? (A crashed backup is dropped from the set.)
pub type Liveness = Box<dyn Fn(usize) -> bool + Send>;

/// The master's side of the log, over any fabric.
pub struct Master<F: Fabric> {
    fabric: Arc<F>,
    layout: ReplicaLayout,
    mode: Mode,
    epoch: u64,
    backups: Vec<usize>,
    head: u64,
    /// One record, encoded once, then copied to every backup (no
    /// allocation on the write path).
    staging: Vec<u8>,
    alive: Liveness,
    /// Give up on a backup that makes no progress for this long.
    stall_ns_max: u64,
    /// Group commit: appends do not wait for replies or echoes; the
    /// caller waits once with [`Master::complete`] before it reports any
    /// of them.
    deferred: bool,
    /// Group commit: appends whose guard is not published yet
    /// ([`Master::complete`] publishes it; disk durability, or one-sided
    /// appends whose bytes are not pushed yet either).
    guard_pending: bool,
    /// Group commit, one-sided: the log positions `[from, to)` written to
    /// the backups' areas but not pushed yet (within one segment), so
    /// that a batch goes out as one push per backup and segment instead
    /// of two per record. Pushed before the guard that covers them.
    unpushed: Option<(u64, u64)>,
    /// Disk durability: the log position every backup has on disk, as
    /// far as the master has waited for it.
    acknowledged: u64,
    /// Backups the epoch began with.
    set_size: usize,
}

impl<F: Fabric> Master<F> {
    /// Become master of `backups` in `epoch`: publishes the epoch and
    /// waits until every backup follows it with fresh state.
    pub fn start(
        fabric: Arc<F>,
        layout: ReplicaLayout,
        mode: Mode,
        epoch: u64,
        backups: Vec<usize>,
        value_bytes_max: usize,
        alive: Liveness,
    ) -> Result<Master<F>, String> {
        let me = fabric.member_rank();
        assert!(!backups.contains(&me), "the master is not its own backup");
        if layout.completion == Completion::Queue && backups.iter().any(|&b| fabric.pushes_completed(b).is_none()) {
            return Err(format!(
                "the fabric ({}) reports no write completions, which a replica with completion = queue waits on \
                 (ofi: open it with delivery_complete; tcp: use completion = echo)",
                fabric.describe()
            ));
        }
        let mut master = Master {
            fabric,
            layout,
            mode,
            epoch,
            backups: Vec::new(),
            head: 0,
            staging: vec![0u8; encoded_len(KEY_BYTES_MAX, value_bytes_max)],
            alive,
            stall_ns_max: STALL_NS_MAX,
            deferred: false,
            guard_pending: false,
            unpushed: None,
            acknowledged: 0,
            set_size: 0,
        };
        master.begin_epoch(epoch, backups)?;
        Ok(master)
    }

    /// Publish `epoch` with `backups` and wait until they follow it.
    fn begin_epoch(&mut self, epoch: u64, backups: Vec<usize>) -> Result<(), String> {
        let me = self.fabric.member_rank();
        let layout = &self.layout;
        let row = self.fabric.row(me);
        for b in 0..layout.members {
            row.u64_at(layout.head.offset(b)).store(0, Ordering::Relaxed);
        }
        let set = backups.iter().fold(0u64, |set, b| set | 1 << b);
        row.u64_at(layout.backup_set.offset()).store(set, Ordering::Relaxed);
        row.u64_at(layout.snapshot_end.offset()).store(0, Ordering::Relaxed);
        row.u64_at(layout.master_rank.offset())
            .store(me as u64, Ordering::Relaxed);
        row.u64_at(layout.role.offset()).store(ROLE_MASTER, Ordering::Relaxed);
        // Partner: the Acquire load of `epoch` by backups in `follow`:
        // seeing the new epoch they see the zeroed heads, the backup set
        // and the role.
        row.u64_at(layout.epoch.offset()).store(epoch, Ordering::Release);
        self.fabric
            .push(
                0..layout.areas.offset(),
                PeerSet::all_except(me, self.fabric.member_count()),
            )
            .map_err(|e| e.to_string())?;
        self.epoch = epoch;
        self.backups = backups;
        self.head = 0;
        self.guard_pending = false;
        self.acknowledged = 0;
        self.wait_backups_ready()?;
        // A backup that never followed holds nothing of this epoch and
        // claims nothing: only drops from here on need a roll.
        self.set_size = self.backups.len();
        Ok(())
    }

    /// End this epoch cleanly: publish `stopped = epoch + 1` and wait
    /// (bounded) until every live backup has sealed it to disk. With
    /// `final_stop` the role becomes *stopped*: backups then exit instead
    /// of waiting for a next epoch.
    pub fn end_epoch(&mut self, final_stop: bool) -> Result<(), String> {
        // Backups seal up to the guard: publish it first.
        self.publish_pending_guard()?;
        let me = self.fabric.member_rank();
        let layout = &self.layout;
        let row = self.fabric.row(me);
        if final_stop {
            row.u64_at(layout.role.offset()).store(ROLE_STOPPED, Ordering::Relaxed);
        }
        // Partner: the Acquire load of `stopped` by backups (node loop):
        // seeing it they see the role and every record published before.
        row.u64_at(layout.stopped.offset())
            .store(self.epoch + 1, Ordering::Release);
        self.fabric
            .push(
                0..layout.areas.offset(),
                PeerSet::all_except(me, self.fabric.member_count()),
            )
            .map_err(|e| e.to_string())?;
        let started = monotonic_coarse_ns();
        let mut i = 0;
        while i < self.backups.len() {
            let b = self.backups[i];
            // Partner: the Release store of `sealed_epoch` in Backup::seal.
            let sealed = self
                .fabric
                .row(b)
                .u64_at(self.layout.sealed_epoch.offset())
                .load(Ordering::Acquire);
            if sealed == self.epoch + 1 {
                i += 1;
                continue;
            }
            if !(self.alive)(b) {
                self.backups.remove(i);
                continue;
            }
            if monotonic_coarse_ns() - started > self.stall_ns_max {
                return Err(format!(
                    "backup {b} did not seal epoch {} within {} s (its sealed_epoch is {sealed})",
                    self.epoch,
                    self.stall_ns_max / 1_000_000_000
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }

    /// End this epoch ([`Master::end_epoch`]) and start the next with
    /// `backups`. The caller then appends the snapshot and
    /// [`RecordKind::SnapshotDone`].
    pub fn roll(&mut self, next: u64, backups: Vec<usize>) -> Result<(), String> {
        let me = self.fabric.member_rank();
        assert!(!backups.contains(&me), "the master is not its own backup");
        assert!(next > self.epoch, "epochs only grow: {next} after {}", self.epoch);
        self.end_epoch(false)?;
        self.begin_epoch(next, backups)
    }

    /// A backup of this epoch was dropped (dead or not answering): the
    /// epoch must roll before anything more is acknowledged.
    pub fn dropped(&self) -> bool {
        self.backups.len() < self.set_size
    }

    /// Append the epoch's `SnapshotDone` marker and publish where it ends:
    /// a backup that has everything up to there on disk no longer needs
    /// older epochs (it deletes them).
    pub fn append_snapshot_done(&mut self, version: u64) -> Result<(), String> {
        self.append_record(RecordKind::SnapshotDone, &[], &[], version)?;
        let me = self.fabric.member_rank();
        let cell = self.layout.snapshot_end.offset();
        // Partner: the Acquire load of `snapshot_end` by the backups'
        // flusher and seal.
        self.fabric.row(me).u64_at(cell).store(self.head, Ordering::Release);
        for &b in &self.backups {
            self.fabric
                .push(cell..cell + 8, PeerSet(1 << b))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Drop backups that died; returns how many are left.
    pub fn check_backups(&mut self) -> usize {
        let alive = &self.alive;
        self.backups.retain(|b| alive(*b));
        self.backups.len()
    }

    fn wait_backups_ready(&mut self) -> Result<(), String> {
        let started = monotonic_coarse_ns();
        loop {
            let mut missing = None;
            for &b in &self.backups {
                // Partner: the Release store of `ready_epoch` in the
                // backup's `follow`.
                if self
                    .fabric
                    .row(b)
                    .u64_at(self.layout.ready_epoch.offset())
                    .load(Ordering::Acquire)
                    != self.epoch + 1
                {
                    missing = Some(b);
                }
            }
            let Some(b) = missing else { return Ok(()) };
            if !(self.alive)(b) {
                self.backups.retain(|x| *x != b);
                continue;
            }
            if monotonic_coarse_ns() - started > self.stall_ns_max {
                return Err(format!(
                    "backup {b} did not follow epoch {} within {} s",
                    self.epoch,
                    STALL_NS_MAX / 1_000_000_000
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn head(&self) -> u64 {
        self.head
    }
    pub fn backups(&self) -> &[usize] {
        &self.backups
    }
    pub fn mode(&self) -> Mode {
        self.mode
    }
    pub fn durability(&self) -> Durability {
        self.layout.durability
    }
    /// Appends that had to wait for a backup (flow control or rpc reply).
    pub fn flow_waits(&self) -> u64 {
        let row = self.fabric.row(self.fabric.member_rank());
        row.u64_at(self.layout.counters.offset(COUNTER_FLOW_WAITS))
            .load(Ordering::Relaxed)
    }

    /// Flow control: wait until every backup has flushed enough segments
    /// for the ring to take bytes up to `end`.
    fn wait_writable(&mut self, end: u64) -> Result<(), String> {
        let geometry = self.layout.geometry;
        let cell = self.layout.flushed_segments.offset();
        let mut spins = 0u32;
        let mut started = 0u64;
        loop {
            // Partner: the Release store of `flushed_segments` in the
            // backup's flusher, after the segment's fsync.
            let blocked = self
                .backups
                .iter()
                .copied()
                .find(|b| !geometry.writable(end, self.fabric.row(*b).u64_at(cell).load(Ordering::Acquire)));
            let Some(b) = blocked else { return Ok(()) };
            if spins == 0 && self.guard_pending {
                // The flushers and syncers free slots only up to the
                // guard they see (group commit may hold it and the bytes
                // back): publish them, wake them.
                self.publish_pending_guard()?;
                self.fabric.doorbell().ring();
            }
            if let Err(waited_s) = self.stall(b, &mut spins, &mut started) {
                let flushed = self.fabric.row(b).u64_at(cell).load(Ordering::Acquire);
                return Err(format!(
                    "backup {b} is alive but flushed no segment for {waited_s} s (it has {flushed} on disk; the write needs segment {} and the ring holds {})",
                    geometry.segment_of(end.max(1) - 1),
                    geometry.segments_max
                ));
            }
        }
    }

    /// One idle step while waiting on backup `b`; drops `b` when it died.
    /// `Err(seconds)` once a live backup made no progress for too long.
    fn stall(&mut self, b: usize, spins: &mut u32, started: &mut u64) -> Result<(), u64> {
        *spins += 1;
        if *spins == 1 {
            self.count(COUNTER_FLOW_WAITS);
        }
        if *spins < 20_000 {
            std::hint::spin_loop();
            return Ok(());
        }
        if *started == 0 {
            *started = monotonic_coarse_ns();
        }
        if !(self.alive)(b) {
            self.backups.retain(|x| *x != b);
            return Ok(());
        }
        if monotonic_coarse_ns() - *started > self.stall_ns_max {
            return Err(self.stall_ns_max / 1_000_000_000);
        }
        std::thread::yield_now();
        Ok(())
    }

    fn count(&self, id: usize) {
        let c = self
            .fabric
            .row(self.fabric.member_rank())
            .u64_at(self.layout.counters.offset(id));
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Copy `len` bytes of staging to `position` of every backup's area.
    fn write_to_backups(&self, position: u64, len: usize) {
        let me = self.fabric.member_rank();
        let row = self.fabric.row(me);
        for &b in &self.backups {
            let at = self.layout.area_offset(b, position);
            // SAFETY:
            // - this is our own row;
            // - the bytes lie past head[b], which no backup reads before
            //   the Release store below publishes them, and flow control
            //   (wait_writable) proved every backup flushed this slot's
            //   previous segment, so nobody reads it any more;
            // - no other slice of these bytes is alive (single writer).
            let dst = unsafe { row.bytes_mut(at, len) };
            dst.copy_from_slice(&self.staging[..len]);
        }
    }

    /// Push the record's bytes to every backup, then the guard `new_head`
    /// — except with disk durability and group commit, where the guard
    /// waits for [`Master::complete`] (one sync round per batch).
    fn publish(&mut self, new_head: u64, range_from: u64) -> Result<(), String> {
        let guard_now = !(self.deferred && self.is_disk());
        if guard_now && self.guard_with_bytes() {
            for &b in &self.backups {
                self.publish_with_guard(b, range_from, new_head, new_head)?;
            }
            self.guard_pending = false;
            return Ok(());
        }
        // Every backup's bytes first, then every guard: on a fabric whose
        // writes to one peer go one at a time (libfabric's tcp provider),
        // the guard to `b` then waits only for `b`'s bytes, which were
        // issued beside the others', not for one backup after another.
        for &b in &self.backups {
            let at = self.layout.area_offset(b, range_from);
            let end = self.layout.area_offset(b, new_head - 1) + 1;
            if end > at {
                self.fabric.push(at..end, PeerSet(1 << b)).map_err(|e| e.to_string())?;
            }
        }
        if guard_now {
            for &b in &self.backups {
                self.publish_guard(b, new_head)?;
            }
        }
        self.guard_pending = !guard_now;
        Ok(())
    }

    /// Whether a backup's bytes and guard go out in one
    /// [`Fabric::push_vectored`]: over tcp (`Completion::Echo`), one
    /// `sendmsg` and one wake-up of the backup's echo thread per write
    /// instead of two, the first of which found nothing to echo. Not on
    /// ofi, whose writes to one peer go one at a time (see `publish`), nor
    /// on shm, where a push is a fence.
    fn guard_with_bytes(&self) -> bool {
        self.layout.completion == Completion::Echo
    }

    /// Store `head[b] = guard`, then push `b`'s area from log position
    /// `from` to `to` (nothing when empty) and the guard behind it, in one
    /// vectored push.
    fn publish_with_guard(&self, b: usize, from: u64, to: u64, guard: u64) -> Result<(), String> {
        let row = self.fabric.row(self.fabric.member_rank());
        let cell = self.layout.head.offset(b);
        // Partner: the Acquire load of head[b] by backup b (flusher,
        // syncer, rpc copier, echo, seal). Stored after the bytes below
        // it; the push applies them at b before the guard.
        row.u64_at(cell).store(guard, Ordering::Release);
        let at = self.layout.area_offset(b, from);
        let end = if to > from {
            self.layout.area_offset(b, to - 1) + 1
        } else {
            at
        };
        self.fabric
            .push_vectored(&[at..end, cell..cell + 8], PeerSet(1 << b))
            .map_err(|e| e.to_string())
    }

    /// Store and push `head[b] = guard` (after the bytes below it).
    fn publish_guard(&self, b: usize, guard: u64) -> Result<(), String> {
        let row = self.fabric.row(self.fabric.member_rank());
        let cell = self.layout.head.offset(b);
        // Partner: the Acquire load of head[b] by backup b (flusher,
        // syncer, rpc copier, echo, seal). Store after the bytes, push
        // after them.
        row.u64_at(cell).store(guard, Ordering::Release);
        self.fabric
            .push(cell..cell + 8, PeerSet(1 << b))
            .map_err(|e| e.to_string())
    }

    /// Publish the guard of appends made with group commit (disk, or
    /// one-sided with their bytes: the bytes first).
    fn publish_pending_guard(&mut self) -> Result<(), String> {
        if !self.guard_pending {
            debug_assert!(self.unpushed.is_none(), "unpushed bytes always have a pending guard");
            return Ok(());
        }
        match self.unpushed.take() {
            Some((from, to)) if self.guard_with_bytes() => {
                for &b in &self.backups {
                    self.publish_with_guard(b, from, to, self.head)?;
                }
            }
            unpushed => {
                if let Some((from, to)) = unpushed {
                    self.publish_range(from, to)?;
                }
                for &b in &self.backups {
                    self.publish_guard(b, self.head)?;
                }
            }
        }
        self.guard_pending = false;
        Ok(())
    }

    fn is_disk(&self) -> bool {
        self.layout.durability == Durability::Disk
    }

    /// Disk durability: wait until every backup's `durable` position has
    /// reached `head`: spin briefly, then park on the doorbell, which the
    /// syncers ring after publishing (bounded parks). A dead backup is
    /// dropped (the live ones have the write on disk); with none left, or
    /// a live one that syncs nothing for `stall_ns_max`, the write fails.
    fn wait_durable(&mut self, head: u64) -> Result<(), String> {
        // Wake parked syncers (tcp: send the guard pushed above now).
        self.fabric.doorbell().ring();
        self.wait_parked(head, Watched::Durable)?;
        if self.backups.is_empty() {
            // Every backup died before syncing: the write is on no disk.
            return Err("no live backup left: the write is on no backup's disk, so it is not acknowledged".into());
        }
        self.acknowledged = head;
        Ok(())
    }

    /// Wait until every live backup's `watched` cell reached `head`,
    /// idling on the doorbell (a fabric that receives on a parked thread,
    /// tcp, wakes it with the frame that moves the cell: one wake-up, no
    /// spinning thread beside the backups' on a shared core). A backup
    /// found dead at a park is dropped; one alive that does not move for
    /// `stall_ns_max` fails the wait.
    fn wait_parked(&mut self, head: u64, watched: Watched) -> Result<(), String> {
        let mut idler = Idler::new(match watched {
            Watched::Durable => DURABLE_WAIT_IDLE,
            Watched::Echo => ECHO_WAIT_IDLE,
        });
        let mut parks_checked = 0;
        let mut counted = false;
        let started = monotonic_coarse_ns();
        let mut i = 0;
        while i < self.backups.len() {
            let b = self.backups[i];
            let cell = match watched {
                Watched::Durable => self.layout.durable.offset(),
                Watched::Echo => self.layout.head.offset(b),
            };
            // Partner: the Release store of `durable` in the backup's
            // syncer (`Shared::sync`), after its fdatasync; or of its own
            // head[b] in its echo thread or rpc copier (its reply).
            let reached = |m: &Self| m.fabric.row(b).u64_at(cell).load(Ordering::Acquire);
            if reached(self) >= head {
                i += 1;
                continue;
            }
            if !counted && matches!(watched, Watched::Echo) {
                // As the spinning wait counted it: a write that waited
                // on a backup's reply.
                counted = true;
                self.count(COUNTER_FLOW_WAITS);
            }
            if idler.parks > parks_checked {
                // At most once per park (≤ 1 ms): a liveness check can
                // be a system call.
                parks_checked = idler.parks;
                if !(self.alive)(b) {
                    self.backups.remove(i);
                    continue;
                }
                if monotonic_coarse_ns() - started > self.stall_ns_max {
                    let what = match watched {
                        Watched::Durable => "synced nothing to disk",
                        Watched::Echo => "did not reply",
                    };
                    return Err(format!(
                        "backup {b} is alive but {what} for {} s (at {}, the write ends at {head})",
                        self.stall_ns_max / 1_000_000_000,
                        reached(self)
                    ));
                }
            }
            idler.idle(0, self.fabric.doorbell(), || reached(self) >= head);
        }
        Ok(())
    }

    /// RPC mode: wait until every backup replied (copied up to `head`);
    /// one-sided with `Completion::Echo`: until every echo reached `head`.
    fn wait_replies(&mut self, head: u64) -> Result<(), String> {
        if self.is_disk() {
            return self.wait_durable(head);
        }
        if self.mode == Mode::OneSided && self.layout.completion == Completion::Queue {
            return self.wait_write_completions();
        }
        if self.layout.completion == Completion::Echo {
            // tcp: the echo or the reply comes back as a frame; park on
            // the sockets for it rather than spin and yield beside the
            // backups' threads.
            return self.wait_parked(head, Watched::Echo);
        }
        let mut i = 0;
        let mut spins = 0u32;
        let mut started = 0u64;
        while i < self.backups.len() {
            let b = self.backups[i];
            // Partner: the Release store of the backup's own head[b] (its
            // reply) in the rpc copier or the echo thread.
            let copied = self
                .fabric
                .row(b)
                .u64_at(self.layout.head.offset(b))
                .load(Ordering::Acquire);
            if copied >= head {
                i += 1;
                continue;
            }
            let before = self.backups.len();
            self.stall(b, &mut spins, &mut started)
                .map_err(|s| format!("backup {b} is alive but did not reply for {s} s"))?;
            if self.backups.len() < before {
                continue;
            }
        }
        Ok(())
    }

    /// One-sided with `Completion::Queue`: wait until the fabric reports
    /// every write issued so far to every live backup delivered into its
    /// memory. No backup code runs for it.
    fn wait_write_completions(&mut self) -> Result<(), String> {
        let mut i = 0;
        let mut spins = 0u32;
        let mut started = 0u64;
        while i < self.backups.len() {
            let b = self.backups[i];
            match self.fabric.pushes_completed(b) {
                Some(true) => {
                    i += 1;
                    continue;
                }
                Some(false) => {}
                None => {
                    return Err(format!(
                        "the fabric ({}) reports no write completions for backup {b}",
                        self.fabric.describe()
                    ))
                }
            }
            let before = self.backups.len();
            self.stall(b, &mut spins, &mut started)
                .map_err(|s| format!("backup {b} is alive but the writes to it did not complete for {s} s"))?;
            if self.backups.len() < before {
                continue;
            }
        }
        Ok(())
    }

    /// Append one record; returns when it is acknowledged (see module docs).
    pub fn append_record(&mut self, kind: RecordKind, key: &[u8], value: &[u8], version: u64) -> Result<(), String> {
        self.append_in_batch(kind, key, value, version, 0)
    }

    /// Append one record of a batch that has `batch_rest` more records
    /// after it (replay applies a batch whole or not at all).
    pub fn append_in_batch(
        &mut self,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        version: u64,
        batch_rest: u32,
    ) -> Result<(), String> {
        if self.backups.is_empty() {
            return Err("no live backup left: writes are refused rather than left unreplicated".into());
        }
        if !self.deferred {
            // A guard published below must not cover bytes a batch left
            // unpushed.
            self.publish_pending_guard()?;
        }
        let len = encoded_len(key.len(), value.len());
        if len > self.staging.len() {
            return Err(format!(
                "record of {len} bytes is larger than the largest allowed ({})",
                self.staging.len()
            ));
        }
        let placement = self.layout.geometry.place(self.head, len);
        self.wait_writable(placement.new_head)?;
        let from = match placement.pad_at {
            Some(pad) => {
                let n = encode_into(
                    &mut self.staging,
                    &RecordFields::single(RecordKind::Pad, self.epoch, pad, 0, &[], &[]),
                );
                debug_assert_eq!(n, HEADER_BYTES);
                self.write_to_backups(pad, n);
                pad
            }
            None => placement.record_at,
        };
        let n = encode_into(
            &mut self.staging,
            &RecordFields {
                kind,
                epoch: self.epoch,
                position: placement.record_at,
                version,
                key,
                value,
                batch_rest,
            },
        );
        self.write_to_backups(placement.record_at, n);
        if self.defers_pushes() {
            self.defer_push(from, placement.record_at, placement.new_head)?;
        } else {
            if from != placement.record_at {
                // The pad sits in the previous segment: push it on its own.
                self.publish_range(from, from + HEADER_BYTES as u64)?;
            }
            self.publish(placement.new_head, placement.record_at)?;
        }
        self.head = placement.new_head;
        if self.mode == Mode::Rpc {
            // A request wakes a parked receiver, as an RPC must.
            self.fabric.doorbell().ring();
        }
        if self.waits_for_backups() && !self.deferred {
            self.wait_replies(self.head)?;
        }
        self.count(COUNTER_APPENDS);
        Ok(())
    }

    /// Group commit of one-sided appends: their bytes and guard go out
    /// together at [`Master::complete`] (or when flow control waits), one
    /// push per backup and segment. Rpc keeps one request per record, as
    /// the baseline it stands for.
    fn defers_pushes(&self) -> bool {
        self.deferred && self.mode == Mode::OneSided
    }

    /// Add a deferred append's bytes (a pad at `from` when it differs from
    /// `record_at`, then the record up to `new_head`) to the unpushed run;
    /// a run never spans segments, so a pad closes it (pushed now).
    fn defer_push(&mut self, from: u64, record_at: u64, new_head: u64) -> Result<(), String> {
        // Appends are contiguous, but for a segment's tail too short for a
        // pad's header: no pad is written there, readers skip it by rule
        // (`LogGeometry::place`), and the append starts the next segment.
        let follows = |end: u64| {
            from == end
                || (self.layout.geometry.segment_remaining(end) < HEADER_BYTES
                    && from == end + self.layout.geometry.segment_remaining(end) as u64)
        };
        debug_assert!(
            follows(self.head),
            "appends are contiguous: {from} after head {}",
            self.head
        );
        let run_from = match self.unpushed {
            Some((run_from, run_to)) => {
                debug_assert!(follows(run_to), "the unpushed run ({run_to}) ends at the head ({from})");
                run_from
            }
            None => from,
        };
        let segment = |p: u64| self.layout.geometry.segment_of(p);
        if from != record_at {
            // The pad ends the run in the previous segment.
            self.publish_range(run_from, from + HEADER_BYTES as u64)?;
            self.unpushed = Some((record_at, new_head));
        } else if segment(run_from) != segment(new_head - 1) {
            // The record starts a new segment (the last one ended exactly
            // at its end): the run so far stays in its own segment.
            if run_from < from {
                self.publish_range(run_from, from)?;
            }
            self.unpushed = Some((record_at, new_head));
        } else {
            self.unpushed = Some((run_from, new_head));
        }
        self.guard_pending = true;
        Ok(())
    }

    /// Whether an append completes only when backups answer or the
    /// fabric reports completions (rpc, one-sided with `Completion::Echo`
    /// or `Completion::Queue`, or disk durability).
    pub fn waits_for_backups(&self) -> bool {
        self.mode == Mode::Rpc || self.layout.completion != Completion::Push || self.is_disk()
    }

    /// Group commit on or off. On, an append returns once its record is
    /// written and published, without waiting for the backups' replies or
    /// echoes; [`Master::complete`] then waits once for all of them. The
    /// caller must not report any of those appends (nor let anyone else
    /// read their effects) before `complete` returns. No effect on shm
    /// one-sided with memory durability, where a push is already the
    /// completion. With disk durability the guard, too, waits for
    /// `complete`: the backups then sync the whole batch in one round.
    pub fn set_deferred(&mut self, on: bool) {
        self.deferred = on;
    }

    /// Wait until every backup has everything appended so far (disk
    /// durability: on its disk).
    pub fn complete(&mut self) -> Result<(), String> {
        self.publish_pending_guard()?;
        if self.is_disk() {
            // Even with no backup left: a write past `acknowledged` is
            // on no disk yet (an error then).
            if self.head > self.acknowledged {
                return self.wait_durable(self.head);
            }
            return Ok(());
        }
        if self.waits_for_backups() && !self.backups.is_empty() {
            self.wait_replies(self.head)?;
        }
        Ok(())
    }

    /// Fault injection (tests and `spindle sim`-style checks): behave as
    /// a master that dies in the middle of an append — write only the
    /// first `cut_bytes` of the record, to the first `backups_reached`
    /// backups, and publish nothing. The caller then drops the master
    /// (its member leaves: the backups see it gone).
    pub fn append_torn(
        &mut self,
        key: &[u8],
        value: &[u8],
        version: u64,
        cut_bytes: usize,
        backups_reached: usize,
    ) -> Result<(), String> {
        let len = encoded_len(key.len(), value.len());
        let placement = self.layout.geometry.place(self.head, len);
        self.wait_writable(placement.new_head)?;
        let n = encode_into(
            &mut self.staging,
            &RecordFields::single(RecordKind::Put, self.epoch, placement.record_at, version, key, value),
        );
        let cut = cut_bytes.min(n);
        let row = self.fabric.row(self.fabric.member_rank());
        for &b in self.backups.iter().take(backups_reached) {
            let at = self.layout.area_offset(b, placement.record_at);
            // SAFETY: as in write_to_backups: own row, unpublished bytes
            // that flow control freed, single writer.
            let dst = unsafe { row.bytes_mut(at, cut) };
            dst.copy_from_slice(&self.staging[..cut]);
        }
        Ok(())
    }

    fn publish_range(&self, from: u64, to: u64) -> Result<(), String> {
        for &b in &self.backups {
            let at = self.layout.area_offset(b, from);
            self.fabric
                .push(at..at + (to - from) as usize, PeerSet(1 << b))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl<F: Fabric> Replicator for Master<F> {
    fn append(
        &mut self,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        version: u64,
        batch_rest: u32,
    ) -> Result<(), String> {
        self.append_in_batch(kind, key, value, version, batch_rest)
    }
}
