//! The shared state of a fanout domain and the protocol steps on it:
//! membership, claiming a multicast, scatter (send, help, skip), gather
//! (combining acknowledgements), completion. Atomics only: no threads, no
//! clock, no parking. Waking a parked slot is asked of the caller through
//! [`Wake`]; waiting is the runtime's ([`crate::Domain`], [`crate::Port`]).
//!
//! ```text
//!  membership line   members: u64 (bit s = slot s joined; bit 63 IN_FLIGHT)
//!  flight line       last_seq | snapshot_seq | targets | failed_seq
//!  completion line   done_seq (+ SLEEPING) | waiter
//!  mailbox[s] line   seq (+ SLEEPING) | payload | targets | acked_seq (+ SLEEPING) | ack_to
//!  gather[s] line    pending | ack_to
//! ```
//!
//! Waking: a waiter sets [`SLEEPING`] (bit 63) in the very word it waits
//! on, by a compare-exchange from the value it checked, and parks only if
//! that succeeded; the writer replaces the word by a swap and wakes the
//! waiter if the bit was set. One word, so coherence alone rules out a
//! lost wake-up (no fences; the loom models check it).
//!
//! Each is one 64-byte line (`#[repr(C, align(64))]`), so the hot counters
//! of different gather nodes never share a line. A gather node combines
//! the acknowledgements of its subtree and, when its `pending` reaches 0,
//! acknowledges to its own target `ack_to`: another gather node, or
//! [`ACK_COMPLETE`] (the completion line the origin polls). A node with a
//! single contribution has no counter: that contribution acknowledges
//! straight to the node's target (the chain stays as short as the
//! combining needs).

use crate::plan::{ack_count, child_action, ChildAction, Layout};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::topology::{SlotSet, Tree, SLOTS_MAX_LIVE};
use crate::FanoutError;

/// The acknowledgement target "the multicast is complete".
pub const ACK_COMPLETE: u32 = u32::MAX;
/// The acknowledgement target of a flat multicast: the target's own flag.
pub const ACK_FLAG: u32 = u32::MAX - 1;
/// Set in a mailbox's `seq`, the `done_seq` or an `acked_seq` word by a
/// thread that parks until that word changes.
pub const SLEEPING: u64 = 1 << 63;
/// Set in the membership word while a multicast is in flight: claiming
/// is a compare-exchange on the word that joins and leaves change, so the
/// snapshot is exactly the value it replaced, and a leave's own read-
/// modify-write says whether a multicast was in flight when it left.
pub const IN_FLIGHT: u64 = 1 << 63;

/// Asked of the runtime: wake the thread serving `slot` if it is parked.
pub trait Wake {
    fn wake(&self, slot: usize);
}

/// A message as a slot's mailbox holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    pub seq: u64,
    pub payload: u64,
    /// The multicast's snapshot of targets (members less the origin).
    pub targets: u64,
    /// Where this slot's subtree acknowledges.
    pub ack_to: u32,
}

#[repr(C, align(64))]
struct MembershipLine {
    members: AtomicU64,
}

#[repr(C, align(64))]
struct FlightLine {
    /// The last multicast finished (or refused); written only by the
    /// holder of IN_FLIGHT.
    last_seq: AtomicU64,
    snapshot_seq: AtomicU64,
    targets: AtomicU64,
    failed_seq: AtomicU64,
}

#[repr(C, align(64))]
struct CompletionLine {
    done_seq: AtomicU64,
    waiter: AtomicU32,
}

#[repr(C, align(64))]
pub(crate) struct MailboxLine {
    seq: AtomicU64,
    payload: AtomicU64,
    targets: AtomicU64,
    acked_seq: AtomicU64,
    ack_to: AtomicU32,
}

#[repr(C, align(64))]
struct GatherLine {
    pending: AtomicU32,
    ack_to: AtomicU32,
}

#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<MembershipLine>() == 64);
    assert!(std::mem::size_of::<FlightLine>() == 64);
    assert!(std::mem::size_of::<CompletionLine>() == 64);
    assert!(std::mem::size_of::<MailboxLine>() == 64);
    assert!(std::mem::size_of::<GatherLine>() == 64);
};

/// A claimed multicast: its sequence number and snapshot of targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flight {
    pub seq: u64,
    pub origin: usize,
    pub targets: u64,
}

/// Why a multicast could not be claimed.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Another multicast is in flight.
    Busy,
    Refused(FanoutError),
}

