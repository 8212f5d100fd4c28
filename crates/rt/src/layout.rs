//! The rt row: what every member publishes in its fabric row.
//!
//! ```text
//!  +0     commit block (one line)             written by the owner
//!         commit_generation  u64  guard: stored Release after the fields below
//!         commit_verdict     u64  generation × 4 + (1 accept | 2 reject)
//!         commit_proposed_start_ns, commit_fingerprint, commit_clock_bound_ns,
//!         commit_reason_len
//!  +64    commit_reason      bytes[192]       the rejection, as text
//!         commit_activate    u64  phase 2: generation × 4 + (1 activate | 2 abort),
//!                                 stored Release after the abort reason
//!         commit_abort_reason_len u64, commit_abort_reason bytes[192]
//!         clock_request_seq  u64              client → master: "stamp me"
//!         clock_generation   u64              steps of this node's clock
//!         clock_reply_seq    [u64; members]   master → client c: "your request
//!                                             is answered" (guard; the client's t4)
//!         clock_reply_stamps [u64; 2 × members] t2, t3 of client c at 2c, 2c + 1
//!         clock_stamps_seq   [u64; members]   guard of client c's stamps, pushed
//!                                             after them (a two-step reply)
//!         counters           [u64; COUNTERS]  live, never pushed
//!  per channel c (every row has the area; only the sender's is used):
//!         chan_c_begin       u64              period+1 being written (seqlock)
//!         chan_c_guard       u64              period+1 published (Release)
//!         chan_c_data        bytes[2 × slot]  slot p % 2 holds period p
//!  slot:  period u64 │ count u32 │ pad u32 │ count × (len u32 │ pad u32 │ key u64 │ bytes[max])
//! ```

use spindle_sst::layout::{BytesColumn, LayoutBuilder, RowLayout, U64Column, U64VectorColumn};

/// Bytes of the rejection text in the commit block (room for a reason
/// that names the task, the deadline it needed and every margin).
pub const REASON_BYTES_MAX: usize = 320;
/// Slot header and per-message header sizes.
pub const SLOT_HEADER_BYTES: usize = 16;
pub const MESSAGE_HEADER_BYTES: usize = 16;
/// Slots per channel (double buffering: period p uses slot p % 2).
pub const CHANNEL_SLOTS: usize = 2;

/// Counter ids (positions in the `counters` column).
pub const COUNTER_NAMES: [&str; 11] = [
    "released",
    "completed",
    "missed_early",
    "overruns",
    "messages_moved",
    "messages_missing",
    "messages_torn",
    "receive_overflow",
    "clock_rounds",
    "clock_over_budget",
    "watchdog_misses",
];
pub const RELEASED: usize = 0;
pub const COMPLETED: usize = 1;
pub const MISSED_EARLY: usize = 2;
pub const OVERRUNS: usize = 3;
pub const MESSAGES_MOVED: usize = 4;
pub const MESSAGES_MISSING: usize = 5;
pub const MESSAGES_TORN: usize = 6;
pub const RECEIVE_OVERFLOW: usize = 7;
pub const CLOCK_ROUNDS: usize = 8;
pub const CLOCK_OVER_BUDGET: usize = 9;
/// Jobs the watchdog found not started at their critical start time.
pub const WATCHDOG_MISSES: usize = 10;

const _: () = assert!(SLOT_HEADER_BYTES.is_multiple_of(8) && MESSAGE_HEADER_BYTES.is_multiple_of(8));

/// One channel's area in the row.
#[derive(Debug, Clone, Copy)]
pub struct ChannelArea {
    pub begin: U64Column,
    pub guard: U64Column,
    pub data: BytesColumn,
    pub message_bytes_max: usize,
    pub messages_per_period_max: usize,
}

impl ChannelArea {
    /// Bytes of one message record (header + payload, 8-aligned).
    pub fn record_bytes(&self) -> usize {
        record_bytes(self.message_bytes_max)
    }
    pub fn slot_bytes(&self) -> usize {
        slot_bytes(self.message_bytes_max, self.messages_per_period_max)
    }
    /// Byte offset of slot `period % 2`.
    pub fn slot_offset(&self, period: u64) -> usize {
        self.data.offset() + (period as usize % CHANNEL_SLOTS) * self.slot_bytes()
    }
}

fn record_bytes(message_bytes_max: usize) -> usize {
    MESSAGE_HEADER_BYTES + message_bytes_max.next_multiple_of(8)
}

fn slot_bytes(message_bytes_max: usize, messages_per_period_max: usize) -> usize {
    SLOT_HEADER_BYTES + messages_per_period_max * record_bytes(message_bytes_max)
}

