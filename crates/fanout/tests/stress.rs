//! Random joins, leaves and multicasts from every slot at once, in every
//! layout: each multicast reaches exactly its snapshot of members (every
//! target delivers it once, nobody else does) and completes. Bounded by
//! operation counts, not by time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_fanout::model::Rng;
use spindle_fanout::{Domain, Layout, Shape, Tree, WaitConfig};

const SLOTS: usize = 6;
const OPS_PER_SLOT: usize = 150;
const TIMEOUT: Duration = Duration::from_secs(20);

type Log = Arc<Mutex<Vec<(u64, usize)>>>;

fn run(layout: Layout, shape: Shape, seed: u64) {
    let wait = WaitConfig {
        spins: 200,
        yields: 64,
        park_max: Duration::from_millis(2),
    };
    let domain = Domain::new(Tree::build(shape, SLOTS).unwrap(), layout, wait).unwrap();
    let deliveries: Log = Arc::default();
    let completions: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..SLOTS)
        .map(|slot| {
            let (domain, deliveries, completions, finished) = (
                domain.clone(),
                deliveries.clone(),
                completions.clone(),
                finished.clone(),
            );
            std::thread::spawn(move || {
                let log = deliveries.clone();
                let mut port = domain
                    .attach(slot, move |d| log.lock().unwrap().push((d.seq, d.slot)))
                    .unwrap();
                let mut rng = Rng::new(seed ^ (slot as u64) << 32);
                let mut member = false;
                for _ in 0..OPS_PER_SLOT {
                    match rng.below(10) {
                        0..=1 if !member => {
                            port.join().unwrap();
                            member = true;
                        }
                        0..=1 => {
                            port.leave(TIMEOUT).unwrap();
                            member = false;
                        }
                        2..=4 if member => {
                            let done = port.multicast(slot as u64, TIMEOUT).unwrap();
                            assert_eq!(done.targets & (1 << slot), 0, "the origin is not its own target");
                            completions.lock().unwrap().push((done.seq, done.targets));
                        }
                        _ => {
                            port.serve(Duration::from_micros(200));
                        }
                    }
                }
                if member {
                    port.leave(TIMEOUT).unwrap();
                }
                // Keep serving until everyone is done (a broadcast needs
                // every slot; a leaver's drained multicast is done).
                finished.fetch_add(1, Ordering::AcqRel);
                while finished.load(Ordering::Acquire) < SLOTS {
                    port.serve(Duration::from_millis(1));
                }
                port.delivered()
            })
        })
        .collect();
    let delivered: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let completions = completions.lock().unwrap();
    let counted = common::check_exactly_the_snapshots(
        &format!("{layout:?}"),
        SLOTS,
        &deliveries.lock().unwrap(),
        &completions,
        21,
    );
    assert_eq!(delivered as usize, counted);
    assert_eq!(domain.state().members(), 0, "everyone left");
}

#[test]
fn random_joins_leaves_and_multicasts_reach_exactly_the_snapshot() {
    for (i, layout) in Layout::ALL.into_iter().enumerate() {
        run(layout, Shape::Kary(2), 0x5eed + i as u64);
    }
    run(Layout::TreeHelpSkip, Shape::Flat, 99);
    run(Layout::TreeHelp, Shape::Kary(3), 98);
}

/// Every wait sleeps (no spinning, no yielding, and a sleep bounded only
/// by 60 s): the origin and the members wake each other once per
/// multicast, in every layout. A lost wake-up leaves a member or the
/// origin asleep, and the multicast fails with a timeout naming who did
/// not acknowledge.
#[test]
fn no_wake_up_is_lost_when_every_wait_sleeps() {
    const MULTICASTS: u64 = 2_000;
    let wait = WaitConfig {
        spins: 0,
        yields: 0,
        park_max: Duration::from_secs(60),
    };
    // 2 members (one target: acknowledged in its mailbox line) and 3.
    for members in [2, 3] {
        for layout in Layout::ALL {
            let domain = Domain::new(Tree::build(Shape::Kary(2), 3).unwrap(), layout, wait).unwrap();
            let group: u64 = (1 << members) - 1;
            let serving: Vec<_> = (1..3)
                .map(|slot| {
                    let domain = domain.clone();
                    std::thread::spawn(move || {
                        let mut port = domain.attach(slot, |_| {}).unwrap();
                        let member = slot < members;
                        if member {
                            port.join().unwrap();
                        }
                        // A broadcast interrupts the non-member too.
                        let expected = if member || layout == Layout::Tree {
                            MULTICASTS
                        } else {
                            0
                        };
                        let mut handled = 0;
                        while handled < expected {
                            handled += u64::from(port.serve(TIMEOUT));
                        }
                        port.delivered()
                    })
                })
                .collect();
            let mut origin = domain.attach(0, |_| {}).unwrap();
            origin.join().unwrap();
            while domain.state().members() != group {
                std::thread::yield_now();
            }
            for i in 0..MULTICASTS {
                let done = origin
                    .multicast(i, TIMEOUT)
                    .unwrap_or_else(|e| panic!("{layout:?}, {members} members, multicast {i}: {e}"));
                assert_eq!(done.targets, group & !1, "reached_exactly_the_group");
            }
            for (slot, t) in (1..3).zip(serving) {
                let delivered = t.join().unwrap();
                let expected = if slot < members { MULTICASTS } else { 0 };
                assert_eq!(delivered, expected, "{layout:?}, {members} members, slot {slot}");
            }
        }
    }
}
