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
        let mut published = 0;
        for _ in 0..3 {
            let n = ring.scan(published);
            for p in published..published + n {
                // SAFETY: committed (Acquire in scan) and not yet released.
                let v = slots.0[p as usize].with(|v| unsafe { *v });
                assert_eq!(v % 100, p, "published slot {p} carries its writer's data");
            }
            published += n;
            loom::thread::yield_now();
        }
        for w in writers {
            w.join().unwrap();
        }
        published += ring.scan(published);
        assert_eq!(published, 2, "both commits are eventually published, no duplication");
    });
}
