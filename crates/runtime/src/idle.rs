//! Idle strategies: what a progress loop does when a pass found no work.
//!
//! `Backoff` spins (cheapest wake-up), then yields (lets the other members
//! of a group that share the cores run), then parks on the fabric's
//! doorbell with a timeout (so 8 processes on 2 cores still progress and
//! an idle group burns no CPU). Any work resets it to spinning.

use std::time::Duration;

use spindle_fabric::doorbell::Doorbell;

/// How a progress loop idles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStrategy {
    /// Never give the core up: lowest latency, needs a core per loop.
    BusySpin,
    /// Spin `spins`, then yield `yields` times, then park up to `park`.
    Backoff {
        /// Idle passes that spin before the loop starts yielding.
        spins: u32,
        /// Idle passes that yield the core before the loop starts parking.
        yields: u32,
        /// The longest single park on the doorbell.
        park: Duration,
    },
}

impl IdleStrategy {
    /// The default: 2,000 spins, 50 yields, parks of up to 1 ms.
    pub const DEFAULT_BACKOFF: IdleStrategy = IdleStrategy::Backoff {
        spins: 2_000,
        yields: 50,
        park: Duration::from_millis(1),
    };

    /// Parse `spin` or `backoff`.
    pub fn parse(s: &str) -> Result<IdleStrategy, String> {
        match s {
            "spin" | "busy-spin" => Ok(IdleStrategy::BusySpin),
            "backoff" => Ok(IdleStrategy::DEFAULT_BACKOFF),
            other => Err(format!("unknown idle strategy '{other}': expected 'spin' or 'backoff'")),
        }
    }
}

/// The most idle passes a backoff spins when a pass makes a system call
/// (see [`Idler::cap_spins`]): a few, for the arrival that comes a moment
/// after the last.
pub const SYSCALL_PASS_SPINS_MAX: u32 = 32;

/// The state of one loop's idle strategy, with its counters.
pub struct Idler {
    strategy: IdleStrategy,
    /// The most idle passes that spin ([`Idler::cap_spins`]).
    spins_max: u32,
    idle_passes: u32,
    /// Times the loop parked on the doorbell.
    pub parks: u64,
    /// Times the loop yielded the core.
    pub yields: u64,
}

impl Idler {
    /// A fresh idler: spinning, with zero parks and yields.
    pub fn new(strategy: IdleStrategy) -> Idler {
        Idler {
            strategy,
            spins_max: u32::MAX,
            idle_passes: 0,
            parks: 0,
            yields: 0,
        }
    }

    /// The strategy this idler follows.
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy
    }

    /// Spin at most `spins_max` idle passes; the spin passes taken off
    /// yield instead, so the loop still parks after as many idle passes.
    /// For a loop whose pass makes a system call (a tcp fabric's receive,
    /// about a microsecond here): a spin pass then costs as much as a
    /// yield and sees an arrival no sooner, but unlike a yield it keeps
    /// the core from the threads that share it: a DDS writer on the core
    /// of its participant's progress thread got an eighth of the core, and
    /// the writes waited for the spinner's time slices.
    pub fn cap_spins(&mut self, spins_max: u32) {
        self.spins_max = spins_max;
    }

    /// Call after every pass with the work it did. `has_work` re-checks
    /// for work after announcing a park (the doorbell protocol's second
    /// half); it is only called on the park path.
    #[inline]
    pub fn idle(&mut self, work: u32, doorbell: &dyn Doorbell, has_work: impl FnOnce() -> bool) {
        if work > 0 {
            self.idle_passes = 0;
            return;
        }
        match self.strategy {
            IdleStrategy::BusySpin => std::hint::spin_loop(),
            IdleStrategy::Backoff { spins, yields, park } => {
                let (spins, yields) = (
                    spins.min(self.spins_max),
                    yields.saturating_add(spins.saturating_sub(self.spins_max)),
                );
                self.idle_passes = self.idle_passes.saturating_add(1);
                if self.idle_passes <= spins {
                    std::hint::spin_loop();
                } else if self.idle_passes <= spins + yields {
                    self.yields += 1;
                    std::thread::yield_now();
                } else {
                    let ticket = doorbell.prepare_park();
                    if has_work() {
                        doorbell.cancel_park();
                        self.idle_passes = 0;
                    } else {
                        self.parks += 1;
                        doorbell.park(ticket, park);
                    }
                }
            }
        }
    }

    /// Forget past idleness (after an external event).
    pub fn reset(&mut self) {
        self.idle_passes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_fabric::doorbell::FutexDoorbell;

    #[test]
    fn backoff_goes_spin_yield_park_and_resets_on_work() {
        let bell = FutexDoorbell::new_local();
        let mut idler = Idler::new(IdleStrategy::Backoff {
            spins: 2,
            yields: 2,
            park: Duration::from_micros(10),
        });
        for _ in 0..4 {
            idler.idle(0, &bell, || false);
        }
        assert_eq!((idler.yields, idler.parks), (2, 0));
        idler.idle(0, &bell, || false);
        assert_eq!(idler.parks, 1);
        idler.idle(0, &bell, || true);
        assert_eq!(idler.parks, 1, "work found on re-check: no park");
        idler.idle(1, &bell, || false);
        idler.idle(0, &bell, || false);
        assert_eq!(idler.yields, 2, "work resets to spinning");
    }

    #[test]
    fn capped_spins_yield_instead_and_park_after_as_many_passes() {
        let bell = FutexDoorbell::new_local();
        let mut idler = Idler::new(IdleStrategy::Backoff {
            spins: 5,
            yields: 2,
            park: Duration::from_micros(10),
        });
        idler.cap_spins(1);
        for _ in 0..7 {
            idler.idle(0, &bell, || false);
        }
        assert_eq!(
            (idler.yields, idler.parks),
            (6, 0),
            "one spin, then the four spins taken off and the two yields yield"
        );
        idler.idle(0, &bell, || false);
        assert_eq!(idler.parks, 1, "parks after as many idle passes as uncapped");
        let mut busy = Idler::new(IdleStrategy::BusySpin);
        busy.cap_spins(0);
        for _ in 0..10 {
            busy.idle(0, &bell, || false);
        }
        assert_eq!(
            (busy.yields, busy.parks),
            (0, 0),
            "a busy-spin loop is kept as configured"
        );
    }
}
