//! # spindle-sst — the row layout of the shared state table
//!
//! The shared state table has one row per member over a
//! [`spindle_fabric::Fabric`]; each row is written only by its owner and
//! pushed to the others. This crate is the row's *layout*: a layer above
//! declares its columns in order with a [`LayoutBuilder`] (`u64` counters,
//! vectors of counters, byte areas, cache-line breaks) and gets back typed
//! column handles ([`U64Column`], [`U64VectorColumn`], [`BytesColumn`])
//! holding byte offsets, plus a [`RowLayout`] with the row length, a
//! fingerprint (`tag`) that members with different shapes refuse to share,
//! and an ASCII diagram for the docs and `spindle stat`.
//!
//! `spindle-group` (the SMC row), `spindle-rt` (the rt row) and
//! `spindle-replica` (control columns plus a log area per member) build
//! their rows this way, then read and write cells at those offsets
//! through the fabric's rows (`RowRef::u64_at`, `RowRef::bytes`)
//! themselves. Nothing here runs: progress loops, threads, the OS clock
//! and idle strategies belong to `spindle-runtime`.
//!
//! ```
//! use spindle_sst::LayoutBuilder;
//! let mut b = LayoutBuilder::new("example");
//! let heartbeat = b.u64("heartbeat");
//! let received = b.u64_vector("received_num", 4);
//! let layout = b.build();
//! assert_eq!(layout.row_len_bytes() % 64, 0);
//! assert!(received.offset(0) > heartbeat.offset());
//! println!("{}", layout.diagram());
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod layout;

pub use layout::{BytesColumn, LayoutBuilder, RowLayout, U64Column, U64VectorColumn};
