//! The dispatcher (see [`RtNode::run`]): releases every job at its time,
//! runs channel and computation tasks, detects misses, and runs the
//! watchdog beside it ([`crate::watchdog`]); what a run measured.

use std::sync::atomic::Ordering;

use spindle_fabric::Fabric;
use spindle_runtime::monotonic_ns;

use super::{Active, RtNode, TaskContext, TaskRef};
use crate::dispatch::{DispatchCore, Job, Poll};
use crate::layout;
use crate::spin::SpinPolicy;
use crate::watchdog::{self, Timetable, WatchdogConfig, WatchdogShared};

/// A deadline miss, reported through the run's callback.
#[derive(Debug, Clone)]
pub struct MissReport {
    pub task: String,
    pub period: u64,
    pub kind: MissKind,
    /// Global time it was detected, and the job's deadline.
    pub detected_ns: u64,
    pub deadline_ns: u64,
    /// The last global time the job could have started and still met its
    /// deadline (`deadline − compute`).
    pub critical_start_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissKind {
    /// Dropped at its critical start time, before its deadline.
    Early,
    /// Started in time but finished after the deadline.
    Overrun,
    /// A receive task found no message for its period.
    MessageMissing,
    /// A receive task found the slot overwritten while copying.
    MessageTorn,
    /// Not started by its critical start time: the dispatcher was busy or
    /// stalled. Reported by the watchdog at that time (before the deadline).
    NotStarted,
}

/// What a run counted (the same figures a member reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunCounters {
    pub released: u64,
    pub completed: u64,
    pub missed_early: u64,
    /// Of `missed_early`: the jobs the watchdog reported (the dispatcher
    /// had not started them at their critical start time).
    #[serde(default)]
    pub missed_by_watchdog: u64,
    pub overruns: u64,
    pub messages_moved: u64,
    pub messages_missing: u64,
    pub messages_torn: u64,
    /// Of `messages_moved`: taken by a receive job from the previous
    /// period's slot, because that period's receive was missed or found
    /// no message yet (see `RtNode::receive_job`).
    #[serde(default)]
    pub messages_caught_up: u64,
    pub receive_overflow: u64,
    /// Jobs run while the clock's bound exceeded the budget (or it was unsynced).
    pub clock_over_budget: u64,
    /// Largest clock bound seen at a job start.
    pub clock_bound_ns_max: u64,
    /// Releases more than 10 µs late, by cause: the sleep woke later than
    /// the spin window covers; it woke in time but the spin was
    /// interrupted (the thread lost its CPU while spinning); or there was
    /// no sleep at all (the release was already due when the dispatcher
    /// got to it).
    #[serde(default)]
    pub late_wakes_sleep: u64,
    #[serde(default)]
    pub late_wakes_spin: u64,
    #[serde(default)]
    pub late_wakes_no_sleep: u64,
    /// Interference seen during the run (see [`crate::interference`]):
    /// the longest the dispatcher lost its CPU at once while spinning, or
    /// a job ran beyond its compute time; the latest release; and how many
    /// of these observations exceeded what admission assumed.
    #[serde(default)]
    pub interference_lost_max_ns: u64,
    #[serde(default)]
    pub release_late_max_ns: u64,
    #[serde(default)]
    pub interference_over_admitted: u64,
}

/// What a run measured (preallocated at commit; no allocation during the run).
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Wake-up lateness of each release the dispatcher slept for (ns).
    pub release_jitter_ns: Vec<u64>,
    /// Start − release of every job run (ns; includes queueing behind a job).
    pub start_delay_ns: Vec<u64>,
    /// Execution time of each channel send / receive job (host ns).
    pub send_exec_ns: Vec<u64>,
    pub receive_exec_ns: Vec<u64>,
    pub counters: RunCounters,
    /// The widest spin window used before a release, and the last one.
    pub spin_window_max_ns: u64,
    pub spin_window_end_ns: u64,
    /// Sum of the windows used, and how many waits used one (for the mean).
    pub spin_window_sum_ns: u64,
    pub spin_waits: u64,
}

impl<F: Fabric> RtNode<F> {
    /// Attach a watchdog to the following runs (see [`crate::watchdog`]):
    /// a second thread that reports, at its critical start time, every job
    /// the dispatcher has not started by then (the dispatcher stalled).
    pub fn set_watchdog(&mut self, config: Option<WatchdogConfig>) {
        self.watchdog = config;
    }

