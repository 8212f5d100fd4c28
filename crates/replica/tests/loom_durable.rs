//! Loom model of the disk syncer's step ([`spindle_replica::durable::step`],
//! the code the syncer thread runs): the master writes two records and
//! their guards (Relaxed stores, then the guard with Release), the syncer
//! steps twice, copying what it saw into its "disk" cells before it
//! publishes `durable`, and the master reads `durable`. Whenever the master
//! sees `durable = n`, records `0..n` are on the disk with their values:
//! an acknowledgement never comes before the sync. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-replica --test loom_durable`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use spindle_replica::durable;

const RECORDS: usize = 2;

struct Cells {
    /// The master's area (the log) and its guard for this backup.
    log: [AtomicU64; RECORDS],
    guard: AtomicU64,
    /// The backup's segment file and its `durable` position.
    disk: [AtomicU64; RECORDS],
    durable: AtomicU64,
}

#[test]
fn durable_never_passes_what_is_on_disk() {
    static ACKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loom::model(|| {
        let c = Arc::new(Cells {
            log: std::array::from_fn(|_| AtomicU64::new(0)),
            guard: AtomicU64::new(0),
            disk: std::array::from_fn(|_| AtomicU64::new(0)),
            durable: AtomicU64::new(0),
        });
        let master_writes = {
            let c = c.clone();
            loom::thread::spawn(move || {
                for (i, r) in c.log.iter().enumerate() {
                    r.store(100 + i as u64, Ordering::Relaxed);
                    // As Master::publish_guard: the guard after the bytes.
                    c.guard.store(i as u64 + 1, Ordering::Release);
                }
            })
        };
        let master_waits = {
            let c = c.clone();
            loom::thread::spawn(move || {
                // One look (see loom_echo.rs for why not a polling loop).
                let acked = c.durable.load(Ordering::Acquire) as usize;
                for (i, d) in c.disk.iter().enumerate().take(acked) {
                    assert_eq!(
                        d.load(Ordering::Relaxed),
                        100 + i as u64,
                        "durable {acked} before record {i} was on disk"
                    );
                }
                if acked > 0 {
                    ACKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        let syncer = {
            let c = c.clone();
            loom::thread::spawn(move || {
                let mut last = 0;
                for _ in 0..2 {
                    let stepped = durable::step(&c.guard, &c.durable, |from, to| {
                        for i in from as usize..to as usize {
                            // write + fdatasync: the bytes reach the disk cells.
                            c.disk[i].store(c.log[i].load(Ordering::Relaxed), Ordering::Relaxed);
                        }
                        Ok(())
                    })
                    .unwrap();
                    if let Some(seen) = stepped {
                        assert!(seen > last, "durable only moves forward");
                        last = seen;
                    }
                }
            })
        };
        master_writes.join().unwrap();
        master_waits.join().unwrap();
        syncer.join().unwrap();
    });
    assert!(
        ACKED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no explored execution acknowledged anything: the model checked nothing"
    );
}
