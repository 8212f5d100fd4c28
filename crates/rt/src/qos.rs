//! Time QoS of channels and tasks (MPI/RT time-driven model), and the
//! schedule they imply once a commit has fixed `epoch_start`.
//!
//! Every periodic task `τ` has a release offset `O`, a period `T`, a
//! relative deadline `D` and a compute time `C`. Job `k` of `τ` is
//! released at `epoch_start + k·T + O`, must finish by that plus `D`, and
//! therefore must *start* by its critical start time `release + D − C`:
//!
//! ```text
//!   epoch_start        release(k)        critical start   deadline(k)
//!   |── k·T ──────────|── O ──┐            |                |
//!                             ├────── D − C ──┤── C ─────────┤
//! ```

use std::fmt;

/// Longest task or channel name (bytes): names travel in fixed rows.
pub const NAME_BYTES_MAX: usize = 40;

/// Why a QoS or task description is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    #[error("task '{task}': period_ns must be > 0")]
    PeriodZero { task: String },
    #[error("task '{task}': deadline_ns {deadline_ns} must be in 1..=period_ns ({period_ns})")]
    DeadlineOutOfRange {
        task: String,
        deadline_ns: u64,
        period_ns: u64,
    },
    #[error("task '{task}': release_offset_ns {release_offset_ns} must be < period_ns ({period_ns})")]
    ReleaseOutOfRange {
        task: String,
        release_offset_ns: u64,
        period_ns: u64,
    },
    #[error("task '{task}': compute_ns {compute_ns} must be in 1..=deadline_ns ({deadline_ns})")]
    ComputeOutOfRange {
        task: String,
        compute_ns: u64,
        deadline_ns: u64,
    },
    #[error("task name '{task}' must be 1..={NAME_BYTES_MAX} bytes of printable ASCII")]
    BadName { task: String },
}

/// A time-driven QoS: release offset within the period, period, relative
/// deadline (all nanoseconds). Periods start at the commit's `epoch_start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeQos {
    pub release_offset_ns: u64,
    pub period_ns: u64,
    pub deadline_ns: u64,
}

impl TimeQos {
    pub const fn new(release_offset_ns: u64, period_ns: u64, deadline_ns: u64) -> TimeQos {
        TimeQos {
            release_offset_ns,
            period_ns,
            deadline_ns,
        }
    }

    /// Check `0 < deadline ≤ period` and `release_offset < period`.
    pub fn validate(&self, task: &str) -> Result<(), QosError> {
        let task = task.to_string();
        if self.period_ns == 0 {
            return Err(QosError::PeriodZero { task });
        }
        if self.deadline_ns == 0 || self.deadline_ns > self.period_ns {
            return Err(QosError::DeadlineOutOfRange {
                task,
                deadline_ns: self.deadline_ns,
                period_ns: self.period_ns,
            });
        }
        if self.release_offset_ns >= self.period_ns {
            return Err(QosError::ReleaseOutOfRange {
                task,
                release_offset_ns: self.release_offset_ns,
                period_ns: self.period_ns,
            });
        }
        Ok(())
    }

    /// Absolute release time of job `k` (saturating: far-future times stay far).
    pub fn release_ns(&self, epoch_start_ns: u64, k: u64) -> u64 {
        epoch_start_ns
            .saturating_add(k.saturating_mul(self.period_ns))
            .saturating_add(self.release_offset_ns)
    }

    /// Absolute deadline of job `k`.
    pub fn deadline_abs_ns(&self, epoch_start_ns: u64, k: u64) -> u64 {
        self.release_ns(epoch_start_ns, k).saturating_add(self.deadline_ns)
    }

    /// The first job whose release is at or after `now_ns`.
    pub fn first_job_at_or_after(&self, epoch_start_ns: u64, now_ns: u64) -> u64 {
        let first = epoch_start_ns + self.release_offset_ns;
        if now_ns <= first {
            return 0;
        }
        (now_ns - first).div_ceil(self.period_ns)
    }
}

