//! # spindle-runtime — threads, the OS clock and idle strategies
//!
//! The protocol crates (`spindle-group`, `spindle-replica`, `spindle-rt`)
//! are *driven*: a pass takes `now_ns` as an argument and returns how much
//! work it did; it never spawns a thread, sleeps or reads the OS clock, so
//! the simulator can run them with simulated time. This crate is the only
//! layer besides the CLI and the benchmarks that owns those things:
//!
//! - [`clock`]: the OS clock ([`monotonic_ns`] for timestamps and
//!   latency, [`monotonic_coarse_ns`] for timeouts and intervals);
//! - [`agent`]: an [`Agent`] is a driven unit of protocol work
//!   (`do_work(now_ns) -> work`), and an [`AgentRunner`] runs agents in
//!   one of three [`ThreadingMode`]s:
//!   - **dedicated**: one progress thread per agent (lowest latency, a
//!     core per agent);
//!   - **shared**: one progress thread runs every agent in turn;
//!   - **invoker**: no thread; the caller calls `do_work` itself (tests,
//!     the simulator, single-threaded programs, benchmarks on few cores);
//! - [`alloc_count`]: a counting global allocator for the tests that
//!   check a path allocates nothing;
//! - [`idle`]: what a progress loop does after a pass that found no work.
//!   [`IdleStrategy::Backoff`] spins (the cheapest wake-up), then yields
//!   (so members sharing the cores run), then parks on the fabric's
//!   doorbell with a timeout (so 8 processes on 2 cores still progress and
//!   an idle group burns no CPU); any work resets it to spinning.
//!   [`IdleStrategy::BusySpin`] never gives the core up.
//!
//! ```
//! use spindle_fabric::doorbell::FutexDoorbell;
//! use spindle_runtime::{monotonic_ns, IdleStrategy, Idler};
//!
//! // An invoker-mode loop: the caller reads the clock, runs a pass, idles.
//! let bell = FutexDoorbell::new_local();
//! let mut idler = Idler::new(IdleStrategy::DEFAULT_BACKOFF);
//! let start_ns = monotonic_ns();
//! for pass in 0..10u32 {
//!     let work = pass % 2; // what a protocol's `do_work(now_ns)` returned
//!     idler.idle(work, &bell, || false);
//! }
//! assert!(monotonic_ns() >= start_ns);
//! assert_eq!(idler.parks, 0, "ten passes stay in the spin phase");
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod agent;
pub mod alloc_count;
pub mod clock;
pub mod idle;

pub use agent::{Agent, AgentRunner, ThreadingMode};
pub use clock::{monotonic_coarse_ns, monotonic_ns, pace_until, realtime_ns};
pub use idle::{IdleStrategy, Idler};
