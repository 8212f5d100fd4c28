//! [`MemberMemory`]: one member's local copies of every row.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::{RowRef, CACHE_LINE_BYTES};

/// One member's memory: `member_count` rows, 64-byte aligned, zeroed.
pub(super) struct MemberMemory {
    base: NonNull<u8>,
    layout: std::alloc::Layout,
    row_len_bytes: usize,
}

// SAFETY: the memory is only accessed through atomics or through RowRef's
// caller-checked byte accessors (guard protocol); the pointer itself is
// owned and freed once, in Drop.
unsafe impl Send for MemberMemory {}
// SAFETY: as for Send.
unsafe impl Sync for MemberMemory {}

impl MemberMemory {
    pub(super) fn new(member_count: usize, row_len_bytes: usize) -> MemberMemory {
        let layout = std::alloc::Layout::from_size_align(member_count * row_len_bytes, CACHE_LINE_BYTES)
            .expect("sim memory layout");
        assert!(layout.size() > 0, "sim memory is never empty");
        // SAFETY: the layout has a non-zero size (asserted).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        MemberMemory {
            base,
            layout,
            row_len_bytes,
        }
    }

    pub(super) fn row(&self, rank: usize) -> RowRef<'_> {
        let offset = rank * self.row_len_bytes;
        assert!(
            offset + self.row_len_bytes <= self.layout.size(),
            "rank {rank} out of range"
        );
        // SAFETY:
        // - in bounds (asserted) and 64-aligned (base is, rows are 64-multiples);
        // - the allocation lives as long as `self`, which outlives the borrow.
        unsafe {
            RowRef::new(
                NonNull::new_unchecked(self.base.as_ptr().add(offset)),
                self.row_len_bytes,
            )
        }
    }

    /// Byte `offset` of `row` as an atomic (for the unaligned edges of a push).
    fn byte(row: RowRef<'_>, offset: usize) -> &AtomicU8 {
        assert!(offset < row.len(), "byte {offset} outside row of {}", row.len());
        // SAFETY: in bounds (asserted); AtomicU8 has the size and alignment
        // of u8; the memory lives as long as the row borrow.
        unsafe { AtomicU8::from_ptr(row.as_ptr().add(offset)) }
    }

    /// Copy `range` of `row` out (the push snapshot).
    pub(super) fn read(row: RowRef<'_>, range: Range<usize>) -> Vec<u8> {
        let mut out = Vec::with_capacity(range.len());
        let mut i = range.start;
        while i < range.end {
            if i.is_multiple_of(8) && i + 8 <= range.end {
                out.extend_from_slice(&row.u64_at(i).load(Ordering::Relaxed).to_ne_bytes());
                i += 8;
            } else {
                out.push(Self::byte(row, i).load(Ordering::Relaxed));
                i += 1;
            }
        }
        out
    }

    /// Write `bytes` at `offset` of `row` (a delivery into a local copy).
    pub(super) fn write(row: RowRef<'_>, offset: usize, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            let at = offset + i;
            if at.is_multiple_of(8) && i + 8 <= bytes.len() {
                let word = u64::from_ne_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
                // Release per word: in the threaded mode a reader that
                // Acquire-loads a guard written by a later delivery sees
                // this word (the deliveries of one link are ordered by the
                // network mutex). Partner: the reader's Acquire guard load.
                row.u64_at(at).store(word, Ordering::Release);
                i += 8;
            } else {
                Self::byte(row, at).store(bytes[i], Ordering::Release);
                i += 1;
            }
        }
    }
}

impl Drop for MemberMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed only here.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_ranges_round_trip() {
        let mem = MemberMemory::new(2, 128);
        let bytes: Vec<u8> = (0..37).collect();
        MemberMemory::write(mem.row(1), 5, &bytes);
        assert_eq!(MemberMemory::read(mem.row(1), 5..42), bytes);
        assert_eq!(
            mem.row(1).u64_at(48).load(Ordering::Relaxed),
            0,
            "nothing written past the range"
        );
    }
}