    /// Run the dispatcher on the calling thread until every task has run
    /// its periods. `on_miss` hears of every miss the dispatcher detects
    /// as it detects it; with a watchdog (see [`RtNode::set_watchdog`]),
    /// a job the dispatcher had not started at its critical start time is
    /// reported by the watchdog's callback instead, at that time, and
    /// only once.
    ///
    /// `spin` is the hybrid release's spin window: a fixed window in ns
    /// (`u64`), or a [`SpinPolicy::Auto`] tuner that keeps learning from
    /// every sleep of the dispatcher (see [`crate::spin`]); the stats
    /// report the widest and last window used.
    pub fn run(
        &mut self,
        spin: impl Into<SpinPolicy>,
        on_miss: &mut dyn FnMut(&MissReport),
    ) -> Result<RunStats, String> {
        let mut spin = spin.into();
        let mut active = self.active.take().ok_or("run before commit")?;
        let shared = active.claims.clone();
        shared.set_stop(false);
        let Some(config) = self.watchdog.clone() else {
            let stats = self.dispatch(&mut active, &mut spin, on_miss, None);
            self.active = Some(active);
            return Ok(stats);
        };
        let timetable = Timetable {
            epoch_start_ns: active.core.epoch_start_ns(),
            tasks: (0..active.core.task_count())
                .map(|i| (active.core.task(i).clone(), active.core.periods_max(i)))
                .collect(),
        };
        let (fabric, clock) = (self.fabric.clone(), self.clock.clone());
        let counter_at = self.layout.counters.offset(layout::WATCHDOG_MISSES);
        let result = std::thread::scope(|s| {
            let watched = shared.clone();
            let handle = std::thread::Builder::new()
                .name("rt-watchdog".into())
                .spawn_scoped(s, move || {
                    watchdog::run(&*fabric, counter_at, &clock, &timetable, &watched, &config)
                })
                .map_err(|e| format!("start the watchdog thread: {e}"))?;
            let watchdog = handle.thread().clone();
            // Stops the watchdog however the dispatcher returns (a panic
            // in a computation task too), so the scope's join never waits
            // for the rest of the timetable.
            let _stop = StopOnDrop(&shared, &watchdog);
            Ok(self.dispatch(&mut active, &mut spin, on_miss, Some(&watchdog)))
        });
        self.active = Some(active);
        result
    }

    /// The dispatcher loop (see [`RtNode::run`]).
    fn dispatch(
        &mut self,
        active: &mut Active,
        spin: &mut SpinPolicy,
        on_miss: &mut dyn FnMut(&MissReport),
        watchdog: Option<&std::thread::Thread>,
    ) -> RunStats {
        let budget_ns = active.budget_ns;
        let rank = self.rank();
        let claims = active.claims.clone();
        // Time the host took across the last release (the wake-up was
        // late because the thread was off its CPU): charged, with what the
        // next job loses while it runs, to that job (one stall, one charge).
        let mut lost_before_release_ns = 0u64;
        loop {
            let now = self.clock.now();
            let now_ns = match now {
                Ok(i) => i.mid_ns(),
                Err(_) => self.clock.now_mid_unchecked_ns(),
            };
            match active.core.poll(now_ns) {
                Poll::Run(job) => {
                    self.count(layout::RELEASED);
                    if !claims.claim(job.task, job.period) {
                        // The watchdog reported it at its critical start,
                        // a moment before this poll: dropped, not reported twice.
                        active.core.handle_dropped(job);
                        self.count(layout::MISSED_EARLY);
                        continue;
                    }
                    let bound = now.map(|i| i.bound_ns()).unwrap_or(u64::MAX);
                    active.stats.counters.clock_bound_ns_max =
                        active.stats.counters.clock_bound_ns_max.max(bound.min(1 << 40));
                    if bound > budget_ns {
                        active.stats.counters.clock_over_budget += 1;
                        self.count(layout::CLOCK_OVER_BUDGET);
                    }
                    push_bounded(&mut active.stats.start_delay_ns, now_ns.saturating_sub(job.release_ns));
                    let started_mono = monotonic_ns();
                    let task = active.refs[job.task];
                    let miss = self.execute(task, job, &mut active.stats);
                    // Claimed: the watchdog plans past this job (after the
                    // job, so that its wake-up never delays the start).
                    if let Some(w) = watchdog {
                        w.unpark();
                    }
                    let exec_ns = monotonic_ns() - started_mono;
                    // A job that ran longer than its compute time lost the
                    // difference (at least) to the host; the first job after
                    // a late wake-up also lost that lateness.
                    let excess_ns = exec_ns.saturating_sub(active.core.task(job.task).compute_ns);
                    claims.observe(0, std::mem::take(&mut lost_before_release_ns).saturating_add(excess_ns));
                    match task {
                        TaskRef::Send(_) => push_bounded(&mut active.stats.send_exec_ns, exec_ns),
                        TaskRef::Receive(_) => push_bounded(&mut active.stats.receive_exec_ns, exec_ns),
                        TaskRef::Compute(_) => {}
                    }
                    if let Some(kind) = miss {
                        on_miss(&self.miss_report(&active.core, job, kind));
                    }
                    let finished = self.clock.now_mid_unchecked_ns();
                    if active.core.handle_completion(job, finished) {
                        self.count(layout::OVERRUNS);
                        on_miss(&self.miss_report(&active.core, job, MissKind::Overrun));
                    }
                    self.count(layout::COMPLETED);
                }
                Poll::Miss(job) => {
                    self.count(layout::RELEASED);
                    self.count(layout::MISSED_EARLY);
                    // Not reported again if the watchdog already did.
                    if claims.claim(job.task, job.period) {
                        if let Some(w) = watchdog {
                            w.unpark();
                        }
                        on_miss(&self.miss_report(&active.core, job, MissKind::Early));
                    }
                }
                Poll::Idle { wake_at_ns } => {
                    let target = self.clock.mono_for_global(wake_at_ns);
                    let window = spin.window_ns();
                    let wake = spin.sleep_until(target);
                    let late = wake.late_ns;
                    lost_before_release_ns = wake.lost_before_release_ns(window);
                    claims.observe(late, wake.gap_max_ns.max(lost_before_release_ns));
                    push_bounded(&mut active.stats.release_jitter_ns, late);
                    if late > LATE_WAKE_NS {
                        let c = &mut active.stats.counters;
                        match wake.overshoot_ns {
                            None => c.late_wakes_no_sleep += 1,
                            Some(o) if o > window => c.late_wakes_sleep += 1,
                            Some(_) => c.late_wakes_spin += 1,
                        }
                    }
                    active.stats.spin_window_max_ns = active.stats.spin_window_max_ns.max(window);
                    active.stats.spin_window_sum_ns = active.stats.spin_window_sum_ns.saturating_add(window);
                    active.stats.spin_waits += 1;
                }
                Poll::Done => break,
            }
        }
        let c = active.core.counters;
        let mut stats = std::mem::take(&mut active.stats);
        stats.spin_window_end_ns = spin.window_ns();
        stats.counters.released = c.released;
        stats.counters.completed = c.completed;
        stats.counters.missed_early = c.missed_early;
        stats.counters.overruns = c.overruns;
        stats.counters.missed_by_watchdog = claims.misses.load(Ordering::Relaxed);
        let seen = claims.interference();
        stats.counters.interference_lost_max_ns = seen.lost_max_ns;
        stats.counters.release_late_max_ns = seen.release_late_max_ns;
        stats.counters.interference_over_admitted = seen.over_admitted;
        debug_assert_eq!(
            c.released,
            c.completed + c.missed_early,
            "every released job completed or missed (rank {rank})"
        );
        stats
    }

