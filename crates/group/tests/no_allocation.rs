//! No allocation on the send or delivery path: a counting global
//! allocator watches the member threads of a 2-member group (every
//! member sending; on shared memory ordered and persistent, on loopback
//! tcp ordered) while, after a warm-up,
//! they send and deliver thousands of messages each with `send` and
//! `poll_or_idle`. Any allocation those threads make in that window is
//! counted, and the first one's backtrace is kept for the report.
//!
//! The window covers whole passes of the progress loop (sending,
//! receiving, delivering, acknowledging, null messages and idling), not
//! only `send` and the delivery callback; a view change or a join, which
//! may allocate, happens before it.

use std::cell::Cell;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use std::net::TcpListener;

use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::Fabric;
use spindle_group::layout::SmcLayout;
use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, SendError};
use spindle_runtime::alloc_count::{self, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const MEMBERS: usize = 2;
const WARM_UP: u64 = 20_000;
const MEASURED: u64 = 50_000;

fn config(case: &str) -> GroupConfig {
    let mut c = GroupConfig::new(&format!("noalloc-{}-{case}", std::process::id()), MEMBERS);
    c.window_slots = 256;
    c.slot_payload_max = 64;
    c
}

/// Send `count` more messages and poll until this member delivered
/// `deliver_to` in all (bounded); `sum` adds up the delivered counters.
fn send_and_deliver<F: Fabric>(
    group: &mut Group<F>,
    sent: &mut u64,
    count: u64,
    deliver_to: u64,
    delivered: &Cell<u64>,
    sum: &Cell<u64>,
) {
    let sender = group.sender().expect("every member sends");
    let target = *sent + count;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut app = |d: &Delivery<'_>| {
        delivered.set(delivered.get() + 1);
        sum.set(
            sum.get()
                .wrapping_add(u64::from_le_bytes(d.payload[..8].try_into().expect("8 bytes"))),
        );
    };
    while *sent < target || delivered.get() < deliver_to {
        assert!(
            Instant::now() < deadline,
            "sent {sent}, delivered {} of {deliver_to}",
            delivered.get()
        );
        while *sent < target {
            match sender.send(&sent.to_le_bytes()) {
                Ok(()) => *sent += 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        group.poll_or_idle(&mut app).expect("poll");
    }
}

/// Run the members (each opened by `join(rank)` on its own thread): a
/// warm-up, then the measured window with counting on. Returns the
/// allocations counted and the first one's backtrace.
fn allocations_while_warm<F: Fabric + 'static>(
    join: impl Fn(usize) -> Group<F> + Send + Sync + 'static,
) -> (u64, Option<String>) {
    alloc_count::reset();
    let barrier = Arc::new(Barrier::new(MEMBERS));
    let join = Arc::new(join);
    let members: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let (barrier, join) = (barrier.clone(), join.clone());
            std::thread::spawn(move || {
                let mut group = join(rank);
                let (mut sent, delivered, sum) = (0u64, Cell::new(0u64), Cell::new(0u64));
                let members = MEMBERS as u64;
                send_and_deliver(&mut group, &mut sent, WARM_UP, WARM_UP * members, &delivered, &sum);
                barrier.wait();
                alloc_count::count_this_thread(true);
                let total = (WARM_UP + MEASURED) * members;
                send_and_deliver(&mut group, &mut sent, MEASURED, total, &delivered, &sum);
                alloc_count::count_this_thread(false);
                barrier.wait();
                group
                    .finish_together(&mut |_: &Delivery<'_>| {}, Duration::from_secs(30))
                    .expect("finish");
                (delivered.get(), sum.get())
            })
        })
        .collect();
    // Bounded, and a member's panic is raised at once: the other one may
    // wait at a barrier for ever (it is left behind; the process ends).
    let mut members: Vec<Option<std::thread::JoinHandle<(u64, u64)>>> = members.into_iter().map(Some).collect();
    let mut ends: Vec<(u64, u64)> = vec![(0, 0); MEMBERS];
    let deadline = Instant::now() + Duration::from_secs(300);
    while members.iter().any(Option::is_some) {
        for (rank, member) in members.iter_mut().enumerate() {
            if member.as_ref().is_some_and(|m| m.is_finished()) {
                match member.take().expect("a member").join() {
                    Ok(end) => ends[rank] = end,
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        }
        let waiting: Vec<usize> = (0..MEMBERS).filter(|r| members[*r].is_some()).collect();
        assert!(Instant::now() < deadline, "members {waiting:?} did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    let expected_sum: u64 = (0..WARM_UP + MEASURED).sum::<u64>() * MEMBERS as u64;
    for (rank, (delivered, sum)) in ends.iter().enumerate() {
        assert_eq!(
            *delivered,
            (WARM_UP + MEASURED) * MEMBERS as u64,
            "member {rank} delivered everything"
        );
        assert_eq!(*sum, expected_sum, "member {rank} delivered every message once");
    }
    let first = alloc_count::first_backtrace();
    (alloc_count::allocations(), first)
}

/// The group's tcp options on loopback listeners bound to port 0.
fn tcp_members(config: &GroupConfig) -> (TcpOptions, Vec<Option<TcpListener>>) {
    let listeners: Vec<TcpListener> = (0..MEMBERS)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let addresses = listeners.iter().map(|l| l.local_addr().expect("address")).collect();
    let layout = SmcLayout::new(config);
    let options = TcpOptions::new(
        &config.name,
        layout.row.row_len_bytes(),
        layout.row.tag(),
        addresses,
        b"no allocation test".to_vec(),
    );
    (options, listeners.into_iter().map(Some).collect())
}

/// One test for every case, one after the other (the counters are
/// process-wide): shm ordered, shm persistent, tcp ordered.
#[test]
fn sending_and_delivering_allocate_nothing_once_warm() {
    let mut failures = Vec::new();
    let mut check = |case: &str, (allocations, first): (u64, Option<String>)| {
        if allocations != 0 {
            failures.push(format!(
                "{case}: {allocations} allocations on the member threads while sending and delivering {MEASURED} messages each; the first:\n{}",
                first.unwrap_or_default()
            ));
        }
    };
    check(
        "shm, ordered",
        allocations_while_warm(|rank| Group::join_shm(config("shm"), rank).expect("join")),
    );
    /// Removed however the test ends.
    struct TempDir(std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = TempDir(std::env::temp_dir().join(format!("noalloc-{}-persistent", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let dir_path = dir.0.clone();
    let persistent = {
        let dir = dir_path;
        move |rank| {
            let mut c = config("persistent");
            c.mode = DeliveryMode::Persistent;
            c.persist_dir = Some(dir.clone());
            Group::join_shm(c, rank).expect("join")
        }
    };
    check("shm, persistent", allocations_while_warm(persistent));
    drop(dir);
    let tcp_config = config("tcp");
    let (options, listeners) = tcp_members(&tcp_config);
    let listeners = Mutex::new(listeners);
    let tcp = move |rank: usize| {
        let listener = listeners.lock().expect("listeners")[rank]
            .take()
            .expect("once per rank");
        let fabric = TcpFabric::open_with_listener(&options, rank, listener).expect("open tcp");
        Group::join(Arc::new(fabric), tcp_config.clone()).expect("join")
    };
    check("tcp, ordered", allocations_while_warm(tcp));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
