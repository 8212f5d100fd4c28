//! The self-tuning spin window of the hybrid release (see
//! [`crate::os::sleep_until_hybrid`]).
//!
//! The dispatcher sleeps with `clock_nanosleep` until `spin` before a
//! release, then spins. A release is late when the sleep overshoots
//! (wakes later than asked) by more than the spin window, or when the
//! spinning thread loses its CPU across the release time. On the nested
//! VM this was built on, the second is the common case: a thread that has
//! just woken from a sleep is interrupted for more than 10 µs again
//! within the next 1–2 ms almost every time (seen in `spindle rt ring`'s
//! late-wake causes, bench/RESULTS-rt.md §7). So the window should cover
//! a high quantile of the *settling time*: from the asked wake-up time
//! until the thread last resumed from a disturbance
//! ([`crate::os::Wake::settled_ns`]; the overshoot when the spin ran
//! undisturbed), counted up to [`SETTLE_HORIZON_NS`] after the sleep
//! returned ([`learnable_ns`]: later disturbances are not caused by the
//! wake-up). That is measured, not assumed: a [`SpinTuner`] keeps a
//! histogram of settling times (seeded by a calibration before the run,
//! fed by every sleep of the dispatcher during it) and sets the window to
//!
//! ```text
//! window = clamp(q(SPIN_QUANTILE_PPM) × 5/4 + SPIN_MARGIN_NS, floor, cap)
//! ```
//!
//! - `floor`: the window chosen at calibration. The release jitter that
//!   admission control uses was measured with it, and a wider window can
//!   only make releases earlier, so the admitted figure stays honest
//!   whatever the tuner does during the run.
//! - `cap`: at most [`SPIN_CAP_DIVISOR`]-th of the shortest task period
//!   per release (and at most [`SPIN_MAX_NS`]), so a spinning
//!   SCHED_FIFO dispatcher can never hold a core for long: with `n`
//!   releases per period it spins at most `n / 16` of that core.
//!
//! Old observations fade (every [`SPIN_DECAY_SAMPLES`] samples every
//! count is halved), so the window follows the machine. Everything is
//! fixed-size: no allocation on the dispatch path.

use spindle_runtime::monotonic_ns;

use crate::os::{sleep_until_measured, Wake};

/// The window covers this quantile of the observed settling times (ppm).
pub const SPIN_QUANTILE_PPM: u64 = 990_000;
/// Added to the scaled quantile.
pub const SPIN_MARGIN_NS: u64 = 10_000;
/// The smallest window the tuner chooses.
pub const SPIN_MIN_NS: u64 = 20_000;
/// The largest window anything chooses (as `--spin-us` allows).
pub const SPIN_MAX_NS: u64 = 10_000_000;
/// Cap per release: the shortest task period divided by this.
pub const SPIN_CAP_DIVISOR: u64 = 16;
/// Counts are halved each time this many samples have come in.
pub const SPIN_DECAY_SAMPLES: u32 = 4_096;
/// How often (in samples) the dispatcher recomputes the window.
const RETUNE_EVERY: u32 = 8;

/// Histogram buckets: 8 exact ones below 8 ns, then 8 per power of two
/// (12.5 % wide) up to 2^34 ns (17 s; larger values land in the last).
pub(crate) const BUCKETS: usize = 8 + 32 * 8;

/// The cap for a node whose shortest task period is `period_min_ns`.
pub fn spin_cap_ns(period_min_ns: u64) -> u64 {
    (period_min_ns / SPIN_CAP_DIVISOR).clamp(SPIN_MIN_NS, SPIN_MAX_NS)
}

pub(crate) fn bucket_of(v: u64) -> usize {
    if v < 8 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as usize; // 3..=63
    let sub = ((v >> (e - 3)) & 7) as usize;
    ((e - 2) * 8 + sub).min(BUCKETS - 1)
}

/// The largest value that falls in bucket `i`.
pub(crate) fn bucket_upper(i: usize) -> u64 {
    if i < 8 {
        return i as u64;
    }
    let (e, sub) = (i / 8 + 2, (i % 8) as u64);
    ((8 + sub + 1) << (e - 3)) - 1
}

