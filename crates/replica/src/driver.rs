//! The runtime around a member's [`Failover`] engine: one thread that,
//! every tick, reads every member's failover words from the rows, takes
//! the time, steps the engine and publishes this member's words (pushed to
//! every peer when they change, and at least every heartbeat).
//!
//! ```text
//!  driver thread (tick ≤ 1 ms)            data path (node loop, server)
//!  ─────────────────────────              ──────────────────────────────
//!  rows ← fo_* of every member            view(): promised (epoch, master), leading?
//!  now  ← CLOCK_MONOTONIC (after reading) lead / follow / roll / establish (under the lock)
//!  engine.step(rows, now)                 may_answer(): now < answer_until_ns
//!  answer_until_ns ← lease end if it may  (one atomic load and a clock read per batch)
//!  publish own fo_* (Release) + push
//! ```
//!
//! On shm a member's death is certain (its process is gone): the driver
//! tells the engine, which then need not wait out that master's lease. On
//! tcp nothing is certain and only the timers count.
//!
//! **Ticks.** While anything moves (a promise, a campaign, an established
//! epoch, in any row or in this member's own words, a view, a death) the
//! driver ticks every [`TICK_MAX`]. Once no word but the heartbeats
//! changed for [`QUIET_AFTER_TICKS`] ticks and no one campaigns, it ticks
//! every `heartbeat / 4`, within `[TICK_MAX, TICK_QUIET_MAX]` (4 ms with
//! the default 400 ms lease: a heartbeat of 25 ms is sent, seen and echoed
//! a few ms late, of a 400 ms lease). On shm a follower waits between ticks on its master's pidfd
//! ([`crate::liveness::ProcessWatch`]), so the master's death wakes it at
//! once, quiet or not. At a fixed 1 ms, each driver of an idle shm service
//! was about 2% of a core.
//!
//! The thread holds only a weak reference: it ends once the node and its
//! leader are dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use spindle_fabric::PeerSet;
use spindle_runtime::monotonic_ns;

use crate::failover::{ControlRow, Failover, StepDown, Timing};
use crate::layout::{ReplicaLayout, FAILOVER_WORDS};
use crate::liveness::ProcessWatch;
use crate::node::Membership;

/// The longest the driver sleeps between ticks while anything moves.
pub const TICK_MAX: Duration = Duration::from_millis(1);
/// The longest tick of a quiet group (see the module docs).
pub const TICK_QUIET_MAX: Duration = Duration::from_millis(4);
/// Ticks with nothing but heartbeats moving after which a group is quiet.
pub const QUIET_AFTER_TICKS: u32 = 32;
/// How often the driver looks for dead processes (shm), at most.
const DEATH_CHECK_NS: u64 = 5_000_000;

/// One member's failover engine and the thread that drives it.
pub struct Driver<F: Membership> {
    fabric: Arc<F>,
    layout: ReplicaLayout,
    engine: Mutex<Failover>,
    /// The master may answer clients until this time (its clock); 0: not.
    /// Written by the driver after each step.
    answer_until_ns: AtomicU64,
    /// Set once the engine stepped down as master.
    stepped_down: AtomicBool,
    /// This member follows epoch `e` as a backup: `e + 1` (0: none).
    backup_of: AtomicU64,
    /// Rpc mode: a backup's log is its own copy (its own `head[me]`).
    rpc: bool,
    /// The thread waiting on this member's view ([`Driver::wait_view`]),
    /// unparked when a tick moves it.
    view_waiter: Mutex<Option<std::thread::Thread>>,
}

/// The epoch this member leads (not while rolling) and the epoch and
/// master it promised: what its data path follows.
pub type View = (Option<u64>, (u64, usize));

/// What one tick saw.
struct TickSeen {
    /// The step moved the view.
    view_moved: bool,
    /// The members found gone for certain in this tick (a bit per rank).
    gone: u64,
}

