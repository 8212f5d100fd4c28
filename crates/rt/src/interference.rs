//! The host's **interference**: how long the host keeps a thread that
//! wants to run off its CPU (other threads, interrupts and softirqs, the
//! hypervisor descheduling a virtual CPU), and the admission modes that
//! use it.
//!
//! Admission ([`crate::admission`]) charges every job `C + I` and
//! shortens every deadline by the clock bound and the release jitter `J`.
//! Both terms are learned from the host, not assumed:
//!
//! - **before commit**, a calibration of several seconds
//!   ([`crate::node::calibrate_host`]): wake-ups as far apart as the
//!   releases, each a hybrid sleep (its lateness is a release-jitter
//!   sample) followed by a **stall detector** spin
//!   ([`crate::os::spin_for_gaps`]: a tight loop reading the clock and
//!   recording every gap between two reads). Each wake-up gives one
//!   *lost-time* sample: the time the host took across the target (the
//!   wake-up's whole lateness when it was disturbed: one stall is charged
//!   once, as interference, never also as release jitter) plus what the
//!   probe lost after it, or the longest gap seen while spinning towards
//!   the release, whichever is larger;
//! - **during the run**, the dispatcher records the longest gap of every
//!   spin and every release's lateness; the watchdog reports when they
//!   exceed what admission assumed ([`crate::watchdog`]).
//! - **between runs**, a [`HostRecord`] keeps the worst of everything
//!   observed on the host (calibrations and runs); worst-case admission
//!   takes at least its figures, so a stall a run once saw is charged to
//!   the next commit.
//!
//! ```text
//!  calibration:  sleep ─▶ spin to target (gaps) ─▶ target: lateness ─▶ probe spin (gaps) ─▶ sleep …
//!                disturbed wake-up (slept past the target, or a gap while spinning):
//!                    J sample = 0,        I sample = lateness + probe's lost time
//!                undisturbed wake-up:
//!                    J sample = lateness, I sample = probe's lost time
//!  admission:    worst case: J = max, I = max     statistical: J, I = quantile (1 − miss budget)
//! ```
//!
//! Two modes ([`AdmissionMode`]):
//!
//! - **worst case** (the default): `J` and `I` are the largest seen. A set
//!   admitted this way misses only if the host later does worse than
//!   anything it did during the calibration; the run reports it when it
//!   does.
//! - **statistical** with a miss budget `b` (e.g. `1e-4`): `J` and `I` are
//!   the `1 − b` quantiles of the calibration samples (p99 for `b =
//!   1e-2`); a calibration with fewer than `1/b` samples falls back to its
//!   maximum. The run reports its observed miss rate against `b`.
//!
//! Everything here is pure: the samples come from the OS layer.

/// Bounds on the miss budget of the statistical mode.
pub const MISS_BUDGET_MIN: f64 = 1e-9;
pub const MISS_BUDGET_MAX: f64 = 0.5;

/// How admission turns the host's calibration into margins.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub enum AdmissionMode {
    /// The largest release jitter and interference seen.
    #[default]
    WorstCase,
    /// The `1 − miss_budget` quantiles; the user accepts up to
    /// `miss_budget` of the jobs missing.
    Statistical { miss_budget: f64 },
}

impl AdmissionMode {
    /// From the command line's `--admission` and `--miss-budget`.
    pub fn parse(mode: &str, miss_budget: Option<f64>) -> Result<AdmissionMode, String> {
        match (mode, miss_budget) {
            ("worst-case", None) => Ok(AdmissionMode::WorstCase),
            ("worst-case", Some(b)) => Err(format!(
                "--miss-budget {b} applies to --admission statistical only (worst-case admission accepts no miss)"
            )),
            ("statistical", None) => Err("--admission statistical needs --miss-budget (e.g. 1e-4)".into()),
            ("statistical", Some(b)) => {
                if !(MISS_BUDGET_MIN..=MISS_BUDGET_MAX).contains(&b) {
                    return Err(format!(
                        "--miss-budget {b} must be in {MISS_BUDGET_MIN:e}..={MISS_BUDGET_MAX} (a fraction of the jobs)"
                    ));
                }
                Ok(AdmissionMode::Statistical { miss_budget: b })
            }
            (other, _) => Err(format!("--admission '{other}': expected worst-case or statistical")),
        }
    }

    /// The miss budget (0 for worst case).
    pub fn miss_budget(&self) -> f64 {
        match self {
            AdmissionMode::WorstCase => 0.0,
            AdmissionMode::Statistical { miss_budget } => *miss_budget,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            AdmissionMode::WorstCase => "worst case (largest release jitter and interference seen)".into(),
            AdmissionMode::Statistical { miss_budget } => {
                format!("statistical, miss budget {miss_budget:e} (the 1 − budget quantiles)")
            }
        }
    }