/// Overshoot statistics and the window they call for.
#[derive(Debug, Clone)]
pub struct SpinTuner {
    counts: [u32; BUCKETS],
    total: u32,
    floor_ns: u64,
    cap_ns: u64,
    window_ns: u64,
    since_retune: u32,
    /// Samples seen in all (not decayed).
    pub samples: u64,
    /// The widest window chosen so far.
    pub window_max_ns: u64,
    /// Largest settling time seen.
    pub settled_max_ns: u64,
}

impl SpinTuner {
    /// An empty tuner whose window starts at `floor_ns` (clamped to the cap).
    pub fn new(floor_ns: u64, cap_ns: u64) -> SpinTuner {
        let cap_ns = cap_ns.min(SPIN_MAX_NS);
        let floor_ns = floor_ns.min(cap_ns);
        SpinTuner {
            counts: [0; BUCKETS],
            total: 0,
            floor_ns,
            cap_ns,
            window_ns: floor_ns,
            since_retune: 0,
            samples: 0,
            window_max_ns: floor_ns,
            settled_max_ns: 0,
        }
    }

    /// Record one wake-up's settling time (see the module docs).
    pub fn observe(&mut self, settled_ns: u64) {
        if self.total >= SPIN_DECAY_SAMPLES {
            self.total = 0;
            for c in self.counts.iter_mut() {
                *c /= 2;
                self.total += *c;
            }
        }
        self.counts[bucket_of(settled_ns)] += 1;
        self.total += 1;
        self.samples += 1;
        self.settled_max_ns = self.settled_max_ns.max(settled_ns);
        self.since_retune += 1;
        if self.since_retune >= RETUNE_EVERY {
            self.retune();
        }
    }

    /// The settling time below which `ppm` of the (decayed) samples lie, as the
    /// upper edge of its bucket; 0 without samples.
    pub fn quantile_ns(&self, ppm: u64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let need = (self.total as u64 * ppm).div_ceil(1_000_000).max(1);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += *c as u64;
            if seen >= need {
                return bucket_upper(i);
            }
        }
        bucket_upper(BUCKETS - 1)
    }

    /// What the observations call for, before the floor.
    pub fn wanted_ns(&self) -> u64 {
        let q = self.quantile_ns(SPIN_QUANTILE_PPM);
        (q.saturating_add(q / 4).saturating_add(SPIN_MARGIN_NS)).max(SPIN_MIN_NS)
    }

    fn retune(&mut self) {
        self.since_retune = 0;
        self.window_ns = self.wanted_ns().clamp(self.floor_ns, self.cap_ns);
        self.window_max_ns = self.window_max_ns.max(self.window_ns);
    }

    /// The window to use now.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }
    pub fn cap_ns(&self) -> u64 {
        self.cap_ns
    }
    pub fn floor_ns(&self) -> u64 {
        self.floor_ns
    }

    /// Fix the current choice as the floor (after calibration): the run
    /// never spins less than the window its release jitter was measured with.
    pub fn freeze_floor(&mut self) {
        self.retune();
        self.floor_ns = self.window_ns;
    }

    /// Whether the observations wanted more than the cap allows.
    pub fn capped(&self) -> bool {
        self.wanted_ns() > self.cap_ns
    }
}

/// Disturbances later than this after the wake-up are not learned from:
/// they are not caused by the wake-up (network interrupts, stalls of the
/// whole VM), so a wider window would only see more of them, and
/// learning from them would widen it to the cap for nothing.
pub const SETTLE_HORIZON_NS: u64 = 2_000_000;

/// What a wake-up teaches the tuner: its settling time, but at most
/// [`SETTLE_HORIZON_NS`] after the sleep actually returned.
pub fn learnable_ns(wake: &Wake) -> Option<u64> {
    let (settled, overshoot) = (wake.settled_ns?, wake.overshoot_ns?);
    Some(settled.min(overshoot.saturating_add(SETTLE_HORIZON_NS)))
}

/// How the dispatcher chooses its spin window.
#[derive(Debug, Clone)]
pub enum SpinPolicy {
    /// Always this window (`--spin-us N`).
    Fixed(u64),
    /// Self-tuned (the default). Boxed: the histogram is 1 KB (allocated
    /// once, before the run).
    Auto(Box<SpinTuner>),
}

