//! The SMC row: the group layer's columns in the shared state table.
//!
//! ```text
//!  row of member m (every member has every column; rings only matter for senders)
//!  line 0  ┌ received_frontier u64   in-order receive frontier: every seq below it received
//!          │ delivered_num     u64   every seq below it delivered (nulls included)
//!          │ heartbeat         u64   bumped while alive (for `spindle stat`)
//!          └ finished          u64   1 once this member is done and waiting to leave
//!  line 1+ ┌ received_num[S]   u64   messages (nulls counted) received from each sender
//!          └ released_slots[S] u64   ring slots of each sender this member no longer needs
//!  next    ┌ guard             u64   slots published by this member's ring  (own line)
//!  next    ┌ counters[C]       u64   observability, never pushed (see `counters.rs`)
//!  next    ┌ ring              window_slots × slot_stride bytes
//!          │   slot = SlotHeader (16 B) + payload (slot_payload_max), stride 16-aligned
//! ```
//!
//! `S` is the number of senders. Positions are monotonic counts, never
//! indices into the ring: slot position `p` lives at ring index
//! `p % window_slots`.

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
///  +0  received_frontier u64 | +8 delivered_num u64 | +16 heartbeat u64 | +24 finished u64 | +32 reserved [u64; 4]
/// ```
#[repr(C, align(64))]
pub struct ProgressLine {
    pub received_frontier: u64,
    pub delivered_num: u64,
    pub heartbeat: u64,
    pub finished: u64,
    pub reserved: [u64; 4],
}

const _: () = assert!(std::mem::size_of::<ProgressLine>() == 64);
const _: () = assert!(std::mem::offset_of!(ProgressLine, received_frontier) == 0);
const _: () = assert!(std::mem::offset_of!(ProgressLine, delivered_num) == 8);
const _: () = assert!(std::mem::offset_of!(ProgressLine, heartbeat) == 16);
const _: () = assert!(std::mem::offset_of!(ProgressLine, finished) == 24);

/// Column handles of the SMC row.
#[derive(Clone, Debug)]
pub struct SmcLayout {
    pub row: RowLayout,
    pub received_frontier: U64Column,
    pub delivered_num: U64Column,
    pub heartbeat: U64Column,
    pub finished: U64Column,
    pub received_num: U64VectorColumn,
    pub released_slots: U64VectorColumn,
    pub guard: U64Column,
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
            "smc members={} senders={} mode={} window_slots={} slot_payload_max={}",
            config.members,
            senders,
            config.mode.as_str(),
            config.window_slots,
            config.slot_payload_max
        ));
        let received_frontier = b.u64("received_frontier");
        let delivered_num = b.u64("delivered_num");
        let heartbeat = b.u64("heartbeat");
        let finished = b.u64("finished");
        b.cache_line_break();
        let received_num = b.u64_vector("received_num", senders);
        let released_slots = b.u64_vector("released_slots", senders);
        b.cache_line_break();
        let guard = b.u64("guard");
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
            received_num,
            released_slots,
            guard,
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

    /// The bytes that carry the progress counters (pushed once per pass).
    pub fn progress_range(&self) -> std::ops::Range<usize> {
        self.received_frontier.offset()..self.released_slots.range().end
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