fn view_of(engine: &Failover) -> View {
    let leading = engine.leading().filter(|_| engine.rolling_to().is_none());
    (leading, engine.promised())
}

impl<F: Membership + 'static> Driver<F> {
    /// Start the driver of a member that begins with `master` leading
    /// `epoch`.
    pub fn start(
        fabric: Arc<F>,
        layout: ReplicaLayout,
        timing: Timing,
        epoch: u64,
        master: usize,
        mode: crate::master::Mode,
    ) -> Result<Arc<Driver<F>>, String> {
        let engine = Failover::new(
            fabric.member_rank(),
            fabric.member_count(),
            timing,
            epoch,
            master,
            monotonic_ns(),
        )
        .map_err(|e| e.to_string())?;
        let driver = Arc::new(Driver {
            fabric,
            layout,
            engine: Mutex::new(engine),
            answer_until_ns: AtomicU64::new(0),
            stepped_down: AtomicBool::new(false),
            backup_of: AtomicU64::new(0),
            rpc: mode == crate::master::Mode::Rpc,
            view_waiter: Mutex::new(None),
        });
        driver.publish(true);
        let weak: Weak<Driver<F>> = Arc::downgrade(&driver);
        std::thread::Builder::new()
            .name(format!("spindle-failover-{}", driver.fabric.member_rank()))
            .spawn(move || run(weak))
            .map_err(|e| format!("start the failover thread: {e}"))?;
        Ok(driver)
    }
}

fn run<F: Membership>(weak: Weak<Driver<F>>) {
    let mut last_push_ns = 0u64;
    let mut last_death_check_ns = 0u64;
    let mut sent = ControlRow::default();
    // This tick's rows and the last tick's (two buffers, swapped each
    // tick: no allocation per tick), and for how many ticks nothing but
    // the heartbeats moved in them (module docs: ticks).
    let mut rows: Vec<ControlRow> = Vec::new();
    let mut rows_last: Vec<ControlRow> = Vec::new();
    let mut still_ticks = 0u32;
    // The members seen gone for certain so far (a new death is movement).
    let mut gone_seen = 0u64;
    let mut master_watch: Option<ProcessWatch> = None;
    let mut master_died = false;
    loop {
        let Some(driver) = weak.upgrade() else { return };
        let timing = driver.engine().timing();
        let seen = driver.tick(&mut last_death_check_ns, &mut rows);
        let row = driver.engine().row();
        let now = monotonic_ns();
        let due = now.saturating_sub(last_push_ns) >= timing.heartbeat_ns;
        let words = |r: &ControlRow| (r.promise, r.established, r.campaign);
        // Our own words moved in this tick (a campaign started, a promise
        // given) or by the data path since the last (a roll, an epoch
        // established): the peers answer, so stay fast.
        let own_moved = words(&row) != words(&sent);
        if row != sent || due {
            driver.publish(true);
            sent = row;
            last_push_ns = now;
        }
        let new_death = seen.gone & !gone_seen != 0;
        gone_seen |= seen.gone;
        let moved = seen.view_moved
            || own_moved
            || new_death
            || master_died
            || rows.len() != rows_last.len()
            || rows.iter().zip(&rows_last).any(|(a, b)| words(a) != words(b));
        let campaigning = rows.iter().any(|r| r.campaign != 0);
        still_ticks = if moved || campaigning {
            0
        } else {
            still_ticks.saturating_add(1)
        };
        std::mem::swap(&mut rows, &mut rows_last);
        let tick = if still_ticks >= QUIET_AFTER_TICKS {
            quiet_tick(&timing)
        } else {
            TICK_MAX
        };
        let me = driver.fabric.member_rank();
        let (_, master) = driver.engine().promised();
        let master_pid = if master == me {
            None
        } else {
            driver.fabric.member_pid(master)
        };
        drop(driver);
        match master_pid {
            Some(pid) => {
                if master_watch.as_ref().map(ProcessWatch::pid) != Some(pid) {
                    master_watch = Some(ProcessWatch::new(pid));
                }
                let watch = master_watch.as_mut().expect("just set");
                // A death ends the wait at once; the next tick finds the
                // master gone, and ticks fast from then on (the watch
                // only sleeps once it said so).
                master_died = watch.wait_exit(tick);
            }
            None => {
                master_died = false;
                std::thread::sleep(tick);
            }
        }
    }
}

