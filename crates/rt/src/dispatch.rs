//! The dispatcher's sans-IO core: which job runs next, and early
//! deadline-miss detection.
//!
//! Driving contract: the runtime calls [`DispatchCore::poll`] with the
//! current global time whenever its thread is free. `Poll::Run(job)`: run
//! it now, then call [`DispatchCore::handle_completion`]. `Poll::Miss(job)`:
//! a released job could no longer meet its deadline (its *critical start*
//! `deadline − compute` has passed before it could start); it is dropped
//! and reported, before its deadline. `Poll::Idle { wake_at_ns }`: sleep
//! until then. `Poll::Done`: every task ran its periods.
//!
//! Jobs are chosen earliest-deadline-first and run to completion (no
//! preemption: admission counts the blocking that causes). Each task has
//! at most one job in flight, so state is bounded by the task count.

use crate::qos::{QosError, TaskSpec};

/// Most tasks one dispatcher runs.
pub const TASKS_MAX: usize = 256;
/// Most misses reported per `poll` (the rest come on later calls).
const MISSES_PER_POLL_MAX: usize = 1;

/// One job: task `task`'s `period`-th release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub task: usize,
    pub period: u64,
    pub release_ns: u64,
    pub deadline_ns: u64,
    pub critical_start_ns: u64,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    Run(Job),
    Miss(Job),
    Idle { wake_at_ns: u64 },
    Done,
}

/// Counters of one dispatcher (monotonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchCounters {
    pub released: u64,
    pub completed: u64,
    /// Jobs dropped at their critical start time (detected early).
    pub missed_early: u64,
    /// Jobs that started in time but finished after their deadline.
    pub overruns: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    spec: TaskSpec,
    periods_max: u64,
    next_period: u64,
}

/// The EDF dispatcher core over tasks fixed at commit.
#[derive(Debug, Clone)]
pub struct DispatchCore {
    epoch_start_ns: u64,
    entries: Vec<Entry>,
    pub counters: DispatchCounters,
}

impl DispatchCore {
    /// Tasks with how many periods each runs (`u64::MAX`: until uncommit).
    pub fn new(epoch_start_ns: u64, tasks: Vec<(TaskSpec, u64)>) -> Result<DispatchCore, QosError> {
        assert!(
            tasks.len() <= TASKS_MAX,
            "{} tasks > TASKS_MAX {TASKS_MAX}",
            tasks.len()
        );
        for (spec, _) in &tasks {
            spec.validate()?;
        }
        Ok(DispatchCore {
            epoch_start_ns,
            entries: tasks
                .into_iter()
                .map(|(spec, periods_max)| Entry {
                    spec,
                    periods_max,
                    next_period: 0,
                })
                .collect(),
            counters: DispatchCounters::default(),
        })
    }

    pub fn task(&self, index: usize) -> &TaskSpec {
        &self.entries[index].spec
    }
    pub fn task_count(&self) -> usize {
        self.entries.len()
    }
    pub fn epoch_start_ns(&self) -> u64 {
        self.epoch_start_ns
    }

    fn job(&self, index: usize) -> Job {
        let e = &self.entries[index];
        Job {
            task: index,
            period: e.next_period,
            release_ns: e.spec.qos.release_ns(self.epoch_start_ns, e.next_period),
            deadline_ns: e.spec.qos.deadline_abs_ns(self.epoch_start_ns, e.next_period),
            critical_start_ns: e.spec.critical_start_ns(self.epoch_start_ns, e.next_period),
        }
    }

    /// Decide what to do at global time `now_ns`.
    pub fn poll(&mut self, now_ns: u64) -> Poll {
        let mut best: Option<Job> = None;
        let mut wake_at_ns = u64::MAX;
        let mut misses = 0;
        for index in 0..self.entries.len() {
            let e = &self.entries[index];
            if e.next_period >= e.periods_max {
                continue;
            }
            let job = self.job(index);
            if job.release_ns > now_ns {
                wake_at_ns = wake_at_ns.min(job.release_ns);
                continue;
            }
            if now_ns > job.critical_start_ns && misses < MISSES_PER_POLL_MAX {
                // Released, not started, and can no longer finish in time.
                self.entries[index].next_period += 1;
                self.counters.released += 1;
                self.counters.missed_early += 1;
                return Poll::Miss(job);
            }
            misses += usize::from(now_ns > job.critical_start_ns);
            let earlier = best.is_none_or(|b| (job.deadline_ns, job.task) < (b.deadline_ns, b.task));
            if earlier {
                best = Some(job);
            }
        }
        match best {
            Some(job) => {
                self.entries[job.task].next_period += 1;
                self.counters.released += 1;
                debug_assert!(job.release_ns <= now_ns, "run_only_released_jobs");
                Poll::Run(job)
            }
            None if wake_at_ns == u64::MAX => Poll::Done,
            None => Poll::Idle { wake_at_ns },
        }
    }

    /// A job [`Poll::Run`] returned that the runtime did not run after all:
    /// the watchdog had already reported it missed (it claimed the job at
    /// its critical start time, a moment before the dispatcher did).
    /// Counted as missed early, like a [`Poll::Miss`].
    pub fn handle_dropped(&mut self, _job: Job) {
        self.counters.missed_early += 1;
        assert!(
            self.counters.completed + self.counters.missed_early <= self.counters.released,
            "drops_never_exceed_releases"
        );
    }

