//! The zero-sided data path: the send task writes a slot of its row and
//! publishes the guard, each receive task copies it under the seqlock
//! ([`crate::seqlock`]); the application fills and drains the buffer
//! pools from its computation tasks ([`TaskContext`]).

use spindle_fabric::{Fabric, RowRef};

use super::{ChannelState, MissKind, RtNode};
use crate::buffers::BufferError;
use crate::clock_service::GlobalClock;
use crate::dispatch::Job;
use crate::layout::{MESSAGE_HEADER_BYTES, SLOT_HEADER_BYTES};
use crate::seqlock;

/// What a computation task sees.
pub struct TaskContext<'a> {
    pub job: Job,
    pub(super) channels: &'a mut [ChannelState],
    pub(super) clock: &'a GlobalClock,
}

impl TaskContext<'_> {
    /// Global time now (interval midpoint; `None` when unsynced).
    pub fn global_now_ns(&self) -> Option<u64> {
        self.clock.now().ok().map(|i| i.mid_ns())
    }
    /// Insert a message into channel `ch`'s input iterator (sender side).
    pub fn insert(&mut self, ch: usize, bytes: &[u8], key: u64) -> Result<(), BufferError> {
        let pool = self.channels[ch]
            .input
            .as_mut()
            .expect("insert: this node does not send on the channel");
        pool.insert(bytes, key)
    }
    /// Fill a registered buffer of channel `ch` in place.
    pub fn insert_with(
        &mut self,
        ch: usize,
        key: u64,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<usize, BufferError> {
        let pool = self.channels[ch]
            .input
            .as_mut()
            .expect("insert: this node does not send on the channel");
        pool.insert_with(key, fill)
    }
    /// Extract the next message of channel `ch`'s output iterator.
    pub fn take_into(&mut self, ch: usize, out: &mut [u8]) -> Option<(usize, u64)> {
        self.channels[ch].output.as_mut()?.take_into(out)
    }
    /// Best-effort channels: a per-message send.
    pub fn send(&mut self, ch: usize, bytes: &[u8]) -> Result<(), BufferError> {
        self.insert(ch, bytes, 0)
    }
    /// Best-effort channels: a per-message receive.
    pub fn receive(&mut self, ch: usize, out: &mut [u8]) -> Option<usize> {
        self.take_into(ch, out).map(|(n, _)| n)
    }
}

