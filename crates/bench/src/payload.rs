//! The bench payload: the sender writes every byte, every receiver reads
//! every byte (a checksum), so the figures are real data movement.
//!
//! ```text
//!  +0  send_ts_ns u64   monotonic ns at commit, 0 when this message is not sampled
//!  +8  counter    u64   the sender's message number (0, 1, 2, …)
//!  +16 pattern …        word i = counter × K + i (the tail is bytes of the same)
//! ```

/// Smallest payload the bench can carry (timestamp + counter).
pub const PAYLOAD_BYTES_MIN: usize = 16;
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Fill `payload` (≥ 16 bytes): every byte is written.
#[inline]
pub fn fill(payload: &mut [u8], send_ts_ns: u64, counter: u64) {
    debug_assert!(payload.len() >= PAYLOAD_BYTES_MIN);
    payload[0..8].copy_from_slice(&send_ts_ns.to_le_bytes());
    payload[8..16].copy_from_slice(&counter.to_le_bytes());
    let base = counter.wrapping_mul(K);
    let mut chunks = payload[16..].chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&base.wrapping_add(i as u64).to_le_bytes());
    }
    for b in chunks.into_remainder() {
        *b = base as u8;
    }
}

/// Write bytes `offset..offset + out.len()` of the payload of `len` bytes
/// that [`fill`] would write (a large message filled fragment by fragment
/// in place). `offset` must be a multiple of 8.
#[inline]
pub fn fill_at(out: &mut [u8], offset: u64, len: usize, send_ts_ns: u64, counter: u64) {
    debug_assert!(offset.is_multiple_of(8) && offset as usize + out.len() <= len);
    let base = counter.wrapping_mul(K);
    let mut header = [0u8; PAYLOAD_BYTES_MIN];
    header[..8].copy_from_slice(&send_ts_ns.to_le_bytes());
    header[8..].copy_from_slice(&counter.to_le_bytes());
    // The bytes past the last whole pattern word are `base as u8`.
    let words_end = PAYLOAD_BYTES_MIN + (len - PAYLOAD_BYTES_MIN) / 8 * 8;
    let (start, end) = (offset as usize, offset as usize + out.len());
    let mut p = start;
    // The header's bytes.
    while p < end.min(PAYLOAD_BYTES_MIN) {
        out[p - start] = header[p];
        p += 1;
    }
    // Whole pattern words, as `fill` writes them (a loop that vectorizes).
    let words = (end.min(words_end).saturating_sub(p)) / 8;
    if words > 0 {
        let first = ((p - PAYLOAD_BYTES_MIN) / 8) as u64;
        let span = &mut out[p - start..p - start + words * 8];
        for (i, c) in span.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&base.wrapping_add(first + i as u64).to_le_bytes());
        }
        p += words * 8;
    }
    // The tail (only at the payload's end).
    for b in &mut out[p - start..] {
        *b = base as u8;
    }
}

/// Read every byte: the wrapping sum of the 8-byte words (tail bytes added
/// one by one). Uses AVX2 where the CPU has it; the raw baseline uses the
/// same function, so the comparison stays like for like.
#[inline]
pub fn checksum(payload: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above), which is
            // the only requirement of the target_feature function.
            return unsafe { checksum_avx2(payload) };
        }
    }
    checksum_portable(payload)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn checksum_avx2(payload: &[u8]) -> u64 {
    checksum_portable(payload)
}

/// Eight independent accumulators so the loads pipeline (and vectorize).
#[inline(always)]
fn checksum_portable(payload: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut lines = payload.chunks_exact(64);
    for line in &mut lines {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(u64::from_le_bytes(line[i * 8..i * 8 + 8].try_into().expect("8 bytes")));
        }
    }
    let mut sum = acc.iter().fold(0u64, |s, a| s.wrapping_add(*a));
    let mut words = lines.remainder().chunks_exact(8);
    for w in &mut words {
        sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    for b in words.remainder() {
        sum = sum.wrapping_add(*b as u64);
    }
    sum
}

/// What [`checksum`] returns for a payload that [`fill`] wrote, computed in
/// closed form (no memory is read): the sender's record of what it sent.
#[inline]
pub fn expected_checksum(len: usize, send_ts_ns: u64, counter: u64) -> u64 {
    debug_assert!(len >= PAYLOAD_BYTES_MIN);
    let base = counter.wrapping_mul(K);
    let words = ((len - PAYLOAD_BYTES_MIN) / 8) as u64;
    let tail = ((len - PAYLOAD_BYTES_MIN) % 8) as u64;
    // Σ_{i<words} (base + i) = words·base + words·(words−1)/2, wrapping.
    let pattern = words
        .wrapping_mul(base)
        .wrapping_add(words * words.saturating_sub(1) / 2);
    send_ts_ns
        .wrapping_add(counter)
        .wrapping_add(pattern)
        .wrapping_add(tail * (base as u8) as u64)
}

/// The header fields.
#[inline]
pub fn header(payload: &[u8]) -> (u64, u64) {
    let ts = u64::from_le_bytes(payload[0..8].try_into().expect("8 bytes"));
    let counter = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
    (ts, counter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_at_writes_what_fill_writes_piece_by_piece() {
        for len in [16usize, 17, 1027, 4096, 5003] {
            let mut whole = vec![0u8; len];
            fill(&mut whole, 7, 3);
            for piece in [8usize, 240, 1024] {
                let mut pieces = vec![0xEEu8; len];
                for (k, out) in pieces.chunks_mut(piece).enumerate() {
                    fill_at(out, (k * piece) as u64, len, 7, 3);
                }
                assert_eq!(pieces, whole, "len {len}, pieces of {piece}");
            }
        }
    }

    #[test]
    fn fill_writes_every_byte_and_checksum_reads_them() {
        let mut a = vec![0xAAu8; 1027];
        fill(&mut a, 5, 9);
        assert_eq!(header(&a), (5, 9));
        let mut b = a.clone();
        b[1026] ^= 1;
        assert_ne!(checksum(&a), checksum(&b), "the tail byte counts");
        let mut c = vec![0u8; 1027];
        fill(&mut c, 5, 9);
        assert_eq!(a, c, "no byte depends on what was there before");
        let words: u64 = a[..1024]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .fold(0, u64::wrapping_add);
        let tail: u64 = a[1024..].iter().map(|b| *b as u64).sum();
        assert_eq!(
            checksum(&a),
            words.wrapping_add(tail),
            "dispatch and portable agree with the definition"
        );
        for len in [16, 17, 23, 24, 32, 100, 10_240, 10_245] {
            let mut p = vec![0u8; len];
            fill(&mut p, 77, 12345 + len as u64);
            assert_eq!(
                checksum(&p),
                expected_checksum(len, 77, 12345 + len as u64),
                "closed form, len {len}"
            );
        }
    }
}