/// A quiet group's tick: `heartbeat / 4` within `[TICK_MAX, TICK_QUIET_MAX]`.
fn quiet_tick(timing: &Timing) -> Duration {
    let quarter_ns = timing.heartbeat_ns / 4;
    Duration::from_nanos(quarter_ns.clamp(TICK_MAX.as_nanos() as u64, TICK_QUIET_MAX.as_nanos() as u64))
}

impl<F: Membership> Driver<F> {
    /// The engine, locked (held briefly: a step is a few hundred ns).
    pub fn engine(&self) -> MutexGuard<'_, Failover> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every member's failover words into `rows` (its capacity reused).
    fn read_rows(&self, rows: &mut Vec<ControlRow>) {
        let col = &self.layout.failover;
        rows.clear();
        rows.extend((0..self.fabric.member_count()).map(|r| {
            let row = self.fabric.row(r);
            // Partner: the Release stores in `publish`, by member r.
            let w = |i: usize| row.u64_at(col.offset(i)).load(Ordering::Acquire);
            ControlRow {
                promise: w(0),
                beat: w(1),
                established: w(2),
                campaign: w(3),
            }
        }));
    }

    /// One step of the engine ([`TickSeen`]; a waiter on the view was
    /// woken if it moved).
    fn tick(&self, last_death_check_ns: &mut u64, rows: &mut Vec<ControlRow>) -> TickSeen {
        self.read_rows(rows);
        let mut engine = self.engine();
        let view_before = view_of(&engine);
        let mut gone = 0u64;
        // The master we follow every tick (its death starts a failover),
        // everyone every DEATH_CHECK_NS (at the first tick after).
        let me = self.fabric.member_rank();
        let master = engine.promised().1;
        if master != me && self.fabric.member_gone(master) {
            engine.handle_dead(master);
            gone |= 1 << master;
        }
        if monotonic_ns().saturating_sub(*last_death_check_ns) >= DEATH_CHECK_NS {
            *last_death_check_ns = monotonic_ns();
            for r in (0..self.fabric.member_count()).filter(|r| *r != me) {
                if self.fabric.member_gone(r) {
                    engine.handle_dead(r);
                    gone |= 1 << r;
                }
            }
        }
        // The time is taken after the rows were read (a follower's timer
        // must not start before what it saw).
        let now = monotonic_ns();
        engine.step(rows, now);
        // A backup of epoch e claims e once its log holds e's whole snapshot.
        let backup_of = self.backup_of.load(Ordering::Acquire);
        if let Some(e) = backup_of.checked_sub(1) {
            let (promised, master) = engine.promised();
            if promised == e && self.holds_snapshot(master, e) {
                engine.note_data(e);
            }
        }
        let until = if engine.can_ack(now) {
            engine.lease_until_ns()
        } else {
            0
        };
        // Partner: the Acquire load in `may_answer`.
        self.answer_until_ns.store(until, Ordering::Release);
        if engine.stepped_down().is_some() && engine.leading().is_none() {
            // Partner: the Acquire load in `stepped_down`.
            self.stepped_down.store(true, Ordering::Release);
        }
        let view_moved = view_of(&engine) != view_before;
        drop(engine);
        if view_moved {
            self.wake_view_waiter();
        }
        TickSeen { view_moved, gone }
    }

    /// The view the data path follows now ([`View`]).
    pub fn view(&self) -> View {
        view_of(&self.engine())
    }

