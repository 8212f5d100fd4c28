//! Membership support of the tcp fabric: a member that starts late, a
//! member that leaves and comes back as a new process with the same rank
//! (its row starts from zeros again), `lost_peers`, `joined`, and the
//! source-address check. Loopback only; every wait is bounded; every
//! fabric is dropped (its sockets closed) at the end of its test.

use std::net::{SocketAddr, TcpListener};

use std::time::Duration;

use spindle_fabric::tcp::{PeerStatus, TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, PeerSet};

mod common;
use common::{listeners, open_together, publish, sees, wait_until};

const ROW: usize = 4096;
const TAG: u64 = 0x10e;

fn options(group: &str, addrs: &[SocketAddr]) -> TcpOptions {
    let mut o = TcpOptions::new(group, ROW, TAG, addrs.to_vec(), b"membership key".to_vec());
    o.join_timeout = Duration::from_secs(10);
    o
}

/// Open members `0..2` together, `o(r)` for rank `r`; both must open.
fn open_pair<'o>(
    ls: &mut [Option<std::net::TcpListener>],
    o: impl Fn(usize) -> &'o TcpOptions + Sync,
) -> (TcpFabric, TcpFabric) {
    let mut fs = open_together(ls, 0..2, o).into_iter().map(|r| r.expect("open"));
    (fs.next().expect("member 0"), fs.next().expect("member 1"))
}

/// Open every member together with `opts`; all must open.
fn open_all(ls: &mut [Option<std::net::TcpListener>], opts: &TcpOptions) -> Vec<Option<TcpFabric>> {
    let n = ls.len();
    open_together(ls, 0..n, |_| opts)
        .into_iter()
        .map(|r| Some(r.expect("open")))
        .collect()
}

#[test]
fn a_member_that_starts_late_joins_and_exchanges_rows() {
    let (mut ls, addrs) = listeners(3);
    let mut early = options("late-join", &addrs);
    early.wait_for = Some(PeerSet(0b011));
    let (f0, f1) = open_pair(&mut ls, |_| &early);
    assert_eq!(f0.joined(), PeerSet(0b011));
    assert_eq!(f1.joined(), PeerSet(0b011));
    assert_eq!(f0.peer_status(2).0, PeerStatus::Waiting);
    assert_eq!(f0.lost_peers(), PeerSet(0), "a member not yet started is not lost");
    f0.check_peers().expect("a waiting member is no error");
    publish(&f0, 0, 11);
    wait_until("member 1 to see member 0's push", || sees(&f1, 0, 0, 11));

    // Member 2 starts late, waiting for everyone (both are up).
    let f2 = TcpFabric::open_with_listener(&options("late-join", &addrs), 2, ls[2].take().expect("l2"))
        .expect("open the late member");
    wait_until("members 0 and 1 to see member 2 join", || {
        f0.joined() == PeerSet(0b111) && f1.joined() == PeerSet(0b111)
    });
    assert_eq!(f2.joined(), PeerSet(0b111));
    publish(&f2, 1, 22);
    wait_until("members 0 and 1 to see the late member's push", || {
        sees(&f0, 2, 1, 22) && sees(&f1, 2, 1, 22)
    });
    publish(&f0, 2, 33);
    publish(&f1, 2, 44);
    wait_until("the late member to see members 0 and 1", || {
        sees(&f2, 0, 2, 33) && sees(&f2, 1, 2, 44)
    });
    for f in [&f0, &f1, &f2] {
        f.check_peers().expect("all connected");
        assert_eq!(f.lost_peers(), PeerSet(0));
    }
}

