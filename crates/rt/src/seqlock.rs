//! The channel slot's seqlock: how a receive task copies slot `k % 2`
//! while the sender may already be rewriting it for period `k + 2` (a
//! lapping writer: the receiver overran, or its clock lags), and never
//! hands the application a torn copy.
//!
//! ```text
//!  writer (send task, period k)              reader (receive task, period k)
//!  begin = k + 1          (Relaxed)          guard ≥ k + 1 ?       (Acquire) else missing
//!  fence(Release)  ─────────────────┐        copy slot, word loads (Relaxed)
//!  slot k % 2 ← words     (Relaxed) └──────▶ fence(Acquire)
//!  guard = k + 1          (Release) ───────▶ begin ≤ k + 2 ?       (Relaxed) else torn
//! ```
//!
//! Every access to the slot is atomic (word stores by the writer,
//! [`RowRef::copy_atomic`](spindle_fabric::RowRef::copy_atomic) by the
//! reader), so a lapping writer is a race the memory model allows, not
//! undefined behaviour. If the reader's copy saw any word of period
//! `k + 2`, the writer's Release fence (after `begin = k + 3`) and the
//! reader's Acquire fence (before its `begin` load) synchronize, so the
//! reader sees `begin ≥ k + 3` and discards the copy. `begin = k + 2` is
//! the writer of period `k + 1`, on the other slot: harmless.
//!
//! The functions are generic over the cell ([`AtomicWord`]): production
//! passes row cells, `tests/loom_seqlock.rs` passes loom cells and checks
//! that a reader never accepts a torn copy.

use crate::sync::{fence, AtomicWord, Ordering};

/// The writer, before it rewrites the slot of `period`: announce it.
#[inline]
pub fn begin_write<W: AtomicWord>(begin: &W, period: u64) {
    begin.store(period + 1, Ordering::Relaxed);
    // Release: pairs with the Acquire fence in `copy_is_intact` (a reader
    // whose copy saw a word stored after this fence sees this `begin`).
    fence(Ordering::Release);
}

/// The writer, after the slot of `period` is written (and pushed).
#[inline]
pub fn publish<W: AtomicWord>(guard: &W, period: u64) {
    // Release: pairs with the Acquire load in `is_published` (publishes
    // the slot's words).
    guard.store(period + 1, Ordering::Release);
}

/// The reader, before it copies: whether the slot of `period` was
/// published (else the message is missing).
#[inline]
pub fn is_published<W: AtomicWord>(guard: &W, period: u64) -> bool {
    // Acquire: pairs with the Release store in `publish` (the slot's words).
    guard.load(Ordering::Acquire) > period
}

/// The reader, after it copied the slot of `period` with atomic loads:
/// whether no writer of a later period (`period + 2`, the same slot)
/// started meanwhile (else the copy may be torn and is discarded).
#[inline]
pub fn copy_is_intact<W: AtomicWord>(begin: &W, period: u64) -> bool {
    // Acquire: pairs with the Release fence in `begin_write` (a lapping
    // writer's words in our copy imply we see its `begin`).
    fence(Ordering::Acquire);
    begin.load(Ordering::Relaxed) <= period + 2
}
