//! Admission control: a per-node EDF processor-demand test over every
//! channel task and registered computation task of the node.
//!
//! Every deadline is first *shortened* by the margins the runtime cannot
//! avoid: the global clock's error bound (a node may release a job up to
//! that much late in global time) and the dispatcher's measured release
//! jitter. Every job is then *charged* the host's **interference** `I`
//! besides its compute time: the longest the host may keep the dispatcher
//! off its CPU while the job is due or running (preemption, interrupts,
//! the hypervisor descheduling a virtual CPU; learned from the host, see
//! [`crate::interference`]). With `D' = D − clock_error_bound −
//! release_jitter` and `C' = C + I` (`I` times the interference headroom,
//! when one is set: `Margins::interference_headroom_pct`):
//!
//! 1. each task needs `C' ≤ D'` (else: "needs a deadline of at least …",
//!    naming the interference measured);
//! 2. utilization `Σ C'/T ≤ 1`;
//! 3. the processor-demand criterion with release offsets: for every
//!    window `[t1, t2]` with `t1` a release and `t2` a deadline inside the
//!    feasibility interval `[0, O_max + 2H)` (H = hyperperiod; Leung and
//!    Merrill), the work of jobs released at or after `t1` with deadlines
//!    at or before `t2`, plus the longest job that may already be running
//!    at `t1` with a later deadline (the dispatcher does not preempt a
//!    running job), fits: `demand + blocking ≤ t2 − t1` (all with `C'`).
//!
//! **The fault model.** The host may take the dispatcher's CPU at any
//! time (a *stall*: the dispatcher thread is not running), provided the
//! stalls that overlap any one job's window `[release, deadline]` total
//! at most `I`. A stall across a release makes that release late; it is
//! charged once, as interference, not also as release jitter: `J` is only
//! the lateness of an undisturbed release (the spin loop's granularity;
//! see [`crate::os::Wake::lost_before_release_ns`]).
//!
//! Why the test is sound under it: if some job misses its deadline `d`,
//! take the busy interval `[t1, d]` before it (from the last instant when
//! no job with a deadline at or before `d` was pending; at most one job
//! with a later deadline, the non-preemptive blocker, runs across `t1`).
//! Throughout it the CPU runs those jobs or is stalled, and every stalled
//! instant lies in the window of some job pending then, which is one the
//! test counts in that window's demand or as its blocking. So the stalls
//! in `[t1, d]` total at most `I` per counted job, and `demand + blocking`
//! with `C' = C + I` is at least the CPU time the interval needed: more
//! than `d − t1`, which the test rejects. Property tests:
//! `accepted_sets_meet_every_deadline_when_every_job_is_delayed_by_up_to_i`
//! (each job's execution stretched by up to `I`) and
//! `accepted_sets_meet_every_deadline_when_the_host_stalls_across_releases`
//! (stalls of the CPU placed across releases and inside jobs, at most `I`
//! in any job's window).
//!
//! The test is pure and bounded: at most [`JOBS_MAX`] jobs in the interval,
//! else the set is rejected as too long to check (never a long stall).
//! Cross-node rules (a channel's receive must come after its send's
//! deadline plus twice the clock bound) are in [`check_channel_order`].

use crate::qos::{QosError, TaskSpec};

/// Most jobs the demand test enumerates in the feasibility interval.
pub const JOBS_MAX: usize = 2_048;

/// The margins every deadline is shortened by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Margins {
    /// The global clock's error bound (half-width of `now()`'s interval).
    pub clock_error_bound_ns: u64,
    /// The dispatcher's measured release jitter (start − release).
    pub release_jitter_ns: u64,
    /// The host's interference charged to every job on top of its compute
    /// time (see [`crate::interference`]); 0: none assumed.
    pub interference_ns: u64,
    /// Percent of `interference_ns` charged (0 or 100: as measured; 300:
    /// three times what the host has shown, a headroom for stalls longer
    /// than any seen).
    pub interference_headroom_pct: u32,
}

impl Margins {
    /// What every deadline is shortened by (the clock bound and the
    /// release jitter; the interference is charged to each job instead).
    pub fn total_ns(&self) -> u64 {
        self.clock_error_bound_ns.saturating_add(self.release_jitter_ns)
    }

