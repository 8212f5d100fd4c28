//! Loom model of the backup's echo ([`spindle_replica::echo::step`], the
//! code the echo thread runs): the backup's receive thread applies two
//! records and their guards as the tcp fabric does (a Release fence at
//! each frame's start, then Relaxed word stores), the echo thread steps,
//! and the master reads the echo. Whenever the master sees an echo of
//! `n`, records `0..n` are applied in the backup's row copy: the echo
//! never acknowledges before the data. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-replica --test loom_echo`.
#![cfg(loom)]

use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;
use spindle_replica::echo;

const RECORDS: usize = 2;

struct Backup {
    /// The backup's copy of the master's row: the records and `head[me]`.
    records: [AtomicU64; RECORDS],
    head: AtomicU64,
    /// The backup's own `head[me]`: the echo (as the master sees it once
    /// pushed; the push is another frame applied in order).
    echo: AtomicU64,
}

#[test]
fn an_echo_never_acknowledges_before_the_data() {
    // Executions in which the master saw an echo (counted over every
    // explored execution), to show the check is not vacuous.
    static ACKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loom::model(|| {
        let b = Arc::new(Backup {
            records: std::array::from_fn(|_| AtomicU64::new(0)),
            head: AtomicU64::new(0),
            echo: AtomicU64::new(0),
        });
        let receive = {
            let b = b.clone();
            loom::thread::spawn(move || {
                for (i, r) in b.records.iter().enumerate() {
                    // The record's frame, then the guard's frame.
                    fence(Ordering::Release);
                    r.store(100 + i as u64, Ordering::Relaxed);
                    fence(Ordering::Release);
                    b.head.store(i as u64 + 1, Ordering::Relaxed);
                }
            })
        };
        let master = {
            let b = b.clone();
            loom::thread::spawn(move || {
                // The master (`wait_replies`): whatever echo it sees, those
                // records are applied. One look, on a thread of its own: loom
                // stops offering a thread the values it saw before a
                // `yield_now`, so a polling loop would hide stale records.
                let acked = b.echo.load(Ordering::Acquire) as usize;
                for (i, r) in b.records.iter().enumerate().take(acked) {
                    assert_eq!(
                        r.load(Ordering::Relaxed),
                        100 + i as u64,
                        "echo {acked} before record {i}"
                    );
                }
                if acked > 0 {
                    ACKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        let echo_thread = {
            let b = b.clone();
            loom::thread::spawn(move || {
                let mut last = 0;
                for _ in 0..2 {
                    if let Some(seen) = echo::step(&b.head, &b.echo) {
                        assert!(seen > last, "the echo only moves forward");
                        last = seen;
                    }
                }
            })
        };
        receive.join().unwrap();
        echo_thread.join().unwrap();
        master.join().unwrap();
    });
    assert!(
        ACKED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "some execution acknowledges"
    );
}
