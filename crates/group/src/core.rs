//! `GroupCore`: the SMC protocol of one member, driven by [`GroupCore::step`].
//!
//! ## Driving contract
//!
//! `step(now_ns, deliver)` does one bounded pass and returns the work it
//! did; it never blocks, sleeps, spawns or reads a clock. Call it from one
//! thread at a time (the runtime's progress loop, or the application in
//! invoker mode). Application threads send concurrently through
//! [`crate::Sender`] handles; they only touch the lock-free
//! [`SendRing`] and their reserved slots.
//!
//! ## One pass
//!
//! 1. **publish** (sender batching): every slot the application committed
//!    since the last pass gets its message index; then one push of the
//!    slots (the bytes they use: header and payload) and one guard update
//!    publish them all.
//! 2. **receive** (receiver batching): the fabric brings in what arrived
//!    ([`Fabric::receive_now`]; tcp reads its sockets on this thread), then
//!    for each sender, drain every slot up to its guard, then store
//!    `received_num` and `received_frontier` once.
//! 3. **nulls**: a sender with nothing in flight that is behind the
//!    round-robin order (others' messages wait for its indices) publishes
//!    one slot carrying a run of nulls.
//! 4. **deliver** (delivery batching): ordered mode delivers the whole
//!    stable prefix `[delivered_num, min over members of frontier)` in
//!    sequence order, then stores `delivered_num` and `released_slots`
//!    once; unordered mode delivers in step 2.
//! 5. **flow control**: raise the send ring's limit to the slowest
//!    member's released slot + window.
//! 6. **progress push**: the counters go to the peers once per pass that
//!    published or received; a pass that only delivered pushes them
//!    lazily (see `release_urgent`). Then [`Fabric::flush`] sends the
//!    pass's pushes (tcp with coalescing: one `sendmsg` per peer).
//!
//! Total order: message `index` of the sender at position `r` in the
//! view's sender list has sequence number `seq = index × senders + r`.
//!
//! Views: everything above runs within the current view (its members and
//! senders); [`crate::membership`] changes the view (Derecho's protocol)
//! and restarts the counters at each install, while ring positions go on.

use std::sync::Arc;

use spindle_fabric::{Fabric, FabricError, PeerSet, RowRef};

use crate::config::{DeliveryMode, GroupConfig};
use crate::counters::{self, Counters};
use crate::large::{Fragment, FragmentDelivery, Reassembly, LEN_FRAGMENT, LEN_MASK};
use crate::layout::{SmcLayout, NULL_COUNT_SKIP, SLOT_HEADER_BYTES};
use crate::membership::{MembershipState, Upcalls, View};
use crate::persist::{PersistLog, SenderWord};
use crate::restart::Replay;
use crate::send_ring::SendRing;
use crate::sync::Ordering;
use crate::GroupError;

/// One delivered message. `payload` points into the sender's ring and is
/// valid only during the callback.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The view (epoch) it was sent in; static groups have view 0.
    pub view: u64,
    /// Member rank of the sender.
    pub sender_rank: usize,
    /// Position of the sender in the view's sender list.
    pub sender_index: usize,
    /// The message's index in its sender's stream (nulls take indices too).
    pub index: u64,
    /// Position in the total order: `index × senders + sender_index`.
    pub seq: u64,
    pub payload: &'a [u8],
}

/// Positions of one member, for tests and tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Positions {
    pub published_slots: u64,
    pub next_msg_index: u64,
    pub received_num: Vec<u64>,
    pub received_frontier: u64,
    pub stable: u64,
    pub delivered_num: u64,
}

/// Messages one delivery pass may hand over before yielding the loop.
const DELIVERY_BUDGET_PER_SENDER: u64 = 1 << 16;
/// Payload bytes one delivery pass may hand over: a long stable prefix is
/// delivered in L2-sized batches, each followed by a release that lets the
/// senders reuse slots while the rest is delivered (no pipeline stall).
const DELIVERY_BYTES_BUDGET: u64 = 256 << 10;

/// Where a sender's delivery cursor stopped ([`GroupCore::advance_cursor`]).
enum Cursor {
    /// A data message: its slot's offset in the sender's row, its length,
    /// and whether it is a fragment of a large message.
    Data { off: usize, len: usize, fragment: bool },
    /// The message index is a null (passed, nothing delivered).
    Null,
    /// The sender moved on to a newer view and reused the slot.
    Overtaken,
}

pub struct GroupCore<F: Fabric> {
    pub(crate) fabric: Arc<F>,
    pub(crate) layout: Arc<SmcLayout>,
    pub(crate) mode: DeliveryMode,
    batching: bool,
    pub(crate) view: u64,
    pub(crate) my_rank: usize,
    /// The current view's members, ascending, and as a mask.
    pub(crate) view_members: Vec<usize>,
    pub(crate) view_mask: u64,
    /// The view's members except this one (SMC pushes go here).
    pub(crate) peers: PeerSet,
    /// Every rank except this one (membership pushes go here).
    pub(crate) everyone: PeerSet,
    /// The configured senders (ranks); a view's senders are those in it.
    pub(crate) configured_senders: Vec<usize>,
    pub(crate) sender_ranks: Vec<usize>,
    pub(crate) my_sender_index: Option<usize>,
    pub(crate) ring: Option<Arc<SendRing>>,
    /// Ring position of the next slot to publish (monotonic across views).
    pub(crate) published_slots: u64,
    /// Ring position where this member's sends in the current view begin.
    pub(crate) my_base: u64,
    /// Per view sender: where its sends in this view begin, once its row
    /// says it runs this view (`smc_view`).
    pub(crate) sender_base: Vec<Option<u64>>,
    /// Every member's row runs this view (until then nothing is stable and
    /// flow control does not move: some member may still be finishing the
    /// old view's ragged edge in the ring).
    pub(crate) all_tagged: bool,
    pub(crate) next_msg_index: u64,
    /// Per view sender, counted from its base: slots received, messages
    /// received (nulls included), slots this member is done with.
    pub(crate) recv_slots: Vec<u64>,
    pub(crate) recv_msgs: Vec<u64>,
    pub(crate) deliver_slots: Vec<u64>,
    /// `deliver_slots` as of the last progress push of a pass that only
    /// delivered (see `release_urgent`).
    released_pushed: Vec<u64>,
    pub(crate) delivered_num: u64,
    pub(crate) received_frontier: u64,
    /// Persistent mode: this member's log; the next seq to stage in it;
    /// each sender's staging cursor (slots from its base, like
    /// `deliver_slots` but ahead of it); the durable frontier this member
    /// published in `persisted_num` (every seq below it on disk).
    pub(crate) persist: Option<PersistLog>,
    /// Persistent mode, after a restart: the history still to hand to
    /// the application, before anything else.
    replay: Option<Replay>,
    /// Large messages being put together, per view sender.
    pub(crate) large: Reassembly,
    pub(crate) appended_num: u64,
    append_slots: Vec<u64>,
    pub(crate) persisted_num: u64,
    null_target: u64,
    /// The ring's reservation and back-pressure counts at the last pass:
    /// if either moved, the application is sending and its own messages
    /// will fill its indices, so no nulls.
    app_reserved_seen: u64,
    app_backpressure_seen: u64,
    pub(crate) flow_limit: u64,
    /// `GroupConfig::ack_every_slots`.
    ack_every_slots: u32,
    /// `GroupConfig::track_acks`.
    track_acks: bool,
    /// `GroupConfig::compact_log_bytes` (0: only when asked).
    compact_log_bytes: u64,
    /// [`GroupCore::request_log_compaction`] was called and the
    /// compaction has not begun.
    compaction_requested: bool,
    /// The application's snapshot for a compaction (keeps its capacity).
    compaction_state: Vec<u8>,
    /// [`GroupCore::pause_receive`].
    receive_paused: bool,
    /// A sender reused a slot this member had yet to deliver from: it was
    /// removed and does not know yet. The SMC stops; the membership step
    /// runs every pass until it installs the view that removed it.
    overtaken: bool,
    pub(crate) counters: Counters,
    pub(crate) peer_check_interval_ns: u64,
    pub(crate) last_peer_check_ns: u64,
    finished_peers: PeerSet,
    pub(crate) mship: MembershipState,
}

