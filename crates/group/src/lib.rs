//! # spindle-group — totally-ordered atomic multicast with Spindle speed
//!
//! Derecho's small-message multicast (SMC) over the shared state table:
//! each sender has a ring of slots in its row and one guard counter; the
//! total order is round-robin across senders (`seq = index × senders +
//! rank`); a message is *stable* when every member's in-order receive
//! frontier has passed it; stable messages are delivered in order. The
//! Spindle techniques are each visible in [`core`] and counted in
//! [`counters`]: sender batching, receiver batching, delivery batching,
//! coalesced nulls only when they unblock the order, and no lock held
//! across a push.
//!
//! Membership changes follow Derecho's view-change protocol
//! ([`membership`]): a member that fails, stalls or is cut off is
//! suspected and removed, members may leave and new ones join (with a
//! snapshot of the application's state), and a minority partition stops
//! rather than split the group. With `GroupConfig::membership` off, the
//! group is static and a member that dies stops the others with
//! [`GroupError::MemberGone`].
//!
//! ```no_run
//! use spindle_group::{DeliveryMode, Group, GroupConfig, SenderSet};
//! let mut config = GroupConfig::new("quickstart", 2);
//! config.senders = SenderSet::All;
//! config.mode = DeliveryMode::Ordered;
//! let rank = 0; // the other process joins as rank 1
//! let mut group = Group::join_shm(config, rank).unwrap();
//! let sender = group.sender().unwrap();
//! let mut slot = sender.reserve(5).unwrap();
//! slot.payload_mut().copy_from_slice(b"hello");
//! slot.commit();
//! group.poll(&mut |d: &spindle_group::Delivery<'_>| println!("seq {} from {}: {:?}", d.seq, d.sender_rank, d.payload)).unwrap();
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod core;
pub mod counters;
pub mod delivery_log;
pub mod error;
pub mod group;
pub mod invariants;
pub mod large;
pub mod layout;
pub mod membership;
pub mod persist;
pub mod query;
pub mod restart;
pub mod send_ring;
pub mod sender;
pub mod state_machine;
pub mod subgroup;
mod sync;

pub use crate::config::{DeliveryMode, GroupConfig, SenderSet};
pub use crate::core::{Delivery, GroupCore, Positions};
pub use crate::error::{GroupError, SendError};
pub use crate::group::{Group, GroupAgent, GroupThread};
pub use crate::large::FragmentDelivery;
pub use crate::membership::{Upcalls, View};
pub use crate::query::{QueryChannel, QueryError, QueryLayout, QueryTarget};
pub use crate::sender::{LargeSend, SendBatch, SendSlot, Sender};
pub use crate::state_machine::{Replicated, StateMachine};
