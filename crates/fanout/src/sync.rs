//! The atomics facade: std's atomics and a futex-backed wake word
//! normally, loom's under `--cfg loom`, so that the membership,
//! scatter/gather and wake-up protocols are model-checked with the code
//! that ships (`tests/loom_fanout.rs`).

use std::time::Duration;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A 32-bit word a thread (of this or another process) sleeps on until
/// a waker bumps it: `FUTEX_WAIT`/`FUTEX_WAKE` without
/// `FUTEX_PRIVATE_FLAG`, so it works in a mapping shared by processes.
///
/// The protocol (no lost wake-up): a sleeper reads the word
/// ([`WakeWord::prepare`]) *before* it checks (and arms) what it waits
/// for, and sleeps with [`WakeWord::wait`] only while the word still
/// holds that value (the kernel compares and queues atomically with
/// respect to a wake); a waker first makes the change the sleeper waits
/// for visible, then [`WakeWord::wake`]: it increments the word, then
/// wakes. A wake that comes after the sleeper's read changes the word, so
/// the wait returns at once; one that comes after the wait began finds it
/// queued.
///
/// Under loom the kernel's part is a mutex and a condition variable with
/// the same semantics (compare under the lock, then sleep; wake under the
/// lock), so the models check the user-space half.
#[repr(C)]
pub struct WakeWord {
    word: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    sleepers: loom::sync::Condvar,
}

impl Default for WakeWord {
    fn default() -> WakeWord {
        WakeWord::new()
    }
}

impl WakeWord {
    pub fn new() -> WakeWord {
        WakeWord {
            word: AtomicU32::new(0),
            #[cfg(loom)]
            lock: loom::sync::Mutex::new(()),
            #[cfg(loom)]
            sleepers: loom::sync::Condvar::new(),
        }
    }

    /// The value to pass to [`WakeWord::wait`]: read it before checking
    /// the condition slept on.
    #[inline]
    pub fn prepare(&self) -> u32 {
        // Acquire: partner of the Release increment in `wake` (what the
        // waker published before it is visible once the bump is seen).
        self.word.load(Ordering::Acquire)
    }

    /// Sleep while the word holds `seen`, for at most `timeout` (under
    /// loom there is no time: until a wake). Returns on a wake, a
    /// timeout, a signal or a changed word alike: the caller re-checks.
    pub fn wait(&self, seen: u32, timeout: Duration) {
        #[cfg(loom)]
        {
            let _ = timeout;
            let guard = self.lock.lock().unwrap();
            // Acquire: partner of the Release increment in `wake`.
            if self.word.load(Ordering::Acquire) != seen {
                return;
            }
            drop(self.sleepers.wait(guard).unwrap());
        }
        #[cfg(not(loom))]
        {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: the word is a live, aligned 32-bit atomic for the
            // call (borrowed from `self`); FUTEX_WAIT only reads it and
            // the timespec, which lives on this stack frame. Every result
            // (woken, EAGAIN, ETIMEDOUT, EINTR) means "re-check".
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.word.as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                    std::ptr::null::<u32>(),
                    0u32,
                );
            }
        }
    }

    /// Bump the word, then wake whoever sleeps on it.
    pub fn wake(&self) {
        // Release: partner of the Acquire in `prepare`/`wait`.
        self.word.fetch_add(1, Ordering::Release);
        #[cfg(loom)]
        {
            let _guard = self.lock.lock().unwrap();
            self.sleepers.notify_all();
        }
        #[cfg(not(loom))]
        // SAFETY: as in `wait`; FUTEX_WAKE reads no memory but the
        // word's address (it may be unmapped elsewhere: harmless).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// One pass of a spin-wait (under loom: a yield, so the model explores
/// the other threads instead of spinning forever).
#[inline]
pub(crate) fn spin_pass() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Give the CPU away once (the phase between spinning and sleeping).
#[inline]
pub(crate) fn yield_pass() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}
