//! Object records: the unit of the log (sans-IO encode and decode).
//!
//! Every record is explicitly encoded with fixed-width little-endian
//! integers, 8-byte aligned, and carries the log position it was written
//! at and the epoch of the master that wrote it, so that a reader can tell
//! a record from zeros, from a stale record left by an earlier lap of the
//! segment ring, and from a record of another master.
//!
//! ```text
//!  +0   magic      u32  "SPRC" (0x4352_5053)
//!  +4   kind       u8   1 put · 2 delete (tombstone) · 3 pad (rest of segment unused) · 4 snapshot done
//!                       · 5 expire (set or clear a key's expiry) · 6 flush (every object deleted)
//!  +5   reserved   u8   0
//!  +6   key_len    u16  1..=KEY_BYTES_MAX (put, delete, expire); 0 (pad, snapshot done, flush)
//!  +8   value_len  u32  0..=VALUE_BYTES_LIMIT (put); 8 (expire); 0 (others)
//!  +12  batch_rest u32  records of this record's batch that follow it (0: last or alone)
//!  +16  epoch      u64  epoch of the master that wrote the record
//!  +24  position   u64  log position of the record's first byte
//!  +32  version    u64  the object's version (store-wide increasing)
//!  +40  checksum   u64  xxh3-64 of bytes +0..+40, the key and the value
//!  +48  key bytes, then value bytes, then zeros up to a multiple of 8
//! ```
//!
//! Expiry is decided by the master and replicated as data, never by a
//! backup's clock: an expire record's value is the key's absolute expiry
//! time, and the master deletes an expired key with a delete record.
//!
//! ```text
//!  expire record value (value_len = 8):
//!  +0   expires_at_ms  u64  unix time in ms at which the key expires;
//!                           0: no expiry (PERSIST)
//! ```
//!
//! A put clears the key's expiry: a write that keeps it (INCR, APPEND,
//! SET KEEPTTL) is a batch of a put and an expire record, and the
//! epoch's starting snapshot writes an expire record after the put of
//! every object that has an expiry.
//!
//! ```
//! use spindle_replica::record::{decode, encode_into, RecordFields, RecordKind};
//! let mut segment = [0u8; 128];
//! let n = encode_into(&mut segment, &RecordFields::single(RecordKind::Put, 1, 0, 7, b"key", b"value"));
//! let (record, len) = decode(&segment, 1, 0).unwrap();
//! assert_eq!((record.key, record.value, record.version, len), (&b"key"[..], &b"value"[..], 7, n));
//! assert!(decode(&segment, 2, 0).is_err(), "another epoch's bytes are no record");
//! ```

use xxhash_rust::xxh3::Xxh3;

/// Bytes of a record header.
pub const HEADER_BYTES: usize = 48;
/// "SPRC" little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPRC");
/// Longest key (Redis allows more; this service bounds it).
pub const KEY_BYTES_MAX: usize = 4096;
/// Hard upper bound of a value in any configuration (the configured bound
/// is usually lower).
pub const VALUE_BYTES_LIMIT: usize = 64 << 20;
/// Records start at multiples of this.
pub const RECORD_ALIGN: usize = 8;
/// Bytes of an expire record's value (the expiry time, `u64` LE).
pub const EXPIRE_VALUE_BYTES: usize = 8;

const _: () = assert!(HEADER_BYTES.is_multiple_of(RECORD_ALIGN));
const _: () = assert!(KEY_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(VALUE_BYTES_LIMIT <= u32::MAX as usize);

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// `key` now holds `value` at `version`.
    Put = 1,
    /// `key` was deleted at `version`.
    Delete = 2,
    /// The rest of the segment holds no record.
    Pad = 3,
    /// Every object of the epoch's starting snapshot has been written: the
    /// epoch's log is usable for recovery from here on.
    SnapshotDone = 4,
    /// `key`'s expiry is now the time in `value` (see
    /// [`expire_value`]); the object itself is unchanged.
    Expire = 5,
    /// Every object was deleted at `version` (FLUSHDB).
    Flush = 6,
}

