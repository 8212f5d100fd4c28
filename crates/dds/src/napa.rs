//! NAPA (Non-supervised Adaptative Publication Algorithm, seed 004): the
//! reliable writer's inter-sample gap, tuned from its send-window occupancy.
//!
//! The writer keeps a window of unacknowledged samples; readers acknowledge
//! cumulatively every K samples. Sending as fast as the window allows fills
//! it: samples then wait in queues (the link's, the reader's) and the
//! one-way latency grows with the window, not with the path. NAPA spaces
//! the samples by a gap `T` so that the occupancy `N` stays inside the
//! *acceptance range* `[low, W]`:
//!
//! ```text
//!   once per control period, with N_max, N_min seen over the period:
//!     N_max > W, still growing (or T ≤ t_m)  →  T += step, T ≤ 2·t_m
//!     N_max > W, already draining             →  hold
//!     N_min < low                             →  T -= step
//!     otherwise, T > t_m                      →  T -= max(step, gain·(T − t_m)), not below t_m
//!     otherwise                               →  T -= step / 8   (probe)
//!   step = gain(t) × t_m × stability
//! ```
//!
//! ## W, the high threshold (seed §III)
//!
//! Readers acknowledge every K samples; the first sample of a group waits
//! for the K−1 after it, so `RTT_k = K·t_m + 2·t_prop + t_proc + t_ack`
//! with `t_m = size_m / C`. Continuous sending needs a window of at least
//! `RTT_k / t_m = RTT_1 / t_m + K − 1` samples; more only adds bursts, so
//! `W = ⌈RTT_1 / t_m⌉ + K − 1`, clamped to `[low + 1, window_slots_max]`.
//! Both inputs are re-estimated while the writer runs (the seed measured
//! them once; the issue asks for periodic re-estimation):
//!
//! - `RTT_1`: the minimum of the RTT samples over a sliding window
//!   ([`NapaConfig::rtt_window_ns`]). The last sample of an ack group is
//!   acknowledged at once, so the window minimum is `RTT_1` without
//!   queueing; queueing only raises the other samples.
//! - `C`: the delivery rate (acknowledged bytes over the time between ack
//!   arrivals, over at least [`NapaConfig::rate_interval_ns_min`] and two
//!   RTTs), a sliding maximum over the same window. That rate is the bottleneck's (link or
//!   slowest reader) when the writer offers at least `C`; a sample taken
//!   while NAPA itself paced slower than `C` only says the writer was slow,
//!   so it is used only when it raises the estimate (as BBR treats
//!   application-limited samples) or when the occupancy exceeded W
//!   meanwhile (a queue stood at the bottleneck, so it was busy). [`NapaConfig::link_capacity_bytes_per_s`]
//!   is the estimate until the first sample.
//!
//! ## The gain and the stability factor
//!
//! `gain(t)` falls linearly from `gain_start` to `gain_end` over
//! `gain_decay_ns` from the first call (seed §V: 1.0 → 0.2 over 30 s): large
//! steps to find the operating point, small ones to stay there. The seed
//! does not define its stability factor; here it is `2^-s`, `s` in
//! `0..=STABILITY_SHIFT_MAX`: each reversal of direction halves the step;
//! from the [`STABILITY_RUN`]th move in one direction on, each move doubles
//! it back (an oscillation damps itself; a real change in the path gets
//! full steps again).
//!
//! ## Refinements of the seed, and why
//!
//! The seed's rule alone (`N > W` up, `N < low` down, else hold) loses
//! throughput in the model, for reasons the seed's figures do not show;
//! each refinement below fixes one, measured in `docs/napa.md`.
//!
//! - **N over the period.** Call [`Napa::step`] as often as convenient (on
//!   every send and ack); between decisions it only records the minimum and
//!   maximum occupancy. With acks every K samples `N` is a sawtooth of
//!   height K: one reading per period would see its top or bottom by
//!   chance. The top is what meets the window limit (`> W`), the bottom
//!   what meets the empty pipe (`< low`).
//! - **No decision before the first RTT sample** (seed §IV measures RTT
//!   first): the gap holds its starting value `t_m` until W is known.
//! - **Recovery.** With acks every K, `N` never falls below 1 while `T` is
//!   somewhat above `t_m` (N ≥ 1 at the sawtooth's bottom for any `T` below
//!   about `RTT_1`): the seed's rule alone would keep a gap that an earlier
//!   `N > W` pushed up and so lose throughput for good. While `N` is inside
//!   the range and `T > t_m`, the gap steps back toward `t_m` (never below:
//!   only `N < low` and the probe go below).
//! - **Anti-windup.** A queue above W drains only as fast as the gap exceeds
//!   the bottleneck's `t_m`; raising the gap every period until `N ≤ W`
//!   overshoots by far. The gap rises only while `N_max` is not falling, and
//!   never past `2·t_m` ([`GAP_OVER_SAMPLE_TIME_MAX`]).
//! - **Probe.** A writer that paces at its capacity estimate sees a delivery
//!   rate equal to it, so an estimate lowered by a slow phase would confirm
//!   itself. In range at or below `t_m` the gap creeps down by
//!   `step >> PROBE_SHIFT`; if the path has no more room, `N > W` answers.
//! - **Sizes.** `t_m` uses a moving average of the sample size, so one odd
//!   sample does not move W.
//!
//! ## Driving contract
//!
//! No threads, clocks or sleeps: the caller passes `now_ns` (any monotonic
//! origin), calls [`Napa::on_sent`] for every sample it sends (sequence
//! numbers 1, 2, 3…), [`Napa::on_acked`] when the cumulative acknowledgement
//! of all readers advances, and [`Napa::step`] with the occupancy (sent, not
//! yet acknowledged by all), then waits until [`Napa::next_send_ns`] before
//! the next send. None of these allocates.

