//! The syncer's step (`Durability::Disk`): a backup writes the log from
//! its `durable` position up to the guard it sees into its segment files,
//! fdatasyncs once for all of it (group commit), then publishes the new
//! `durable`, which the master waits for before it acknowledges.
//!
//! ```text
//!  master                          syncer (backup)                       master
//!  bytes, guard (Release) ──▶      g = guard            (Acquire)
//!                                  write log[durable..g] to disk,
//!                                  fdatasync
//!                                  durable = g          (Release) ──▶    durable ≥ n (Acquire):
//!                                                                        log[..n] is on disk
//! ```
//!
//! `durable` never passes what is on disk: the syncer only publishes a
//! guard it Acquire-loaded, after the write and sync of everything below
//! it returned. [`step`] is generic over the cells ([`AtomicWord`]) so
//! that `tests/loom_durable.rs` checks it with loom's atomics.

use spindle_fabric::sync::{AtomicWord, Ordering};

/// One syncer step: `Ok(Some(guard))` when `durable` moved to a newly
/// seen `guard` after `write_and_sync(from, to)` put log positions
/// `from..to` on disk (the caller pushes `durable` to the master);
/// `Ok(None)` when there was nothing new.
#[inline]
pub fn step<W: AtomicWord>(
    guard: &W,
    durable: &W,
    write_and_sync: impl FnOnce(u64, u64) -> Result<(), String>,
) -> Result<Option<u64>, String> {
    // Acquire: pairs with the master's Release store of the guard
    // (`Master::publish_guard`; on tcp, the Release fence before the
    // guard's frame is applied): every log byte below it is in our area.
    let seen = guard.load(Ordering::Acquire);
    // Relaxed: only this thread writes `durable`.
    let synced = durable.load(Ordering::Relaxed);
    if seen == synced {
        return Ok(None);
    }
    assert!(
        seen > synced,
        "durability: the guard moved back from {synced} to {seen}"
    );
    write_and_sync(synced, seen)?;
    // Release: pairs with the Acquire load of `durable` in the master's
    // `wait_parked` (through the push): the write and the sync of
    // everything below `seen` happen before the acknowledgement.
    durable.store(seen, Ordering::Release);
    Ok(Some(seen))
}
