//! The atomics facade: std's atomics normally, loom's under `--cfg loom`
//! (spindle-fabric's facade, re-exported), so that the watchdog's claims
//! and the channel seqlock are model-checked with the code that ships
//! (`tests/loom_*.rs`).

pub use spindle_fabric::sync::{fence, AtomicBool, AtomicU64, AtomicWord, Ordering};