/// How far the stability factor may halve a step (`2^-6`).
pub const STABILITY_SHIFT_MAX: u32 = 6;

/// Moves in one direction after which each further one doubles the step
/// back (a real change, not an oscillation).
pub const STABILITY_RUN: u32 = 3;

/// The gap's increases stop at this multiple of `t_m`.
pub const GAP_OVER_SAMPLE_TIME_MAX: u64 = 2;

/// In range at or below `t_m`, the gap probes down by the step `>> 3`.
pub const PROBE_SHIFT: u32 = 3;

/// RTT probes kept in flight at once: a fixed ring (no allocation on send).
pub const RTT_PROBES_MAX: usize = 16;

/// Sub-windows of the sliding min/max filters.
const FILTER_BUCKETS: usize = 4;

const NS_PER_S: u128 = 1_000_000_000;

/// NAPA's parameters. [`NapaConfig::default`] gives the seed's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct NapaConfig {
    /// K: readers acknowledge every K samples (default 10).
    pub ack_every: u32,
    /// The acceptance range's low threshold (default 1: at least one
    /// unacknowledged sample, so the pipe never runs empty).
    pub low_threshold: u32,
    /// How often the gap is adjusted (default 1 ms).
    pub control_period_ns: u64,
    /// The gain at the first call (default 1.0).
    pub gain_start: f64,
    /// The gain once decayed (default 0.2).
    pub gain_end: f64,
    /// The linear decay's length (default 30 s; 0: `gain_end` at once).
    pub gain_decay_ns: u64,
    /// The capacity C until the first delivery-rate estimate replaces it.
    pub link_capacity_bytes_per_s: u64,
    /// RTT and capacity are estimated over a sliding window this long
    /// (default 1 s).
    pub rtt_window_ns: u64,
    /// A delivery-rate sample (the capacity estimate's input) spans at
    /// least this long, and at least two RTTs (default 32 ms, thirty-two
    /// control periods). Shorter samples see a reader that drains a backlog
    /// at memory speed after it was descheduled, a rate no writer can keep
    /// up: the maximum filter would then hold C several times too high,
    /// `t_m` too short, and the gap (capped at `2·t_m`) could never pace
    /// the writer below the bottleneck's rate. 1 ms samples did that on
    /// loopback; 8 ms ones still held C ~1.75× over the achieved rate
    /// across two network namespaces at 200 KB, the occupancy at 48 of 64
    /// slots against W = 11 (bench/RESULTS-dds.md). The price: C follows
    /// a faster path a few samples later (a sample every 32 ms, the filter
    /// over `rtt_window_ns`).
    pub rate_interval_ns_min: u64,
    /// The writer's hard window; W is clamped to it (default 256).
    pub window_slots_max: u32,
    /// The gap's upper clamp (default 100 ms).
    pub gap_ns_max: u64,
}

impl Default for NapaConfig {
    fn default() -> Self {
        NapaConfig {
            ack_every: 10,
            low_threshold: 1,
            control_period_ns: 1_000_000,
            gain_start: 1.0,
            gain_end: 0.2,
            gain_decay_ns: 30_000_000_000,
            link_capacity_bytes_per_s: 125_000_000, // 1 Gb/s, the seed's LAN
            rtt_window_ns: 1_000_000_000,
            rate_interval_ns_min: 32_000_000,
            window_slots_max: 256,
            gap_ns_max: 100_000_000,
        }
    }
}

/// A [`NapaConfig`] (or sample size) that NAPA cannot run with.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NapaConfigError {
    /// `ack_every` is 0.
    #[error("napa: ack_every (K) must be at least 1")]
    AckEveryZero,
    /// `low_threshold` is 0: the pipe-empty test could never fire.
    #[error("napa: low_threshold must be at least 1")]
    LowThresholdZero,
    /// The window leaves no acceptance range above the low threshold.
    #[error("napa: window_slots_max ({window_slots_max}) must exceed low_threshold ({low_threshold})")]
    WindowTooSmall {
        /// The configured window.
        window_slots_max: u32,
        /// The configured low threshold.
        low_threshold: u32,
    },
    /// `control_period_ns` is 0.
    #[error("napa: control_period_ns must be at least 1")]
    ControlPeriodZero,
    /// A gain is not a finite positive number.
    #[error("napa: {field} must be finite and > 0 (got {value})")]
    Gain {
        /// `gain_start` or `gain_end`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// `link_capacity_bytes_per_s` is 0.
    #[error("napa: link_capacity_bytes_per_s must be at least 1")]
    CapacityZero,
    /// `rtt_window_ns` is shorter than the control period.
    #[error("napa: rtt_window_ns ({rtt_window_ns}) must be at least control_period_ns ({control_period_ns})")]
    RttWindowTooShort {
        /// The configured window.
        rtt_window_ns: u64,
        /// The configured control period.
        control_period_ns: u64,
    },
    /// `rate_interval_ns_min` is 0, or longer than the RTT/capacity window
    /// (the capacity filter would then never hold more than one sample).
    #[error("napa: rate_interval_ns_min ({rate_interval_ns_min}) must be in 1..=rtt_window_ns ({rtt_window_ns})")]
    RateIntervalOutOfRange {
        /// The configured minimum rate-sample span.
        rate_interval_ns_min: u64,
        /// The configured window.
        rtt_window_ns: u64,
    },
    /// `gap_ns_max` is 0.
    #[error("napa: gap_ns_max must be at least 1")]
    GapMaxZero,
    /// The sample size is 0.
    #[error("napa: sample_bytes must be at least 1")]
    SampleBytesZero,
}

