//! [`Sst`]: a row layout over a fabric.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use spindle_fabric::{Fabric, FabricError, PeerSet, RowRef};

use crate::layout::{RowLayout, U64Column, U64VectorColumn};

/// The shared state table: one row per member, `layout`'s columns, over a
/// fabric. Reads of other rows load with `Acquire`; writes to the own row
/// store with `Release`, then [`Sst::push`] makes them visible.
pub struct Sst<F: Fabric> {
    fabric: Arc<F>,
    layout: RowLayout,
    peers: PeerSet,
}

impl<F: Fabric> Sst<F> {
    pub fn new(fabric: Arc<F>, layout: RowLayout) -> Sst<F> {
        assert!(
            fabric.row_len_bytes() >= layout.row_len_bytes(),
            "fabric rows ({} B) shorter than the layout ({} B)",
            fabric.row_len_bytes(),
            layout.row_len_bytes()
        );
        let peers = PeerSet::all_except(fabric.member_rank(), fabric.member_count());
        Sst { fabric, layout, peers }
    }

    pub fn fabric(&self) -> &Arc<F> {
        &self.fabric
    }
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }
    pub fn my_rank(&self) -> usize {
        self.fabric.member_rank()
    }
    pub fn member_count(&self) -> usize {
        self.fabric.member_count()
    }
    pub fn row(&self, rank: usize) -> RowRef<'_> {
        self.fabric.row(rank)
    }
    pub fn my_row(&self) -> RowRef<'_> {
        self.fabric.row(self.fabric.member_rank())
    }

    /// Load `rank`'s cell. Partner: the Release store in [`Sst::set`].
    #[inline(always)]
    pub fn get(&self, rank: usize, column: U64Column) -> u64 {
        self.fabric.row(rank).u64_at(column.offset()).load(Ordering::Acquire)
    }

    #[inline(always)]
    pub fn get_at(&self, rank: usize, column: U64VectorColumn, index: usize) -> u64 {
        self.fabric
            .row(rank)
            .u64_at(column.offset(index))
            .load(Ordering::Acquire)
    }

    /// Store the own cell. Partner: the Acquire load in [`Sst::get`].
    #[inline(always)]
    pub fn set(&self, column: U64Column, value: u64) {
        self.my_row().u64_at(column.offset()).store(value, Ordering::Release);
    }

    #[inline(always)]
    pub fn set_at(&self, column: U64VectorColumn, index: usize, value: u64) {
        self.my_row()
            .u64_at(column.offset(index))
            .store(value, Ordering::Release);
    }

    /// Push bytes `range` of the own row to every peer.
    #[inline(always)]
    pub fn push(&self, range: std::ops::Range<usize>) -> Result<(), FabricError> {
        self.fabric.push(range, self.peers)
    }
}
