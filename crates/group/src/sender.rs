//! [`Sender`]: zero-copy sends from any number of application threads.
//!
//! ```text
//!  let mut slot = sender.reserve(len)?;   // lock-free; WouldBlock when the window is full
//!  slot.payload_mut().copy_from_slice(..); // write in place, in the ring in shared memory
//!  slot.commit();                          // local only: the progress loop publishes it
//! ```
//!
//! A sender with several messages ready reserves them together, with one
//! atomic instead of one per message:
//!
//! ```text
//!  let mut batch = sender.reserve_batch(64, len)?; // up to 64 slots, one CAS
//!  while let Some(mut slot) = batch.next_slot() { ..; slot.commit(); }
//!  // dropping the batch publishes its untaken slots as skip slots
//! ```
//!
//! A message bigger than a slot goes as fragments (see [`crate::large`]),
//! as many per call as the window has room for:
//!
//! ```text
//!  let mut tx = sender.send_large(message.len())?;  // one at a time per member
//!  while !tx.push(&message)? { group.poll(&mut app)?; }
//! ```

use std::sync::Arc;

use spindle_fabric::Fabric;

use crate::large::{FragmentHeader, FRAGMENT_HEADER_BYTES, LEN_FRAGMENT};
use crate::layout::{SmcLayout, NULL_COUNT_SKIP, SLOT_HEADER_BYTES};
use crate::send_ring::SendRing;
use crate::sync::Ordering;
use crate::SendError;

/// A handle for sending into this member's ring. Clone it for each thread.
pub struct Sender<F: Fabric> {
    fabric: Arc<F>,
    ring: Arc<SendRing>,
    layout: Arc<SmcLayout>,
    /// The group's `large_message_max_bytes`.
    large_message_max_bytes: u64,
}

impl<F: Fabric> Clone for Sender<F> {
    fn clone(&self) -> Self {
        Sender {
            fabric: self.fabric.clone(),
            ring: self.ring.clone(),
            layout: self.layout.clone(),
            large_message_max_bytes: self.large_message_max_bytes,
        }
    }
}

impl<F: Fabric> Sender<F> {
    pub(crate) fn new(fabric: Arc<F>, ring: Arc<SendRing>, layout: Arc<SmcLayout>) -> Sender<F> {
        Sender {
            fabric,
            ring,
            layout,
            large_message_max_bytes: crate::config::defaults::LARGE_MESSAGE_MAX_BYTES,
        }
    }

    pub(crate) fn with_large_message_max(mut self, bytes: u64) -> Sender<F> {
        self.large_message_max_bytes = bytes;
        self
    }