impl SpinPolicy {
    pub fn window_ns(&self) -> u64 {
        match self {
            SpinPolicy::Fixed(w) => *w,
            SpinPolicy::Auto(t) => t.window_ns(),
        }
    }
    /// Record a wake-up's settling time (the fixed policy ignores it).
    pub fn observe(&mut self, settled_ns: u64) {
        if let SpinPolicy::Auto(t) = self {
            t.observe(settled_ns);
        }
    }
    /// Hybrid sleep to `target_mono_ns` with the current window; learns
    /// from the wake-up's settling time (see [`learnable_ns`]).
    pub fn sleep_until(&mut self, target_mono_ns: u64) -> Wake {
        let wake = sleep_until_measured(target_mono_ns, self.window_ns());
        if let Some(settled) = learnable_ns(&wake) {
            self.observe(settled);
        }
        wake
    }
}

impl From<u64> for SpinPolicy {
    fn from(window_ns: u64) -> SpinPolicy {
        SpinPolicy::Fixed(window_ns)
    }
}

/// What a run reports about its spin window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpinReport {
    pub auto: bool,
    /// The window chosen at calibration (auto) or given (fixed).
    pub window_ns: u64,
    /// The widest window used during the run.
    pub window_max_ns: u64,
    /// The window at the end of the run.
    pub window_end_ns: u64,
    pub cap_ns: u64,
    /// Settling-time quantiles of the calibration wake-ups (auto).
    pub calibration_settled_p50_ns: u64,
    pub calibration_settled_p99_ns: u64,
    pub calibration_settled_p999_ns: u64,
    pub calibration_settled_max_ns: u64,
    pub calibration_sleeps: u64,
    /// The observations wanted more than the cap.
    pub capped: bool,
}

impl SpinReport {
    pub fn describe(&self) -> String {
        if !self.auto {
            return format!("spin window {} µs (fixed, --spin-us)", self.window_ns / 1_000);
        }
        format!(
            "spin window {} µs (auto: settling time p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs over {} wake-ups; cap {} µs{})",
            self.window_ns / 1_000,
            self.calibration_settled_p50_ns / 1_000,
            self.calibration_settled_p99_ns / 1_000,
            self.calibration_settled_p999_ns / 1_000,
            self.calibration_settled_max_ns / 1_000,
            self.calibration_sleeps,
            self.cap_ns / 1_000,
            if self.capped { ", capped" } else { "" },
        )
    }
}

/// The spin of a calibration wake-up: long enough to see disturbances
/// after the wake-up, short enough that members calibrating at once
/// rarely spin at the same time.
pub const CALIBRATION_PROBE_NS: u64 = 2_000_000;

