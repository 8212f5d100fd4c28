//! Membership: Derecho's view change, driven from [`GroupCore::step`].
//!
//! A view is a set of ranks of the fabric (its *capacity*); ranks outside
//! the view may join, members may leave or fail. Every member publishes a
//! [`MembershipLine`] and a [`ProposalLine`] in its row (see
//! [`crate::layout`]) and runs, per pass while a change is under way (and
//! every heartbeat interval otherwise):
//!
//! ```text
//!  detect   heartbeat stalled > suspect_timeout, or the fabric lost it  → suspected
//!  spread   suspected |= what every unsuspected member suspects
//!  wedge    any suspicion, join/leave request or wedged peer → stop sending,
//!           receiving and delivering; publish counters, then `wedged`
//!  leader   lowest unsuspected member; once every survivor is wedged:
//!           adopt the proposal with the lowest origin that any survivor
//!           acknowledged, else propose: members − suspected − leavers +
//!           joiners, final_seq = max(min frontier, max delivered) over survivors
//!  ack      every member copies the leader's proposal and acknowledges it
//!  commit   the leader, once every survivor acknowledged the same proposal
//!  install  everyone who sees a commit (or a member already in the next
//!           view): deliver exactly seq < final_seq (ragged-edge cleanup),
//!           snapshot for joiners, zero the SMC counters, enter the view
//! ```
//!
//! Safety arguments, each guarded by an assertion or a checker:
//!
//! - **Virtual synchrony.** Survivors stop receiving and delivering when
//!   they wedge, and publish their frontier and `delivered_num` before the
//!   `wedged` flag, so the leader, which reads them after seeing `wedged`,
//!   sees final values. Every survivor has received every seq below the
//!   min frontier, and every seq anyone delivered was stable, hence
//!   received by all: every survivor can deliver exactly `seq < final_seq`.
//! - **One membership per view id.** Only a leader commits, and only a
//!   proposal every survivor holds. A new leader adopts the proposal with
//!   the lowest origin any survivor holds, unchanged, and a member never
//!   trades a held proposal for one of a higher origin: a proposal that
//!   may have been committed is the one every later leader adopts.
//! - **No split brain.** A view needs a majority of the previous one: a
//!   member that cannot reach one stops with
//!   [`GroupError::MinorityPartition`].
//! - **Ring reuse.** Ring positions go on across views; a member sends in
//!   the new view from its `base_slot`, and flow control and stability
//!   wait until every member runs the new view (`smc_view`), so no slot a
//!   slow member still delivers from is overwritten.

use std::mem::offset_of;

use spindle_fabric::{Fabric, FabricError, PeerSet};

use crate::config::{DeliveryMode, GroupConfig};
use crate::core::{Delivery, GroupCore};
use crate::counters;
use crate::layout::{MembershipLine, ProposalLine, REQUEST_JOIN, REQUEST_LEAVE};
use crate::sync::Ordering;
use crate::GroupError;