    /// The interference charged to every job: `interference_ns` times the
    /// headroom.
    pub fn interference_charged_ns(&self) -> u64 {
        let pct = self.interference_headroom_pct.max(100) as u128;
        (self.interference_ns as u128 * pct).div_ceil(100).min(u64::MAX as u128) as u64
    }

    /// How the charged interference came about, for a rejection's text.
    fn interference_source(&self) -> String {
        if self.interference_headroom_pct > 100 {
            format!(
                "({}% of the {} ns measured on this host: the headroom for longer stalls than any seen)",
                self.interference_headroom_pct, self.interference_ns
            )
        } else {
            "measured on this host".to_string()
        }
    }
}

/// Why a task set was rejected. Always names the task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    #[error("invalid task: {0}")]
    Invalid(QosError),
    #[error("needs a deadline of at least {deadline_needed_ns} ns, has {deadline_ns} ns: compute {compute_ns} ns + interference {interference_ns} ns {interference_source} + clock bound {clock_error_bound_ns} ns + release jitter {release_jitter_ns} ns (shortened deadline {deadline_effective_ns} ns)")]
    ComputeExceedsDeadline {
        compute_ns: u64,
        /// Charged (the headroom included).
        interference_ns: u64,
        /// "measured on this host", or the headroom over what was.
        interference_source: String,
        deadline_ns: u64,
        /// `compute + interference + clock bound + release jitter`.
        deadline_needed_ns: u64,
        deadline_effective_ns: i64,
        clock_error_bound_ns: u64,
        release_jitter_ns: u64,
    },
    #[error("utilization {utilization_ppm} ppm (compute + interference {interference_ns} ns per job {interference_source}) exceeds 1,000,000 ppm once this task is added")]
    Utilization {
        utilization_ppm: u64,
        interference_ns: u64,
        interference_source: String,
    },
    #[error("demand {demand_ns} ns (+ {blocking_ns} ns non-preemptive blocking; each job charged interference {interference_ns} ns {interference_source}) exceeds the window [{window_start_ns}, {window_end_ns}) ns of {window_ns} ns ending at this task's deadline")]
    Demand {
        window_start_ns: u64,
        window_end_ns: u64,
        window_ns: u64,
        demand_ns: u64,
        blocking_ns: u64,
        interference_ns: u64,
        interference_source: String,
    },
    #[error(
        "the feasibility interval holds more than {JOBS_MAX} jobs (hyperperiod {hyperperiod_ns} ns): too long to check"
    )]
    TooManyJobs { hyperperiod_ns: u64 },
    #[error("receive release {receive_release_ns} ns within the period is before the send deadline {send_deadline_ns} ns + 2 × clock bound {clock_error_bound_ns} ns: the message may not be there")]
    ReceiveBeforeSend {
        receive_release_ns: u64,
        send_deadline_ns: u64,
        clock_error_bound_ns: u64,
    },
    #[error("send period {send_period_ns} ns differs from receive period {receive_period_ns} ns")]
    PeriodMismatch {
        send_period_ns: u64,
        receive_period_ns: u64,
    },
}

/// A rejection: which task, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task '{task}' rejected: {reason}")]
pub struct Rejection {
    pub task: String,
    pub reason: RejectReason,
}

/// What an accepted test found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub utilization_ppm: u64,
    pub hyperperiod_ns: u64,
    pub jobs_checked: usize,
    pub windows_checked: u64,
    /// Smallest `window − demand − blocking` over all windows (slack).
    pub slack_ns_min: u64,
}