    /// Make the calling thread the one [`Driver::wait_view`] wakes.
    pub fn watch_view(&self) {
        *self.view_waiter.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current());
    }

    /// Sleep up to `timeout`, or until a tick moves the view (for the
    /// thread that called [`Driver::watch_view`]; a wake that came before
    /// the wait ends it at once, so none is lost). Spurious returns happen:
    /// the caller looks again.
    pub fn wait_view(&self, timeout: Duration) {
        std::thread::park_timeout(timeout);
    }

    fn wake_view_waiter(&self) {
        if let Some(waiter) = self.view_waiter.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            waiter.unpark();
        }
    }

    /// Whether this member's copy of `master`'s log of `epoch` reaches past
    /// the epoch's snapshot (`SnapshotDone` included).
    fn holds_snapshot(&self, master: usize, epoch: u64) -> bool {
        let row = self.fabric.row(master);
        let me = self.fabric.member_rank();
        // Partner: the Release store of `epoch` in Master::begin_epoch (it
        // zeroes `snapshot_end` and the heads before).
        let e1 = row.u64_at(self.layout.epoch.offset()).load(Ordering::Acquire);
        // Partner: the Release store in Master::append_snapshot_done.
        let end = row.u64_at(self.layout.snapshot_end.offset()).load(Ordering::Acquire);
        let head = if self.rpc {
            // Our own copy: our `head[me]`, the positions we copied (our reply).
            let mine = self.fabric.row(me);
            // Partner: our copier's Release store of its reply.
            mine.u64_at(self.layout.head.offset(me)).load(Ordering::Acquire)
        } else {
            // Partner: the master's Release store of the guard after the bytes.
            row.u64_at(self.layout.head.offset(me)).load(Ordering::Acquire)
        };
        let e2 = row.u64_at(self.layout.epoch.offset()).load(Ordering::Acquire);
        e1 == epoch && e2 == epoch && end > 0 && head >= end
    }

    /// Store this member's failover words (Release) and push them.
    fn publish(&self, push: bool) {
        let row = self.engine().row();
        let me = self.fabric.member_rank();
        let mine = self.fabric.row(me);
        let col = &self.layout.failover;
        for (i, w) in [row.promise, row.beat, row.established, row.campaign]
            .into_iter()
            .enumerate()
        {
            // Partner: the Acquire loads in `read_rows`, by every member.
            mine.u64_at(col.offset(i)).store(w, Ordering::Release);
        }
        if push {
            let range = col.offset(0)..col.offset(0) + FAILOVER_WORDS * 8;
            // A peer that is gone is reported by the fabric's own checks.
            let _ = self
                .fabric
                .push(range, PeerSet::all_except(me, self.fabric.member_count()));
        }
    }

    /// Publish now (after a change made by the data path: a roll asked,
    /// an epoch established), without waiting for the next tick.
    pub fn publish_now(&self) {
        self.publish(true);
    }

    /// Whether the master may answer a client now (its lease holds and its
    /// epoch is established at a majority).
    pub fn may_answer(&self) -> bool {
        // Partner: the Release store in `tick`.
        monotonic_ns() < self.answer_until_ns.load(Ordering::Acquire)
    }

    /// Why this member stopped being the master, once it did.
    pub fn stepped_down(&self) -> Option<StepDown> {
        // Partner: the Release store in `tick`.
        if self.stepped_down.load(Ordering::Acquire) {
            self.engine().stepped_down().or(Some(StepDown::LeaseLost))
        } else {
            None
        }
    }

    /// This member follows epoch `epoch` as a backup (`None`: not a backup).
    pub fn set_backup_of(&self, epoch: Option<u64>) {
        // Partner: the Acquire load in `tick`.
        self.backup_of.store(epoch.map_or(0, |e| e + 1), Ordering::Release);
    }

    /// Whether `rank` answers this master (see [`Failover::responsive`]).
    pub fn responsive(&self, rank: usize) -> bool {
        self.engine().responsive(rank, monotonic_ns())
    }

    pub fn timing(&self) -> Timing {
        self.engine().timing()
    }
}