/// What the application is told: deliveries, views, and the state a
/// joiner needs. Every method but `deliver` has a default.
pub trait Upcalls {
    /// One delivered message (the payload is valid during the call).
    fn deliver(&mut self, d: &Delivery<'_>);
    /// Ordered delivery passed a null: position `index` of `sender_rank`'s
    /// stream in `view` carried no message (a sender behind the round-robin
    /// order fills its indices with nulls). Together with the deliveries,
    /// these account for every index of every sender, so a log that
    /// records both can prove it has no gaps. Called once per null index,
    /// in total order; the default ignores it.
    fn null_passed(&mut self, _view: u64, _sender_rank: usize, _index: u64) {}
    /// Large message `message_id` of `sender_rank` (see
    /// [`crate::LargeSend::message_id`]), `len_bytes` long, begun in
    /// `view`, is delivered nowhere: a view change cut it (every member of
    /// the view drops it alike, see [`crate::large`]), or its sender
    /// dropped its [`crate::LargeSend`] half way. The sender (a member
    /// too) is told as well: send it again. The default ignores it.
    fn large_message_cut(&mut self, _view: u64, _sender_rank: usize, _message_id: u64, _len_bytes: u64) {}
    /// Whether this application takes large messages fragment by
    /// fragment, in place, with [`Upcalls::deliver_fragment`] instead of
    /// whole with [`Upcalls::deliver`]: no reassembly buffer is written,
    /// so the message's bytes are read once, where the transport put
    /// them (see [`crate::large`]). The answer at a message's first
    /// fragment decides for the whole message; keep it fixed. The
    /// default says no.
    fn takes_fragments(&self) -> bool {
        false
    }
    /// One fragment of a large message, in total order, its bytes in
    /// place and valid during the call (only when
    /// [`Upcalls::takes_fragments`]). The message is delivered with its
    /// last fragment ([`crate::large::FragmentDelivery::is_last`]);
    /// until then its fragments are staged, and a
    /// [`Upcalls::large_message_cut`] of it says to drop them. Every
    /// member of the view is handed the same fragments and cuts. The
    /// fragments before the last also pass as nulls
    /// ([`Upcalls::null_passed`]), as they do for a whole delivery.
    fn deliver_fragment(&mut self, _f: &crate::large::FragmentDelivery<'_>) {}
    /// A new view was installed (after the old view's last delivery and
    /// before the new view's first).
    fn view_installed(&mut self, _view: &View) {}
    /// The state after every delivery so far, for a joiner.
    fn snapshot(&mut self, _out: &mut Vec<u8>) {}
    /// Start from a snapshot (a joiner, before its first delivery; a
    /// member restarted over a compacted log, before its history).
    fn restore(&mut self, _snapshot: &[u8]) -> Result<(), String> {
        Ok(())
    }
    /// Whether [`Upcalls::snapshot`] captures the application's whole
    /// state, so that a log may be compacted to it
    /// (`GroupConfig::compact_log_bytes`, [`crate::Group::compact_log`]).
    /// The default says no: compacting to an empty snapshot would lose
    /// the history.
    fn takes_snapshots(&self) -> bool {
        false
    }
    /// Answer a point-to-point query from another member (a read sent
    /// to this replica: see [`crate::query`]): fill `reply` from this
    /// member's state (at most [`crate::query::QUERY_PAYLOAD_BYTES_MAX`]
    /// bytes), or say why not. It runs between deliveries, on the thread
    /// that polls. The default answers none.
    fn query(&mut self, _request: &[u8], _reply: &mut Vec<u8>) -> Result<(), String> {
        Err("this member's application answers no queries (it does not implement Upcalls::query)".into())
    }
}

/// A delivery closure is the [`Upcalls`] of a group that only delivers
/// (no view-change hook, an empty snapshot): `group.poll(&mut |d: &Delivery<'_>| …)`.
impl<D: FnMut(&Delivery<'_>)> Upcalls for D {
    #[inline(always)]
    fn deliver(&mut self, d: &Delivery<'_>) {
        self(d)
    }
}

/// A view: an epoch id and its members (ranks of the fabric).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub id: u64,
    pub members: Vec<usize>,
    /// The members that send, in the order that defines `seq`.
    pub senders: Vec<usize>,
    /// Members new in this view.
    pub joined: Vec<usize>,
    /// Members of the previous view that are not in this one.
    pub departed: Vec<usize>,
    /// The previous view delivered exactly its messages with seq below this.
    pub prev_final_seq: u64,
}

/// A proposed next view (the fields of a [`ProposalLine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Proposal {
    next_view: u64,
    next_members: u64,
    origin: u64,
    final_seq: u64,
    joiners: u64,
}

/// A member's private membership state.
pub(crate) struct MembershipState {
    pub(crate) enabled: bool,
    suspect_timeout_ns: u64,
    snapshot_bytes_max: usize,
    /// Last heartbeat seen per rank, and when it last moved.
    hb_seen: Vec<u64>,
    hb_moved_ns: Vec<u64>,
    /// What this member published as `suspected`.
    suspected: u64,
    pub(crate) wedged: bool,
    /// The proposal in this member's own proposal line for the next view.
    held: Option<Proposal>,
    committed: bool,
    leaving: bool,
    pub(crate) joining: bool,
    /// The newest view a joiner saw when it asked (older commits are not its).
    join_seen_view: u64,
    pub(crate) left: bool,
    /// A joiner in view `w` waits for its snapshot before running it.
    pub(crate) awaiting_snapshot: Option<(u64, usize)>,
    snapshot_buf: Vec<u8>,
    pub(crate) current: View,
    /// Installs not yet reported through `view_installed`.
    pending_upcall: bool,
    /// Following an outer group's view ([`GroupCore::follow_view`]): the
    /// members that view has left out. This member suspects exactly
    /// those, and the outer group's majority rule stands for its own.
    authority: Option<u64>,
}

impl MembershipState {
    pub(crate) fn new(config: &GroupConfig) -> MembershipState {
        MembershipState {
            enabled: config.membership,
            suspect_timeout_ns: config.suspect_timeout.as_nanos() as u64,
            snapshot_bytes_max: config.snapshot_bytes_max,
            hb_seen: vec![0; config.members],
            hb_moved_ns: vec![0; config.members],
            suspected: 0,
            wedged: false,
            held: None,
            committed: false,
            leaving: false,
            joining: false,
            join_seen_view: 0,
            left: false,
            awaiting_snapshot: None,
            snapshot_buf: Vec::new(),
            current: View::default(),
            pending_upcall: false,
            authority: None,
        }
    }

    /// Whether a change is under way (run the protocol every pass).
    #[inline(always)]
    pub(crate) fn busy(&self) -> bool {
        self.wedged || self.joining || self.awaiting_snapshot.is_some()
    }

    /// Ranks this member suspects in its current view.
    #[inline(always)]
    pub(crate) fn suspected(&self) -> u64 {
        self.suspected
    }

    /// Report the first view, before the first delivery of the first pass.
    #[inline(always)]
    pub(crate) fn report_first_view<U: Upcalls + ?Sized>(&mut self, up: &mut U) {
        if self.pending_upcall {
            self.pending_upcall = false;
            up.view_installed(&self.current);
        }
    }
}

fn mask_ranks(mask: u64) -> Vec<usize> {
    PeerSet(mask).iter().collect()
}