    /// The margin this mode takes from `samples` (ns, any order): the
    /// maximum, or the `1 − budget` quantile (nearest rank; the maximum
    /// when there are fewer than `1 / budget` samples). 0 without samples.
    pub fn margin_ns(&self, samples: &[u64]) -> u64 {
        let Some(&max) = samples.iter().max() else { return 0 };
        match self {
            AdmissionMode::WorstCase => max,
            AdmissionMode::Statistical { miss_budget } => {
                let n = samples.len();
                // Samples allowed above the margin: floor(n · budget).
                let above = ((n as f64) * miss_budget).floor() as usize;
                if above == 0 {
                    return max;
                }
                let mut sorted = samples.to_vec();
                sorted.sort_unstable();
                sorted[n - 1 - above.min(n - 1)]
            }
        }
    }
}

/// A calibration's figures as reported (ns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InterferenceReport {
    /// How long the calibration ran, and its wake-ups.
    pub calibration_ns: u64,
    pub wakeups: u64,
    /// Lost-time samples (see the module docs): p99 and max.
    pub lost_p99_ns: u64,
    pub lost_max_ns: u64,
    /// The longest single gap the stall detector saw.
    pub gap_max_ns: u64,
    /// What admission used: release jitter and interference.
    pub release_jitter_admitted_ns: u64,
    pub interference_admitted_ns: u64,
    /// The host record's figures admission took at least ([`HostRecord`];
    /// 0: no record, or statistical mode).
    #[serde(default)]
    pub release_jitter_recorded_ns: u64,
    #[serde(default)]
    pub interference_recorded_ns: u64,
    /// Seen during the run: the longest gap of a dispatcher spin and the
    /// latest release; how many spins / releases exceeded what was admitted.
    #[serde(default)]
    pub run_gap_max_ns: u64,
    #[serde(default)]
    pub run_release_late_max_ns: u64,
    #[serde(default)]
    pub run_over_admitted: u64,
}

impl InterferenceReport {
    /// Whether the run saw more than admission assumed.
    pub fn exceeded(&self) -> bool {
        self.run_over_admitted > 0
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "interference: admitted {} µs, release jitter admitted {} µs (calibration {:.1} s, {} wake-ups: lost time p99 {} µs, max {} µs, longest gap {} µs)",
            self.interference_admitted_ns / 1_000,
            self.release_jitter_admitted_ns / 1_000,
            self.calibration_ns as f64 / 1e9,
            self.wakeups,
            self.lost_p99_ns / 1_000,
            self.lost_max_ns / 1_000,
            self.gap_max_ns / 1_000,
        );
        if self.interference_recorded_ns > 0 || self.release_jitter_recorded_ns > 0 {
            s += &format!(
                "; at least this host's record: interference {} µs, release jitter {} µs",
                self.interference_recorded_ns / 1_000,
                self.release_jitter_recorded_ns / 1_000
            );
        }
        s += &format!(
            "; in the run: longest gap {} µs, latest release {} µs",
            self.run_gap_max_ns / 1_000,
            self.run_release_late_max_ns / 1_000
        );
        if self.exceeded() {
            s += &format!(
                " — EXCEEDED what admission assumed ({} times): the host did worse than during the calibration",
                self.run_over_admitted
            );
        }
        s
    }
}

/// What a host has shown over its lifetime, kept between runs (the CLI
/// stores it in a file per host: see `spindle rt ring --host-record`):
/// the worst interference and the worst release lateness ever observed
/// there, by a calibration or during a run, each with when and by what.
///
/// A calibration of seconds does not see a stall that comes once a
/// minute; a run of minutes does, and the watchdog reports it. Keeping
/// that observation lets the *next* commit charge it: in worst-case mode
/// admission takes at least the recorded figures ([`HostRecord::floor`]),
/// so a host that once stalled for 11 ms rejects, at commit and with the
/// reason, a set whose deadlines cannot absorb 11 ms, instead of accepting
/// it and missing. The record only grows; to forget it, delete the file.
///
/// Pure data: the caller supplies the time and does the I/O.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostRecord {
    /// Format version ([`HostRecord::VERSION`]).
    pub version: u32,
    /// The host it was observed on (its hostname).
    pub host: String,
    /// The longest time the host kept a thread that wanted to run off its
    /// CPU (a calibration's lost time, a dispatcher spin's longest gap).
    pub interference_max_ns: u64,
    pub interference_seen: Option<Observation>,
    /// The latest release (a calibration wake-up's or a run's).
    pub release_jitter_max_ns: u64,
    pub release_jitter_seen: Option<Observation>,
    /// How many observations were merged (calibrations and runs).
    pub observations: u64,
    /// How long this host has been watched in all (calibrations and
    /// runs): a worst case seen over a minute says little of an hour.
    #[serde(default)]
    pub observed_ns: u64,
}