impl<F: Fabric> GroupCore<F> {
    /// A member's protocol state over a fabric whose rows follow `layout`.
    pub fn new(fabric: Arc<F>, config: &GroupConfig, layout: SmcLayout) -> Result<GroupCore<F>, GroupError> {
        let joining = !config.initial_ranks().contains(&fabric.member_rank());
        GroupCore::build(fabric, config, layout, joining, 0)
    }

    /// A member of a group restarted after a total failure (persistent
    /// mode): its first view is `first_view` (see [`crate::restart`]).
    pub fn new_restarted(
        fabric: Arc<F>,
        config: &GroupConfig,
        layout: SmcLayout,
        first_view: u64,
    ) -> Result<GroupCore<F>, GroupError> {
        GroupCore::build(fabric, config, layout, false, first_view)
    }

    /// A member that asks to join a running group (see
    /// [`crate::Group::join_running`]).
    pub fn new_joiner(fabric: Arc<F>, config: &GroupConfig, layout: SmcLayout) -> Result<GroupCore<F>, GroupError> {
        GroupCore::build(fabric, config, layout, true, 0)
    }

    /// A member that a restart after a total failure left out, asking to
    /// join the group restarted in `first_view` (whose first view may
    /// have no sender, as the group before the failure may have had
    /// none: see `GroupConfig::validate_for`).
    pub fn new_joiner_of_restarted(
        fabric: Arc<F>,
        config: &GroupConfig,
        layout: SmcLayout,
        first_view: u64,
    ) -> Result<GroupCore<F>, GroupError> {
        GroupCore::build(fabric, config, layout, true, first_view)
    }

    fn build(
        fabric: Arc<F>,
        config: &GroupConfig,
        layout: SmcLayout,
        joining: bool,
        first_view: u64,
    ) -> Result<GroupCore<F>, GroupError> {
        config.validate_for(first_view > 0)?;
        if fabric.row_len_bytes() < layout.row.row_len_bytes() || fabric.member_count() != config.members {
            return Err(GroupError::Config(format!(
                "fabric ({} members, {} B rows) does not fit the layout ({} members, {} B rows)",
                fabric.member_count(),
                fabric.row_len_bytes(),
                config.members,
                layout.row.row_len_bytes()
            )));
        }
        // The ring is read only behind its senders' guards: a fabric that
        // copies rows may fill it with plain copies.
        fabric.declare_payload_region(layout.payload_region());
        let my_rank = fabric.member_rank();
        let configured_senders = config.senders.ranks(config.members);
        let initial = config.initial_ranks();
        let ring = configured_senders
            .contains(&my_rank)
            .then(|| Arc::new(SendRing::new(config.window_slots)));
        let mut core = GroupCore {
            peers: PeerSet::default(),
            everyone: PeerSet::all_except(my_rank, config.members),
            view_members: Vec::new(),
            view_mask: 0,
            my_rank,
            fabric,
            mode: config.mode,
            batching: config.batching,
            view: 0,
            configured_senders,
            sender_ranks: Vec::new(),
            my_sender_index: None,
            ring,
            published_slots: 0,
            my_base: 0,
            sender_base: Vec::new(),
            all_tagged: false,
            next_msg_index: 0,
            recv_slots: Vec::new(),
            recv_msgs: Vec::new(),
            deliver_slots: Vec::new(),
            released_pushed: Vec::new(),
            delivered_num: 0,
            received_frontier: 0,
            persist: None,
            replay: None,
            large: Reassembly::new(
                config.senders.ranks(config.members).len(),
                config.large_message_max_bytes,
            ),
            appended_num: 0,
            append_slots: Vec::new(),
            persisted_num: 0,
            null_target: 0,
            app_reserved_seen: 0,
            app_backpressure_seen: 0,
            flow_limit: config.window_slots as u64,
            ack_every_slots: config.ack_every_slots,
            track_acks: config.track_acks,
            compact_log_bytes: config.compact_log_bytes,
            compaction_requested: false,
            compaction_state: Vec::new(),
            receive_paused: false,
            overtaken: false,
            counters: Counters::default(),
            peer_check_interval_ns: config.peer_check_interval.as_nanos() as u64,
            last_peer_check_ns: 0,
            finished_peers: PeerSet::default(),
            mship: MembershipState::new(config),
            layout: Arc::new(layout),
        };
        if joining {
            core.start_joining()?;
        } else {
            core.start_first_view(first_view, &initial)?;
        }
        Ok(core)
    }

    /// Enter the current view's SMC state: senders, counters from zero,
    /// every peer's base unknown until its row says it runs this view.
    pub(crate) fn enter_view(&mut self, view: u64, members: &[usize]) {
        debug_assert!(
            !self.overtaken,
            "virtual synchrony: member {} was overtaken in view {} yet enters view {view}",
            self.my_rank, self.view
        );
        self.view = view;
        self.view_members = members.to_vec();
        self.view_mask = members.iter().fold(0u64, |m, r| m | 1 << r);
        self.peers = PeerSet(self.view_mask & !(1u64 << self.my_rank));
        self.sender_ranks = self
            .configured_senders
            .iter()
            .copied()
            .filter(|r| self.view_mask & (1 << r) != 0)
            .collect();
        self.my_sender_index = self.sender_ranks.iter().position(|r| *r == self.my_rank);
        let senders = self.sender_ranks.len();
        self.my_base = self.published_slots;
        self.sender_base = vec![None; senders];
        self.all_tagged = false;
        self.next_msg_index = 0;
        self.recv_slots = vec![0; senders];
        self.recv_msgs = vec![0; senders];
        self.deliver_slots = vec![0; senders];
        self.released_pushed = vec![0; senders];
        self.delivered_num = 0;
        self.received_frontier = 0;
        self.appended_num = 0;
        self.append_slots = vec![0; senders];
        self.large.resize(senders);
        self.persisted_num = 0;
        self.null_target = 0;
        self.counters.values[counters::VIEW] = view;
        // This view's counters in the row start from zero (the tag that
        // tells peers they are valid is stored after them: `tag_view`).
        let me = self.row(self.my_rank);
        let l = &self.layout;
        me.u64_at(l.received_frontier.offset()).store(0, Ordering::Relaxed);
        me.u64_at(l.delivered_num.offset()).store(0, Ordering::Relaxed);
        me.u64_at(l.persisted_num.offset()).store(0, Ordering::Relaxed);
        for i in 0..l.senders {
            me.u64_at(l.received_num.offset(i)).store(0, Ordering::Relaxed);
            me.u64_at(l.released_slots.offset(i)).store(0, Ordering::Relaxed);
        }
        me.u64_at(l.guard.offset()).store(0, Ordering::Relaxed);
        me.u64_at(l.guard_view.offset()).store(view + 1, Ordering::Relaxed);
        // Release: pairs with the Acquire load of `base_slot` in the
        // peers' `sender_ready`: a peer that reads this view's base reads
        // this view's `guard_view` too, and so knows the base is not its.
        me.u64_at(l.base_slot.offset()).store(self.my_base, Ordering::Release);
    }

    /// Publish that this member's SMC counters belong to the current view:
    /// the zeroed guard and its view first, then the zeroed counters and
    /// the base, then the tag.
    pub(crate) fn tag_view(&mut self) -> Result<(), FabricError> {
        let guard = self.layout.guard.offset();
        debug_assert_eq!(self.layout.guard_view.offset(), guard + 8);
        // The guard and its view first, in one push: a peer still in the
        // view before reads `base_slot` (in the next push) only after the
        // new `guard_view` landed, and so never takes this view's base
        // for its own (`sender_ready`). Then the zeroed counters and the
        // base.
        self.fabric.push(guard..guard + 16, self.everyone)?;
        self.fabric.push(self.layout.progress_range(), self.everyone)?;
        let me = self.row(self.my_rank);
        // Release: pairs with the Acquire loads of `smc_view` in
        // `sender_ready`, `refresh_tags`, `stable` and the membership's
        // `fresh_proposal` of every peer (publishes the zeroed counters,
        // the guard's view and the base slot of `reset_smc`).
        me.u64_at(self.layout.smc_view.offset())
            .store(self.view + 1, Ordering::Release);
        self.fabric.push(self.layout.progress_range(), self.everyone)?;
        self.fabric.doorbell().ring();
        Ok(())
    }

