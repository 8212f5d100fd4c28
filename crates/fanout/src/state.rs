//! The shared state of a fanout domain and the protocol steps on it:
//! membership, claiming a multicast, scatter (send, help, skip), gather
//! (combining acknowledgements), completion, and the wake-ups they owe.
//! Atomics only: no threads, no clock; a parked slot is woken through
//! its [`WakeWord`] (a futex word), waiting is the runtime's
//! ([`crate::Domain`], [`crate::Port`]).
//!
//! All of it lives in one [`Region`], `#[repr(C)]`, fixed-width atomics,
//! every part on its own 64-byte line(s): on the heap for a domain of
//! threads, or mapped from a file (`/dev/shm/spindle-fanout@NAME`) for a
//! domain of processes ([`crate::shm`]). The same code runs on both.
//!
//! ```text
//!  offset  line                fields (all little-endian atomics)
//!  0x0000  header              magic u64 | version u32 | layout u32 | shape u32 | shape_k u32
//!                              | slots u32 | creator_pid u32 | tree_hash u64 | region_tag u64
//!  0x0040  membership          members u64 (bit s = slot s joined; bit 63 IN_FLIGHT)
//!  0x0080  flight              last_seq u64 | snapshot_seq u64 | targets u64 | failed_seq u64
//!  0x00c0  completion          done_seq u64 (+SLEEPING) | waiter u32
//!  0x0100  mailbox[0..63]      seq u64 (+SLEEPING) | payload u64 | targets u64 | ack_to u32
//!                              | (4 bytes) | flag_seq u64 (+SLEEPING)
//!  0x10c0  acked[0..63]        acked_seq u64 (+SLEEPING)
//!  0x2080  gather[0..63]       pending u32 | ack_to u32
//!  0x3040  slot[0..63]         pid u32 (the attached process; 0: free) | wake u32 (futex word)
//!  0x4000  end (16,384 bytes; 63 = the live slots, one membership word)
//! ```
//!
//! Where a slot acknowledges depends on who waits for it:
//!
//! - **Its flag, in its mailbox line** (`flag_seq`), when the origin waits
//!   for the slot itself: every target of a flat multicast (Linux's
//!   `smp_call_function_many` keeps its lock flag in the same `csd` as
//!   the call), and the single target of a `tree_help_skip` multicast
//!   (skipping and helping reach it by a direct send). The exchange is
//!   then one line going there and back, the pattern of a cache-line
//!   round trip; two lines (the mailbox there, another line back) cost
//!   about twice that on a 16-core Intel machine, whether written by
//!   locked swaps or by plain stores (bench/results/fanout-16core-fences.json).
//! - **Its `acked` line and a gather node** otherwise: a target inside a
//!   tree multicast records `acked_seq` on a line of its own (read only
//!   after a timeout, and by a port attaching to the slot) and
//!   acknowledges up the tree; a store to its mailbox line there would
//!   take that line back from the sender before the gather's locked
//!   operation could run (the swap drains the store buffer).
//!
//! All-zero is the initial state (a fresh `ftruncate`d file is a valid
//! empty domain once its header is written).
//!
//! Waking: a waiter sets [`SLEEPING`] (bit 63) in the very word it waits
//! on, by a compare-exchange from the value it checked, and sleeps only
//! if that succeeded; the writer replaces the word by a swap and, if the
//! bit was set, bumps the waiter's slot's wake word and wakes it (see
//! [`WakeWord`] for the futex half). One word, so coherence alone rules
//! out a lost wake-up (no fences; the loom models check it).
//!
//! A gather node combines the acknowledgements of its subtree and, when
//! its `pending` reaches 0, acknowledges to its own target `ack_to`:
//! another gather node, or [`ACK_COMPLETE`] (the completion line the
//! origin polls). A node with a single contribution has no counter: that
//! contribution acknowledges straight to the node's target (the chain
//! stays as short as the combining needs).

use std::ptr::NonNull;

use crate::plan::{ack_count, child_action, visited_children, ChildAction, Layout};
use crate::sync::{AtomicU32, AtomicU64, Ordering, WakeWord};
use crate::topology::{SlotSet, Tree};
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