/// The shared state of a domain of `slots` slots.
pub struct State {
    tree: Tree,
    layout: Layout,
    membership: MembershipLine,
    flight: FlightLine,
    completion: CompletionLine,
    mailboxes: Box<[MailboxLine]>,
    gathers: Box<[GatherLine]>,
}

impl State {
    pub fn new(tree: Tree, layout: Layout) -> Result<State, FanoutError> {
        let slots = tree.slots();
        if slots > SLOTS_MAX_LIVE {
            return Err(FanoutError::TooManyLiveSlots {
                slots,
                max: SLOTS_MAX_LIVE,
            });
        }
        let mailboxes = (0..slots)
            .map(|_| MailboxLine {
                seq: AtomicU64::new(0),
                payload: AtomicU64::new(0),
                targets: AtomicU64::new(0),
                acked_seq: AtomicU64::new(0),
                ack_to: AtomicU32::new(0),
            })
            .collect();
        let gathers = (0..slots)
            .map(|_| GatherLine {
                pending: AtomicU32::new(0),
                ack_to: AtomicU32::new(0),
            })
            .collect();
        Ok(State {
            tree,
            layout,
            membership: MembershipLine {
                members: AtomicU64::new(0),
            },
            flight: FlightLine {
                last_seq: AtomicU64::new(0),
                snapshot_seq: AtomicU64::new(0),
                targets: AtomicU64::new(0),
                failed_seq: AtomicU64::new(0),
            },
            completion: CompletionLine {
                done_seq: AtomicU64::new(0),
                waiter: AtomicU32::new(0),
            },
            mailboxes,
            gathers,
        })
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }
    pub fn slots(&self) -> usize {
        self.tree.slots()
    }

    pub(crate) fn check_slot(&self, slot: usize) -> Result<(), FanoutError> {
        if slot >= self.slots() {
            return Err(FanoutError::SlotOutOfRange {
                slot,
                slots: self.slots(),
            });
        }
        Ok(())
    }

    /// The members now (a snapshot).
    pub fn members(&self) -> u64 {
        self.membership.members.load(Ordering::Acquire) & !IN_FLIGHT
    }

    /// Join `slot`: one atomic OR. A multicast already claimed does not
    /// include the new member (its snapshot was taken).
    pub fn join(&self, slot: usize) -> Result<(), FanoutError> {
        self.check_slot(slot)?;
        let bit = 1u64 << slot;
        // AcqRel: a read-modify-write of the word `claim` exchanges.
        let before = self.membership.members.fetch_or(bit, Ordering::AcqRel);
        if before & bit != 0 {
            return Err(FanoutError::SlotOccupied { slot });
        }
        Ok(())
    }

    /// Leave `slot`: one atomic AND. Returns the multicast in flight at
    /// that moment, if any: its snapshot may still hold `slot`
    /// ([`State::snapshot_holds`]), and then `slot` must serve it.
    pub fn leave(&self, slot: usize) -> Result<Option<u64>, FanoutError> {
        self.check_slot(slot)?;
        let bit = 1u64 << slot;
        // Acquire: this read-modify-write continues the release sequence
        // of the last `finish` (its Release fetch_and), so last_seq below
        // is that multicast's, and the one in flight is the next.
        let before = self.membership.members.fetch_and(!bit, Ordering::AcqRel);
        if before & bit == 0 {
            return Err(FanoutError::NotJoined { slot });
        }
        if before & IN_FLIGHT == 0 {
            return Ok(None);
        }
        Ok(Some(self.flight.last_seq.load(Ordering::Relaxed) + 1))
    }

    /// Whether the snapshot of multicast `seq` holds `slot`: `Ok(false)`
    /// also when `seq` is over; `Err(())` when its snapshot is not
    /// published yet (ask again).
    #[allow(clippy::result_unit_err)]
    pub fn snapshot_holds(&self, slot: usize, seq: u64) -> Result<bool, ()> {
        if self.in_flight() != Some(seq) || self.failed_seq() != 0 {
            return Ok(false);
        }
        // Acquire: partner of the Release store of snapshot_seq in `claim`
        // (the targets written before it are visible).
        if self.flight.snapshot_seq.load(Ordering::Acquire) != seq {
            return Err(());
        }
        Ok(self.flight.targets.load(Ordering::Relaxed) & (1 << slot) != 0)
    }

    /// The multicast in flight now, if any.
    pub fn in_flight(&self) -> Option<u64> {
        // Acquire: partner of `finish`'s Release (last_seq is current).
        let members = self.membership.members.load(Ordering::Acquire);
        (members & IN_FLIGHT != 0).then(|| self.flight.last_seq.load(Ordering::Relaxed) + 1)
    }

