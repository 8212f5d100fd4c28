//! [`GroupBuilder`]: one way in. Name the group, say how many members and
//! which one this is, pick a transport, and `join`.
//!
//! ```no_run
//! use spindle::{Delivery, Group};
//! let mut group = Group::builder("orders")
//!     .members(3)
//!     .rank(0)
//!     .on_deliver(|d: &Delivery<'_>| println!("{} from {}", d.seq, d.sender_rank))
//!     .join()?;
//! group.send(b"hello")?;
//! # Ok::<(), spindle::Error>(())
//! ```

use std::sync::Arc;
use std::time::Duration;

use spindle_group::subgroup::{LayoutFunction, SubgroupSpec};
use spindle_group::{DeliveryMode, GroupConfig, Replicated, SenderSet, StateMachine, Upcalls};
use spindle_runtime::IdleStrategy;

use crate::group::{Callbacks, Group};
use crate::transport::{self, Transport};
use crate::Error;

/// Builds one member of a group. Every setting has a safe default (the
/// values of `spindle_group::config::defaults`, the same as the group
/// file's and the docs'); `join` validates them all and names the first
/// bad one.
///
/// The type parameter is the application that receives the upcalls
/// (deliveries, view changes, snapshots): delivery and view-change
/// closures by default, a [`StateMachine`] after
/// [`GroupBuilder::state_machine`], or any [`Upcalls`] after
/// [`GroupBuilder::app`].
pub struct GroupBuilder<A = Callbacks> {
    pub(crate) config: GroupConfig,
    members_set: bool,
    pub(crate) rank: usize,
    pub(crate) transport: Transport,
    app: A,
    /// Subgroups to lay the members out into (`join_sharded`).
    pub(crate) subgroups: Vec<SubgroupSpec>,
    /// The layout function (default: `StickyLayout`).
    pub(crate) layout_function: Option<Box<dyn LayoutFunction>>,
    /// Open the point-to-point query channel (`join_sharded`).
    pub(crate) queries: bool,
    /// On tcp: the query channel's address of every member.
    pub(crate) query_addresses: Option<Vec<std::net::SocketAddr>>,
}

impl GroupBuilder<Callbacks> {
    /// A builder for group `name`: 3 members on shared memory, ordered
    /// delivery, every member sends, this member is rank 0.
    pub fn new(name: &str) -> GroupBuilder {
        let mut builder = GroupBuilder::from_config(GroupConfig::new(name, spindle_group::config::defaults::MEMBERS));
        builder.members_set = false;
        builder
    }

    /// A builder from a group layer configuration (every field taken as is).
    pub fn from_config(config: GroupConfig) -> GroupBuilder {
        GroupBuilder {
            config,
            members_set: true,
            rank: 0,
            transport: Transport::Shm,
            app: Callbacks::default(),
            subgroups: Vec::new(),
            layout_function: None,
            queries: false,
            query_addresses: None,
        }
    }

