//! The SMC row: the group layer's columns in the shared state table.
//!
//! ```text
//!  row of member m (every member has every column; rings only matter for senders)
//!  line 0  ┌ received_frontier u64   in-order receive frontier: every seq below it received
//!          │ delivered_num     u64   every seq below it delivered (nulls included)
//!          │ heartbeat         u64   bumped every heartbeat interval while alive
//!          │ finished          u64   1 once this member is done and waiting to leave
//!          │ smc_view          u64   view + 1 whose SMC counters these are (0: none yet)
//!          │ base_slot         u64   ring position where this member's sends in smc_view begin
//!          └ persisted_num     u64   persistent mode: every seq below it is in this member's log on disk
//!  line 1+ ┌ received_num[S]   u64   messages (nulls counted) received from each sender
//!          └ released_slots[S] u64   ring slots of each sender released, counted from its base_slot
//!  next    ┌ guard             u64   slots published in this view (from base_slot)  (own line)
//!          └ guard_view        u64   view + 1 the guard counts in (read with it: no extra line)
//!  next    ┌ MembershipLine    64 B  installed view, suspicions, wedge, ack, commit, requests
//!  next    ┌ ProposalLine      64 B  the next view this member proposed (leader) or acked
//!  next    ┌ RestartLine       64 B  persistent mode: this member's log summary at a restart
//!  next    ┌ snapshot          u64 length + snapshot_bytes_max bytes (state for joiners)
//!  next    ┌ counters[C]       u64   observability, never pushed (see `counters.rs`)
//!  next    ┌ ring              window_slots × slot_stride bytes
//!          │   slot = SlotHeader (16 B) + payload (slot_payload_max), stride 16-aligned
//! ```
//!
//! `S` is the largest number of senders a view can have (the configured
//! senders); in a view, column `i` belongs to the view's `i`-th sender.
//! Positions are monotonic counts, never indices into the ring: slot
//! position `p` lives at ring index `p % window_slots`. Within a view, a
//! sender's guard and every member's `released_slots` count from that
//! sender's `base_slot`, so the ring continues across views while the
//! counters start from zero (see [`crate::membership`]).

use spindle_sst::{BytesColumn, LayoutBuilder, RowLayout, U64Column, U64VectorColumn};

use crate::config::GroupConfig;
use crate::counters::COUNTER_NAMES;

/// Header of one ring slot, written by the sender before the guard that
/// publishes it.
///
/// ```text
///  +0  index      u64  message index of the first message in the slot
///  +8  null_count u32  0: a data message; n > 0: a run of n null messages; SKIP: an aborted slot
///  +12 len        u32  payload bytes (data slots)
///  +16 payload …
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    pub index: u64,
    pub null_count: u32,
    pub len: u32,
}

pub const SLOT_HEADER_BYTES: usize = 16;
const _: () = assert!(std::mem::size_of::<SlotHeader>() == SLOT_HEADER_BYTES);
const _: () = assert!(std::mem::align_of::<SlotHeader>() == 8);

/// `null_count` of a reserved slot that was dropped without a commit: it
/// carries no message and takes no index.
pub const NULL_COUNT_SKIP: u32 = u32::MAX;

/// Bytes per slot for a payload size: header + payload, 16-aligned.
pub fn slot_stride(slot_payload_max: usize) -> usize {
    (SLOT_HEADER_BYTES + slot_payload_max).next_multiple_of(16)
}

/// The first cache line of every SMC row, as a `#[repr(C)]` struct: the
/// progress counters every member polls. [`SmcLayout::new`] checks that
/// the column offsets it builds land exactly on these fields.
///
/// ```text
///  +0  received_frontier u64 | +8 delivered_num u64 | +16 heartbeat u64 | +24 finished u64
///  +32 smc_view u64          | +40 base_slot u64     | +48 persisted_num u64 | +56 reserved u64
/// ```
#[repr(C, align(64))]
pub struct ProgressLine {
    pub received_frontier: u64,
    pub delivered_num: u64,
    pub heartbeat: u64,
    pub finished: u64,
    pub smc_view: u64,
    pub base_slot: u64,
    pub persisted_num: u64,
    pub reserved: u64,
}