    /// Whether every member of the view runs it (cached once true).
    #[inline]
    fn refresh_tags(&mut self) -> bool {
        if self.all_tagged {
            return true;
        }
        if self.mship.awaiting_snapshot.is_some() {
            return false;
        }
        let tag = self.view + 1;
        let off = self.layout.smc_view.offset();
        let all = self
            .view_members
            .iter()
            // Acquire: pairs with the Release store of `smc_view` in each
            // member's `tag_view` (its counters are of this view).
            .all(|&r| self.row(r).u64_at(off).load(Ordering::Acquire) == tag);
        self.all_tagged = all;
        all
    }

    /// The base of view sender `i`, once its row says it runs this view.
    #[inline]
    fn sender_ready(&mut self, i: usize) -> Option<u64> {
        if let Some(base) = self.sender_base[i] {
            return Some(base);
        }
        let row = self.row(self.sender_ranks[i]);
        // Acquire: pairs with the Release store of `smc_view` in the
        // sender's `tag_view` (its zeroed guard and its base slot).
        if row.u64_at(self.layout.smc_view.offset()).load(Ordering::Acquire) != self.view + 1 {
            return None;
        }
        // Acquire: pairs with the Release store of `base_slot` in the
        // sender's `reset_smc` (after its `guard_view`).
        let base = row.u64_at(self.layout.base_slot.offset()).load(Ordering::Acquire);
        // A sender that moved on to a newer view since (this member was
        // removed and does not know yet) may have stored that view's base
        // before its new tag: its `guard_view`, stored and pushed before
        // the base, says so. (Seen in the simulator: a slow member read a
        // sender's next base with the old tag, and its slots with it.)
        if row.u64_at(self.layout.guard_view.offset()).load(Ordering::Relaxed) != self.view + 1 {
            return None;
        }
        self.sender_base[i] = Some(base);
        Some(base)
    }

    pub fn fabric(&self) -> &Arc<F> {
        &self.fabric
    }
    pub fn my_rank(&self) -> usize {
        self.my_rank
    }
    pub fn sender_ranks(&self) -> &[usize] {
        &self.sender_ranks
    }
    pub fn my_sender_index(&self) -> Option<usize> {
        self.my_sender_index
    }
    pub fn view(&self) -> u64 {
        self.view
    }
    /// The current view's members (ranks, ascending).
    pub fn members(&self) -> &[usize] {
        &self.view_members
    }
    /// The current view, as the application sees it.
    pub fn current_view(&self) -> View {
        self.mship.current.clone()
    }

