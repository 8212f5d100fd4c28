//! Global clock: a sans-IO estimator of a node's offset and drift against
//! the master's clock, with a guaranteed error bound, and injectable
//! clocks for tests (members on one host share one kernel clock, so a
//! test gives each node its own offset, drift and jumps).
//!
//! ## One exchange (NTP-style, four timestamps)
//!
//! ```text
//!   node (local clock)          master (global clock)
//!   t1 ── request ─────────────▶ t2
//!   t4 ◀──────────── reply ───── t3
//! ```
//!
//! If clocks do not drift during the exchange, the master's `t2` happened
//! after local `t1` and its `t3` before local `t4`, so the true offset
//! `θ = global − local` lies in `[t3 − t4, t2 − t1]`: midpoint
//! `((t2 − t1) + (t3 − t4)) / 2`, half-width `rtt / 2` with
//! `rtt = (t4 − t1) − (t3 − t2)`. That interval holds whatever the path
//! asymmetry: the bound is guaranteed, not statistical.
//!
//! ## Rounds, min-RTT filter, drift
//!
//! A *round* is a burst of exchanges; [`ClockEstimator::finish_round`]
//! reduces it to one [`Sample`] at the instant of its smallest-RTT
//! exchange: the **intersection** of every exchange's interval, each
//! carried to that instant (shifted by the drift estimate, widened by the
//! drift uncertainty times the distance). Every interval holds the true
//! offset, so their intersection does too, and it is never wider than the
//! min-RTT exchange's alone: it is bounded below by the fastest
//! request's path and above by the fastest reply's, even when no single
//! exchange was fast both ways. (An empty intersection means a clock
//! misbehaved inside the round: the min-RTT exchange alone is used.)
//!
//! Drift is the slope between two samples of a history (up to
//! [`HISTORY_MAX`], 3 s at the default resync interval), the pair with the
//! tightest uncertainty `(e_a + e_b) / Δt`. The model's offset is again
//! the intersection of every history sample carried to the newest one.
//! Between rounds the bound grows with the drift uncertainty (plus a
//! floor for non-linear wander): `bound(L) = e + (u + floor)·|L − L_base|`.
//!
//! A sample that falls outside the interval the model predicted is a
//! clock jump: history is dropped and drift re-learned. A *known*
//! discontinuity (the local or master clock announced a step, as Linux
//! does with `TFD_TIMER_CANCEL_ON_SET`) invalidates the model at once, so
//! `now()` says "unsynchronized" rather than give a wrong interval.

/// Exchanges kept per round (the rest of a burst is ignored).
pub const ROUND_EXCHANGES_MAX: usize = 64;
/// Samples kept for drift estimation and the model's intersection.
pub const HISTORY_MAX: usize = 32;
/// Most jumps an injected clock can carry.
pub const JUMPS_MAX: usize = 8;

const NS_PER_S: i128 = 1_000_000_000;

/// A time with a guaranteed error bound: the true global time lies in
/// `[earliest_ns, latest_ns]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub earliest_ns: u64,
    pub latest_ns: u64,
}

impl Interval {
    pub fn mid_ns(&self) -> u64 {
        self.earliest_ns + (self.latest_ns - self.earliest_ns) / 2
    }
    pub fn bound_ns(&self) -> u64 {
        (self.latest_ns - self.earliest_ns).div_ceil(2)
    }
    pub fn contains(&self, t_ns: u64) -> bool {
        self.earliest_ns <= t_ns && t_ns <= self.latest_ns
    }
}

/// The four timestamps of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    pub t1_local_ns: u64,
    pub t2_remote_ns: u64,
    pub t3_remote_ns: u64,
    pub t4_local_ns: u64,
}

impl Exchange {
    /// Round trip minus the master's turnaround (never negative).
    pub fn rtt_ns(&self) -> u64 {
        let total = self.t4_local_ns.saturating_sub(self.t1_local_ns);
        let turnaround = self.t3_remote_ns.saturating_sub(self.t2_remote_ns);
        total.saturating_sub(turnaround)
    }
    /// Midpoint estimate of `global − local`.
    pub fn offset_ns(&self) -> i64 {
        let a = self.t2_remote_ns as i128 - self.t1_local_ns as i128;
        let b = self.t3_remote_ns as i128 - self.t4_local_ns as i128;
        ((a + b) / 2) as i64
    }
    /// Whether the timestamps are ordered as an exchange must be.
    pub fn is_well_formed(&self) -> bool {
        self.t4_local_ns >= self.t1_local_ns && self.t3_remote_ns >= self.t2_remote_ns
    }
}

