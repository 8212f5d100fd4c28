//! Recovery replay: decode an epoch's log, verify every record, detect a
//! torn last record and rebuild the objects (sans-IO: the caller hands in
//! segment bytes, however it got them).
//!
//! The *guard* is the head the dead master had published to this backup:
//! every record below it was completely written before the guard was
//! stored (`Release`), and every acknowledged write lies below it. So:
//!
//! - a record below the guard that fails to decode is corruption: an error
//!   (`durability: acknowledged record …`), never silently dropped;
//! - past the guard the master may have died mid-copy: the first record
//!   that is not valid there is the torn tail, reported and dropped;
//!   complete records past the guard (written, never acknowledged) are
//!   kept, which linearizability allows for a write whose client never got
//!   an answer;
//! - the log must reach the guard, or acknowledged writes were lost;
//! - a batch (an MSET, a SET with an expiry: records whose `batch_rest` counts down to 0) is
//!   applied whole or not at all: a batch cut short — by the end of the
//!   log, or abandoned by a master whose append failed — was never
//!   acknowledged and is dropped. A batch's records have consecutive
//!   versions and `batch_rest` counting down to 0.

use crate::log::LogGeometry;
use crate::record::{decode, DecodeError, Record, RecordKind, HEADER_BYTES};
use crate::store::ObjectMap;

/// What a replay found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// Position just past the last valid record.
    pub end: u64,
    /// Valid records applied (pads and markers included).
    pub records: u64,
    /// The torn tail that was dropped, if any.
    pub torn: Option<String>,
    /// Whether the epoch's starting snapshot was complete in this log.
    pub snapshot_done: bool,
    /// Records of incomplete batches that were dropped.
    pub batch_records_dropped: u64,
}

/// An owned record held until its batch is complete.
struct Pending {
    kind: RecordKind,
    position: u64,
    version: u64,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// Why a log cannot be replayed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("durability: acknowledged record lost: {0} (below the guard {guard})", guard = .1)]
    CorruptBelowGuard(DecodeError, u64),
    #[error(
        "durability: acknowledged write lost: the log ends at position {end} but the master acknowledged up to {guard}"
    )]
    ShortLog { end: u64, guard: u64 },
    #[error("the store cannot hold the log's objects: {0}")]
    Store(String),
}

/// Replay epoch `epoch` of a log. `segment(k)` returns segment `k`'s bytes
/// (a prefix of the segment when it was sealed part-way), or `None` past
/// the last segment. `apply` sees every put and delete in log order.
pub fn replay<'a>(
    geometry: &LogGeometry,
    epoch: u64,
    guard: u64,
    mut segment: impl FnMut(u64) -> Option<&'a [u8]>,
    mut apply: impl FnMut(&Record<'_>) -> Result<(), String>,
) -> Result<ReplayOutcome, ReplayError> {
    let mut out = ReplayOutcome::default();
    let mut position = 0u64;
    let mut batch: Vec<Pending> = Vec::new();
    let mut expected_rest: Option<u32> = None;
    let segment_bytes = geometry.segment_bytes as u64;
    loop {
        let k = geometry.segment_of(position);
        let Some(bytes) = segment(k) else { break };
        assert!(
            bytes.len() <= geometry.segment_bytes,
            "segment {k} longer than a segment"
        );
        let offset = (position % segment_bytes) as usize;
        if geometry.segment_bytes - offset < HEADER_BYTES {
            position = (k + 1) * segment_bytes;
            continue;
        }
        let src = if offset <= bytes.len() {
            &bytes[offset..]
        } else {
            &[][..]
        };
        match decode(src, epoch, position) {
            Ok((record, len)) => {
                out.records += 1;
                match record.kind {
                    RecordKind::Pad => {
                        position = (k + 1) * segment_bytes;
                        continue;
                    }
                    RecordKind::SnapshotDone => {
                        out.batch_records_dropped += batch.len() as u64;
                        batch.clear();
                        expected_rest = None;
                        out.snapshot_done = true;
                    }
                    RecordKind::Put | RecordKind::Delete | RecordKind::Expire | RecordKind::Flush => {
                        // A batch continues with the next count down and
                        // the next version; anything else means it was
                        // abandoned (the master reuses the versions of a
                        // batch it never applied).
                        let continues = batch.last().is_some_and(|p| {
                            expected_rest == Some(record.batch_rest) && record.version == p.version + 1
                        });
                        if !batch.is_empty() && !continues {
                            // The batch before was abandoned part-way.
                            out.batch_records_dropped += batch.len() as u64;
                            batch.clear();
                        }
                        if record.batch_rest > 0 {
                            batch.push(Pending {
                                kind: record.kind,
                                position: record.position,
                                version: record.version,
                                key: record.key.to_vec(),
                                value: record.value.to_vec(),
                            });
                            expected_rest = Some(record.batch_rest - 1);
                        } else {
                            for p in batch.drain(..) {
                                let held = Record {
                                    kind: p.kind,
                                    epoch,
                                    position: p.position,
                                    version: p.version,
                                    key: &p.key,
                                    value: &p.value,
                                    batch_rest: 1,
                                };
                                apply(&held).map_err(ReplayError::Store)?;
                            }
                            expected_rest = None;
                            apply(&record).map_err(ReplayError::Store)?;
                        }
                    }
                }
                position += len as u64;
            }
            Err(DecodeError::NoRecord { .. }) => break,
            Err(e) if position < guard => return Err(ReplayError::CorruptBelowGuard(e, guard)),
            Err(e) => {
                out.torn = Some(e.to_string());
                break;
            }
        }
    }
    out.end = position;
    out.batch_records_dropped += batch.len() as u64;
    if position < guard {
        return Err(ReplayError::ShortLog { end: position, guard });
    }
    Ok(out)
}