    #[inline(always)]
    pub(crate) fn row(&self, rank: usize) -> RowRef<'_> {
        self.fabric.row(rank)
    }

    /// One bounded pass (see the module docs) with every upcall to `up`:
    /// deliveries (once per delivered message, in delivery order), view
    /// changes, and the snapshot a joiner gets (see [`Upcalls`]; a
    /// delivery closure is an `Upcalls` too). Never blocks: a pass does at
    /// most a bounded amount of work (one window per sender) and returns.
    pub fn step<U: Upcalls + ?Sized>(&mut self, now_ns: u64, up: &mut U) -> Result<u32, GroupError> {
        if self.replay.is_some() {
            return self.replay_history(up);
        }
        self.mship.report_first_view(up);
        let mut work = 0u32;
        let smc_running = self.smc_running();
        if smc_running && self.my_sender_index.is_some() {
            work += self.publish()?;
        }
        // Fabrics that copy rows (tcp) bring in what arrived, on this
        // thread: a spinning loop needs no other thread to wake. After
        // publishing, so that a new message is not held up by it.
        self.fabric.receive_now();
        if smc_running && !self.receive_paused {
            work += self.receive(up)?;
            if self.my_sender_index.is_some() && self.send_nulls_if_blocking() {
                work += self.publish()?;
            }
            if self.mode == DeliveryMode::Persistent {
                work += self.persist_received()?;
            }
            let delivered = if self.mode.is_total_order() {
                self.deliver_stable(up)?
            } else {
                0
            };
            if self.mode == DeliveryMode::Persistent {
                work += self.compact_if_due(up)?;
            }
            if let Some(si) = self.my_sender_index {
                self.update_flow_limit(si);
            }
            // Receiver and delivery batching: counters stored as they
            // moved, published once per pass. A pass that only delivered
            // publishes its releases lazily (with the next push, the
            // heartbeat, or once a sender's window needs them): nobody
            // waits for a delivery count, and on tcp a push that the peer
            // does not answer costs its next round trip a bare ACK.
            if work > 0 || (delivered > 0 && self.release_urgent()) {
                self.push_progress()?;
                self.released_pushed.copy_from_slice(&self.deliver_slots);
            }
            work += delivered;
        }
        self.counters.add(counters::STEPS, 1);
        let timed = now_ns.saturating_sub(self.last_peer_check_ns) >= self.peer_check_interval_ns;
        if timed {
            self.last_peer_check_ns = now_ns;
            let hb = &self.layout.heartbeat;
            self.row(self.my_rank)
                .u64_at(hb.offset())
                .fetch_add(1, Ordering::Relaxed);
            if !self.mship.enabled {
                self.push_progress()?;
                self.check_peers()?;
            }
        }
        if self.mship.enabled && (timed || self.mship.busy() || self.overtaken) {
            work += self.membership_step(now_ns, timed, up)?;
        }
        if work > 0 || timed {
            self.flush_counters();
        }
        // The pass's pushes, batched by fabrics that coalesce (tcp: one
        // `sendmsg` per peer per pass).
        self.fabric.flush();
        Ok(work)
    }

    /// Whether some sender may soon wait for this member's releases: it
    /// has at least half a window of slots that this member received but
    /// has not yet told it were released. (A sender blocked on its window
    /// has a whole window past the releases it saw, so this member gets
    /// there before it blocks: flow control never waits for the lazy
    /// push.)
    fn release_urgent(&self) -> bool {
        let owed_max = match self.ack_every_slots {
            0 => self.layout.window_slots as u64 / 2,
            k => k as u64,
        };
        (0..self.deliver_slots.len()).any(|i| {
            Some(i) != self.my_sender_index && self.recv_slots[i].saturating_sub(self.released_pushed[i]) >= owed_max
        })
    }

    /// Stop (or resume) receiving and delivering: a consumer that cannot
    /// take more (a DDS reader whose keep-all history is full) pauses its
    /// member. Heartbeats, pushes of its own messages and membership go
    /// on, so the member is not suspected; the senders' windows fill and
    /// their sends return `WouldBlock`: back-pressure, nothing dropped.
    pub fn pause_receive(&mut self, paused: bool) {
        self.receive_paused = paused;
    }

    /// Whether receiving is paused ([`GroupCore::pause_receive`]).
    pub fn is_receive_paused(&self) -> bool {
        self.receive_paused
    }

    /// Whether the SMC runs this pass: in a view, not wedged, own
    /// counters published for this view.
    #[inline(always)]
    fn smc_running(&self) -> bool {
        !self.mship.wedged
            && !self.mship.joining
            && !self.mship.left
            && !self.overtaken
            && self.mship.awaiting_snapshot.is_none()
    }

    /// Whether a pass would find something to do (cheap; before parking).
    pub fn has_work(&self) -> bool {
        if self.mship.busy() || self.overtaken || self.replay.is_some() {
            return true;
        }
        if let Some(ring) = &self.ring {
            if self.my_sender_index.is_some() && ring.scan(self.published_slots) > 0 {
                return true;
            }
        }
        for (i, &rank) in self.sender_ranks.iter().enumerate() {
            // Acquire: pairs with the Release store of the guard in the
            // sender's `publish` (a hint here: `receive_from` loads it again).
            if self.sender_base[i].is_none()
                || self
                    .row(rank)
                    .u64_at(self.layout.guard.offset())
                    .load(Ordering::Acquire)
                    > self.recv_slots[i]
            {
                return true;
            }
        }
        if self.mode == DeliveryMode::Persistent {
            if self.appended_num < self.received_frontier {
                return true;
            }
            if let Some(log) = &self.persist {
                if log.durable_seq(self.view).map_or(true, |d| d > self.persisted_num) {
                    return true;
                }
            }
        }
        self.mode.is_total_order() && self.received_frontier > self.delivered_num && self.stable() > self.delivered_num
    }

    // ---- 2b. persist (persistent mode) -----------------------------------

    /// Whether the history of a restart is still being handed over.
    pub fn is_replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// Hand the application the history of a restart (see
    /// [`crate::restart`]), a bounded batch per pass; the protocol runs
    /// once it is all handed over.
    pub fn set_replay(&mut self, replay: Replay) {
        self.replay = (!replay.messages.is_empty() || replay.snapshot.is_some()).then_some(replay);
    }

    fn replay_history<U: Upcalls + ?Sized>(&mut self, up: &mut U) -> Result<u32, GroupError> {
        let Some(replay) = self.replay.as_mut() else {
            return Ok(0);
        };
        if let Some(snapshot) = replay.snapshot.take() {
            // A compacted log: the state it was compacted to comes first,
            // then the messages after it.
            let (view, seq) = replay.snapshot_at;
            up.restore(&snapshot).map_err(|reason| GroupError::Persist {
                rank: self.my_rank,
                reason: format!(
                    "restart: the application refused the snapshot its log was compacted to (view {view} seq {seq}): {reason}"
                ),
            })?;
            self.counters.add(counters::SNAPSHOTS_RESTORED, 1);
        }
        let end = (replay.next + DELIVERY_BUDGET_PER_SENDER as usize).min(replay.messages.len());
        for m in &replay.messages[replay.next..end] {
            if replay.view != Some(m.view) {
                // The history crosses a view change: what was half put
                // together was dropped at that install (see `large`), and
                // the application told, as it was then.
                if let Some(view) = replay.view {
                    cut_partials(&mut self.large, &mut self.counters, up, view, &replay.ranks);
                }
                replay.view = Some(m.view);
            }
            if replay.ranks.len() <= m.sender_index {
                replay.ranks.resize(m.sender_index + 1, 0);
            }
            replay.ranks[m.sender_index] = m.sender_rank;
            self.large.grow(m.sender_index + 1);
            let d = Delivery {
                view: m.view,
                sender_rank: m.sender_rank,
                sender_index: m.sender_index,
                index: m.index,
                seq: m.seq,
                payload: &replay.bytes[m.bytes.clone()],
            };
            hand_over(&mut self.large, &mut self.counters, up, &d, m.fragment);
        }
        let handed = end - replay.next;
        replay.next = end;
        self.counters.add(counters::REPLAYED_MSGS, handed as u64);
        if end == replay.messages.len() {
            // A large message the crash cut short is delivered nowhere; the
            // live view starts with no half-assembled message.
            if let Some(view) = replay.view {
                cut_partials(&mut self.large, &mut self.counters, up, view, &replay.ranks);
            }
            self.large.resize(self.sender_ranks.len());
            self.replay = None;
        }
        Ok(handed as u32)
    }

    /// Attach this member's log (persistent mode; [`crate::Group::join`]
    /// opens it in `persist_dir`, the simulator gives one in memory).
    pub fn attach_log(&mut self, log: PersistLog) {
        self.persist = Some(log);
    }

    /// This member's log (persistent mode).
    pub fn persist_log_mut(&mut self) -> Option<&mut PersistLog> {
        self.persist.as_mut()
    }

    /// This member's log (persistent mode).
    pub fn persist_log(&self) -> Option<&PersistLog> {
        self.persist.as_ref()
    }

    /// Compact this member's log at the next pass that can (persistent
    /// mode; see [`crate::persist`]): between deliveries, outside a view
    /// change, with no large message half put together.
    pub fn request_log_compaction(&mut self) -> Result<(), GroupError> {
        if self.mode != DeliveryMode::Persistent {
            return Err(GroupError::Config(format!(
                "log compaction needs mode = \"persistent\" (mode is \"{}\")",
                self.mode.as_str()
            )));
        }
        self.compaction_requested = true;
        Ok(())
    }

    /// Persistent mode: compact the log to the application's snapshot if
    /// asked or `compact_log_bytes` were appended since the last time,
    /// and the pass is at a point where the snapshot is exactly the
    /// deliveries before `delivered_num`: no view change under way (its
    /// ragged edge is not delivered yet), no large message half put
    /// together (its first fragments are delivered to the reassembly, not
    /// to the application).
    fn compact_if_due(&mut self, up: &mut (impl Upcalls + ?Sized)) -> Result<u32, GroupError> {
        let Some(log) = &self.persist else { return Ok(0) };
        let due = self.compaction_requested
            || (self.compact_log_bytes > 0 && log.bytes_since_compaction() >= self.compact_log_bytes);
        if !due || log.is_compacting() || self.mship.busy() || self.overtaken || self.large.has_partial() {
            return Ok(0);
        }
        if !up.takes_snapshots() {
            return Err(GroupError::Config(
                "log compaction (compact_log_bytes, or Group::compact_log) needs upcalls that take snapshots of the \
                 whole state (a StateMachine in Replicated, or Upcalls::takes_snapshots): compacting to an empty \
                 snapshot would lose the history"
                    .into(),
            ));
        }
        self.compaction_requested = false;
        self.compaction_state.clear();
        up.snapshot(&mut self.compaction_state);
        let (view, seq, members) = (self.view, self.delivered_num, self.view_mask);
        let rank = self.my_rank;
        let log = self.persist.as_mut().expect("checked above");
        log.compact(view, seq, members, &self.compaction_state)
            .map_err(|reason| GroupError::Persist { rank, reason })?;
        self.counters.add(counters::LOG_COMPACTIONS, 1);
        Ok(1)
    }

    /// Stage what was received since the last pass in the log (in seq
    /// order, one handover), then publish how far the log is durable.
    fn persist_received(&mut self) -> Result<u32, GroupError> {
        let mut work = 0;
        let accepting = self.persist.as_ref().is_some_and(|l| l.accepting());
        if self.appended_num < self.received_frontier && accepting {
            let senders = self.sender_ranks.len() as u64;
            let end = self
                .received_frontier
                .min(self.appended_num + DELIVERY_BUDGET_PER_SENDER * senders);
            work += self.persist_through(end)?;
        }
        let rank = self.my_rank;
        let log = self.persist.as_ref().ok_or_else(|| {
            GroupError::Config(
                "persistent mode without a log: join with Group::join, which opens it in persist_dir".into(),
            )
        })?;
        let durable = log
            .durable_seq(self.view)
            .map_err(|reason| GroupError::Persist { rank, reason })?;
        if durable > self.persisted_num {
            assert!(
                durable <= self.appended_num,
                "persistence: durable frontier {durable} beyond what was staged ({})",
                self.appended_num
            );
            self.persisted_num = durable;
            self.counters.values[counters::PERSISTED_NUM] = durable;
            // Release: pairs with the Acquire load of `persisted_num` in
            // peers' `stable` (the records below it are on this disk).
            self.row(self.my_rank)
                .u64_at(self.layout.persisted_num.offset())
                .store(durable, Ordering::Release);
            work += 1;
        }
        Ok(work)
    }

    /// Stage every message from `appended_num` up to `end` (all received)
    /// and hand them to the log. Returns the positions passed.
    pub(crate) fn persist_through(&mut self, end: u64) -> Result<u32, GroupError> {
        let Some(mut log) = self.persist.take() else {
            return Err(GroupError::Config(
                "persistent mode without a log: join with Group::join, which opens it in persist_dir".into(),
            ));
        };
        debug_assert!(
            end <= self.received_frontier,
            "persistence: staging past the receive frontier"
        );
        let senders = self.sender_ranks.len() as u64;
        let start = self.appended_num;
        let (mut index, mut s) = (start / senders, (start % senders) as usize);
        let fabric = Arc::clone(&self.fabric);
        let mut q = start;
        while q < end {
            let rank = self.sender_ranks[s];
            let row = fabric.row(rank);
            let (cursor, p) = self.locate(row, s, self.append_slots[s], index, q);
            match cursor {
                Cursor::Data { off, len, fragment } => {
                    // SAFETY: the slot was published by the guard we loaded with
                    // Acquire when receiving it, and stays ours until we release
                    // it after delivering it (delivery follows persistence).
                    let payload = unsafe { row.bytes(off + SLOT_HEADER_BYTES, len) };
                    let mut sender = SenderWord::new(rank, s, senders as usize);
                    if fragment {
                        sender = sender.fragment();
                    }
                    log.stage_message(self.view, q, sender, payload);
                }
                Cursor::Null => {}
                Cursor::Overtaken => {
                    self.overtaken = true;
                    break;
                }
            }
            self.append_slots[s] = p;
            q += 1;
            s += 1;
            if s as u64 == senders {
                s = 0;
                index += 1;
            }
        }
        self.appended_num = q;
        log.stage_frontier(self.view, q);
        log.commit();
        self.persist = Some(log);
        Ok((q - start) as u32)
    }

    // ---- 1. publish -------------------------------------------------------

    fn publish(&mut self) -> Result<u32, GroupError> {
        let ring = self.ring.as_ref().expect("publish: only senders publish");
        let n = ring.scan(self.published_slots);
        if n == 0 {
            return Ok(0);
        }
        let fabric = Arc::clone(&self.fabric);
        let me = fabric.row(self.my_rank);
        let from = self.published_slots;
        let mut data_msgs = 0u64;
        let mut data_bytes = 0u64;
        for p in from..from + n {
            let off = self.layout.slot_offset(p);
            let null_count = me.u32_at(off + 8).load(Ordering::Relaxed);
            if null_count == NULL_COUNT_SKIP {
                continue;
            }
            me.u64_at(off).store(self.next_msg_index, Ordering::Relaxed);
            if null_count == 0 {
                data_msgs += 1;
                data_bytes += (me.u32_at(off + 12).load(Ordering::Relaxed) & LEN_MASK) as u64;
                self.next_msg_index += 1;
            } else {
                self.next_msg_index += null_count as u64;
            }
        }
        let guard = self.layout.guard.offset();
        if self.batching {
            // Sender batching: one push of all slots (only the bytes they
            // use: a short message in a long slot sends its header and
            // payload, not the slot), then one guard update.
            let ranges = self.layout.ring_ranges(from, from + n);
            let span_bytes: usize = ranges.iter().map(|r| r.len()).sum();
            let used_bytes: usize = (from..from + n).map(|p| self.slot_used_bytes(p)).sum();
            if used_bytes * 2 < span_bytes {
                for p in from..from + n {
                    let off = self.layout.slot_offset(p);
                    self.fabric.push(off..off + self.slot_used_bytes(p), self.peers)?;
                }
            } else {
                let last = from + n - 1;
                let last_end = self.layout.slot_offset(last) + self.slot_used_bytes(last);
                for mut r in ranges {
                    if r.is_empty() {
                        continue;
                    }
                    if r.contains(&(last_end - 1)) {
                        r.end = last_end;
                    }
                    self.fabric.push(r, self.peers)?;
                }
            }
            // Release: pairs with the Acquire load of the guard in peers'
            // `receive_from` (and `has_work`) (publishes the batch's slots).
            me.u64_at(guard).store(from + n - self.my_base, Ordering::Release);
            self.fabric.push(guard..guard + 8, self.peers)?;
            self.counters.add(counters::PUBLISH_BATCHES, 1);
        } else {
            for p in from..from + n {
                let off = self.layout.slot_offset(p);
                self.fabric.push(off..off + self.slot_used_bytes(p), self.peers)?;
                // Release: pairs with the Acquire load of the guard in
                // peers' `receive_from` (and `has_work`) (publishes slot `p`).
                me.u64_at(guard).store(p + 1 - self.my_base, Ordering::Release);
                self.fabric.push(guard..guard + 8, self.peers)?;
                self.counters.add(counters::PUBLISH_BATCHES, 1);
            }
        }
        self.published_slots = from + n;
        self.counters.add(counters::PUBLISH_BATCH_SLOTS, n);
        self.counters.add(counters::SENT_MSGS, data_msgs);
        self.counters.add(counters::SENT_BYTES, data_bytes);
        self.fabric.doorbell().ring();
        Ok(n as u32)
    }

    /// Bytes of own slot `p` that carry something: the header and the
    /// payload (a null or a skipped slot: the header; the length is
    /// clamped, so a stale one never reaches past the slot).
    #[inline]
    fn slot_used_bytes(&self, p: u64) -> usize {
        let off = self.layout.slot_offset(p);
        let len = (self.row(self.my_rank).u32_at(off + 12).load(Ordering::Relaxed) & LEN_MASK) as usize;
        SLOT_HEADER_BYTES + len.min(self.layout.slot_stride - SLOT_HEADER_BYTES)
    }

    // ---- 2. receive -------------------------------------------------------

    fn receive<U: Upcalls + ?Sized>(&mut self, up: &mut U) -> Result<u32, GroupError> {
        let mut work = 0u32;
        for i in 0..self.sender_ranks.len() {
            work += self.receive_from(i, up);
        }
        if work > 0 {
            let senders = self.sender_ranks.len() as u64;
            let frontier = (0..self.sender_ranks.len())
                .map(|i| self.recv_msgs[i] * senders + i as u64)
                .min()
                .expect("at least one sender");
            debug_assert!(
                frontier >= self.received_frontier,
                "total order: the receive frontier never moves back"
            );
            self.received_frontier = frontier;
            let me = self.row(self.my_rank);
            // Release: pairs with the Acquire loads of the frontier in
            // peers' `stable` and the membership's `fresh_proposal`
            // (the slots below it are received here).
            me.u64_at(self.layout.received_frontier.offset())
                .store(frontier, Ordering::Release);
            self.counters.add(counters::RECEIVE_BATCHES, 1);
            if !self.batching {
                self.push_progress()?;
            }
        }
        Ok(work)
    }

    /// Drain sender `i` up to its guard. Returns slots consumed.
    fn receive_from<U: Upcalls + ?Sized>(&mut self, i: usize, up: &mut U) -> u32 {
        let Some(base) = self.sender_ready(i) else {
            return 0;
        };
        let rank = self.sender_ranks[i];
        let fabric = Arc::clone(&self.fabric);
        let row = fabric.row(rank);
        // Acquire: pairs with the Release store of the guard in the
        // sender's `publish` (the slots below it).
        let guard = row.u64_at(self.layout.guard.offset()).load(Ordering::Acquire);
        let mut p = self.recv_slots[i];
        if guard <= p {
            return 0;
        }
        // A sender that moved on to a newer view (this member was removed
        // and does not know yet) counts its guard from another base.
        // Acquire: pairs with the Release store of `smc_view` in the
        // sender's `tag_view`, which follows its store of `guard_view` in
        // `reset_smc` (pushed with the guard, in one push).
        if row.u64_at(self.layout.guard_view.offset()).load(Ordering::Acquire) != self.view + 1 {
            return 0;
        }
        assert!(
            guard - self.deliver_slots[i] <= self.layout.window_slots as u64,
            "flow control: sender {rank} published slot {guard} past the window of member {}",
            self.my_rank
        );
        let mut msgs = self.recv_msgs[i];
        let senders = self.sender_ranks.len() as u64;
        let start = p;
        while p < guard {
            let off = self.layout.slot_offset(base + p);
            let null_count = row.u32_at(off + 8).load(Ordering::Relaxed);
            p += 1;
            if null_count == NULL_COUNT_SKIP {
                continue;
            }
            let index = row.u64_at(off).load(Ordering::Relaxed);
            if index != msgs && self.sender_moved_on(row) {
                // The sender installed a newer view while we read (this
                // member was removed and does not know yet) and may be
                // publishing its trimmed slots again with new indices.
                p -= 1;
                break;
            }
            assert_eq!(
                index,
                msgs,
                "per-sender FIFO: sender {rank} slot {} carries index {index}, expected {msgs}",
                p - 1
            );
            if null_count == 0 {
                msgs += 1;
                if self.mode == DeliveryMode::Unordered {
                    let len = row.u32_at(off + 12).load(Ordering::Relaxed);
                    // SAFETY: the guard (Acquire above) published this slot, and
                    // the sender cannot reuse it before we release it (we publish
                    // released_slots only after this callback returns).
                    let payload = unsafe { row.bytes(off + SLOT_HEADER_BYTES, (len & LEN_MASK) as usize) };
                    let seq = index * senders + i as u64;
                    let d = Delivery {
                        view: self.view,
                        sender_rank: rank,
                        sender_index: i,
                        index,
                        seq,
                        payload,
                    };
                    if let Some(bytes) = hand_over(&mut self.large, &mut self.counters, up, &d, len & LEN_FRAGMENT != 0)
                    {
                        self.counters.add(counters::DELIVERED_MSGS, 1);
                        self.counters.add(counters::DELIVERED_BYTES, bytes as u64);
                    }
                }
            } else {
                msgs += null_count as u64;
            }
        }
        self.counters.add(counters::RECEIVED_MSGS, msgs - self.recv_msgs[i]);
        self.recv_slots[i] = p;
        self.recv_msgs[i] = msgs;
        let me = fabric.row(self.my_rank);
        // Release: no protocol partner (the count is read by `spindle stat`
        // and the checkers); Release keeps it behind the receipt it counts.
        me.u64_at(self.layout.received_num.offset(i))
            .store(msgs, Ordering::Release);
        if self.mode == DeliveryMode::Unordered {
            self.deliver_slots[i] = p;
            // Release: pairs with the Acquire load of `released_slots` in
            // the sender's `update_flow_limit` (we are done with its slots).
            me.u64_at(self.layout.released_slots.offset(i))
                .store(p, Ordering::Release);
            self.counters.add(counters::DELIVERY_BATCHES, 1);
        }
        (p - start) as u32
    }

    /// Whether a sender's row runs a newer view than this member's.
    #[cold]
    fn sender_moved_on(&self, row: RowRef<'_>) -> bool {
        // Acquire: pairs with the Release store of `smc_view` in the
        // sender's `tag_view`.
        row.u64_at(self.layout.guard_view.offset()).load(Ordering::Acquire) != self.view + 1
    }

    /// No loss for a sender that stays in the next view: its messages
    /// published in the old view beyond the ragged edge (`final_seq`) were
    /// delivered nowhere (every delivery anywhere is below the edge), so
    /// they are published again, with the next view's indices, by the next
    /// `publish` (Derecho re-sends them the same way). Called at install,
    /// before [`GroupCore::enter_view`], in ordered mode. Returns how many
    /// data messages go out again.
    ///
    /// The ring slots from the first trimmed one on still hold the
    /// messages: flow control never let the application reuse them (no
    /// member released a slot it did not deliver), and their commit marks
    /// still read `position + 1`, so `scan` finds them again. Null runs
    /// among them are turned into skips (they filled the old view's
    /// round-robin order and mean nothing in the next one).
    pub(crate) fn rewind_trimmed(&mut self, final_seq: u64) -> u64 {
        let Some(si) = self.my_sender_index else {
            return 0;
        };
        let senders = self.sender_ranks.len() as u64;
        let si = si as u64;
        // Own indices i with seq = i × senders + si below the edge.
        let delivered_own = if final_seq > si {
            (final_seq - si).div_ceil(senders)
        } else {
            0
        };
        assert!(
            delivered_own <= self.next_msg_index,
            "virtual synchrony: the ragged edge {final_seq} passes index {delivered_own} of member {}, which published only {}",
            self.my_rank,
            self.next_msg_index
        );
        let fabric = Arc::clone(&self.fabric);
        let me = fabric.row(self.my_rank);
        let window_slots = self.layout.window_slots as u64;
        // The first slot whose first index is past the edge (a null run
        // that straddles it stays: a slow member may still pass it while
        // it delivers the old view's ragged edge). Positions below
        // `flow_limit - window` were released by every member (delivered
        // everywhere, so below the edge), and their slots may already
        // hold positions the application reserved since; from there on,
        // each slot still holds what was published at its position.
        let mut resend_from = self.my_base.max(self.flow_limit.saturating_sub(window_slots));
        while resend_from < self.published_slots {
            let off = self.layout.slot_offset(resend_from);
            let null_count = me.u32_at(off + 8).load(Ordering::Relaxed);
            if null_count != NULL_COUNT_SKIP && me.u64_at(off).load(Ordering::Relaxed) >= delivered_own {
                break;
            }
            resend_from += 1;
        }
        assert!(
            self.flow_limit <= resend_from + window_slots,
            "no duplication: trimmed slot {resend_from} of member {} could be reused (flow limit {}; view {} base {} published {} \
             delivered_own {delivered_own} of {} published, final_seq {final_seq}, delivered_num {})",
            self.my_rank,
            self.flow_limit,
            self.view,
            self.my_base,
            self.published_slots,
            self.next_msg_index,
            self.delivered_num,
        );
        let mut resent = 0u64;
        for p in resend_from..self.published_slots {
            let off = self.layout.slot_offset(p);
            match me.u32_at(off + 8).load(Ordering::Relaxed) {
                0 => resent += 1,
                NULL_COUNT_SKIP => {}
                _ => me.u32_at(off + 8).store(NULL_COUNT_SKIP, Ordering::Relaxed),
            }
        }
        debug_assert!(
            resent <= self.next_msg_index - delivered_own,
            "no duplication: {resent} messages to resend but only {} were trimmed",
            self.next_msg_index - delivered_own
        );
        self.published_slots = resend_from;
        self.counters.add(counters::RESENT_MSGS, resent);
        resent
    }

    // ---- 3. nulls ---------------------------------------------------------

    /// Spindle's null rule: only an idle sender (nothing in flight, and the
    /// application neither reserved a slot nor hit back-pressure since the
    /// last pass) whose missing indices hold back others' received
    /// messages sends nulls, all of them in one slot. Returns whether it
    /// committed a null slot.
    ///
    /// Liveness: a sender that keeps hitting back-pressure never blocks the
    /// order, because a full window means its W oldest messages are
    /// published, and all lie below any index it could be missing.
    fn send_nulls_if_blocking(&mut self) -> bool {
        let si = self.my_sender_index.expect("only senders send nulls");
        let senders = self.sender_ranks.len();
        if senders == 1 {
            return false;
        }
        let mut target = 0u64;
        for j in (0..senders).filter(|j| *j != si) {
            let n = self.recv_msgs[j];
            let need = if j > si { n } else { n.saturating_sub(1) };
            target = target.max(need);
        }
        self.null_target = target;
        let ring = self.ring.as_ref().expect("sender has a ring");
        let reserved = ring.reserved();
        let backpressure = ring.backpressure.load(Ordering::Relaxed);
        let app_active = reserved != self.app_reserved_seen || backpressure != self.app_backpressure_seen;
        self.app_reserved_seen = reserved;
        self.app_backpressure_seen = backpressure;
        if app_active || target <= self.next_msg_index || reserved != self.published_slots {
            return false;
        }
        let Some(p) = ring.reserve() else {
            self.app_backpressure_seen = ring.backpressure.load(Ordering::Relaxed);
            return false;
        };
        self.app_reserved_seen = p + 1;
        let run = (target - self.next_msg_index).min(NULL_COUNT_SKIP as u64 - 1) as u32;
        let me = self.row(self.my_rank);
        let off = self.layout.slot_offset(p);
        me.u32_at(off + 8).store(run, Ordering::Relaxed);
        me.u32_at(off + 12).store(0, Ordering::Relaxed);
        ring.commit(p);
        self.counters.add(counters::NULLS_SENT, run as u64);
        self.counters.add(counters::NULL_RUNS, 1);
        true
    }

    // ---- 4. deliver -------------------------------------------------------

    /// min over the view's members of their receive frontier (0 until
    /// every member runs this view).
    pub fn stable(&self) -> u64 {
        if !self.all_tagged {
            return 0;
        }
        // Persistent mode: stable once on every member's disk.
        let (off, mut stable) = if self.mode == DeliveryMode::Persistent {
            (self.layout.persisted_num.offset(), self.persisted_num)
        } else {
            (self.layout.received_frontier.offset(), self.received_frontier)
        };
        let tag = self.layout.smc_view.offset();
        for &rank in &self.view_members {
            if rank != self.my_rank {
                let row = self.row(rank);
                // Acquire: pairs with the Release store of the frontier in
                // the member's `receive` (or of `persisted_num` in its
                // `persist_received`).
                stable = stable.min(row.u64_at(off).load(Ordering::Acquire));
                // A member that moved on to a newer view counts from zero
                // again (same cache line as the frontier: no extra miss).
                // Acquire: pairs with the Release store of `smc_view` in
                // the member's `tag_view`.
                if row.u64_at(tag).load(Ordering::Acquire) != self.view + 1 {
                    return self.delivered_num.min(stable);
                }
            }
        }
        stable
    }

    fn deliver_stable<U: Upcalls + ?Sized>(&mut self, up: &mut U) -> Result<u32, GroupError> {
        let skipped = self.release_received_skips();
        // Nothing received beyond what is delivered: no peer's frontier can
        // make anything deliverable, so do not pull their cache lines.
        if self.received_frontier <= self.delivered_num || !self.refresh_tags() {
            return Ok(skipped);
        }
        let stable = self.stable();
        if stable <= self.delivered_num {
            return Ok(skipped);
        }
        debug_assert!(
            stable <= self.received_frontier,
            "stability: stable {stable} beyond own frontier"
        );
        let senders = self.sender_ranks.len() as u64;
        let end = stable.min(self.delivered_num + DELIVERY_BUDGET_PER_SENDER * senders);
        let delivered = self.deliver_range(end, DELIVERY_BYTES_BUDGET, up)?;
        self.counters.values[counters::STABLE] = stable;
        Ok(delivered + skipped)
    }

    /// Deliver in sequence order from `delivered_num` up to `end` (every
    /// seq below it received), stopping early after `bytes_budget` payload
    /// bytes. Returns the positions passed.
    pub(crate) fn deliver_range<U: Upcalls + ?Sized>(
        &mut self,
        end: u64,
        bytes_budget: u64,
        up: &mut U,
    ) -> Result<u32, GroupError> {
        let senders = self.sender_ranks.len() as u64;
        let start = self.delivered_num;
        let (mut index, mut s) = (start / senders, (start % senders) as usize);
        let (mut delivered, mut bytes, mut delivered_bytes) = (0u64, 0u64, 0u64);
        let fabric = Arc::clone(&self.fabric);
        let mut q = start;
        while q < end {
            let rank = self.sender_ranks[s];
            let row = fabric.row(rank);
            match self.advance_cursor(row, s, index, q) {
                Cursor::Data { off, len, fragment } => {
                    // SAFETY: the slot was published by the guard we loaded with
                    // Acquire when receiving it, and stays ours until we store
                    // released_slots past it (after this callback returns).
                    let payload = unsafe { row.bytes(off + SLOT_HEADER_BYTES, len) };
                    let d = Delivery {
                        view: self.view,
                        sender_rank: rank,
                        sender_index: s,
                        index,
                        seq: q,
                        payload,
                    };
                    if let Some(n) = hand_over(&mut self.large, &mut self.counters, up, &d, fragment) {
                        delivered += 1;
                        delivered_bytes += n as u64;
                    }
                    bytes += len as u64;
                }
                Cursor::Null => up.null_passed(self.view, rank, index),
                Cursor::Overtaken => {
                    // Removed without knowing it yet: the sender's slots
                    // from here on belong to a view this member is not in.
                    // Nothing more is delivered; the membership step that
                    // runs next learns of the removal (see `overtaken`).
                    self.overtaken = true;
                    break;
                }
            }
            q += 1;
            s += 1;
            if s as u64 == senders {
                s = 0;
                index += 1;
            }
            if !self.batching {
                self.delivered_num = q;
                self.store_delivery_progress();
                self.push_progress()?;
            }
            if bytes >= bytes_budget {
                break;
            }
        }
        self.delivered_num = q;
        self.store_delivery_progress();
        self.counters.add(counters::DELIVERY_BATCHES, 1);
        self.counters.add(counters::DELIVERED_MSGS, delivered);
        self.counters.add(counters::DELIVERED_BYTES, delivered_bytes);
        Ok((q - start) as u32)
    }

    /// Release received skip slots at the head of each sender's delivery
    /// cursor. A skip carries no index, so no delivery would ever step over
    /// one that is a sender's last slot; left in place, trailing skips that
    /// fill a window would stall that sender for ever (found by the
    /// simulator: `spindle sim --seed 182 --members 4 --steps 300 --abandon 20`).
    fn release_received_skips(&mut self) -> u32 {
        let mut released = 0u32;
        let fabric = Arc::clone(&self.fabric);
        for s in 0..self.sender_ranks.len() {
            let Some(base) = self.sender_base[s] else { continue };
            let row = fabric.row(self.sender_ranks[s]);
            while self.deliver_slots[s] < self.recv_slots[s]
                && row
                    .u32_at(self.layout.slot_offset(base + self.deliver_slots[s]) + 8)
                    .load(Ordering::Relaxed)
                    == NULL_COUNT_SKIP
            {
                // Persistent mode: the staging cursor passes a skip it
                // stands on too (a released slot may be reused at once).
                if self.append_slots.get(s) == Some(&self.deliver_slots[s]) {
                    self.append_slots[s] += 1;
                }
                self.deliver_slots[s] += 1;
                released += 1;
            }
        }
        if released > 0 {
            self.store_delivery_progress();
        }
        released
    }

    /// Move sender `s`'s delivery cursor to message `index` (global `seq`)
    /// and past it. Returns the data slot's offset and length, or
    /// [`Cursor::Null`] when `index` is a null (skip slots carry no index
    /// and are passed), or [`Cursor::Overtaken`] when the sender has
    /// moved on to a newer view and reused the slot (this member was
    /// removed while it was stopped between computing `stable` and
    /// getting here: a process under SIGSTOP, a VM paused).
    #[inline]
    fn advance_cursor(&mut self, row: RowRef<'_>, s: usize, index: u64, seq: u64) -> Cursor {
        let (cursor, p) = self.locate(row, s, self.deliver_slots[s], index, seq);
        self.deliver_slots[s] = p;
        cursor
    }

    /// Find message `index` (global `seq`) of sender `s` from its slot
    /// `p` on: what it is and the cursor past it (see `advance_cursor`).
    #[inline]
    fn locate(&self, row: RowRef<'_>, s: usize, mut p: u64, index: u64, seq: u64) -> (Cursor, u64) {
        debug_assert!(
            self.sender_base[s].is_some(),
            "stability: delivering from a sender whose base is unknown"
        );
        // Known: this sender's messages were received (stability).
        let base = self.sender_base[s].unwrap_or(0);
        loop {
            if p >= self.recv_slots[s] {
                // Only reused slots (skips the new view wrote) lead here.
                if self.sender_moved_on(row) {
                    return (Cursor::Overtaken, p);
                }
                debug_assert!(false, "stability: seq {seq} delivered before it was received");
            }
            let off = self.layout.slot_offset(base + p);
            let null_count = row.u32_at(off + 8).load(Ordering::Relaxed);
            if null_count == NULL_COUNT_SKIP {
                p += 1;
                continue;
            }
            let first = row.u64_at(off).load(Ordering::Relaxed);
            if null_count == 0 {
                if first != index && self.sender_moved_on(row) {
                    return (Cursor::Overtaken, p);
                }
                assert_eq!(
                    first, index,
                    "total order: sender index {s} slot {p} holds index {first}, seq {seq} needs {index}"
                );
                let len = row.u32_at(off + 12).load(Ordering::Relaxed);
                let fragment = len & LEN_FRAGMENT != 0;
                return (
                    Cursor::Data {
                        off,
                        len: (len & LEN_MASK) as usize,
                        fragment,
                    },
                    p + 1,
                );
            }
            let last = first + null_count as u64 - 1;
            if !(first..=last).contains(&index) && self.sender_moved_on(row) {
                return (Cursor::Overtaken, p);
            }
            debug_assert!(
                index >= first && index <= last,
                "total order: null run {first}..={last} skips {index}"
            );
            return (Cursor::Null, if index == last { p + 1 } else { p });
        }
    }

    fn store_delivery_progress(&self) {
        let me = self.row(self.my_rank);
        // Release: pairs with the Acquire load of `delivered_num` in the
        // membership's `fresh_proposal` (the ragged edge).
        me.u64_at(self.layout.delivered_num.offset())
            .store(self.delivered_num, Ordering::Release);
        for s in 0..self.sender_ranks.len() {
            // Release: pairs with the Acquire load of `released_slots` in
            // the sender's `update_flow_limit` (we are done with its slots).
            me.u64_at(self.layout.released_slots.offset(s))
                .store(self.deliver_slots[s], Ordering::Release);
        }
    }

    pub(crate) fn push_progress(&self) -> Result<(), FabricError> {
        // Not to suspected members: a cut-off peer must not hold up pushes.
        let peers = PeerSet(self.peers.0 & !self.mship.suspected());
        self.fabric.push(self.layout.progress_range(), peers)?;
        self.fabric.doorbell().ring();
        Ok(())
    }

    // ---- 5. flow control --------------------------------------------------

    fn update_flow_limit(&mut self, si: usize) {
        // Read the members' release counters only when the window is at
        // least half used: they live on lines the members keep writing.
        let ring = self.ring.as_ref().expect("sender ring");
        if !self.track_acks && ring.reserved() + (self.layout.window_slots as u64 / 2) < self.flow_limit {
            return;
        }
        if !self.refresh_tags() {
            return;
        }
        let off = self.layout.released_slots.offset(si);
        let mut released = u64::MAX;
        for &rank in &self.view_members {
            // Acquire: pairs with the Release stores of `released_slots` in
            // `store_delivery_progress` / `receive_from` of each member.
            released = released.min(self.row(rank).u64_at(off).load(Ordering::Acquire));
        }
        let limit = self.my_base + released + self.layout.window_slots as u64;
        if limit > self.flow_limit {
            self.flow_limit = limit;
            self.ring.as_ref().expect("sender ring").set_limit(limit);
        }
    }

    // ---- liveness and observability --------------------------------------

    fn check_peers(&mut self) -> Result<(), GroupError> {
        match self.fabric.check_peers() {
            Ok(()) => Ok(()),
            Err(FabricError::PeerGone { rank }) | Err(FabricError::PeerLeft { rank }) => {
                if self.peer_finished(rank) {
                    self.finished_peers.0 |= 1 << rank;
                    Ok(())
                } else {
                    Err(GroupError::MemberGone { rank })
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn peer_finished(&self, rank: usize) -> bool {
        // Acquire: pairs with the Release store in the peer's `set_finished`.
        self.row(rank)
            .u64_at(self.layout.finished.offset())
            .load(Ordering::Acquire)
            != 0
    }

    /// Mark this member finished (it has all it wants and will leave).
    pub fn set_finished(&self) -> Result<(), FabricError> {
        let off = self.layout.finished.offset();
        // Release: pairs with the Acquire load in peers' `peer_finished`
        // (`check_peers`, `all_finished`, the membership's `detect`): it
        // publishes the delivery progress stored before it, pushed with it.
        self.row(self.my_rank).u64_at(off).store(1, Ordering::Release);
        self.push_progress_all()
    }

    fn push_progress_all(&self) -> Result<(), FabricError> {
        let start = self.layout.received_frontier.offset();
        self.fabric.push(start..self.layout.progress_range().end, self.peers)?;
        self.fabric.doorbell().ring();
        Ok(())
    }

    /// Whether every member of the view has marked itself finished.
    pub fn all_finished(&self) -> bool {
        // A restart's history is handed over in full before a finish.
        self.replay.is_none() && self.view_members.iter().all(|&r| self.peer_finished(r))
    }

    /// Copy the private counters into the row for `spindle stat`.
    pub(crate) fn flush_counters(&mut self) {
        if let Some(ring) = &self.ring {
            self.counters.values[counters::BACKPRESSURE] = ring.backpressure.load(Ordering::Relaxed);
        }
        let me = self.row(self.my_rank);
        for (id, value) in self.counters.values.iter().enumerate() {
            me.u64_at(self.layout.counters.offset(id))
                .store(*value, Ordering::Relaxed);
        }
    }

    pub fn record_idle(&mut self, parks: u64, yields: u64) {
        self.counters.values[counters::PARKS] = parks;
        self.counters.values[counters::YIELDS] = yields;
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn positions(&self) -> Positions {
        Positions {
            published_slots: self.published_slots,
            next_msg_index: self.next_msg_index,
            received_num: self.recv_msgs.clone(),
            received_frontier: self.received_frontier,
            stable: self.stable(),
            delivered_num: self.delivered_num,
        }
    }
}

/// Drop every half-assembled large message at the end of `view` (whose
/// sender index `s` is rank `ranks[s]`) and tell the application of each.
pub(crate) fn cut_partials<U: Upcalls + ?Sized>(
    large: &mut Reassembly,
    counters: &mut Counters,
    up: &mut U,
    view: u64,
    ranks: &[usize],
) {
    for (s, cut) in large.drop_partials() {
        counters.add(counters::LARGE_MSGS_CUT, 1);
        up.large_message_cut(view, ranks[s], cut.message_id, cut.len_bytes);
    }
}

/// Hand one delivered data slot to the application: a message as it is,
/// a fragment of a large message to the reassembly (see [`crate::large`]),
/// which hands over the whole message at its last fragment (or, to an
/// application that takes fragments, each fragment in place). Returns the
/// bytes delivered, or `None` when nothing was (a fragment taken or
/// passed over: it passes as a null, so every index is accounted for).
#[inline]
fn hand_over<U: Upcalls + ?Sized>(
    large: &mut Reassembly,
    counters: &mut Counters,
    up: &mut U,
    d: &Delivery<'_>,
    fragment: bool,
) -> Option<usize> {
    if !fragment {
        up.deliver(d);
        return Some(d.payload.len());
    }
    let (taken, cut) = large.take(d.sender_index, d.payload, up.takes_fragments());
    if let Some(cut) = cut {
        counters.add(counters::LARGE_MSGS_CUT, 1);
        up.large_message_cut(d.view, d.sender_rank, cut.message_id, cut.len_bytes);
    }
    match taken {
        Fragment::Complete(whole) => {
            counters.add(counters::LARGE_MSGS, 1);
            up.deliver(&Delivery { payload: whole, ..*d });
            Some(whole.len())
        }
        Fragment::InPlace {
            message_id,
            total_len,
            offset,
            data,
        } => {
            let f = FragmentDelivery {
                view: d.view,
                sender_rank: d.sender_rank,
                sender_index: d.sender_index,
                index: d.index,
                seq: d.seq,
                message_id,
                total_len,
                offset,
                data,
            };
            up.deliver_fragment(&f);
            if f.is_last() {
                counters.add(counters::LARGE_MSGS, 1);
                return Some(total_len as usize);
            }
            up.null_passed(d.view, d.sender_rank, d.index);
            None
        }
        Fragment::Pending | Fragment::PassedOver => {
            up.null_passed(d.view, d.sender_rank, d.index);
            None
        }
    }
}