const _: () = assert!(std::mem::size_of::<ProgressLine>() == 64);
const _: () = assert!(std::mem::offset_of!(ProgressLine, received_frontier) == 0);
const _: () = assert!(std::mem::offset_of!(ProgressLine, delivered_num) == 8);
const _: () = assert!(std::mem::offset_of!(ProgressLine, heartbeat) == 16);
const _: () = assert!(std::mem::offset_of!(ProgressLine, finished) == 24);
const _: () = assert!(std::mem::offset_of!(ProgressLine, smc_view) == 32);
const _: () = assert!(std::mem::offset_of!(ProgressLine, base_slot) == 40);
const _: () = assert!(std::mem::offset_of!(ProgressLine, persisted_num) == 48);

/// The membership state every member publishes (Derecho's view-change
/// columns), one cache line, pushed to every rank when it changes and with
/// each heartbeat.
///
/// ```text
///  +0  installed_view u64  the view this member runs
///  +8  members        u64  that view's members (bit r = rank r); 0: not in any view yet
///  +16 prev_final_seq u64  the old view's messages below this seq were delivered at install
///  +24 suspected      u64  ranks this member suspects (its own and spread)
///  +32 wedged         u64  view + 1 once wedged in that view (0: not wedged)
///  +40 ack_view       u64  the next view whose proposal this member copied and acknowledged
///  +48 commit_view    u64  the next view this member committed (leader) or installed
///  +56 request        u64  REQUEST_JOIN | REQUEST_LEAVE
/// ```
#[repr(C, align(64))]
pub struct MembershipLine {
    pub installed_view: u64,
    pub members: u64,
    pub prev_final_seq: u64,
    pub suspected: u64,
    pub wedged: u64,
    pub ack_view: u64,
    pub commit_view: u64,
    pub request: u64,
}

const _: () = assert!(std::mem::size_of::<MembershipLine>() == 64);
const _: () = assert!(std::mem::offset_of!(MembershipLine, installed_view) == 0);
const _: () = assert!(std::mem::offset_of!(MembershipLine, members) == 8);
const _: () = assert!(std::mem::offset_of!(MembershipLine, prev_final_seq) == 16);
const _: () = assert!(std::mem::offset_of!(MembershipLine, suspected) == 24);
const _: () = assert!(std::mem::offset_of!(MembershipLine, wedged) == 32);
const _: () = assert!(std::mem::offset_of!(MembershipLine, ack_view) == 40);
const _: () = assert!(std::mem::offset_of!(MembershipLine, commit_view) == 48);
const _: () = assert!(std::mem::offset_of!(MembershipLine, request) == 56);

/// `request` bit: a process that is not in the view asks to join.
pub const REQUEST_JOIN: u64 = 1;
/// `request` bit: a member asks to leave at the next view change.
pub const REQUEST_LEAVE: u64 = 2;

/// A proposed next view: written by the leader, copied by every member
/// that acknowledges it (so a new leader can adopt it).
///
/// ```text
///  +0  next_view     u64  the proposed view's id
///  +8  next_members  u64  its members
///  +16 origin        u64  rank of the leader that first proposed it
///  +24 final_seq     u64  ragged-edge cleanup: the old view delivers exactly seq < final_seq
///  +32 joiners       u64  members new in it (they get a snapshot)
///  +40 snapshot_view u64  view + 1 whose snapshot is in the snapshot column (0: none)
///  +48 version       u64  odd while the owner rewrites either line (a seqlock for readers)
///  +56 reserved      u64
/// ```
#[repr(C, align(64))]
pub struct ProposalLine {
    pub next_view: u64,
    pub next_members: u64,
    pub origin: u64,
    pub final_seq: u64,
    pub joiners: u64,
    pub snapshot_view: u64,
    pub version: u64,
    pub reserved: u64,
}

const _: () = assert!(std::mem::size_of::<ProposalLine>() == 64);
const _: () = assert!(std::mem::offset_of!(ProposalLine, next_view) == 0);
const _: () = assert!(std::mem::offset_of!(ProposalLine, next_members) == 8);
const _: () = assert!(std::mem::offset_of!(ProposalLine, origin) == 16);
const _: () = assert!(std::mem::offset_of!(ProposalLine, final_seq) == 24);
const _: () = assert!(std::mem::offset_of!(ProposalLine, joiners) == 32);
const _: () = assert!(std::mem::offset_of!(ProposalLine, snapshot_view) == 40);
const _: () = assert!(std::mem::offset_of!(ProposalLine, version) == 48);

