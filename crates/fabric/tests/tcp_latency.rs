//! A fabric-level round trip on loopback, for profiling: it checks every
//! round trip completes and prints the figures (it asserts no timing):
//!
//! ```sh
//! cargo test --release -p spindle-fabric --test tcp_latency -- --nocapture
//! ```
//!
//! Member 0 stores a counter and pushes it; member 1 waits for it and
//! pushes it back; member 0 waits the same way. Two ways to wait, each
//! next to the raw TCP ping-pong that waits the same way, in the same
//! run, so the difference is the fabric's own cost:
//! - spin, then park on the doorbell (the group layer's `park` idle
//!   strategy), against blocking reads: two wake-ups and two sends;
//! - spin, receiving on the waiting thread (`Fabric::receive_now`, the
//!   group layer's `spin` idle strategy on tcp), against busy-polling
//!   non-blocking reads: no wake-up at all.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, PeerSet};

const ROUNDS: u64 = 20_000;
const WARMUP: u64 = 2_000;
/// Passes before parking (`SPINDLE_TEST_SPINS` overrides).
fn spins_max() -> u32 {
    std::env::var("SPINDLE_TEST_SPINS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}
const STALL_MAX: Duration = Duration::from_secs(30);

/// How a side waits for the other's push.
#[derive(Clone, Copy, PartialEq)]
enum Wait {
    /// Spin a while, then park on the doorbell (the receive thread or
    /// the park itself receives); flush each pass when coalescing.
    SpinThenPark { coalesce: bool },
    /// Spin, receiving on this thread (`Fabric::receive_now`) each pass,
    /// like a group progress loop with `--idle spin`.
    SpinReceiving,
}

/// Wait until word 0 of `rank`'s row reaches `want`.
fn wait_for(f: &TcpFabric, rank: usize, want: u64, wait: Wait) {
    let started = Instant::now();
    let mut spins = 0u64;
    let spins_max = spins_max();
    loop {
        if wait == Wait::SpinReceiving {
            f.receive_now();
        }
        if f.row(rank).u64_at(0).load(Ordering::Acquire) >= want {
            return;
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            assert!(started.elapsed() < STALL_MAX, "stalled at {want}");
        }
        if wait == Wait::SpinReceiving {
            std::hint::spin_loop();
            continue;
        }
        if wait == (Wait::SpinThenPark { coalesce: true }) {
            f.flush();
        }
        if spins < spins_max as u64 {
            std::hint::spin_loop();
            continue;
        }
        let bell = f.doorbell();
        let t = bell.prepare_park();
        if f.row(rank).u64_at(0).load(Ordering::Acquire) >= want {
            bell.cancel_park();
        } else {
            bell.park(t, Duration::from_millis(1));
        }
    }
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn fabric_round_trips(wait: Wait) -> Vec<u64> {
    let coalesce = wait != (Wait::SpinThenPark { coalesce: false });
    let ls: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
    let mut o = TcpOptions::new("tcp-latency", 4096, 1, addrs, b"latency key".to_vec());
    o.coalesce = coalesce;
    o.flush_on_ring = false;
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().expect("l0"), ls.next().expect("l1"));
    let (f0, f1) = std::thread::scope(|s| {
        let t0 = s.spawn(|| TcpFabric::open_with_listener(&o, 0, l0));
        let t1 = s.spawn(|| TcpFabric::open_with_listener(&o, 1, l1));
        (t0.join().unwrap().expect("open 0"), t1.join().unwrap().expect("open 1"))
    });
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=ROUNDS + WARMUP {
                wait_for(&f1, 0, i, wait);
                f1.row(1).u64_at(0).store(i, Ordering::Release);
                f1.push(0..8, PeerSet(1)).expect("push");
                if coalesce {
                    f1.flush();
                }
            }
        });
        let mut rtts = Vec::with_capacity(ROUNDS as usize);
        for i in 1..=ROUNDS + WARMUP {
            let t = Instant::now();
            f0.row(0).u64_at(0).store(i, Ordering::Release);
            f0.push(0..8, PeerSet(2)).expect("push");
            if coalesce {
                f0.flush();
            }
            wait_for(&f0, 1, i, wait);
            if i > WARMUP {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        }
        rtts
    })
}

/// Read exactly `b.len()` bytes: blocking, or by spinning on
/// non-blocking reads.
fn read_all(c: &mut TcpStream, b: &mut [u8], spin: bool) {
    if !spin {
        c.read_exact(b).expect("read");
        return;
    }
    let mut got = 0;
    while got < b.len() {
        match c.read(&mut b[got..]) {
            Ok(0) => panic!("peer closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn raw_round_trips(spin: bool) -> Vec<u64> {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::scope(|s| {
        s.spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            c.set_nodelay(true).expect("nodelay");
            c.set_nonblocking(spin).expect("nonblocking");
            let mut b = [0u8; 32];
            for _ in 0..ROUNDS + WARMUP {
                read_all(&mut c, &mut b, spin);
                c.write_all(&b).expect("write");
            }
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        let mut b = [7u8; 32];
        let mut rtts = Vec::with_capacity(ROUNDS as usize);
        for i in 0..ROUNDS + WARMUP {
            let t = Instant::now();
            c.write_all(&b).expect("write");
            c.set_nonblocking(spin).expect("nonblocking");
            read_all(&mut c, &mut b, spin);
            c.set_nonblocking(false).expect("blocking");
            if i >= WARMUP {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        }
        rtts
    })
}

/// Every round trip completes on each path (the times are printed with
/// `--nocapture`, for profiling; no speed is asserted: speed targets live
/// in `spindle bench multicast --transport tcp`).
#[test]
fn fabric_round_trip_next_to_a_raw_tcp_ping_pong() {
    for (name, mut v) in [
        ("raw TCP ping-pong (threads)", raw_round_trips(false)),
        (
            "tcp fabric, push per send",
            fabric_round_trips(Wait::SpinThenPark { coalesce: false }),
        ),
        (
            "tcp fabric, coalesced + flush per pass",
            fabric_round_trips(Wait::SpinThenPark { coalesce: true }),
        ),
        ("raw TCP ping-pong, busy-polling reads", raw_round_trips(true)),
        (
            "tcp fabric, spinning on receive_now",
            fabric_round_trips(Wait::SpinReceiving),
        ),
    ] {
        assert_eq!(v.len(), ROUNDS as usize, "{name}: every round trip completes");
        let p50 = percentile(&mut v, 0.5);
        let p99 = percentile(&mut v, 0.99);
        println!("{name:45} p50 {p50:>7} ns  p99 {p99:>8} ns  ({} rounds)", v.len());
    }
}
