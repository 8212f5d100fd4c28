//! Doorbells: how a parked progress loop is woken when a peer publishes.
//!
//! An event count over two `u32`s, `seq` and `sleepers`, that may live in
//! shared memory (a process-shared futex):
//!
//! ```text
//!  waiter                               ringer
//!  sleepers += 1        (SeqCst RMW)    store data (Release)
//!  t = seq              (SeqCst)        fence(SeqCst)
//!  re-check for work  ──┐               if sleepers > 0 {
//!  futex_wait(seq, t) <─┘ lost wake-up      seq += 1; futex_wake(seq)
//!  sleepers -= 1          impossible:   }
//!                         Dekker pair
//! ```
//!
//! Waits always carry a timeout, so even a peer that never rings (it
//! crashed) costs at most one timeout of latency, never a hang.

use std::sync::atomic::{fence, AtomicU32, Ordering};
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
        // Partner: the SeqCst `sleepers` increment in prepare_park. The
        // fence orders the caller's earlier Release stores (the data)
        // before the load of `sleepers` (store→load needs SeqCst).
        fence(Ordering::SeqCst);
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            self.seq().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.seq());
        }
    }

    fn prepare_park(&self) -> u32 {
        self.sleepers().fetch_add(1, Ordering::SeqCst);
        self.seq().load(Ordering::SeqCst)
    }

    fn park(&self, ticket: u32, timeout: Duration) {
        futex_wait(self.seq(), ticket, timeout);
        self.sleepers().fetch_sub(1, Ordering::SeqCst);
    }

    fn cancel_park(&self) {
        self.sleepers().fetch_sub(1, Ordering::SeqCst);
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
