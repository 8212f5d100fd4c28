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

/// Read every byte: the wrapping sum of the 8-byte words (tail bytes added
/// one by one).
#[inline]
pub fn checksum(payload: &[u8]) -> u64 {
    let mut chunks = payload.chunks_exact(8);
    let mut sum = 0u64;
    for c in &mut chunks {
        sum = sum.wrapping_add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    for b in chunks.remainder() {
        sum = sum.wrapping_add(*b as u64);
    }
    sum
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
    }
}