    pub fn failed_seq(&self) -> u64 {
        self.flight.failed_seq.load(Ordering::Acquire)
    }

    /// Claim the next multicast for `origin`: set IN_FLIGHT in the
    /// membership word; the value replaced is the snapshot.
    pub fn claim(&self, origin: usize) -> Result<Flight, Claim> {
        self.check_slot(origin).map_err(Claim::Refused)?;
        let failed = self.failed_seq();
        if failed != 0 {
            return Err(Claim::Refused(FanoutError::Failed { seq: failed }));
        }
        let bit = 1u64 << origin;
        let mut members = self.membership.members.load(Ordering::Relaxed);
        let mut attempts = 0u32;
        loop {
            if members & IN_FLIGHT != 0 {
                return Err(Claim::Busy);
            }
            if members & bit == 0 {
                return Err(Claim::Refused(FanoutError::NotMember { slot: origin }));
            }
            // Acquire: partner of the last `finish`'s Release (last_seq).
            match self.membership.members.compare_exchange_weak(
                members,
                members | IN_FLIGHT,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => members = now,
            }
            attempts += 1;
            if attempts == 1024 {
                // Joins and leaves keep changing the word: try later.
                return Err(Claim::Busy);
            }
        }
        let seq = self.flight.last_seq.load(Ordering::Relaxed) + 1;
        assert!(seq < SLEEPING, "seq_leaves_the_sleeping_bit_free");
        let targets = members & !bit;
        // Relaxed: read by a completer after its swap of a word this
        // origin armed (compare-exchange, Release) before it parked.
        self.completion.waiter.store(origin as u32, Ordering::Relaxed);
        self.flight.targets.store(targets, Ordering::Relaxed);
        // Release: partner of the Acquire load in `snapshot_holds`.
        self.flight.snapshot_seq.store(seq, Ordering::Release);
        Ok(Flight { seq, origin, targets })
    }

    /// Start a claimed multicast: the origin does the root's scatter (a
    /// flat send to every target; or the tree root's, sending, helping
    /// and skipping by the layout).
    pub fn start(&self, flight: &Flight, payload: u64, wake: &dyn Wake) {
        let set = SlotSet::from_word(flight.targets);
        let message = Message {
            seq: flight.seq,
            payload,
            targets: flight.targets,
            ack_to: ACK_COMPLETE,
        };
        match self.layout {
            Layout::Flat => {
                for target in set.iter() {
                    self.send(
                        target,
                        Message {
                            ack_to: ACK_FLAG,
                            ..message
                        },
                        wake,
                    );
                }
            }
            Layout::Tree if flight.origin == 0 => {
                let mine = self.scatter(0, message, wake);
                self.acknowledge(0, flight.seq, mine, wake);
            }
            Layout::Tree => self.send(0, message, wake),
            Layout::TreeHelp | Layout::TreeHelpSkip => {
                if flight.targets == 0 {
                    self.complete(flight.seq, wake);
                } else if set.contains(0) {
                    self.send(0, message, wake);
                } else {
                    self.scatter(0, message, wake);
                }
            }
        }
    }

    /// Write `slot`'s mailbox and wake it if it parked.
    fn send(&self, slot: usize, message: Message, wake: &dyn Wake) {
        let mailbox = &self.mailboxes[slot];
        mailbox.payload.store(message.payload, Ordering::Relaxed);
        mailbox.targets.store(message.targets, Ordering::Relaxed);
        mailbox.ack_to.store(message.ack_to, Ordering::Relaxed);
        // Release: partner of the Acquire load in `receive` (the fields
        // above, and every counter this scatter set, are visible to it).
        // A swap: it returns the receiver's SLEEPING bit if it parked
        // (partner of the compare-exchange in `arm_mailbox`).
        let before = mailbox.seq.swap(message.seq, Ordering::AcqRel);
        debug_assert!(
            before & !SLEEPING < message.seq,
            "one_message_per_seq: slot {slot} had {} got {:?} layout {:?}",
            before & !SLEEPING,
            message,
            self.layout
        );
        if before & SLEEPING != 0 {
            wake.wake(slot);
        }
    }

