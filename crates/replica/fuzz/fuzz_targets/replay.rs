//! Fuzz recovery replay over arbitrary segment bytes (what a backup reads
//! back from disk) with an arbitrary guard. Properties: no panic; either
//! an error, or an outcome whose end is at least the guard and whose
//! objects fit the store's bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_replica::log::LogGeometry;
use spindle_replica::replay::replay_into;
use spindle_replica::store::ObjectMap;

const GEOMETRY: LogGeometry = LogGeometry {
    segment_bytes: 512,
    segments_max: 4,
};

fuzz_target!(|data: &[u8]| {
    // First byte: the guard (in records of 8 bytes); the rest: segments.
    let Some((&g, log)) = data.split_first() else { return };
    let guard = g as u64 * 8;
    let segments: Vec<&[u8]> = log.chunks(GEOMETRY.segment_bytes).collect();
    let mut objects = ObjectMap::new(1 << 20);
    if let Ok(outcome) = replay_into(&GEOMETRY, 1, guard, |k| segments.get(k as usize).copied(), &mut objects) {
        assert!(
            outcome.end >= guard,
            "replay stopped at {} below the guard {guard}",
            outcome.end
        );
        assert!(objects.bytes() <= objects.bytes_max());
    }
});
