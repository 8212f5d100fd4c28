//! The lock-free reservation ring that lets several application threads
//! send at once, and the progress loop publish what they committed.
//!
//! ```text
//!   positions:   published ≤ (committed, in any order) < reserved ≤ limit
//!                 ▲ progress loop     ▲ app threads           ▲ flow control
//! ```
//!
//! - `reserve` (any thread): CAS `reserved` from `r` to `r + 1` while
//!   `r < limit`: the thread owns slot position `r`. No lock, no wait:
//!   a full window returns `None` (back-pressure).
//! - `reserve_many(n_max)` (any thread): the same CAS from `r` to `r + n`,
//!   `n = min(n_max, limit - r)`: the thread owns positions `r..r + n`.
//!   One atomic read-modify-write (a full barrier on x86) for the run
//!   instead of one per slot.
//! - `commit(r)` (the owner): store `r + 1` in `committed[r % W]` with
//!   Release. Storing the position (not a flag) makes a stale mark from
//!   the previous lap of the ring harmless.
//! - `scan` (progress loop only): count consecutive committed positions
//!   from `published`, loading marks with Acquire: whatever the owner
//!   wrote into the slot before committing is visible to the publisher,
//!   which then makes it visible to peers with the guard.
//! - `set_limit` (progress loop): flow control raises `limit` to
//!   `min(released) + W`.

use std::ops::Range;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, Ordering};

pub struct SendRing {
    reserved: CachePadded<AtomicU64>,
    limit: CachePadded<AtomicU64>,
    committed: Box<[AtomicU64]>,
    window_slots: u64,
    /// Sends refused because the window was full.
    pub backpressure: CachePadded<AtomicU64>,
    stopped: AtomicBool,
    /// A [`crate::LargeSend`] holds it while it sends (one at a time).
    pub(crate) large_in_progress: AtomicBool,
    /// Large messages started (the next one's id).
    pub(crate) large_started: AtomicU64,
}

impl SendRing {
    pub fn new(window_slots: usize) -> SendRing {
        assert!(window_slots.is_power_of_two(), "window_slots must be a power of two");
        SendRing {
            reserved: CachePadded::new(AtomicU64::new(0)),
            limit: CachePadded::new(AtomicU64::new(window_slots as u64)),
            committed: (0..window_slots).map(|_| AtomicU64::new(0)).collect(),
            window_slots: window_slots as u64,
            backpressure: CachePadded::new(AtomicU64::new(0)),
            stopped: AtomicBool::new(false),
            large_in_progress: AtomicBool::new(false),
            large_started: AtomicU64::new(0),
        }
    }

    /// Take the next slot position, or `None` when the window is full.
    #[inline]
    pub fn reserve(&self) -> Option<u64> {
        self.reserve_many(1).map(|run| run.start)
    }

    /// Take up to `n_max` consecutive slot positions with one atomic, or
    /// `None` when the window is full. Fewer than `n_max` come back when
    /// the window has fewer free slots.
    #[inline]
    pub fn reserve_many(&self, n_max: u64) -> Option<Range<u64>> {
        debug_assert!(n_max >= 1, "a reservation takes at least one slot");
        let mut r = self.reserved.load(Ordering::Relaxed);
        loop {
            // Partner: the Release store in `set_limit`: a position below
            // the limit is one every member has released.
            let limit = self.limit.load(Ordering::Acquire);
            if r >= limit {
                self.backpressure.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let n = n_max.min(limit - r);
            // Relaxed: the CAS only divides positions among reserving
            // threads; what the slots may hold was ordered by the Acquire
            // above (released by every member) and is published by the
            // Release in `commit`.
            match self
                .reserved
                .compare_exchange_weak(r, r + n, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    debug_assert!(
                        r + n <= limit && n <= self.window_slots,
                        "flow control: positions {r}..{} reserved past the limit {limit}",
                        r + n
                    );
                    return Some(r..r + n);
                }
                Err(seen) => r = seen,
            }
        }
    }

    /// Mark `position` committed (its owner has finished writing the slot).
    #[inline]
    pub fn commit(&self, position: u64) {
        let mark = &self.committed[(position % self.window_slots) as usize];
        debug_assert!(
            mark.load(Ordering::Relaxed) <= position,
            "no duplication: position {position} committed twice"
        );
        // Partner: the Acquire load in `scan`.
        mark.store(position + 1, Ordering::Release);
    }

    /// How many positions from `published` on are committed (at most a
    /// window's worth).
    #[inline]
    pub fn scan(&self, published: u64) -> u64 {
        let mut n = 0;
        while n < self.window_slots {
            let p = published + n;
            // Partner: the Release store in `commit`.
            if self.committed[(p % self.window_slots) as usize].load(Ordering::Acquire) != p + 1 {
                break;
            }
            n += 1;
        }
        n
    }

    /// Raise the flow-control limit (progress loop only; never lowers it).
    #[inline]
    pub fn set_limit(&self, limit: u64) {
        debug_assert!(
            limit >= self.limit.load(Ordering::Relaxed),
            "flow-control limit never moves back"
        );
        // Partner: the Acquire load in `reserve`.
        self.limit.store(limit, Ordering::Release);
    }

    /// The flow-control limit (positions below it were released by every
    /// member, less one window).
    #[inline]
    pub fn limit(&self) -> u64 {
        // Partner: the Release store in `set_limit`.
        self.limit.load(Ordering::Acquire)
    }

    /// Positions handed out so far.
    #[inline]
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    pub fn window_slots(&self) -> u64 {
        self.window_slots
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn reserve_respects_limit_and_scan_stops_at_holes() {
        let ring = SendRing::new(4);
        let got: Vec<u64> = (0..5).filter_map(|_| ring.reserve()).collect();
        assert_eq!(got, vec![0, 1, 2, 3], "window of 4: the fifth reservation is refused");
        assert_eq!(ring.backpressure.load(Ordering::Relaxed), 1);
        ring.commit(1);
        assert_eq!(ring.scan(0), 0, "position 0 not committed: nothing publishable");
        ring.commit(0);
        assert_eq!(ring.scan(0), 2);
        ring.set_limit(6);
        assert_eq!(ring.reserve(), Some(4));
        ring.commit(2);
        ring.commit(3);
        ring.commit(4);
        assert_eq!(ring.scan(2), 3, "stale marks from the last lap do not count");
    }

    #[test]
    fn reserve_many_takes_what_the_window_has_and_scan_sees_the_run() {
        let ring = SendRing::new(8);
        assert_eq!(ring.reserve_many(3), Some(0..3));
        assert_eq!(ring.reserve(), Some(3));
        assert_eq!(ring.reserve_many(16), Some(4..8), "clipped to the limit, never past it");
        assert_eq!(ring.reserve_many(1), None, "full window: back-pressure");
        assert_eq!(ring.backpressure.load(Ordering::Relaxed), 1);
        for p in [2, 0, 1] {
            ring.commit(p);
        }
        assert_eq!(
            ring.scan(0),
            3,
            "a run commits slot by slot; scan stops at the first hole"
        );
        ring.set_limit(10);
        assert_eq!(ring.reserve_many(4), Some(8..10));
        assert_eq!(ring.reserved(), 10);
    }
}
