//! The dispatcher's watchdog: early miss detection when the dispatcher
//! itself stalls.
//!
//! The dispatcher detects a miss when it polls: a released job whose
//! critical start time (`deadline − compute`) has passed is dropped and
//! reported. But a dispatcher that is not polling (stuck in a long job,
//! preempted, paused) detects nothing until it runs again, possibly after
//! the deadline. The watchdog is a second thread (at a higher SCHED_FIFO
//! priority when permitted) that follows the same timetable and wakes at
//! each job's critical start time: if the dispatcher has not started that
//! job by then, the watchdog reports it at once, through its own callback
//! and the `watchdog_misses` row counter, before the deadline.
//!
//! Each job is *claimed* exactly once, by whoever comes first, with one
//! compare-and-swap per job on a per-task counter ([`WatchdogShared`]):
//! the dispatcher claims a job when it starts or drops it; the watchdog
//! claims it at its critical start time. A job the watchdog claimed is
//! never run by the dispatcher (it could no longer finish in time) and
//! is not reported a second time: every miss is reported once, never
//! silently dropped, never twice.
//!
//! ```text
//!  dispatcher:  ──job A (stalls)──────────────────────────▶ poll: B claimed → count, no 2nd report
//!  watchdog:          sleep ─▶ critical start of B: claim(B) ok → report "not started" (before B's deadline)
//! ```

use std::sync::Arc;

use spindle_fabric::Fabric;
use spindle_runtime::monotonic_ns;

use crate::clock_service::GlobalClock;
use crate::node::{MissKind, MissReport};
use crate::os::request_rt_privileges;
use crate::qos::TaskSpec;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// Longest single sleep of the watchdog (it re-reads the clock model at
/// least this often). Long: each wake-up of a SCHED_FIFO thread can
/// interrupt a dispatcher spinning towards a release.
const NAP_NS_MAX: u64 = 20_000_000;

/// A callback the watchdog thread calls for every miss it detects.
pub type MissCallback = Arc<dyn Fn(&MissReport) + Send + Sync>;

/// How the watchdog runs.
#[derive(Clone)]
pub struct WatchdogConfig {
    pub on_miss: MissCallback,
    /// Ask for SCHED_FIFO at this priority (above the dispatcher's, so it
    /// preempts a dispatcher stuck in a job); `None`: normal scheduling.
    pub fifo_priority: Option<i32>,
}

impl std::fmt::Debug for WatchdogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchdogConfig")
            .field("fifo_priority", &self.fifo_priority)
            .finish_non_exhaustive()
    }
}

/// State shared by the dispatcher and the watchdog of one commit
/// (allocated at commit).
#[derive(Debug)]
pub struct WatchdogShared {
    /// Per task: how many of its jobs have been claimed.
    claims: Box<[AtomicU64]>,
    stop: AtomicBool,
    /// Jobs the watchdog found not started at their critical start time.
    pub misses: AtomicU64,
}

impl WatchdogShared {
    /// For `tasks` tasks, no job claimed yet.
    pub fn new(tasks: usize) -> WatchdogShared {
        WatchdogShared {
            claims: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            misses: AtomicU64::new(0),
        }
    }

