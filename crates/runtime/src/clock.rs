//! The OS clock. Protocol crates never read it: they take `now_ns` as an
//! argument, so the simulator can drive them with simulated time. The
//! runtime, the CLI and the benchmarks read it here and pass it down.

/// Nanoseconds of a `timespec` (fits in a `u64` for 584 years of uptime).
#[inline]
fn timespec_ns(ts: &libc::timespec) -> u64 {
    debug_assert!(ts.tv_sec >= 0 && (0..1_000_000_000).contains(&ts.tv_nsec));
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Monotonic nanoseconds (CLOCK_MONOTONIC: one clock for every process of
/// a host, so timestamps compare across members on shm).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable out-pointer for the duration of the
    // call, and CLOCK_MONOTONIC is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    timespec_ns(&ts)
}

/// Coarse monotonic nanoseconds (CLOCK_MONOTONIC_COARSE: a few ns to read,
/// ticks of a few ms): for timeouts and intervals, never for latency.
#[inline]
pub fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable out-pointer for the duration of the
    // call, and CLOCK_MONOTONIC_COARSE is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    timespec_ns(&ts)
}

/// Wall-clock nanoseconds since the Unix epoch (CLOCK_REALTIME): for
/// timestamps that other hosts compare (a DDS sample's source timestamp).
/// It may jump when the clock is set: never use it for intervals.
#[inline]
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable out-pointer for the duration of the
    // call, and CLOCK_REALTIME is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    timespec_ns(&ts)
}

/// The timer slack `pace_until` gives its thread (the kernel's default,
/// 50 µs, would make every short sleep 50 µs late).
const PACE_TIMER_SLACK_NS: libc::c_ulong = 1_000;

thread_local! {
    static PACE_SLACK_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Wait until the monotonic clock reads `deadline_ns`, without burning
/// the CPU where the wait is long and precisely where it is short: sleep
/// for all but the last `spin_ns`, then spin. The calling thread's timer
/// slack is set to 1 µs on first use, so a sleep wakes within a few µs
/// of its time. Returns the clock when done.
pub fn pace_until(deadline_ns: u64, spin_ns: u64) -> u64 {
    PACE_SLACK_SET.with(|set| {
        if !set.get() {
            // SAFETY: PR_SET_TIMERSLACK takes one integer argument and
            // only changes this thread's timer slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, PACE_TIMER_SLACK_NS) };
            set.set(true);
        }
    });
    let mut now = monotonic_ns();
    if deadline_ns > now + spin_ns {
        std::thread::sleep(std::time::Duration::from_nanos(deadline_ns - now - spin_ns));
        now = monotonic_ns();
    }
    // The short rest: yield rather than spin, so that on a machine with
    // fewer cores than busy threads the progress loops run meanwhile (a
    // pure spin would hold the core until preempted).
    while now < deadline_ns {
        std::thread::yield_now();
        now = monotonic_ns();
    }
    now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_never_go_backwards() {
        let mut fine_ns = monotonic_ns();
        let mut coarse_ns = monotonic_coarse_ns();
        assert!(fine_ns > 0 && coarse_ns > 0);
        for _ in 0..1_000 {
            let (next_fine_ns, next_coarse_ns) = (monotonic_ns(), monotonic_coarse_ns());
            assert!(next_fine_ns >= fine_ns, "CLOCK_MONOTONIC went backwards");
            assert!(next_coarse_ns >= coarse_ns, "CLOCK_MONOTONIC_COARSE went backwards");
            (fine_ns, coarse_ns) = (next_fine_ns, next_coarse_ns);
        }
    }

    #[test]
    fn timespec_converts_to_ns() {
        let ts = libc::timespec { tv_sec: 3, tv_nsec: 7 };
        assert_eq!(timespec_ns(&ts), 3_000_000_007);
    }
}
