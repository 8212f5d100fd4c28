//! The atomics facade: std atomics normally, loom's under `--cfg loom`, so
//! the lock-free send ring is model-checked with the code that ships.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
