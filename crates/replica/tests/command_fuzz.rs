//! Fuzz-style property test of the commands and the records they write:
//! random command sequences (SET with and without expiry options,
//! EXPIRE/PERSIST, INCRBY, APPEND, MSET, DEL, FLUSHDB, reads) run on a
//! master whose clock moves forward; its records are encoded into a real
//! segmented log, and replaying that log — what a backup promoted after a
//! failover does — must give exactly the master's objects, values,
//! versions and expiries. Covers every record kind the commands write
//! (put, delete, expire, flush; batches).

use proptest::prelude::*;
use spindle_replica::command::{execute, Args, CommandLimits, Context, Replicator, Session};
use spindle_replica::log::LogGeometry;
use spindle_replica::record::{encode_into, encoded_len, RecordFields, RecordKind};
use spindle_replica::replay::replay_into;
use spindle_replica::resp::{parse_request, Limits};
use spindle_replica::store::ObjectMap;

const GEOMETRY: LogGeometry = LogGeometry {
    segment_bytes: 4096,
    segments_max: 4,
};
const EPOCH: u64 = 3;

/// A replicator that encodes every record into segments, as a backup's
/// log holds them.
#[derive(Default)]
struct SegmentLog {
    segments: Vec<Vec<u8>>,
    head: u64,
    kinds: Vec<RecordKind>,
}

impl SegmentLog {
    fn write(&mut self, f: &RecordFields<'_>) {
        let k = GEOMETRY.segment_of(f.position) as usize;
        while self.segments.len() <= k {
            self.segments.push(vec![0u8; GEOMETRY.segment_bytes]);
        }
        let off = (f.position % GEOMETRY.segment_bytes as u64) as usize;
        encode_into(&mut self.segments[k][off..], f);
    }
}

impl Replicator for SegmentLog {
    fn append(
        &mut self,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        version: u64,
        batch_rest: u32,
    ) -> Result<(), String> {
        let p = GEOMETRY.place(self.head, encoded_len(key.len(), value.len()));
        if let Some(pad) = p.pad_at {
            self.write(&RecordFields::single(RecordKind::Pad, EPOCH, pad, 0, &[], &[]));
        }
        self.write(&RecordFields {
            batch_rest,
            ..RecordFields::single(kind, EPOCH, p.record_at, version, key, value)
        });
        self.head = p.new_head;
        self.kinds.push(kind);
        Ok(())
    }
}

fn command() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec!["a", "b", "c", "d"]);
    let n = 0u32..40;
    prop_oneof![
        (key.clone(), n.clone()).prop_map(|(k, v)| format!("SET {k} {v}")),
        (key.clone(), n.clone(), 1u32..30).prop_map(|(k, v, t)| format!("SET {k} {v} PX {t}")),
        (key.clone(), n.clone()).prop_map(|(k, v)| format!("SET {k} {v} KEEPTTL")),
        (key.clone(), n.clone()).prop_map(|(k, v)| format!("SET {k} {v} NX EX 1")),
        (key.clone(), 1u32..30).prop_map(|(k, t)| format!("PEXPIRE {k} {t}")),
        (key.clone(), 1u32..30).prop_map(|(k, t)| format!("PEXPIRE {k} {t} GT")),
        key.clone().prop_map(|k| format!("PERSIST {k}")),
        (key.clone(), n.clone()).prop_map(|(k, v)| format!("INCRBY {k} {v}")),
        (key.clone(), n.clone()).prop_map(|(k, v)| format!("APPEND {k} {v}")),
        (key.clone(), key.clone()).prop_map(|(k, j)| format!("MSET {k} 1 {j} 2")),
        (key.clone(), key.clone()).prop_map(|(k, j)| format!("DEL {k} {j}")),
        key.clone().prop_map(|k| format!("GET {k}")),
        key.clone().prop_map(|k| format!("GETSET {k} x")),
        Just("FLUSHDB".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn a_replayed_log_holds_the_masters_objects_and_expiries(
        steps in prop::collection::vec((command(), 0u64..12), 1..80),
    ) {
        let mut objects = ObjectMap::new(1 << 20);
        let mut log = SegmentLog::default();
        let mut session = Session::default();
        let limits = CommandLimits { value_bytes_max: 1024 };
        let mut now_ms = 1_000_000u64;
        let mut ranges = Vec::new();
        for (request, advance_ms) in &steps {
            now_ms += advance_ms;
            let line = format!("{request}\r\n");
            parse_request(line.as_bytes(), &Limits::for_values(1024), &mut ranges).unwrap().unwrap();
            let mut out = Vec::new();
            let mut ctx = Context { objects: &mut objects, log: &mut log, limits: &limits, info: &|_| String::new(), now_ms };
            execute(Args { buf: line.as_bytes(), ranges: &ranges }, &mut ctx, &mut session, &mut out);
            // GETSET stores "x", which INCRBY then refuses: the only error.
            prop_assert!(
                !out.is_empty() && (!out.starts_with(b"-") || out.starts_with(b"-ERR value is not an integer")),
                "{}: {}", request, String::from_utf8_lossy(&out)
            );
        }
        let mut replayed = ObjectMap::new(1 << 20);
        let segments = &log.segments;
        let outcome = replay_into(&GEOMETRY, EPOCH, log.head, |k| segments.get(k as usize).map(|s| &s[..]), &mut replayed)
            .expect("the log replays");
        // Replay may step over a segment's tail too short for a header.
        prop_assert!(outcome.end >= log.head && outcome.end - log.head < 48, "end {} head {}", outcome.end, log.head);
        prop_assert_eq!(outcome.batch_records_dropped, 0);
        prop_assert_eq!(replayed.len(), objects.len());
        prop_assert_eq!(replayed.version_max(), objects.version_max());
        for (key, o) in objects.iter() {
            prop_assert_eq!(replayed.get(key), Some(o), "key {:?}", key);
        }
        prop_assert_eq!(replayed.expiring(), objects.expiring());
    }
}

/// The generator reaches every record kind the commands write.
#[test]
fn every_command_record_kind_is_written() {
    let mut objects = ObjectMap::new(1 << 20);
    let mut log = SegmentLog::default();
    let mut session = Session::default();
    let limits = CommandLimits { value_bytes_max: 1024 };
    let mut ranges = Vec::new();
    for (now_ms, request) in [(1, "SET a 1 PX 5"), (2, "MSET b 1 c 2"), (10, "GET a"), (11, "FLUSHDB")] {
        let line = format!("{request}\r\n");
        parse_request(line.as_bytes(), &Limits::for_values(1024), &mut ranges)
            .unwrap()
            .unwrap();
        let mut ctx = Context {
            objects: &mut objects,
            log: &mut log,
            limits: &limits,
            info: &|_| String::new(),
            now_ms,
        };
        execute(
            Args {
                buf: line.as_bytes(),
                ranges: &ranges,
            },
            &mut ctx,
            &mut session,
            &mut Vec::new(),
        );
    }
    for kind in [
        RecordKind::Put,
        RecordKind::Expire,
        RecordKind::Delete,
        RecordKind::Flush,
    ] {
        assert!(log.kinds.contains(&kind), "{kind:?} never written: {:?}", log.kinds);
    }
}