    fn count(&self, counter: usize) {
        self.fabric
            .row(self.rank())
            .u64_at(self.layout.counters.offset(counter))
            .fetch_add(1, Ordering::Relaxed);
    }

    fn miss_report(&self, core: &DispatchCore, job: Job, kind: MissKind) -> MissReport {
        MissReport {
            task: core.task(job.task).name.clone(),
            period: job.period,
            kind,
            detected_ns: self.clock.now().map(|i| i.mid_ns()).unwrap_or(0),
            deadline_ns: job.deadline_ns,
            critical_start_ns: job.critical_start_ns,
        }
    }

    fn execute(&mut self, task: TaskRef, job: Job, stats: &mut RunStats) -> Option<MissKind> {
        match task {
            TaskRef::Send(c) => {
                let moved = self.send_job(c, job.period);
                stats.counters.messages_moved += moved;
                None
            }
            TaskRef::Receive(c) => {
                let result = self.receive_job(c, job.period);
                match result {
                    Ok(received) => {
                        stats.counters.messages_moved += received.moved;
                        stats.counters.messages_caught_up += received.caught_up;
                        stats.counters.receive_overflow += received.overflow;
                        None
                    }
                    Err(kind) => {
                        if kind == MissKind::MessageMissing {
                            stats.counters.messages_missing += 1;
                            self.count(layout::MESSAGES_MISSING);
                        } else {
                            stats.counters.messages_torn += 1;
                            self.count(layout::MESSAGES_TORN);
                        }
                        Some(kind)
                    }
                }
            }
            TaskRef::Compute(i) => {
                let (_, body) = &mut self.computations[i];
                let mut ctx = TaskContext {
                    job,
                    channels: &mut self.channels,
                    clock: &self.clock,
                };
                body(&mut ctx);
                None
            }
        }
    }
}

/// Stops a watchdog when dropped.
struct StopOnDrop<'a>(&'a WatchdogShared, &'a std::thread::Thread);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_stop(true);
        self.1.unpark();
    }
}

fn push_bounded(v: &mut Vec<u64>, x: u64) {
    if v.len() < v.capacity() {
        v.push(x);
    }
}

/// A release later than this counts as a late wake-up (by cause).
const LATE_WAKE_NS: u64 = 10_000;