#[derive(Debug, Clone, Copy)]
struct Job {
    release_ns: u64,
    deadline_ns: u64,
    compute_ns: u64,
    task: usize,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn reject(task: &TaskSpec, reason: RejectReason) -> Rejection {
    Rejection {
        task: task.name.clone(),
        reason,
    }
}

/// Run the node's admission test. All-or-nothing: the first failing task
/// rejects the whole set.
pub fn admit_node(tasks: &[TaskSpec], margins: Margins) -> Result<Admitted, Rejection> {
    let interference_ns = margins.interference_charged_ns();
    let mut utilization_ppm: u64 = 0;
    let mut hyperperiod_ns: u64 = 1;
    let mut offset_max_ns: u64 = 0;
    let mut deadlines_effective = Vec::with_capacity(tasks.len());
    for task in tasks {
        task.validate().map_err(|e| reject(task, RejectReason::Invalid(e)))?;
        let effective = task.qos.deadline_ns as i64 - margins.total_ns() as i64;
        let charged_ns = task.compute_ns.saturating_add(interference_ns);
        if effective < charged_ns as i64 {
            return Err(reject(
                task,
                RejectReason::ComputeExceedsDeadline {
                    compute_ns: task.compute_ns,
                    interference_ns,
                    interference_source: margins.interference_source(),
                    deadline_ns: task.qos.deadline_ns,
                    deadline_needed_ns: charged_ns.saturating_add(margins.total_ns()),
                    deadline_effective_ns: effective,
                    clock_error_bound_ns: margins.clock_error_bound_ns,
                    release_jitter_ns: margins.release_jitter_ns,
                },
            ));
        }
        deadlines_effective.push(effective as u64);
        utilization_ppm += (charged_ns as u128 * 1_000_000).div_ceil(task.qos.period_ns as u128) as u64;
        if utilization_ppm > 1_000_000 {
            return Err(reject(
                task,
                RejectReason::Utilization {
                    utilization_ppm,
                    interference_ns,
                    interference_source: margins.interference_source(),
                },
            ));
        }
        let period = task.qos.period_ns;
        hyperperiod_ns = (hyperperiod_ns / gcd(hyperperiod_ns, period))
            .checked_mul(period)
            .ok_or_else(|| {
                reject(
                    task,
                    RejectReason::TooManyJobs {
                        hyperperiod_ns: u64::MAX,
                    },
                )
            })?;
        offset_max_ns = offset_max_ns.max(task.qos.release_offset_ns);
    }
    let horizon_ns = offset_max_ns.saturating_add(hyperperiod_ns.saturating_mul(2));
    let mut jobs = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let mut k = 0u64;
        loop {
            let release_ns = task.qos.release_ns(0, k);
            if release_ns >= horizon_ns {
                break;
            }
            if jobs.len() == JOBS_MAX {
                return Err(reject(task, RejectReason::TooManyJobs { hyperperiod_ns }));
            }
            jobs.push(Job {
                release_ns,
                deadline_ns: release_ns + deadlines_effective[i],
                compute_ns: task.compute_ns + interference_ns,
                task: i,
            });
            k += 1;
        }
    }
    let (windows_checked, slack_ns_min) = demand_test(tasks, &mut jobs, interference_ns, &margins)?;
    Ok(Admitted {
        utilization_ppm,
        hyperperiod_ns,
        jobs_checked: jobs.len(),
        windows_checked,
        slack_ns_min,
    })
}

/// The processor-demand criterion over all (release, deadline) windows.
fn demand_test(
    tasks: &[TaskSpec],
    jobs: &mut [Job],
    interference_ns: u64,
    margins: &Margins,
) -> Result<(u64, u64), Rejection> {
    jobs.sort_by_key(|j| (j.deadline_ns, j.release_ns, j.task));
    let mut starts: Vec<u64> = jobs.iter().map(|j| j.release_ns).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut windows_checked = 0u64;
    let mut slack_ns_min = u64::MAX;
    for &t1 in &starts {
        // Blocking: the longest job that may be running at t1 (released
        // before, deadline after); it must be one with a deadline after t2
        // to block (else it is counted in an earlier window's demand).
        let mut demand_ns = 0u64;
        for (idx, job) in jobs.iter().enumerate() {
            if job.deadline_ns <= t1 {
                continue;
            }
            if job.release_ns >= t1 {
                demand_ns += job.compute_ns;
            }
            let t2 = job.deadline_ns;
            let last_at_t2 = jobs.get(idx + 1).is_none_or(|next| next.deadline_ns != t2);
            if !last_at_t2 {
                continue;
            }
            let blocking_ns = jobs
                .iter()
                .filter(|j| j.release_ns < t1 && j.deadline_ns > t2)
                .map(|j| j.compute_ns)
                .max()
                .unwrap_or(0);
            windows_checked += 1;
            let window_ns = t2 - t1;
            let need_ns = demand_ns + blocking_ns;
            if need_ns > window_ns {
                return Err(reject(
                    &tasks[job.task],
                    RejectReason::Demand {
                        window_start_ns: t1,
                        window_end_ns: t2,
                        window_ns,
                        demand_ns,
                        blocking_ns,
                        interference_ns,
                        interference_source: margins.interference_source(),
                    },
                ));
            }
            slack_ns_min = slack_ns_min.min(window_ns - need_ns);
        }
    }
    Ok((windows_checked, slack_ns_min))
}