/// Slots a [`Region`] has room for: every live slot (loom models use
/// small domains, and a small region keeps their state space small).
#[cfg(not(loom))]
pub const REGION_SLOTS: usize = crate::topology::SLOTS_MAX_LIVE;
#[cfg(loom)]
pub const REGION_SLOTS: usize = 4;

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

/// What identifies a region: written by the creator of a mapped domain
/// (the magic last), checked by every process that opens it. Zero in a
/// heap domain.
#[repr(C, align(64))]
pub(crate) struct HeaderLine {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    /// The multicast [`Layout`]'s tag (1 flat .. 4 tree_help_skip).
    pub(crate) layout: AtomicU32,
    /// The tree's shape tag (1 flat, 2 k-ary, 3 cpu) and its fan-out.
    pub(crate) shape: AtomicU32,
    pub(crate) shape_k: AtomicU32,
    pub(crate) slots: AtomicU32,
    pub(crate) creator_pid: AtomicU32,
    /// FNV-1a of the tree's parent array (the tree an opener rebuilds
    /// from shape and slots must be the creator's).
    pub(crate) tree_hash: AtomicU64,
    /// A fingerprint of this struct layout (sizes and offsets).
    pub(crate) region_tag: AtomicU64,
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
struct MailboxLine {
    seq: AtomicU64,
    payload: AtomicU64,
    targets: AtomicU64,
    ack_to: AtomicU32,
    /// The last multicast the slot acknowledged to its origin directly
    /// (`ACK_FLAG`), written by the slot, polled by the origin.
    flag_seq: AtomicU64,
}

/// The last multicast a slot acknowledged (written by that slot only).
#[repr(C, align(64))]
struct AckedLine {
    acked_seq: AtomicU64,
}

#[repr(C, align(64))]
struct GatherLine {
    pending: AtomicU32,
    ack_to: AtomicU32,
}

/// Who holds a slot, and the word its port sleeps on.
#[repr(C, align(64))]
struct SlotLine {
    /// The process attached to the slot (0: free). A slot whose process
    /// is gone can be taken over ([`State::take_slot`]).
    pid: AtomicU32,
    wake: WakeWord,
}

/// Everything a domain shares, in one `#[repr(C)]` block (the diagram in
/// the module docs).
#[repr(C)]
pub struct Region {
    pub(crate) header: HeaderLine,
    membership: MembershipLine,
    flight: FlightLine,
    completion: CompletionLine,
    mailboxes: [MailboxLine; REGION_SLOTS],
    acked: [AckedLine; REGION_SLOTS],
    gathers: [GatherLine; REGION_SLOTS],
    slots: [SlotLine; REGION_SLOTS],
}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<HeaderLine>() == 64);
    assert!(size_of::<MembershipLine>() == 64);
    assert!(size_of::<FlightLine>() == 64);
    assert!(size_of::<CompletionLine>() == 64);
    assert!(size_of::<MailboxLine>() == 64);
    assert!(size_of::<AckedLine>() == 64);
    assert!(size_of::<GatherLine>() == 64);
    assert!(size_of::<SlotLine>() == 64);
    assert!(offset_of!(HeaderLine, magic) == 0);
    assert!(offset_of!(HeaderLine, slots) == 24);
    assert!(offset_of!(HeaderLine, tree_hash) == 32);
    assert!(offset_of!(HeaderLine, region_tag) == 40);
    assert!(offset_of!(MailboxLine, ack_to) == 24);
    assert!(offset_of!(MailboxLine, flag_seq) == 32);
    assert!(offset_of!(SlotLine, wake) == 4);
    assert!(offset_of!(Region, membership) == 0x40);
    assert!(offset_of!(Region, flight) == 0x80);
    assert!(offset_of!(Region, completion) == 0xc0);
    assert!(offset_of!(Region, mailboxes) == 0x100);
    assert!(offset_of!(Region, acked) == 0x10c0);
    assert!(offset_of!(Region, gathers) == 0x2080);
    assert!(offset_of!(Region, slots) == 0x3040);
    assert!(size_of::<Region>() == 0x4000);
    assert!(std::mem::align_of::<Region>() == 64);
};

