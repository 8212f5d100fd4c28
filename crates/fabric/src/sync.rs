//! The atomics facade: std's atomics normally, loom's under `--cfg loom`,
//! so that the lock-free protocols (doorbell, tcp sleepers, and the rt and
//! replica crates' protocols that re-use this facade) are model-checked
//! with the code that ships (`tests/loom_*.rs`).
//!
//! Memory shared with other processes or written by a fabric's receive
//! path (rows, the shm header) is always std atomics over raw memory:
//! loom's atomics carry model state and cannot alias it. Protocols that
//! run over such memory are written generically over [`AtomicWord`] /
//! [`AtomicCount`], implemented for both std's and (under loom) loom's
//! atomics: production passes row cells, the loom models pass loom cells.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A 64-bit atomic cell (a guard, a sequence counter, a slot word).
pub trait AtomicWord: Sync {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
}

/// A 32-bit atomic counter (a doorbell's `seq` and `sleepers`).
pub trait AtomicCount: Sync {
    fn load(&self, order: Ordering) -> u32;
    fn fetch_add(&self, value: u32, order: Ordering) -> u32;
    fn fetch_sub(&self, value: u32, order: Ordering) -> u32;
}

macro_rules! impl_cells {
    ($word:ty, $count:ty) => {
        impl AtomicWord for $word {
            #[inline(always)]
            fn load(&self, order: Ordering) -> u64 {
                <$word>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: u64, order: Ordering) {
                <$word>::store(self, value, order)
            }
        }
        impl AtomicCount for $count {
            #[inline(always)]
            fn load(&self, order: Ordering) -> u32 {
                <$count>::load(self, order)
            }
            #[inline(always)]
            fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
                <$count>::fetch_add(self, value, order)
            }
            #[inline(always)]
            fn fetch_sub(&self, value: u32, order: Ordering) -> u32 {
                <$count>::fetch_sub(self, value, order)
            }
        }
    };
}

impl_cells!(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU32);
#[cfg(loom)]
impl_cells!(loom::sync::atomic::AtomicU64, loom::sync::atomic::AtomicU32);
