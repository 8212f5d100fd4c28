//! Strangers cannot disturb the tcp fabric's handshakes: connections
//! that are not members (connect-then-close, random bytes, an HTTP GET,
//! silent connections) are handshaked alongside the members', fail on
//! their own deadline or at their first bad byte, are closed and counted
//! (`handshakes_failed`), and never fail a member — while the group forms
//! and while a restarted member rejoins a running group. Loopback only;
//! every wait is bounded; every socket and fabric is dropped at the end.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use spindle_fabric::tcp::stat::StatReader;
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, PeerSet};

mod common;
use common::{listeners, open_together, publish, sees, wait_until};

const ROW: usize = 4096;
const TAG: u64 = 0x57a;
/// Strangers thrown at each accepting member in the formation tests.
const STRANGERS_PER_MEMBER: usize = 4;
/// Silent connections held open while a member rejoins.
const SILENT_FLOOD: usize = 500;
/// Open files the flood tests need at least (see [`ensure_open_files`]).
const OPEN_FILES_NEEDED: u64 = 2048;

fn options(group: &str, addrs: &[SocketAddr]) -> TcpOptions {
    let mut o = TcpOptions::new(group, ROW, TAG, addrs.to_vec(), b"strangers key".to_vec());
    o.join_timeout = Duration::from_secs(15);
    o
}

/// A connection to `addr` that is already in the listener's backlog.
fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to a member's listener")
}

/// Three members on loopback; before any of them opens, `stranger` is
/// called [`STRANGERS_PER_MEMBER`] times for each member that accepts
/// (ranks 0 and 1: the higher ranks dial them) and what it returns is
/// kept open until the end. The group must form, and each accepting
/// member must count every stranger as a failed handshake.
fn form_despite(group: &str, stranger: impl Fn(SocketAddr) -> Option<TcpStream>) {
    let (mut ls, addrs) = listeners(3);
    let held: Vec<TcpStream> = addrs[..2]
        .iter()
        .flat_map(|a| {
            (0..STRANGERS_PER_MEMBER)
                .filter_map(|_| stranger(*a))
                .collect::<Vec<_>>()
        })
        .collect();
    let opts = options(group, &addrs);
    let fs: Vec<TcpFabric> = open_together(&mut ls, 0..3, |_| &opts)
        .into_iter()
        .enumerate()
        .map(|(r, f)| f.unwrap_or_else(|e| panic!("member {r} failed to open despite the strangers: {e}")))
        .collect();
    for f in &fs {
        assert_eq!(f.joined(), PeerSet(0b111), "member {} joined", f.member_rank());
    }
    for f in &fs[..2] {
        wait_until(&format!("member {} to count the strangers", f.member_rank()), || {
            f.handshake_stats().failed >= STRANGERS_PER_MEMBER as u64
        });
    }
    assert_eq!(
        fs[2].handshake_stats().failed,
        0,
        "nobody connected to member 2 but its peers"
    );
    publish(&fs[2], 0, 9);
    wait_until("member 2's push to reach members 0 and 1", || {
        sees(&fs[0], 2, 0, 9) && sees(&fs[1], 2, 0, 9)
    });
    drop(held);
}

#[test]
fn a_connect_then_close_does_not_fail_the_forming_group() {
    form_despite("strangers-close", |addr| {
        drop(connect(addr));
        None
    });
}