/// The fingerprint of [`Region`]'s layout written in a mapped header: a
/// binary built with another layout refuses the file.
#[cfg(not(loom))]
pub(crate) const REGION_TAG: u64 = {
    use std::mem::{offset_of, size_of};
    let parts = [
        size_of::<Region>() as u64,
        REGION_SLOTS as u64,
        offset_of!(Region, mailboxes) as u64,
        offset_of!(Region, acked) as u64,
        offset_of!(Region, gathers) as u64,
        offset_of!(Region, slots) as u64,
        offset_of!(MailboxLine, ack_to) as u64,
        offset_of!(MailboxLine, flag_seq) as u64,
        offset_of!(SlotLine, wake) as u64,
    ];
    let mut hash = FNV_OFFSET;
    let mut i = 0;
    while i < parts.len() {
        hash = fnv1a(hash, parts[i]);
        i += 1;
    }
    hash
};

#[cfg(not(loom))]
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// One FNV-1a step over the eight bytes of `value`.
#[cfg(not(loom))]
pub(crate) const fn fnv1a(mut hash: u64, value: u64) -> u64 {
    let bytes = value.to_le_bytes();
    let mut i = 0;
    while i < 8 {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

impl Region {
    /// A zeroed region on the heap (the initial state).
    fn boxed() -> Box<Region> {
        Box::new(Region {
            header: HeaderLine {
                magic: AtomicU64::new(0),
                version: AtomicU32::new(0),
                layout: AtomicU32::new(0),
                shape: AtomicU32::new(0),
                shape_k: AtomicU32::new(0),
                slots: AtomicU32::new(0),
                creator_pid: AtomicU32::new(0),
                tree_hash: AtomicU64::new(0),
                region_tag: AtomicU64::new(0),
            },
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
            mailboxes: std::array::from_fn(|_| MailboxLine {
                seq: AtomicU64::new(0),
                payload: AtomicU64::new(0),
                targets: AtomicU64::new(0),
                ack_to: AtomicU32::new(0),
                flag_seq: AtomicU64::new(0),
            }),
            acked: std::array::from_fn(|_| AckedLine {
                acked_seq: AtomicU64::new(0),
            }),
            gathers: std::array::from_fn(|_| GatherLine {
                pending: AtomicU32::new(0),
                ack_to: AtomicU32::new(0),
            }),
            slots: std::array::from_fn(|_| SlotLine {
                pid: AtomicU32::new(0),
                wake: WakeWord::new(),
            }),
        })
    }
}

/// A claimed multicast: its sequence number and snapshot of targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flight {
    pub seq: u64,
    pub origin: usize,
    pub targets: u64,
    /// Every target acknowledges in its own flag (flat, or a skipping
    /// multicast with one target): the origin polls the flags, not the
    /// completion.
    pub flags: bool,
}

/// Why a multicast could not be claimed.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Another multicast is in flight.
    Busy,
    Refused(FanoutError),
}

/// What keeps a [`State`]'s region alive.
pub(crate) enum Backing {
    /// A region of `Box::into_raw`: freed when the state drops.
    Heap,
    /// A mapped file (unmapped, and removed if this process created it,
    /// when the state drops).
    #[cfg(not(loom))]
    Mapped(crate::shm::Mapping),
}

/// The shared state of a domain of `slots` slots: a view of its
/// [`Region`] and the tree and layout that give it meaning.
pub struct State {
    tree: Tree,
    layout: Layout,
    region: NonNull<Region>,
    backing: Backing,
}

// SAFETY: a Region is atomics only (Sync and Send); `region` points to
// memory `backing` owns (a leaked Box or a mapping) for the state's life,
// so the state may move to and be shared with other threads.
unsafe impl Send for State {}
// SAFETY: as above: every access through `region` is atomic.
unsafe impl Sync for State {}

impl Drop for State {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Heap) {
            // SAFETY: `region` came from Box::into_raw in `State::new` and
            // nothing else frees it; no reference into it outlives `self`.
            drop(unsafe { Box::from_raw(self.region.as_ptr()) });
        }
    }
}

