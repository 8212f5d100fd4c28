//! The thin OS layer of the dispatcher: real-time priority, timer slack,
//! memory locking, and the hybrid sleep-then-spin release.
//!
//! Nothing here is protocol logic; each call says clearly what the OS
//! granted, so a run can report "SCHED_FIFO 80 granted" or "SCHED_FIFO
//! refused: EPERM (run as root or grant CAP_SYS_NICE / RLIMIT_RTPRIO)".

use spindle_runtime::monotonic_ns;

/// What the OS granted the calling thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtPrivileges {
    /// `Ok(priority)` or the reason SCHED_FIFO was refused.
    pub sched_fifo: Result<i32, String>,
    pub timer_slack_ns: Option<u64>,
    pub memory_locked: bool,
}

impl RtPrivileges {
    pub fn describe(&self) -> String {
        let fifo = match &self.sched_fifo {
            Ok(p) => format!("SCHED_FIFO priority {p} granted"),
            Err(e) => format!("SCHED_FIFO refused ({e}): releases use the normal scheduler"),
        };
        let slack = match self.timer_slack_ns {
            Some(ns) => format!("timer slack {ns} ns"),
            None => "timer slack unchanged (prctl refused)".into(),
        };
        let lock = if self.memory_locked {
            "memory locked"
        } else {
            "memory not locked"
        };
        format!("{fifo}; {slack}; {lock}")
    }
}

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Ask for SCHED_FIFO at `priority` (when `want_fifo`), timer slack 1 ns
/// and locked memory for the calling thread; report what was granted.
pub fn request_rt_privileges(want_fifo: bool, priority: i32, lock_memory: bool) -> RtPrivileges {
    let sched_fifo = if want_fifo {
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        if rc == 0 {
            Ok(priority)
        } else {
            Err(format!("{}; needs root, CAP_SYS_NICE or RLIMIT_RTPRIO", errno_text()))
        }
    } else {
        Err("not requested (--no-fifo)".into())
    };
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long value; no pointers.
    let slack_rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let lock_rc = if lock_memory {
        // SAFETY: mlockall takes flags only.
        unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) }
    } else {
        -1
    };
    RtPrivileges {
        sched_fifo,
        timer_slack_ns: (slack_rc == 0).then_some(1),
        memory_locked: lock_rc == 0,
    }
}

/// Return the calling thread to SCHED_OTHER (after a run).
pub fn drop_rt_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: valid sched_param; pid 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
}

/// Sleep until `CLOCK_MONOTONIC` reads `target_mono_ns`: an absolute
/// `clock_nanosleep` to `spin_ns` before, then spin. Returns the lateness
/// (now − target) in ns once the target is reached.
pub fn sleep_until_hybrid(target_mono_ns: u64, spin_ns: u64) -> u64 {
    sleep_until_measured(target_mono_ns, spin_ns).late_ns
}

/// What one hybrid wake-up measured (see [`sleep_until_measured`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// now − target when the spin saw the target (the release jitter).
    pub late_ns: u64,
    /// How much later than asked the sleep woke; `None`: no sleep (the
    /// wake-up time had already passed).
    pub overshoot_ns: Option<u64>,
    /// When, after the asked wake-up time, the thread last *resumed* from
    /// a disturbance: the sleep's return, or the end of the last gap over
    /// [`SPIN_GAP_NS`] while spinning (the thread lost its CPU: an
    /// interrupt, a higher-priority thread, the hypervisor). A window at
    /// least this long would have kept this release on time. `None`: no sleep.
    pub settled_ns: Option<u64>,
    /// The longest gap between two clock reads of the spin (how long the
    /// thread lost its CPU at once while spinning; interference).
    pub gap_max_ns: u64,
}

impl Wake {
    /// The part of this release's lateness the host took: all of it when
    /// the wake-up was disturbed (the sleep woke past the target, i.e. it
    /// overshot the `spin_ns` window; there was no sleep because the
    /// target had passed before the thread got to it; or the thread lost
    /// its CPU for more than [`GAP_COUNTED_NS`] while spinning), else 0.
    ///
    /// Admission charges this as *interference* (time lost), never as
    /// release jitter as well: one stall is charged once
    /// ([`crate::admission`]'s fault model). What is left,
    /// [`Wake::undisturbed_late_ns`], is the release jitter proper: how
    /// late a release is when nothing took the CPU (the spin loop's own
    /// granularity, tens of ns).
    pub fn lost_before_release_ns(&self, spin_ns: u64) -> u64 {
        let disturbed = self.overshoot_ns.is_none_or(|o| o > spin_ns) || self.gap_max_ns > GAP_COUNTED_NS;
        if disturbed {
            self.late_ns
        } else {
            0
        }
    }

