//! The rows of every member of a tcp fabric: the own row and the local
//! copies of the peers' rows, in one allocation.

use std::alloc::Layout;
use std::ptr::NonNull;

use super::stat;
use crate::{FabricError, CACHE_LINE_BYTES};

/// The rows of every member: one zeroed, cache-line-aligned allocation,
/// on the heap or in the member's stat file ([`stat`]).
pub(crate) struct RowsAlloc {
    pub(crate) ptr: NonNull<u8>,
    backing: Backing,
}

enum Backing {
    Heap(Layout),
    Stat(stat::StatFile),
}

// SAFETY: the allocation is plain memory; all shared access goes through
// atomics (RowRef, the receive thread) or the guard protocol.
unsafe impl Send for RowsAlloc {}
// SAFETY: as for Send.
unsafe impl Sync for RowsAlloc {}

impl RowsAlloc {
    pub(crate) fn new(bytes: usize) -> Result<RowsAlloc, FabricError> {
        let layout = Layout::from_size_align(bytes.max(CACHE_LINE_BYTES), CACHE_LINE_BYTES)
            .map_err(|e| FabricError::InvalidOption(format!("rows of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| FabricError::InvalidOption(format!("cannot allocate {bytes} bytes of rows")))?;
        Ok(RowsAlloc {
            ptr,
            backing: Backing::Heap(layout),
        })
    }

    /// The rows in a stat file (zeroed by its creation).
    pub(crate) fn in_stat_file(file: stat::StatFile) -> RowsAlloc {
        RowsAlloc {
            ptr: file.rows_ptr(),
            backing: Backing::Stat(file),
        }
    }

    pub(crate) fn stat(&self) -> Option<&stat::StatFile> {
        match &self.backing {
            Backing::Stat(s) => Some(s),
            Backing::Heap(_) => None,
        }
    }
}

impl Drop for RowsAlloc {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
        // A stat file unmaps (and unlinks) itself.
    }
}
