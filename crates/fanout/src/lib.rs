//! # spindle-fanout — acknowledged multicast over a static tree
//!
//! Members (threads of one process, or processes attached to one
//! shared-memory file: [`Domain::create_shm`], [`Domain::open_shm`],
//! module [`shm`]) occupy slots of a static tree built
//! from the machine's CPU topology ([`Shape::Cpu`]; flat and k-ary shapes
//! too). Membership is one bit-mask word: [`Port::join`] and
//! [`Port::leave`] are one atomic operation each, safe while a multicast
//! is in flight. [`Port::multicast`] reaches exactly the members present
//! when it claims its sequence number (less the origin) and returns a
//! [`Completion`] when all of them acknowledged, or, after a bounded wait,
//! [`FanoutError::AckTimeout`] naming the slots that did not.
//!
//! Four [`Layout`]s: `flat` (Linux's `smp_call_function_many`: one
//! mailbox and one acknowledgement flag per target), `tree` (a broadcast
//! down the tree: non-members are interrupted to forward), `tree_help`
//! (members forward on behalf of non-member scatter nodes) and
//! `tree_help_skip` (subtrees without a member are jumped over, by a range
//! test on the mask). Acknowledgements combine up the tree in one counter
//! per gather node, each on its own cache line. Waiting spins, yields,
//! then sleeps on its slot's futex word ([`WakeWord`], shared between
//! processes); a sleeping port is woken by whoever writes what it waits
//! for.
//!
//! The protocol steps ([`State`]) are atomics only, over one `#[repr(C)]`
//! [`state::Region`] (on the heap, or mapped); the runtime
//! ([`Domain`], [`Port`]) owns waiting, parking and time. [`model`] is a
//! discrete-event model of the same protocol on a many-core, with costs
//! calibrated on a real machine.
//!
//! ```
//! use std::time::Duration;
//! use spindle_fanout::{Domain, Layout, Shape, Tree, WaitConfig};
//!
//! let domain = Domain::new(Tree::build(Shape::Kary(2), 2).unwrap(), Layout::TreeHelpSkip, WaitConfig::default()).unwrap();
//! let member = {
//!     let domain = domain.clone();
//!     std::thread::spawn(move || {
//!         let mut port = domain.attach(1, |d| assert_eq!(d.payload, 42)).unwrap();
//!         port.join().unwrap();
//!         while port.serve(Duration::from_secs(5)) == 0 {}
//!         port.leave(Duration::from_secs(1)).unwrap();
//!     })
//! };
//! let mut origin = domain.attach(0, |_| {}).unwrap();
//! origin.join().unwrap();
//! while domain.state().members() != 0b11 { std::thread::yield_now(); }
//! let done = origin.multicast(42, Duration::from_secs(5)).unwrap();
//! assert_eq!(done.targets, 0b10);
//! member.join().unwrap();
//! ```

mod error;
pub mod model;
pub mod plan;
mod runtime;
#[cfg(not(loom))]
pub mod shm;
pub mod state;
mod sync;
pub mod topology;

pub use error::FanoutError;
pub use plan::Layout;
pub use runtime::{Completion, Delivery, Domain, Port, WaitConfig};
pub use state::State;
pub use sync::WakeWord;
pub use topology::{Shape, SlotSet, Tree, SLOTS_MAX, SLOTS_MAX_LIVE};