const M_INSTALLED: usize = offset_of!(MembershipLine, installed_view);
const M_MEMBERS: usize = offset_of!(MembershipLine, members);
const M_PREV_FINAL: usize = offset_of!(MembershipLine, prev_final_seq);
const M_SUSPECTED: usize = offset_of!(MembershipLine, suspected);
const M_WEDGED: usize = offset_of!(MembershipLine, wedged);
const M_ACK: usize = offset_of!(MembershipLine, ack_view);
const M_COMMIT: usize = offset_of!(MembershipLine, commit_view);
const M_REQUEST: usize = offset_of!(MembershipLine, request);
const P_NEXT_VIEW: usize = offset_of!(ProposalLine, next_view);
const P_NEXT_MEMBERS: usize = offset_of!(ProposalLine, next_members);
const P_ORIGIN: usize = offset_of!(ProposalLine, origin);
const P_FINAL_SEQ: usize = offset_of!(ProposalLine, final_seq);
const P_JOINERS: usize = offset_of!(ProposalLine, joiners);
const P_SNAPSHOT_VIEW: usize = offset_of!(ProposalLine, snapshot_view);
const P_VERSION: usize = offset_of!(ProposalLine, version);

/// A consistent copy of a member's two membership lines.
#[derive(Clone, Copy, Debug)]
struct MRow {
    installed: u64,
    members: u64,
    prev_final_seq: u64,
    ack: u64,
    commit: u64,
    proposal: Proposal,
}

impl<F: Fabric> GroupCore<F> {
    // ---- row access ---------------------------------------------------------

    #[inline]
    fn m_load(&self, rank: usize, field: usize) -> u64 {
        // Acquire: pairs with the Release stores in `m_store` of the row's
        // owner (what it stored before the field: e.g. its proposal before
        // `M_ACK`); in `read_row` it also keeps the closing version load
        // after this one (the membership seqlock).
        self.row(rank).u64_at(self.layout.mship(field)).load(Ordering::Acquire)
    }

    fn m_store(&self, field: usize, value: u64) {
        // Release: pairs with the Acquire loads in `m_load` of every peer
        // (publishes what this member stored before the field).
        self.row(self.my_rank)
            .u64_at(self.layout.mship(field))
            .store(value, Ordering::Release);
    }

    fn p_load(&self, rank: usize, field: usize) -> u64 {
        // Acquire: pairs with the Release stores in `p_store` of the row's
        // owner (the seqlock version and the proposal fields of `update`);
        // in `read_row` it also keeps the closing version load after it.
        self.row(rank)
            .u64_at(self.layout.proposal(field))
            .load(Ordering::Acquire)
    }

    fn p_store(&self, field: usize, value: u64) {
        // Release: pairs with the Acquire loads in `p_load` of every peer:
        // the odd version before the fields, the fields, then the even
        // version after them (the seqlock of `update` / `read_row`).
        self.row(self.my_rank)
            .u64_at(self.layout.proposal(field))
            .store(value, Ordering::Release);
    }

    /// Push both membership lines to every rank (joiners included) but the
    /// ones this member suspects (a cut-off peer must not hold up pushes).
    fn push_membership(&self) -> Result<(), FabricError> {
        let peers = PeerSet(self.everyone.0 & !self.mship.suspected);
        self.fabric.push(self.layout.membership_range(), peers)?;
        self.fabric.doorbell().ring();
        Ok(())
    }

    /// Rewrite membership fields under the seqlock: the version turns odd
    /// (pushed alone), the fields are written and pushed, the version turns
    /// even (pushed alone). Bytes of one push may land in any order, but
    /// pushes land in order, so a reader that saw any new field sees an
    /// odd or newer version after it ([`Self::read_row`]).
    ///
    /// The odd and the even version go out **alone** (the version word,
    /// not the lines): a peer that missed earlier pushes (it was
    /// suspected, so pushes skipped it) must not get fields it never saw
    /// in the same push as the version, where its bytes could land before
    /// the version's and pass for consistent. Found by the simulator (seed
    /// 32445: a removed member read `installed` of the next view with the
    /// old `members` and took itself for a member of that view: split
    /// brain).
    fn update(&mut self, write: impl FnOnce(&mut Self)) -> Result<(), FabricError> {
        let version = self.p_load(self.my_rank, P_VERSION);
        debug_assert!(version.is_multiple_of(2), "membership seqlock: nested update");
        self.p_store(P_VERSION, version + 1);
        self.push_version()?;
        write(self);
        self.push_membership()?;
        self.p_store(P_VERSION, version + 2);
        self.push_version()
    }

    /// Push the seqlock's version word alone (see [`Self::update`]).
    fn push_version(&self) -> Result<(), FabricError> {
        let peers = PeerSet(self.everyone.0 & !self.mship.suspected);
        let off = self.layout.proposal(P_VERSION);
        self.fabric.push(off..off + 8, peers)?;
        self.fabric.doorbell().ring();
        Ok(())
    }