/// Cross-node order of one channel: the receiver's release (within the
/// period) must come after the sender's deadline plus twice the clock
/// bound (each node may be off by the bound in opposite directions), so
/// the message is always there when the receive task runs.
pub fn check_channel_order(send: &TaskSpec, receive: &TaskSpec, clock_error_bound_ns: u64) -> Result<(), Rejection> {
    if send.qos.period_ns != receive.qos.period_ns {
        return Err(reject(
            receive,
            RejectReason::PeriodMismatch {
                send_period_ns: send.qos.period_ns,
                receive_period_ns: receive.qos.period_ns,
            },
        ));
    }
    let send_deadline_ns = send.qos.release_offset_ns + send.qos.deadline_ns;
    if receive.qos.release_offset_ns < send_deadline_ns + 2 * clock_error_bound_ns {
        return Err(reject(
            receive,
            RejectReason::ReceiveBeforeSend {
                receive_release_ns: receive.qos.release_offset_ns,
                send_deadline_ns,
                clock_error_bound_ns,
            },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::{TaskKind, TimeQos};
    use proptest::prelude::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    fn task(name: &str, offset: u64, period: u64, compute: u64, deadline: u64) -> TaskSpec {
        TaskSpec::new(
            name,
            TaskKind::Computation,
            TimeQos::new(offset, period, deadline),
            compute,
        )
    }

    /// Table 5.1, node A: User 0, Channel Send 75, Channel Recv 525 (µs).
    fn table_5_1_node_a() -> Vec<TaskSpec> {
        vec![
            task("A user", 0, 5 * MS, 50 * US, 75 * US),
            task("A channel send", 75 * US, 5 * MS, 50 * US, 75 * US),
            task("A channel recv", 525 * US, 5 * MS, 50 * US, 75 * US),
        ]
    }

    #[test]
    fn table_5_1_node_a_is_admitted_with_no_margins() {
        let a = admit_node(&table_5_1_node_a(), Margins::default()).unwrap();
        assert_eq!(a.hyperperiod_ns, 5 * MS);
        assert_eq!(a.utilization_ppm, 30_000);
        assert_eq!(a.slack_ns_min, 25 * US);
    }

    #[test]
    fn table_5_1_is_rejected_once_jitter_eats_the_slack() {
        let margins = Margins {
            clock_error_bound_ns: 10 * US,
            release_jitter_ns: 20 * US,
            ..Margins::default()
        };
        let r = admit_node(&table_5_1_node_a(), margins).unwrap_err();
        assert_eq!(r.task, "A user");
        assert!(matches!(
            r.reason,
            RejectReason::ComputeExceedsDeadline {
                deadline_effective_ns: 45_000,
                ..
            }
        ));
        assert!(r.to_string().contains("A user"), "{r}");
    }

    #[test]
    fn offsets_matter_two_overlapping_tasks_are_rejected_with_the_window() {
        let tasks = vec![
            task("a", 0, MS, 60 * US, 100 * US),
            task("b", 20 * US, MS, 60 * US, 80 * US),
        ];
        let r = admit_node(&tasks, Margins::default()).unwrap_err();
        assert_eq!(r.task, "b");
        assert!(
            matches!(
                r.reason,
                RejectReason::Demand {
                    window_start_ns: 0,
                    window_end_ns: 100_000,
                    demand_ns: 120_000,
                    blocking_ns: 0,
                    ..
                }
            ),
            "{r}"
        );
        // Spread apart, the same tasks fit.
        let tasks = vec![
            task("a", 0, MS, 60 * US, 100 * US),
            task("b", 100 * US, MS, 60 * US, 100 * US),
        ];
        assert!(admit_node(&tasks, Margins::default()).is_ok());
    }

    #[test]
    fn over_utilization_names_the_task_that_tips_it() {
        let tasks = vec![task("a", 0, MS, 600 * US, MS), task("b", 0, MS, 500 * US, MS)];
        let r = admit_node(&tasks, Margins::default()).unwrap_err();
        assert_eq!(r.task, "b");
        assert!(matches!(
            r.reason,
            RejectReason::Utilization {
                utilization_ppm: 1_100_000,
                ..
            }
        ));
    }

    #[test]
    fn non_preemptive_blocking_is_counted() {
        // A long low-urgency job released just before a short urgent one.
        let tasks = vec![
            task("long", 0, MS, 300 * US, MS),
            task("urgent", 10 * US, MS, 50 * US, 100 * US),
        ];
        let r = admit_node(&tasks, Margins::default()).unwrap_err();
        assert_eq!(r.task, "urgent");
        assert!(
            matches!(
                r.reason,
                RejectReason::Demand {
                    blocking_ns: 300_000,
                    ..
                }
            ),
            "{r}"
        );
    }

    #[test]
    fn huge_hyperperiods_are_rejected_not_enumerated() {
        let tasks = vec![task("a", 0, 1_000_003, 1, 1_000), task("b", 0, 999_983, 1, 1_000)];
        let r = admit_node(&tasks, Margins::default()).unwrap_err();
        assert!(matches!(r.reason, RejectReason::TooManyJobs { .. }), "{r}");
    }

    #[test]
    fn invalid_tasks_are_rejected_by_name() {
        let r = admit_node(&[task("bad", 0, 0, 1, 1)], Margins::default()).unwrap_err();
        assert_eq!(r.task, "bad");
        assert!(matches!(r.reason, RejectReason::Invalid(_)));
    }

    #[test]
    fn channel_order_of_table_5_1_fails_because_receive_precedes_send_deadline() {
        let send = task("A channel send", 75 * US, 5 * MS, 50 * US, 75 * US);
        let recv = task("B channel recv", 125 * US, 5 * MS, 50 * US, 75 * US);
        let r = check_channel_order(&send, &recv, 0).unwrap_err();
        assert_eq!(r.task, "B channel recv");
        let recv_late = task("B channel recv", 150 * US, 5 * MS, 50 * US, 75 * US);
        assert!(check_channel_order(&send, &recv_late, 0).is_ok());
        assert!(check_channel_order(&send, &recv_late, 1).is_err());
    }

    /// Reference: non-preemptive EDF simulation over the feasibility
    /// interval (jobs released at integer µs). If admission accepts, the
    /// simulation meets every (shortened) deadline.
    fn simulate_np_edf(tasks: &[TaskSpec], margins: Margins) -> bool {
        simulate_np_edf_delayed(tasks, margins, &mut |_| 0)
    }

    /// The same, with job `k` (in release order) delayed by `delay(k)` ns
    /// in all: the host takes its CPU for that long once the job is due
    /// (before it starts, or while it runs: the same to its completion).
    fn simulate_np_edf_delayed(tasks: &[TaskSpec], margins: Margins, delay: &mut dyn FnMut(usize) -> u64) -> bool {
        let mut jobs = jobs_of(tasks, margins);
        for (k, job) in jobs.iter_mut().enumerate() {
            job.2 += delay(k);
        }
        np_edf_meets_deadlines(&jobs, &|at, work| at + work)
    }

    /// Non-preemptive EDF over `jobs` (`(release, deadline, work)`, in
    /// release order); `finish(at, work)` is when `work` ns of CPU started
    /// at `at` are done (`finish(at, 0)`: when the dispatcher next runs).
    /// True when every deadline is met.
    fn np_edf_meets_deadlines(jobs: &[(u64, u64, u64)], finish: &dyn Fn(u64, u64) -> u64) -> bool {
        let mut now = 0u64;
        let mut pending: Vec<(u64, u64, u64)> = Vec::new();
        let mut next = 0;
        while next < jobs.len() || !pending.is_empty() {
            // The dispatcher only looks at the clock when it runs.
            now = finish(now, 0);
            while next < jobs.len() && jobs[next].0 <= now {
                pending.push(jobs[next]);
                next += 1;
            }
            if pending.is_empty() {
                now = jobs[next].0;
                continue;
            }
            let i = (0..pending.len()).min_by_key(|&i| pending[i].1).unwrap();
            let job = pending.swap_remove(i);
            now = finish(now, job.2);
            if now > job.1 {
                return false;
            }
        }
        true
    }

    /// Non-preemptive EDF on a CPU the host takes away during `stalls`
    /// (`(start, length)`, sorted, disjoint): a job due during a stall
    /// starts when it ends (its release made late), a job running into
    /// one finishes that much later. True when every (shortened) deadline
    /// is met.
    fn simulate_np_edf_stalled(tasks: &[TaskSpec], margins: Margins, stalls: &[(u64, u64)]) -> bool {
        let jobs = jobs_of(tasks, margins);
        // The CPU time from `at` until `work` ns of it were available.
        let finish = |at: u64, work: u64| {
            let (mut now, mut left) = (at, work);
            for &(s, len) in stalls {
                if s + len <= now {
                    continue;
                }
                if s > now {
                    if s >= now + left {
                        break;
                    }
                    // Run until the stall starts ...
                    left -= s - now;
                }
                // ... then wait it out.
                now = s + len;
            }
            now + left
        };
        np_edf_meets_deadlines(&jobs, &finish)
    }

    /// Every job of the feasibility interval, `(release, shortened
    /// deadline, compute)`, in release order.
    fn jobs_of(tasks: &[TaskSpec], margins: Margins) -> Vec<(u64, u64, u64)> {
        let h: u64 = tasks.iter().map(|t| t.qos.period_ns).fold(1, |a, p| a / gcd(a, p) * p);
        let horizon = tasks.iter().map(|t| t.qos.release_offset_ns).max().unwrap_or(0) + 2 * h;
        let mut jobs: Vec<(u64, u64, u64)> = Vec::new();
        for t in tasks {
            let mut k = 0;
            while t.qos.release_ns(0, k) < horizon {
                let r = t.qos.release_ns(0, k);
                jobs.push((r, r + t.qos.deadline_ns - margins.total_ns(), t.compute_ns));
                k += 1;
            }
        }
        jobs.sort();
        jobs
    }

    /// Stalls the fault model allows: each at most `i_ns` long, placed
    /// (by `pick`) across a job's release or inside its window, and kept
    /// only if every job window still overlaps at most `i_ns` of stall.
    fn stalls_within_the_model(
        jobs: &[(u64, u64, u64)],
        i_ns: u64,
        pick: &mut dyn FnMut(u64) -> u64,
    ) -> Vec<(u64, u64)> {
        let mut stalls: Vec<(u64, u64)> = Vec::new();
        if i_ns == 0 {
            return stalls;
        }
        for job in jobs {
            let len = 1 + pick(i_ns);
            // Start from up to `len` before the release (making it late)
            // to the release plus the job's compute (inside it).
            let start = (job.0 + pick(len + job.2)).saturating_sub(len);
            let mut candidate = stalls.clone();
            candidate.push((start, len));
            candidate.sort();
            let disjoint = candidate.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0);
            let within = jobs.iter().all(|&(r, d, _)| {
                let overlap: u64 = candidate
                    .iter()
                    .map(|&(s, l)| (s + l).min(d).saturating_sub(s.max(r)))
                    .sum();
                overlap <= i_ns
            });
            if disjoint && within {
                stalls = candidate;
            }
        }
        stalls
    }

    #[test]
    fn the_stall_simulation_delays_a_job_by_the_stall_it_meets() {
        let tasks = vec![task("t", 0, MS, 100 * US, 500 * US)];
        // A 350 µs stall from 50 µs: the job runs 50, waits 350, runs 50.
        assert!(simulate_np_edf_stalled(
            &tasks,
            Margins::default(),
            &[(50 * US, 350 * US)]
        ));
        // 410 µs from the release: it starts at 410 µs, ends at 510 > 500.
        assert!(!simulate_np_edf_stalled(&tasks, Margins::default(), &[(0, 410 * US)]));
        assert!(simulate_np_edf_stalled(&tasks, Margins::default(), &[(0, 400 * US)]));
    }

    #[test]
    fn interference_is_charged_to_every_job_and_named_in_the_reason() {
        // Table 5.1's node A fits with no margins; 838 µs of interference
        // (what the run saw) does not, and the reason says so.
        let margins = Margins {
            clock_error_bound_ns: 10 * US,
            release_jitter_ns: 0,
            interference_ns: 838 * US,
            ..Margins::default()
        };
        let r = admit_node(&table_5_1_node_a(), margins).unwrap_err();
        assert_eq!(r.task, "A user");
        assert!(
            matches!(
                r.reason,
                RejectReason::ComputeExceedsDeadline {
                    deadline_needed_ns: 898_000,
                    interference_ns: 838_000,
                    ..
                }
            ),
            "{r}"
        );
        let text = r.to_string();
        for needle in ["'A user'", "at least 898000 ns", "interference 838000 ns measured"] {
            assert!(text.contains(needle), "'{needle}' not in: {text}");
        }
        // With deadlines long enough for it, the same interference is
        // charged in the demand: two jobs 1 ms apart each need C + I.
        let tasks = vec![
            task("a", 0, 5 * MS, 50 * US, 1_000 * US),
            task("b", 100 * US, 5 * MS, 50 * US, 1_000 * US),
        ];
        let r = admit_node(&tasks, margins).unwrap_err();
        assert_eq!(r.task, "b");
        assert!(
            matches!(
                r.reason,
                RejectReason::Demand {
                    demand_ns: 1_776_000,
                    interference_ns: 838_000,
                    ..
                }
            ),
            "{r}"
        );
        let spread = vec![
            task("a", 0, 5 * MS, 50 * US, 1_000 * US),
            task("b", 1_000 * US, 5 * MS, 50 * US, 1_000 * US),
        ];
        let a = admit_node(&spread, margins).unwrap();
        assert_eq!(a.utilization_ppm, 2 * 888_000 / 5);
    }

    #[test]
    fn a_headroom_charges_a_multiple_of_the_measured_interference_and_says_so() {
        let tasks = vec![task("ring send", 0, 50 * MS, 5 * US, 5_525 * US)];
        let measured = Margins {
            clock_error_bound_ns: 10 * US,
            interference_ns: 1_610 * US,
            ..Margins::default()
        };
        assert!(admit_node(&tasks, measured).is_ok(), "1.61 ms fits 5.5 ms");
        let tripled = Margins {
            interference_headroom_pct: 300,
            ..measured
        };
        assert_eq!(tripled.interference_charged_ns(), 4_830 * US);
        assert!(admit_node(&tasks, tripled).is_ok(), "4.83 ms still fits");
        let host_worse = Margins {
            interference_ns: 6_825_282,
            ..tripled
        };
        let r = admit_node(&tasks, host_worse).unwrap_err();
        let text = r.to_string();
        for needle in [
            "at least 20490846 ns",
            "interference 20475846 ns (300% of the 6825282 ns measured on this host",
        ] {
            assert!(text.contains(needle), "'{needle}' not in: {text}");
        }
        // 0 and 100 both mean: as measured.
        assert_eq!(measured.interference_charged_ns(), 1_610 * US);
        let hundred = Margins {
            interference_headroom_pct: 100,
            ..measured
        };
        assert_eq!(hundred.interference_charged_ns(), 1_610 * US);
    }

    /// Tasks from proptest's `(offset, period exponent, compute, deadline)`:
    /// periods of 100, 200 or 400 µs, everything in µs.
    fn random_tasks(specs: &[(u64, u64, u64, u64)]) -> Vec<TaskSpec> {
        specs
            .iter()
            .enumerate()
            .map(|(i, &(off, p, c, d))| {
                let period = (100 * US) << (p - 1);
                let deadline = (d * US * 2).min(period);
                task(
                    &format!("t{i}"),
                    (off * 10 * US) % period,
                    period,
                    (c * US).min(deadline),
                    deadline,
                )
            })
            .collect()
    }

    proptest! {
        #[test]
        fn accepted_sets_meet_every_deadline_under_np_edf(
            specs in proptest::collection::vec((0u64..10, 1u64..4, 1u64..30, 5u64..50), 1..5),
            jitter in 0u64..5,
        ) {
            // Periods from {100, 200, 400} µs, everything in µs.
            let tasks = random_tasks(&specs);
            let margins = Margins { clock_error_bound_ns: 0, release_jitter_ns: jitter * US, interference_ns: 0, ..Margins::default() };
            if admit_node(&tasks, margins).is_ok() {
                prop_assert!(simulate_np_edf(&tasks, margins));
            }
        }

        #[test]
        fn accepted_sets_meet_every_deadline_when_every_job_is_delayed_by_up_to_i(
            specs in proptest::collection::vec((0u64..10, 1u64..4, 1u64..30, 5u64..50), 1..5),
            interference in 0u64..40,
            jitter in 0u64..5,
            seed in any::<u64>(),
        ) {
            let tasks = random_tasks(&specs);
            let margins = Margins {
                clock_error_bound_ns: 0,
                release_jitter_ns: jitter * US,
                interference_ns: interference * US,
                ..Margins::default()
            };
            if admit_node(&tasks, margins).is_ok() {
                let i_ns = interference * US;
                // Every job delayed by the whole I, by none, and by a
                // random amount up to I (xorshift from the seed).
                prop_assert!(simulate_np_edf_delayed(&tasks, margins, &mut |_| i_ns));
                prop_assert!(simulate_np_edf_delayed(&tasks, margins, &mut |_| 0));
                let mut x = seed | 1;
                let mut random_up_to_i = |_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % (i_ns + 1)
                };
                prop_assert!(simulate_np_edf_delayed(&tasks, margins, &mut random_up_to_i));
            }
        }

        #[test]
        fn accepted_sets_meet_every_deadline_when_the_host_stalls_across_releases(
            specs in proptest::collection::vec((0u64..10, 1u64..4, 1u64..30, 5u64..50), 1..5),
            interference in 0u64..40,
            seed in any::<u64>(),
        ) {
            let tasks = random_tasks(&specs);
            // No release jitter: a late release is the stall's doing, and
            // charged only as interference.
            let margins = Margins { clock_error_bound_ns: 0, release_jitter_ns: 0, interference_ns: interference * US, ..Margins::default() };
            if admit_node(&tasks, margins).is_ok() {
                let i_ns = interference * US;
                let jobs = jobs_of(&tasks, margins);
                let mut x = seed | 1;
                let mut random = |below: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % below.max(1)
                };
                // Random stalls, and the longest ones (each a whole I).
                let stalls = stalls_within_the_model(&jobs, i_ns, &mut random);
                prop_assert!(simulate_np_edf_stalled(&tasks, margins, &stalls), "stalls {:?}", stalls);
                let mut whole = |below: u64| if below > i_ns { random(below) } else { below.saturating_sub(1) };
                let stalls = stalls_within_the_model(&jobs, i_ns, &mut whole);
                prop_assert!(simulate_np_edf_stalled(&tasks, margins, &stalls), "stalls {:?}", stalls);
            }
        }

        #[test]
        fn admission_is_monotone_in_margins(c in 1u64..70, d in 70u64..100, j in 0u64..100) {
            let tasks = vec![task("t", 0, MS, c * US, d * US)];
            let small = Margins { clock_error_bound_ns: 0, release_jitter_ns: j * US / 2, interference_ns: j * US / 4, ..Margins::default() };
            let big = Margins { clock_error_bound_ns: 0, release_jitter_ns: j * US, interference_ns: j * US / 2, ..Margins::default() };
            if admit_node(&tasks, big).is_ok() {
                prop_assert!(admit_node(&tasks, small).is_ok());
            }
        }
    }
}