/// The best exchange of a round, reduced to an offset with an error bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub local_ns: u64,
    pub offset_ns: i64,
    pub error_ns: u64,
}

/// Tunables of the estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockConfig {
    /// Drift uncertainty assumed before drift has been measured (ppb):
    /// the oscillator tolerance (default 200 ppm).
    pub drift_unknown_ppb: u64,
    /// Added to every measured drift uncertainty (ppb) for wander.
    pub drift_floor_ppb: u64,
    /// Samples must span this long before drift is measured.
    pub drift_span_min_ns: u64,
    /// A model older than this is stale: `now()` refuses.
    pub stale_after_ns: u64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            drift_unknown_ppb: 200_000,
            drift_floor_ppb: 1_000,
            drift_span_min_ns: 20_000_000,
            stale_after_ns: 5_000_000_000,
        }
    }
}

/// Why no interval can be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error("the clock is not synchronized yet (or a clock step invalidated it)")]
    Unsynced,
    #[error("the clock model is stale: last synchronized {age_ns} ns ago")]
    Stale { age_ns: u64 },
}

/// The affine model `global = local + offset + drift·(local − base)`,
/// copyable so a runtime can publish it to other threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockModel {
    pub valid: bool,
    pub base_local_ns: u64,
    pub offset_ns: i64,
    pub drift_ppb: i64,
    pub error_ns: u64,
    /// Drift uncertainty including the floor.
    pub uncertainty_ppb: u64,
    pub stale_after_ns: u64,
}

impl ClockModel {
    /// The master's own model: exact.
    pub fn exact() -> ClockModel {
        ClockModel {
            valid: true,
            stale_after_ns: u64::MAX,
            ..ClockModel::default()
        }
    }

    /// Global time interval at local time `local_ns`.
    pub fn interval(&self, local_ns: u64) -> Result<Interval, ClockError> {
        if !self.valid {
            return Err(ClockError::Unsynced);
        }
        let age = local_ns as i128 - self.base_local_ns as i128;
        if age.unsigned_abs() > self.stale_after_ns as u128 {
            return Err(ClockError::Stale {
                age_ns: age.unsigned_abs() as u64,
            });
        }
        let mid = local_ns as i128 + self.offset_ns as i128 + self.drift_ppb as i128 * age / NS_PER_S;
        let growth = (self.uncertainty_ppb as u128 * age.unsigned_abs()).div_ceil(NS_PER_S as u128) as i128;
        // +1: the integer divisions above round toward zero.
        let bound = self.error_ns as i128 + growth + 1;
        Ok(Interval {
            earliest_ns: (mid - bound).max(0) as u64,
            latest_ns: (mid + bound).max(0) as u64,
        })
    }

    /// The local time at which the model's midpoint reads `global_ns`.
    pub fn local_for_global(&self, global_ns: u64) -> u64 {
        let base = self.base_local_ns as i128;
        let x = global_ns as i128 - self.offset_ns as i128 - base;
        let local = base + x * NS_PER_S / (NS_PER_S + self.drift_ppb as i128);
        local.max(0) as u64
    }
}

/// The clock-sync estimator of one node against the master. Driven:
/// `handle_exchange` for each completed exchange, `finish_round` after a
/// burst, `handle_discontinuity` when a clock announces a step, `model()`
/// to read.
#[derive(Debug, Clone)]
pub struct ClockEstimator {
    config: ClockConfig,
    round: [Option<Exchange>; ROUND_EXCHANGES_MAX],
    round_len: usize,
    history: [Sample; HISTORY_MAX],
    history_len: usize,
    model: ClockModel,
    /// Rounds finished with a sample.
    pub rounds: u64,
    /// Exchanges accepted.
    pub exchanges: u64,
    /// Exchanges dropped as malformed.
    pub exchanges_malformed: u64,
    /// Samples that fell outside the predicted interval.
    pub jumps_detected: u64,
    /// Discontinuities announced by a clock.
    pub discontinuities: u64,
    /// Round samples dropped because the model already knew better.
    pub samples_filtered: u64,
    /// Rounds whose exchanges' intervals did not intersect (a clock
    /// misbehaved inside the round; the min-RTT exchange alone was used).
    pub rounds_inconsistent: u64,
    /// Drift (ppb) and its uncertainty learned before an announced step.
    drift_prior: Option<(i64, u64)>,
    /// The model's drift and uncertainty before the last finished round:
    /// what an announced step may keep (the last round may straddle the
    /// step, and its sample then mixes offsets from both sides).
    drift_before_last_round: Option<(i64, u64)>,
}