impl State {
    /// A state on the heap (a domain of threads).
    pub fn new(tree: Tree, layout: Layout) -> Result<State, FanoutError> {
        check_live_slots(tree.slots())?;
        let region = NonNull::from(Box::leak(Region::boxed()));
        Ok(State {
            tree,
            layout,
            region,
            backing: Backing::Heap,
        })
    }

    /// A state over a region another owner keeps alive (a mapping).
    ///
    /// # Safety
    /// `region` points to a `Region`-sized, 64-byte-aligned block that
    /// holds a valid region (all-zero is one) and stays mapped while
    /// `backing` lives; it is accessed only through atomics.
    #[cfg(not(loom))]
    pub(crate) unsafe fn over(
        tree: Tree,
        layout: Layout,
        region: NonNull<Region>,
        backing: Backing,
    ) -> Result<State, FanoutError> {
        check_live_slots(tree.slots())?;
        Ok(State {
            tree,
            layout,
            region,
            backing,
        })
    }

    #[inline(always)]
    pub(crate) fn r(&self) -> &Region {
        // SAFETY: see the type's Send/Sync note: `region` is valid for
        // the life of `self`, shared, and only accessed atomically.
        unsafe { self.region.as_ref() }
    }

    /// The mapping behind this state, if it is a domain of processes.
    #[cfg(not(loom))]
    pub(crate) fn mapping(&self) -> Option<&crate::shm::Mapping> {
        match &self.backing {
            Backing::Mapped(m) => Some(m),
            Backing::Heap => None,
        }
    }

    /// Bump `slot`'s wake word and wake its port if it sleeps there.
    #[inline]
    fn wake_slot(&self, slot: usize) {
        self.r().slots[slot].wake.wake();
    }

    /// The word `slot`'s port sleeps on.
    #[inline]
    pub fn wake_word(&self, slot: usize) -> &WakeWord {
        &self.r().slots[slot].wake
    }

    /// Attach process `pid` to `slot`: take it if it is free, or if the
    /// process holding it is gone (`alive` says; a zombie counts as
    /// alive until it is reaped). A slot taken over keeps its membership
    /// bit: the new port serves as that member.
    pub fn take_slot(&self, slot: usize, pid: u32, alive: impl Fn(u32) -> bool) -> Result<(), FanoutError> {
        self.check_slot(slot)?;
        assert_ne!(pid, 0, "a pid is never 0");
        let owner = &self.r().slots[slot].pid;
        // Acquire: partner of the Release in `release_slot` (the last
        // owner's acknowledgements are visible to the next).
        let mut held = owner.load(Ordering::Acquire);
        loop {
            if held == pid {
                return Err(FanoutError::SlotAttached { slot });
            }
            if held != 0 && alive(held) {
                return Err(FanoutError::SlotTaken { slot, pid: held });
            }
            // AcqRel: as above, and publishes this owner to the next.
            match owner.compare_exchange(held, pid, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(now) => held = now,
            }
        }
    }

    /// Detach `pid` from `slot` (a no-op if it no longer holds it).
    pub fn release_slot(&self, slot: usize, pid: u32) {
        // Release: partner of the Acquire in `take_slot`.
        let _ = self.r().slots[slot]
            .pid
            .compare_exchange(pid, 0, Ordering::Release, Ordering::Relaxed);
    }

    /// The process attached to `slot` (0: none).
    pub fn slot_pid(&self, slot: usize) -> u32 {
        self.r().slots[slot].pid.load(Ordering::Acquire)
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
        self.r().membership.members.load(Ordering::Acquire) & !IN_FLIGHT
    }

    /// Join `slot`: one atomic OR. A multicast already claimed does not
    /// include the new member (its snapshot was taken).
    pub fn join(&self, slot: usize) -> Result<(), FanoutError> {
        self.check_slot(slot)?;
        let bit = 1u64 << slot;
        // AcqRel: a read-modify-write of the word `claim` exchanges.
        let before = self.r().membership.members.fetch_or(bit, Ordering::AcqRel);
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
        let before = self.r().membership.members.fetch_and(!bit, Ordering::AcqRel);
        if before & bit == 0 {
            return Err(FanoutError::NotJoined { slot });
        }
        if before & IN_FLIGHT == 0 {
            return Ok(None);
        }
        Ok(Some(self.r().flight.last_seq.load(Ordering::Relaxed) + 1))
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
        if self.r().flight.snapshot_seq.load(Ordering::Acquire) != seq {
            return Err(());
        }
        Ok(self.r().flight.targets.load(Ordering::Relaxed) & (1 << slot) != 0)
    }

