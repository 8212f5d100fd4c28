//! # spindle-fabric — registered rows and one-sided pushes
//!
//! The one abstraction everything above is written against. A group of
//! `member_count` members each owns one *row*: a registered region of
//! `row_len_bytes` bytes. A member writes only its own row and *pushes* byte
//! ranges of it to peers, who see the bytes appear in their local copy of
//! that row without running any code (RDMA write semantics).
//!
//! ## Ordering contract (every implementation)
//!
//! 1. Pushes from one member to one peer become visible in the order they
//!    were issued.
//! 2. Bytes within one push may become visible in any order, but an
//!    8-aligned `u64` is never torn: a reader sees its old or its new value
//!    (layers above push several counters in one push).
//! 3. Therefore a *guard*: write the data, push it, then write a counter
//!    (an aligned `u64` stored with `Release`) and push it. A reader that
//!    loads the guard with `Acquire` and sees the new value sees the data.
//!
//! On [`shm`] every member maps the same file, so a push is ordering only
//! (a `Release` fence): zero copies.
//!
//! ```no_run
//! use spindle_fabric::{Fabric, PeerSet, shm::{ShmFabric, ShmOptions}};
//! let fabric = ShmFabric::open(&ShmOptions::new("doc-example", 2, 4096, 0), 0).unwrap();
//! let row = fabric.row(fabric.member_rank());
//! row.u64_at(0).store(7, std::sync::atomic::Ordering::Release);
//! fabric.push(0..8, PeerSet::all_except(0, 2)).unwrap();
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod doorbell;
#[cfg(feature = "ofi")]
pub mod ofi;
pub mod row;
pub mod shm;
pub mod sim;
pub mod sync;
pub mod tcp;

use std::ops::Range;
use std::time::Duration;

pub use row::RowRef;

/// Largest group any fabric supports: member sets are a `u64` bit-mask.
pub const MEMBERS_MAX: usize = 64;

/// Rows are cache-line multiples so that no two rows share a line.
pub const CACHE_LINE_BYTES: usize = 64;

/// A set of member ranks, as a bit-mask (rank `r` is bit `r`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PeerSet(pub u64);

impl PeerSet {
    /// Every rank in `0..member_count` except `me`.
    pub fn all_except(me: usize, member_count: usize) -> PeerSet {
        PeerSet(PeerSet::all(member_count).0 & !(1u64 << (me % MEMBERS_MAX)))
    }
    /// Every rank in `0..member_count`.
    pub fn all(member_count: usize) -> PeerSet {
        assert!(
            member_count <= MEMBERS_MAX,
            "member_count {member_count} > {MEMBERS_MAX}"
        );
        PeerSet(if member_count == 64 {
            u64::MAX
        } else {
            (1u64 << member_count) - 1
        })
    }
    /// Whether `rank` is in the set.
    pub fn contains(self, rank: usize) -> bool {
        rank < MEMBERS_MAX && self.0 & (1u64 << rank) != 0
    }
    /// The ranks in the set, lowest first: one step per member in the
    /// set, not per possible rank (a push to one peer is on every send).
    pub fn iter(self) -> PeerSetIter {
        PeerSetIter(self.0)
    }
}

/// The ranks of a [`PeerSet`], lowest first ([`PeerSet::iter`]).
#[derive(Clone, Copy, Debug)]
pub struct PeerSetIter(u64);