/// The value of an expire record: the absolute expiry time (unix ms, 0:
/// none), little-endian.
pub fn expire_value(expires_at_ms: u64) -> [u8; EXPIRE_VALUE_BYTES] {
    expires_at_ms.to_le_bytes()
}

/// The expiry time an expire record's value holds (its length is checked
/// by [`decode`]).
pub fn expire_time_ms(value: &[u8]) -> u64 {
    assert_eq!(value.len(), EXPIRE_VALUE_BYTES, "an expire record's value is 8 bytes");
    u64_at(value, 0)
}

impl RecordKind {
    fn from_u8(b: u8) -> Option<RecordKind> {
        match b {
            1 => Some(RecordKind::Put),
            2 => Some(RecordKind::Delete),
            3 => Some(RecordKind::Pad),
            4 => Some(RecordKind::SnapshotDone),
            5 => Some(RecordKind::Expire),
            6 => Some(RecordKind::Flush),
            _ => None,
        }
    }
}

/// A decoded record, borrowing its key and value from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub kind: RecordKind,
    pub epoch: u64,
    pub position: u64,
    pub version: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// Records of the same batch (an MSET) that follow this one.
    pub batch_rest: u32,
}

/// Bytes a record with these lengths takes in the log.
pub fn encoded_len(key_len: usize, value_len: usize) -> usize {
    (HEADER_BYTES + key_len + value_len).next_multiple_of(RECORD_ALIGN)
}

/// Why bytes at a position are not a (valid) record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not a record written at this position in this epoch: zeros, a stale
    /// record of an earlier lap, or another epoch's. The log ends here.
    #[error("no record at position {position}")]
    NoRecord { position: u64 },
    /// A header of this epoch and position whose fields are impossible or
    /// whose bytes do not fit where it lies.
    #[error("record at position {position} is malformed: {what}")]
    Malformed { position: u64, what: String },
    /// A well-formed header whose checksum does not match its bytes: a
    /// write interrupted part-way (torn) or corruption.
    #[error("record at position {position} fails its checksum (stored {stored:#018x}, computed {computed:#018x})")]
    Checksum { position: u64, stored: u64, computed: u64 },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn checksum(header40: &[u8], key: &[u8], value: &[u8]) -> u64 {
    debug_assert_eq!(header40.len(), 40);
    let mut h = Xxh3::new();
    h.update(header40);
    h.update(key);
    h.update(value);
    h.digest()
}

/// The fields of a record to encode.
#[derive(Clone, Copy, Debug)]
pub struct RecordFields<'a> {
    pub kind: RecordKind,
    pub epoch: u64,
    pub position: u64,
    pub version: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// Records of the same batch that follow this one (0: last or alone).
    pub batch_rest: u32,
}

impl<'a> RecordFields<'a> {
    /// A record that is not part of a batch.
    pub fn single(kind: RecordKind, epoch: u64, position: u64, version: u64, key: &'a [u8], value: &'a [u8]) -> Self {
        RecordFields {
            kind,
            epoch,
            position,
            version,
            key,
            value,
            batch_rest: 0,
        }
    }
}

