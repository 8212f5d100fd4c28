//! The atomics facade: std's atomics, mutex and thread parking normally,
//! loom's under `--cfg loom`, so that the membership, scatter/gather and
//! wake-up protocols are model-checked with the code that ships
//! (`tests/loom_fanout.rs`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(loom)]
pub(crate) use loom::thread::{current, Thread};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::thread::{current, Thread};

/// Park the calling thread for at most `timeout`. Under loom there is no
/// time: a park lasts until an unpark, so a lost wake-up is a deadlock
/// that loom reports.
#[inline]
pub(crate) fn park_bounded(timeout: std::time::Duration) {
    #[cfg(loom)]
    {
        let _ = timeout;
        loom::thread::park();
    }
    #[cfg(not(loom))]
    std::thread::park_timeout(timeout);
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