/// An interval of `global − local` offsets, `[lo, hi]`, at a local instant.
#[derive(Debug, Clone, Copy)]
struct OffsetInterval {
    lo: i128,
    hi: i128,
}

impl OffsetInterval {
    /// Carry from `from_local` to `to_local` with drift `drift_ppb`, known
    /// to within `uncertainty_ppb`: shifted by the drift, widened by the
    /// uncertainty (rounded outward).
    fn carried(self, from_local: u64, to_local: u64, drift_ppb: i64, uncertainty_ppb: u64) -> OffsetInterval {
        let dt = to_local as i128 - from_local as i128;
        let shift = drift_ppb as i128 * dt;
        let widen = (uncertainty_ppb as u128 * dt.unsigned_abs()).div_ceil(NS_PER_S as u128) as i128;
        OffsetInterval {
            lo: self.lo + shift.div_euclid(NS_PER_S) - widen,
            hi: self.hi + (shift + NS_PER_S - 1).div_euclid(NS_PER_S) + widen,
        }
    }
    fn intersect(self, other: OffsetInterval) -> OffsetInterval {
        OffsetInterval {
            lo: self.lo.max(other.lo),
            hi: self.hi.min(other.hi),
        }
    }
    fn is_empty(&self) -> bool {
        self.lo > self.hi
    }
    /// As a midpoint and a half-width that covers the whole interval.
    fn to_mid_error(self) -> (i64, u64) {
        let mid = (self.lo + self.hi).div_euclid(2);
        let error = (self.hi - mid).max(mid - self.lo).max(0);
        (mid as i64, error as u64)
    }
}

impl Exchange {
    /// The local instant a sample of this exchange is taken at.
    fn mid_local_ns(&self) -> u64 {
        self.t1_local_ns + (self.t4_local_ns - self.t1_local_ns) / 2
    }
    /// The offsets consistent with this exchange at its local midpoint:
    /// `[t3 − t4, t2 − t1]`, widened by what an unknown drift of up to
    /// `drift_max_ppb` can move the offset while the exchange runs.
    fn interval(&self, drift_max_ppb: u64) -> OffsetInterval {
        let span = self.t4_local_ns - self.t1_local_ns;
        // +1: the midpoint's integer division.
        let widen = (span as u128 * drift_max_ppb as u128).div_ceil(NS_PER_S as u128) as i128 + 1;
        OffsetInterval {
            lo: self.t3_remote_ns as i128 - self.t4_local_ns as i128 - widen,
            hi: self.t2_remote_ns as i128 - self.t1_local_ns as i128 + widen,
        }
    }
}

impl Sample {
    fn interval(&self) -> OffsetInterval {
        OffsetInterval {
            lo: self.offset_ns as i128 - self.error_ns as i128,
            hi: self.offset_ns as i128 + self.error_ns as i128,
        }
    }
}

impl ClockEstimator {
    pub fn new(config: ClockConfig) -> ClockEstimator {
        ClockEstimator {
            config,
            round: [None; ROUND_EXCHANGES_MAX],
            round_len: 0,
            history: [Sample {
                local_ns: 0,
                offset_ns: 0,
                error_ns: 0,
            }; HISTORY_MAX],
            history_len: 0,
            model: ClockModel::default(),
            rounds: 0,
            exchanges: 0,
            exchanges_malformed: 0,
            jumps_detected: 0,
            discontinuities: 0,
            samples_filtered: 0,
            rounds_inconsistent: 0,
            drift_prior: None,
            drift_before_last_round: None,
        }
    }

    pub fn model(&self) -> ClockModel {
        self.model
    }

    /// Record one exchange of the current round (bounded: extra ones are dropped).
    pub fn handle_exchange(&mut self, ex: Exchange) {
        if !ex.is_well_formed() {
            self.exchanges_malformed += 1;
            return;
        }
        if self.round_len < ROUND_EXCHANGES_MAX {
            self.round[self.round_len] = Some(ex);
            self.round_len += 1;
            self.exchanges += 1;
        }
    }