    /// Claim job `period` of `task`; true for the first claimer only.
    /// Jobs of one task are claimed in order by both sides, so the
    /// counter is `period` (unclaimed) or more (claimed).
    pub fn claim(&self, task: usize, period: u64) -> bool {
        // AcqRel: pairs with this same compare_exchange in the other thread
        // (the dispatcher in `RtNode::run`, the watchdog in `run`) and with
        // the Acquire load in `claimed`: whoever sees a job claimed sees
        // what its claimer did before claiming it.
        self.claims[task]
            .compare_exchange(period, period + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// How many jobs of `task` have been claimed (jobs `0..claimed`).
    pub fn claimed(&self, task: usize) -> u64 {
        // Acquire: pairs with the AcqRel compare_exchange in `claim`.
        self.claims[task].load(Ordering::Acquire)
    }

    pub(crate) fn set_stop(&self, stop: bool) {
        // Release: pairs with the Acquire load in `stopped`.
        self.stop.store(stop, Ordering::Release);
    }

    fn stopped(&self) -> bool {
        // Acquire: pairs with the Release store in `set_stop`.
        self.stop.load(Ordering::Acquire)
    }
}

/// The timetable the watchdog follows (a copy of the dispatcher's).
pub(crate) struct Timetable {
    pub epoch_start_ns: u64,
    /// Each task and how many periods it runs.
    pub tasks: Vec<(TaskSpec, u64)>,
}

/// The watchdog thread's body: until every job has passed its critical
/// start time or `shared` says stop.
///
/// It sleeps (parked) until the critical start of the earliest job not
/// yet claimed. The dispatcher unparks it after each claim, and it plans
/// again, skipping claimed jobs: when the dispatcher keeps up, the
/// watchdog never wakes at a critical start (on this kind of machine each
/// wake-up of a SCHED_FIFO thread near a release costs the dispatcher
/// tens of µs of release jitter); it wakes at one only when that job is
/// still unclaimed when the time comes.
pub(crate) fn run<F: Fabric>(
    fabric: &F,
    counter_at: usize,
    clock: &GlobalClock,
    timetable: &Timetable,
    shared: &WatchdogShared,
    config: &WatchdogConfig,
) {
    if let Some(priority) = config.fifo_priority {
        // Best effort: reported by the dispatcher's privileges line.
        let _ = request_rt_privileges(true, priority, false);
    }
    let tasks = &timetable.tasks;
    let mut next = vec![0u64; tasks.len()];
    while !shared.stopped() {
        for (t, n) in next.iter_mut().enumerate() {
            *n = (*n).max(shared.claimed(t)).min(tasks[t].1);
        }
        let due = (0..tasks.len())
            .filter(|&t| next[t] < tasks[t].1)
            .map(|t| (tasks[t].0.critical_start_ns(timetable.epoch_start_ns, next[t]), t))
            .min();
        let Some((critical_start_ns, t)) = due else { return };
        let target = clock.mono_for_global(critical_start_ns + 1);
        let now = monotonic_ns();
        if now < target {
            // Woken early by a claim (plan again), a stop, or the nap limit.
            std::thread::park_timeout(std::time::Duration::from_nanos((target - now).min(NAP_NS_MAX)));
            continue;
        }
        let period = next[t];
        next[t] += 1;
        if !shared.claim(t, period) {
            continue; // started (or dropped) by the dispatcher in time
        }
        shared.misses.fetch_add(1, Ordering::Relaxed);
        fabric
            .row(fabric.member_rank())
            .u64_at(counter_at)
            .fetch_add(1, Ordering::Relaxed);
        let spec = &tasks[t].0;
        (config.on_miss)(&MissReport {
            task: spec.name.clone(),
            period,
            kind: MissKind::NotStarted,
            detected_ns: clock.now().map(|i| i.mid_ns()).unwrap_or(0),
            deadline_ns: spec.qos.deadline_abs_ns(timetable.epoch_start_ns, period),
            critical_start_ns,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_job_is_claimed_once_whoever_comes_first() {
        let s = WatchdogShared::new(2);
        assert!(s.claim(0, 0), "the dispatcher starts job 0");
        assert!(!s.claim(0, 0), "the watchdog finds it started");
        assert!(s.claim(1, 0), "the watchdog reports task 1's job 0");
        assert!(s.claim(1, 1), "and job 1");
        assert!(!s.claim(1, 0) && !s.claim(1, 1), "the dispatcher finds both reported");
        assert!(s.claim(1, 2), "job 2 is the dispatcher's again");
    }

    #[test]
    fn racing_claims_give_every_job_to_exactly_one_side() {
        let s = Arc::new(WatchdogShared::new(1));
        let jobs = 10_000u64;
        let side = |s: Arc<WatchdogShared>| std::thread::spawn(move || (0..jobs).filter(|&k| s.claim(0, k)).count());
        let (a, b) = (side(s.clone()), side(s.clone()));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(a + b, jobs as usize);
    }
}
