//! Calibration: this machine's release jitter and interference, and a
//! channel task's compute time, measured before commit.

use spindle_runtime::monotonic_ns;

use crate::buffers::{BufferPool, IteratorPolicy};
use crate::layout::{MESSAGE_HEADER_BYTES, SLOT_HEADER_BYTES};
use crate::os::{sleep_until_hybrid, sleep_until_measured, spin_for_gaps};

/// Most wake-ups one host calibration makes (its sample buffers are
/// allocated up front).
pub const CALIBRATION_WAKEUPS_MAX: usize = 100_000;
/// Longest host calibration.
pub const CALIBRATION_NS_MAX: u64 = 120_000_000_000;
/// The stall detector's spin after each calibration wake-up (at most half
/// the gap between wake-ups): long enough to see the host take the CPU,
/// short enough that members calibrating at once rarely spin together.
pub const INTERFERENCE_PROBE_NS: u64 = 500_000;

/// What a host calibration measured (see [`crate::interference`]).
#[derive(Debug, Clone, Default)]
pub struct HostCalibration {
    /// Each wake-up's lateness at its target that nothing took the CPU
    /// for ([`crate::os::Wake::undisturbed_late_ns`]: release-jitter
    /// samples; 0 for a disturbed wake-up, whose lateness is lost time).
    pub release_jitter_ns: Vec<u64>,
    /// Each wake-up's lost time: its lateness when the host took the CPU
    /// across the target ([`crate::os::Wake::lost_before_release_ns`])
    /// plus the probe's time lost to gaps after it (what a job released
    /// then would have lost), or the longest gap while spinning to the
    /// target, whichever is larger.
    pub lost_ns: Vec<u64>,
    /// The longest single gap seen.
    pub gap_max_ns: u64,
    /// How long the calibration ran.
    pub duration_ns: u64,
}

/// How a host calibration runs (see [`calibrate_host`]).
#[derive(Debug, Clone, Copy)]
pub struct CalibrationPlan {
    /// At least this many wake-ups, and at least this long.
    pub wakeups_min: usize,
    pub duration_ns: u64,
    /// Wake-ups this far apart, each spinning `spin_ns` towards its
    /// target, then `probe_ns` more (at most half the gap).
    pub gap_ns: u64,
    pub spin_ns: u64,
    pub probe_ns: u64,
    /// Targets at `k × gap + phase` of `CLOCK_MONOTONIC`: members of one
    /// host calibrating at once take phases `rank × gap / members`, so
    /// that their spins do not overlap (three spinning members on two
    /// CPUs would measure each other, not the host).
    pub phase_ns: u64,
}

/// Calibrate this host for admission: wake-ups `gap_ns` apart, each a
/// hybrid sleep with `spin_ns` of spin (its lateness: release jitter, or
/// lost time when the host took the CPU across the target)
/// followed by the stall detector ([`spin_for_gaps`]) for `probe_ns`;
/// until at least `wakeups_min` wake-ups have been made *and*
/// `duration_ns` has passed (seconds: long enough to see the host's
/// preemptions, not only its wake-up latency), bounded by
/// [`CALIBRATION_WAKEUPS_MAX`] and [`CALIBRATION_NS_MAX`].
pub fn calibrate_host(plan: CalibrationPlan) -> HostCalibration {
    let CalibrationPlan {
        wakeups_min,
        duration_ns,
        gap_ns,
        spin_ns,
        probe_ns,
        phase_ns,
    } = plan;
    assert!(gap_ns > 0, "calibration wake-ups need a gap");
    let duration_ns = duration_ns.min(CALIBRATION_NS_MAX);
    // Room for the wake-ups the duration holds (and the first one's
    // alignment); the loop stops at the duration or the minimum count.
    let planned = (duration_ns / gap_ns + 2).max(wakeups_min as u64);
    let capacity = (planned as usize).min(CALIBRATION_WAKEUPS_MAX);
    let wakeups_max = CALIBRATION_WAKEUPS_MAX;
    let probe_ns = probe_ns.min(gap_ns / 2);
    let mut out = HostCalibration {
        release_jitter_ns: Vec::with_capacity(capacity),
        lost_ns: Vec::with_capacity(capacity),
        ..HostCalibration::default()
    };
    let start = monotonic_ns();
    let aligned = |at: u64| at.next_multiple_of(gap_ns) + phase_ns % gap_ns;
    let mut target = aligned(start + gap_ns);
    while out.release_jitter_ns.len() < wakeups_max {
        let elapsed = monotonic_ns() - start;
        if out.release_jitter_ns.len() >= wakeups_min && elapsed >= duration_ns {
            break;
        }
        if elapsed >= CALIBRATION_NS_MAX {
            break;
        }
        let wake = sleep_until_measured(target, spin_ns);
        let gaps = spin_for_gaps(probe_ns);
        // One stall is charged once: lateness the host caused is lost
        // time (with what the probe lost after it), not release jitter too.
        let lost_before_ns = wake.lost_before_release_ns(spin_ns);
        out.release_jitter_ns.push(wake.late_ns - lost_before_ns);
        out.lost_ns
            .push(lost_before_ns.saturating_add(gaps.lost_ns).max(wake.gap_max_ns));
        out.gap_max_ns = out.gap_max_ns.max(gaps.gap_max_ns).max(wake.gap_max_ns);
        target += gap_ns;
        // After a stall longer than the gap: the next wake-up is a gap from
        // now (no burst of zero-length sleeps).
        let now = monotonic_ns();
        if target <= now {
            target = aligned(now + gap_ns);
        }
    }
    out.duration_ns = monotonic_ns() - start;
    debug_assert_eq!(out.release_jitter_ns.len(), out.lost_ns.len());
    out
}