impl Iterator for PeerSetIter {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let rank = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1; // clear the lowest set bit
        Some(rank)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for PeerSetIter {}

/// Why a fabric operation failed. Every variant names what went wrong and
/// where, so the message can be shown to a user as it is.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error("member {rank} is gone (its process exited or crashed)")]
    PeerGone { rank: usize },
    #[error("member {rank} left the group")]
    PeerLeft { rank: usize },
    #[error("member rank {rank} is out of range: the group has {member_count} members")]
    RankOutOfRange { rank: usize, member_count: usize },
    #[error("member {rank} of group '{group}' is already running (pid {pid})")]
    RankTaken { group: String, rank: usize, pid: u32 },
    #[error("push range {start}..{end} is outside the row of {row_len_bytes} bytes")]
    PushOutOfBounds {
        start: usize,
        end: usize,
        row_len_bytes: usize,
    },
    #[error("group '{group}' already exists with a different layout: {found} (this member expects {expected}); stop the other members or pick another group name")]
    LayoutMismatch {
        group: String,
        found: String,
        expected: String,
    },
    #[error("invalid group name '{name}': use 1..=48 characters of [A-Za-z0-9_.-]")]
    InvalidGroupName { name: String },
    #[error("invalid fabric option: {0}")]
    InvalidOption(String),
    #[error("timed out after {waited_ms} ms waiting for members {missing:?} of group '{group}' to join")]
    JoinTimeout {
        group: String,
        missing: Vec<usize>,
        waited_ms: u64,
    },
    #[error("handshake with {peer} failed: {fault}")]
    Handshake { peer: String, fault: String },
    #[error("member {rank} sent a bad frame; its connection was closed: {fault}")]
    BadFrame { rank: usize, fault: String },
    #[error("could not connect to member {rank} at {addr} within {waited_ms} ms (last error: {last_error}); is it running and reachable?")]
    ConnectTimeout {
        rank: usize,
        addr: String,
        waited_ms: u64,
        last_error: String,
    },
    #[error("ofi: {op}{peer} failed: {fault}")]
    Ofi {
        /// The libfabric operation (`fi_write`, `fi_mr_reg`, ...).
        op: String,
        /// " to member N" when it concerns a peer, else empty.
        peer: String,
        fault: String,
    },
    #[error("the libfabric provider '{provider}' is not available for RMA writes on RDM endpoints on this machine; its libfabric offers: {offered} (`fi_info -l` lists every provider)")]
    OfiProvider { provider: String, offered: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl FabricError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        FabricError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Registered rows and one-sided pushes. See the crate docs for the
/// ordering contract; `tests/conformance.rs` checks it for every
/// implementation.
pub trait Fabric: Send + Sync + 'static {
    /// This member's rank, `0..member_count()`.
    fn member_rank(&self) -> usize;
    /// How many members the group has (fixed for the fabric's life).
    fn member_count(&self) -> usize;
    /// Length of every row, a multiple of [`CACHE_LINE_BYTES`].
    fn row_len_bytes(&self) -> usize;
    /// The local copy of `rank`'s row. The own row is the writable original;
    /// every other row must only be read. Every row reads as zeros until
    /// its owner writes it (layers above rely on counters starting at 0).
    fn row(&self, rank: usize) -> RowRef<'_>;
    /// Make bytes `range` of the own row visible to `peers`, after
    /// everything pushed to them before. Never blocks on a lock held across
    /// the write.
    fn push(&self, range: Range<usize>, peers: PeerSet) -> Result<(), FabricError>;
    /// Push several ranges of the own row to `peers`, in order: as
    /// `push` of each range one after the other (a peer that sees a later
    /// range's bytes sees the earlier ones'), in as few system calls as
    /// the fabric allows. tcp sends them to each peer in one `sendmsg`
    /// (the bytes of a write and its guard: one wake-up of the peer, not
    /// two). Every range is checked before anything is pushed. The
    /// default pushes one range at a time.
    fn push_vectored(&self, ranges: &[Range<usize>], peers: PeerSet) -> Result<(), FabricError> {
        for range in ranges {
            check_range(range, self.row_len_bytes())?;
        }
        for range in ranges {
            self.push(range.clone(), peers)?;
        }
        Ok(())
    }
    /// Check that every peer is still there. Slow path (may make a system
    /// call per peer): call it when idle, not per message.
    fn check_peers(&self) -> Result<(), FabricError>;
    /// Peers known to be gone (crashed, exited, cut off) or to have left,
    /// all at once (`check_peers` reports only the first). Slow path, like
    /// `check_peers`. The default asks `check_peers`, so it finds at most
    /// one; fabrics override it to report every lost peer.
    fn lost_peers(&self) -> PeerSet {
        match self.check_peers() {
            Err(FabricError::PeerGone { rank })
            | Err(FabricError::PeerLeft { rank })
            | Err(FabricError::BadFrame { rank, .. }) => PeerSet(1u64 << (rank % MEMBERS_MAX)),
            _ => PeerSet::default(),
        }
    }
    /// Ranks whose members have joined (their rows are live).
    fn joined(&self) -> PeerSet;
    /// The doorbell that parked progress loops wait on.
    fn doorbell(&self) -> &dyn doorbell::Doorbell;
    /// A short human description ("shm:/dev/shm/spindle-g1").
    fn describe(&self) -> String;
    /// Bring in what the peers have pushed, on the calling thread and
    /// without blocking; returns whether any row copy changed. A fabric
    /// whose pushes land in the readers' memory directly (shm, sim) has
    /// nothing to do. A fabric that copies rows (tcp) reads its sockets
    /// here, so a thread that waits by spinning (a progress loop, a clock
    /// exchange) sees a push without waiting for another thread to wake.
    /// Cheap enough to call once per progress pass (one non-blocking
    /// system call per peer on tcp).
    fn receive_now(&self) -> bool {
        false
    }
    /// Whether [`Fabric::receive_now`] makes a system call (tcp: a `recv`
    /// per peer). A progress loop on such a fabric yields where it would
    /// spin: a spin pass costs as much as a yield there and sees nothing
    /// sooner, but keeps the core from the threads that share it (see
    /// `spindle_runtime::Idler::cap_spins`). Fabrics that receive in user
    /// space (shm, sim) say no, and so does ofi (its completion queue is
    /// memory on a hardware provider).
    fn receive_makes_system_calls(&self) -> bool {
        false
    }
    /// Send the pushes this fabric has held back to batch them (tcp with
    /// coalescing: one `sendmsg` per peer per progress pass). Pushes are
    /// visible to the peers only after it; the group layer calls it at the
    /// end of every pass. A fabric that sends at once does nothing.
    fn flush(&self) {}
    /// Whether every push to `rank` issued before this call has
    /// *completed*: its bytes are in `rank`'s memory, as the fabric's own
    /// completions say (libfabric's completion queue with
    /// `FI_DELIVERY_COMPLETE` on ofi). `None`: this fabric reports no
    /// completions (tcp: a push hands bytes to the kernel; a layer that
    /// needs to know must have the peer answer, as the replica's echo
    /// does). shm's push is its own completion (`Some(true)`). A peer that
    /// is not connected has completed nothing (`Some(false)`). Cheap:
    /// callable in a wait loop (it drives the fabric's completions).
    fn pushes_completed(&self, _rank: usize) -> Option<bool> {
        None
    }
    /// Declare a byte range of every row that the layer above reads only
    /// behind a guard (after an `Acquire` load of a word pushed after the
    /// bytes) and never while its owner may rewrite it: the group layer's
    /// slot ring. A fabric that copies rows (tcp) may then write pushes
    /// into it with plain memory copies instead of word-by-word atomic
    /// stores. The first declaration holds for the fabric's life (a fabric
    /// carries one layout: its tag is checked when members connect);
    /// frames applied before it take the atomic path, which is always
    /// correct. Fabrics whose pushes land directly (shm, sim) ignore it.
    fn declare_payload_region(&self, _range: Range<usize>) {}
}

/// Wait until every member has joined, or fail with the missing ranks.
pub fn wait_all_joined(fabric: &dyn Fabric, group: &str, timeout: Duration) -> Result<(), FabricError> {
    let all = PeerSet::all(fabric.member_count());
    let started = std::time::Instant::now();
    let mut sleep_us = 50u64;
    loop {
        let joined = fabric.joined();
        if joined.0 & all.0 == all.0 {
            return Ok(());
        }
        if started.elapsed() >= timeout {
            let missing = PeerSet(all.0 & !joined.0).iter().collect();
            return Err(FabricError::JoinTimeout {
                group: group.to_string(),
                missing,
                waited_ms: timeout.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_micros(sleep_us));
        sleep_us = (sleep_us * 2).min(5_000);
    }
}

/// Validate a byte range against a row length (shared by implementations).
pub fn check_range(range: &Range<usize>, row_len_bytes: usize) -> Result<(), FabricError> {
    if range.start > range.end || range.end > row_len_bytes {
        return Err(FabricError::PushOutOfBounds {
            start: range.start,
            end: range.end,
            row_len_bytes,
        });
    }
    Ok(())
}

#[cfg(test)]
mod peer_set_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The bit iterator yields exactly the ranks `contains` accepts,
        /// lowest first, each once.
        #[test]
        fn iter_yields_exactly_the_members_in_order(mask in any::<u64>()) {
            let set = PeerSet(mask);
            let by_iter: Vec<usize> = set.iter().collect();
            let by_contains: Vec<usize> = (0..MEMBERS_MAX).filter(|r| set.contains(*r)).collect();
            prop_assert_eq!(set.iter().len(), by_contains.len());
            prop_assert_eq!(by_iter, by_contains);
        }
    }

    #[test]
    fn iter_edges() {
        assert_eq!(PeerSet(0).iter().count(), 0);
        assert_eq!(PeerSet(1 << 63).iter().collect::<Vec<_>>(), vec![63]);
        assert_eq!(PeerSet::all(64).iter().count(), 64);
        assert_eq!(PeerSet::all_except(2, 4).iter().collect::<Vec<_>>(), vec![0, 1, 3]);
    }
}
