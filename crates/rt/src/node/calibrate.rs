//! Calibration: this machine's release jitter and a channel task's
//! compute time, measured before commit.

use spindle_runtime::monotonic_ns;

use crate::buffers::{BufferPool, IteratorPolicy};
use crate::layout::{MESSAGE_HEADER_BYTES, SLOT_HEADER_BYTES};
use crate::os::sleep_until_hybrid;

/// Measure the dispatcher's release jitter on this machine: `samples`
/// hybrid wake-ups `period_ns` apart; returns each wake-up's lateness.
pub fn calibrate_release_jitter(samples: usize, period_ns: u64, spin_ns: u64) -> Vec<u64> {
    let mut out = Vec::with_capacity(samples);
    let mut target = monotonic_ns() + period_ns;
    for _ in 0..samples {
        out.push(sleep_until_hybrid(target, spin_ns));
        target += period_ns;
    }
    out
}

/// Measure a channel task's compute time for `message_bytes` messages,
/// `messages` per period: worst of `rounds` copies through a pool and a
/// slot-sized buffer, doubled for safety, at least `floor_ns`.
pub fn measure_channel_compute_ns(message_bytes: usize, messages: usize, rounds: usize, floor_ns: u64) -> u64 {
    let mut pool = BufferPool::new(IteratorPolicy::Fifo, messages.max(1), message_bytes.max(1));
    let mut slot = vec![0u8; messages.max(1) * (message_bytes + MESSAGE_HEADER_BYTES) + SLOT_HEADER_BYTES];
    let msg = vec![7u8; message_bytes.max(1)];
    let mut worst = 0u64;
    for _ in 0..rounds {
        for _ in 0..messages {
            let _ = pool.insert(&msg, 0);
        }
        let t0 = monotonic_ns();
        let mut at = SLOT_HEADER_BYTES;
        while pool
            .take_with(|m, _| {
                slot[at..at + m.len()].copy_from_slice(m);
                at += m.len() + MESSAGE_HEADER_BYTES;
            })
            .is_some()
        {}
        std::hint::black_box(&slot);
        worst = worst.max(monotonic_ns() - t0);
    }
    (worst * 2).max(floor_ns)
}
