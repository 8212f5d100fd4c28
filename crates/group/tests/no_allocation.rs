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

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use std::net::TcpListener;

use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::Fabric;
use spindle_group::layout::SmcLayout;
use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, SendError};

/// Counts the allocations of threads that set [`COUNTING`].
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// The first counted allocation's backtrace (resolved after the window).
static FIRST: Mutex<Option<std::backtrace::Backtrace>> = Mutex::new(None);

thread_local! {
    /// This thread's allocations are counted (const-initialized: reading
    /// it allocates nothing).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn counted() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // Capturing allocates: not counted, and only the first (its
        // symbols are resolved later, outside the allocator).
        COUNTING.with(|c| c.set(false));
        if let Ok(mut first) = FIRST.try_lock() {
            if first.is_none() {
                *first = Some(std::backtrace::Backtrace::force_capture());
            }
        }
        COUNTING.with(|c| c.set(true));
    }
}

// SAFETY: every call is passed to `System` unchanged. The counting reads
// and writes a const-initialized thread-local `Cell` (no lazy init, no
// destructor, no allocation) and an atomic; once, with counting off, it
// takes a mutex with `try_lock` and captures a backtrace, whose own
// allocations re-enter this allocator uncounted. Nothing in it unwinds.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

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
    ALLOCATIONS.store(0, Ordering::Relaxed);
    *FIRST.lock().expect("first") = None;
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
                COUNTING.with(|c| c.set(true));
                let total = (WARM_UP + MEASURED) * members;
                send_and_deliver(&mut group, &mut sent, MEASURED, total, &delivered, &sum);
                COUNTING.with(|c| c.set(false));
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
    let first = FIRST.lock().ok().and_then(|mut f| f.take()).map(|b| b.to_string());
    (ALLOCATIONS.load(Ordering::Relaxed), first)
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