impl NapaConfig {
    /// Checks every field; the first bad one is the error.
    pub fn validate(&self) -> Result<(), NapaConfigError> {
        if self.ack_every == 0 {
            return Err(NapaConfigError::AckEveryZero);
        }
        if self.low_threshold == 0 {
            return Err(NapaConfigError::LowThresholdZero);
        }
        if self.window_slots_max <= self.low_threshold {
            return Err(NapaConfigError::WindowTooSmall {
                window_slots_max: self.window_slots_max,
                low_threshold: self.low_threshold,
            });
        }
        if self.control_period_ns == 0 {
            return Err(NapaConfigError::ControlPeriodZero);
        }
        for (field, value) in [("gain_start", self.gain_start), ("gain_end", self.gain_end)] {
            if !value.is_finite() || value <= 0.0 {
                return Err(NapaConfigError::Gain { field, value });
            }
        }
        if self.link_capacity_bytes_per_s == 0 {
            return Err(NapaConfigError::CapacityZero);
        }
        if self.rtt_window_ns < self.control_period_ns {
            return Err(NapaConfigError::RttWindowTooShort {
                rtt_window_ns: self.rtt_window_ns,
                control_period_ns: self.control_period_ns,
            });
        }
        if self.rate_interval_ns_min == 0 || self.rate_interval_ns_min > self.rtt_window_ns {
            return Err(NapaConfigError::RateIntervalOutOfRange {
                rate_interval_ns_min: self.rate_interval_ns_min,
                rtt_window_ns: self.rtt_window_ns,
            });
        }
        if self.gap_ns_max == 0 {
            return Err(NapaConfigError::GapMaxZero);
        }
        Ok(())
    }
}

/// One observation of the controller, for traces and plots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NapaTrace {
    /// The time of the last call.
    pub now_ns: u64,
    /// The current gap T.
    pub gap_ns: u64,
    /// The occupancy N passed to the last [`Napa::step`].
    pub occupancy: u32,
    /// W.
    pub high_threshold: u32,
    /// The RTT estimate (window minimum; 0 before the first sample).
    pub rtt_ns: u64,
    /// The capacity estimate C.
    pub capacity_bytes_per_s: u64,
    /// The gain at the last decision.
    pub gain: f64,
}

/// A sliding-window minimum or maximum over [`FILTER_BUCKETS`] sub-windows
/// (fixed size: no allocation).
#[derive(Clone, Debug)]
struct WindowedExtreme {
    /// `(sub-window index, extreme in it)`, oldest first; `len` in use.
    buckets: [(u64, u64); FILTER_BUCKETS],
    len: usize,
    bucket_ns: u64,
    keep_max: bool,
}

impl WindowedExtreme {
    fn new(window_ns: u64, keep_max: bool) -> Self {
        WindowedExtreme {
            buckets: [(0, 0); FILTER_BUCKETS],
            len: 0,
            bucket_ns: (window_ns / FILTER_BUCKETS as u64).max(1),
            keep_max,
        }
    }

    fn better(&self, a: u64, b: u64) -> u64 {
        if self.keep_max {
            a.max(b)
        } else {
            a.min(b)
        }
    }

    fn update(&mut self, now_ns: u64, value: u64) {
        let index = now_ns / self.bucket_ns;
        if self.len > 0 && self.buckets[self.len - 1].0 == index {
            let last = &mut self.buckets[self.len - 1];
            last.1 = if self.keep_max {
                last.1.max(value)
            } else {
                last.1.min(value)
            };
            return;
        }
        if self.len == FILTER_BUCKETS {
            self.buckets.copy_within(1.., 0);
            self.len -= 1;
        }
        self.buckets[self.len] = (index, value);
        self.len += 1;
    }

    /// The extreme over the buckets still inside the window, if any.
    fn get(&self, now_ns: u64) -> Option<u64> {
        let index_now = now_ns / self.bucket_ns;
        self.buckets[..self.len]
            .iter()
            .filter(|(index, _)| index_now.saturating_sub(*index) < FILTER_BUCKETS as u64)
            .map(|(_, value)| *value)
            .reduce(|a, b| self.better(a, b))
    }
}

/// The NAPA controller of one reliable writer (see the module docs).
#[derive(Clone, Debug)]
pub struct Napa {
    cfg: NapaConfig,
    /// The moving average of the sample size.
    sample_bytes: u32,
    gap_ns: u64,
    /// The first call's time: the gain decays from here.
    start_ns: Option<u64>,
    decision_next_ns: u64,
    occupancy_min: u32,
    occupancy_max: u32,
    occupancy_last: u32,
    /// The previous decision's maximum occupancy (the trend of the queue).
    occupancy_max_last: u32,
    stability_shift: u32,
    direction_last: i8,
    gain: f64,
    now_last_ns: u64,
    /// RTT probes `(seq, sent_ns)`, oldest at `probe_head`.
    probes: [(u64, u64); RTT_PROBES_MAX],
    probe_head: usize,
    probe_len: usize,
    probe_seq_last: u64,
    rtt_filter: WindowedExtreme,
    rtt_ns: u64,
    capacity_filter: WindowedExtreme,
    capacity_bytes_per_s: u64,
    acked_through: u64,
    /// Delivery-rate measurement: since this ack arrival, `rate_bytes`.
    rate_mark_ns: Option<u64>,
    rate_bytes: u64,
    /// Whether NAPA paced slower than C at any time since the mark.
    rate_pacing_limited: bool,
    /// Whether the occupancy exceeded W since the mark (a queue stood at
    /// the bottleneck, so the delivery rate is the bottleneck's).
    rate_backlogged: bool,
    /// Consecutive decisions in `direction_last`.
    direction_run: u32,
}

