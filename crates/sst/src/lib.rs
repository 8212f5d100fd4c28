//! # spindle-sst — the shared state table
//!
//! A table with one row per member over a [`spindle_fabric::Fabric`]: each
//! row is written only by its owner and pushed to the others. A layer
//! above declares its columns with a [`layout::LayoutBuilder`] (counters,
//! vectors of counters, byte areas), gets typed column handles, and reads
//! any member's cell or writes its own.
//!
//! Progress is driven: a [`predicates::Predicates`] engine evaluates
//! registered predicates and runs their triggers (nothing here holds a lock
//! while a trigger runs), an [`idle::Idler`] decides what to do when no
//! trigger fired (spin → yield → park on the fabric's doorbell), and a
//! [`runtime`] runs [`runtime::Agent`]s in one of three threading modes:
//! dedicated, shared or invoker.
//!
//! ```
//! use spindle_sst::layout::LayoutBuilder;
//! let mut b = LayoutBuilder::new("example");
//! let heartbeat = b.u64("heartbeat");
//! let received = b.u64_vector("received_num", 4);
//! let layout = b.build();
//! assert_eq!(layout.row_len_bytes() % 64, 0);
//! assert!(received.offset(0) > heartbeat.offset());
//! println!("{}", layout.diagram());
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod idle;
pub mod layout;
pub mod predicates;
pub mod runtime;
pub mod table;

pub use idle::{IdleStrategy, Idler};
pub use layout::{BytesColumn, LayoutBuilder, RowLayout, U64Column, U64VectorColumn};
pub use predicates::{PredicateKind, Predicates};
pub use runtime::{monotonic_coarse_ns, monotonic_ns, Agent, AgentRunner, ThreadingMode};
pub use table::Sst;