    /// The scatter of node `slot` for `message` (done by `slot`'s thread
    /// on receipt, or by a helper on its behalf). Returns where `slot`'s
    /// own acknowledgement goes (if it acknowledges itself).
    pub fn scatter(&self, slot: usize, message: Message, wake: &dyn Wake) -> u32 {
        let set = SlotSet::from_word(message.targets);
        let count = ack_count(&self.tree, self.layout, slot, &set);
        let mine = match count {
            0 => {
                // A helped node with nothing below: it is complete now.
                self.ack(message.ack_to, message.seq, wake);
                return message.ack_to;
            }
            1 => message.ack_to,
            _ => {
                let gather = &self.gathers[slot];
                gather.ack_to.store(message.ack_to, Ordering::Relaxed);
                // Relaxed: published to the contributors by the Release
                // of the sends below (or program order for helped ones
                // and for this node's own acknowledgement).
                gather.pending.store(count, Ordering::Relaxed);
                slot as u32
            }
        };
        for &child in self.tree.children(slot) {
            let child = child as usize;
            match child_action(&self.tree, self.layout, child, &set) {
                ChildAction::Send => self.send(
                    child,
                    Message {
                        ack_to: mine,
                        ..message
                    },
                    wake,
                ),
                ChildAction::Help => {
                    debug_assert!(!set.contains(child), "helping_only_non_targets");
                    self.scatter(
                        child,
                        Message {
                            ack_to: mine,
                            ..message
                        },
                        wake,
                    );
                }
                ChildAction::Skip => {}
            }
        }
        mine
    }

    /// The message in `slot`'s mailbox if it is newer than `last_seen`.
    #[inline]
    pub fn receive(&self, slot: usize, last_seen: u64) -> Option<Message> {
        let mailbox = &self.mailboxes[slot];
        // Acquire: partner of the Release store in `send`.
        let seq = mailbox.seq.load(Ordering::Acquire) & !SLEEPING;
        if seq == last_seen {
            return None;
        }
        assert!(seq > last_seen, "mailbox_seq_is_monotonic: {seq} after {last_seen}");
        Some(Message {
            seq,
            payload: mailbox.payload.load(Ordering::Relaxed),
            targets: mailbox.targets.load(Ordering::Relaxed),
            ack_to: mailbox.ack_to.load(Ordering::Relaxed),
        })
    }

    /// The last multicast `slot` acknowledged.
    pub fn acked_seq(&self, slot: usize) -> u64 {
        // Acquire: partner of the Release store in `acknowledge`.
        self.mailboxes[slot].acked_seq.load(Ordering::Acquire) & !SLEEPING
    }

    /// Whether `slot` is to handle (deliver) `message`, or only forward it.
    pub fn is_target(&self, slot: usize, message: &Message) -> bool {
        message.targets & (1 << slot) != 0
    }

    /// What the receiver does after its scatter (and handler, if it is a
    /// target): acknowledge its own contribution to `mine`.
    pub fn acknowledge(&self, slot: usize, seq: u64, mine: u32, wake: &dyn Wake) {
        let acked = &self.mailboxes[slot].acked_seq;
        if mine == ACK_FLAG {
            // Release: partner of the Acquire loads in `flat_acked` and
            // `unacknowledged`; a swap returns the origin's SLEEPING bit
            // (partner of the compare-exchange in `arm_flight`).
            if acked.swap(seq, Ordering::AcqRel) & SLEEPING != 0 {
                self.wake_waiter(wake);
            }
        } else {
            // Release: partner of the Acquire load in `unacknowledged`.
            acked.store(seq, Ordering::Release);
            self.ack(mine, seq, wake);
        }
    }

    /// Combine one acknowledgement into gather node `node` and upward.
    fn ack(&self, mut node: u32, seq: u64, wake: &dyn Wake) {
        for _ in 0..=self.tree.height() + 1 {
            if node == ACK_COMPLETE {
                self.complete(seq, wake);
                return;
            }
            let gather = &self.gathers[node as usize];
            // AcqRel: Release hands this contributor's history to the last
            // one; Acquire (by the last) takes every contributor's, and the
            // scatter's stores of pending/ack_to (partner: the mailbox
            // Release/Acquire in `send`/`receive`).
            let before = gather.pending.fetch_sub(1, Ordering::AcqRel);
            assert!(before >= 1, "acks_never_exceed_the_count: node {node} seq {seq}");
            if before != 1 {
                return;
            }
            node = gather.ack_to.load(Ordering::Relaxed);
        }
        unreachable!("an acknowledgement climbs at most the height of the tree");
    }