    /// A clock announced a step: forget everything learned.
    ///
    /// A step moves the offset, not the rate: the drift learned so far is
    /// kept as a prior (its interval), so the bound does not fall back to
    /// the oscillator tolerance while drift is re-learned. Call it before
    /// the round after the step is finished: the drift kept is the one from
    /// before the last finished round, which may straddle the step (its
    /// sample mixes offsets from both sides and would bias the drift).
    pub fn handle_discontinuity(&mut self) {
        self.discontinuities += 1;
        if let Some(prior) = self.drift_before_last_round {
            self.drift_prior = Some(prior);
        }
        self.drift_before_last_round = None;
        self.history_len = 0;
        self.round_len = 0;
        self.model.valid = false;
    }

    /// Close the round: keep its min-RTT exchange, update offset and drift.
    /// Returns the sample, or `None` for an empty round.
    pub fn finish_round(&mut self) -> Option<Sample> {
        self.drift_before_last_round = (self.model.valid && self.model.uncertainty_ppb < self.config.drift_unknown_ppb)
            .then_some((self.model.drift_ppb, self.model.uncertainty_ppb));
        let round = &self.round[..self.round_len];
        let best = round.iter().flatten().min_by_key(|ex| ex.rtt_ns()).copied();
        let best = match best {
            Some(b) => b,
            None => {
                self.round_len = 0;
                return None;
            }
        };
        let at = best.mid_local_ns();
        // The offset moves while an exchange runs, by an unknown drift of
        // up to the oscillator tolerance; between exchanges of the round it
        // moves by the model's drift, known to its uncertainty (or, before
        // drift is measured, by up to the tolerance).
        let tolerance = self.config.drift_unknown_ppb;
        let (drift, uncertainty) = if self.model.valid {
            (self.model.drift_ppb, self.model.uncertainty_ppb.max(1))
        } else {
            (0, tolerance)
        };
        let own = best.interval(tolerance);
        let mut both = own;
        for ex in round.iter().flatten() {
            let carried = ex
                .interval(tolerance)
                .carried(ex.mid_local_ns(), at, drift, uncertainty);
            both = both.intersect(carried);
        }
        self.round_len = 0;
        let interval = if both.is_empty() {
            self.rounds_inconsistent += 1;
            own
        } else {
            both
        };
        let (offset_ns, error_ns) = interval.to_mid_error();
        let sample = Sample {
            local_ns: at,
            offset_ns,
            error_ns,
        };
        if self.model.valid && self.history_len > 0 {
            if let Ok(predicted) = self.model.interval(sample.local_ns) {
                let observed_lo = sample.local_ns as i128 + sample.offset_ns as i128 - sample.error_ns as i128;
                let observed_hi = sample.local_ns as i128 + sample.offset_ns as i128 + sample.error_ns as i128;
                let disjoint = observed_hi < predicted.earliest_ns as i128 || observed_lo > predicted.latest_ns as i128;
                if disjoint {
                    self.jumps_detected += 1;
                    self.history_len = 0;
                }
            }
        }
        // Min-RTT filtering across rounds: a sample that knows less than
        // the model already predicts for its instant is not kept (it would
        // evict a better one); the bound keeps growing honestly with age.
        let useful = match self.model.interval(sample.local_ns) {
            Ok(predicted) if self.history_len > 0 => sample.error_ns < predicted.bound_ns(),
            _ => true,
        };
        self.rounds += 1;
        if useful {
            self.push_history(sample);
            self.update_model();
        } else {
            self.samples_filtered += 1;
        }
        Some(sample)
    }

    fn push_history(&mut self, sample: Sample) {
        if self.history_len == HISTORY_MAX {
            self.history.copy_within(1.., 0);
            self.history_len -= 1;
        }
        self.history[self.history_len] = sample;
        self.history_len += 1;
        debug_assert!(
            self.history[..self.history_len]
                .windows(2)
                .all(|w| w[0].local_ns <= w[1].local_ns),
            "history_in_local_time_order"
        );
    }