/// When and by what a recorded figure was observed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Observation {
    pub unix_time_s: u64,
    pub source: String,
}

/// Which figure an observation is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    Interference,
    ReleaseJitter,
}

impl HostRecord {
    pub const VERSION: u32 = 1;
    /// Longest source text kept (bounded file).
    pub const SOURCE_BYTES_MAX: usize = 200;

    pub fn new(host: &str) -> HostRecord {
        HostRecord {
            version: Self::VERSION,
            host: host.to_string(),
            ..HostRecord::default()
        }
    }

    /// Merge one observation; true when the recorded figure grew.
    pub fn observe(&mut self, figure: Figure, value_ns: u64, unix_time_s: u64, source: &str) -> bool {
        self.observations = self.observations.saturating_add(1);
        let (max, seen) = match figure {
            Figure::Interference => (&mut self.interference_max_ns, &mut self.interference_seen),
            Figure::ReleaseJitter => (&mut self.release_jitter_max_ns, &mut self.release_jitter_seen),
        };
        if value_ns <= *max {
            return false;
        }
        *max = value_ns;
        let mut source = source.to_string();
        if source.len() > Self::SOURCE_BYTES_MAX {
            let mut end = Self::SOURCE_BYTES_MAX;
            while !source.is_char_boundary(end) {
                end -= 1;
            }
            source.truncate(end);
        }
        *seen = Some(Observation { unix_time_s, source });
        debug_assert!(*max == value_ns);
        true
    }

    /// Add `ns` of watching (a calibration, a run) to the record; true
    /// when it grew.
    pub fn watched(&mut self, ns: u64) -> bool {
        self.observed_ns = self.observed_ns.saturating_add(ns);
        ns > 0
    }

    /// The least release jitter and interference admission takes in
    /// `mode`, `(jitter, interference)`. Worst case: no release jitter and
    /// the larger of the recorded interference and release lateness as
    /// interference. A recorded late release is a release the host made
    /// late by keeping the dispatcher off its CPU (time lost, what the
    /// interference term charges); charging it as release jitter as well
    /// would charge one stall twice (the release jitter proper, lateness
    /// with nothing taking the CPU, is tens of ns and comes from the
    /// calibration). Statistical mode: none (a single worst value says
    /// nothing of a quantile: that mode admits on its calibration's
    /// quantiles).
    pub fn floor(&self, mode: AdmissionMode) -> (u64, u64) {
        match mode {
            AdmissionMode::WorstCase => (0, self.interference_max_ns.max(self.release_jitter_max_ns)),
            AdmissionMode::Statistical { .. } => (0, 0),
        }
    }