/// A member's log summary, published once at a start in persistent mode
/// (restart after a total failure: see [`crate::restart`]).
///
/// ```text
///  +0  valid        u64  RESTART_LINE_VALID once the fields below are written
///  +8  last_view    u64  the last view the member's log says it installed
///  +16 last_members u64  that view's members (bit r = rank r)
///  +24 prev_view    u64  the view before it (flags bit 0: there is one)
///  +32 prev_final   u64  where that view ended (its final_seq)
///  +40 frontier     u64  every message of last_view below this seq is in the log
///  +48 flags        u64  bit 0: prev_view is set; bit 1: the member joined a running group
///  +56 records      u64  records in the log (0: an empty log)
/// ```
#[repr(C, align(64))]
pub struct RestartLine {
    pub valid: u64,
    pub last_view: u64,
    pub last_members: u64,
    pub prev_view: u64,
    pub prev_final: u64,
    pub frontier: u64,
    pub flags: u64,
    pub records: u64,
}

const _: () = assert!(std::mem::size_of::<RestartLine>() == 64);
const _: () = assert!(std::mem::offset_of!(RestartLine, last_view) == 8);
const _: () = assert!(std::mem::offset_of!(RestartLine, last_members) == 16);
const _: () = assert!(std::mem::offset_of!(RestartLine, prev_view) == 24);
const _: () = assert!(std::mem::offset_of!(RestartLine, prev_final) == 32);
const _: () = assert!(std::mem::offset_of!(RestartLine, frontier) == 40);
const _: () = assert!(std::mem::offset_of!(RestartLine, flags) == 48);
const _: () = assert!(std::mem::offset_of!(RestartLine, records) == 56);

/// `RestartLine::valid` once written ("RESTART1").
pub const RESTART_LINE_VALID: u64 = u64::from_le_bytes(*b"RESTART1");

/// Column handles of the SMC row.
#[derive(Clone, Debug)]
pub struct SmcLayout {
    pub row: RowLayout,
    pub received_frontier: U64Column,
    pub delivered_num: U64Column,
    pub heartbeat: U64Column,
    pub finished: U64Column,
    pub smc_view: U64Column,
    pub base_slot: U64Column,
    pub persisted_num: U64Column,
    pub received_num: U64VectorColumn,
    pub released_slots: U64VectorColumn,
    pub guard: U64Column,
    pub guard_view: U64Column,
    /// The [`MembershipLine`], then the [`ProposalLine`] (128 bytes).
    pub membership: BytesColumn,
    /// The [`RestartLine`] (64 bytes).
    pub restart: BytesColumn,
    /// Snapshot length (u64), then up to `snapshot_bytes_max` bytes.
    pub snapshot: BytesColumn,
    pub counters: U64VectorColumn,
    pub ring: BytesColumn,
    pub senders: usize,
    pub window_slots: usize,
    pub slot_stride: usize,
    pub slot_payload_max: usize,
}