#[test]
fn a_lost_member_reopened_with_its_rank_starts_from_a_zeroed_row_and_resumes() {
    let (mut ls, addrs) = listeners(3);
    let opts = options("rejoin", &addrs);
    let mut fs = open_all(&mut ls, &opts);
    {
        let f1 = fs[1].as_ref().expect("member 1");
        publish(f1, 0, 42);
        publish(f1, 5, 43);
    }
    wait_until("members 0 and 2 to see member 1's row", || {
        sees(fs[0].as_ref().unwrap(), 1, 0, 42) && sees(fs[2].as_ref().unwrap(), 1, 5, 43)
    });

    // Member 1 goes away (a clean close: LEAVE).
    drop(fs[1].take());
    wait_until("members 0 and 2 to notice member 1 left", || {
        fs[0].as_ref().unwrap().lost_peers() == PeerSet(0b010) && fs[2].as_ref().unwrap().lost_peers() == PeerSet(0b010)
    });
    assert_eq!(fs[0].as_ref().unwrap().joined(), PeerSet(0b101));
    assert!(fs[0].as_ref().unwrap().check_peers().is_err());

    // A new process takes rank 1 on the same address.
    let l1 = TcpListener::bind(addrs[1]).expect("bind member 1's address again");
    let f1 = TcpFabric::open_with_listener(&opts, 1, l1).expect("reopen member 1");
    let (f0, f2) = (fs[0].as_ref().unwrap(), fs[2].as_ref().unwrap());
    wait_until("members 0 and 2 to see member 1 back", || {
        f0.joined() == PeerSet(0b111) && f2.joined() == PeerSet(0b111)
    });
    for f in [f0, f2] {
        assert_eq!(f.lost_peers(), PeerSet(0));
        f.check_peers().expect("member 1 is connected again");
        // Nothing pushed yet by the new incarnation: its row reads zeros.
        assert!(
            (0..ROW / 8).all(|w| sees(f, 1, w, 0)),
            "member {} still has the old incarnation's row",
            f.member_rank()
        );
    }
    publish(&f1, 3, 7);
    publish(f0, 4, 70);
    publish(f2, 4, 72);
    wait_until("the new member 1's push to arrive", || {
        sees(f0, 1, 3, 7) && sees(f2, 1, 3, 7)
    });
    wait_until("members 0 and 2's pushes to reach the new member 1", || {
        sees(&f1, 0, 4, 70) && sees(&f1, 2, 4, 72)
    });
    assert!(sees(f0, 1, 0, 0), "the old value stays gone");
}

#[test]
fn a_connection_from_another_address_than_the_rank_claims_is_refused() {
    // Member 1 is configured at 127.0.0.2 but dials from 127.0.0.1.
    let (mut ls, mut addrs) = listeners(2);
    let real1 = addrs[1];
    addrs[1] = SocketAddr::new("127.0.0.2".parse().expect("ip"), real1.port());
    let mut o0 = options("source-check", &addrs);
    o0.join_timeout = Duration::from_secs(3);
    let mut o1 = o0.clone();
    o1.listen = Some(real1);
    let mut rs = open_together(&mut ls, 0..2, |r| if r == 0 { &o0 } else { &o1 }).into_iter();
    let (r0, r1) = (rs.next().expect("member 0"), rs.next().expect("member 1"));
    let e0 = r0.err().expect("member 0 must refuse").to_string();
    let e1 = r1.err().expect("member 1 must be refused").to_string();
    assert!(
        e0.contains("connected from 127.0.0.1") && e0.contains("127.0.0.2"),
        "member 0 said: {e0}"
    );
    assert!(e1.contains("source address"), "member 1 said: {e1}");

    // The same set-up with the check off connects.
    let (mut ls, addrs2) = listeners(2);
    let mut addrs = addrs2.clone();
    addrs[1] = SocketAddr::new("127.0.0.2".parse().expect("ip"), addrs2[1].port());
    let mut o0 = options("source-nat", &addrs);
    o0.check_source_addr = false;
    let mut o1 = o0.clone();
    o1.listen = Some(addrs2[1]);
    let (f0, f1) = open_pair(&mut ls, |r| if r == 0 { &o0 } else { &o1 });
    assert_eq!(f0.joined(), PeerSet(0b11));
    assert_eq!(f1.joined(), PeerSet(0b11));
}

#[test]
fn lost_peers_lists_every_lost_peer_at_once_without_an_error() {
    let (mut ls, addrs) = listeners(3);
    let opts = options("lost-all", &addrs);
    let mut fs = open_all(&mut ls, &opts);
    assert_eq!(fs[0].as_ref().unwrap().lost_peers(), PeerSet(0));
    drop(fs[1].take());
    drop(fs[2].take());
    let f0 = fs[0].as_ref().unwrap();
    wait_until("member 0 to see both peers lost", || f0.lost_peers() == PeerSet(0b110));
    assert_eq!(f0.joined(), PeerSet(0b001));
    assert!(f0.check_peers().is_err(), "check_peers still reports the first loss");
}