    /// Start sending a message of `len` bytes, bigger than a slot (one
    /// that fits goes whole in one fragment too, but [`Sender::send`] is
    /// cheaper for it): [`LargeSend::push`] copies it into the window as
    /// fragments, as many per call as there is room for. The group
    /// delivers it as one message, in the total order, at every member
    /// or (cut by a view change) at none. One at a time per member: a
    /// second returns [`SendError::LargeInProgress`] until the first is
    /// done or dropped.
    pub fn send_large(&self, len: usize) -> Result<LargeSend<F>, SendError> {
        let refuse = |reason: String| SendError::LargeRefused {
            len: len as u64,
            reason,
        };
        // A multiple of 8: every fragment's bytes start 8-aligned in the
        // message (and 16-aligned in the slot), so a writer filling in
        // place (`LargeSend::push_with`) works in whole words.
        let fragment_bytes_max = self.layout.slot_payload_max.saturating_sub(FRAGMENT_HEADER_BYTES) & !7;
        if fragment_bytes_max == 0 {
            return Err(refuse(format!(
                "slot_payload_max = {} leaves no room for a fragment (its header takes {FRAGMENT_HEADER_BYTES} B)",
                self.layout.slot_payload_max
            )));
        }
        if len == 0 {
            return Err(refuse(
                "an empty message is not a large one: send it with Sender::send".into(),
            ));
        }
        if len as u64 > self.large_message_max_bytes {
            return Err(refuse(format!(
                "larger than the group's large_message_max_bytes = {}",
                self.large_message_max_bytes
            )));
        }
        if self.ring.is_stopped() {
            return Err(SendError::Stopped);
        }
        // Acquire: pairs with the Release store in `LargeSend::drop` (the
        // previous large send's slots were all handed out before).
        self.ring
            .large_in_progress
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| SendError::LargeInProgress)?;
        // Relaxed: only this holder of `large_in_progress` takes an id.
        let message_id = self.ring.large_started.fetch_add(1, Ordering::Relaxed);
        Ok(LargeSend {
            message_id,
            sender: self.clone(),
            len_bytes: len as u64,
            sent_bytes: 0,
            fragment_bytes_max,
        })
    }

    /// Largest payload a slot carries.
    pub fn slot_payload_max(&self) -> usize {
        self.layout.slot_payload_max
    }

    /// Reserve a slot for a payload of `len` bytes. Never waits: a full
    /// window returns [`SendError::WouldBlock`] (so it is safe to call from
    /// inside a delivery callback).
    #[inline]
    pub fn reserve(&self, len: usize) -> Result<SendSlot<'_, F>, SendError> {
        self.check_send(len)?;
        let position = self.ring.reserve().ok_or(SendError::WouldBlock)?;
        // SAFETY: the ring's CAS handed `position` to this call alone.
        Ok(unsafe { self.slot_at(position, len) })
    }

    /// Reserve up to `n_max` consecutive slots, each for a payload of `len`
    /// bytes, with one atomic read-modify-write for all of them (a single
    /// [`Sender::reserve`] costs one per message, a full barrier on x86).
    /// Fewer than `n_max` come back when the window has fewer free slots;
    /// a full window returns [`SendError::WouldBlock`]. Never waits.
    ///
    /// Take the slots with [`SendBatch::next_slot`] and commit each; slots
    /// left untaken when the batch is dropped are published as skip slots
    /// (no message), as a dropped [`SendSlot`] is, so reserve no more than
    /// you will send.
    #[inline]
    pub fn reserve_batch(&self, n_max: usize, len: usize) -> Result<SendBatch<'_, F>, SendError> {
        assert!(n_max >= 1, "reserve_batch: n_max must be at least 1");
        self.check_send(len)?;
        let run = self.ring.reserve_many(n_max as u64).ok_or(SendError::WouldBlock)?;
        debug_assert!(
            !run.is_empty() && run.end - run.start <= n_max as u64,
            "a batch holds between 1 and n_max slots"
        );
        Ok(SendBatch {
            sender: self,
            next: run.start,
            end: run.end,
            len,
        })
    }

    #[inline]
    fn check_send(&self, len: usize) -> Result<(), SendError> {
        if len > self.layout.slot_payload_max {
            return Err(SendError::TooLarge {
                len,
                slot_payload_max: self.layout.slot_payload_max,
            });
        }
        if self.ring.is_stopped() {
            return Err(SendError::Stopped);
        }
        Ok(())
    }

    /// The slot at `position`, its payload `len` bytes.
    ///
    /// # Safety
    ///
    /// `position` was handed to the caller alone by the ring (`reserve` or
    /// `reserve_many`), and no other `SendSlot` for it exists or will be
    /// made: the caller hands it out once.
    #[inline]
    unsafe fn slot_at(&self, position: u64, len: usize) -> SendSlot<'_, F> {
        debug_assert!(len <= self.layout.slot_payload_max, "checked by check_send");
        let off = self.layout.slot_offset(position);
        let row = self.fabric.row(self.fabric.member_rank());
        // SAFETY:
        // - position `position` belongs to this slot alone (the caller's
        //   contract: the ring's CAS gave it to one reservation, which
        //   makes one slot of it);
        // - the flow-control limit guarantees every member released the
        //   slot's previous lap (the Acquire of `limit` in `reserve_many`):
        //   nobody reads or writes these bytes until we commit and the
        //   progress loop publishes them;
        // - `len <= slot_payload_max`, so the bytes lie inside the slot.
        let payload = unsafe { row.bytes_mut(off + SLOT_HEADER_BYTES, len) };
        SendSlot {
            sender: self,
            position,
            offset: off,
            payload,
            committed: false,
        }
    }

    /// Write a slot's header and mark it committed for the progress loop.
    #[inline]
    fn finish_slot(&self, position: u64, offset: usize, null_count: u32, len: u32) {
        let row = self.fabric.row(self.fabric.member_rank());
        row.u32_at(offset + 8).store(null_count, Ordering::Relaxed);
        row.u32_at(offset + 12).store(len, Ordering::Relaxed);
        // The Release in `commit` orders the payload and header before the mark.
        self.ring.commit(position);
    }

    /// Copy `payload` into a slot and commit it.
    #[inline]
    pub fn send(&self, payload: &[u8]) -> Result<(), SendError> {
        let mut slot = self.reserve(payload.len())?;
        slot.payload_mut().copy_from_slice(payload);
        slot.commit();
        Ok(())
    }

    /// Sends refused so far because the window was full.
    pub fn backpressure_count(&self) -> u64 {
        self.ring.backpressure.load(Ordering::Relaxed)
    }

    /// Slot positions handed out so far (the next reservation gets this
    /// one).
    pub fn reserved_slots(&self) -> u64 {
        self.ring.reserved()
    }

    /// Slot positions every member of the view has released (delivered
    /// and acknowledged): the flow-control limit minus the window. Exact
    /// on every pass with `GroupConfig::track_acks`; otherwise refreshed
    /// only once half the window is used.
    pub fn acknowledged_slots(&self) -> u64 {
        self.ring.limit().saturating_sub(self.ring.window_slots())
    }

    /// Slots reserved and not yet acknowledged by every member: the send
    /// window's occupancy (what NAPA keeps between 1 and W).
    pub fn window_occupancy(&self) -> u64 {
        self.reserved_slots().saturating_sub(self.acknowledged_slots())
    }

    /// Slots in the send window.
    pub fn window_slots(&self) -> u64 {
        self.ring.window_slots()
    }

    /// Wake this member's progress loop if it is parked on the doorbell
    /// (one fence and one load when it is not), so a message committed
    /// from another thread is published now rather than after the park
    /// (up to the idle strategy's park time). Call it after
    /// [`SendSlot::commit`] when the sender does not poll itself.
    #[inline]
    pub fn wake_progress(&self) {
        self.fabric.doorbell().ring();
    }
}

