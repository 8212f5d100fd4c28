//! Fuzz-style property tests of the log decoder and of replay (proptest
//! stands in for cargo-fuzz, which this workspace does not run): whatever
//! the bytes, decoding never panics; a log cut at any byte of its last
//! record replays every acknowledged record and drops the torn tail; any
//! flipped byte inside an acknowledged record is an error, never data.

use proptest::prelude::*;
use spindle_replica::log::LogGeometry;
use spindle_replica::record::{decode, encode_into, encoded_len, RecordFields, RecordKind, HEADER_BYTES};
use spindle_replica::replay::{replay_into, ReplayError};
use spindle_replica::store::ObjectMap;

const GEOMETRY: LogGeometry = LogGeometry {
    segment_bytes: 1024,
    segments_max: 4,
};
const EPOCH: u64 = 7;

/// A log of records as a list of segments; returns the segments, each
/// record's (position, len) and the head.
fn build_log(records: &[(Vec<u8>, Vec<u8>)]) -> (Vec<Vec<u8>>, Vec<(u64, usize)>, u64) {
    let mut segments: Vec<Vec<u8>> = Vec::new();
    let mut head = 0u64;
    let mut spans = Vec::new();
    let write = |segments: &mut Vec<Vec<u8>>, f: &RecordFields<'_>| -> usize {
        let k = GEOMETRY.segment_of(f.position) as usize;
        while segments.len() <= k {
            segments.push(vec![0u8; GEOMETRY.segment_bytes]);
        }
        let off = (f.position % GEOMETRY.segment_bytes as u64) as usize;
        encode_into(&mut segments[k][off..], f)
    };
    for (i, (key, value)) in records.iter().enumerate() {
        let len = encoded_len(key.len(), value.len());
        let p = GEOMETRY.place(head, len);
        if let Some(pad) = p.pad_at {
            let f = RecordFields::single(RecordKind::Pad, EPOCH, pad, 0, &[], &[]);
            write(&mut segments, &f);
        }
        let f = RecordFields::single(RecordKind::Put, EPOCH, p.record_at, i as u64 + 1, key, value);
        let n = write(&mut segments, &f);
        spans.push((p.record_at, n));
        head = p.new_head;
    }
    (segments, spans, head)
}

fn records() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    prop::collection::vec(
        (
            prop::collection::vec(any::<u8>(), 1..24),
            prop::collection::vec(any::<u8>(), 0..300),
        ),
        1..24,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600), epoch in 0u64..3, position in 0u64..3) {
        let _ = decode(&bytes, epoch, position * 8);
        // Bytes with a plausible header prefix go further into the decoder.
        let mut b = bytes.clone();
        if b.len() >= HEADER_BYTES {
            b[0..4].copy_from_slice(b"SPRC");
            b[16..24].copy_from_slice(&epoch.to_le_bytes());
            b[24..32].copy_from_slice(&(position * 8).to_le_bytes());
            let _ = decode(&b, epoch, position * 8);
        }
    }

    #[test]
    fn encode_decode_round_trip(key in prop::collection::vec(any::<u8>(), 1..100), value in prop::collection::vec(any::<u8>(), 0..900), version: u64) {
        let mut buf = vec![0u8; 2048];
        let f = RecordFields::single(RecordKind::Put, EPOCH, 64, version, &key, &value);
        let n = encode_into(&mut buf, &f);
        let (r, len) = decode(&buf, EPOCH, 64).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(r.key, &key[..]);
        prop_assert_eq!(r.value, &value[..]);
        prop_assert_eq!(r.version, version);
    }

    /// The master died while copying its last record: any prefix of it
    /// (even all of it) reached the backup, the guard covers the others.
    #[test]
    fn a_torn_last_record_is_dropped_and_nothing_acknowledged_is_lost(recs in records(), cut_frac in 0.0f64..1.0, stale in any::<bool>()) {
        let (full, spans, _) = build_log(&recs);
        let (last_pos, last_len) = *spans.last().unwrap();
        let guard = if spans.len() > 1 { spans[spans.len() - 2].0 + spans[spans.len() - 2].1 as u64 } else { 0 };
        let cut = ((last_len as f64) * cut_frac) as usize;
        let mut torn = full.clone();
        let k = GEOMETRY.segment_of(last_pos) as usize;
        let off = (last_pos % GEOMETRY.segment_bytes as u64) as usize;
        let fill = if stale { 0xA5 } else { 0 };
        torn[k][off + cut..off + last_len].fill(fill);
        let mut objects = ObjectMap::new(1 << 30);
        let out = replay_into(&GEOMETRY, EPOCH, guard, |s| torn.get(s as usize).map(|v| &v[..]), &mut objects).unwrap();
        let acked = &recs[..recs.len() - 1];
        let mut model = std::collections::HashMap::new();
        for (key, value) in acked {
            model.insert(key.clone(), value.clone());
        }
        // Bytes the cut did not change (zeros over zeros) leave it whole.
        if torn == full {
            model.insert(recs.last().unwrap().0.clone(), recs.last().unwrap().1.clone());
            prop_assert!(out.torn.is_none());
        } else {
            prop_assert!(out.end >= guard);
        }
        prop_assert_eq!(objects.len(), model.len());
        for (key, value) in &model {
            prop_assert_eq!(&objects.get(key).expect("acknowledged key present").value[..], &value[..]);
        }
    }

    #[test]
    fn a_flipped_byte_in_an_acknowledged_record_is_an_error(recs in records(), which in any::<prop::sample::Index>(), byte in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (mut segs, spans, head) = build_log(&recs);
        let (pos, len) = spans[which.index(spans.len())];
        let at = byte.index(len);
        let k = GEOMETRY.segment_of(pos) as usize;
        let off = (pos % GEOMETRY.segment_bytes as u64) as usize;
        segs[k][off + at] ^= 1 << bit;
        let mut objects = ObjectMap::new(1 << 30);
        let r = replay_into(&GEOMETRY, EPOCH, head, |s| segs.get(s as usize).map(|v| &v[..]), &mut objects);
        prop_assert!(matches!(r, Err(ReplayError::CorruptBelowGuard(..)) | Err(ReplayError::ShortLog { .. })), "{:?}", r);
    }
}
