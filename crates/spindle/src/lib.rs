//! # Spindle — fast, safe replication of small objects
//!
//! A group of members (processes on one host, or on many) multicasts
//! messages that every member delivers in **one total order**, with
//! **virtual synchrony** when members fail, leave or join: Derecho's
//! semantics, made fast with the Spindle techniques (sender, receiver and
//! delivery batching, counter-only polling, coalesced nulls, no lock held
//! across a push). This crate is the one a program depends on; the
//! workspace's other crates are its layers.
//!
//! ```no_run
//! use spindle::{Delivery, Group};
//!
//! // Run this with rank 0, 1 and 2 (three processes, or three threads).
//! let rank = 0;
//! let mut group = Group::builder("hello")
//!     .members(3)
//!     .rank(rank)
//!     .on_deliver(|d: &Delivery<'_>| println!("seq {} from {}: {:?}", d.seq, d.sender_rank, d.payload))
//!     .join()?; // waits for the other members
//! group.send(b"hello")?;
//! loop {
//!     group.poll_or_idle()?;
//! }
//! # Ok::<(), spindle::Error>(())
//! ```
//!
//! ## Concepts
//!
//! - **Group, member, rank.** A group has a name and a fixed number of
//!   ranks (`0..members`, at most 64). Each member is one rank.
//! - **View.** The members currently in the group, with an epoch id. Every
//!   delivery happens in a view; a member that fails is removed by a view
//!   change, and ranks outside the view may join (getting a snapshot of the
//!   application's state).
//! - **Senders and slots.** Each sending member has a ring of
//!   `window_slots` slots of `slot_payload_max` bytes in its row: a send
//!   writes a slot in place (zero copy with [`Sender::reserve`]) and never
//!   waits; a full window is [`SendError::WouldBlock`].
//! - **Delivery.** The progress loop ([`Group::poll`]) pushes, receives and
//!   delivers. In [`DeliveryMode::Ordered`] (the default) a message is
//!   delivered once every member has received it (it is *stable*), in the
//!   same order everywhere: round-robin across senders, `seq = index ×
//!   senders + sender index`. [`DeliveryMode::Unordered`] delivers on
//!   receipt, FIFO per sender.
//! - **Upcalls.** The application receives deliveries and view changes:
//!   closures ([`GroupBuilder::on_deliver`], [`GroupBuilder::on_view_change`]),
//!   a replicated [`StateMachine`] ([`GroupBuilder::state_machine`]), or any
//!   [`Upcalls`].
//!
//! ## The transports
//!
//! - [`Transport::Shm`] (the default): every member on this host maps one
//!   file under `/dev/shm`. A push is a memory fence; zero copies.
//! - [`Transport::Tcp`]: members on any hosts, authenticated by a shared
//!   group key (and optionally TLS). Each member keeps a copy of every
//!   peer's row; a push sends the bytes that changed. A group file
//!   ([`GroupFile`]) names the members' addresses and the key file.
//! - `Ofi` (libfabric RDMA) is planned; the builder will take it the same way.
//!
//! ## Driving a member
//!
//! [`GroupBuilder::join`] returns a member in *invoker* mode: the
//! application calls [`Group::poll`] (one bounded pass; never blocks) or
//! [`Group::poll_or_idle`] (then, if nothing happened, spins, yields and
//! parks on the doorbell: blocks at most the idle strategy's park time,
//! 1 ms by default). [`Group::spawn`] runs it on a progress thread instead.
//! Upcalls run on the polling thread; they may send (a full window returns
//! `WouldBlock`, it never waits on the thread running the upcall).
//!
//! ## What happens on a failure
//!
//! With membership on (the default), a member that crashes, stalls for
//! `suspect_timeout` (500 ms by default) or is cut off is suspected; the
//! survivors agree on a new view without it, deliver exactly the messages
//! every survivor can deliver from the old view (the *ragged edge*: none
//! is lost, none duplicated, all in the same order), and go on. A view
//! needs a majority of the previous one: a minority partition stops with
//! [`GroupError::MinorityPartition`] rather than split the group. With
//! membership off (a static group) a failed member stops the others with
//! [`GroupError::MemberGone`]. [`Group::leave`] leaves cleanly: the others
//! install a view without this member at once.
//!
//! ## Observing a node
//!
//! Positions and counters live in shared memory; [`stat::collect`] reads
//! them (what `spindle stat` shows) without the members' cooperation.
//!
//! ## Beyond the group
//!
//! [`kv::KvService`] runs the replicated key-value store (one-sided
//! primary-backup replication, RAMCloud's design) in this process, serving
//! RESP so any Redis client can use it. The layers built on the group are
//! re-exported: [`replica`] (the store's layer) and [`rt`] (time-driven
//! real-time channels with a global clock).
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod builder;
pub mod config;
pub mod dds;
pub mod error;
pub mod group;
pub mod kv;
mod relayout;
pub mod sharded;
pub mod stat;
pub mod transport;

pub use crate::builder::GroupBuilder;
pub use crate::config::{ConfigError, GroupFile};
pub use crate::error::Error;
pub use crate::group::{Callbacks, Group, RunningGroup};
pub use crate::sharded::{Shard, Sharded};
pub use crate::transport::{AnyFabric, OfiTransport, TcpTransport, Transport};
pub use spindle_group::subgroup::{Layout, LayoutFunction, StickyLayout, SubgroupSpec};

/// Persistent mode's on-disk log: its layout, and reading a log back.
pub use spindle_group::persist;
pub use spindle_group::{
    Delivery, DeliveryMode, FragmentDelivery, GroupError, LargeSend, QueryError, Replicated, SendBatch, SendError,
    SendSlot, SenderSet, StateMachine, Upcalls, View,
};
pub use spindle_runtime::IdleStrategy;

/// A sending handle of a member (clone it into other threads).
pub type Sender = spindle_group::Sender<AnyFabric>;

/// The fabric layer: registered rows and one-sided pushes (shm, tcp, sim).
pub use spindle_fabric as fabric;
/// Acknowledged multicast over a static tree among the threads of a host.
pub use spindle_fanout as fanout;
/// The group layer underneath [`Group`]: views, membership, atomic multicast.
pub use spindle_group as group_layer;
/// One-sided primary-backup object replication and the RESP key-value service.
pub use spindle_replica as replica;
/// Time-driven real-time channels (MPI/RT) with a global clock.
pub use spindle_rt as rt;
/// The runtime: OS clock, progress threads, agents and idle strategies.
pub use spindle_runtime as runtime;