    /// `rank`'s membership lines, if they were not being rewritten.
    fn read_row(&self, rank: usize) -> Option<MRow> {
        let before = self.p_load(rank, P_VERSION);
        if !before.is_multiple_of(2) {
            return None;
        }
        let row = MRow {
            installed: self.m_load(rank, M_INSTALLED),
            members: self.m_load(rank, M_MEMBERS),
            prev_final_seq: self.m_load(rank, M_PREV_FINAL),
            ack: self.m_load(rank, M_ACK),
            commit: self.m_load(rank, M_COMMIT),
            proposal: Proposal {
                next_view: self.p_load(rank, P_NEXT_VIEW),
                next_members: self.p_load(rank, P_NEXT_MEMBERS),
                origin: self.p_load(rank, P_ORIGIN),
                final_seq: self.p_load(rank, P_FINAL_SEQ),
                joiners: self.p_load(rank, P_JOINERS),
            },
        };
        // Acquire (in `p_load`): pairs with the Release store of the even
        // version in `update`; the Acquire loads above keep this load after
        // them, so a reader that saw any rewritten field sees the version move.
        (self.p_load(rank, P_VERSION) == before).then_some(row)
    }

    /// The proposal `rank` acknowledged for view `next`, read consistently
    /// (the owner writes the fields before `ack_view`; re-checked after).
    fn proposal_of(&self, rank: usize, next: u64) -> Option<Proposal> {
        let row = self.read_row(rank)?;
        (row.ack == next && row.proposal.next_view == next).then_some(row.proposal)
    }

    /// Write `p` into the own proposal line and acknowledge it.
    fn hold(&mut self, p: Proposal) -> Result<(), FabricError> {
        self.update(|c| {
            c.p_store(P_NEXT_VIEW, p.next_view);
            c.p_store(P_NEXT_MEMBERS, p.next_members);
            c.p_store(P_ORIGIN, p.origin);
            c.p_store(P_FINAL_SEQ, p.final_seq);
            c.p_store(P_JOINERS, p.joiners);
            c.m_store(M_ACK, p.next_view);
        })?;
        self.mship.held = Some(p);
        Ok(())
    }

    // ---- start --------------------------------------------------------------

    /// Enter view 0 with `initial` members.
    pub(crate) fn start_first_view(&mut self, first_view: u64, initial: &[usize]) -> Result<(), GroupError> {
        self.enter_view(first_view, initial);
        let mask = self.view_mask;
        self.update(|c| {
            c.m_store(M_MEMBERS, mask);
            c.m_store(M_INSTALLED, first_view);
            c.m_store(M_COMMIT, first_view);
        })?;
        self.tag_view()?;
        self.mship.current = View {
            id: first_view,
            members: initial.to_vec(),
            senders: self.sender_ranks.clone(),
            joined: initial.to_vec(),
            departed: Vec::new(),
            prev_final_seq: 0,
        };
        self.mship.pending_upcall = true;
        Ok(())
    }

    /// Not in the first view: ask to join (see [`Self::join_step`]).
    pub(crate) fn start_joining(&mut self) -> Result<(), GroupError> {
        if !self.mship.enabled {
            return Err(GroupError::Config(format!(
                "rank {} is not in initial_members and membership is off: it cannot join",
                self.my_rank
            )));
        }
        self.mship.joining = true;
        self.mship.join_seen_view = self.newest_view_seen();
        self.update(|c| {
            c.m_store(M_MEMBERS, 0);
            c.m_store(M_REQUEST, REQUEST_JOIN);
        })?;
        Ok(())
    }

    /// The newest view any live rank has installed.
    fn newest_view_seen(&self) -> u64 {
        let alive = self.fabric.joined().0 & !self.fabric.lost_peers().0;
        PeerSet(alive & self.everyone.0)
            .iter()
            .filter_map(|r| self.read_row(r))
            .filter(|row| row.members != 0)
            .map(|row| row.installed)
            .max()
            .unwrap_or(0)
    }

    /// Ask to leave: the next view will not include this member, which
    /// then reports [`GroupCore::has_left`].
    pub fn request_leave(&mut self) -> Result<(), GroupError> {
        self.mship.leaving = true;
        let request = self.m_load(self.my_rank, M_REQUEST) | REQUEST_LEAVE;
        self.update(|c| c.m_store(M_REQUEST, request))?;
        Ok(())
    }

    /// Whether this member left the group (after [`Self::request_leave`]).
    pub fn has_left(&self) -> bool {
        self.mship.left
    }

    /// Whether this member is waiting to be admitted.
    pub fn is_joining(&self) -> bool {
        self.mship.joining || self.mship.awaiting_snapshot.is_some()
    }

    /// Follow an outer group's view, as a shard follows the top-level
    /// group (Derecho's subgroup views, which are cut from the top-level
    /// one): `Some(left_out)`, the members (ranks shared with this group)
    /// that the outer view has left out. From the next failure check on,
    /// this member suspects exactly the members of its view that are
    /// left out, not those whose heartbeat stalls or whose process is
    /// gone, and the majority rule is the outer group's (one member of a
    /// shard of two goes on when the top-level view says the other is
    /// out). A member the outer view has not heard of yet (a joiner this
    /// member's outer view lags behind) is not left out. Every member of
    /// this group must follow the same outer group. `None`: decide alone
    /// again.
    pub fn follow_view(&mut self, left_out: Option<&[usize]>) {
        self.mship.authority = left_out.map(|m| m.iter().fold(0u64, |mask, r| mask | (1u64 << r)));
    }

    // ---- the protocol -------------------------------------------------------