    /// The lateness nothing explains ([`Wake::lost_before_release_ns`]'s rest).
    pub fn undisturbed_late_ns(&self, spin_ns: u64) -> u64 {
        self.late_ns - self.lost_before_release_ns(spin_ns)
    }
}

/// A gap between two clock reads of the spin loop longer than this means
/// the spinning thread lost its CPU for long enough to matter (the
/// release-jitter target). Shorter gaps (timer ticks: a few µs every few
/// ms on the VM this was built on) are ignored: they come at any time,
/// and a wider window would only see more of them.
pub const SPIN_GAP_NS: u64 = 10_000;

/// [`sleep_until_hybrid`], also returning how much later than asked the
/// sleep itself woke (its *overshoot*) and when the thread last resumed
/// from a disturbance ([`Wake`]). A release is late when the sleep
/// overshoots the spin window or the spin is interrupted across the
/// target; [`crate::spin::SpinTuner`] learns the window from these.
pub fn sleep_until_measured(target_mono_ns: u64, spin_ns: u64) -> Wake {
    let wake_ns = target_mono_ns.saturating_sub(spin_ns);
    let mut overshoot = None;
    if monotonic_ns() < wake_ns {
        let ts = libc::timespec {
            tv_sec: (wake_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (wake_ns % 1_000_000_000) as libc::c_long,
        };
        // Bounded: EINTR only (a signal), at most a few times.
        for _ in 0..1_000 {
            // SAFETY: `ts` is a valid timespec; the remainder pointer may be
            // null with TIMER_ABSTIME.
            let rc =
                unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
            if rc != libc::EINTR {
                break;
            }
        }
        overshoot = Some(monotonic_ns().saturating_sub(wake_ns));
    }
    let mut resumed = overshoot.map(|o| wake_ns + o);
    let mut prev = monotonic_ns();
    let mut gap_max_ns = 0;
    loop {
        let now = monotonic_ns();
        let gap = now - prev;
        gap_max_ns = gap_max_ns.max(gap);
        if gap > SPIN_GAP_NS && resumed.is_some() {
            resumed = Some(now);
        }
        if now >= target_mono_ns {
            return Wake {
                late_ns: now - target_mono_ns,
                overshoot_ns: overshoot,
                settled_ns: resumed.map(|r| r - wake_ns),
                gap_max_ns,
            };
        }
        prev = now;
        std::hint::spin_loop();
    }
}

/// Gaps between two clock reads shorter than this are the loop itself
/// (a clock read is tens of ns); longer ones are time the thread lost.
pub const GAP_COUNTED_NS: u64 = 1_000;

/// What one stall-detector spin saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Time lost to gaps over [`GAP_COUNTED_NS`], in all.
    pub lost_ns: u64,
    /// The longest single gap.
    pub gap_max_ns: u64,
    /// How many gaps over [`GAP_COUNTED_NS`].
    pub gaps: u64,
}

/// The stall detector: spin reading `CLOCK_MONOTONIC` for `duration_ns`
/// and record every gap between two reads (the thread lost its CPU: an
/// interrupt, a higher-priority thread, the hypervisor). A gap that runs
/// past the end is counted whole.
pub fn spin_for_gaps(duration_ns: u64) -> Gaps {
    let start = monotonic_ns();
    let end = start.saturating_add(duration_ns);
    let mut out = Gaps::default();
    let mut prev = start;
    loop {
        let now = monotonic_ns();
        let gap = now - prev;
        if gap > GAP_COUNTED_NS {
            out.lost_ns += gap;
            out.gaps += 1;
            out.gap_max_ns = out.gap_max_ns.max(gap);
        }
        if now >= end {
            return out;
        }
        prev = now;
        std::hint::spin_loop();
    }
}

