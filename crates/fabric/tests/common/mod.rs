//! Helpers shared by the tcp fabric's integration tests (membership, TLS):
//! loopback listeners bound before any member opens, members opened
//! together, bounded waits, and one-word pushes.

#![allow(dead_code)] // each test binary uses its own subset

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, FabricError, PeerSet};

/// Liveness bound for waits (a hang fails the test; never a speed
/// assertion).
pub const STALL_MAX: Duration = Duration::from_secs(20);

/// `n` listeners on free loopback ports, and their addresses.
pub fn listeners(n: usize) -> (Vec<Option<TcpListener>>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
    (ls.into_iter().map(Some).collect(), addrs)
}

/// Open ranks `ranks` at once (each waits for the others), rank `r` with
/// `options(r)` on its listener `ls[r]`; the results by rank.
pub fn open_together<'o>(
    ls: &mut [Option<TcpListener>],
    ranks: std::ops::Range<usize>,
    options: impl Fn(usize) -> &'o TcpOptions + Sync,
) -> Vec<Result<TcpFabric, FabricError>> {
    let listeners: Vec<TcpListener> = ls[ranks.clone()]
        .iter_mut()
        .map(|l| l.take().expect("listener opened once"))
        .collect();
    std::thread::scope(|s| {
        let ts: Vec<_> = ranks
            .zip(listeners)
            .map(|(r, l)| {
                let options = &options;
                s.spawn(move || TcpFabric::open_with_listener(options(r), r, l))
            })
            .collect();
        ts.into_iter().map(|t| t.join().expect("open thread")).collect()
    })
}

/// Wait until `ok()` holds, or panic naming `what` after [`STALL_MAX`].
pub fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < STALL_MAX, "stalled waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Store `value` at word `word` of the own row and push it to every peer.
pub fn publish(f: &TcpFabric, word: usize, value: u64) {
    f.row(f.member_rank()).u64_at(word * 8).store(value, Ordering::Release);
    f.push(
        word * 8..word * 8 + 8,
        PeerSet::all_except(f.member_rank(), f.member_count()),
    )
    .expect("push");
}

/// Whether word `word` of `rank`'s row reads `value` at `f`.
pub fn sees(f: &TcpFabric, rank: usize, word: usize, value: u64) -> bool {
    f.row(rank).u64_at(word * 8).load(Ordering::Acquire) == value
}