impl Napa {
    /// A controller for samples of `sample_bytes`; the gap starts at `t_m`
    /// of the configured capacity (sending at the link's rate).
    pub fn new(cfg: NapaConfig, sample_bytes: u32) -> Result<Napa, NapaConfigError> {
        cfg.validate()?;
        if sample_bytes == 0 {
            return Err(NapaConfigError::SampleBytesZero);
        }
        let mut napa = Napa {
            sample_bytes,
            gap_ns: 0,
            start_ns: None,
            decision_next_ns: 0,
            occupancy_min: u32::MAX,
            occupancy_max: 0,
            occupancy_last: 0,
            occupancy_max_last: 0,
            stability_shift: 0,
            direction_last: 0,
            gain: cfg.gain_start,
            now_last_ns: 0,
            probes: [(0, 0); RTT_PROBES_MAX],
            probe_head: 0,
            probe_len: 0,
            probe_seq_last: 0,
            rtt_filter: WindowedExtreme::new(cfg.rtt_window_ns, false),
            rtt_ns: 0,
            capacity_filter: WindowedExtreme::new(cfg.rtt_window_ns, true),
            capacity_bytes_per_s: cfg.link_capacity_bytes_per_s,
            acked_through: 0,
            rate_mark_ns: None,
            rate_bytes: 0,
            rate_pacing_limited: false,
            rate_backlogged: false,
            direction_run: 0,
            cfg,
        };
        napa.gap_ns = napa.sample_time_ns().min(napa.cfg.gap_ns_max);
        Ok(napa)
    }

    /// The configuration in force.
    pub fn config(&self) -> &NapaConfig {
        &self.cfg
    }

    /// The size of the sample about to be sent. Sizes may vary: `t_m` (so
    /// W, the step and the delivered bytes) follows their moving average
    /// (weight 1/8), so one odd sample does not move W.
    pub fn set_sample_bytes(&mut self, bytes: u32) {
        let average = (7 * self.sample_bytes as u64 + bytes.max(1) as u64 + 4) / 8;
        self.sample_bytes = average.clamp(1, u32::MAX as u64) as u32;
    }

    /// `t_m = size / C`, in ns (at least 1).
    pub fn sample_time_ns(&self) -> u64 {
        let ns = (self.sample_bytes as u128 * NS_PER_S).div_ceil(self.capacity_bytes_per_s.max(1) as u128);
        ns.clamp(1, u64::MAX as u128) as u64
    }

    fn touch(&mut self, now_ns: u64) {
        if self.start_ns.is_none() {
            self.start_ns = Some(now_ns);
            self.decision_next_ns = now_ns.saturating_add(self.cfg.control_period_ns);
        }
        self.now_last_ns = self.now_last_ns.max(now_ns);
    }

    /// Sample `seq` left the writer at `now_ns` (seq = 1, 2, 3…). Samples
    /// are probed for RTT while the fixed probe ring has room.
    pub fn on_sent(&mut self, seq: u64, now_ns: u64) {
        self.touch(now_ns);
        if self.gap_ns > self.sample_time_ns() {
            self.rate_pacing_limited = true;
        }
        if seq <= self.probe_seq_last || self.probe_len == RTT_PROBES_MAX {
            return;
        }
        let slot = (self.probe_head + self.probe_len) % RTT_PROBES_MAX;
        self.probes[slot] = (seq, now_ns);
        self.probe_len += 1;
        self.probe_seq_last = seq;
    }

    /// Every reader has acknowledged every sample up to `acked_through_seq`
    /// (cumulative; a value that does not advance is ignored).
    pub fn on_acked(&mut self, acked_through_seq: u64, now_ns: u64) {
        self.touch(now_ns);
        if acked_through_seq <= self.acked_through {
            return;
        }
        let newly = acked_through_seq - self.acked_through;
        self.acked_through = acked_through_seq;
        while self.probe_len > 0 {
            let (seq, sent_ns) = self.probes[self.probe_head];
            if seq > acked_through_seq {
                break;
            }
            self.rtt_filter.update(now_ns, now_ns.saturating_sub(sent_ns).max(1));
            self.probe_head = (self.probe_head + 1) % RTT_PROBES_MAX;
            self.probe_len -= 1;
        }
        if let Some(rtt_ns) = self.rtt_filter.get(now_ns) {
            self.rtt_ns = rtt_ns;
        }
        self.measure_rate(newly, now_ns);
    }