/// Encode a record into the front of `dst`; returns its encoded length.
/// `dst` must hold [`encoded_len`] bytes. No allocation.
pub fn encode_into(dst: &mut [u8], f: &RecordFields<'_>) -> usize {
    assert!(
        f.key.len() <= KEY_BYTES_MAX,
        "key of {} bytes > {KEY_BYTES_MAX}",
        f.key.len()
    );
    assert!(f.value.len() <= VALUE_BYTES_LIMIT, "value of {} bytes", f.value.len());
    assert!(
        f.position.is_multiple_of(RECORD_ALIGN as u64),
        "position {} not aligned",
        f.position
    );
    let len = encoded_len(f.key.len(), f.value.len());
    assert!(dst.len() >= len, "record of {len} bytes into {} bytes", dst.len());
    dst[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    dst[4] = f.kind as u8;
    dst[5] = 0;
    dst[6..8].copy_from_slice(&(f.key.len() as u16).to_le_bytes());
    dst[8..12].copy_from_slice(&(f.value.len() as u32).to_le_bytes());
    dst[12..16].copy_from_slice(&f.batch_rest.to_le_bytes());
    dst[16..24].copy_from_slice(&f.epoch.to_le_bytes());
    dst[24..32].copy_from_slice(&f.position.to_le_bytes());
    dst[32..40].copy_from_slice(&f.version.to_le_bytes());
    let body = HEADER_BYTES + f.key.len();
    dst[HEADER_BYTES..body].copy_from_slice(f.key);
    dst[body..body + f.value.len()].copy_from_slice(f.value);
    dst[body + f.value.len()..len].fill(0);
    let sum = checksum(&dst[0..40], f.key, f.value);
    dst[40..48].copy_from_slice(&sum.to_le_bytes());
    len
}

/// Decode the record that should start at the front of `src`, written at
/// `position` in `epoch`. `src` runs to the end of the segment: a record
/// never crosses a segment's end. Never panics, whatever the bytes.
pub fn decode(src: &[u8], epoch: u64, position: u64) -> Result<(Record<'_>, usize), DecodeError> {
    if src.len() < HEADER_BYTES || u32_at(src, 0) != MAGIC || u64_at(src, 16) != epoch || u64_at(src, 24) != position {
        return Err(DecodeError::NoRecord { position });
    }
    let malformed = |what: String| DecodeError::Malformed { position, what };
    let kind = RecordKind::from_u8(src[4]).ok_or_else(|| malformed(format!("kind {}", src[4])))?;
    let key_len = u16_at(src, 6) as usize;
    let value_len = u32_at(src, 8) as usize;
    if src[5] != 0 {
        return Err(malformed("reserved byte is not zero".into()));
    }
    let batch_rest = u32_at(src, 12);
    if batch_rest != 0 && !matches!(kind, RecordKind::Put | RecordKind::Delete | RecordKind::Expire) {
        return Err(malformed(format!("batch_rest {batch_rest} on a {kind:?} record")));
    }
    match kind {
        RecordKind::Put | RecordKind::Delete | RecordKind::Expire if key_len == 0 || key_len > KEY_BYTES_MAX => {
            return Err(malformed(format!("key_len {key_len}")));
        }
        RecordKind::Delete | RecordKind::Pad | RecordKind::SnapshotDone | RecordKind::Flush if value_len != 0 => {
            return Err(malformed(format!("value_len {value_len} on a {kind:?} record")));
        }
        RecordKind::Expire if value_len != EXPIRE_VALUE_BYTES => {
            return Err(malformed(format!(
                "value_len {value_len} on an Expire record (expected 8)"
            )));
        }
        RecordKind::Pad | RecordKind::SnapshotDone | RecordKind::Flush if key_len != 0 => {
            return Err(malformed(format!("key_len {key_len} on a {kind:?} record")));
        }
        _ => {}
    }
    if value_len > VALUE_BYTES_LIMIT {
        return Err(malformed(format!("value_len {value_len}")));
    }
    let len = encoded_len(key_len, value_len);
    if len > src.len() {
        return Err(malformed(format!(
            "{len} bytes long but only {} bytes remain in the segment",
            src.len()
        )));
    }
    if src[HEADER_BYTES + key_len + value_len..len].iter().any(|b| *b != 0) {
        return Err(malformed("alignment padding is not zero".into()));
    }
    let key = &src[HEADER_BYTES..HEADER_BYTES + key_len];
    let value = &src[HEADER_BYTES + key_len..HEADER_BYTES + key_len + value_len];
    let stored = u64_at(src, 40);
    let computed = checksum(&src[0..40], key, value);
    if stored != computed {
        return Err(DecodeError::Checksum {
            position,
            stored,
            computed,
        });
    }
    let record = Record {
        kind,
        epoch,
        position,
        version: u64_at(src, 32),
        key,
        value,
        batch_rest,
    };
    Ok((record, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put<'a>(position: u64, key: &'a [u8], value: &'a [u8]) -> RecordFields<'a> {
        RecordFields {
            kind: RecordKind::Put,
            epoch: 3,
            position,
            version: 9,
            key,
            value,
            batch_rest: 0,
        }
    }

    #[test]
    fn round_trip_and_alignment() {
        let mut buf = vec![0xAAu8; 256];
        let n = encode_into(&mut buf, &put(64, b"key", b"value!"));
        assert_eq!(n, encoded_len(3, 6));
        assert_eq!(n % RECORD_ALIGN, 0);
        let (r, len) = decode(&buf, 3, 64).unwrap();
        assert_eq!(
            (r.key, r.value, r.version, r.kind, len),
            (&b"key"[..], &b"value!"[..], 9, RecordKind::Put, n)
        );
        assert!(buf[HEADER_BYTES + 9..n].iter().all(|b| *b == 0), "padding is zeroed");
    }

    #[test]
    fn wrong_position_or_epoch_is_no_record() {
        let mut buf = vec![0u8; 128];
        encode_into(&mut buf, &put(8, b"k", b"v"));
        assert_eq!(decode(&buf, 3, 16), Err(DecodeError::NoRecord { position: 16 }));
        assert_eq!(decode(&buf, 4, 8), Err(DecodeError::NoRecord { position: 8 }));
        assert_eq!(decode(&[0u8; 64], 0, 0), Err(DecodeError::NoRecord { position: 0 }));
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let mut buf = vec![0u8; 128];
        let n = encode_into(&mut buf, &put(0, b"abc", b"0123456789"));
        for i in 0..n {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad[..n], 3, 0).is_err(), "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn expire_and_flush_records_round_trip_and_are_checked() {
        let mut buf = vec![0u8; 128];
        let at = 1_700_000_000_123u64;
        let value = expire_value(at);
        let n = encode_into(
            &mut buf,
            &RecordFields::single(RecordKind::Expire, 3, 0, 5, b"k", &value),
        );
        let (r, len) = decode(&buf, 3, 0).unwrap();
        assert_eq!(
            (r.kind, r.key, expire_time_ms(r.value), len),
            (RecordKind::Expire, &b"k"[..], at, n)
        );
        let n = encode_into(&mut buf, &RecordFields::single(RecordKind::Flush, 3, 0, 6, b"", b""));
        let (r, len) = decode(&buf, 3, 0).unwrap();
        assert_eq!((r.kind, r.version, len), (RecordKind::Flush, 6, n));
        // An expire record whose value is not 8 bytes, or that has no key;
        // a flush with a key: malformed (checksums made valid).
        for (kind, key, value) in [
            (RecordKind::Expire, &b"k"[..], &b"1234"[..]),
            (RecordKind::Expire, &b""[..], &value[..]),
            (RecordKind::Flush, &b"k"[..], &b""[..]),
        ] {
            buf.fill(0);
            let len = encoded_len(key.len(), value.len());
            buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            buf[4] = kind as u8;
            buf[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
            buf[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
            buf[16..24].copy_from_slice(&3u64.to_le_bytes());
            buf[HEADER_BYTES..HEADER_BYTES + key.len()].copy_from_slice(key);
            buf[HEADER_BYTES + key.len()..HEADER_BYTES + key.len() + value.len()].copy_from_slice(value);
            let sum = checksum(&buf[0..40], key, value);
            buf[40..48].copy_from_slice(&sum.to_le_bytes());
            assert!(
                matches!(
                    decode(&buf[..len.max(HEADER_BYTES)], 3, 0),
                    Err(DecodeError::Malformed { .. })
                ),
                "{kind:?} key {key:?} value {value:?}"
            );
        }
    }

    #[test]
    fn truncated_record_is_malformed_not_a_panic() {
        let mut buf = vec![0u8; 128];
        let n = encode_into(&mut buf, &put(0, b"abc", b"0123456789"));
        for cut in HEADER_BYTES..n {
            assert!(matches!(decode(&buf[..cut], 3, 0), Err(DecodeError::Malformed { .. })));
        }
    }
}