/// Move the calling thread into the network namespace `name` (as made by
/// `ip netns add name`, i.e. `/var/run/netns/name`). Threads it starts
/// afterwards inherit it; call it before opening sockets or starting
/// threads. Needs CAP_SYS_ADMIN (root).
pub fn enter_netns(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("network namespace '{name}': not a namespace name"));
    }
    let path = format!("/var/run/netns/{name}");
    let file = std::fs::File::open(&path).map_err(|e| format!("network namespace '{name}' ({path}): {e}"))?;
    // SAFETY: the fd is open for the duration of the call (`file` lives
    // until the end of this function); CLONE_NEWNET changes only this
    // thread's network namespace, no memory is passed.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(format!(
            "enter network namespace '{name}': {}; needs root (CAP_SYS_ADMIN)",
            errno_text()
        ));
    }
    Ok(())
}

/// Give every thread of this process whose name starts with `prefix`
/// SCHED_FIFO at `priority` (e.g. a fabric's receive thread, which the
/// dispatcher's data depends on). Returns how many threads were raised.
pub fn raise_threads_named(prefix: &str, priority: i32) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut raised = 0;
    for task in tasks.flatten().take(4_096) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let Ok(tid) = task.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: `param` is a valid sched_param; `tid` is a thread of this
        // process (a stale tid fails with ESRCH, harmlessly).
        raised += usize::from(unsafe { libc::sched_setscheduler(tid, libc::SCHED_FIFO, &param) } == 0);
    }
    raised
}

/// Pin the calling thread to `cpu` (best effort; returns whether it worked).
pub fn pin_to_cpu(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t and cpu < CPU_SETSIZE is checked.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        libc::CPU_SET(cpu, &mut set);
    }
    // SAFETY: valid set and size; pid 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_sleep_never_returns_early() {
        for spin_ns in [0, 50_000, 10_000_000] {
            let target = monotonic_ns() + 200_000;
            sleep_until_hybrid(target, spin_ns);
            assert!(monotonic_ns() >= target);
        }
        // A target in the past returns at once with its lateness.
        assert!(sleep_until_hybrid(0, 0) > 0);
        let w = sleep_until_measured(0, 0);
        assert_eq!(
            (w.overshoot_ns, w.settled_ns),
            (None, None),
            "no sleep, nothing measured"
        );
        let w = sleep_until_measured(monotonic_ns() + 200_000, 50_000);
        assert!(
            w.settled_ns >= w.overshoot_ns && w.overshoot_ns.is_some(),
            "it slept: {w:?}"
        );
    }

    #[test]
    fn a_late_release_is_lost_time_when_the_host_took_the_cpu_and_jitter_otherwise() {
        let wake = |late_ns, overshoot_ns, gap_max_ns| Wake {
            late_ns,
            overshoot_ns,
            settled_ns: overshoot_ns,
            gap_max_ns,
        };
        let spin = 100_000;
        // Undisturbed: slept into the window, spun without a gap: jitter.
        let w = wake(40, Some(30_000), 200);
        assert_eq!((w.lost_before_release_ns(spin), w.undisturbed_late_ns(spin)), (0, 40));
        // Slept past the window (the vCPU was descheduled): all lost.
        let w = wake(4_348_124, Some(4_448_124), 0);
        assert_eq!(
            (w.lost_before_release_ns(spin), w.undisturbed_late_ns(spin)),
            (4_348_124, 0)
        );
        // Lost the CPU while spinning across the target: all lost.
        let w = wake(400_000, Some(10_000), 500_000);
        assert_eq!(
            (w.lost_before_release_ns(spin), w.undisturbed_late_ns(spin)),
            (400_000, 0)
        );
        // No sleep: the target passed before the thread got to it.
        let w = wake(2_000, None, 0);
        assert_eq!(w.lost_before_release_ns(spin), 2_000);
    }

    #[test]
    fn the_stall_detector_spins_its_duration_and_counts_only_long_gaps() {
        let start = monotonic_ns();
        let g = spin_for_gaps(300_000);
        assert!(monotonic_ns() - start >= 300_000);
        assert!(g.gap_max_ns <= g.lost_ns || g.gaps == 0, "{g:?}");
        assert!(g.lost_ns == 0 || g.gap_max_ns > GAP_COUNTED_NS, "{g:?}");
    }

    #[test]
    fn privileges_are_reported_either_way() {
        let p = std::thread::spawn(|| {
            let p = request_rt_privileges(false, 10, false);
            drop_rt_priority();
            p
        })
        .join()
        .unwrap();
        assert!(p.sched_fifo.is_err());
        assert!(p.describe().contains("not requested"));
    }
}