    /// The delivery rate between ack arrivals, over at least
    /// [`NapaConfig::rate_interval_ns_min`] and two RTTs, fed to the
    /// capacity filter.
    fn measure_rate(&mut self, newly_acked: u64, now_ns: u64) {
        let Some(mark_ns) = self.rate_mark_ns else {
            self.rate_mark_ns = Some(now_ns);
            self.rate_bytes = 0;
            self.rate_pacing_limited = self.gap_ns > self.sample_time_ns();
            self.rate_backlogged = false;
            return;
        };
        self.rate_bytes = self
            .rate_bytes
            .saturating_add(newly_acked.saturating_mul(self.sample_bytes as u64));
        let elapsed_ns = now_ns.saturating_sub(mark_ns);
        let interval_ns = self.cfg.rate_interval_ns_min.max(self.rtt_ns.saturating_mul(2));
        debug_assert!(
            interval_ns >= 1,
            "a rate sample spans time (validate: rate_interval_ns_min >= 1)"
        );
        if elapsed_ns < interval_ns || elapsed_ns == 0 {
            return;
        }
        let rate = (self.rate_bytes as u128 * NS_PER_S / elapsed_ns as u128).clamp(1, u64::MAX as u128) as u64;
        if !self.rate_pacing_limited || self.rate_backlogged || rate >= self.capacity_bytes_per_s {
            self.capacity_filter.update(now_ns, rate);
        }
        if let Some(capacity) = self.capacity_filter.get(now_ns) {
            self.capacity_bytes_per_s = capacity;
        }
        self.rate_mark_ns = Some(now_ns);
        self.rate_bytes = 0;
        self.rate_pacing_limited = self.gap_ns > self.sample_time_ns();
        self.rate_backlogged = false;
    }

    /// The gain at `now_ns`: linear from `gain_start` to `gain_end`.
    pub fn gain_at(&self, now_ns: u64) -> f64 {
        let elapsed_ns = now_ns.saturating_sub(self.start_ns.unwrap_or(now_ns));
        if elapsed_ns >= self.cfg.gain_decay_ns {
            return self.cfg.gain_end;
        }
        let fraction = elapsed_ns as f64 / self.cfg.gain_decay_ns as f64;
        self.cfg.gain_start + (self.cfg.gain_end - self.cfg.gain_start) * fraction
    }

    /// Records the occupancy (sent, not yet acknowledged by every reader);
    /// once per control period it also moves the gap. Cheap between
    /// decisions: call it on every send and ack.
    pub fn step(&mut self, now_ns: u64, occupancy: u32) {
        self.touch(now_ns);
        self.occupancy_last = occupancy;
        if occupancy > self.high_threshold() {
            self.rate_backlogged = true;
        }
        if self.rtt_ns == 0 {
            // No W yet (seed §IV: RTT first): hold the starting gap, and
            // open the first period when the first RTT sample arrives.
            self.decision_next_ns = now_ns.saturating_add(self.cfg.control_period_ns);
            self.occupancy_min = occupancy;
            self.occupancy_max = occupancy;
            return;
        }
        self.occupancy_min = self.occupancy_min.min(occupancy);
        self.occupancy_max = self.occupancy_max.max(occupancy);
        if now_ns < self.decision_next_ns {
            return;
        }
        let period_ns = self.cfg.control_period_ns;
        let late_periods = (now_ns - self.decision_next_ns) / period_ns;
        self.decision_next_ns += (late_periods + 1) * period_ns;
        self.decide(now_ns);
        // The next period starts empty: its extremes are its own.
        self.occupancy_min = u32::MAX;
        self.occupancy_max = 0;
    }

    fn decide(&mut self, now_ns: u64) {
        debug_assert!(
            self.occupancy_max >= self.occupancy_min,
            "a decision without an occupancy"
        );
        self.gain = self.gain_at(now_ns);
        let high = self.high_threshold();
        let t_m_ns = self.sample_time_ns();
        let growing = self.occupancy_max >= self.occupancy_max_last;
        self.occupancy_max_last = self.occupancy_max;
        let direction: i8 = if self.occupancy_max > high && (growing || self.gap_ns <= t_m_ns) {
            1
        } else if self.occupancy_max > high {
            0 // above W but already draining: more gap would only overshoot
        } else if self.occupancy_min < self.cfg.low_threshold || self.gap_ns > t_m_ns {
            -1 // the pipe ran empty, or recovery toward t_m
        } else {
            0
        };
        if direction == 0 {
            if self.occupancy_max <= high && self.gap_ns <= t_m_ns {
                // Probe (module docs): a C that the writer's own pacing
                // caps would otherwise confirm itself for ever.
                let shift = self.stability_shift + PROBE_SHIFT;
                let probe_ns = ((self.gain * t_m_ns as f64) as u64 >> shift).max(1);
                self.gap_ns = self.gap_ns.saturating_sub(probe_ns);
            }
            return;
        }
        if direction == self.direction_last {
            self.direction_run += 1;
            if self.direction_run >= STABILITY_RUN {
                self.stability_shift = self.stability_shift.saturating_sub(1);
            }
        } else {
            if self.direction_last != 0 {
                self.stability_shift = (self.stability_shift + 1).min(STABILITY_SHIFT_MAX);
            }
            self.direction_run = 1;
        }
        self.direction_last = direction;
        let step_ns = ((self.gain * t_m_ns as f64) as u64 >> self.stability_shift).max(1);
        self.gap_ns = if direction > 0 {
            // Anti-windup: pacing at half the estimated bottleneck rate
            // already drains any queue; beyond that only C can be wrong,
            // and its estimate follows a backlogged delivery rate.
            let gap_max_ns = t_m_ns.saturating_mul(GAP_OVER_SAMPLE_TIME_MAX);
            let raised_ns = self.gap_ns.saturating_add(step_ns).min(gap_max_ns);
            raised_ns.max(self.gap_ns.min(gap_max_ns)).min(self.cfg.gap_ns_max)
        } else if self.occupancy_min < self.cfg.low_threshold {
            self.gap_ns.saturating_sub(step_ns)
        } else {
            // Recovery toward t_m, never below it (module docs), at least
            // `gain` of the way: the capacity samples that set t_m leave the
            // window if the gap lingers above it.
            let distance_ns = self.gap_ns - t_m_ns;
            let recovery_ns = step_ns.max((self.gain * distance_ns as f64) as u64);
            self.gap_ns.saturating_sub(recovery_ns).max(t_m_ns)
        };
        debug_assert!(self.gap_ns <= self.cfg.gap_ns_max);
    }