/// Calibrate a tuner: `samples` wake-ups `sleep_ns` apart, each a sleep
/// then a spin of up to [`CALIBRATION_PROBE_NS`] (at most the cap),
/// feeding every settling time; then fix the chosen window as the floor.
/// Returns the tuner and the report's calibration part.
pub fn calibrate_spin(samples: usize, sleep_ns: u64, cap_ns: u64) -> (SpinTuner, SpinReport) {
    let mut tuner = SpinTuner::new(SPIN_MIN_NS, cap_ns);
    let probe = CALIBRATION_PROBE_NS.min(tuner.cap_ns()).min(sleep_ns / 2);
    let mut target = monotonic_ns() + sleep_ns;
    for _ in 0..samples {
        let wake = sleep_until_measured(target, probe);
        tuner.observe(learnable_ns(&wake).unwrap_or(wake.late_ns));
        // The next wake-up is `sleep_ns` from now, not from a target
        // already passed (a long stall must not turn into a burst of
        // zero-length sleeps).
        target = monotonic_ns() + sleep_ns;
    }
    tuner.freeze_floor();
    let report = SpinReport {
        auto: true,
        window_ns: tuner.window_ns(),
        window_max_ns: tuner.window_ns(),
        window_end_ns: tuner.window_ns(),
        cap_ns: tuner.cap_ns(),
        // Bucket edges, never above the largest value seen.
        calibration_settled_p50_ns: tuner.quantile_ns(500_000).min(tuner.settled_max_ns),
        calibration_settled_p99_ns: tuner.quantile_ns(990_000).min(tuner.settled_max_ns),
        calibration_settled_p999_ns: tuner.quantile_ns(999_000).min(tuner.settled_max_ns),
        calibration_settled_max_ns: tuner.settled_max_ns,
        calibration_sleeps: tuner.samples,
        capped: tuner.capped(),
    };
    (tuner, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_their_values_and_are_ordered() {
        for v in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            100,
            1_000,
            12_345,
            999_999,
            5_000_000,
            1 << 33,
        ] {
            let b = bucket_of(v);
            assert!(bucket_upper(b) >= v, "{v} in bucket {b} (upper {})", bucket_upper(b));
            if b > 0 {
                assert!(
                    bucket_upper(b - 1) < v,
                    "{v}: previous bucket's upper {}",
                    bucket_upper(b - 1)
                );
            }
            // 12.5 % resolution above 8 ns.
            assert!(bucket_upper(b) <= v + v / 8 + 1);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn the_window_covers_the_high_quantile_with_margin() {
        let mut t = SpinTuner::new(SPIN_MIN_NS, 5_000_000);
        // 980 short settling times of 30 µs, 20 long ones of 1 ms: p99 is 1 ms.
        for i in 0..1_000u64 {
            t.observe(if i % 50 == 0 { 1_000_000 } else { 30_000 });
        }
        t.freeze_floor();
        let w = t.window_ns();
        assert!(w >= 1_000_000 + SPIN_MARGIN_NS, "window {w}");
        assert!(w <= 1_200_000 + 1_000_000 / 4 + SPIN_MARGIN_NS, "window {w}");
        assert!(!t.capped());
    }

    #[test]
    fn the_cap_bounds_the_window_and_is_reported() {
        let mut t = SpinTuner::new(SPIN_MIN_NS, spin_cap_ns(8_000_000));
        assert_eq!(t.cap_ns(), 500_000);
        for _ in 0..100 {
            t.observe(3_000_000);
        }
        t.freeze_floor();
        assert_eq!(t.window_ns(), 500_000);
        assert!(t.capped());
        assert_eq!(spin_cap_ns(1_000), SPIN_MIN_NS);
        assert_eq!(spin_cap_ns(u64::MAX), SPIN_MAX_NS);
    }

    #[test]
    fn the_window_never_drops_below_the_calibrated_floor_and_follows_the_machine() {
        let mut t = SpinTuner::new(SPIN_MIN_NS, 10_000_000);
        for _ in 0..200 {
            t.observe(200_000);
        }
        t.freeze_floor();
        let floor = t.window_ns();
        // A quiet run: the window stays at the floor.
        for _ in 0..(3 * SPIN_DECAY_SAMPLES) {
            t.observe(1_000);
        }
        assert_eq!(t.window_ns(), floor);
        // A burst of late wake-ups widens it (bounded by the cap) ...
        for _ in 0..200 {
            t.observe(2_000_000);
        }
        assert!(t.window_ns() > 2_000_000, "{}", t.window_ns());
        assert_eq!(t.window_max_ns, t.window_ns());
        // ... and it narrows back to the floor once they fade.
        for _ in 0..(4 * SPIN_DECAY_SAMPLES) {
            t.observe(1_000);
        }
        assert_eq!(t.window_ns(), floor);
    }

    #[test]
    fn disturbances_long_after_the_wake_up_are_not_learned() {
        let wake = |overshoot, settled| Wake {
            late_ns: 0,
            overshoot_ns: Some(overshoot),
            settled_ns: Some(settled),
            gap_max_ns: 0,
        };
        assert_eq!(learnable_ns(&wake(30_000, 400_000)), Some(400_000));
        assert_eq!(learnable_ns(&wake(30_000, 3_000_000)), Some(30_000 + SETTLE_HORIZON_NS));
        let no_sleep = Wake {
            late_ns: 5,
            overshoot_ns: None,
            settled_ns: None,
            gap_max_ns: 0,
        };
        assert_eq!(learnable_ns(&no_sleep), None);
    }

    #[test]
    fn fixed_policy_ignores_observations() {
        let mut p = SpinPolicy::from(123_000);
        p.observe(5_000_000);
        assert_eq!(p.window_ns(), 123_000);
    }

    #[test]
    fn calibration_chooses_a_window_within_its_bounds() {
        let (t, r) = calibrate_spin(20, 200_000, 2_000_000);
        assert!(r.auto && r.calibration_sleeps == 20);
        assert!((SPIN_MIN_NS..=2_000_000).contains(&t.window_ns()));
        assert_eq!(t.floor_ns(), t.window_ns());
        assert!(r.describe().contains("auto"));
    }
}
