//! No allocation on the DDS path once warm: a counting global allocator
//! (`spindle_runtime::alloc_count`) watches, while a writer of one
//! participant sends 40,000 samples of a fixed-size keyed type to a
//! reliable keep-last reader of another (on shared memory):
//! - the application thread: every `DataWriter::write` and
//!   `DataReader::take_raw`;
//! - both participants' progress threads, whole (routing, the readers'
//!   caches, acknowledgements, ticks): a data-available listener, which
//!   runs on them, turns their counting on for the window.

mod common_dds;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common_dds::*;
use serde::{Deserialize, Serialize};
use spindle::dds::{Keyed, ReaderQos, WriterQos};
use spindle_runtime::alloc_count::{self, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// A sample with no heap data: decoding it allocates nothing either.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Tick {
    id: u32,
    n: u64,
}

impl Keyed for Tick {
    type Key = u32;
    fn key(&self) -> u32 {
        self.id
    }
}

/// The progress threads count while set (their listeners read it).
static MEASURING: AtomicBool = AtomicBool::new(false);

#[test]
fn writing_routing_and_taking_allocate_nothing_once_warm() {
    const WARM_UP: u64 = 20_000;
    const MEASURED: u64 = 40_000;
    let d = join_all(domain_id(77), 2, |b| b);
    let topics = [
        d[0].create_topic::<Tick>("ticks").unwrap(),
        d[1].create_topic::<Tick>("ticks").unwrap(),
    ];
    let writer = d[0]
        .create_writer(&topics[0], WriterQos::default().reliable(Duration::from_secs(10)))
        .unwrap();
    let qos = || ReaderQos::default().reliable(Duration::from_secs(10)).keep_last(4);
    // A reader on each participant: each one's listener runs on its
    // participant's progress thread.
    let readers = [
        d[0].create_reader(&topics[0], qos()).unwrap(),
        d[1].create_reader(&topics[1], qos()).unwrap(),
    ];
    for reader in &readers {
        reader.on_data_available(|| alloc_count::count_this_thread(MEASURING.load(Ordering::Relaxed)));
    }
    writer.wait_for_readers(2, WAIT).unwrap();
    let mut taken = 0usize;
    let run = |from: u64, to: u64, taken: &mut usize| {
        for n in from..to {
            writer.write(&Tick { id: (n % 4) as u32, n }).unwrap();
            if n % 64 == 0 {
                for reader in &readers {
                    *taken += reader.take_raw(usize::MAX, |_, _| {});
                }
            }
        }
    };
    run(0, WARM_UP, &mut taken);
    alloc_count::reset();
    MEASURING.store(true, Ordering::Relaxed);
    alloc_count::count_this_thread(true);
    run(WARM_UP, WARM_UP + MEASURED, &mut taken);
    writer.wait_for_acknowledgments(WAIT).unwrap();
    alloc_count::count_this_thread(false);
    MEASURING.store(false, Ordering::Relaxed);
    let allocations = alloc_count::allocations();
    let first = alloc_count::first_backtrace();
    // The listeners turn the progress threads' counting off again.
    run(WARM_UP + MEASURED, WARM_UP + MEASURED + 64, &mut taken);
    assert!(taken > 0, "the readers took samples");
    assert_eq!(
        allocations,
        0,
        "{allocations} allocations while writing, routing and taking {MEASURED} samples; the first:\n{}",
        first.unwrap_or_default()
    );
}
