//! Fuzz the log record decoder: arbitrary bytes at an arbitrary
//! (epoch, position). Properties: no panic; a decoded record lies inside
//! the input, is 8-byte aligned, carries the epoch and position asked for,
//! and re-encodes to exactly the bytes it was decoded from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_replica::record::{decode, encode_into, RecordFields, RECORD_ALIGN};

fuzz_target!(|data: &[u8]| {
    // First two bytes: epoch and position (in records of 8 bytes).
    let Some((&[e, p], src)) = data.split_first_chunk::<2>() else {
        return;
    };
    let (epoch, position) = (e as u64 % 4, p as u64 * RECORD_ALIGN as u64);
    let Ok((record, len)) = decode(src, epoch, position) else {
        return;
    };
    assert!(
        len <= src.len(),
        "record of {len} bytes from {} bytes of input",
        src.len()
    );
    assert_eq!(len % RECORD_ALIGN, 0, "record length {len} not aligned");
    assert_eq!((record.epoch, record.position), (epoch, position));
    let mut again = vec![0u8; len];
    let n = encode_into(
        &mut again,
        &RecordFields {
            kind: record.kind,
            epoch: record.epoch,
            position: record.position,
            version: record.version,
            key: record.key,
            value: record.value,
            batch_rest: record.batch_rest,
        },
    );
    assert_eq!(n, len, "re-encoded length");
    assert_eq!(&again[..], &src[..len], "decode and encode disagree");
});