    /// Call `f` with every delivered message, in delivery order (the
    /// payload is valid during the call). Runs on the thread that polls.
    pub fn on_deliver(mut self, f: impl FnMut(&spindle_group::Delivery<'_>) + Send + 'static) -> GroupBuilder {
        self.app.deliver = Some(Box::new(f));
        self
    }

    /// Take each message larger than the slot fragment by fragment, in
    /// place, with `f` instead of whole with `on_deliver`: no reassembly
    /// buffer is written, so its bytes are read once, where the transport
    /// put them (see `docs/large-messages.md`). The fragments come in
    /// total order; the
    /// message is delivered with its last
    /// ([`crate::FragmentDelivery::is_last`]), and until then they are
    /// staged: [`GroupBuilder::on_large_message_cut`] says when to drop
    /// them (set it too: without it, a cut message's staged fragments are
    /// never dropped). Messages that fit in a slot still go to
    /// `on_deliver`.
    pub fn on_large_fragment(
        mut self,
        f: impl FnMut(&spindle_group::FragmentDelivery<'_>) + Send + 'static,
    ) -> GroupBuilder {
        self.app.large_fragment = Some(Box::new(f));
        self
    }

    /// Call `f(view, sender_rank, message_id, len_bytes)` when a large
    /// message is delivered nowhere (a view change cut it, or its sender
    /// dropped its [`crate::LargeSend`] half way): drop its staged
    /// fragments; a sender sends it again.
    pub fn on_large_message_cut(mut self, f: impl FnMut(u64, usize, u64, u64) + Send + 'static) -> GroupBuilder {
        self.app.large_cut = Some(Box::new(f));
        self
    }

    /// Call `f` with every view this member installs (the first view
    /// too): after the old view's last delivery, before the new view's
    /// first.
    pub fn on_view_change(mut self, f: impl FnMut(&spindle_group::View) + Send + 'static) -> GroupBuilder {
        self.app.view_change = Some(Box::new(f));
        self
    }

    /// Replicate `state`: every member applies the same messages in the
    /// same order, and a joiner starts from a snapshot. (Its
    /// `StateMachine::view_installed` sees the view changes.)
    pub fn state_machine<S: StateMachine>(self, state: S) -> GroupBuilder<Replicated<S>> {
        self.app(Replicated::new(state))
    }

    /// Any [`Upcalls`] as the application.
    pub fn app<U: Upcalls>(self, app: U) -> GroupBuilder<U> {
        GroupBuilder {
            config: self.config,
            members_set: self.members_set,
            rank: self.rank,
            transport: self.transport,
            app,
            subgroups: self.subgroups,
            layout_function: self.layout_function,
            queries: self.queries,
            query_addresses: self.query_addresses,
        }
    }
}

impl<A: Upcalls> GroupBuilder<A> {
    /// How many members the group has (ranks `0..n`; at most 64). With
    /// tcp, the default is the number of addresses.
    pub fn members(mut self, n: usize) -> Self {
        self.config.members = n;
        self.members_set = true;
        self
    }

    /// This member's rank, `0..members`.
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// How the members reach each other (default: shared memory).
    pub fn transport(mut self, transport: Transport) -> Self {
        let members = match &transport {
            Transport::Tcp(tcp) => Some(tcp.members.len()),
            Transport::Ofi(ofi) => Some(ofi.tcp.members.len()),
            Transport::Shm => None,
        };
        if let Some(members) = members.filter(|_| !self.members_set) {
            self.config.members = members;
        }
        self.transport = transport;
        self
    }

    /// Ordered (atomic multicast, the default), unordered, or persistent
    /// delivery (ordered, and delivered once every member has it in its
    /// on-disk log: set [`GroupBuilder::persist_dir`] too).
    pub fn mode(mut self, mode: DeliveryMode) -> Self {
        self.config.mode = mode;
        self
    }

    /// The largest message [`spindle_group::Sender::send_large`] (and
    /// [`crate::LargeSend`]) accepts: bigger than a slot, it goes as
    /// fragments (default 1 GiB).
    pub fn large_message_max_bytes(mut self, bytes: u64) -> Self {
        self.config.large_message_max_bytes = bytes;
        self
    }

    /// Where persistent mode keeps this member's log
    /// (`<dir>/<group>-member-<rank>.log`, created if missing).
    pub fn persist_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.config.persist_dir = Some(dir.into());
        self
    }

    /// Persistent mode: compact the log to the application's snapshot
    /// once this many bytes were appended since the last compaction (0,
    /// the default: never). The application must be a
    /// [`crate::StateMachine`] in [`crate::Replicated`] (or upcalls that
    /// take snapshots): a restart restores the snapshot, then replays the
    /// messages after it.
    pub fn compact_log_bytes(mut self, bytes: u64) -> Self {
        self.config.compact_log_bytes = bytes;
        self
    }

    /// Which members send (default: all).
    pub fn senders(mut self, senders: SenderSet) -> Self {
        self.config.senders = senders;
        self
    }

    /// Slots in each sender's ring: the send window (a power of two;
    /// default 1024).
    pub fn window_slots(mut self, slots: usize) -> Self {
        self.config.window_slots = slots;
        self
    }

    /// The largest message, bytes (default 10,240).
    pub fn slot_payload_max(mut self, bytes: usize) -> Self {
        self.config.slot_payload_max = bytes;
        self
    }

    /// What a progress loop does when a pass finds nothing: spin, back off
    /// (spin, yield, then park on the doorbell: the default), or park.
    pub fn idle(mut self, idle: IdleStrategy) -> Self {
        self.config.idle = idle;
        self
    }

    /// How long `join` waits for the other members (default 10 s).
    pub fn join_timeout(mut self, timeout: Duration) -> Self {
        self.config.join_timeout = timeout;
        self
    }

    /// A member whose heartbeat stalls this long is suspected and removed
    /// (default 500 ms). The tcp send stall follows it (a quarter of it).
    pub fn suspect_timeout(mut self, timeout: Duration) -> Self {
        self.config.suspect_timeout = timeout;
        self
    }

    /// Membership changes on (the default: a failed member is removed and
    /// the others go on) or off (a static group: a failed member stops
    /// the others with an error).
    pub fn membership(mut self, on: bool) -> Self {
        self.config.membership = on;
        self
    }

    /// The ranks in the first view (default: all). A member outside it
    /// joins the running group when it calls `join`.
    pub fn initial_members(mut self, ranks: Vec<usize>) -> Self {
        self.config.initial_members = Some(ranks);
        self
    }

    /// The group layer's configuration as it stands.
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// Validate every setting, open the transport and join: as a member of
    /// the first view (waiting up to the join timeout for the others), or,
    /// for a rank outside `initial_members`, by joining the running group
    /// (see [`GroupBuilder::join_running`]). Returns the member in invoker
    /// mode: drive it with [`Group::poll`], or hand it to a progress
    /// thread with [`Group::spawn`].
    pub fn join(self) -> Result<Group<A>, Error> {
        let joining = !self.config.initial_ranks().contains(&self.rank);
        self.open_and_join(joining)
    }

    /// Join a group that is already running, as a rank outside its current
    /// view (never started, or its member died or left): the group admits
    /// it in a view change and the application gets the state snapshot
    /// first. Waits up to the join timeout to be admitted.
    pub fn join_running(self) -> Result<Group<A>, Error> {
        self.open_and_join(true)
    }

    fn open_and_join(mut self, joining: bool) -> Result<Group<A>, Error> {
        self.config.validate()?;
        if self.rank >= self.config.members {
            return Err(Error::Config(format!(
                "rank {} is not a member: the group has {} members (ranks 0..={})",
                self.rank,
                self.config.members,
                self.config.members - 1
            )));
        }
        let fabric = Arc::new(transport::open(&self.transport, &self.config, self.rank, joining)?);
        let inner = if joining {
            spindle_group::Group::join_running(fabric, self.config, &mut self.app)?
        } else {
            let mut inner = spindle_group::Group::join(fabric, self.config)?;
            // A persistent member that a restart after a total failure
            // left out joins the restarted group afresh: wait until it
            // is admitted (its application gets the state first).
            inner.wait_admitted(&mut self.app)?;
            inner
        };
        Ok(Group::new(inner, self.app))
    }
}