    /// The current inter-sample gap T.
    pub fn gap_ns(&self) -> u64 {
        self.gap_ns
    }

    /// The earliest time the next sample may be sent.
    pub fn next_send_ns(&self, last_send_ns: u64) -> u64 {
        last_send_ns.saturating_add(self.gap_ns)
    }

    /// W = ⌈RTT_1 / t_m⌉ + K − 1, clamped to `[low + 1, window_slots_max]`;
    /// the whole window before the first RTT sample.
    pub fn high_threshold(&self) -> u32 {
        let low = self.cfg.low_threshold;
        let max = self.cfg.window_slots_max;
        if self.rtt_ns == 0 {
            return max;
        }
        let in_flight = self.rtt_ns.div_ceil(self.sample_time_ns());
        let w = in_flight.saturating_add(self.cfg.ack_every as u64 - 1);
        w.clamp(low as u64 + 1, max as u64) as u32
    }

    /// The RTT estimate (0 before the first sample).
    pub fn rtt_ns(&self) -> u64 {
        self.rtt_ns
    }

    /// The capacity estimate C.
    pub fn capacity_bytes_per_s(&self) -> u64 {
        self.capacity_bytes_per_s
    }

    /// The controller's state, for traces and plots.
    pub fn snapshot(&self) -> NapaTrace {
        NapaTrace {
            now_ns: self.now_last_ns,
            gap_ns: self.gap_ns,
            occupancy: self.occupancy_last,
            high_threshold: self.high_threshold(),
            rtt_ns: self.rtt_ns,
            capacity_bytes_per_s: self.capacity_bytes_per_s,
            gain: self.gain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NapaConfig {
        NapaConfig {
            gain_decay_ns: 1_000_000_000,
            ..NapaConfig::default()
        }
    }

    #[test]
    fn every_bad_field_is_refused_by_name() {
        let bad: [(NapaConfig, &str); 12] = [
            (NapaConfig { ack_every: 0, ..cfg() }, "ack_every"),
            (
                NapaConfig {
                    low_threshold: 0,
                    ..cfg()
                },
                "low_threshold",
            ),
            (
                NapaConfig {
                    window_slots_max: 1,
                    ..cfg()
                },
                "window_slots_max",
            ),
            (
                NapaConfig {
                    control_period_ns: 0,
                    ..cfg()
                },
                "control_period_ns",
            ),
            (
                NapaConfig {
                    gain_start: f64::NAN,
                    ..cfg()
                },
                "gain_start",
            ),
            (NapaConfig { gain_end: 0.0, ..cfg() }, "gain_end"),
            (
                NapaConfig {
                    link_capacity_bytes_per_s: 0,
                    ..cfg()
                },
                "link_capacity",
            ),
            (
                NapaConfig {
                    rtt_window_ns: 10,
                    ..cfg()
                },
                "rtt_window_ns",
            ),
            (
                NapaConfig {
                    rate_interval_ns_min: 0,
                    ..cfg()
                },
                "rate_interval_ns_min",
            ),
            (
                NapaConfig {
                    rate_interval_ns_min: 2_000_000_000,
                    ..cfg()
                },
                "rate_interval_ns_min",
            ),
            (NapaConfig { gap_ns_max: 0, ..cfg() }, "gap_ns_max"),
            (cfg(), "sample_bytes"),
        ];
        for (config, field) in bad {
            let bytes = if field == "sample_bytes" { 0 } else { 1000 };
            let error = Napa::new(config, bytes).unwrap_err();
            assert!(error.to_string().contains(field), "{error} names {field}");
        }
        assert!(Napa::new(cfg(), 1000).is_ok());
    }

    #[test]
    fn w_follows_the_seed_formula() {
        // 100 kB at 1 Gb/s: t_m = 800 µs; RTT_1 = 1 ms → ⌈1.25⌉ + 10 − 1 = 11.
        // Delivery-rate samples of 8 ms (not the default's 32) keep the
        // story short.
        let cfg = || NapaConfig {
            rate_interval_ns_min: 8_000_000,
            ..cfg()
        };
        let mut napa = Napa::new(cfg(), 100_000).unwrap();
        assert_eq!(napa.sample_time_ns(), 800_000);
        assert_eq!(napa.high_threshold(), 256, "no RTT yet: the whole window");
        napa.on_sent(1, 0);
        napa.on_acked(1, 1_000_000);
        assert_eq!(napa.rtt_ns(), 1_000_000);
        assert_eq!(napa.high_threshold(), 11);
        // A later, queued sample does not raise the window minimum; its
        // ack comes 4 ms after the first, too soon for a delivery-rate
        // sample (rate_interval_ns_min, 8 ms): C stays as configured.
        napa.on_sent(2, 2_000_000);
        napa.on_acked(2, 5_000_000);
        assert_eq!(napa.rtt_ns(), 1_000_000);
        assert_eq!(napa.capacity_bytes_per_s(), 125_000_000);
        // 10 ms after the first ack, 200 kB: the first delivery rate.
        napa.on_sent(3, 6_000_000);
        napa.on_acked(3, 11_000_000);
        assert_eq!(napa.capacity_bytes_per_s(), 20_000_000);
        assert_eq!(napa.sample_time_ns(), 5_000_000);
        assert_eq!(napa.high_threshold(), 1 + 10 - 1);
        // Clamp to the hard window.
        let mut small = Napa::new(
            NapaConfig {
                window_slots_max: 8,
                ..cfg()
            },
            100_000,
        )
        .unwrap();
        small.on_sent(1, 0);
        small.on_acked(1, 1_000_000);
        assert_eq!(small.high_threshold(), 8);
    }

    /// A path that sustains 40 k samples/s of 100 kB (25 µs each) but
    /// acknowledges in bursts, as a 2-core host where the writer and the
    /// reader hold a core each only part of the time: 200 samples in about
    /// 2 ms (2.5 times the sustained rate), then nothing for about 3 ms.
    /// Rate samples of one control period see the burst; NAPA's cap on
    /// the gap (2·t_m) then stays below the path's real time per sample,
    /// so the gap could never pace the writer slower than the path drains.
    /// The default 32 ms samples span whole cycles.
    #[test]
    fn bursty_acks_do_not_inflate_the_capacity() {
        // 20 acks of 10 samples each, 100 µs apart, 3 ms into each 5 ms
        // cycle; each sample was sent 60 µs before its ack (the RTT).
        let path = BurstyAcks {
            sample_bytes: 100_000,
            cycles: 200,
            cycle_ns: 5_000_000,
            first_ack_ns: 3_000_000,
            acks_per_cycle: 20,
            ack_spacing_ns: 100_000,
            rtt_ns: 60_000,
        };
        path.check_spans(1_000_000, 25_000, 15);
    }

    /// Bursts longer than 8 ms: a path that sustains 10 k samples/s of
    /// 200 kB (100 µs each, the veth path between two network namespaces
    /// on a 2-core host) acknowledges them in 30 ms cycles, all in the
    /// first 10 ms (3 times the sustained rate), then nothing for 20 ms.
    /// 8 ms rate samples can fall on a burst: C three times too high, and
    /// the gap (at most `2·t_m`) below the path's time per sample, so the
    /// queue fills the window (what the netns run of 2026-12-04 showed).
    /// The default 32 ms samples hold at least one whole cycle.
    #[test]
    fn bursts_longer_than_a_short_sample_do_not_inflate_the_capacity() {
        // A cycle's 300 samples, acknowledged 10 at a time, 30 acks spread
        // over the burst (one every 333 µs); each sample sent 90 µs before
        // its ack (the RTT).
        let path = BurstyAcks {
            sample_bytes: 200_000,
            cycles: 40,
            cycle_ns: 30_000_000,
            first_ack_ns: 1_000_000,
            acks_per_cycle: 30,
            ack_spacing_ns: 10_000_000 / 30,
            rtt_ns: 90_000,
        };
        path.check_spans(8_000_000, 100_000, 16);
    }

    /// A path that acknowledges in bursts: `acks_per_cycle` acks of 10
    /// samples each, `ack_spacing_ns` apart from `first_ack_ns` into each
    /// `cycle_ns` cycle, each sample sent `rtt_ns` before its ack.
    struct BurstyAcks {
        sample_bytes: u64,
        cycles: u64,
        cycle_ns: u64,
        first_ack_ns: u64,
        acks_per_cycle: u64,
        ack_spacing_ns: u64,
        rtt_ns: u64,
    }

    impl BurstyAcks {
        /// A controller fed this path's sends and acks, with rate samples
        /// of at least `rate_interval_ns_min`.
        fn feed(&self, rate_interval_ns_min: u64) -> Napa {
            let mut napa = Napa::new(
                NapaConfig {
                    window_slots_max: 64,
                    rate_interval_ns_min,
                    ..cfg()
                },
                self.sample_bytes as u32,
            )
            .unwrap();
            let mut seq = 0u64;
            for cycle in 0..self.cycles {
                for ack in 0..self.acks_per_cycle {
                    let now = cycle * self.cycle_ns + self.first_ack_ns + ack * self.ack_spacing_ns;
                    for _ in 0..10 {
                        seq += 1;
                        napa.on_sent(seq, now - self.rtt_ns);
                    }
                    napa.on_acked(seq, now);
                }
            }
            napa
        }

        /// Rate samples of `short_ns` see the bursts (C at least twice the
        /// sustained rate, the gap's cap below the path's time per sample);
        /// the default's span whole cycles (C within 0.9 and
        /// `long_tenths_max` tenths of it, the gap able to pace below it).
        fn check_spans(&self, short_ns: u64, sustained_ns_per_sample: u64, long_tenths_max: u64) {
            let sustained = self.sample_bytes * 1_000_000_000 / sustained_ns_per_sample;
            let short = self.feed(short_ns);
            assert!(
                short.capacity_bytes_per_s() >= 2 * sustained,
                "{} ms samples see the burst: C {} against {sustained}",
                short_ns / 1_000_000,
                short.capacity_bytes_per_s()
            );
            assert!(GAP_OVER_SAMPLE_TIME_MAX * short.sample_time_ns() < sustained_ns_per_sample);
            let long = self.feed(NapaConfig::default().rate_interval_ns_min);
            let capacity = long.capacity_bytes_per_s();
            assert!(
                capacity * 10 <= long_tenths_max * sustained && capacity * 10 >= 9 * sustained,
                "the default samples span whole cycles: C {capacity} against {sustained}"
            );
            assert!(
                GAP_OVER_SAMPLE_TIME_MAX * long.sample_time_ns() >= sustained_ns_per_sample,
                "the gap can pace below the path's rate"
            );
        }
    }

    #[test]
    fn rtt_minimum_expires_with_its_window() {
        let mut napa = Napa::new(cfg(), 100_000).unwrap();
        napa.on_sent(1, 0);
        napa.on_acked(1, 1_000_000);
        // Two seconds later the path is slower: the old minimum has left the
        // 1 s window and the new RTT is taken.
        napa.on_sent(2, 3_000_000_000);
        napa.on_acked(2, 3_004_000_000);
        assert_eq!(napa.rtt_ns(), 4_000_000);
    }

    #[test]
    fn gap_moves_with_occupancy_and_gain_decays() {
        let mut napa = Napa::new(cfg(), 100_000).unwrap();
        napa.on_sent(1, 0);
        napa.on_acked(1, 1_000_000); // W = 11
        let t_m = napa.sample_time_ns();
        assert_eq!(napa.gap_ns(), t_m, "starts at t_m");
        napa.step(1_000_000, 5); // in range at t_m: probe down a little
        assert!(napa.gap_ns() < t_m && napa.gap_ns() >= t_m - t_m / 8);
        napa.step(1_500_000, 40);
        napa.step(2_000_000, 40); // N > W and growing: increase by gain × t_m
        assert!(napa.gap_ns() > t_m, "N > W increases the gap");
        let raised = napa.gap_ns();
        napa.step(2_500_000, 30);
        napa.step(3_000_000, 20); // above W but draining: hold (no windup)
        assert_eq!(napa.gap_ns(), raised);
        napa.step(4_000_000, 5); // in range, gap above t_m: recover, not below t_m
        assert!(napa.gap_ns() < raised && napa.gap_ns() >= t_m);
        napa.step(5_000_000, 5);
        assert!(napa.gap_ns() <= t_m);
        let probed = napa.gap_ns();
        napa.step(6_000_000, 0); // N < low: a full step down
        let g = napa.gap_ns();
        assert!(g < probed && probed - g > t_m / 8);
        napa.step(6_500_000, 0); // same period: no decision
        assert_eq!(napa.gap_ns(), g);
        assert_eq!(napa.next_send_ns(10), 10 + g);
        assert!((napa.gain_at(0) - 1.0).abs() < 1e-9);
        assert!((napa.gain_at(500_000_000) - 0.6).abs() < 1e-9);
        assert!((napa.gain_at(2_000_000_000) - 0.2).abs() < 1e-9);
        let trace = napa.snapshot();
        assert_eq!((trace.gap_ns, trace.occupancy, trace.high_threshold), (g, 0, 11));
    }

    #[test]
    fn no_decision_before_the_first_rtt_sample() {
        let mut napa = Napa::new(cfg(), 100_000).unwrap();
        for now in 0..100u64 {
            napa.step(now * 1_000_000, if now % 2 == 0 { 0 } else { 200 });
        }
        assert_eq!(napa.gap_ns(), napa.sample_time_ns());
    }

    #[test]
    fn gap_stays_within_its_clamps() {
        for (gap_ns_max, clamp) in [(1_000_000, 1_000_000), (100_000_000, 2 * 800_000)] {
            let mut napa = Napa::new(NapaConfig { gap_ns_max, ..cfg() }, 100_000).unwrap();
            napa.on_sent(1, 0);
            napa.on_acked(1, 1_000_000);
            for now in 0..200u64 {
                napa.step(now * 1_000_000, 1000);
                assert!(napa.gap_ns() <= clamp);
            }
            assert_eq!(napa.gap_ns(), clamp, "gap_ns_max, or 2·t_m (anti-windup)");
            for now in 200..2000u64 {
                napa.step(now * 1_000_000, 0);
            }
            assert_eq!(napa.gap_ns(), 0);
        }
    }

    #[test]
    fn capacity_follows_the_delivery_rate() {
        // Configured 1 Gb/s; acks show 50 MB/s while NAPA paces at t_m.
        let mut napa = Napa::new(cfg(), 100_000).unwrap();
        let mut now = 0;
        for seq in 1..=200u64 {
            napa.on_sent(seq, now);
            now += 2_000_000; // 100 kB every 2 ms = 50 MB/s
            napa.on_acked(seq, now);
        }
        let c = napa.capacity_bytes_per_s();
        assert!((49_000_000..=51_000_000).contains(&c), "C = {c}");
        assert_eq!(napa.sample_time_ns(), (100_000 * 1_000_000_000u64).div_ceil(c));
    }

    #[test]
    fn probe_ring_is_bounded() {
        let mut napa = Napa::new(cfg(), 1000).unwrap();
        for seq in 1..=1000u64 {
            napa.on_sent(seq, seq);
        }
        assert_eq!(napa.probe_len, RTT_PROBES_MAX);
        napa.on_acked(1000, 10_000);
        assert_eq!(napa.probe_len, 0);
        assert_eq!(napa.rtt_ns(), 10_000 - RTT_PROBES_MAX as u64);
    }
}