    /// One pass of the membership protocol. `timed`: a heartbeat interval
    /// has passed (detect failures and look for requests).
    pub(crate) fn membership_step<U: Upcalls + ?Sized>(
        &mut self,
        now_ns: u64,
        timed: bool,
        up: &mut U,
    ) -> Result<u32, GroupError> {
        if self.mship.left {
            return Ok(0);
        }
        if timed {
            self.push_progress()?;
            self.push_membership()?;
        }
        if self.mship.joining {
            return self.join_step(up);
        }
        if let Some((view, provider)) = self.mship.awaiting_snapshot {
            return self.receive_snapshot(view, provider, up);
        }
        let v = self.view;
        let next = v + 1;
        if timed {
            self.detect(now_ns)?;
        }
        let suspected = self.spread_suspicion()?;
        // A member already in the next view, or a committed proposal:
        // install it (the leader may have died after committing).
        if let Some(p) = self.committed_elsewhere(next)? {
            return self.install(p, up).map(|_| 1);
        }
        if !self.mship.wedged {
            let pending = suspected != 0
                || self.view_members.iter().any(|&r| {
                    r != self.my_rank
                        && (self.m_load(r, M_WEDGED) == next || self.m_load(r, M_REQUEST) & REQUEST_LEAVE != 0)
                })
                || self.mship.leaving
                || (timed && self.join_requests() != 0);
            if !pending {
                return Ok(0);
            }
            self.wedge()?;
        }
        let survivors = self.view_mask & !suspected;
        // No split brain: a majority of the view, or (following an outer
        // group) the outer view's verdict, decided by its majority.
        if self.mship.authority.is_none() && survivors.count_ones() * 2 <= self.view_mask.count_ones() {
            return Err(GroupError::MinorityPartition {
                rank: self.my_rank,
                view: v,
                reachable: mask_ranks(survivors),
                members: self.view_members.clone(),
            });
        }
        let leader = survivors.trailing_zeros() as usize;
        let mut work = 0;
        if leader == self.my_rank {
            work += self.lead(next, survivors, suspected)?;
            if self.mship.committed {
                let p = self.mship.held.expect("a committed proposal is held");
                self.install(p, up)?;
                return Ok(1);
            }
        } else if let Some(p) = self.proposal_of(leader, next) {
            match self.mship.held {
                Some(h) if h == p => {}
                // Keep a proposal of a lower origin: it may have been
                // committed, and the leader will adopt it from this row.
                Some(h) if h.origin < p.origin => {}
                _ => {
                    self.hold(p)?;
                    work += 1;
                }
            }
        }
        Ok(work)
    }

    /// Suspect members whose heartbeat stalled or whose process the
    /// fabric lost (a member that finished and left is not suspected).
    fn detect(&mut self, now_ns: u64) -> Result<(), GroupError> {
        let lost = self.fabric.lost_peers().0;
        let hb_off = self.layout.heartbeat.offset();
        let mut newly = 0u64;
        for &r in &self.view_members {
            if r == self.my_rank || self.mship.suspected & (1 << r) != 0 || self.peer_finished(r) {
                continue;
            }
            // Acquire: no Release partner (the owner bumps its heartbeat with
            // a Relaxed fetch_add in `step`): only the count's movement
            // matters here, nothing is published with it.
            let hb = self.row(r).u64_at(hb_off).load(Ordering::Acquire);
            if hb != self.mship.hb_seen[r] || self.mship.hb_moved_ns[r] == 0 {
                self.mship.hb_seen[r] = hb;
                self.mship.hb_moved_ns[r] = now_ns.max(1);
            }
            let stalled = now_ns.saturating_sub(self.mship.hb_moved_ns[r]) > self.mship.suspect_timeout_ns;
            let out = match self.mship.authority {
                Some(left_out) => left_out & (1 << r) != 0,
                None => lost & (1 << r) != 0 || stalled,
            };
            if out {
                newly |= 1 << r;
            }
        }
        if newly != 0 {
            self.counters.add(counters::SUSPICIONS, newly.count_ones() as u64);
            self.mship.suspected |= newly;
            let suspected = self.mship.suspected;
            self.update(|c| c.m_store(M_SUSPECTED, suspected))?;
        }
        Ok(())
    }

    /// Merge what unsuspected members suspect; stop if one suspects us.
    fn spread_suspicion(&mut self) -> Result<u64, GroupError> {
        let mut suspected = self.mship.suspected;
        loop {
            let mut grew = false;
            for &r in &self.view_members {
                if r == self.my_rank || suspected & (1 << r) != 0 {
                    continue;
                }
                let theirs = self.m_load(r, M_SUSPECTED) & self.view_mask;
                // Only suspicions raised in this view count.
                if self.m_load(r, M_INSTALLED) != self.view {
                    continue;
                }
                if theirs & (1 << self.my_rank) != 0 {
                    return Err(GroupError::Removed {
                        rank: self.my_rank,
                        view: self.view,
                        by: r,
                    });
                }
                if theirs & !suspected != 0 {
                    suspected |= theirs;
                    grew = true;
                }
            }
            if !grew {
                break;
            }
        }
        if suspected != self.mship.suspected {
            self.mship.suspected = suspected;
            self.update(|c| c.m_store(M_SUSPECTED, suspected))?;
        }
        Ok(suspected)
    }

