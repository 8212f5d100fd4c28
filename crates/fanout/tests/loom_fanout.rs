//! Loom models of the fanout protocol, run on the code that ships: joins
//! and leaves racing a multicast's snapshot, acknowledgements combining
//! in a gather counter, and the wake-ups (ports never spin: every wait
//! sleeps on its slot's futex word, modelled by a mutex and condition
//! variable with the kernel's semantics, so a lost wake-up is a deadlock
//! loom reports). Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p spindle-fanout --test loom_fanout`.
#![cfg(loom)]

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use spindle_fanout::{Domain, Layout, Shape, Tree, WaitConfig, WakeWord};

const TIMEOUT: Duration = Duration::from_secs(3600);

fn domain(layout: Layout) -> Arc<Domain> {
    // No spinning: every wait takes the park path.
    let wait = WaitConfig {
        spins: 0,
        yields: 0,
        park_max: TIMEOUT,
    };
    Domain::new(Tree::build(Shape::Kary(2), 3).unwrap(), layout, wait).unwrap()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

/// A member leaves (`joins == false`), or a slot joins and then leaves
/// (`joins == true`), while slot 0 multicasts: it delivers exactly when
/// the snapshot holds it, and the multicast completes.
fn membership_racing_a_multicast(joins: bool) {
    model(move || {
        let d = domain(Layout::TreeHelpSkip);
        d.state().join(0).unwrap();
        if !joins {
            d.state().join(1).unwrap();
        }
        let member = {
            let d = d.clone();
            loom::thread::spawn(move || {
                let mut port = d.attach(1, |_| {}).unwrap();
                if joins {
                    port.join().unwrap();
                }
                port.leave(TIMEOUT).unwrap();
                port.delivered()
            })
        };
        let mut origin = d.attach(0, |_| {}).unwrap();
        let done = origin.multicast(7, TIMEOUT).unwrap();
        let delivered = member.join().unwrap();
        assert_eq!(delivered, (done.targets >> 1) & 1, "delivers iff the snapshot holds it");
        assert_eq!(d.state().members(), 0b1);
        assert_eq!(d.state().in_flight(), None, "the multicast finished");
    });
}

#[test]
fn a_leave_racing_a_multicast_reaches_exactly_the_snapshot() {
    membership_racing_a_multicast(false);
}

#[test]
fn a_join_racing_a_multicast_reaches_exactly_the_snapshot() {
    membership_racing_a_multicast(true);
}

/// Two targets acknowledge into the root's gather counter at once (tree
/// with skipping) or into their flags (flat): the last one completes the
/// multicast and wakes the parked origin; each delivers once.
#[test]
fn acknowledgements_combine_and_the_last_wakes_the_origin() {
    for layout in [Layout::TreeHelpSkip, Layout::Flat] {
        model(move || {
            let d = domain(layout);
            for slot in 0..3 {
                d.state().join(slot).unwrap();
            }
            let payloads = Arc::new(AtomicU64::new(0));
            let targets: Vec<_> = (1..3)
                .map(|slot| {
                    let (d, payloads) = (d.clone(), payloads.clone());
                    loom::thread::spawn(move || {
                        let mut port = d
                            .attach(slot, move |m| {
                                payloads.fetch_add(m.payload, Ordering::Relaxed);
                            })
                            .unwrap();
                        while port.serve(TIMEOUT) == 0 {}
                    })
                })
                .collect();
            let mut origin = d.attach(0, |_| {}).unwrap();
            let done = origin.multicast(5, TIMEOUT).unwrap();
            assert_eq!(done.targets, 0b110);
            // Completion happens after both handlers ran.
            assert_eq!(payloads.load(Ordering::Relaxed), 10, "{layout:?}");
            for t in targets {
                t.join().unwrap();
            }
        });
    }
}

/// A broadcast from a slot below the root: the root's thread forwards,
/// the origin's own node is reached while it waits and it forwards and
/// acknowledges there, a non-member is interrupted and acknowledges.
#[test]
fn a_broadcast_from_below_the_root_completes() {
    model(|| {
        let d = domain(Layout::Tree);
        d.state().join(2).unwrap();
        d.state().join(1).unwrap();
        let others: Vec<_> = (0..2)
            .map(|slot| {
                let d = d.clone();
                loom::thread::spawn(move || {
                    let mut port = d.attach(slot, |_| {}).unwrap();
                    while port.serve(TIMEOUT) == 0 {}
                    port.delivered()
                })
            })
            .collect();
        let mut origin = d.attach(2, |_| {}).unwrap();
        let done = origin.multicast(1, TIMEOUT).unwrap();
        assert_eq!(done.targets, 0b010);
        let delivered: Vec<u64> = others.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            delivered,
            vec![0, 1],
            "the non-member forwards only; the member delivers"
        );
    });
}

/// The futex word protocol alone: two wakers each publish a change and
/// wake; the sleeper reads the word before checking, and sleeps only
/// while it is unchanged. It is never left asleep (a lost wake-up would
/// be a deadlock), and sees both changes.
#[test]
fn a_wake_word_sleeper_sees_every_wake() {
    model(|| {
        let word = Arc::new(WakeWord::new());
        let changes = Arc::new(AtomicU64::new(0));
        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let (word, changes) = (word.clone(), changes.clone());
                loom::thread::spawn(move || {
                    // Release: partner of the sleeper's Acquire load.
                    changes.fetch_add(1, Ordering::Release);
                    word.wake();
                })
            })
            .collect();
        loop {
            let seen = word.prepare();
            if changes.load(Ordering::Acquire) == 2 {
                break;
            }
            word.wait(seen, TIMEOUT);
        }
        for w in wakers {
            w.join().unwrap();
        }
    });
}
