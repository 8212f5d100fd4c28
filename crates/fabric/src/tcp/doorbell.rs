//! The tcp fabric's doorbell: ringing flushes coalesced pushes and wakes
//! local parked loops; parking sleeps in `ppoll` on the peers' sockets and
//! an eventfd ([`recv::park`]). Who must be woken is counted in
//! [`Sleepers`], the waker's half of a Dekker pair with each parker:
//!
//! ```text
//!  parker (progress loop)              waker (receive thread, status change)
//!  sleepers.enter()  RMW + fence       apply frames (Release fence first)
//!  re-check for work ──┐               sleepers.must_wake(): fence + load
//!  ppoll(sockets, eventfd) <─ write(eventfd) if it saw a parker
//!  sleepers.leave()
//! ```
//!
//! `tests/loom_tcp_sleepers.rs` checks [`Sleepers`] under loom: a waker
//! never skips a parker that may have missed its data.

use std::time::Duration;

use super::{recv, Inner};
use crate::doorbell::Doorbell;
use crate::sync::{fence, AtomicU32, Ordering};

/// Progress threads between `prepare_park` and the end of `park`.
#[derive(Debug)]
pub struct Sleepers(AtomicU32);

impl Default for Sleepers {
    fn default() -> Sleepers {
        Sleepers::new()
    }
}

impl Sleepers {
    pub fn new() -> Sleepers {
        Sleepers(AtomicU32::new(0))
    }

    /// A parker announces itself, before its last re-check for work.
    #[inline]
    pub fn enter(&self) {
        // SeqCst: pairs with the SeqCst load in `must_wake`.
        self.0.fetch_add(1, Ordering::SeqCst);
        // SeqCst: pairs with the SeqCst fence in `must_wake` (Dekker):
        // orders the increment before the caller's re-check (an Acquire
        // load, which a SeqCst RMW alone does not order).
        fence(Ordering::SeqCst);
    }

    /// A parker is done (woken, timed out, or it did not park).
    #[inline]
    pub fn leave(&self) {
        // SeqCst: read by `must_wake` and `any`; nothing is published.
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "leave without enter");
    }

    /// The waker's side, after it published its data: whether a parker
    /// may have missed it (then the caller signals the eventfd).
    #[inline]
    pub fn must_wake(&self) -> bool {
        // SeqCst: pairs with the SeqCst fence in `enter` (Dekker): either
        // the parker's re-check sees the data stored before this fence,
        // or the load below sees the parker.
        fence(Ordering::SeqCst);
        // SeqCst: pairs with the SeqCst increment in `enter`.
        self.0.load(Ordering::SeqCst) > 0
    }

    /// Whether a parker is (about to be) parked: a hint for the receive
    /// thread's naps, no ordering needed beyond the count itself.
    #[inline]
    pub fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

impl Inner {
    /// Wake local loops parked on this fabric's doorbell (after applying
    /// frames or a status change).
    pub(super) fn wake_local(&self) {
        self.doorbell.ring();
        if self.sleepers.must_wake() {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a local u64 to our eventfd.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }
}

/// The fabric's doorbell. Ringing it first sends the pushes coalesced
/// since the last ring (the group layer rings after each batch of
/// pushes), then wakes local parked loops. Parking sleeps in `poll` on
/// the peers' sockets and an eventfd, and receives on the parked thread
/// ([`recv::park`]): a frame wakes the progress loop directly.
impl Doorbell for Inner {
    fn ring(&self) {
        if self.coalesce && self.flush_on_ring {
            self.flush_all();
        }
        self.wake_local();
    }
    fn prepare_park(&self) -> u32 {
        if self.coalesce {
            // Never sleep on unsent pushes.
            self.flush_all();
        }
        // Take what has arrived: the caller's re-check then sees it and
        // does not park at all.
        recv::try_receive(self);
        // Relaxed: a hint for the receive thread's naps, publishes nothing.
        self.parks.fetch_add(1, Ordering::Relaxed);
        self.sleepers.enter();
        0
    }
    fn park(&self, _ticket: u32, timeout: Duration) {
        recv::park(self, timeout);
        self.sleepers.leave();
    }
    fn cancel_park(&self) {
        self.sleepers.leave();
    }
}
