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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

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

    /// The `u64` words covering bytes `offset..offset + len` (8-aligned
    /// offset, length a multiple of 8, in bounds).
    #[inline(always)]
    fn words(&self, offset: usize, len: usize) -> &'a [AtomicU64] {
        assert!(
            offset.is_multiple_of(8) && len.is_multiple_of(8) && offset <= self.len && len <= self.len - offset,
            "word range {offset}+{len} bad for row of {}",
            self.len
        );
        // SAFETY:
        // - in bounds and 8-aligned (asserted above; base is 64-aligned);
        // - AtomicU64 has the size and alignment of u64, so `len / 8` of
        //   them cover exactly these bytes, and may alias memory that other
        //   threads and processes access atomically;
        // - the memory outlives 'a (constructor contract).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset) as *const AtomicU64, len / 8) }
    }

    /// Copy bytes `offset..offset + dst.len()` into `dst` with `Relaxed`
    /// word loads (8-aligned offset, length a multiple of 8).
    ///
    /// The read side of a seqlock: unlike [`RowRef::bytes`], this is sound
    /// while a writer may be storing the same bytes (a lapping writer),
    /// because every access is atomic; the copy may be torn, and the
    /// caller decides after an `Acquire` fence whether to keep it.
    #[inline]
    pub fn copy_atomic(&self, offset: usize, dst: &mut [u8]) {
        let words = self.words(offset, dst.len());
        for (word, out) in words.iter().zip(dst.chunks_exact_mut(8)) {
            out.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
    }

    /// Store `src` at bytes `offset..offset + src.len()` with `Relaxed`
    /// word stores (8-aligned offset, length a multiple of 8).
    ///
    /// The write side of a seqlock: sound while a reader may be copying
    /// the same bytes with [`RowRef::copy_atomic`]. Publication is the
    /// caller's (a `Release` store of the guard that covers them).
    #[inline]
    pub fn store_atomic(&self, offset: usize, src: &[u8]) {
        let words = self.words(offset, src.len());
        for (word, bytes) in words.iter().zip(src.chunks_exact(8)) {
            word.store(
                u64::from_ne_bytes(bytes.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One cache line of row memory (rows are 64-byte aligned).
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    fn rows(lines: usize) -> Vec<Line> {
        (0..lines).map(|_| Line([0; 64])).collect()
    }

    fn row_of(lines: &mut [Line]) -> RowRef<'_> {
        let len = lines.len() * 64;
        // SAFETY: the buffer is 64-aligned, `len` bytes long, ours for the
        // borrow, and only accessed through the RowRef below.
        unsafe { RowRef::new(NonNull::new(lines.as_mut_ptr() as *mut u8).expect("non-null"), len) }
    }

    #[test]
    fn scalars_and_byte_ranges_round_trip() {
        let mut lines = rows(2);
        let row = row_of(&mut lines);
        row.u64_at(8).store(0x0102_0304_0506_0708, Ordering::Relaxed);
        row.u32_at(20).store(7, Ordering::Relaxed);
        // SAFETY: single-threaded test: no other access to these bytes.
        unsafe { row.bytes_mut(64, 5).copy_from_slice(b"hello") };
        // SAFETY: as above.
        assert_eq!(unsafe { row.bytes(64, 5) }, b"hello");
        assert_eq!(row.u64_at(8).load(Ordering::Relaxed), 0x0102_0304_0506_0708);
        assert_eq!(row.u32_at(20).load(Ordering::Relaxed), 7);
    }

    #[test]
    fn atomic_copies_round_trip() {
        let mut lines = rows(2);
        let row = row_of(&mut lines);
        let src: Vec<u8> = (0..48u8).collect();
        row.store_atomic(16, &src);
        let mut dst = vec![0u8; 48];
        row.copy_atomic(16, &mut dst);
        assert_eq!(dst, src);
        // SAFETY: single-threaded test: no other access to these bytes.
        assert_eq!(unsafe { row.bytes(16, 48) }, &src[..], "same bytes as a plain read");
    }

    #[test]
    #[should_panic(expected = "word range")]
    fn atomic_copies_reject_unaligned_ranges() {
        let mut lines = rows(1);
        let row = row_of(&mut lines);
        row.copy_atomic(4, &mut [0u8; 8]);
    }

    /// A writer lapping a reader (the rt seqlock's situation): every access
    /// is atomic, so this is sound (Miri checks it: `scripts/miri.sh`); the
    /// reader may see a mix of versions, but every word is one the writer
    /// wrote whole.
    #[test]
    fn a_writer_may_race_an_atomic_copy() {
        let mut lines = rows(1);
        let row = row_of(&mut lines);
        let rounds = if cfg!(miri) { 20 } else { 2_000 };
        std::thread::scope(|s| {
            s.spawn(|| {
                for v in 1..=rounds as u64 {
                    let words: Vec<u8> = (0..8).flat_map(|_| v.to_ne_bytes()).collect();
                    row.store_atomic(0, &words);
                }
            });
            let mut copy = [0u8; 64];
            for _ in 0..rounds {
                row.copy_atomic(0, &mut copy);
                for word in copy.chunks_exact(8) {
                    let v = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
                    assert!(v <= rounds as u64, "word {v} was never written");
                }
            }
        });
    }
}