    fn complete(&self, seq: u64, wake: &dyn Wake) {
        // Release: partner of the Acquire load in `is_done`; a swap
        // returns the origin's SLEEPING bit (partner: `arm_flight`).
        if self.completion.done_seq.swap(seq, Ordering::AcqRel) & SLEEPING != 0 {
            self.wake_waiter(wake);
        }
    }

    fn wake_waiter(&self, wake: &dyn Wake) {
        // Relaxed: ordered by the swap that saw SLEEPING (Acquire) after
        // the origin's arming compare-exchange (Release).
        wake.wake(self.completion.waiter.load(Ordering::Relaxed) as usize);
    }

    /// Before `slot`'s thread parks: set SLEEPING in its mailbox word if
    /// that still holds `last_seen`. False: a message came; do not park.
    pub fn arm_mailbox(&self, slot: usize, last_seen: u64) -> bool {
        arm(&self.mailboxes[slot].seq, |v| v == last_seen)
    }

    /// Before the origin of `flight` parks: set SLEEPING in the word whose
    /// change it waits for (the completion; for a flat multicast, the flag
    /// of the first target that has not acknowledged). False: that word
    /// changed (or nothing is left to wait for); do not park.
    pub fn arm_flight(&self, flight: &Flight) -> bool {
        if self.layout != Layout::Flat {
            return arm(&self.completion.done_seq, |v| v != flight.seq);
        }
        let first = (0..self.slots()).find(|&s| flight.targets & (1 << s) != 0 && self.acked_seq(s) != flight.seq);
        match first {
            Some(s) => arm(&self.mailboxes[s].acked_seq, |v| v != flight.seq),
            None => false,
        }
    }

    /// Whether the tree multicast `seq` completed.
    #[inline]
    pub fn is_done(&self, seq: u64) -> bool {
        // Acquire: partner of the Release store in `complete`.
        self.completion.done_seq.load(Ordering::Acquire) & !SLEEPING == seq
    }

    /// A flat multicast: whether every target from `*cursor` on (in slot
    /// order) acknowledged `seq`; the cursor moves past those that did.
    #[inline]
    pub fn flat_acked(&self, flight: &Flight, cursor: &mut usize) -> bool {
        while *cursor < self.slots() {
            if flight.targets & (1 << *cursor) != 0 {
                // Acquire: partner of the Release store in `acknowledge`.
                if self.acked_seq(*cursor) != flight.seq {
                    return false;
                }
            }
            *cursor += 1;
        }
        true
    }

    /// The slots that owed `flight` an acknowledgement and did not give it.
    pub fn unacknowledged(&self, flight: &Flight) -> Vec<usize> {
        let expected = if self.layout == Layout::Tree {
            u64::MAX
        } else {
            flight.targets
        };
        (0..self.slots())
            .filter(|&s| expected & (1 << s) != 0)
            // Acquire: partner of the Release store in `acknowledge`.
            .filter(|&s| self.acked_seq(s) != flight.seq)
            .collect()
    }

    /// End a completed multicast: the next may be claimed.
    pub fn finish(&self, flight: &Flight) {
        assert_eq!(self.in_flight(), Some(flight.seq), "finish_ends_the_flight_it_claimed");
        self.flight.last_seq.store(flight.seq, Ordering::Relaxed);
        // Release: partner of the Acquire of the next `claim`, `leave` and
        // `in_flight` (last_seq is visible with the cleared bit).
        self.membership.members.fetch_and(!IN_FLIGHT, Ordering::AcqRel);
    }

    /// A multicast that did not complete: evict the slots that did not
    /// acknowledge and fail the domain (IN_FLIGHT stays set: late
    /// acknowledgements could otherwise count into a later multicast).
    pub fn fail(&self, flight: &Flight, missing: &[usize]) {
        let mask = missing.iter().fold(0u64, |m, s| m | 1 << s);
        self.membership.members.fetch_and(!mask, Ordering::AcqRel);
        // Release: partner of the Acquire loads in `failed_seq`.
        self.flight.failed_seq.store(flight.seq, Ordering::Release);
    }
}

/// Set SLEEPING in `word` if its value (without the bit) still `waits`.
fn arm(word: &AtomicU64, waits: impl Fn(u64) -> bool) -> bool {
    // Acquire: the value checked is the one the waiter acts on.
    let seen = word.load(Ordering::Acquire);
    if !waits(seen & !SLEEPING) {
        return false;
    }
    // Release: partner of the writer's swap (AcqRel), which sees the bit
    // and wakes; a failed exchange means the word changed: re-check.
    word.compare_exchange(seen, seen | SLEEPING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}
