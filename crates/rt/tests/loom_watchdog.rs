//! Loom model of the watchdog's claims ([`WatchdogShared`], the code the
//! dispatcher and the watchdog run): both sides walk one task's jobs in
//! order, the dispatcher claiming each as it starts it, the watchdog
//! skipping what it sees claimed and claiming the rest at their critical
//! start. Every job is claimed by exactly one side. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-rt --test loom_watchdog`.
#![cfg(loom)]

use loom::sync::Arc;
use spindle_rt::watchdog::WatchdogShared;

const JOBS: u64 = 3;

#[test]
fn every_job_has_exactly_one_claimer() {
    loom::model(|| {
        let shared = Arc::new(WatchdogShared::new(1));
        let watchdog = {
            let shared = shared.clone();
            loom::thread::spawn(move || {
                // As `watchdog::run` plans: skip past what is claimed, then
                // claim the next job when its critical start comes.
                let mut mine = Vec::new();
                let mut next = 0;
                while next < JOBS {
                    next = next.max(shared.claimed(0)).min(JOBS);
                    if next == JOBS {
                        break;
                    }
                    if shared.claim(0, next) {
                        mine.push(next);
                    }
                    next += 1;
                }
                mine
            })
        };
        // The dispatcher: every job in order, run if its claim succeeds,
        // dropped (already reported by the watchdog) if not.
        let ran: Vec<u64> = (0..JOBS).filter(|&k| shared.claim(0, k)).collect();
        let reported = watchdog.join().unwrap();
        let mut all: Vec<u64> = ran.iter().chain(&reported).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..JOBS).collect::<Vec<_>>(), "ran {ran:?}, reported {reported:?}");
        assert_eq!(shared.claimed(0), JOBS);
    });
}
