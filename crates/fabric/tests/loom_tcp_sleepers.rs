//! Loom model of the tcp fabric's sleepers count ([`Sleepers`], the code
//! the tcp doorbell runs): a parker enters, re-checks for work and sleeps
//! on an eventfd; a waker (the receive thread) applies data and signals
//! the eventfd only when `must_wake` says a parker may have missed it.
//! The eventfd is modelled as the kernel's counter (readable while
//! non-zero). A waker that skips a parker which missed the data leaves it
//! asleep forever (no timeout here), which loom reports as a deadlock.
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-fabric --test loom_tcp_sleepers`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use spindle_fabric::tcp::Sleepers;

/// The kernel's eventfd: a counter; `ppoll` returns once it is non-zero.
#[derive(Default)]
struct EventFd {
    count: Mutex<u64>,
    readable: Condvar,
}

impl EventFd {
    fn write(&self) {
        *self.count.lock().unwrap() += 1;
        self.readable.notify_all();
    }
    fn poll_and_drain(&self) {
        let mut count = self.count.lock().unwrap();
        while *count == 0 {
            count = self.readable.wait(count).unwrap();
        }
        *count = 0;
    }
}

struct Fabric {
    sleepers: Sleepers,
    wake: EventFd,
    /// A guard in a row copy: the receive thread applies it.
    guard: AtomicU64,
}

impl Fabric {
    /// The receive thread: apply a frame, then `wake_local`.
    fn apply(&self, value: u64) {
        self.guard.store(value, Ordering::Release);
        if self.sleepers.must_wake() {
            self.wake.write();
        }
    }

    /// A progress loop's pass: prepare_park, re-check, park. Returns
    /// whether it saw `at_least` (after the park, if it parked).
    fn pass(&self, at_least: u64) -> bool {
        self.sleepers.enter();
        if self.guard.load(Ordering::Acquire) >= at_least {
            self.sleepers.leave();
            return true;
        }
        self.wake.poll_and_drain();
        self.sleepers.leave();
        self.guard.load(Ordering::Acquire) >= at_least
    }
}

#[test]
fn a_waker_never_skips_a_parker_that_missed_its_data() {
    loom::model(|| {
        let fabric = Arc::new(Fabric {
            sleepers: Sleepers::new(),
            wake: EventFd::default(),
            guard: AtomicU64::new(0),
        });
        let parker = {
            let fabric = fabric.clone();
            loom::thread::spawn(move || {
                // One pass is enough: the only eventfd write is the one
                // for this data, so a wake-up means it was applied.
                assert!(fabric.pass(1), "woken before the data was applied");
            })
        };
        fabric.apply(1);
        parker.join().unwrap();
        assert!(!fabric.sleepers.any(), "sleepers balance");
    });
}

#[test]
fn a_parker_that_comes_back_for_more_is_woken_again() {
    loom::model(|| {
        let fabric = Arc::new(Fabric {
            sleepers: Sleepers::new(),
            wake: EventFd::default(),
            guard: AtomicU64::new(0),
        });
        let parker = {
            let fabric = fabric.clone();
            loom::thread::spawn(move || {
                assert!(fabric.pass(1), "woken before the data was applied");
                // The first apply's write may still be counted (the
                // parker saw the data without parking): one stale
                // wake-up at most, then the second apply's.
                let passes = (0..2).take_while(|_| !fabric.pass(2)).count();
                assert!(passes < 2, "still no data after two wake-ups");
            })
        };
        fabric.apply(1);
        fabric.apply(2);
        parker.join().unwrap();
        assert!(!fabric.sleepers.any(), "sleepers balance");
    });
}