/// An application computation task's body.
pub type Computation = Box<dyn FnMut(&mut TaskContext<'_>)>;

impl<F: Fabric> RtNode<F> {
    /// Zero-sided send: move up to `messages_per_period_max` buffers from
    /// the input iterator into slot `period % 2` and publish the guard.
    pub(super) fn send_job(&mut self, c: usize, period: u64) -> u64 {
        let ch = &mut self.channels[c];
        let area = ch.area;
        let row = self.fabric.row(self.fabric.member_rank());
        let slot = area.slot_offset(period);
        // The slot is assembled in the scratch buffer, then stored into
        // the row with word stores: a reader that overran may still be
        // copying this slot (period − 2), so every access to it is atomic
        // (see `crate::seqlock`).
        let bytes = &mut ch.scratch[..];
        let input = ch.input.as_mut().expect("send task on a node that does not send");
        let mut count = 0usize;
        let record = area.record_bytes();
        while count < area.messages_per_period_max {
            let at = SLOT_HEADER_BYTES + count * record;
            let taken = input.take_with(|msg, key| {
                bytes[at..at + 4].copy_from_slice(&(msg.len() as u32).to_le_bytes());
                bytes[at + 8..at + 16].copy_from_slice(&key.to_le_bytes());
                bytes[at + MESSAGE_HEADER_BYTES..at + MESSAGE_HEADER_BYTES + msg.len()].copy_from_slice(msg);
            });
            if taken.is_none() {
                break;
            }
            count += 1;
        }
        bytes[0..8].copy_from_slice(&period.to_le_bytes());
        bytes[8..12].copy_from_slice(&(count as u32).to_le_bytes());
        let used = SLOT_HEADER_BYTES + count * record;
        seqlock::begin_write(row.u64_at(area.begin.offset()), period);
        row.store_atomic(slot, &bytes[..used]);
        // Three pushes, in this order, so that a fabric that copies rows
        // (tcp: frames applied in order, each in address order) never
        // shows a reader the guard before the slot: `begin`, the slot,
        // then the guard. On shm a push is a no-op.
        let receivers = ch.spec.receivers;
        let begin = area.begin.offset();
        let _ = self.fabric.push(begin..begin + 8, receivers);
        let _ = self.fabric.push(slot..slot + area.slot_bytes(), receivers);
        seqlock::publish(row.u64_at(area.guard.offset()), period);
        let guard = area.guard.offset();
        let _ = self.fabric.push(guard..guard + 8, receivers);
        count as u64
    }

    /// Zero-sided receive: take slot `period % 2` of the sender's row into
    /// the output iterator. Returns what it moved, or the miss kind.
    ///
    /// Catch-up: when the previous period's message was not taken (that
    /// receive job was missed, or found the sender's slot not yet
    /// published), it is taken first from slot `(period − 1) % 2`, which
    /// holds it until the sender begins period `period + 1`. So one
    /// missed receive in a row loses nothing; its miss is still reported
    /// as it happened.
    pub(super) fn receive_job(&mut self, c: usize, period: u64) -> Result<Received, MissKind> {
        let ch = &mut self.channels[c];
        let row = self.fabric.row(ch.spec.sender);
        let mut received = Received::default();
        if ch.receive_next_period < period {
            // Only the period just before can still be in its slot.
            if let Ok((moved, overflow)) = take_slot(ch, &row, period - 1) {
                received.moved += moved;
                received.caught_up += moved;
                received.overflow += overflow;
            }
        }
        let (moved, overflow) = match take_slot(ch, &row, period) {
            Ok(taken) => taken,
            Err(kind) => {
                // The next job tries this period's slot again.
                ch.receive_next_period = period;
                return Err(kind);
            }
        };
        ch.receive_next_period = period + 1;
        received.moved += moved;
        received.overflow += overflow;
        Ok(received)
    }
}

/// What a receive job moved into the output iterator.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Received {
    /// Messages inserted, the caught-up ones included.
    pub moved: u64,
    /// Of `moved`: taken from the previous period's slot.
    pub caught_up: u64,
    /// Messages the full output iterator refused.
    pub overflow: u64,
}

/// Copy the slot of `period` from the sender's `row` under the seqlock and
/// insert its messages into the channel's output iterator. Returns
/// (moved, overflowed) or why nothing was taken.
fn take_slot(ch: &mut ChannelState, row: &RowRef<'_>, period: u64) -> Result<(u64, u64), MissKind> {
    let area = ch.area;
    if !seqlock::is_published(row.u64_at(area.guard.offset()), period) {
        return Err(MissKind::MessageMissing);
    }
    // Word loads: sound even while a writer that laps us rewrites the
    // slot; such a copy is detected by the `begin` check and discarded,
    // so torn bytes never reach the application (see `crate::seqlock`).
    row.copy_atomic(area.slot_offset(period), &mut ch.scratch);
    let intact = seqlock::copy_is_intact(row.u64_at(area.begin.offset()), period);
    // The slot names its period: a slot from an earlier period (or an
    // earlier commit, whose periods restarted) is never taken for this one.
    let slot_period = u64::from_le_bytes(ch.scratch[0..8].try_into().expect("8 bytes"));
    if !intact || slot_period != period {
        return Err(MissKind::MessageTorn);
    }
    let count = u32::from_le_bytes(ch.scratch[8..12].try_into().expect("4 bytes")) as usize;
    let count = count.min(area.messages_per_period_max);
    let output = ch
        .output
        .as_mut()
        .expect("receive task on a node that does not receive");
    let (mut moved, mut overflow) = (0, 0);
    for i in 0..count {
        let at = SLOT_HEADER_BYTES + i * area.record_bytes();
        let len = u32::from_le_bytes(ch.scratch[at..at + 4].try_into().expect("4 bytes")) as usize;
        let key = u64::from_le_bytes(ch.scratch[at + 8..at + 16].try_into().expect("8 bytes"));
        let len = len.min(area.message_bytes_max);
        let msg = &ch.scratch[at + MESSAGE_HEADER_BYTES..at + MESSAGE_HEADER_BYTES + len];
        match output.insert(msg, key) {
            Ok(()) => moved += 1,
            Err(_) => overflow += 1,
        }
    }
    Ok((moved, overflow))
}
