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

/// A callback the watchdog thread calls when the run's interference
/// exceeds what admission assumed (see [`InterferenceExceeded`]).
pub type InterferenceCallback = Arc<dyn Fn(&InterferenceExceeded) + Send + Sync>;

/// Most interference reports one run makes (each at least 5/4 of the last).
pub const INTERFERENCE_REPORTS_MAX: u64 = 16;

/// The run saw more interference than admission assumed: deadlines are
/// no longer guaranteed (reported by the watchdog within one watchdog nap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterferenceExceeded {
    /// The longest the dispatcher lost its CPU at once, or a job took
    /// beyond its compute time, during the run so far.
    pub lost_max_ns: u64,
    /// The latest release so far.
    pub release_late_max_ns: u64,
    /// What admission charged every job, and shortened deadlines by.
    pub interference_admitted_ns: u64,
    pub release_jitter_admitted_ns: u64,
    /// Observations over the admitted figures so far.
    pub over_admitted: u64,
}

/// How the watchdog runs.
#[derive(Clone)]
pub struct WatchdogConfig {
    pub on_miss: MissCallback,
    /// Told when the run's interference exceeds what admission assumed.
    pub on_interference: Option<InterferenceCallback>,
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
    /// What admission assumed (set at commit).
    interference_admitted_ns: u64,
    release_jitter_admitted_ns: u64,
    /// Interference seen during the run (see [`WatchdogShared::observe`]).
    pub lost_max_ns: AtomicU64,
    pub release_late_max_ns: AtomicU64,
    pub over_admitted: AtomicU64,
}

impl WatchdogShared {
    /// For `tasks` tasks, no job claimed yet.
    pub fn new(tasks: usize) -> WatchdogShared {
        WatchdogShared {
            claims: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            misses: AtomicU64::new(0),
            interference_admitted_ns: u64::MAX,
            release_jitter_admitted_ns: u64::MAX,
            lost_max_ns: AtomicU64::new(0),
            release_late_max_ns: AtomicU64::new(0),
            over_admitted: AtomicU64::new(0),
        }
    }

    /// What admission assumed: the interference charged to every job and
    /// the release jitter deadlines were shortened by.
    pub fn with_admitted(mut self, interference_ns: u64, release_jitter_ns: u64) -> WatchdogShared {
        self.interference_admitted_ns = interference_ns;
        self.release_jitter_admitted_ns = release_jitter_ns;
        self
    }

    /// The dispatcher's observation of one release or job: how late it
    /// released (`release_late_ns`) and the longest it lost its CPU
    /// (`lost_ns`: a gap while spinning, or a job's run time beyond its
    /// compute time). Returns whether it exceeded what admission assumed:
    /// a loss longer than the interference, or a release later than the
    /// release jitter and the interference together (the slack a job has).
    pub fn observe(&self, release_late_ns: u64, lost_ns: u64) -> bool {
        // Relaxed: statistics; the watchdog reads them with no ordering
        // to anything else.
        self.lost_max_ns.fetch_max(lost_ns, Ordering::Relaxed);
        self.release_late_max_ns.fetch_max(release_late_ns, Ordering::Relaxed);
        let slack_ns = self
            .release_jitter_admitted_ns
            .saturating_add(self.interference_admitted_ns);
        let over = lost_ns > self.interference_admitted_ns || release_late_ns > slack_ns;
        if over {
            self.over_admitted.fetch_add(1, Ordering::Relaxed);
        }
        over
    }

    /// What the run has seen so far, as a report.
    pub fn interference(&self) -> InterferenceExceeded {
        InterferenceExceeded {
            lost_max_ns: self.lost_max_ns.load(Ordering::Relaxed),
            release_late_max_ns: self.release_late_max_ns.load(Ordering::Relaxed),
            interference_admitted_ns: self.interference_admitted_ns,
            release_jitter_admitted_ns: self.release_jitter_admitted_ns,
            over_admitted: self.over_admitted.load(Ordering::Relaxed),
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

/// Which interference reports the watchdog has made.
#[derive(Default)]
struct Reported {
    reports: u64,
    /// The largest excess reported so far (lost, late).
    lost_ns: u64,
    late_ns: u64,
}

impl Reported {
    /// Report when the dispatcher's observations exceeded what admission
    /// assumed and grew by a quarter since the last report (bounded by
    /// [`INTERFERENCE_REPORTS_MAX`]).
    fn check(&mut self, shared: &WatchdogShared, config: &WatchdogConfig) {
        let Some(callback) = &config.on_interference else {
            return;
        };
        let now = shared.interference();
        if now.over_admitted == 0 || self.reports >= INTERFERENCE_REPORTS_MAX {
            return;
        }
        let grew = |new: u64, old: u64| new > old.saturating_add(old / 4);
        if self.reports > 0 && !grew(now.lost_max_ns, self.lost_ns) && !grew(now.release_late_max_ns, self.late_ns) {
            return;
        }
        self.reports += 1;
        self.lost_ns = now.lost_max_ns;
        self.late_ns = now.release_late_max_ns;
        callback(&now);
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
    let mut reported = Reported::default();
    while !shared.stopped() {
        reported.check(shared, config);
        for (t, n) in next.iter_mut().enumerate() {
            *n = (*n).max(shared.claimed(t)).min(tasks[t].1);
        }
        let due = (0..tasks.len())
            .filter(|&t| next[t] < tasks[t].1)
            .map(|t| (tasks[t].0.critical_start_ns(timetable.epoch_start_ns, next[t]), t))
            .min();
        let Some((critical_start_ns, t)) = due else {
            reported.check(shared, config);
            return;
        };
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
    fn observations_over_what_admission_assumed_are_counted() {
        let s = WatchdogShared::new(1).with_admitted(100_000, 20_000);
        assert!(!s.observe(15_000, 90_000), "within the admitted figures");
        assert!(!s.observe(110_000, 0), "late, but within jitter + interference");
        assert!(s.observe(0, 838_000), "a longer loss than admitted");
        assert!(s.observe(200_000, 0), "later than jitter + interference");
        let seen = s.interference();
        assert_eq!(
            (seen.lost_max_ns, seen.release_late_max_ns, seen.over_admitted),
            (838_000, 200_000, 2)
        );
        // Nothing admitted (no commit yet): nothing is over.
        assert!(!WatchdogShared::new(1).observe(u64::MAX - 1, u64::MAX - 1));
    }

    #[test]
    fn interference_reports_grow_and_are_bounded() {
        let s = WatchdogShared::new(1).with_admitted(100, 0);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let config = WatchdogConfig {
            on_miss: Arc::new(|_| {}),
            on_interference: Some(Arc::new(move |e| log.lock().unwrap().push(e.lost_max_ns))),
            fifo_priority: None,
        };
        let mut reported = Reported::default();
        reported.check(&s, &config);
        for lost in [50, 200, 210, 300, 301] {
            s.observe(0, lost);
            reported.check(&s, &config);
        }
        assert_eq!(
            *seen.lock().unwrap(),
            vec![200, 300],
            "only when over and grown by a quarter"
        );
        for k in 0..100u64 {
            s.observe(0, 1_000 << (k % 60));
            reported.check(&s, &config);
        }
        assert_eq!(seen.lock().unwrap().len() as u64, INTERFERENCE_REPORTS_MAX);
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