/// Replay straight into an object map.
pub fn replay_into<'a>(
    geometry: &LogGeometry,
    epoch: u64,
    guard: u64,
    segment: impl FnMut(u64) -> Option<&'a [u8]>,
    objects: &mut ObjectMap,
) -> Result<ReplayOutcome, ReplayError> {
    replay(geometry, epoch, guard, segment, |r| objects.apply_record(r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{encode_into, encoded_len, RecordFields};

    const G: LogGeometry = LogGeometry {
        segment_bytes: 4096,
        segments_max: 4,
    };

    /// One segment holding `(key, batch_rest, version)` puts in order;
    /// returns it and the head.
    fn log(records: &[(&str, u32, u64)]) -> (Vec<u8>, u64) {
        let mut seg = vec![0u8; G.segment_bytes];
        let mut head = 0u64;
        for (key, rest, version) in records {
            let f = RecordFields {
                batch_rest: *rest,
                ..RecordFields::single(RecordKind::Put, 1, head, *version, key.as_bytes(), b"v")
            };
            head += encode_into(&mut seg[head as usize..], &f) as u64;
            assert_eq!(head as usize % 8, 0);
            assert!(head as usize <= encoded_len(8, 1) * records.len());
        }
        (seg, head)
    }

    fn keys(records: &[(&str, u32, u64)]) -> (Vec<String>, ReplayOutcome) {
        let (seg, head) = log(records);
        let mut objects = ObjectMap::new(1 << 20);
        let out = replay_into(&G, 1, head, |k| (k == 0).then_some(&seg[..]), &mut objects).unwrap();
        let mut keys: Vec<String> = objects
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        (keys, out)
    }

    #[test]
    fn a_complete_batch_is_applied_whole() {
        let (k, out) = keys(&[("a", 0, 1), ("b", 2, 2), ("c", 1, 3), ("d", 0, 4)]);
        assert_eq!(k, ["a", "b", "c", "d"]);
        assert_eq!(out.batch_records_dropped, 0);
    }

    #[test]
    fn a_batch_cut_short_by_the_log_end_is_dropped() {
        let (k, out) = keys(&[("a", 0, 1), ("b", 2, 2), ("c", 1, 3)]);
        assert_eq!(k, ["a"]);
        assert_eq!(out.batch_records_dropped, 2);
    }

    #[test]
    fn an_abandoned_batch_is_dropped_and_what_follows_applied() {
        // The master reuses the versions of a batch it never applied.
        let (k, out) = keys(&[("b", 2, 1), ("c", 1, 2), ("x", 0, 1), ("y", 1, 2), ("z", 0, 3)]);
        assert_eq!(k, ["x", "y", "z"]);
        assert_eq!(out.batch_records_dropped, 2);
    }
}