    fn update_model(&mut self) {
        let history = &self.history[..self.history_len];
        let newest = history[history.len() - 1];
        // Drift: the pair of samples with the tightest slope uncertainty
        // (e_i + e_j) / (t_j − t_i) among pairs far enough apart.
        let mut best: Option<(u128, i64, u64)> = None; // (uncertainty ppb, drift ppb, span)
        for (i, a) in history.iter().enumerate() {
            for b in &history[i + 1..] {
                let span = b.local_ns.saturating_sub(a.local_ns);
                if span < self.config.drift_span_min_ns {
                    continue;
                }
                let unc = ((a.error_ns + b.error_ns) as u128 * NS_PER_S as u128).div_ceil(span as u128);
                let drift = ((b.offset_ns as i128 - a.offset_ns as i128) * NS_PER_S / span as i128) as i64;
                if best.is_none_or(|(u, _, _)| unc < u) {
                    best = Some((unc, drift, span));
                }
            }
        }
        // The drift lies within the tolerance, within the prior kept
        // across an announced step, and within the measured pair's
        // interval (+1: the division above truncates; + the floor for
        // wander): the intersection of the three, each sound.
        let tolerance = self.config.drift_unknown_ppb as i128;
        let mut drift_lo = -tolerance;
        let mut drift_hi = tolerance;
        for (d, u) in [
            self.drift_prior.map(|(d, u)| (d as i128, u as i128)),
            best.map(|(unc, d, _)| (d as i128, unc as i128 + 1 + self.config.drift_floor_ppb as i128)),
        ]
        .into_iter()
        .flatten()
        {
            drift_lo = drift_lo.max(d - u);
            drift_hi = drift_hi.min(d + u);
        }
        let (drift_ppb, uncertainty_ppb) = if drift_lo <= drift_hi {
            let mid = (drift_lo + drift_hi).div_euclid(2);
            (mid as i64, (drift_hi - mid).max(mid - drift_lo) as u64)
        } else {
            // Contradictory (the rate changed): the measurement alone.
            match best {
                Some((unc, drift, _)) => (drift, unc as u64 + 1 + self.config.drift_floor_ppb),
                None => (0, self.config.drift_unknown_ppb),
            }
        };
        // The offset at the newest sample's instant: every sample's
        // interval carried there (each holds the true offset, so their
        // intersection does), never wider than the best single one.
        let mut both: Option<OffsetInterval> = None;
        for s in history {
            let carried = s
                .interval()
                .carried(s.local_ns, newest.local_ns, drift_ppb, uncertainty_ppb);
            both = Some(both.map_or(carried, |b| b.intersect(carried)));
        }
        let both = both.expect("non-empty history");
        let (offset_ns, error_ns) = if both.is_empty() {
            // The samples contradict the linear model (wander beyond the
            // floor): fall back to the one whose bound, carried to the
            // newest instant, is the smallest.
            let carried = |s: &Sample| {
                s.interval()
                    .carried(s.local_ns, newest.local_ns, drift_ppb, uncertainty_ppb)
                    .to_mid_error()
            };
            history
                .iter()
                .map(carried)
                .min_by_key(|(_, e)| *e)
                .expect("non-empty history")
        } else {
            both.to_mid_error()
        };
        self.model = ClockModel {
            valid: true,
            base_local_ns: newest.local_ns,
            offset_ns,
            drift_ppb,
            error_ns,
            uncertainty_ppb,
            stale_after_ns: self.config.stale_after_ns,
        };
    }
}

/// A node's local clock derived from the host's monotonic clock with an
/// injected offset, drift and jumps (pure: `local(mono)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedClock {
    pub start_mono_ns: u64,
    pub offset_ns: i64,
    pub drift_ppb: i64,
    /// `(after_ns, delta_ns)`: at `start + after` the clock steps by delta.
    pub jumps: [(u64, i64); JUMPS_MAX],
    pub jumps_len: usize,
}

impl InjectedClock {
    pub fn new(start_mono_ns: u64, offset_ns: i64, drift_ppb: i64) -> InjectedClock {
        InjectedClock {
            start_mono_ns,
            offset_ns,
            drift_ppb,
            jumps: [(0, 0); JUMPS_MAX],
            jumps_len: 0,
        }
    }

    /// Add a step of `delta_ns` at `after_ns` past start (ascending order).
    pub fn with_jump(mut self, after_ns: u64, delta_ns: i64) -> Result<InjectedClock, String> {
        if self.jumps_len == JUMPS_MAX {
            return Err(format!("at most {JUMPS_MAX} clock jumps can be injected"));
        }
        if self.jumps_len > 0 && self.jumps[self.jumps_len - 1].0 > after_ns {
            return Err(format!("clock jump at {after_ns} ns is before the previous one"));
        }
        self.jumps[self.jumps_len] = (after_ns, delta_ns);
        self.jumps_len += 1;
        Ok(self)
    }

    /// How many jumps have happened by `mono_ns` (a step counter).
    pub fn generation(&self, mono_ns: u64) -> u64 {
        let since = mono_ns.saturating_sub(self.start_mono_ns);
        self.jumps[..self.jumps_len]
            .iter()
            .filter(|(at, _)| *at <= since)
            .count() as u64
    }

