//! # spindle-rt — time-driven real-time channels (MPI/RT)
//!
//! Channels with a time QoS (release offset, period, deadline) whose
//! buffers the middleware moves at their release times: *zero-sided*
//! communication, the application never calls send or receive per
//! message. A collective `commit` runs admission control on every node
//! and returns a common `epoch_start` in the future, and a global clock
//! gives every node `now() → [earliest, latest]`.
//!
//! Sans-IO cores (pure, deterministic, densely tested):
//! - [`qos`]: time QoS, tasks, schedules;
//! - [`admission`]: per-node EDF demand test with shortened deadlines;
//! - [`dispatch`]: which job runs next, early deadline-miss detection;
//! - [`watchdog`]: the job claims that let a second thread report, at its
//!   critical start time, a job a stalled dispatcher has not started;
//! - [`seqlock`]: the channel slot's seqlock: a receive task that a
//!   lapping sender overtakes never hands the application a torn copy;
//! - [`clock`]: clock-sync estimator (min-RTT filter, offset and drift,
//!   error bound) and injectable clocks;
//! - [`buffers`]: registered buffers with FIFO, LIFO and sorted iterators.
//!
//! ```
//! use spindle_rt::{admit_node, Margins, TaskKind, TaskSpec, TimeQos};
//! // Table 5.1, node A (µs → ns): user, channel send, channel receive.
//! let task = |name, start_us: u64, kind| {
//!     TaskSpec::new(name, kind, TimeQos::new(start_us * 1_000, 5_000_000, 75_000), 50_000)
//! };
//! let node_a = [
//!     task("A user", 0, TaskKind::Computation),
//!     task("A send", 75, TaskKind::ChannelSend),
//!     task("A recv", 525, TaskKind::ChannelReceive),
//! ];
//! assert!(admit_node(&node_a, Margins::default()).is_ok());
//! // 30 µs of clock bound + release jitter leave 45 µs for a 50 µs task:
//! let margins = Margins { clock_error_bound_ns: 10_000, release_jitter_ns: 20_000, interference_ns: 0, interference_headroom_pct: 100 };
//! let rejection = admit_node(&node_a, margins).unwrap_err();
//! assert_eq!(rejection.task, "A user");
//! println!("{rejection}");
//! ```
//!
//! Thin runtime: [`os`] (SCHED_FIFO, timer slack, hybrid sleep-then-spin),
//! [`spin`] (the self-tuning spin window of that release),
//! [`clock_service`] (exchanges over a fabric), [`node`] (channels over
//! any [`spindle_fabric::Fabric`], shm or tcp: the two-phase collective
//! commit, the dispatcher and its watchdog, uncommit, best-effort
//! channels). The measurements of `spindle rt` (the thesis's scenarios)
//! live in the `spindle-bench` crate.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod admission;
pub mod buffers;
pub mod clock;
pub mod clock_service;
pub mod dispatch;
pub mod interference;
pub mod layout;
pub mod node;
pub mod os;
pub mod qos;
pub mod seqlock;
pub mod spin;
pub mod sync;
pub mod watchdog;

pub use admission::{admit_node, Admitted, Margins, RejectReason, Rejection};
pub use buffers::{BufferPool, IteratorPolicy};
pub use clock::{ClockEstimator, InjectedClock, Interval};
pub use dispatch::{DispatchCore, Poll};
pub use interference::{AdmissionMode, InterferenceReport};
pub use qos::{TaskKind, TaskSpec, TimeQos};
