//! The ofi fabric under load and with bad input (feature `ofi`,
//! libfabric's `tcp` provider on loopback).
//!
//! - `streamed_slots_stay_behind_their_guard`: two members stream 10 KB
//!   slots to each other at once, megabytes in flight, the way the group
//!   layer's sender batching does (slots in one push, then the guard in
//!   another); each reader checks every slot its guard covers. With
//!   `FI_ORDER_WAW` trusted on libfabric 1.17's tcp provider this failed
//!   3 runs out of 3 (a guard landed before its slot), which is why that
//!   provider's writes are serialized per peer
//!   (`ofi::endpoint::PROVIDERS_SERIALIZED`).
//! - A provider this machine's libfabric lacks, and a wrong group key,
//!   fail `open` with errors that say what is wrong.
#![cfg(feature = "ofi")]

use std::net::TcpListener;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use spindle_fabric::ofi::{OfiFabric, OfiOptions};
use spindle_fabric::{Fabric, FabricError, PeerSet};

/// A wait that sees no progress for this long fails (liveness, not speed).
const STALL_MAX: Duration = Duration::from_secs(20);

const GUARD: usize = 0;
const ACK: usize = 64;
const SLOT_BYTES: usize = 10_240;
const SLOTS_AT: usize = 128;
/// Slots a writer may run ahead of its reader's acknowledgement.
const AHEAD_MAX: u64 = 512;
/// Ring slots: the writer is at most AHEAD_MAX ahead, so twice that.
const RING: u64 = 1024;
const BATCH_MAX: u64 = 50;
const ROUNDS: u64 = 30_000;

fn loopback(n: usize) -> (Vec<TcpListener>, Vec<std::net::SocketAddr>) {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let addresses = listeners.iter().map(|l| l.local_addr().expect("address")).collect();
    (listeners, addresses)
}

fn open_all(options: &OfiOptions, listeners: Vec<TcpListener>) -> Vec<Result<OfiFabric, FabricError>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| s.spawn(move || OfiFabric::open_with_listener(options, rank, l)))
            .collect();
        threads.into_iter().map(|t| t.join().expect("open thread")).collect()
    })
}

fn slot_offset(round: u64) -> usize {
    SLOTS_AT + (round % RING) as usize * SLOT_BYTES
}

/// Stream ROUNDS slots to the peer, in pushes of up to BATCH_MAX slots
/// followed by the guard, never more than AHEAD_MAX ahead of its ack.
fn writer(fabric: &OfiFabric) {
    let me = fabric.member_rank();
    let peer = 1 - me;
    let (mine, theirs) = (fabric.row(me), fabric.row(peer));
    let mut round = 1u64;
    while round <= ROUNDS {
        let started = Instant::now();
        // Partner: the Release store of ACK by the peer's reader.
        while theirs.u64_at(ACK).load(Acquire) + AHEAD_MAX < round {
            assert!(started.elapsed() < STALL_MAX, "member {me}: acks stuck");
            std::thread::yield_now();
        }
        let acked = theirs.u64_at(ACK).load(Acquire);
        let mut last = round;
        while last < ROUNDS
            && last + 1 - round < BATCH_MAX
            && !(last + 1).is_multiple_of(RING)
            && acked + AHEAD_MAX > last
        {
            last += 1;
        }
        for r in round..=last {
            mine.u64_at(slot_offset(r)).store(r, Relaxed);
            // SAFETY: the own row; the reader acknowledged this slot's
            // previous lap (AHEAD_MAX < RING), so nobody reads it now.
            unsafe { mine.bytes_mut(slot_offset(r) + 8, SLOT_BYTES - 8) }.fill(r as u8);
        }
        let to_peer = PeerSet(1 << peer);
        fabric
            .push(slot_offset(round)..slot_offset(last) + SLOT_BYTES, to_peer)
            .expect("push slots");
        // Partner: the Acquire load of GUARD by the peer's reader.
        mine.u64_at(GUARD).store(last, Release);
        fabric.push(GUARD..GUARD + 8, to_peer).expect("push guard");
        round = last + 1;
    }
}

