//! The clock the bench reads around every timed multicast. A sample is
//! a few hundred nanoseconds, so the clock's own cost shows in it: two
//! `Instant::now` (a vDSO `clock_gettime`) cost some 20-30 ns each on
//! the VMs measured here, where the cache-line round trip the sample is
//! compared with is timed over batches (no clock per exchange). Where
//! the CPU has an invariant TSC (`constant_tsc` and `nonstop_tsc` in
//! /proc/cpuinfo) samples are read from it (`lfence; rdtsc; lfence`, a
//! few ns) and converted to ns by the TSC's rate measured against
//! `Instant` over the whole sampling loop; elsewhere `Instant` is used.

use std::time::Instant;

/// A per-sample clock: ticks, and their rate once sampling is over.
pub struct SampleClock {
    tsc: bool,
    base: Instant,
}

impl SampleClock {
    pub fn new() -> SampleClock {
        SampleClock {
            tsc: invariant_tsc(),
            base: Instant::now(),
        }
    }

    /// `tsc` or `instant`, as the JSON names it.
    pub fn name(&self) -> &'static str {
        if self.tsc {
            "tsc"
        } else {
            "instant"
        }
    }

    /// Now, in ticks (TSC cycles, or ns since the clock was made).
    #[inline(always)]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            // SAFETY: lfence and rdtsc have no memory operands and are
            // available on every x86_64 CPU (the TSC's presence and
            // invariance were checked in `invariant_tsc`).
            return unsafe {
                std::arch::x86_64::_mm_lfence();
                let t = std::arch::x86_64::_rdtsc();
                std::arch::x86_64::_mm_lfence();
                t
            };
        }
        self.base.elapsed().as_nanos() as u64
    }

    /// Nanoseconds per tick over an interval: `ticks` read by [`Self::now`]
    /// while `elapsed_ns` passed by `Instant`.
    pub fn ns_per_tick(&self, ticks: u64, elapsed_ns: f64) -> f64 {
        if self.tsc && ticks > 0 {
            elapsed_ns / ticks as f64
        } else {
            1.0
        }
    }

    /// The cost one sample carries from the clock: the median, over
    /// batches, of the gap between two reads in a row, in ns.
    pub fn read_pair_ns(&self) -> f64 {
        const READS: u64 = 1_000;
        let mut gaps = Vec::with_capacity(31);
        for _ in 0..31 {
            let (t0, i0) = (self.now(), Instant::now());
            let mut sum = 0u64;
            for _ in 0..READS {
                let a = self.now();
                let b = self.now();
                sum += b - a;
            }
            let (t1, i1) = (self.now(), Instant::now());
            let per_tick = self.ns_per_tick(t1 - t0, (i1 - i0).as_nanos() as f64);
            gaps.push(sum as f64 / READS as f64 * per_tick);
        }
        gaps.sort_by(f64::total_cmp);
        gaps[gaps.len() / 2]
    }
}

impl Default for SampleClock {
    fn default() -> SampleClock {
        SampleClock::new()
    }
}

fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("tsc") && has("constant_tsc") && has("nonstop_tsc")
}