    /// Ranks outside the view that ask to join and are alive.
    fn join_requests(&self) -> u64 {
        let outside = self.fabric.joined().0 & !self.fabric.lost_peers().0 & !self.view_mask;
        PeerSet(outside & self.everyone.0)
            .iter()
            .filter(|&r| self.m_load(r, M_REQUEST) & REQUEST_JOIN != 0 && self.m_load(r, M_MEMBERS) == 0)
            .fold(0u64, |m, r| m | 1 << r)
    }

    /// A proposal for `next` that is committed somewhere, or the next view
    /// as installed by a member already in it.
    fn committed_elsewhere(&self, next: u64) -> Result<Option<Proposal>, GroupError> {
        for &r in &self.view_members {
            if r == self.my_rank {
                continue;
            }
            let Some(row) = self.read_row(r) else { continue };
            if row.installed > next && row.members != 0 {
                return Err(GroupError::FellBehind {
                    rank: self.my_rank,
                    view: self.view,
                    group_view: row.installed,
                });
            }
            if row.installed == next && row.members != 0 {
                return Ok(Some(Proposal {
                    next_view: next,
                    next_members: row.members,
                    origin: r as u64,
                    final_seq: row.prev_final_seq,
                    joiners: row.members & !self.view_mask,
                }));
            }
            if row.commit == next && row.ack == next && row.proposal.next_view == next {
                return Ok(Some(row.proposal));
            }
        }
        Ok(None)
    }

    /// Stop sending, receiving and delivering; publish the final counters,
    /// then `wedged` (the leader reads the counters after the flag).
    fn wedge(&mut self) -> Result<(), GroupError> {
        self.mship.wedged = true;
        self.push_progress()?;
        let wedged = self.view + 1;
        self.update(|c| c.m_store(M_WEDGED, wedged))?;
        Ok(())
    }

    /// The leader's part: propose (or adopt) once every survivor is
    /// wedged; commit once every survivor holds the proposal.
    fn lead(&mut self, next: u64, survivors: u64, suspected: u64) -> Result<u32, GroupError> {
        if self.mship.committed {
            return Ok(0);
        }
        let wedged_all = PeerSet(survivors)
            .iter()
            .all(|r| self.m_load(r, M_WEDGED) == self.view + 1);
        if !wedged_all {
            return Ok(0);
        }
        // Adopt the lowest-origin proposal any survivor holds.
        let adopted = PeerSet(survivors)
            .iter()
            .filter_map(|r| self.proposal_of(r, next))
            .min_by_key(|p| p.origin);
        let me = self.my_rank as u64;
        let proposal = match adopted {
            Some(p) if p.origin != me => p,
            Some(mut p) => {
                // Our own, not committed: drop members suspected since.
                p.next_members &= !suspected;
                p.joiners &= p.next_members;
                p
            }
            None => self.fresh_proposal(next, survivors),
        };
        let mut work = 0;
        if self.mship.held != Some(proposal) {
            self.hold(proposal)?;
            work += 1;
        }
        let all_hold = PeerSet(survivors)
            .iter()
            .all(|r| self.proposal_of(r, next) == Some(proposal));
        if all_hold {
            self.update(|c| c.m_store(M_COMMIT, next))?;
            self.mship.committed = true;
            work += 1;
        }
        Ok(work)
    }

    /// A new proposal: survivors minus leavers plus joiners; the ragged
    /// edge is `max(min frontier, max delivered)` over the survivors (the
    /// receive frontier; in persistent mode the persisted one).
    fn fresh_proposal(&self, next: u64, survivors: u64) -> Proposal {
        let tag = self.view + 1;
        let mut min_frontier = u64::MAX;
        let mut max_delivered = 0u64;
        let mut leavers = 0u64;
        let frontier_column = if self.mode == DeliveryMode::Persistent {
            self.layout.persisted_num.offset()
        } else {
            self.layout.received_frontier.offset()
        };
        for r in PeerSet(survivors).iter() {
            let row = self.row(r);
            // Acquire: pairs with the Release store of `smc_view` in the
            // member's `tag_view` (its progress counters are of this view).
            let (frontier, delivered) = if row.u64_at(self.layout.smc_view.offset()).load(Ordering::Acquire) == tag {
                (
                    // Acquire: pairs with the Release store of the frontier
                    // in the member's `receive` (persistent mode: of
                    // `persisted_num` in its `persist_received`, so that
                    // the edge is on every survivor's disk already and a
                    // restart from any survivor's log finds all of it).
                    row.u64_at(frontier_column).load(Ordering::Acquire),
                    // Acquire: pairs with the Release store of
                    // `delivered_num` in the member's `store_delivery_progress`.
                    row.u64_at(self.layout.delivered_num.offset()).load(Ordering::Acquire),
                )
            } else {
                (0, 0)
            };
            min_frontier = min_frontier.min(frontier);
            max_delivered = max_delivered.max(delivered);
            if self.m_load(r, M_REQUEST) & REQUEST_LEAVE != 0 {
                leavers |= 1 << r;
            }
        }
        let joiners = self.join_requests();
        Proposal {
            next_view: next,
            next_members: (survivors & !leavers) | joiners,
            origin: self.my_rank as u64,
            final_seq: min_frontier.max(max_delivered),
            joiners,
        }
    }