/// Measure the dispatcher's release jitter on this machine: `samples`
/// hybrid wake-ups `period_ns` apart; returns each wake-up's lateness.
pub fn calibrate_release_jitter(samples: usize, period_ns: u64, spin_ns: u64) -> Vec<u64> {
    let mut out = Vec::with_capacity(samples);
    let mut target = monotonic_ns() + period_ns;
    for _ in 0..samples {
        out.push(sleep_until_hybrid(target, spin_ns));
        target += period_ns;
    }
    out
}

/// Measure a channel task's compute time for `message_bytes` messages,
/// `messages` per period: the 90th percentile of `rounds` copies through
/// a pool and a slot-sized buffer, doubled for safety, at least
/// `floor_ns`. Not the worst round: on a shared machine one round in 64
/// may be preempted for milliseconds, which is interference (measured on
/// its own, see `interference`), not the copy's cost.
pub fn measure_channel_compute_ns(message_bytes: usize, messages: usize, rounds: usize, floor_ns: u64) -> u64 {
    let mut pool = BufferPool::new(IteratorPolicy::Fifo, messages.max(1), message_bytes.max(1));
    let mut slot = vec![0u8; messages.max(1) * (message_bytes + MESSAGE_HEADER_BYTES) + SLOT_HEADER_BYTES];
    let msg = vec![7u8; message_bytes.max(1)];
    let mut took_ns = Vec::with_capacity(rounds.max(1));
    for _ in 0..rounds.max(1) {
        for _ in 0..messages {
            let _ = pool.insert(&msg, 0);
        }
        let t0 = monotonic_ns();
        let mut at = SLOT_HEADER_BYTES;
        while pool
            .take_with(|m, _| {
                slot[at..at + m.len()].copy_from_slice(m);
                at += m.len() + MESSAGE_HEADER_BYTES;
            })
            .is_some()
        {}
        std::hint::black_box(&slot);
        took_ns.push(monotonic_ns() - t0);
    }
    took_ns.sort_unstable();
    let p90 = took_ns[(took_ns.len() * 9 / 10).min(took_ns.len() - 1)];
    (p90 * 2).max(floor_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_calibration_makes_its_wake_ups_and_lasts_its_duration() {
        let plan = CalibrationPlan {
            wakeups_min: 5,
            duration_ns: 20_000_000,
            gap_ns: 2_000_000,
            spin_ns: 50_000,
            probe_ns: INTERFERENCE_PROBE_NS,
            phase_ns: 700_000,
        };
        let c = calibrate_host(plan);
        assert!(c.release_jitter_ns.len() >= 5 && c.release_jitter_ns.len() == c.lost_ns.len());
        assert!(c.duration_ns >= 20_000_000, "{}", c.duration_ns);
        assert!(c.lost_ns.iter().all(|l| *l <= c.duration_ns));
        // Fewer wake-ups asked than the duration holds: the duration rules.
        let c = calibrate_host(CalibrationPlan {
            wakeups_min: 1,
            duration_ns: 0,
            gap_ns: 1_000_000,
            ..plan
        });
        assert_eq!(c.release_jitter_ns.len(), 1);
    }
}