/// The rt row layout for `members` members and the given channel shapes
/// `(message_bytes_max, messages_per_period_max)`.
#[derive(Debug, Clone)]
pub struct RtLayout {
    pub row: RowLayout,
    pub commit_generation: U64Column,
    pub commit_verdict: U64Column,
    pub commit_proposed_start_ns: U64Column,
    pub commit_fingerprint: U64Column,
    pub commit_clock_bound_ns: U64Column,
    pub commit_reason_len: U64Column,
    pub commit_reason: BytesColumn,
    pub commit_activate: U64Column,
    pub commit_abort_reason_len: U64Column,
    pub commit_abort_reason: BytesColumn,
    pub clock_request_seq: U64Column,
    pub clock_generation: U64Column,
    pub clock_reply_seq: U64VectorColumn,
    /// Client `c`'s `t2` at index `2c`, `t3` at `2c + 1` (one push).
    pub clock_reply_stamps: U64VectorColumn,
    pub clock_stamps_seq: U64VectorColumn,
    pub counters: U64VectorColumn,
    pub channels: Vec<ChannelArea>,
}

impl RtLayout {
    pub fn new(members: usize, channels: &[(usize, usize)]) -> RtLayout {
        assert!((1..=64).contains(&members), "members {members} not in 1..=64");
        let mut b = LayoutBuilder::new("spindle-rt");
        let commit_generation = b.u64("commit_generation");
        let commit_verdict = b.u64("commit_verdict");
        let commit_proposed_start_ns = b.u64("commit_proposed_start_ns");
        let commit_fingerprint = b.u64("commit_fingerprint");
        let commit_clock_bound_ns = b.u64("commit_clock_bound_ns");
        let commit_reason_len = b.u64("commit_reason_len");
        let commit_reason = b.bytes("commit_reason", REASON_BYTES_MAX);
        b.cache_line_break();
        let commit_activate = b.u64("commit_activate");
        let commit_abort_reason_len = b.u64("commit_abort_reason_len");
        let commit_abort_reason = b.bytes("commit_abort_reason", REASON_BYTES_MAX);
        b.cache_line_break();
        let clock_request_seq = b.u64("clock_request_seq");
        let clock_generation = b.u64("clock_generation");
        b.cache_line_break();
        let clock_reply_seq = b.u64_vector("clock_reply_seq", members);
        let clock_reply_stamps = b.u64_vector("clock_reply_stamps", 2 * members);
        let clock_stamps_seq = b.u64_vector("clock_stamps_seq", members);
        b.cache_line_break();
        let counters = b.u64_vector("counters", COUNTER_NAMES.len());
        let mut areas = Vec::with_capacity(channels.len());
        for (c, &(message_bytes_max, messages_per_period_max)) in channels.iter().enumerate() {
            assert!(
                message_bytes_max > 0 && messages_per_period_max > 0,
                "channel {c}: empty shape"
            );
            b.cache_line_break();
            let begin = b.u64(&format!("chan_{c}_begin"));
            let guard = b.u64(&format!("chan_{c}_guard"));
            let data = b.bytes(
                &format!("chan_{c}_data"),
                CHANNEL_SLOTS * slot_bytes(message_bytes_max, messages_per_period_max),
            );
            areas.push(ChannelArea {
                begin,
                guard,
                data,
                message_bytes_max,
                messages_per_period_max,
            });
        }
        RtLayout {
            row: b.build(),
            commit_generation,
            commit_verdict,
            commit_proposed_start_ns,
            commit_fingerprint,
            commit_clock_bound_ns,
            commit_reason_len,
            commit_reason,
            commit_activate,
            commit_abort_reason_len,
            commit_abort_reason,
            clock_request_seq,
            clock_generation,
            clock_reply_seq,
            clock_reply_stamps,
            clock_stamps_seq,
            counters,
            channels: areas,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_slots_are_aligned_and_inside_the_row() {
        let l = RtLayout::new(3, &[(4, 1), (1024, 2), (13, 3)]);
        for a in &l.channels {
            assert_eq!(a.data.offset() % 64, 0);
            assert_eq!(a.slot_offset(1) % 8, 0);
            assert!(a.data.offset() + a.data.len() <= l.row.row_len_bytes());
            assert_eq!(a.data.len(), 2 * a.slot_bytes());
            assert_eq!(a.slot_offset(0), a.slot_offset(2));
        }
        assert_eq!(l.channels[2].record_bytes(), 16 + 16);
        assert!(l.row.diagram().contains("chan_1_data"));
    }
}