    /// Install the next view `p`: ragged-edge cleanup, snapshot for the
    /// joiners, counters from zero, then the view-change upcall.
    fn install<U: Upcalls + ?Sized>(&mut self, p: Proposal, up: &mut U) -> Result<(), GroupError> {
        let old_mask = self.view_mask;
        let staying = p.next_members & (1 << self.my_rank) != 0;
        let joiner = old_mask & (1 << self.my_rank) == 0;
        if !staying {
            // Removed or left: no ragged edge for it (it delivered a
            // prefix). The next view's members do not wait for it before
            // reusing ring slots it never delivered from.
            self.mship.left = true;
            self.mship.wedged = false;
            // Persistent mode: its log says that the group went on without
            // it (the committed view, members and all, synced), so that a
            // restart after a total failure that finds this log knows of
            // the view even when every member of it joined a running group
            // and takes no part in the restart (`restart::plan` then
            // refuses rather than rebuild from this older history). A view
            // of nobody (the last member left) has no history to lose.
            if self.mode == DeliveryMode::Persistent && !joiner && p.next_members != 0 {
                let rank = self.my_rank;
                if let Some(log) = self.persist.as_mut() {
                    log.install_view(p.next_view, self.view, p.final_seq, p.next_members)
                        .map_err(|reason| GroupError::Persist { rank, reason })?;
                }
            }
            if self.mship.leaving {
                return Ok(());
            }
            return Err(GroupError::Removed {
                rank: self.my_rank,
                view: p.next_view,
                by: p.origin as usize,
            });
        }
        // Persistent mode: the log gets what it lacks of the old view up to
        // the edge, then the view record, synced before the edge is
        // delivered (a delivery is never ahead of this member's disk).
        if self.mode == DeliveryMode::Persistent {
            if !joiner && self.appended_num < p.final_seq {
                self.persist_through(p.final_seq)?;
            }
            let rank = self.my_rank;
            let old_view = if joiner { crate::persist::JOINED } else { self.view };
            if let Some(log) = self.persist.as_mut() {
                log.install_view(p.next_view, old_view, p.final_seq, p.next_members)
                    .map_err(|reason| GroupError::Persist { rank, reason })?;
            }
        }
        // Ragged-edge cleanup: exactly seq < final_seq of the old view
        // (unordered delivery already handed over everything received).
        if !joiner && self.mode.is_total_order() && self.delivered_num < p.final_seq {
            assert!(
                p.final_seq <= self.received_frontier,
                "virtual synchrony: view {} ends at seq {} but member {} received only up to {}",
                self.view,
                p.final_seq,
                self.my_rank,
                self.received_frontier
            );
            let end = p.final_seq;
            self.deliver_range(end, u64::MAX, up)?;
            debug_assert_eq!(self.delivered_num, end, "virtual synchrony: ragged edge not delivered");
        }
        if !joiner && self.mode.is_total_order() && self.received_frontier > p.final_seq {
            self.counters
                .add(counters::TRIMMED_MSGS, self.received_frontier - p.final_seq);
        }
        // Virtual synchrony for large messages: a half-assembled one (the
        // same prefix at every survivor, by the edge) is delivered nowhere.
        crate::core::cut_partials(&mut self.large, &mut self.counters, up, self.view, &self.sender_ranks);
        // Snapshot for the joiners, from the lowest old member that stays
        // (a joiner knows the old members as those not joining).
        let old_members = if joiner { p.next_members & !p.joiners } else { old_mask };
        let provider = (p.next_members & old_members).trailing_zeros() as usize;
        if p.joiners != 0 && provider == self.my_rank {
            self.write_snapshot(p.next_view, up)?;
        }
        // No loss for a sender that stays: what it published beyond the
        // edge goes out again in the next view.
        if !joiner && self.mode.is_total_order() {
            self.rewind_trimmed(p.final_seq);
        }
        let members = mask_ranks(p.next_members);
        self.enter_view(p.next_view, &members);
        // A leave asked for after the proposal was made stays asked for.
        let request = if self.mship.leaving { REQUEST_LEAVE } else { 0 };
        self.update(|c| {
            c.m_store(M_PREV_FINAL, p.final_seq);
            c.m_store(M_MEMBERS, p.next_members);
            c.m_store(M_INSTALLED, p.next_view);
            c.m_store(M_COMMIT, p.next_view);
            c.m_store(M_WEDGED, 0);
            c.m_store(M_SUSPECTED, 0);
            c.m_store(M_REQUEST, request);
        })?;
        self.mship.suspected = 0;
        // The members suspected in the old view missed this view's pushes:
        // bring them up to date under the seqlock (a plain push would hand
        // them new fields and the new version in one push).
        self.update(|_| {})?;
        self.mship.wedged = false;
        self.mship.committed = false;
        self.mship.held = None;
        self.mship.hb_moved_ns.iter_mut().for_each(|t| *t = 0);
        self.counters.add(counters::VIEWS_INSTALLED, 1);
        self.mship.current = View {
            id: p.next_view,
            members: members.clone(),
            senders: self.sender_ranks.clone(),
            joined: mask_ranks(if joiner { p.joiners } else { p.next_members & !old_mask }),
            departed: mask_ranks(old_mask & !p.next_members),
            prev_final_seq: p.final_seq,
        };
        if joiner && (p.next_members & old_members) != 0 {
            self.mship.joining = false;
            self.mship.awaiting_snapshot = Some((p.next_view, provider));
            self.push_membership()?;
            return Ok(());
        }
        self.mship.joining = false;
        self.tag_view()?;
        self.push_membership()?;
        up.view_installed(&self.mship.current);
        Ok(())
    }

