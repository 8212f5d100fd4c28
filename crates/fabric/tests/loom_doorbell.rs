//! Loom model of the doorbell's event count ([`event_count`], the code
//! `FutexDoorbell` runs): a ringer publishes data and rings while waiters
//! prepare, re-check and park. The futex is modelled as the kernel
//! implements it: the value check and the queueing happen under the
//! bucket lock, and a wake takes that lock. A lost wake-up leaves a
//! waiter parked forever, which loom reports as a deadlock. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-fabric --test loom_doorbell`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use spindle_fabric::doorbell::event_count;

/// A doorbell over loom cells and a modelled futex (no timeout: a missed
/// ring is a hang, which is what loom detects).
struct Bell {
    seq: AtomicU32,
    sleepers: AtomicU32,
    bucket: Mutex<()>,
    queue: Condvar,
}

impl Bell {
    fn new() -> Bell {
        Bell {
            seq: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            bucket: Mutex::new(()),
            queue: Condvar::new(),
        }
    }

    fn ring(&self) {
        if event_count::ring(&self.seq, &self.sleepers) {
            let _bucket = self.bucket.lock().unwrap();
            self.queue.notify_all();
        }
    }

    /// Wait until `data` is set, as a progress loop does: prepare,
    /// re-check, park. Returns how many times it parked.
    fn wait_for(&self, data: &AtomicBool) -> u32 {
        let ticket = event_count::prepare_park(&self.seq, &self.sleepers);
        if data.load(Ordering::Acquire) {
            event_count::end_park(&self.sleepers);
            return 0;
        }
        // futex_wait(seq, ticket): sleep only if seq is still the ticket.
        let bucket = self.bucket.lock().unwrap();
        if self.seq.load(Ordering::SeqCst) == ticket {
            drop(self.queue.wait(bucket).unwrap());
        } else {
            drop(bucket);
        }
        event_count::end_park(&self.sleepers);
        1
    }
}

#[test]
fn a_ring_after_the_data_always_wakes_the_waiter() {
    loom::model(|| {
        let bell = Arc::new(Bell::new());
        let data = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (bell, data) = (bell.clone(), data.clone());
            loom::thread::spawn(move || {
                bell.wait_for(&data);
                // Woken (or never parked): the data is visible now.
                assert!(data.load(Ordering::Acquire), "woken without the data");
            })
        };
        data.store(true, Ordering::Release);
        bell.ring();
        waiter.join().unwrap();
        assert_eq!(bell.sleepers.load(Ordering::SeqCst), 0, "sleepers balance");
    });
}

#[test]
fn one_ring_wakes_every_parked_waiter() {
    // Two waiters make the state space large: bound the preemptions
    // (loom's recommended bound, 2-3, finds the bugs seen in practice).
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let bell = Arc::new(Bell::new());
        let data = Arc::new(AtomicBool::new(false));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (bell, data) = (bell.clone(), data.clone());
                loom::thread::spawn(move || {
                    bell.wait_for(&data);
                    assert!(data.load(Ordering::Acquire), "woken without the data");
                })
            })
            .collect();
        data.store(true, Ordering::Release);
        bell.ring();
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(bell.sleepers.load(Ordering::SeqCst), 0, "sleepers balance");
    });
}