    /// How many periods task `index` runs.
    pub fn periods_max(&self, index: usize) -> u64 {
        self.entries[index].periods_max
    }

    /// A job returned at `finished_ns`; returns whether it overran its deadline.
    pub fn handle_completion(&mut self, job: Job, finished_ns: u64) -> bool {
        self.counters.completed += 1;
        assert!(
            self.counters.completed + self.counters.missed_early <= self.counters.released,
            "completions_never_exceed_releases"
        );
        let overrun = finished_ns > job.deadline_ns;
        self.counters.overruns += u64::from(overrun);
        overrun
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::{TaskKind, TimeQos};
    use proptest::prelude::*;

    const US: u64 = 1_000;

    fn task(name: &str, offset: u64, period: u64, compute: u64, deadline: u64) -> TaskSpec {
        TaskSpec::new(
            name,
            TaskKind::Computation,
            TimeQos::new(offset, period, deadline),
            compute,
        )
    }

    #[test]
    fn releases_at_epoch_plus_k_period_plus_offset() {
        let mut d = DispatchCore::new(1_000, vec![(task("a", 100, 1_000, 10, 50), 2)]).unwrap();
        assert_eq!(d.poll(0), Poll::Idle { wake_at_ns: 1_100 });
        let Poll::Run(j) = d.poll(1_100) else { panic!() };
        assert_eq!(
            (j.period, j.release_ns, j.deadline_ns, j.critical_start_ns),
            (0, 1_100, 1_150, 1_140)
        );
        assert!(!d.handle_completion(j, 1_120));
        assert_eq!(d.poll(1_200), Poll::Idle { wake_at_ns: 2_100 });
        let Poll::Run(j) = d.poll(2_100) else { panic!() };
        assert!(d.handle_completion(j, 2_151), "finished after its deadline: an overrun");
        assert_eq!(d.poll(9_999), Poll::Done);
        assert_eq!(d.counters.overruns, 1);
    }

    #[test]
    fn edf_picks_the_earliest_deadline_among_released_jobs() {
        let tasks = vec![
            (task("late", 0, 1_000, 10, 900), 1),
            (task("soon", 0, 1_000, 10, 100), 1),
        ];
        let mut d = DispatchCore::new(0, tasks).unwrap();
        let Poll::Run(j) = d.poll(5) else { panic!() };
        assert_eq!(d.task(j.task).name, "soon");
    }

    #[test]
    fn a_job_is_reported_missed_at_its_critical_start_before_its_deadline() {
        let mut d = DispatchCore::new(0, vec![(task("a", 0, 1_000, 40, 100), 1)]).unwrap();
        assert!(
            matches!(d.poll(60), Poll::Run(_)),
            "at its critical start it still runs"
        );
        // At 61 ns the job can no longer finish by 100: missed, early.
        let mut d2 = DispatchCore::new(0, vec![(task("a", 0, 1_000, 40, 100), 1)]).unwrap();
        let Poll::Miss(j) = d2.poll(61) else { panic!() };
        assert!(61 < j.deadline_ns, "detected before the deadline");
        assert_eq!(d2.counters.missed_early, 1);
        assert_eq!(d2.poll(62), Poll::Done);
    }

    #[test]
    fn a_long_stall_reports_every_missed_period_one_by_one() {
        let mut d = DispatchCore::new(0, vec![(task("a", 0, 100, 10, 50), 5)]).unwrap();
        let mut misses = 0;
        while let Poll::Miss(_) = d.poll(1_000) {
            misses += 1;
        }
        assert_eq!(misses, 5);
        assert_eq!(d.poll(1_000), Poll::Done);
    }

    proptest! {
        /// Every released job is either completed or missed, never both,
        /// never lost; a run job always starts by its critical start.
        #[test]
        fn jobs_are_conserved(
            specs in proptest::collection::vec((0u64..100, 1u64..40, 40u64..100), 1..6),
            steps in proptest::collection::vec(1u64..60, 1..400),
        ) {
            let tasks: Vec<(TaskSpec, u64)> = specs.iter().enumerate()
                .map(|(i, &(off, c, d))| (task(&format!("t{i}"), off * US, 100 * US, c * US, d * US), 20))
                .collect();
            let mut core = DispatchCore::new(0, tasks).unwrap();
            let mut now = 0u64;
            for step in steps {
                match core.poll(now) {
                    Poll::Run(j) => {
                        prop_assert!(now <= j.critical_start_ns);
                        now += core.task(j.task).compute_ns;
                        core.handle_completion(j, now);
                    }
                    Poll::Miss(j) => prop_assert!(now > j.critical_start_ns),
                    Poll::Idle { wake_at_ns } => { prop_assert!(wake_at_ns > now); now = wake_at_ns; }
                    Poll::Done => break,
                }
                now += step;
            }
            let c = core.counters;
            prop_assert_eq!(c.released, c.completed + c.missed_early);
        }
    }
}