    fn write_snapshot<U: Upcalls + ?Sized>(&mut self, view: u64, up: &mut U) -> Result<(), GroupError> {
        let mut buf = std::mem::take(&mut self.mship.snapshot_buf);
        buf.clear();
        up.snapshot(&mut buf);
        let max = self.mship.snapshot_bytes_max;
        if buf.len() > max {
            return Err(GroupError::StateTransfer {
                rank: self.my_rank,
                reason: format!(
                    "the snapshot is {} bytes, more than snapshot_bytes_max = {max}",
                    buf.len()
                ),
            });
        }
        let off = self.layout.snapshot.offset();
        let me = self.row(self.my_rank);
        // SAFETY: the snapshot column holds 8 + snapshot_bytes_max bytes of
        // the own row, which only this member writes; joiners read it only
        // after the snapshot_view guard below.
        unsafe { me.bytes_mut(off + 8, buf.len()) }.copy_from_slice(&buf);
        me.u64_at(off).store(buf.len() as u64, Ordering::Relaxed);
        self.fabric.push(off..off + 8 + buf.len(), self.everyone)?;
        // Partner: the Acquire load of snapshot_view in `receive_snapshot`.
        self.update(|c| c.p_store(P_SNAPSHOT_VIEW, view + 1))?;
        self.mship.snapshot_buf = buf;
        Ok(())
    }

    /// A joiner in view `view` waits for its snapshot from `provider`.
    fn receive_snapshot<U: Upcalls + ?Sized>(
        &mut self,
        view: u64,
        provider: usize,
        up: &mut U,
    ) -> Result<u32, GroupError> {
        // The snapshot is written once per view, by the lowest old member
        // that stays, and tagged with the view. A joiner admitted beside
        // others may not know them all (it learns the joiners from a
        // proposal line that may have moved on), so it may have taken
        // another joiner for the provider: any member of the view whose
        // row carries the tag is the provider.
        let tagged = |r: usize| self.p_load(r, P_SNAPSHOT_VIEW) == view + 1;
        let found = if tagged(provider) {
            Some(provider)
        } else {
            self.view_members
                .iter()
                .copied()
                .find(|&r| r != self.my_rank && tagged(r))
        };
        let Some(provider) = found else {
            if self.fabric.lost_peers().contains(provider) {
                return Err(GroupError::StateTransfer {
                    rank: self.my_rank,
                    reason: format!("member {provider}, which was to send the snapshot, is gone"),
                });
            }
            return Ok(0);
        };
        let off = self.layout.snapshot.offset();
        let row = self.row(provider);
        let len = row.u64_at(off).load(Ordering::Relaxed) as usize;
        if len > self.mship.snapshot_bytes_max {
            return Err(GroupError::StateTransfer {
                rank: self.my_rank,
                reason: format!("member {provider} announced a snapshot of {len} bytes, more than the row holds"),
            });
        }
        // SAFETY: the provider wrote these bytes before the snapshot_view
        // guard (Acquire above) and does not write them again in this view.
        let bytes = unsafe { row.bytes(off + 8, len) };
        up.restore(bytes).map_err(|reason| GroupError::StateTransfer {
            rank: self.my_rank,
            reason,
        })?;
        self.mship.awaiting_snapshot = None;
        self.tag_view()?;
        up.view_installed(&self.mship.current);
        Ok(1)
    }

    /// A joiner: wait for a committed view that includes it.
    fn join_step<U: Upcalls + ?Sized>(&mut self, up: &mut U) -> Result<u32, GroupError> {
        let me = 1u64 << self.my_rank;
        let alive = self.fabric.joined().0 & !self.fabric.lost_peers().0 & self.everyone.0;
        for r in PeerSet(alive).iter() {
            let Some(row) = self.read_row(r) else { continue };
            if row.installed > self.mship.join_seen_view && row.members & me != 0 {
                // Its proposal line still names the joiners of the view it
                // installed, unless it has proposed a newer one since.
                let joiners = if row.proposal.next_view == row.installed {
                    row.proposal.joiners | me
                } else {
                    me
                };
                let p = Proposal {
                    next_view: row.installed,
                    next_members: row.members,
                    origin: r as u64,
                    final_seq: row.prev_final_seq,
                    joiners,
                };
                self.install(p, up)?;
                return Ok(1);
            }
            let p = row.proposal;
            if row.commit > self.mship.join_seen_view
                && row.commit == row.ack
                && p.next_view == row.commit
                && row.installed + 1 == row.commit
                && row.members != 0
                && p.joiners & me != 0
            {
                self.install(p, up)?;
                return Ok(1);
            }
        }
        Ok(0)
    }
}
