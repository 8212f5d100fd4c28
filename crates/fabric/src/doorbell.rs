//! Doorbells: how a parked progress loop is woken when a peer publishes.
//!
//! An event count over two `u32`s, `seq` and `sleepers`, that may live in
//! shared memory (a process-shared futex):
//!
//! ```text
//!  waiter                               ringer
//!  sleepers += 1        (SeqCst RMW)    store data (Release)
//!  fence(SeqCst)                        fence(SeqCst)
//!  t = seq              (SeqCst)        if sleepers > 0 {
//!  re-check for work  ──┐                   seq += 1; futex_wake(seq)
//!  futex_wait(seq, t) <─┘ lost wake-up  }
//!  sleepers -= 1          impossible:
//!                         Dekker pair
//! ```
//!
//! Both sides fence: the two SeqCst fences are ordered one way or the
//! other, so either the waiter's re-check sees the data or the ringer's
//! load sees the waiter (a SeqCst RMW alone does not order the waiter's
//! later plain-Acquire re-check in the language's memory model). The
//! protocol is [`event_count`], generic over the cells so that
//! `tests/loom_doorbell.rs` checks it with loom's atomics and a futex
//! modelled by a mutex and a condition variable.
//!
//! Waits always carry a timeout, so even a peer that never rings (it
//! crashed) costs at most one timeout of latency, never a hang.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Wake-ups for parked progress loops.
pub trait Doorbell: Send + Sync {
    /// Wake every parked waiter; one load when nobody is parked.
    fn ring(&self);
    /// Announce the intent to park and return a ticket; the caller must
    /// re-check for work, then call [`Doorbell::park`] or
    /// [`Doorbell::cancel_park`].
    fn prepare_park(&self) -> u32;
    /// Sleep until rung after `ticket` was taken, or `timeout` passes.
    fn park(&self, ticket: u32, timeout: Duration);
    /// Withdraw a [`Doorbell::prepare_park`] without sleeping.
    fn cancel_park(&self);
}

/// The event-count protocol over a `seq` and a `sleepers` cell; the
/// futex calls are the caller's (see the module docs for the diagram).
pub mod event_count {
    use crate::sync::{fence, AtomicCount, Ordering};

    /// The ringer's side, after it stored its data: whether a waiter may
    /// be parked (then `seq` has moved and the caller wakes the futex).
    #[inline]
    pub fn ring<C: AtomicCount>(seq: &C, sleepers: &C) -> bool {
        // SeqCst: pairs with the SeqCst fence in `prepare_park` (Dekker):
        // orders the caller's earlier data stores before the load of
        // `sleepers` (store→load needs SeqCst).
        fence(Ordering::SeqCst);
        // SeqCst: pairs with the SeqCst increment in `prepare_park`.
        if sleepers.load(Ordering::SeqCst) == 0 {
            return false;
        }
        // Release (SeqCst): pairs with the waiter's load of `seq` (the
        // ticket, or the futex's check of it): a waiter that sees the new
        // `seq` sees the data stored before this ring.
        seq.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// The waiter's side: announce the intent to park, return the ticket.
    /// The caller then re-checks for work and parks or cancels.
    #[inline]
    pub fn prepare_park<C: AtomicCount>(seq: &C, sleepers: &C) -> u32 {
        // SeqCst: pairs with the SeqCst load of `sleepers` in `ring`.
        sleepers.fetch_add(1, Ordering::SeqCst);
        // SeqCst: pairs with the SeqCst fence in `ring` (Dekker): orders
        // the increment before the caller's re-check for work.
        fence(Ordering::SeqCst);
        // Acquire (SeqCst): pairs with the `seq` increment in `ring`.
        seq.load(Ordering::SeqCst)
    }

    /// The waiter's side, after parking or instead of it.
    #[inline]
    pub fn end_park<C: AtomicCount>(sleepers: &C) {
        // SeqCst: the count is read (SeqCst) by `ring`; nothing is published.
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A futex event count over two `u32`s that the owner keeps alive.
pub struct FutexDoorbell {
    seq: *const AtomicU32,
    sleepers: *const AtomicU32,
    _owned: Option<Box<[AtomicU32; 2]>>,
}

// SAFETY: the pointers refer to atomics (Sync) that outlive the doorbell
// (constructor contract of `in_shared_memory`, or the owned box).
unsafe impl Send for FutexDoorbell {}
// SAFETY: as for Send; all access is atomic.
unsafe impl Sync for FutexDoorbell {}

impl FutexDoorbell {
    /// A doorbell for threads of one process.
    pub fn new_local() -> FutexDoorbell {
        let owned = Box::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let seq = &owned[0] as *const AtomicU32;
        let sleepers = &owned[1] as *const AtomicU32;
        FutexDoorbell {
            seq,
            sleepers,
            _owned: Some(owned),
        }
    }

    /// A doorbell over two atomics in shared memory.
    ///
    /// # Safety
    /// Both pointers must be valid, 4-aligned and outlive the doorbell.
    pub unsafe fn in_shared_memory(seq: *const AtomicU32, sleepers: *const AtomicU32) -> FutexDoorbell {
        FutexDoorbell {
            seq,
            sleepers,
            _owned: None,
        }
    }

    fn seq(&self) -> &AtomicU32 {
        // SAFETY: valid for the doorbell's life (constructor contracts).
        unsafe { &*self.seq }
    }

    fn sleepers(&self) -> &AtomicU32 {
        // SAFETY: valid for the doorbell's life (constructor contracts).
        unsafe { &*self.sleepers }
    }
}

impl Doorbell for FutexDoorbell {
    fn ring(&self) {
        if event_count::ring(self.seq(), self.sleepers()) {
            futex_wake(self.seq());
        }
    }

    fn prepare_park(&self) -> u32 {
        event_count::prepare_park(self.seq(), self.sleepers())
    }

    fn park(&self, ticket: u32, timeout: Duration) {
        futex_wait(self.seq(), ticket, timeout);
        event_count::end_park(self.sleepers());
    }

    fn cancel_park(&self) {
        event_count::end_park(self.sleepers());
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the call; FUTEX_WAIT (not
    // PRIVATE) works for memory shared between processes; the timespec
    // lives across the call. Spurious returns are fine: callers re-check.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn ring_wakes_a_parked_waiter() {
        let bell = Arc::new(FutexDoorbell::new_local());
        let waiter = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                let ticket = bell.prepare_park();
                bell.park(ticket, Duration::from_secs(30));
                Instant::now()
            })
        };
        // Ring until the waiter has gone (it may not have parked yet).
        while !waiter.is_finished() {
            bell.ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        waiter.join().unwrap();
        assert_eq!(bell.sleepers().load(Ordering::SeqCst), 0, "sleepers must balance");
    }

    #[test]
    fn ring_between_prepare_and_park_is_not_lost() {
        let bell = FutexDoorbell::new_local();
        let ticket = bell.prepare_park();
        bell.ring();
        // seq moved past the ticket, so park returns at once (no 30 s wait).
        assert_ne!(bell.seq().load(Ordering::SeqCst), ticket);
        bell.park(ticket, Duration::from_secs(30));
        assert_eq!(bell.sleepers().load(Ordering::SeqCst), 0);
    }
}
