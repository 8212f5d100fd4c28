//! [`RowRef`]: typed access to one member's row in registered memory.
//!
//! Rows are shared with other processes (shm) or written by a fabric's
//! receive path (tcp), so every scalar is accessed through an atomic at an
//! aligned offset, and bulk bytes only under the guard protocol (see the
//! crate docs): a byte range is read only after an `Acquire` load of the
//! guard that covers it, and written only while no reader may look at it
//! (flow control in the layer above guarantees this).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A borrowed view of one row: `len` bytes at `base`, 64-byte aligned.
#[derive(Clone, Copy)]
pub struct RowRef<'a> {
    base: NonNull<u8>,
    len: usize,
    _fabric: PhantomData<&'a ()>,
}

// SAFETY: a RowRef only hands out atomics (Sync by definition) and, through
// unsafe methods whose callers uphold the guard protocol, byte slices; the
// memory it points to lives as long as the fabric borrow `'a`.
unsafe impl Send for RowRef<'_> {}
// SAFETY: as for Send: all shared access goes through atomics or the
// caller-checked unsafe byte accessors.
unsafe impl Sync for RowRef<'_> {}

impl<'a> RowRef<'a> {
    /// # Safety
    /// `base` must point to `len` bytes, 64-byte aligned, valid for reads
    /// (and for writes if this is the caller's own row) for `'a`.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> RowRef<'a> {
        debug_assert_eq!(base.as_ptr() as usize % crate::CACHE_LINE_BYTES, 0);
        RowRef {
            base,
            len,
            _fabric: PhantomData,
        }
    }

    /// Length of the row in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the row has no bytes (never true for a real row).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The row's first byte (for implementations that copy rows).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The `u64` at byte `offset` (8-aligned, in bounds).
    #[inline(always)]
    pub fn u64_at(&self, offset: usize) -> &'a AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "u64 offset {offset} bad for row of {}",
            self.len
        );
        // SAFETY:
        // - in bounds and 8-aligned (asserted above; base is 64-aligned);
        // - AtomicU64 has the size and alignment of u64 and may alias memory
        //   that other processes access atomically;
        // - the memory outlives 'a (constructor contract).
        unsafe { &*(self.base.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// The `u32` at byte `offset` (4-aligned, in bounds).
    #[inline(always)]
    pub fn u32_at(&self, offset: usize) -> &'a AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.len,
            "u32 offset {offset} bad for row of {}",
            self.len
        );
        // SAFETY: as for u64_at, with 4-byte size and alignment.
        unsafe { &*(self.base.as_ptr().add(offset) as *const AtomicU32) }
    }

    /// Bytes `offset..offset + len` for reading.
    ///
    /// # Safety
    /// No one may write these bytes while the returned slice lives: the
    /// caller has observed (Acquire) the guard that published them, and
    /// flow control keeps the writer off them until the caller releases
    /// them.
    #[inline(always)]
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &'a [u8] {
        assert!(
            offset <= self.len && len <= self.len - offset,
            "byte range {offset}+{len} outside row of {}",
            self.len
        );
        // SAFETY: in bounds (asserted); no concurrent writer (caller contract).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    /// Bytes `offset..offset + len` for writing.
    ///
    /// # Safety
    /// This must be the caller's own row, and no one else may read or
    /// write these bytes while the slice lives (the range is not yet
    /// published, or flow control says every reader has released it), and
    /// no other `bytes_mut` slice overlapping it may be alive.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &'a mut [u8] {
        assert!(
            offset <= self.len && len <= self.len - offset,
            "byte range {offset}+{len} outside row of {}",
            self.len
        );
        // SAFETY: in bounds (asserted); exclusive access (caller contract).
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) }
    }
}