/// A reserved slot: write the payload in place, then [`SendSlot::commit`].
/// Dropping it uncommitted publishes an empty skip slot (no message, no
/// index), so an abandoned reservation never stalls the ring.
pub struct SendSlot<'a, F: Fabric> {
    sender: &'a Sender<F>,
    position: u64,
    offset: usize,
    payload: &'a mut [u8],
    committed: bool,
}

impl<F: Fabric> SendSlot<'_, F> {
    /// The payload bytes, in the ring.
    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.payload
    }

    /// Hand the message to the progress loop (local only; no push here).
    #[inline]
    pub fn commit(mut self) {
        self.finish(0, self.payload.len() as u32);
    }

    /// Commit only the first `len` bytes of the reserved payload (a value
    /// serialized in place whose size was known only after writing it).
    /// Only those bytes are pushed.
    ///
    /// # Panics
    ///
    /// If `len` is larger than the reservation.
    #[inline]
    pub fn commit_len(mut self, len: usize) {
        assert!(
            len <= self.payload.len(),
            "commit_len({len}) exceeds the reserved {} bytes",
            self.payload.len()
        );
        self.finish(0, len as u32);
    }

    /// This slot's position in the sender's stream (0, 1, 2, …): the
    /// message is acknowledged by every member once
    /// [`Sender::acknowledged_slots`] exceeds it.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Commit the slot as a fragment of a large message.
    fn commit_fragment(mut self, len: usize) {
        debug_assert!(len <= self.payload.len(), "a fragment fits its reservation");
        self.finish(0, len as u32 | LEN_FRAGMENT);
    }

    #[inline]
    fn finish(&mut self, null_count: u32, len: u32) {
        debug_assert!(!self.committed, "no duplication: slot {} finished twice", self.position);
        self.sender.finish_slot(self.position, self.offset, null_count, len);
        self.committed = true;
    }
}

impl<F: Fabric> Drop for SendSlot<'_, F> {
    fn drop(&mut self) {
        if !self.committed {
            self.finish(NULL_COUNT_SKIP, 0);
        }
    }
}

/// Consecutive slots reserved together by [`Sender::reserve_batch`]: take
/// them in order with [`SendBatch::next_slot`]. Dropping the batch
/// publishes the slots not taken as empty skip slots (no message, no
/// index), so an unused reservation never stalls the ring.
pub struct SendBatch<'a, F: Fabric> {
    sender: &'a Sender<F>,
    /// The next position to hand out; `next..end` are reserved and untaken.
    next: u64,
    end: u64,
    len: usize,
}