/// Check every slot the peer's guard covers, acknowledging as it goes.
/// Incoming writes are applied by the fabric's progress thread alone.
fn reader(fabric: &OfiFabric) {
    let me = fabric.member_rank();
    let peer = 1 - me;
    let (mine, theirs) = (fabric.row(me), fabric.row(peer));
    let mut next = 1u64;
    let mut moved = Instant::now();
    while next <= ROUNDS {
        // Partner: the Release store of GUARD by the peer's writer.
        let guard = theirs.u64_at(GUARD).load(Acquire);
        if guard < next {
            assert!(moved.elapsed() < STALL_MAX, "member {me}: guard stuck at {guard}");
            std::thread::yield_now();
            continue;
        }
        while next <= guard {
            let header = theirs.u64_at(slot_offset(next)).load(Relaxed);
            assert_eq!(
                header,
                next,
                "member {me}: the guard says {guard} but slot {} still holds round {header}, not {next} \
                 (a write landed before the one issued ahead of it)",
                next % RING
            );
            next += 1;
        }
        moved = Instant::now();
        // Partner: the Acquire load of ACK by the peer's writer.
        mine.u64_at(ACK).store(next - 1, Release);
        fabric.push(ACK..ACK + 8, PeerSet(1 << peer)).expect("push ack");
    }
}

#[test]
fn streamed_slots_stay_behind_their_guard() {
    const _: () = assert!(AHEAD_MAX * 2 <= RING && SLOTS_AT >= ACK + 8);
    let (listeners, addresses) = loopback(2);
    let row_len_bytes = SLOTS_AT + RING as usize * SLOT_BYTES;
    // SPINDLE_OFI_PROVIDER checks another provider (a cluster's verbs or efa).
    let provider = std::env::var("SPINDLE_OFI_PROVIDER").unwrap_or_else(|_| "tcp".into());
    let options = OfiOptions::new(
        "ofi-stream",
        row_len_bytes,
        1,
        addresses,
        b"stream key".to_vec(),
        &provider,
    );
    let fabrics: Vec<OfiFabric> = open_all(&options, listeners)
        .into_iter()
        .map(|f| f.unwrap_or_else(|e| panic!("open: {e}")))
        .collect();
    std::thread::scope(|s| {
        for fabric in &fabrics {
            s.spawn(move || writer(fabric));
            s.spawn(move || reader(fabric));
        }
    });
    for fabric in &fabrics {
        fabric.check_peers().expect("both members alive");
    }
}

#[test]
fn a_missing_provider_is_named_with_what_the_machine_offers() {
    let (mut listeners, addresses) = loopback(1);
    let options = OfiOptions::new("ofi-missing", 4096, 1, addresses, b"k".to_vec(), "no-such-provider");
    match OfiFabric::open_with_listener(&options, 0, listeners.remove(0)) {
        Err(e @ FabricError::OfiProvider { .. }) => {
            let text = e.to_string();
            eprintln!("{text}");
            assert!(
                text.contains("no-such-provider") && text.contains("tcp"),
                "the error names the provider asked for and those offered: {text}"
            );
        }
        Err(other) => panic!("expected OfiProvider, got: {other}"),
        Ok(_) => panic!("a provider that does not exist was opened"),
    }
}

#[test]
fn a_wrong_group_key_is_refused_by_the_control_plane() {
    let (listeners, addresses) = loopback(2);
    let mut options = OfiOptions::new("ofi-key", 4096, 1, addresses, b"right key".to_vec(), "tcp");
    options.tcp.join_timeout = Duration::from_secs(3);
    let wrong = {
        let mut o = options.clone();
        o.tcp.key = b"wrong key".to_vec();
        o
    };
    let results = std::thread::scope(|s| {
        let mut listeners = listeners.into_iter();
        let (l0, l1) = (listeners.next().expect("0"), listeners.next().expect("1"));
        let a = s.spawn(|| OfiFabric::open_with_listener(&options, 0, l0));
        let b = s.spawn(|| OfiFabric::open_with_listener(&wrong, 1, l1));
        [a.join().expect("member 0"), b.join().expect("member 1")]
    });
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("key") || text.contains("did not join"),
                    "member {rank}: the error says why: {text}"
                );
            }
            Ok(_) => panic!("member {rank} opened with a peer that has another key"),
        }
    }
}
