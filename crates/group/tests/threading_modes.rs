//! The same group protocol under the three threading modes: invoker (the
//! application polls), dedicated (a progress thread per group) and shared
//! (one thread runs several groups).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_group::{Group, GroupAgent, GroupConfig, SendError};
use spindle_runtime::{AgentRunner, IdleStrategy, ThreadingMode};

const PER_MEMBER: u64 = 500;

fn config(test: &str) -> GroupConfig {
    let mut c = GroupConfig::new(&format!("tm-{}-{test}", std::process::id()), 2);
    c.window_slots = 32;
    c.slot_payload_max = 32;
    c
}

/// Send `PER_MEMBER` messages through `sender`, yielding on back-pressure
/// (a progress thread frees slots meanwhile).
fn send_all(sender: &spindle_group::Sender<spindle_fabric::shm::ShmFabric>) {
    let mut sent = 0;
    while sent < PER_MEMBER {
        match sender.send(&sent.to_le_bytes()) {
            Ok(()) => sent += 1,
            Err(SendError::WouldBlock) => std::thread::yield_now(),
            Err(e) => panic!("send: {e}"),
        }
    }
}

fn wait_for(counter: &AtomicU64, want: u64) {
    // Liveness bound only (a hang fails the test), not a speed assertion.
    for _ in 0..60_000 {
        if counter.load(Ordering::Acquire) >= want {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("delivered {} of {want}", counter.load(Ordering::Acquire));
}

#[test]
fn dedicated_progress_threads_deliver_everything_and_hand_the_group_back() {
    let config = config("dedicated");
    let members: Vec<_> = (0..2)
        .map(|rank| {
            let config = config.clone();
            std::thread::spawn(move || {
                let group = Group::join_shm(config, rank).unwrap();
                let sender = group.sender().unwrap();
                let delivered = Arc::new(AtomicU64::new(0));
                let counter = delivered.clone();
                let running = group.spawn(move |_: &spindle_group::Delivery<'_>| {
                    counter.fetch_add(1, Ordering::Release);
                });
                send_all(&sender);
                wait_for(&delivered, 2 * PER_MEMBER);
                let mut group = running.stop().expect("progress thread ran cleanly");
                group
                    .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
                    .unwrap();
                delivered.load(Ordering::Acquire)
            })
        })
        .collect();
    for m in members {
        assert_eq!(m.join().unwrap(), 2 * PER_MEMBER);
    }
}

#[test]
fn one_shared_thread_runs_two_groups() {
    // Member 0 of groups A and B runs on one shared progress thread; the
    // members 1 run in invoker mode on another thread.
    let (a, b) = (config("shared-a"), config("shared-b"));
    let peers = {
        let (a, b) = (a.clone(), b.clone());
        std::thread::spawn(move || {
            let mut ga = Group::join_shm(a, 1).unwrap();
            let mut gb = Group::join_shm(b, 1).unwrap();
            let (mut na, mut nb) = (0u64, 0u64);
            while na < PER_MEMBER || nb < PER_MEMBER {
                ga.poll_or_idle(&mut |_: &spindle_group::Delivery<'_>| na += 1).unwrap();
                gb.poll_or_idle(&mut |_: &spindle_group::Delivery<'_>| nb += 1).unwrap();
            }
            ga.finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
                .unwrap();
            gb.finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
                .unwrap();
            (na, nb)
        })
    };
    // Member 1 of each group is a sender that never sends: its nulls
    // unblock the order, exercising the null path on the shared thread.
    let ga = Group::join_shm(a, 0).unwrap();
    let gb = Group::join_shm(b, 0).unwrap();
    let (sa, sb) = (ga.sender().unwrap(), gb.sender().unwrap());
    let delivered = Arc::new(AtomicU64::new(0));
    let (ca, cb) = (delivered.clone(), delivered.clone());
    let agents = vec![
        GroupAgent::new(ga, move |_: &spindle_group::Delivery<'_>| {
            ca.fetch_add(1, Ordering::Release);
        }),
        GroupAgent::new(gb, move |_: &spindle_group::Delivery<'_>| {
            cb.fetch_add(1, Ordering::Release);
        }),
    ];
    let runner = AgentRunner::start(ThreadingMode::Shared, agents, IdleStrategy::DEFAULT_BACKOFF);
    send_all(&sa);
    send_all(&sb);
    wait_for(&delivered, 2 * PER_MEMBER);
    let mut agents = runner.stop().expect("shared thread ran cleanly");
    for agent in agents.iter_mut() {
        agent
            .group
            .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
            .unwrap();
    }
    assert_eq!(peers.join().unwrap(), (PER_MEMBER, PER_MEMBER));
}