impl<'a, F: Fabric> SendBatch<'a, F> {
    /// The next reserved slot (payload of the batch's `len` bytes), or
    /// `None` once all were taken. No atomic read-modify-write.
    #[inline]
    pub fn next_slot(&mut self) -> Option<SendSlot<'a, F>> {
        if self.next == self.end {
            return None;
        }
        let position = self.next;
        self.next += 1;
        debug_assert!(self.next <= self.end, "a batch hands out only its own positions");
        // SAFETY: `next..end` came from one `reserve_many` call, held by
        // this batch alone; `next` moved past `position`, so it is handed
        // out exactly once.
        Some(unsafe { self.sender.slot_at(position, self.len) })
    }

    /// Slots reserved and not taken yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        (self.end - self.next) as usize
    }
}

impl<F: Fabric> Drop for SendBatch<'_, F> {
    fn drop(&mut self) {
        for position in self.next..self.end {
            let offset = self.sender.layout.slot_offset(position);
            self.sender.finish_slot(position, offset, NULL_COUNT_SKIP, 0);
        }
        self.next = self.end;
    }
}

/// Fragments a reservation takes at most (one atomic for all of them).
const LARGE_BATCH_SLOTS_MAX: u64 = 64;

/// A large message being sent (see [`Sender::send_large`]). Dropping it
/// before [`LargeSend::push`] returned `true` abandons the message: the
/// fragments already sent are passed over everywhere (each member says so
/// with `Upcalls::large_message_cut`), and this member may start another.
pub struct LargeSend<F: Fabric> {
    message_id: u64,
    sender: Sender<F>,
    len_bytes: u64,
    sent_bytes: u64,
    fragment_bytes_max: usize,
}

impl<F: Fabric> LargeSend<F> {
    /// Copy the next fragments of `message` into the window, as many as it
    /// has room for; never waits (run the progress loop between calls).
    /// Returns `Ok(true)` once the last fragment is committed.
    ///
    /// # Panics
    ///
    /// If `message` is not as long as announced to [`Sender::send_large`]
    /// (pass the same message to every call).
    pub fn push(&mut self, message: &[u8]) -> Result<bool, SendError> {
        assert_eq!(
            message.len() as u64,
            self.len_bytes,
            "LargeSend::push: pass the message announced to send_large every time"
        );
        self.push_with(|offset, out| {
            let at = offset as usize;
            out.copy_from_slice(&message[at..at + out.len()]);
        })
    }

    /// [`LargeSend::push`] without a copy of the message: `fill(offset,
    /// bytes)` writes the message's bytes `offset..offset + bytes.len()`
    /// in place, into the ring (each call a whole fragment; offsets are
    /// multiples of 8 and come in order).
    pub fn push_with(&mut self, mut fill: impl FnMut(u64, &mut [u8])) -> Result<bool, SendError> {
        if self.sent_bytes == self.len_bytes {
            return Ok(true);
        }
        if self.sender.ring.is_stopped() {
            return Err(SendError::Stopped);
        }
        let fragment_max = self.fragment_bytes_max as u64;
        let fragments_left = (self.len_bytes - self.sent_bytes).div_ceil(fragment_max);
        let Some(run) = self.sender.ring.reserve_many(fragments_left.min(LARGE_BATCH_SLOTS_MAX)) else {
            return Ok(false);
        };
        for position in run {
            let n = (self.len_bytes - self.sent_bytes).min(fragment_max) as usize;
            // SAFETY: `position` came from the `reserve_many` above, held by
            // this call alone, and is made into exactly one slot here.
            let mut slot = unsafe { self.sender.slot_at(position, FRAGMENT_HEADER_BYTES + n) };
            let payload = slot.payload_mut();
            FragmentHeader {
                message_id: self.message_id,
                total_len: self.len_bytes,
                offset: self.sent_bytes,
            }
            .write(payload);
            fill(self.sent_bytes, &mut payload[FRAGMENT_HEADER_BYTES..]);
            slot.commit_fragment(FRAGMENT_HEADER_BYTES + n);
            self.sent_bytes += n as u64;
        }
        Ok(self.sent_bytes == self.len_bytes)
    }

    /// This member's count of large messages started before this one: the
    /// id `Upcalls::large_message_cut` names if this one is cut.
    pub fn message_id(&self) -> u64 {
        self.message_id
    }

    /// The message's length.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Bytes committed so far.
    pub fn sent_bytes(&self) -> u64 {
        self.sent_bytes
    }

    /// Whether every fragment is committed.
    pub fn is_done(&self) -> bool {
        self.sent_bytes == self.len_bytes
    }
}

impl<F: Fabric> Drop for LargeSend<F> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in `Sender::send_large`.
        self.sender.ring.large_in_progress.store(false, Ordering::Release);
    }
}
