//! [`Sender`]: zero-copy sends from any number of application threads.
//!
//! ```text
//!  let mut slot = sender.reserve(len)?;   // lock-free; WouldBlock when the window is full
//!  slot.payload_mut().copy_from_slice(..); // write in place, in the ring in shared memory
//!  slot.commit();                          // local only: the progress loop publishes it
//! ```

use std::sync::Arc;

use spindle_fabric::Fabric;

use crate::layout::{SmcLayout, NULL_COUNT_SKIP, SLOT_HEADER_BYTES};
use crate::send_ring::SendRing;
use crate::sync::Ordering;
use crate::SendError;

/// A handle for sending into this member's ring. Clone it for each thread.
pub struct Sender<F: Fabric> {
    fabric: Arc<F>,
    ring: Arc<SendRing>,
    layout: Arc<SmcLayout>,
}

impl<F: Fabric> Clone for Sender<F> {
    fn clone(&self) -> Self {
        Sender {
            fabric: self.fabric.clone(),
            ring: self.ring.clone(),
            layout: self.layout.clone(),
        }
    }
}

impl<F: Fabric> Sender<F> {
    pub(crate) fn new(fabric: Arc<F>, ring: Arc<SendRing>, layout: Arc<SmcLayout>) -> Sender<F> {
        Sender { fabric, ring, layout }
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
        if len > self.layout.slot_payload_max {
            return Err(SendError::TooLarge {
                len,
                slot_payload_max: self.layout.slot_payload_max,
            });
        }
        if self.ring.is_stopped() {
            return Err(SendError::Stopped);
        }
        let position = self.ring.reserve().ok_or(SendError::WouldBlock)?;
        let off = self.layout.slot_offset(position);
        let row = self.fabric.row(self.fabric.member_rank());
        // SAFETY: position `position` was handed to us alone by the ring's
        // CAS, and the flow-control limit guarantees every member released
        // the slot's previous lap: nobody reads or writes these bytes until
        // we commit and the progress loop publishes them.
        let payload = unsafe { row.bytes_mut(off + SLOT_HEADER_BYTES, len) };
        Ok(SendSlot {
            sender: self,
            position,
            offset: off,
            payload,
            committed: false,
        })
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

    fn finish(&mut self, null_count: u32, len: u32) {
        let row = self.sender.fabric.row(self.sender.fabric.member_rank());
        row.u32_at(self.offset + 8).store(null_count, Ordering::Relaxed);
        row.u32_at(self.offset + 12).store(len, Ordering::Relaxed);
        // The Release in `commit` orders the payload and header before the mark.
        self.sender.ring.commit(self.position);
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