/// Whether a task moves a channel's buffers or is the application's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// The send side of a channel: moves buffers out at its release.
    ChannelSend,
    /// The receive side of a channel: takes buffers in at its release.
    ChannelReceive,
    /// An application computation task registered with the dispatcher.
    Computation,
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskKind::ChannelSend => "channel send",
            TaskKind::ChannelReceive => "channel receive",
            TaskKind::Computation => "computation",
        })
    }
}

/// One periodic task as admission control sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    pub name: String,
    pub kind: TaskKind,
    pub qos: TimeQos,
    /// Worst-case compute time, measured or declared.
    pub compute_ns: u64,
}

impl TaskSpec {
    pub fn new(name: &str, kind: TaskKind, qos: TimeQos, compute_ns: u64) -> TaskSpec {
        TaskSpec {
            name: name.to_string(),
            kind,
            qos,
            compute_ns,
        }
    }

    pub fn validate(&self) -> Result<(), QosError> {
        let printable = self.name.bytes().all(|b| (0x20..0x7f).contains(&b));
        if self.name.is_empty() || self.name.len() > NAME_BYTES_MAX || !printable {
            return Err(QosError::BadName {
                task: self.name.clone(),
            });
        }
        self.qos.validate(&self.name)?;
        if self.compute_ns == 0 || self.compute_ns > self.qos.deadline_ns {
            return Err(QosError::ComputeOutOfRange {
                task: self.name.clone(),
                compute_ns: self.compute_ns,
                deadline_ns: self.qos.deadline_ns,
            });
        }
        Ok(())
    }

    /// Latest start time of job `k` that still meets its deadline.
    pub fn critical_start_ns(&self, epoch_start_ns: u64, k: u64) -> u64 {
        self.qos
            .deadline_abs_ns(epoch_start_ns, k)
            .saturating_sub(self.compute_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn qos_validation_names_the_bad_value() {
        let e = TimeQos::new(0, 0, 1).validate("x").unwrap_err();
        assert_eq!(e, QosError::PeriodZero { task: "x".into() });
        let e = TimeQos::new(0, 10, 11).validate("x").unwrap_err();
        assert!(e.to_string().contains("11"), "{e}");
        let e = TimeQos::new(10, 10, 5).validate("x").unwrap_err();
        assert!(e.to_string().contains("release_offset_ns 10"), "{e}");
        assert!(TimeQos::new(9, 10, 10).validate("x").is_ok());
    }

    #[test]
    fn task_validation_rejects_compute_beyond_deadline_and_bad_names() {
        let q = TimeQos::new(0, 100, 50);
        assert!(TaskSpec::new("a", TaskKind::Computation, q, 51).validate().is_err());
        assert!(TaskSpec::new("a", TaskKind::Computation, q, 0).validate().is_err());
        assert!(TaskSpec::new("", TaskKind::Computation, q, 5).validate().is_err());
        assert!(TaskSpec::new("a\n", TaskKind::Computation, q, 5).validate().is_err());
        assert!(TaskSpec::new("a", TaskKind::Computation, q, 50).validate().is_ok());
    }

    #[test]
    fn schedule_of_the_thesis_channel_send_task() {
        // Table 5.1, node A "Channel Send": start 75 µs, period 5 ms, C 50 µs, D 75 µs.
        let t = TaskSpec::new(
            "send",
            TaskKind::ChannelSend,
            TimeQos::new(75_000, 5_000_000, 75_000),
            50_000,
        );
        assert_eq!(t.qos.release_ns(1_000, 0), 76_000);
        assert_eq!(t.qos.release_ns(1_000, 2), 10_076_000);
        assert_eq!(t.qos.deadline_abs_ns(1_000, 0), 151_000);
        assert_eq!(t.critical_start_ns(1_000, 0), 101_000);
    }

    proptest! {
        #[test]
        fn first_job_at_or_after_is_the_first(epoch in 0u64..1_000_000_000, off in 0u64..1_000, period in 1_000u64..100_000, now in 0u64..2_000_000_000) {
            let q = TimeQos::new(off % period, period, period);
            let k = q.first_job_at_or_after(epoch, now);
            prop_assert!(q.release_ns(epoch, k) >= now);
            if k > 0 {
                prop_assert!(q.release_ns(epoch, k - 1) < now);
            }
        }
    }
}
