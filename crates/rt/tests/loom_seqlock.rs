//! Loom model of the channel slot's seqlock ([`spindle_rt::seqlock`], the
//! code the send and receive tasks run): a writer publishes periods 0, 1
//! and 2 into two slots (period 2 laps period 0's slot) while a reader
//! copies period 0 with word loads. The reader never accepts a torn copy:
//! whatever it accepts is exactly period 0's slot. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-rt --test loom_seqlock`.
#![cfg(loom)]

use std::sync::atomic::AtomicUsize as StdAtomicUsize;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use spindle_rt::seqlock;

/// Words per slot: the slot header's period and two payload words.
const WORDS: usize = 3;
const PERIODS: u64 = 3;

struct Channel {
    begin: AtomicU64,
    guard: AtomicU64,
    slots: [[AtomicU64; WORDS]; 2],
}

/// Period `k`'s slot: `[k, 10k + 1, 10k + 2]`.
fn word(period: u64, i: usize) -> u64 {
    if i == 0 {
        period
    } else {
        10 * period + i as u64
    }
}

fn send(ch: &Channel, period: u64) {
    seqlock::begin_write(&ch.begin, period);
    for (i, w) in ch.slots[period as usize % 2].iter().enumerate() {
        w.store(word(period, i), Ordering::Relaxed);
    }
    seqlock::publish(&ch.guard, period);
}

/// The receive task for `period`: `Some(copy)` if it accepted one.
fn receive(ch: &Channel, period: u64) -> Option<[u64; WORDS]> {
    if !seqlock::is_published(&ch.guard, period) {
        return None; // missing
    }
    let mut copy = [0u64; WORDS];
    for (out, w) in copy.iter_mut().zip(&ch.slots[period as usize % 2]) {
        *out = w.load(Ordering::Relaxed);
    }
    let intact = seqlock::copy_is_intact(&ch.begin, period);
    (intact && copy[0] == period).then_some(copy)
}

#[test]
fn a_lapping_writer_never_gets_a_torn_copy_accepted() {
    // Executions in which the reader accepted (outside the model: counts
    // over every explored execution), to show the check is not vacuous.
    static ACCEPTED: StdAtomicUsize = StdAtomicUsize::new(0);
    static TORN_DISCARDED: StdAtomicUsize = StdAtomicUsize::new(0);
    loom::model(|| {
        let ch = Arc::new(Channel {
            begin: AtomicU64::new(0),
            guard: AtomicU64::new(0),
            slots: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        });
        let writer = {
            let ch = ch.clone();
            loom::thread::spawn(move || (0..PERIODS).for_each(|k| send(&ch, k)))
        };
        match receive(&ch, 0) {
            Some(copy) => {
                assert_eq!(copy, [0, 1, 2], "accepted a torn copy of period 0");
                ACCEPTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            None if ch.guard.load(Ordering::Relaxed) > 0 => {
                TORN_DISCARDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            None => {}
        }
        writer.join().unwrap();
    });
    assert!(
        ACCEPTED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "some execution accepts"
    );
    assert!(
        TORN_DISCARDED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "some execution discards"
    );
}
