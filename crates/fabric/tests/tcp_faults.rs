//! The tcp fabric facing bad input: a wrong key, a wrong group name, a
//! port in use, an unreachable address, bad frames, a peer that vanishes.
//! Each must give a clear error naming the fault, never a hang or a
//! corrupted row. Everything is on loopback; every wait is bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use spindle_fabric::tcp::frame::{encode_write, FRAME_HEADER_BYTES};
use spindle_fabric::tcp::handshake::{ExpectRank, Handshake, Hello, HELLO_BYTES, NONCE_BYTES, REPLY_BYTES};
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, FabricError, PeerSet};

const ROW: usize = 4096;
const TAG: u64 = 0x5eed;
/// Liveness bound for waits (never a speed assertion).
const STALL_MAX: Duration = Duration::from_secs(20);

fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
    (ls, addrs)
}

fn options(group: &str, addrs: &[SocketAddr], key: &[u8]) -> TcpOptions {
    let mut o = TcpOptions::new(group, ROW, TAG, addrs.to_vec(), key.to_vec());
    o.join_timeout = Duration::from_secs(5);
    o
}

/// Open two members on threads with their own options; both results.
fn open_pair(o0: TcpOptions, o1: TcpOptions) -> (Result<TcpFabric, FabricError>, Result<TcpFabric, FabricError>) {
    let (mut ls, _) = (Vec::new(), ());
    let (l0, a0) = listeners(1);
    let (l1, a1) = listeners(1);
    ls.extend(l0);
    ls.extend(l1);
    let addrs = vec![a0[0], a1[0]];
    let (mut o0, mut o1) = (o0, o1);
    o0.addresses = addrs.clone();
    o1.addresses = addrs;
    let l1 = ls.pop().expect("l1");
    let l0 = ls.pop().expect("l0");
    std::thread::scope(|s| {
        let t0 = s.spawn(move || TcpFabric::open_with_listener(&o0, 0, l0));
        let t1 = s.spawn(move || TcpFabric::open_with_listener(&o1, 1, l1));
        (t0.join().expect("member 0"), t1.join().expect("member 1"))
    })
}

#[test]
fn a_peer_timeout_of_an_hour_opens_like_any_other() {
    // Linux refuses more than 127 keepalive probes; a long peer timeout
    // once failed every connection with "Invalid argument".
    let (_, addrs) = listeners(2);
    let key = b"the right key, 32 bytes long....";
    let mut o0 = options("patient", &addrs, key);
    let mut o1 = options("patient", &addrs, key);
    o0.peer_timeout = Duration::from_secs(3600);
    o1.peer_timeout = Duration::from_secs(3600);
    let (r0, r1) = open_pair(o0, o1);
    r0.expect("member 0 with a one-hour peer timeout");
    r1.expect("member 1 with a one-hour peer timeout");
}

#[test]
fn a_wrong_key_is_refused_with_a_clear_error_on_both_sides() {
    let (_, addrs) = listeners(2);
    let (r0, r1) = open_pair(
        options("keyed", &addrs, b"the right key, 32 bytes long...."),
        options("keyed", &addrs, b"a guessed key"),
    );
    let e0 = r0.err().expect("member 0 must refuse").to_string();
    let e1 = r1.err().expect("member 1 must be refused").to_string();
    assert!(e0.contains("did not prove the group key"), "member 0 said: {e0}");
    assert!(e1.contains("key"), "member 1 said: {e1}");
}

#[test]
fn a_wrong_group_name_is_refused_on_both_sides() {
    let (_, addrs) = listeners(2);
    let (r0, r1) = open_pair(options("alpha", &addrs, b"k"), options("beta", &addrs, b"k"));
    let e0 = r0.err().expect("refused").to_string();
    let e1 = r1.err().expect("refused").to_string();
    assert!(e0.contains("group"), "{e0}");
    assert!(e1.contains("group"), "{e1}");
}

#[test]
fn a_port_in_use_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addrs = vec![taken.local_addr().expect("addr")];
    let e = TcpFabric::open(&options("port", &addrs, b"k"), 0)
        .err()
        .expect("port in use")
        .to_string();
    assert!(e.contains("in use") && e.contains(&addrs[0].to_string()), "{e}");
}

#[test]
fn an_unreachable_member_times_out_with_its_address() {
    let (ls, addrs) = listeners(2);
    drop(ls); // nobody listens at member 0's address
    let (l1, _) = listeners(1);
    let mut o = options("unreachable", &addrs, b"k");
    o.join_timeout = Duration::from_millis(600);
    let e = TcpFabric::open_with_listener(&o, 1, l1.into_iter().next().expect("l"))
        .err()
        .expect("nobody to connect to")
        .to_string();
    assert!(
        e.contains("could not connect to member 0") && e.contains(&addrs[0].to_string()),
        "{e}"
    );
}