    /// Checks a record read back: the version, and a figure for every
    /// observation source.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != Self::VERSION {
            return Err(format!(
                "version {} (this spindle reads version {})",
                self.version,
                Self::VERSION
            ));
        }
        if (self.interference_max_ns > 0) != self.interference_seen.is_some()
            || (self.release_jitter_max_ns > 0) != self.release_jitter_seen.is_some()
        {
            return Err("a recorded figure without its observation (or the reverse)".into());
        }
        Ok(())
    }

    pub fn describe(&self) -> String {
        let one = |ns: u64, seen: &Option<Observation>| match seen {
            Some(o) => format!("{} µs ({}, unix time {})", ns / 1_000, o.source, o.unix_time_s),
            None => "none".to_string(),
        };
        format!(
            "worst interference {}; worst release lateness {}; {} observations over {:.0} s",
            one(self.interference_max_ns, &self.interference_seen),
            one(self.release_jitter_max_ns, &self.release_jitter_seen),
            self.observations,
            self.observed_ns as f64 / 1e9
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_bad_input_names_the_value() {
        assert_eq!(AdmissionMode::parse("worst-case", None), Ok(AdmissionMode::WorstCase));
        assert_eq!(
            AdmissionMode::parse("statistical", Some(1e-4)),
            Ok(AdmissionMode::Statistical { miss_budget: 1e-4 })
        );
        for (mode, budget, needle) in [
            ("statistical", None, "needs --miss-budget"),
            ("statistical", Some(2.0), "--miss-budget 2"),
            ("statistical", Some(0.0), "--miss-budget 0"),
            ("statistical", Some(f64::NAN), "--miss-budget NaN"),
            ("worst-case", Some(1e-3), "statistical only"),
            ("optimistic", None, "'optimistic'"),
        ] {
            let e = AdmissionMode::parse(mode, budget).unwrap_err();
            assert!(e.contains(needle), "{mode} {budget:?}: '{needle}' not in {e}");
        }
    }

    #[test]
    fn worst_case_takes_the_max_and_statistical_the_quantile() {
        let samples: Vec<u64> = (1..=10_000).collect();
        assert_eq!(AdmissionMode::WorstCase.margin_ns(&samples), 10_000);
        let p99 = AdmissionMode::Statistical { miss_budget: 1e-2 };
        assert_eq!(p99.margin_ns(&samples), 9_900, "100 samples may lie above");
        let tight = AdmissionMode::Statistical { miss_budget: 1e-4 };
        assert_eq!(tight.margin_ns(&samples), 9_999);
        // Too few samples to know the 1 − 1e-4 quantile: the maximum.
        assert_eq!(tight.margin_ns(&samples[..500]), 500);
        assert_eq!(AdmissionMode::WorstCase.margin_ns(&[]), 0);
    }

    #[test]
    fn the_statistical_margin_never_exceeds_the_worst_case_one() {
        let samples = [5, 1, 900, 3, 3, 7, 2, 8, 1, 4];
        for b in [1e-9, 1e-4, 0.1, 0.25, 0.5] {
            let m = AdmissionMode::Statistical { miss_budget: b }.margin_ns(&samples);
            assert!(m <= 900);
            let above = samples.iter().filter(|s| **s > m).count();
            assert!(
                above as f64 <= samples.len() as f64 * b,
                "budget {b}: {above} above {m}"
            );
        }
    }

    #[test]
    fn a_report_says_when_the_run_exceeded_the_admitted_figures() {
        let mut r = InterferenceReport {
            interference_admitted_ns: 100_000,
            ..InterferenceReport::default()
        };
        assert!(!r.describe().contains("EXCEEDED"));
        r.run_gap_max_ns = 838_000;
        r.run_over_admitted = 1;
        assert!(r.exceeded() && r.describe().contains("EXCEEDED"), "{}", r.describe());
    }
    #[test]
    fn a_host_record_only_grows_and_keeps_what_saw_it() {
        let mut r = HostRecord::new("vm1");
        assert_eq!(r.floor(AdmissionMode::WorstCase), (0, 0));
        assert!(r.observe(Figure::Interference, 838_000, 10, "calibration, node B"));
        assert!(r.observe(Figure::Interference, 11_301_000, 20, "run, node A"));
        assert!(
            !r.observe(Figure::Interference, 5_000_000, 30, "run, node C"),
            "smaller: kept"
        );
        assert!(r.observe(Figure::ReleaseJitter, 9_595_000, 20, "run, node B"));
        assert_eq!(r.interference_max_ns, 11_301_000);
        let seen = r.interference_seen.clone().unwrap();
        assert_eq!((seen.unix_time_s, seen.source.as_str()), (20, "run, node A"));
        assert_eq!(r.observations, 4);
        assert!(r.watched(5_000_000_000) && !r.watched(0));
        assert_eq!(r.observed_ns, 5_000_000_000);
        assert_eq!(
            r.floor(AdmissionMode::WorstCase),
            (0, 11_301_000),
            "one stall, charged once"
        );
        let mut late_only = HostRecord::new("vm1");
        late_only.observe(Figure::ReleaseJitter, 4_348_124, 50, "run, node A");
        assert_eq!(late_only.floor(AdmissionMode::WorstCase), (0, 4_348_124));
        assert_eq!(r.floor(AdmissionMode::Statistical { miss_budget: 1e-4 }), (0, 0));
        assert!(r.validate().is_ok());
        assert!(r.describe().contains("11301 µs (run, node A"), "{}", r.describe());
        // Bounded sources, cut on a character boundary.
        let long = "é".repeat(300);
        assert!(r.observe(Figure::ReleaseJitter, 20_000_000, 40, &long));
        assert!(r.release_jitter_seen.as_ref().unwrap().source.len() <= HostRecord::SOURCE_BYTES_MAX);
    }

    #[test]
    fn a_host_record_round_trips_and_a_bad_one_says_why() {
        let mut r = HostRecord::new("vm1");
        r.observe(Figure::Interference, 4_468_000, 1_764_000_000, "run, node B");
        let text = serde_json::to_string(&r).unwrap();
        let back: HostRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert!(back.validate().is_ok());
        let old = HostRecord {
            version: 0,
            ..r.clone()
        };
        assert!(old.validate().unwrap_err().contains("version 0"));
        let torn = HostRecord {
            interference_seen: None,
            ..r
        };
        assert!(torn.validate().is_err());
    }
}
