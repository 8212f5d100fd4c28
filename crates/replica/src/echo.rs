//! The echo (one-sided writes over a fabric whose push is not a
//! completion, tcp): a backup's echo thread copies the guard it sees
//! applied in its copy of the master's row (`head[me]`) into its own
//! `head[me]`, which it pushes back to the master as the acknowledgement.
//!
//! ```text
//!  master           receive thread (backup)        echo thread (backup)       master
//!  bytes, head ──▶  apply bytes, then head ──────▶ seen = head   (Acquire)
//!                   (Release fence per frame)      echo = seen   (Release) ─▶ echo ≥ n (Acquire):
//!                                                                              bytes < n applied
//! ```
//!
//! The echo never acknowledges before the data: it only ever echoes a
//! guard it Acquire-loaded, and the receive thread applied that guard's
//! bytes before it (frames are applied in order, each after a Release
//! fence). [`step`] is generic over the cells ([`AtomicWord`]) so that
//! `tests/loom_echo.rs` checks it with loom's atomics.

use spindle_fabric::sync::{AtomicWord, Ordering};

/// One echo step: `Some(guard)` when the echo moved to a newly seen
/// `guard` (the caller pushes it to the master), `None` when it is
/// already up to date.
#[inline]
pub fn step<W: AtomicWord>(seen_guard: &W, echo: &W) -> Option<u64> {
    // Acquire: pairs with the Release fence before the guard's frame is
    // applied (tcp receive thread; on shm, the master's Release store of
    // the guard): the bytes below the guard are applied.
    let seen = seen_guard.load(Ordering::Acquire);
    // Relaxed: only this thread writes the echo.
    if echo.load(Ordering::Relaxed) == seen {
        return None;
    }
    // Release: pairs with the Acquire load of the echo in the master's
    // `wait_parked` (through the push): what this thread saw applied
    // (the bytes below `seen`) happens before the acknowledgement.
    echo.store(seen, Ordering::Release);
    Some(seen)
}
