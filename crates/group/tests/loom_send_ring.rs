//! Loom model of the send ring: two application threads reserve, write and
//! commit while the progress loop scans. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p spindle-group --test loom_send_ring --release`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use spindle_group::send_ring::SendRing;

struct Slots([UnsafeCell<u64>; 4]);
// SAFETY: access to each cell is serialized by the ring's protocol, which
// is exactly what loom checks here (it reports any racing access).
unsafe impl Sync for Slots {}

/// The progress loop's part: `passes` scans, publishing whatever is
/// committed in order and checking that each published slot carries its
/// writer's data (`v % 100 == position`). Returns the positions published.
fn publish_checked(ring: &SendRing, slots: &Slots, passes: usize) -> u64 {
    let mut published = 0;
    for _ in 0..passes {
        let n = ring.scan(published);
        for p in published..published + n {
            // SAFETY: committed (Acquire in scan) and not yet released.
            let v = slots.0[p as usize].with(|v| unsafe { *v });
            assert_eq!(v % 100, p, "published slot {p} carries its writer's data");
        }
        published += n;
        loom::thread::yield_now();
    }
    published
}

#[test]
fn reserved_slots_are_exclusive_and_published_writes_are_visible() {
    loom::model(|| {
        let ring = Arc::new(SendRing::new(4));
        let slots = Arc::new(Slots(std::array::from_fn(|_| UnsafeCell::new(0))));
        let writers: Vec<_> = (1..=2u64)
            .map(|t| {
                let (ring, slots) = (ring.clone(), slots.clone());
                loom::thread::spawn(move || {
                    let p = ring.reserve().expect("window of 4 fits two sends");
                    // SAFETY: position p is ours alone until commit (the
                    // property under test).
                    slots.0[p as usize].with_mut(|v| unsafe { *v = t * 100 + p });
                    ring.commit(p);
                })
            })
            .collect();
        // The progress loop: publish whatever is committed, in order.
        let mut published = publish_checked(&ring, &slots, 3);
        for w in writers {
            w.join().unwrap();
        }
        published += ring.scan(published);
        assert_eq!(published, 2, "both commits are eventually published, no duplication");
    });
}

/// A batched reservation (`reserve_many`, one CAS for several slots) races
/// a single one: the runs never overlap, every slot carries its writer's
/// data when published, and each position is published once.
#[test]
fn batched_and_single_reservations_are_exclusive_and_published_in_order() {
    loom::model(|| {
        let ring = Arc::new(SendRing::new(4));
        let slots = Arc::new(Slots(std::array::from_fn(|_| UnsafeCell::new(0))));
        let batch = {
            let (ring, slots) = (ring.clone(), slots.clone());
            loom::thread::spawn(move || {
                let run = ring.reserve_many(3).expect("window of 4 fits three and one");
                assert_eq!(run.end - run.start, 3, "the whole batch fits");
                for p in run {
                    // SAFETY: the run is this thread's alone until each
                    // commit (the property under test).
                    slots.0[p as usize].with_mut(|v| unsafe { *v = 100 + p });
                    ring.commit(p);
                }
            })
        };
        let single = {
            let (ring, slots) = (ring.clone(), slots.clone());
            loom::thread::spawn(move || {
                let p = ring.reserve().expect("window of 4 fits three and one");
                // SAFETY: as above.
                slots.0[p as usize].with_mut(|v| unsafe { *v = 200 + p });
                ring.commit(p);
            })
        };
        let mut published = publish_checked(&ring, &slots, 2);
        batch.join().unwrap();
        single.join().unwrap();
        published += ring.scan(published);
        assert_eq!(published, 4, "all four commits are published, no duplication");
        assert_eq!(ring.reserved(), 4);
    });
}

/// Flow control with batches: a batch is clipped to the limit, and a limit
/// the progress loop raises (Release in `set_limit`, Acquire in
/// `reserve_many`) hands out the next lap's slots only after the previous
/// lap's contents were read.
#[test]
fn batched_reservation_never_passes_the_limit() {
    loom::model(|| {
        let ring = Arc::new(SendRing::new(2));
        let slots = Arc::new(Slots(std::array::from_fn(|_| UnsafeCell::new(0))));
        let first = ring.reserve_many(3).expect("an empty window");
        assert_eq!(first, 0..2, "clipped to the window");
        for p in first {
            // SAFETY: reserved by this thread; no other thread runs yet.
            slots.0[p as usize].with_mut(|v| unsafe { *v = p });
            ring.commit(p);
        }
        let writer = {
            let (ring, slots) = (ring.clone(), slots.clone());
            loom::thread::spawn(move || {
                // Either the window is still full, or the lap was released.
                if let Some(run) = ring.reserve_many(2) {
                    assert!(run.end <= 4, "never past the limit");
                    for p in run {
                        // SAFETY: the limit's Acquire orders this write after
                        // the progress loop's read of the previous lap.
                        slots.0[(p % 2) as usize].with_mut(|v| unsafe { *v = p });
                        ring.commit(p);
                    }
                }
            })
        };
        // The progress loop: read the first lap, then release it.
        assert_eq!(ring.scan(0), 2);
        for p in 0..2u64 {
            // SAFETY: committed, and the limit still excludes the next lap.
            let v = slots.0[p as usize].with(|v| unsafe { *v });
            assert_eq!(v, p, "the first lap is intact until released");
        }
        ring.set_limit(4);
        writer.join().unwrap();
        let reserved = ring.reserved();
        assert!(reserved == 2 || reserved == 4, "a batch is taken whole or refused here");
        assert_eq!(ring.scan(2), reserved - 2, "whatever was reserved was committed");
    });
}