#[test]
fn random_bytes_do_not_fail_the_forming_group() {
    form_despite("strangers-random", |addr| {
        let mut s = connect(addr);
        let noise: Vec<u8> = (0..128u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        s.write_all(&noise).expect("send 128 random bytes");
        Some(s)
    });
}

#[test]
fn an_http_get_does_not_fail_the_forming_group() {
    form_despite("strangers-http", |addr| {
        let mut s = connect(addr);
        let get = http_get(addr);
        s.write_all(get.as_bytes()).expect("send an HTTP GET");
        Some(s)
    });
}

/// Silent connections held past the handshake timeout, before the other
/// members even start: each times out on its own deadline; the waiting
/// member goes on waiting for its peers.
#[test]
fn silent_connections_held_past_the_handshake_timeout_do_not_fail_the_forming_group() {
    let stat_dir = tempfile::tempdir().expect("a stat directory");
    let (mut ls, addrs) = listeners(3);
    let mut o = options("strangers-silent", &addrs);
    o.handshake_timeout = Duration::from_millis(500);
    o.stat_dir = Some(stat_dir.path().to_path_buf());
    let held: Vec<TcpStream> = (0..3).map(|_| connect(addrs[0])).collect();
    let l0 = ls[0].take().expect("listener 0");
    std::thread::scope(|s| {
        let o = &o;
        let first = s.spawn(move || TcpFabric::open_with_listener(o, 0, l0));
        // Member 0 is waiting; its stat file shows the silent connections
        // fail one by one on their deadline.
        wait_until("member 0's stat file to count 3 timed-out handshakes", || {
            stat_handshakes(stat_dir.path(), "strangers-silent", 0).is_some_and(|(failed, _)| failed >= 3)
        });
        let others = open_together(&mut ls, 1..3, |_| o);
        let f0 = first
            .join()
            .expect("member 0's thread")
            .expect("member 0 opens after the silent strangers");
        let fs: Vec<TcpFabric> = others.into_iter().map(|f| f.expect("members 1 and 2 open")).collect();
        assert_eq!(f0.joined(), PeerSet(0b111));
        assert!(f0.handshake_stats().failed >= 3, "{:?}", f0.handshake_stats());
        assert!(fs.iter().all(|f| f.joined() == PeerSet(0b111)));
    });
    drop(held);
}

/// One stranger of each kind at `addr`: a connect-then-close, 128 random
/// bytes, an HTTP GET; the ones still open are returned (to be held).
fn one_of_each(addr: SocketAddr) -> Vec<TcpStream> {
    drop(connect(addr));
    let mut random = connect(addr);
    random.write_all(&noise()).expect("send 128 random bytes");
    let mut http = connect(addr);
    http.write_all(http_get(addr).as_bytes()).expect("send an HTTP GET");
    vec![random, http]
}

/// 128 bytes of noise (a fixed multiplicative hash: the test is repeatable).
fn noise() -> Vec<u8> {
    (0..128u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// What a curl-like client sends (longer than a HELLO).
fn http_get(addr: SocketAddr) -> String {
    format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\nAccept-Language: en\r\nConnection: keep-alive\r\n\r\n"
    )
}

/// The handshake counters in member `rank`'s stat file in `dir` (while
/// its `open` has not returned yet).
fn stat_handshakes(dir: &std::path::Path, group: &str, rank: usize) -> Option<(u64, u64)> {
    StatReader::list(dir, Some(group))
        .ok()?
        .into_iter()
        .find(|r| r.rank() == rank)
        .map(|r| r.handshakes())
}

/// Raise the soft limit on open files to what the flood needs (the
/// strangers' sockets, the members', and the test harness's).
/// Two floods may run at once (the tests of this file run in parallel):
/// 2 × 503 strangers' sockets, the members' side of them (at most
/// `handshakes_pending_per_source_max` each) and the members' own.
fn ensure_open_files(needed: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit that the call fills in.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0, "getrlimit");
    if limit.rlim_cur >= needed {
        return;
    }
    assert!(
        limit.rlim_max >= needed,
        "this test needs {needed} open files; the hard limit is {}",
        limit.rlim_max
    );
    limit.rlim_cur = limit.rlim_max.min(4 * needed);
    // SAFETY: a valid rlimit, read above, with the soft limit raised
    // within the hard one.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0, "setrlimit");
}

/// `count` silent connections to `addr`, made from several threads.
fn silent_flood(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    const THREADS: usize = 10;
    std::thread::scope(|s| {
        let ts: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    (0..count / THREADS + usize::from(t < count % THREADS))
                        .map(|_| connect(addr))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        ts.into_iter().flat_map(|t| t.join().expect("flood thread")).collect()
    })
}

#[test]
fn a_restarted_member_rejoins_while_500_silent_connections_are_open() {
    ensure_open_files(OPEN_FILES_NEEDED);
    let (mut ls, addrs) = listeners(3);
    let mut o = options("strangers-rejoin", &addrs);
    // Long enough that the strangers are still pending when the member
    // comes back: it gets in beside them, not after them.
    o.handshake_timeout = Duration::from_secs(120);
    let mut fs: Vec<Option<TcpFabric>> = open_together(&mut ls, 0..3, |_| &o)
        .into_iter()
        .map(|f| Some(f.expect("open")))
        .collect();
    drop(fs[1].take());
    let f0 = fs[0].as_ref().expect("member 0");
    wait_until("member 0 to see member 1 gone", || f0.lost_peers() == PeerSet(0b010));

    let flood = silent_flood(addrs[0], SILENT_FLOOD);
    assert_eq!(flood.len(), SILENT_FLOOD, "every silent connection was made");
    let others = one_of_each(addrs[0]);
    let strangers = SILENT_FLOOD as u64 + 3;
    wait_until("member 0 to accept every stranger", || {
        let s = f0.handshake_stats();
        s.failed + s.pending >= strangers
    });
    let stats = f0.handshake_stats();
    assert!(stats.pending > 0, "some strangers are pending when the member restarts");
    assert!(
        stats.pending <= o.handshakes_pending_per_source_max as u64,
        "pending handshakes from one address stay within the per-source bound: {stats:?}"
    );

    // A new process takes rank 1 on the same address.
    let l1 = TcpListener::bind(addrs[1]).expect("bind member 1's address again");
    let f1 = TcpFabric::open_with_listener(&o, 1, l1).expect("the restarted member 1 opens despite the flood");
    let f2 = fs[2].as_ref().expect("member 2");
    wait_until("members 0 and 2 to see member 1 back", || {
        f0.joined() == PeerSet(0b111) && f2.joined() == PeerSet(0b111)
    });
    assert_eq!(f1.joined(), PeerSet(0b111));
    publish(&f1, 1, 77);
    wait_until("the rejoined member's push", || {
        sees(f0, 1, 1, 77) && sees(f2, 1, 1, 77)
    });
    assert!(
        f0.handshake_stats().pending > 0,
        "the strangers were still pending while member 1 rejoined: {:?}",
        f0.handshake_stats()
    );

    // The strangers go away: every one of them is counted as failed.
    drop((flood, others));
    wait_until("member 0 to count every stranger as a failed handshake", || {
        let s = f0.handshake_stats();
        s.failed >= strangers && s.pending == 0
    });
    f0.check_peers().expect("member 0's peers are all connected");
}

/// 500 silent connections, and one stranger of each other kind, at a
/// member that waits for its group: the members still connect beside them.
#[test]
fn a_group_forms_while_500_silent_connections_are_open() {
    ensure_open_files(OPEN_FILES_NEEDED);
    let stat_dir = tempfile::tempdir().expect("a stat directory");
    let (mut ls, addrs) = listeners(3);
    let mut o = options("strangers-flood", &addrs);
    o.handshake_timeout = Duration::from_secs(120);
    o.stat_dir = Some(stat_dir.path().to_path_buf());
    let l0 = ls[0].take().expect("listener 0");
    std::thread::scope(|s| {
        let o = &o;
        let first = s.spawn(move || TcpFabric::open_with_listener(o, 0, l0));
        let flood = silent_flood(addrs[0], SILENT_FLOOD);
        let others = one_of_each(addrs[0]);
        let strangers = SILENT_FLOOD as u64 + 3;
        wait_until("member 0's stat file to show every stranger accepted", || {
            stat_handshakes(stat_dir.path(), "strangers-flood", 0)
                .is_some_and(|(failed, pending)| failed + pending >= strangers && pending > 0)
        });
        let rest: Vec<TcpFabric> = open_together(&mut ls, 1..3, |_| o)
            .into_iter()
            .map(|f| f.expect("members 1 and 2 open beside the flood"))
            .collect();
        let f0 = first
            .join()
            .expect("member 0's thread")
            .expect("member 0 opens beside the flood");
        assert_eq!(f0.joined(), PeerSet(0b111));
        assert!(rest.iter().all(|f| f.joined() == PeerSet(0b111)));
        assert!(
            f0.handshake_stats().pending > 0,
            "the flood was still pending: {:?}",
            f0.handshake_stats()
        );
        drop((flood, others));
        wait_until("member 0 to count every stranger", || {
            let s = f0.handshake_stats();
            s.failed >= strangers && s.pending == 0
        });
    });
}

/// The total bound: over `handshakes_pending_max`, the oldest pending
/// handshake is closed (never the newest), so a member that starts late
/// still gets in beside a flood that fills the set.
#[test]
fn over_the_pending_bound_the_oldest_handshake_is_closed_and_a_late_member_gets_in() {
    const PENDING_MAX: usize = 8;
    const SILENT: usize = 40;
    let (mut ls, addrs) = listeners(3);
    let mut o = options("strangers-bound", &addrs);
    o.handshake_timeout = Duration::from_secs(120);
    o.handshakes_pending_max = PENDING_MAX;
    o.handshakes_pending_per_source_max = PENDING_MAX;
    o.wait_for = Some(PeerSet(0b011));
    let mut fs = open_together(&mut ls, 0..2, |_| &o)
        .into_iter()
        .map(|f| f.expect("open"));
    let (f0, f1) = (fs.next().expect("member 0"), fs.next().expect("member 1"));
    let flood = silent_flood(addrs[0], SILENT);
    wait_until("member 0 to accept every silent connection", || {
        let s = f0.handshake_stats();
        s.failed + s.pending >= SILENT as u64
    });
    let stats = f0.handshake_stats();
    assert_eq!(
        stats.pending, PENDING_MAX as u64,
        "the set is full and bounded: {stats:?}"
    );
    assert_eq!(
        stats.failed,
        (SILENT - PENDING_MAX) as u64,
        "each closed one counted once: {stats:?}"
    );

    let mut late = o.clone();
    late.wait_for = None;
    let f2 = TcpFabric::open_with_listener(&late, 2, ls[2].take().expect("listener 2")).expect("the late member opens");
    wait_until("members 0 and 1 to see member 2", || {
        f0.joined() == PeerSet(0b111) && f1.joined() == PeerSet(0b111)
    });
    assert_eq!(f2.joined(), PeerSet(0b111));
    drop(flood);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// Any bytes, in any chunks, from a connection that then closes: never
    /// a member, counted exactly once, and the member's peers unchanged.
    #[test]
    fn any_bytes_from_a_stranger_are_counted_once_and_never_connect(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..4),
    ) {
        use std::sync::OnceLock;
        static MEMBER: OnceLock<(TcpFabric, SocketAddr)> = OnceLock::new();
        let (f0, addr) = MEMBER.get_or_init(|| {
            let (mut ls, addrs) = listeners(2);
            let mut o = options("strangers-bytes", &addrs);
            o.wait_for = Some(PeerSet(0));
            let f = TcpFabric::open_with_listener(&o, 0, ls[0].take().expect("listener 0")).expect("open member 0");
            (f, addrs[0])
        });
        let before = f0.handshake_stats().failed;
        {
            let mut s = connect(*addr);
            for c in &chunks {
                if s.write_all(c).is_err() {
                    break; // refused and closed already
                }
            }
        }
        wait_until("the stranger to be counted", || f0.handshake_stats().failed > before);
        proptest::prop_assert_eq!(f0.handshake_stats().failed, before + 1);
        proptest::prop_assert_eq!(f0.joined(), PeerSet(0b01));
    }
}