    /// The multicast in flight now, if any.
    pub fn in_flight(&self) -> Option<u64> {
        // Acquire: partner of `finish`'s Release (last_seq is current).
        let members = self.r().membership.members.load(Ordering::Acquire);
        (members & IN_FLIGHT != 0).then(|| self.r().flight.last_seq.load(Ordering::Relaxed) + 1)
    }

    pub fn failed_seq(&self) -> u64 {
        self.r().flight.failed_seq.load(Ordering::Acquire)
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
        let mut members = self.r().membership.members.load(Ordering::Relaxed);
        let mut attempts = 0u32;
        loop {
            if members & IN_FLIGHT != 0 {
                return Err(Claim::Busy);
            }
            if members & bit == 0 {
                return Err(Claim::Refused(FanoutError::NotMember { slot: origin }));
            }
            // Acquire: partner of the last `finish`'s Release (last_seq).
            match self.r().membership.members.compare_exchange_weak(
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
        let seq = self.r().flight.last_seq.load(Ordering::Relaxed) + 1;
        assert!(seq < SLEEPING, "seq_leaves_the_sleeping_bit_free");
        let targets = members & !bit;
        // Relaxed: read by a completer after its swap of a word this
        // origin armed (compare-exchange, Release) before it parked.
        // Written only when the origin changes: the completion line is
        // the one the last multicast's completer wrote, and a store here
        // would take it back before the send (one line transfer more on
        // the critical path of an origin that multicasts in a row).
        let waiter = &self.r().completion.waiter;
        if waiter.load(Ordering::Relaxed) != origin as u32 {
            waiter.store(origin as u32, Ordering::Relaxed);
        }
        self.r().flight.targets.store(targets, Ordering::Relaxed);
        // Release: partner of the Acquire load in `snapshot_holds`.
        self.r().flight.snapshot_seq.store(seq, Ordering::Release);
        let flags = match self.layout {
            Layout::Flat => true,
            Layout::TreeHelpSkip => targets.count_ones() == 1,
            Layout::Tree | Layout::TreeHelp => false,
        };
        Ok(Flight {
            seq,
            origin,
            targets,
            flags,
        })
    }

    /// Start a claimed multicast: the origin does the root's scatter (a
    /// flat send to every target; or the tree root's, sending, helping
    /// and skipping by the layout).
    pub fn start(&self, flight: &Flight, payload: u64) {
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
                    );
                }
            }
            Layout::Tree if flight.origin == 0 => {
                let mine = self.scatter(0, message);
                self.acknowledge(0, flight.seq, mine);
            }
            Layout::Tree => self.send(0, message),
            // One target: skipping and helping reach it by a direct send
            // (every node between is a helped non-member with one
            // contribution), and it acknowledges in its flag.
            Layout::TreeHelpSkip if flight.flags => {
                let target = flight.targets.trailing_zeros() as usize;
                self.send(
                    target,
                    Message {
                        ack_to: ACK_FLAG,
                        ..message
                    },
                );
            }
            Layout::TreeHelp | Layout::TreeHelpSkip => {
                if flight.targets == 0 {
                    self.complete(flight.seq);
                } else if set.contains(0) {
                    self.send(0, message);
                } else {
                    self.scatter(0, message);
                }
            }
        }
    }

    /// Write `slot`'s mailbox and wake it if it parked.
    fn send(&self, slot: usize, message: Message) {
        let mailbox = &self.r().mailboxes[slot];
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
            self.wake_slot(slot);
        }
    }

    /// The scatter of node `slot` for `message` (done by `slot`'s thread
    /// on receipt, or by a helper on its behalf). Returns where `slot`'s
    /// own acknowledgement goes (if it acknowledges itself).
    pub fn scatter(&self, slot: usize, message: Message) -> u32 {
        if self.layout == Layout::TreeHelpSkip && message.targets == 1 << slot {
            // The only target: nothing below to visit, one contribution
            // (its own), which goes straight to the node's target.
            debug_assert_eq!(
                ack_count(&self.tree, self.layout, slot, &SlotSet::from_word(message.targets)),
                1,
                "a lone target's scatter is its own acknowledgement"
            );
            return message.ack_to;
        }
        let set = SlotSet::from_word(message.targets);
        let count = ack_count(&self.tree, self.layout, slot, &set);
        let mine = match count {
            0 => {
                // A helped node with nothing below: it is complete now.
                self.ack(message.ack_to, message.seq);
                return message.ack_to;
            }
            1 => message.ack_to,
            _ => {
                let gather = &self.r().gathers[slot];
                gather.ack_to.store(message.ack_to, Ordering::Relaxed);
                // Relaxed: published to the contributors by the Release
                // of the sends below (or program order for helped ones
                // and for this node's own acknowledgement).
                gather.pending.store(count, Ordering::Relaxed);
                slot as u32
            }
        };
        let below = Message {
            ack_to: mine,
            ..message
        };
        if self.layout == Layout::TreeHelpSkip {
            for (child, action) in visited_children(&self.tree, slot, &set) {
                self.scatter_child(child, action, below);
            }
        } else {
            for &child in self.tree.children(slot) {
                let child = child as usize;
                self.scatter_child(child, child_action(&self.tree, self.layout, child, &set), below);
            }
        }
        mine
    }

    /// One child's part of a scatter: a send, help (its scatter done
    /// here), or nothing.
    #[inline]
    fn scatter_child(&self, child: usize, action: ChildAction, message: Message) {
        match action {
            ChildAction::Send => self.send(child, message),
            ChildAction::Help => {
                debug_assert!(message.targets & (1 << child) == 0, "helping_only_non_targets");
                self.scatter(child, message);
            }
            ChildAction::Skip => {}
        }
    }

    /// The message in `slot`'s mailbox if it is newer than `last_seen`.
    #[inline]
    pub fn receive(&self, slot: usize, last_seen: u64) -> Option<Message> {
        let mailbox = &self.r().mailboxes[slot];
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

    /// The last multicast `slot` acknowledged (in its acked line or its
    /// flag, whichever is later).
    pub fn acked_seq(&self, slot: usize) -> u64 {
        // Acquire: partner of the Release store in `acknowledge`.
        let acked = self.r().acked[slot].acked_seq.load(Ordering::Acquire) & !SLEEPING;
        acked.max(self.flag_seq(slot))
    }

    /// The last multicast `slot` acknowledged in its flag.
    #[inline]
    pub fn flag_seq(&self, slot: usize) -> u64 {
        // Acquire: partner of the swap (Release) in `acknowledge`.
        self.r().mailboxes[slot].flag_seq.load(Ordering::Acquire) & !SLEEPING
    }

    /// Whether `slot` is to handle (deliver) `message`, or only forward it.
    pub fn is_target(&self, slot: usize, message: &Message) -> bool {
        message.targets & (1 << slot) != 0
    }

    /// What the receiver does after its scatter (and handler, if it is a
    /// target): acknowledge its own contribution to `mine`.
    pub fn acknowledge(&self, slot: usize, seq: u64, mine: u32) {
        if mine == ACK_FLAG {
            // Release: partner of the Acquire loads in `flag_seq`; a swap
            // returns the origin's SLEEPING bit (partner of the
            // compare-exchange in `arm_flight`).
            let flag = &self.r().mailboxes[slot].flag_seq;
            if flag.swap(seq, Ordering::AcqRel) & SLEEPING != 0 {
                self.wake_waiter();
            }
        } else {
            let acked = &self.r().acked[slot].acked_seq;
            // Release: partner of the Acquire load in `unacknowledged`.
            acked.store(seq, Ordering::Release);
            self.ack(mine, seq);
        }
    }

    /// Combine one acknowledgement into gather node `node` and upward.
    fn ack(&self, mut node: u32, seq: u64) {
        for _ in 0..=self.tree.height() + 1 {
            if node == ACK_COMPLETE {
                self.complete(seq);
                return;
            }
            let gather = &self.r().gathers[node as usize];
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

    fn complete(&self, seq: u64) {
        // Release: partner of the Acquire load in `is_done`; a swap
        // returns the origin's SLEEPING bit (partner: `arm_flight`).
        if self.r().completion.done_seq.swap(seq, Ordering::AcqRel) & SLEEPING != 0 {
            self.wake_waiter();
        }
    }

    fn wake_waiter(&self) {
        // Relaxed: ordered by the swap that saw SLEEPING (Acquire) after
        // the origin's arming compare-exchange (Release).
        self.wake_slot(self.r().completion.waiter.load(Ordering::Relaxed) as usize);
    }

    /// Before `slot`'s thread parks: set SLEEPING in its mailbox word if
    /// that still holds `last_seen`. False: a message came; do not park.
    pub fn arm_mailbox(&self, slot: usize, last_seen: u64) -> bool {
        arm(&self.r().mailboxes[slot].seq, |v| v == last_seen)
    }

    /// Before the origin of `flight` parks: set SLEEPING in the word whose
    /// change it waits for (the completion; where the targets acknowledge
    /// in their flags, the flag of the first that has not). False: that
    /// word changed (or nothing is left to wait for); do not park.
    pub fn arm_flight(&self, flight: &Flight) -> bool {
        if !flight.flags {
            return arm(&self.r().completion.done_seq, |v| v != flight.seq);
        }
        let first = SlotSet::from_word(flight.targets)
            .iter()
            .find(|&s| self.flag_seq(s) != flight.seq);
        match first {
            Some(s) => arm(&self.r().mailboxes[s].flag_seq, |v| v != flight.seq),
            None => false,
        }
    }

    /// Whether `flight` completed: every target's flag, or the completion.
    #[inline]
    pub fn flight_done(&self, flight: &Flight, cursor: &mut usize) -> bool {
        if flight.flags {
            self.flags_acked(flight, cursor)
        } else {
            self.is_done(flight.seq)
        }
    }

    /// Whether the tree multicast `seq` completed.
    #[inline]
    pub fn is_done(&self, seq: u64) -> bool {
        // Acquire: partner of the Release store in `complete`.
        self.r().completion.done_seq.load(Ordering::Acquire) & !SLEEPING == seq
    }

    /// A multicast acknowledged in flags: whether every target from
    /// `*cursor` on (in slot order) acknowledged `seq` in its flag; the
    /// cursor moves past those that did.
    #[inline]
    pub fn flags_acked(&self, flight: &Flight, cursor: &mut usize) -> bool {
        while *cursor < self.slots() {
            if flight.targets & (1 << *cursor) != 0 && self.flag_seq(*cursor) != flight.seq {
                return false;
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
        self.r().flight.last_seq.store(flight.seq, Ordering::Relaxed);
        // Release: partner of the Acquire of the next `claim`, `leave` and
        // `in_flight` (last_seq is visible with the cleared bit).
        self.r().membership.members.fetch_and(!IN_FLIGHT, Ordering::AcqRel);
    }

    /// A multicast that did not complete: evict the slots that did not
    /// acknowledge and fail the domain (IN_FLIGHT stays set: late
    /// acknowledgements could otherwise count into a later multicast).
    pub fn fail(&self, flight: &Flight, missing: &[usize]) {
        let mask = missing.iter().fold(0u64, |m, s| m | 1 << s);
        self.r().membership.members.fetch_and(!mask, Ordering::AcqRel);
        // Release: partner of the Acquire loads in `failed_seq`.
        self.r().flight.failed_seq.store(flight.seq, Ordering::Release);
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

fn check_live_slots(slots: usize) -> Result<(), FanoutError> {
    if slots > REGION_SLOTS {
        return Err(FanoutError::TooManyLiveSlots {
            slots,
            max: REGION_SLOTS,
        });
    }
    Ok(())
}