/// A raw peer that passes the handshake as member 1, then misbehaves.
fn raw_member1(addr: SocketAddr, key: &[u8], group: &str) -> TcpStream {
    let started = Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if started.elapsed() < STALL_MAX => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    let hello = Hello {
        rank: 1,
        member_count: 2,
        row_len_bytes: ROW as u64,
        layout_tag: TAG,
        group: group.into(),
        nonce: [42; NONCE_BYTES],
    };
    let mut hs = Handshake::new(key, hello, ExpectRank::Exactly(0));
    s.write_all(&hs.hello()).expect("hello");
    let mut theirs = [0u8; HELLO_BYTES];
    s.read_exact(&mut theirs).expect("their hello");
    let proof = hs.on_hello(&theirs).map_err(|(_, e)| e).expect("hello accepted");
    s.write_all(&proof).expect("proof");
    let mut reply = [0u8; REPLY_BYTES];
    s.read_exact(&mut reply).expect("their proof");
    let accept = hs.on_proof(&reply).map_err(|(_, e)| e).expect("proof verifies");
    s.write_all(&accept).expect("accept");
    s.read_exact(&mut reply).expect("verdict");
    hs.on_verdict(&reply).expect("accepted");
    s
}

/// Member 0 opens with a raw member 1; `misbehave` gets its socket.
fn with_raw_peer(group: &str, misbehave: impl FnOnce(TcpStream) + Send) -> TcpFabric {
    let (ls, addrs) = listeners(2);
    let key = b"raw peer key".to_vec();
    let o = options(group, &addrs, &key);
    let l0 = ls.into_iter().next().expect("l0");
    std::thread::scope(|s| {
        let member0 = s.spawn(|| TcpFabric::open_with_listener(&o, 0, l0).expect("member 0 opens"));
        let raw = raw_member1(addrs[0], &key, group);
        let fabric = member0.join().expect("member 0");
        misbehave(raw);
        fabric
    })
}

fn wait_for_error(fabric: &TcpFabric) -> FabricError {
    let started = Instant::now();
    loop {
        if let Err(e) = fabric.check_peers() {
            return e;
        }
        assert!(
            started.elapsed() < STALL_MAX,
            "no error reported within the liveness bound"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn row_is_zero(fabric: &TcpFabric, rank: usize) -> bool {
    (0..ROW)
        .step_by(8)
        .all(|o| fabric.row(rank).u64_at(o).load(std::sync::atomic::Ordering::Acquire) == 0)
}

#[test]
fn an_out_of_bounds_frame_closes_the_connection_and_writes_nothing() {
    let fabric = with_raw_peer("oob", |mut s| {
        let mut frame = encode_write(ROW as u64 - 8, 16).to_vec();
        frame.extend_from_slice(&[0xAB; 16]);
        let _ = s.write_all(&frame);
        std::thread::sleep(Duration::from_millis(50));
    });
    match wait_for_error(&fabric) {
        FabricError::BadFrame { rank: 1, fault } => assert!(fault.contains("outside the row"), "{fault}"),
        other => panic!("expected BadFrame from member 1, got {other}"),
    }
    assert!(row_is_zero(&fabric, 1), "a refused frame never touches memory");
}

#[test]
fn an_oversized_or_unknown_frame_is_refused_by_name() {
    let fabric = with_raw_peer("oversize", |mut s| {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[0] = 1;
        h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let _ = s.write_all(&h);
        std::thread::sleep(Duration::from_millis(50));
    });
    let e = wait_for_error(&fabric).to_string();
    assert!(
        e.contains("member 1 sent a bad frame") && e.contains("frame length"),
        "{e}"
    );
    let fabric = with_raw_peer("kind", |mut s| {
        let _ = s.write_all(&[9u8; FRAME_HEADER_BYTES]);
        std::thread::sleep(Duration::from_millis(50));
    });
    let e = wait_for_error(&fabric).to_string();
    assert!(e.contains("unknown frame kind 9"), "{e}");
}

#[test]
fn a_truncated_frame_then_close_is_a_gone_peer_and_whole_words_only() {
    let fabric = with_raw_peer("truncated", |mut s| {
        let mut frame = encode_write(64, 16).to_vec();
        frame.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]); // 11 of 16
        let _ = s.write_all(&frame);
    });
    assert!(matches!(wait_for_error(&fabric), FabricError::PeerGone { rank: 1 }));
    let (_, why) = fabric.peer_status(1);
    assert!(why.unwrap_or_default().contains("without leaving"));
    let row = fabric.row(1);
    assert_eq!(
        row.u64_at(64).load(std::sync::atomic::Ordering::Acquire),
        u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8])
    );
    assert_eq!(
        row.u64_at(72).load(std::sync::atomic::Ordering::Acquire),
        0,
        "a partial word is never applied"
    );
}

#[test]
fn good_frames_from_a_raw_peer_land_in_its_row() {
    let fabric = with_raw_peer("good", |mut s| {
        let mut frame = encode_write(128, 8).to_vec();
        frame.extend_from_slice(&77u64.to_ne_bytes());
        frame.extend_from_slice(&spindle_fabric::tcp::frame::encode_leave());
        s.write_all(&frame).expect("write");
    });
    assert!(matches!(wait_for_error(&fabric), FabricError::PeerLeft { rank: 1 }));
    assert_eq!(fabric.row(1).u64_at(128).load(std::sync::atomic::Ordering::Acquire), 77);
    // Pushing to a member that left is not an error (check_peers reports it).
    fabric.push(0..8, PeerSet(0b10)).expect("push after leave");
}