    /// The local clock reading at host time `mono_ns`.
    pub fn local(&self, mono_ns: u64) -> u64 {
        let since = mono_ns as i128 - self.start_mono_ns as i128;
        let stepped: i128 = self.jumps[..self.jumps_len]
            .iter()
            .filter(|(at, _)| since >= *at as i128)
            .map(|(_, d)| *d as i128)
            .sum();
        let t = mono_ns as i128 + self.offset_ns as i128 + self.drift_ppb as i128 * since / NS_PER_S + stepped;
        t.max(0) as u64
    }

    /// The host time at which the local clock reads `local_ns` (a few
    /// Newton steps; exact away from jumps).
    pub fn mono_for_local(&self, local_ns: u64) -> u64 {
        let mut m = local_ns as i128 - self.offset_ns as i128;
        for _ in 0..4 {
            let err = self.local(m.max(0) as u64) as i128 - local_ns as i128;
            if err == 0 {
                break;
            }
            m -= err;
        }
        m.max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    /// One exchange between a node clock and a master clock over a path
    /// with the given one-way delays (host ns) and master turnaround.
    fn exchange(node: &InjectedClock, master: &InjectedClock, at: u64, up: u64, turn: u64, down: u64) -> Exchange {
        Exchange {
            t1_local_ns: node.local(at),
            t2_remote_ns: master.local(at + up),
            t3_remote_ns: master.local(at + up + turn),
            t4_local_ns: node.local(at + up + turn + down),
        }
    }

    #[test]
    fn symmetric_exchange_recovers_the_offset_exactly() {
        let master = InjectedClock::new(0, 0, 0);
        let node = InjectedClock::new(0, -1_234_567, 0);
        let ex = exchange(&node, &master, 10 * MS, 500, 100, 500);
        assert_eq!(ex.offset_ns(), 1_234_567);
        assert_eq!(ex.rtt_ns(), 1_000);
    }

    #[test]
    fn min_rtt_filter_keeps_the_tightest_exchange() {
        let master = InjectedClock::new(0, 5_000, 0);
        let node = InjectedClock::new(0, 0, 0);
        let mut est = ClockEstimator::new(ClockConfig::default());
        est.handle_exchange(exchange(&node, &master, MS, 50_000, 100, 1_000));
        est.handle_exchange(exchange(&node, &master, 2 * MS, 300, 100, 300));
        est.handle_exchange(exchange(&node, &master, 3 * MS, 1_000, 100, 40_000));
        let s = est.finish_round().unwrap();
        assert_eq!(s.offset_ns, 5_000);
        assert_eq!(s.error_ns, 302, "rtt/2 + rounding + drift over the exchange");
        assert!(est.finish_round().is_none(), "an empty round gives no sample");
    }

    #[test]
    fn a_round_intersects_its_exchanges_fast_request_and_fast_reply() {
        // No exchange is fast both ways, but one has a fast request and
        // another a fast reply: together they pin the offset far tighter
        // than either alone, and still around the truth.
        let master = InjectedClock::new(0, 5_000, 0);
        let node = InjectedClock::new(0, 0, 0);
        let mut est = ClockEstimator::new(ClockConfig::default());
        est.handle_exchange(exchange(&node, &master, MS, 100, 50, 20_000));
        est.handle_exchange(exchange(&node, &master, MS + 100_000, 20_000, 50, 300));
        let s = est.finish_round().unwrap();
        assert!(s.error_ns < 1_000, "error {} (each alone: > 10 µs)", s.error_ns);
        let truth = 5_000i64;
        assert!((s.offset_ns - truth).unsigned_abs() <= s.error_ns);
        assert_eq!(est.rounds_inconsistent, 0);
    }

    #[test]
    fn malformed_exchanges_are_counted_and_dropped() {
        let mut est = ClockEstimator::new(ClockConfig::default());
        est.handle_exchange(Exchange {
            t1_local_ns: 10,
            t2_remote_ns: 5,
            t3_remote_ns: 4,
            t4_local_ns: 20,
        });
        assert_eq!(est.exchanges_malformed, 1);
        assert_eq!(est.model().interval(0), Err(ClockError::Unsynced));
    }

    #[test]
    fn drift_is_learned_and_the_bound_stays_tight() {
        let master = InjectedClock::new(0, 0, 0);
        let node = InjectedClock::new(0, 3_000_000, 50_000); // +3 ms, +50 ppm
        let mut est = ClockEstimator::new(ClockConfig::default());
        for round in 0..10u64 {
            let at = round * 100 * MS;
            est.handle_exchange(exchange(&node, &master, at, 2_000, 200, 2_000));
            est.handle_exchange(exchange(&node, &master, at + 10_000, 700, 200, 900));
            est.finish_round().unwrap();
        }
        let m = est.model();
        assert!((m.drift_ppb + 50_000).abs() < 50, "drift {}", m.drift_ppb);
        let at = 1_000 * MS;
        let i = m.interval(node.local(at)).unwrap();
        assert!(i.contains(master.local(at)));
        assert!(i.bound_ns() < 10_000, "bound {}", i.bound_ns());
    }

    #[test]
    fn an_unannounced_jump_is_detected_and_relearned() {
        let master = InjectedClock::new(0, 0, 0);
        let node = InjectedClock::new(0, 0, 0).with_jump(550 * MS, 1_000_000).unwrap();
        let mut est = ClockEstimator::new(ClockConfig::default());
        for round in 0..10u64 {
            est.handle_exchange(exchange(&node, &master, round * 100 * MS, 500, 100, 500));
            est.finish_round().unwrap();
        }
        assert_eq!(est.jumps_detected, 1);
        let i = est.model().interval(node.local(950 * MS)).unwrap();
        assert!(i.contains(master.local(950 * MS)));
    }

    #[test]
    fn drift_learned_before_an_announced_step_is_kept_as_a_prior() {
        let master = InjectedClock::new(0, 0, 0);
        let node = InjectedClock::new(0, 0, 80_000).with_jump(1_050 * MS, 300_000).unwrap();
        let mut est = ClockEstimator::new(ClockConfig::default());
        // The prior is the drift from before the last round finished (that
        // round may straddle the step).
        let mut before = u64::MAX;
        for round in 0..10u64 {
            before = est.model().uncertainty_ppb;
            est.handle_exchange(exchange(&node, &master, round * 100 * MS, 1_000, 100, 1_000));
            est.finish_round().unwrap();
        }
        assert!(before < 10_000, "drift learned: ±{before} ppb");
        est.handle_discontinuity();
        est.handle_exchange(exchange(&node, &master, 1_100 * MS, 1_000, 100, 1_000));
        est.finish_round().unwrap();
        let m = est.model();
        assert!(m.uncertainty_ppb <= before, "prior kept: ±{} ppb", m.uncertainty_ppb);
        let at = 1_190 * MS;
        assert!(m.interval(node.local(at)).unwrap().contains(master.local(at)));
    }

    #[test]
    fn announced_discontinuity_makes_now_refuse_until_resync() {
        let mut est = ClockEstimator::new(ClockConfig::default());
        est.handle_exchange(Exchange {
            t1_local_ns: 0,
            t2_remote_ns: 10,
            t3_remote_ns: 10,
            t4_local_ns: 20,
        });
        est.finish_round();
        assert!(est.model().interval(30).is_ok());
        est.handle_discontinuity();
        assert_eq!(est.model().interval(30), Err(ClockError::Unsynced));
    }

    #[test]
    fn stale_models_refuse() {
        let mut m = ClockModel::exact();
        m.stale_after_ns = 100;
        assert!(m.interval(100).is_ok());
        assert_eq!(m.interval(101), Err(ClockError::Stale { age_ns: 101 }));
    }

    #[test]
    fn injected_clock_inverts_and_counts_jumps() {
        let c = InjectedClock::new(1_000, -500, 100_000)
            .with_jump(10_000, 7_000)
            .unwrap();
        assert_eq!(c.generation(10_999), 0);
        assert_eq!(c.generation(11_000), 1);
        for mono in [2_000u64, 50_000, 5_000_000_000] {
            assert_eq!(c.mono_for_local(c.local(mono)), mono);
        }
        assert!(c.with_jump(5, 1).is_err(), "jumps must be in order");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Whatever the offset, drift (≤ 100 ppm), path asymmetry and
        /// delays, the true master time is inside the interval, at the
        /// sample and up to 200 ms after it.
        #[test]
        fn true_time_is_always_inside_the_interval(
            offset in -1_000_000_000i64..1_000_000_000,
            drift in -100_000i64..100_000,
            delays in proptest::collection::vec((1u64..200_000, 0u64..20_000, 1u64..200_000), 1..40),
            probe in 0u64..200 * MS,
        ) {
            let master = InjectedClock::new(0, 77, 0);
            let node = InjectedClock::new(0, offset, drift);
            let mut est = ClockEstimator::new(ClockConfig::default());
            let mut at = 2_000_000_000u64;
            for (i, (up, turn, down)) in delays.iter().enumerate() {
                est.handle_exchange(exchange(&node, &master, at, *up, *turn, *down));
                at += up + turn + down + 1_000;
                if i % 4 == 3 {
                    est.finish_round();
                    at += 50 * MS;
                }
            }
            est.finish_round();
            let t = at + probe;
            let i = est.model().interval(node.local(t)).unwrap();
            prop_assert!(i.contains(master.local(t)), "{i:?} vs {}", master.local(t));
        }

        /// Long runs: many rounds of several exchanges with random
        /// asymmetric delays (the intersections within rounds and across
        /// the history, drift measured over seconds): the true time stays
        /// inside at every round and after the last.
        #[test]
        fn true_time_stays_inside_over_long_histories(
            offset in -1_000_000_000i64..1_000_000_000,
            drift in -150_000i64..150_000,
            delays in proptest::collection::vec((1u64..100_000, 0u64..5_000, 1u64..100_000), 60..200),
            gap_ms in 20u64..150,
            probe in 0u64..300 * MS,
        ) {
            let master = InjectedClock::new(0, -3_333, 11_000);
            let node = InjectedClock::new(0, offset, drift);
            let mut est = ClockEstimator::new(ClockConfig::default());
            let mut at = 1_000_000_000u64;
            for (i, (up, turn, down)) in delays.iter().enumerate() {
                est.handle_exchange(exchange(&node, &master, at, *up, *turn, *down));
                at += up + turn + down + 5_000;
                if i % 5 == 4 {
                    est.finish_round();
                    let i = est.model().interval(node.local(at)).unwrap();
                    prop_assert!(i.contains(master.local(at)), "round {}: {i:?} vs {}", est.rounds, master.local(at));
                    at += gap_ms * MS;
                }
            }
            est.finish_round();
            let t = at + probe;
            let i = est.model().interval(node.local(t)).unwrap();
            prop_assert!(i.contains(master.local(t)), "{i:?} vs {}", master.local(t));
        }

        /// An announced step in the middle of a long run: the round that
        /// straddles it is discarded (as the service does), the drift
        /// learned before is kept as a prior, and the truth stays inside
        /// at every round after it.
        #[test]
        fn true_time_stays_inside_through_an_announced_step(
            drift in -150_000i64..150_000,
            step in -2_000_000i64..2_000_000,
            step_round in 5usize..30,
            delays in proptest::collection::vec((1u64..60_000, 0u64..5_000, 1u64..60_000), 200),
        ) {
            let master = InjectedClock::new(0, 0, 0);
            let step_at = 1_000_000_000 + step_round as u64 * 60 * MS + 7 * MS;
            let node = InjectedClock::new(0, 123_456, drift).with_jump(step_at, step).unwrap();
            let mut est = ClockEstimator::new(ClockConfig::default());
            let mut at = 1_000_000_000u64;
            let mut generation = node.generation(at);
            for (i, (up, turn, down)) in delays.iter().enumerate() {
                est.handle_exchange(exchange(&node, &master, at, *up, *turn, *down));
                at += up + turn + down + 5_000;
                if i % 5 == 4 {
                    est.finish_round();
                    if node.generation(at) != generation {
                        generation = node.generation(at);
                        est.handle_discontinuity();
                        prop_assert!(est.model().interval(node.local(at)).is_err());
                    } else {
                        let i = est.model().interval(node.local(at)).unwrap();
                        prop_assert!(i.contains(master.local(at)), "round {}: {i:?} vs {}", est.rounds, master.local(at));
                    }
                    at += 60 * MS;
                }
            }
        }

        #[test]
        fn local_for_global_inverts_the_model(offset in -1_000_000i64..1_000_000, drift in -100_000i64..100_000, g in 1_000_000_000u64..2_000_000_000) {
            let m = ClockModel { valid: true, base_local_ns: 1_500_000_000, offset_ns: offset, drift_ppb: drift, error_ns: 0, uncertainty_ppb: 0, stale_after_ns: u64::MAX };
            let l = m.local_for_global(g);
            let back = m.interval(l).unwrap().mid_ns();
            prop_assert!((back as i64 - g as i64).abs() <= 2, "{back} vs {g}");
        }
    }
}
