//! The atomics facade: std's atomics and a futex-backed wake word
//! normally, loom's under `--cfg loom`, so that the membership,
//! scatter/gather and wake-up protocols are model-checked with the code
//! that ships (`tests/loom_fanout.rs`).

use std::time::Duration;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

/// How a writer and a sleeper agree that a wake-up cannot be lost: the
/// writer publishes a word and then reads the sleeping flag of whoever
/// may wait on it; the sleeper sets its flag and then reads the word
/// (store buffering: each side needs a full barrier between its store
/// and its load, or both may miss the other).
///
/// With [`Fences::Membarrier`] the writer's barrier, on every multicast's
/// critical path, is a compiler fence only, and the sleeper, which is
/// about to sleep anyway, pays for both sides with `membarrier(2)`: a
/// full barrier runs on every CPU running a thread of this process
/// (threads) or of any process registered with it (processes), so every
/// writer's store and load are ordered as if it had fenced itself (the
/// asymmetric pair of liburcu and folly). Before this, each writer took
/// the word by a locked swap, which costs two to three cache-line round
/// trips on a line another core polls (bench/RESULTS-fanout.md).
///
/// [`Fences::Symmetric`]: a full fence on both sides, where
/// `membarrier(2)` is not available (a seccomp filter, an old kernel).
/// Under loom both are `fence(SeqCst)` on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fences {
    /// Light writers, heavy sleepers. `global`: the domain's members are
    /// processes (`MEMBARRIER_CMD_GLOBAL_EXPEDITED`, every one of them
    /// registered); else threads of this process (`PRIVATE_EXPEDITED`).
    Membarrier { global: bool },
    /// A full fence on both sides.
    Symmetric,
}

/// `membarrier(2)` commands (linux/membarrier.h).
#[cfg(not(loom))]
mod membarrier_cmd {
    pub const GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
    pub const REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;
    pub const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    pub const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;
}

#[cfg(not(loom))]
fn membarrier(cmd: libc::c_int) -> Result<(), std::io::Error> {
    // SAFETY: membarrier(cmd, flags = 0, cpu_id = 0) reads and writes no
    // user memory; an unknown or refused command fails with an errno.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint, 0 as libc::c_int) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Fences {
    /// The fences of a domain of threads: membarrier if this process can
    /// register for it, else symmetric.
    pub fn for_threads() -> Fences {
        #[cfg(loom)]
        return Fences::Membarrier { global: false };
        #[cfg(not(loom))]
        match membarrier(membarrier_cmd::REGISTER_PRIVATE_EXPEDITED) {
            Ok(()) => Fences::Membarrier { global: false },
            Err(_) => Fences::Symmetric,
        }
    }

    /// The fences of a domain of processes: registers this process for
    /// global expedited barriers (every process of the domain must be:
    /// a barrier reaches registered processes only).
    #[cfg(not(loom))]
    pub fn for_processes() -> Result<Fences, std::io::Error> {
        membarrier(membarrier_cmd::REGISTER_GLOBAL_EXPEDITED).map(|()| Fences::Membarrier { global: true })
    }

    /// The writer's side: between publishing a word and reading whether
    /// its reader sleeps.
    #[inline]
    pub(crate) fn light(self) {
        match self {
            #[cfg(not(loom))]
            Fences::Membarrier { .. } => std::sync::atomic::compiler_fence(Ordering::SeqCst),
            _ => fence(Ordering::SeqCst),
        }
    }

    /// The sleeper's side: between setting its sleeping flag and reading
    /// the words it waits on. False: the barrier failed (it must not
    /// sleep; it yields instead).
    #[must_use]
    pub(crate) fn heavy(self) -> bool {
        match self {
            #[cfg(not(loom))]
            Fences::Membarrier { global } => membarrier(if global {
                membarrier_cmd::GLOBAL_EXPEDITED
            } else {
                membarrier_cmd::PRIVATE_EXPEDITED
            })
            .is_ok(),
            _ => {
                fence(Ordering::SeqCst);
                true
            }
        }
    }
}

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