impl SmcLayout {
    pub fn new(config: &GroupConfig) -> SmcLayout {
        let senders = config.senders.ranks(config.members).len();
        let stride = slot_stride(config.slot_payload_max);
        let mut b = LayoutBuilder::new(&format!(
            "smc members={} senders={} mode={} window_slots={} slot_payload_max={} snapshot_bytes_max={}",
            config.members,
            senders,
            config.mode.as_str(),
            config.window_slots,
            config.slot_payload_max,
            config.snapshot_bytes_max
        ));
        let received_frontier = b.u64("received_frontier");
        let delivered_num = b.u64("delivered_num");
        let heartbeat = b.u64("heartbeat");
        let finished = b.u64("finished");
        let smc_view = b.u64("smc_view");
        let base_slot = b.u64("base_slot");
        let persisted_num = b.u64("persisted_num");
        b.cache_line_break();
        let received_num = b.u64_vector("received_num", senders);
        let released_slots = b.u64_vector("released_slots", senders);
        b.cache_line_break();
        let guard = b.u64("guard");
        let guard_view = b.u64("guard_view");
        b.cache_line_break();
        let membership = b.bytes("membership", 128);
        b.cache_line_break();
        let restart = b.bytes("restart", std::mem::size_of::<RestartLine>());
        b.cache_line_break();
        let snapshot = b.bytes("snapshot", 8 + config.snapshot_bytes_max);
        b.cache_line_break();
        let counters = b.u64_vector("counters", COUNTER_NAMES.len());
        let ring = b.bytes("ring", stride * config.window_slots);
        let row = b.build();
        // The fixed part of the row is exactly the #[repr(C)] ProgressLine.
        assert_eq!(
            received_frontier.offset(),
            std::mem::offset_of!(ProgressLine, received_frontier)
        );
        assert_eq!(
            delivered_num.offset(),
            std::mem::offset_of!(ProgressLine, delivered_num)
        );
        assert_eq!(heartbeat.offset(), std::mem::offset_of!(ProgressLine, heartbeat));
        assert_eq!(finished.offset(), std::mem::offset_of!(ProgressLine, finished));
        assert_eq!(smc_view.offset(), std::mem::offset_of!(ProgressLine, smc_view));
        assert_eq!(base_slot.offset(), std::mem::offset_of!(ProgressLine, base_slot));
        assert_eq!(
            persisted_num.offset(),
            std::mem::offset_of!(ProgressLine, persisted_num)
        );
        assert_eq!(
            membership.offset() % 64,
            0,
            "the membership lines are cache-line aligned"
        );
        assert_eq!(
            received_num.offset(0),
            std::mem::size_of::<ProgressLine>(),
            "per-sender vectors start on line 1"
        );
        assert_eq!(guard.offset() % 64, 0, "the guard has its own cache line");
        assert_eq!(ring.offset() % 64, 0, "the ring is cache-line aligned");
        SmcLayout {
            row,
            received_frontier,
            delivered_num,
            heartbeat,
            finished,
            smc_view,
            base_slot,
            persisted_num,
            received_num,
            released_slots,
            guard,
            guard_view,
            membership,
            restart,
            snapshot,
            counters,
            ring,
            senders,
            window_slots: config.window_slots,
            slot_stride: stride,
            slot_payload_max: config.slot_payload_max,
        }
    }

    /// Byte offset of slot position `position`'s header in the row.
    #[inline(always)]
    pub fn slot_offset(&self, position: u64) -> usize {
        self.ring.offset() + (position as usize & (self.window_slots - 1)) * self.slot_stride
    }

    /// Byte offset of a [`MembershipLine`] field (`offset_of!`).
    #[inline(always)]
    pub fn mship(&self, field_offset: usize) -> usize {
        self.membership.offset() + field_offset
    }

    /// Byte offset of a [`ProposalLine`] field (`offset_of!`).
    #[inline(always)]
    pub fn proposal(&self, field_offset: usize) -> usize {
        self.membership.offset() + 64 + field_offset
    }

    /// The membership and proposal lines.
    pub fn membership_range(&self) -> std::ops::Range<usize> {
        self.membership.offset()..self.membership.offset() + self.membership.len()
    }

    /// The bytes that carry the progress counters (pushed once per pass).
    pub fn progress_range(&self) -> std::ops::Range<usize> {
        self.received_frontier.offset()..self.released_slots.range().end
    }

    /// The slot ring's bytes in a row: read only behind the sender's guard
    /// and rewritten only after every member released the slot, so a
    /// fabric that copies rows may write them with plain copies
    /// (`Fabric::declare_payload_region`, which `GroupCore` calls).
    pub fn payload_region(&self) -> std::ops::Range<usize> {
        self.ring.offset()..self.ring.offset() + self.ring.len()
    }

    /// Ring byte ranges covering slot positions `from..to` (at most two:
    /// the ring wraps).
    pub fn ring_ranges(&self, from: u64, to: u64) -> [std::ops::Range<usize>; 2] {
        debug_assert!(to >= from && to - from <= self.window_slots as u64);
        if to == from {
            return [0..0, 0..0];
        }
        let start = self.slot_offset(from);
        let last = self.slot_offset(to - 1) + self.slot_stride;
        if last > start {
            [start..last, 0..0]
        } else {
            [start..self.ring.offset() + self.ring.len(), self.ring.offset()..last]
        }
    }
}
