//! The builder: every bad setting is refused with an error naming it, the
//! defaults are safe, and a built member delivers, changes views, runs on a
//! progress thread and leaves.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle::transport::{send_stall_max, tcp_options};
use spindle::{Delivery, Error, Group, GroupError, TcpTransport, Transport, Upcalls, View};

fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

fn loopback_addresses(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<_> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners.iter().map(|l| l.local_addr().expect("address")).collect()
}

#[test]
fn bad_settings_are_refused_with_the_setting_named() {
    let e = Group::builder(&unique("b-rank"))
        .members(2)
        .rank(2)
        .join()
        .err()
        .expect("rank 2 of 2");
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("rank 2 is not a member"), "{e}");

    let e = Group::builder(&unique("b-window"))
        .window_slots(100)
        .join()
        .err()
        .expect("not a power of two");
    assert!(e.to_string().contains("window_slots = 100"), "{e}");

    let e = Group::builder("bad name!").join().err().expect("bad name");
    assert!(e.to_string().contains("bad name!"), "{e}");

    let tcp = TcpTransport::new(loopback_addresses(2), b"a-sixteen-byte-key!".to_vec());
    let e = Group::builder(&unique("b-count"))
        .members(3)
        .transport(Transport::Tcp(tcp))
        .join()
        .err()
        .expect("3 members, 2 addresses");
    assert!(
        e.to_string()
            .contains("lists 2 member addresses but the group has 3 members"),
        "{e}"
    );

    let short = TcpTransport::new(loopback_addresses(2), b"short".to_vec());
    let e = Group::builder(&unique("b-key"))
        .transport(Transport::Tcp(short))
        .join()
        .err()
        .expect("short key");
    assert!(e.to_string().contains("the group key has 5 bytes"), "{e}");
}

#[test]
fn tcp_defaults_keep_the_send_stall_below_the_suspicion_timeout() {
    for suspect_ms in [20u64, 500, 10_000] {
        let builder = Group::builder("stall")
            .transport(Transport::Tcp(TcpTransport::new(loopback_addresses(3), vec![7u8; 32])))
            .suspect_timeout(Duration::from_millis(suspect_ms));
        assert_eq!(
            builder.config().members,
            3,
            "members default to the number of addresses"
        );
        let config = builder.config().clone();
        let layout = spindle::group_layer::layout::SmcLayout::new(&config);
        let tcp = TcpTransport::new(loopback_addresses(3), vec![7u8; 32]);
        let options = tcp_options(&tcp, &config, &layout, 0, false).expect("valid options");
        assert!(options.send_stall_max < config.suspect_timeout);
        assert_eq!(options.send_stall_max, send_stall_max(&config));
        assert_eq!(options.send_stall_max, config.suspect_timeout / 4);
    }
}

#[test]
fn a_timeout_is_its_own_error() {
    let e = Group::builder(&unique("b-timeout"))
        .members(2)
        .join_timeout(Duration::from_millis(50))
        .join()
        .err()
        .expect("member 1 never comes");
    assert!(
        matches!(e, Error::Fabric(_)),
        "a join timeout names the missing members: {e:?}"
    );
    assert!(e.to_string().contains("[1]"), "{e}");

    let mut group = Group::builder(&unique("b-run-until"))
        .members(1)
        .join()
        .expect("a group of one");
    let e = group
        .run_until(Duration::from_millis(20), |_| false)
        .expect_err("never done");
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    let from_group: Error = GroupError::Timeout {
        waiting_for: "x".into(),
        waited_ms: 5,
    }
    .into();
    assert!(matches!(from_group, Error::Timeout { waited_ms: 5, .. }));
}

/// One delivery: (seq, sender rank, payload).
type Seq = (u64, usize, Vec<u8>);

/// Deliveries and views, shared with the test thread.
#[derive(Clone, Default)]
struct Seen {
    deliveries: Arc<Mutex<Vec<Seq>>>,
    views: Arc<Mutex<Vec<View>>>,
}

impl Upcalls for Seen {
    fn deliver(&mut self, d: &Delivery<'_>) {
        let mut all = self.deliveries.lock().expect("lock");
        all.push((d.seq, d.sender_rank, d.payload.to_vec()));
    }
    fn view_installed(&mut self, view: &View) {
        self.views.lock().expect("lock").push(view.clone());
    }
}

/// Three tcp members on threads: each sends 20 messages from a progress
/// thread's group; every member sees the same order; member 2 leaves and
/// the others install a view without it.
#[test]
fn tcp_members_deliver_in_one_order_and_a_leave_installs_a_view() {
    members_deliver_in_one_order_and_a_leave_installs_a_view("b-tcp", |addresses| {
        Transport::Tcp(TcpTransport::new(addresses, vec![42u8; 32]))
    });
}

/// The same over the ofi fabric (libfabric's software tcp provider).
#[cfg(feature = "ofi")]
#[test]
fn ofi_members_deliver_in_one_order_and_a_leave_installs_a_view() {
    members_deliver_in_one_order_and_a_leave_installs_a_view("b-ofi", |addresses| {
        Transport::Ofi(spindle::OfiTransport::new(addresses, vec![42u8; 32], "tcp"))
    });
}

/// Without the `ofi` feature, an ofi group is refused with how to rebuild.
#[cfg(not(feature = "ofi"))]
#[test]
fn ofi_without_the_feature_says_how_to_rebuild() {
    let transport = Transport::Ofi(spindle::OfiTransport::new(loopback_addresses(2), vec![42u8; 32], "tcp"));
    let e = Group::builder(&unique("b-no-ofi"))
        .transport(transport)
        .join()
        .err()
        .expect("no ofi in this build");
    assert!(e.to_string().contains("--features ofi"), "{e}");
}

fn members_deliver_in_one_order_and_a_leave_installs_a_view(prefix: &str, transport: fn(Vec<SocketAddr>) -> Transport) {
    let addresses = loopback_addresses(3);
    let name = unique(prefix);
    let seen: Vec<Seen> = (0..3).map(|_| Seen::default()).collect();
    let groups: Vec<_> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..3)
            .map(|rank| {
                let (name, addresses, app) = (name.clone(), addresses.clone(), seen[rank].clone());
                s.spawn(move || {
                    Group::builder(&name)
                        .rank(rank)
                        .transport(transport(addresses))
                        .app(app)
                        .join()
                        .expect("join")
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().expect("member thread")).collect()
    });
    let running: Vec<_> = groups.into_iter().map(Group::spawn).collect();
    for (rank, member) in running.iter().enumerate() {
        let sender = member.sender().expect("every member sends");
        let mut sent = 0;
        while sent < 20 {
            match sender.send(&[rank as u8; 8]) {
                Ok(()) => sent += 1,
                Err(spindle::SendError::WouldBlock) => std::thread::yield_now(),
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.iter().any(|s| s.deliveries.lock().expect("lock").len() < 60) {
        assert!(
            std::time::Instant::now() < deadline,
            "every member delivers 60 messages"
        );
        assert!(running.iter().all(|r| !r.has_failed()), "no progress thread fails");
        std::thread::sleep(Duration::from_millis(5));
    }
    let first = seen[0].deliveries.lock().expect("lock").clone();
    for s in &seen[1..] {
        assert_eq!(*s.deliveries.lock().expect("lock"), first, "total order");
    }
    let mut members: Vec<_> = running.into_iter().map(|r| r.stop().expect("stop")).collect();
    let leaver = members.pop().expect("member 2");
    std::thread::scope(|s| {
        s.spawn(move || leaver.leave(Duration::from_secs(30)).expect("member 2 leaves"));
        for member in members.iter_mut() {
            s.spawn(move || {
                member
                    .run_until(Duration::from_secs(30), |app| {
                        app.views
                            .lock()
                            .expect("lock")
                            .last()
                            .is_some_and(|v| v.members == [0, 1])
                    })
                    .expect("the others install a view without member 2")
            });
        }
    });
    let views = seen[0].views.lock().expect("lock").clone();
    assert_eq!(views.last().expect("a view").departed, vec![2]);
}

/// What a persistent member delivered: (view, seq, payload).
#[derive(Default)]
struct Recorded(Vec<(u64, u64, Vec<u8>)>);

impl Upcalls for Recorded {
    fn deliver(&mut self, d: &Delivery<'_>) {
        self.0.push((d.view, d.seq, d.payload.to_vec()));
    }
}

/// One run of three persistent tcp members: each sends `per_member`
/// messages; returns what each delivered (a restart's history first).
fn persistent_tcp_run(
    name: &str,
    dir: &std::path::Path,
    run: u8,
    per_member: usize,
    total: usize,
) -> Vec<Vec<(u64, u64, Vec<u8>)>> {
    persistent_tcp_members(name, dir, 3, total, |group, rank| {
        for i in 0..per_member {
            group.send(&[run, rank as u8, i as u8]).expect("send");
        }
    })
}

/// `members` persistent tcp members; each runs `send(group, rank)`, then
/// delivers until it has `total`; returns what each delivered.
fn persistent_tcp_members(
    name: &str,
    dir: &std::path::Path,
    members: usize,
    total: usize,
    send: impl Fn(&mut Group<Recorded>, usize) + Sync,
) -> Vec<Vec<(u64, u64, Vec<u8>)>> {
    let addresses = loopback_addresses(members);
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..members)
            .map(|rank| {
                let (addresses, send) = (addresses.clone(), &send);
                s.spawn(move || {
                    let mut group = Group::builder(name)
                        .rank(rank)
                        .transport(Transport::Tcp(TcpTransport::new(addresses, vec![9u8; 32])))
                        .mode(spindle::DeliveryMode::Persistent)
                        .persist_dir(dir)
                        .app(Recorded::default())
                        .join()
                        .expect("join");
                    send(&mut group, rank);
                    group
                        .run_until(Duration::from_secs(30), |r| r.0.len() == total)
                        .expect("deliver");
                    group.finish_together(Duration::from_secs(30)).expect("finish").0
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().expect("member thread")).collect()
    })
}

/// Persistent mode over tcp: a second start over the logs replays the
/// first run's history to every member, then goes on in view 1.
#[test]
fn tcp_persistent_members_restart_from_their_logs() {
    let name = unique("b-persist-tcp");
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let first = persistent_tcp_run(&name, &dir, 1, 30, 90);
    assert!(first.iter().all(|d| *d == first[0]), "one order");
    let second = persistent_tcp_run(&name, &dir, 2, 10, 120);
    for d in &second {
        assert_eq!(&d[..90], &first[0][..], "the history comes back first, unchanged");
        assert!(
            d[90..].iter().all(|m| m.0 == 1 && m.2[0] == 2),
            "then run 2's messages, in view 1"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Large messages over tcp, in persistent mode: each member delivers the
/// 300 KB message whole (30 fragments of a 10 KB slot), and a restart
/// over the logs replays it whole too, before the new view.
#[test]
fn tcp_large_messages_arrive_whole_and_a_persistent_restart_replays_them() {
    let name = unique("b-large-tcp");
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let large: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 1000) as u8).collect();
    let run = |round: u8, expected: usize| {
        persistent_tcp_members(&name, &dir, 2, expected, |group, rank| {
            if round == 1 && rank == 0 {
                group.send_large(&large).expect("send_large");
            } else {
                group.send(&[round, rank as u8]).expect("send");
            }
        })
    };
    let first = run(1, 2);
    for d in &first {
        assert_eq!(d, &first[0], "one order");
        assert!(d.iter().any(|m| m.2 == large), "the large message, whole");
    }
    let second = run(2, 4);
    for d in &second {
        assert_eq!(
            &d[..2],
            &first[0][..],
            "the history, the large message whole, comes back first"
        );
        assert!(d[2..].iter().all(|m| m.0 == 1 && m.2[0] == 2), "then run 2's messages");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member built with `on_large_fragment` takes a large message fragment
/// by fragment, in place, over tcp: the fragments continue each other
/// and make the message sent; `on_deliver` sees only the small messages.
#[test]
fn tcp_large_messages_taken_in_place_through_the_builder() {
    let name = unique("b-large-in-place");
    let addresses = loopback_addresses(2);
    let large: Vec<u8> = (0..300_000u32).map(|i| (i * 13 + i / 777) as u8).collect();
    type Staged = Arc<Mutex<(Vec<u8>, Vec<Vec<u8>>, usize)>>;
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..2usize)
            .map(|rank| {
                let (addresses, large, name) = (addresses.clone(), &large, &name);
                s.spawn(move || {
                    // (staged bytes, whole messages put together, small deliveries)
                    let staged: Staged = Arc::default();
                    let (in_fragments, in_delivery, cuts) =
                        (staged.clone(), staged.clone(), Arc::new(Mutex::new(0u32)));
                    let cut_count = cuts.clone();
                    let mut group = Group::builder(name)
                        .rank(rank)
                        .transport(Transport::Tcp(TcpTransport::new(addresses, vec![5u8; 32])))
                        .on_large_fragment(move |f| {
                            let mut st = in_fragments.lock().expect("lock");
                            assert_eq!(st.0.len() as u64, f.offset, "no gaps: fragments in order");
                            st.0.extend_from_slice(f.data);
                            if f.is_last() {
                                let whole = std::mem::take(&mut st.0);
                                st.1.push(whole);
                            }
                        })
                        .on_large_message_cut(move |_, _, _, _| *cut_count.lock().expect("lock") += 1)
                        .on_deliver(move |d| {
                            assert!(d.payload.len() < 1000, "a large message went to on_deliver");
                            in_delivery.lock().expect("lock").2 += 1;
                        })
                        .join()
                        .expect("join");
                    if rank == 0 {
                        group.send_large(large).expect("send_large");
                    }
                    group.send(&[rank as u8]).expect("send");
                    let done = |st: &Staged| {
                        let st = st.lock().expect("lock");
                        st.1.len() == 1 && st.2 == 2
                    };
                    group
                        .run_until(Duration::from_secs(30), |_| done(&staged))
                        .expect("deliver");
                    group.finish_together(Duration::from_secs(30)).expect("finish");
                    assert_eq!(*cuts.lock().expect("lock"), 0, "nothing cut");
                    let st = staged.lock().expect("lock");
                    assert!(
                        st.1[0] == *large,
                        "member {rank}: the message, whole, from its fragments"
                    );
                })
            })
            .collect();
        for j in joins {
            j.join().expect("member thread");
        }
    });
}

/// Poll `group` until `done(group)` holds (a liveness bound, not a speed
/// bound: 30 s).
fn poll_until<A: Upcalls>(group: &mut Group<A>, what: &str, done: impl Fn(&Group<A>) -> bool) {
    let started = std::time::Instant::now();
    while !done(group) {
        group.poll_or_idle().expect("poll");
        assert!(started.elapsed() < Duration::from_secs(30), "never: {what}");
    }
}

/// A restart after the group went on without a member: the two members
/// of the last view restart from their logs; the third, started again
/// with the same configuration, sets its log aside (kept, renamed) and
/// joins the restarted group afresh, then delivers with the others.
#[test]
fn tcp_a_member_left_out_of_a_restart_joins_the_restarted_group_afresh() {
    let name = unique("b-rejoin");
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let addresses = loopback_addresses(3);
    let member = |rank: usize| {
        Group::builder(&name)
            .rank(rank)
            .transport(Transport::Tcp(TcpTransport::new(addresses.clone(), vec![4u8; 32])))
            .mode(spindle::DeliveryMode::Persistent)
            .persist_dir(&dir)
            .app(Recorded::default())
    };
    // Run 1: three messages in view 0; member 2 leaves; two more in view 1.
    std::thread::scope(|s| {
        for rank in 0..3usize {
            let member = &member;
            s.spawn(move || {
                let mut group = member(rank).join().expect("join");
                group.send(&[1, rank as u8]).expect("send");
                group
                    .run_until(Duration::from_secs(30), |r| r.0.len() == 3)
                    .expect("view 0's messages");
                if rank == 2 {
                    group.leave(Duration::from_secs(30)).expect("leave");
                    return;
                }
                poll_until(&mut group, "a view without member 2", |g| g.view().members == [0, 1]);
                group.send(&[1, rank as u8, 1]).expect("send");
                group
                    .run_until(Duration::from_secs(30), |r| r.0.len() == 5)
                    .expect("view 1's messages");
                group.finish_together(Duration::from_secs(30)).expect("finish");
            });
        }
    });
    // Run 2: all three again, the same configuration.
    let delivered: Vec<Vec<(u64, u64, Vec<u8>)>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..3usize)
            .map(|rank| {
                let member = &member;
                s.spawn(move || {
                    let mut group = member(rank).join().expect("restart or join afresh");
                    poll_until(&mut group, "all three in one view", |g| g.view().members.len() == 3);
                    group.send(&[2, rank as u8]).expect("send");
                    let want = if rank == 2 { 3 } else { 8 };
                    group
                        .run_until(Duration::from_secs(30), |r| r.0.len() == want)
                        .expect("run 2's messages");
                    group.finish_together(Duration::from_secs(30)).expect("finish").0
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().expect("member thread")).collect()
    });
    // Members 0 and 1: the history of run 1, then run 2's messages.
    assert_eq!(delivered[0], delivered[1], "one order");
    assert_eq!(delivered[0].len(), 8);
    assert!(delivered[0][..5].iter().all(|m| m.2[0] == 1), "the history first");
    // Member 2: run 2's messages, in the same order, after its admission.
    assert_eq!(
        delivered[2][..],
        delivered[0][5..],
        "the joiner delivers what the others do"
    );
    let first_view = delivered[0][5].0;
    assert!(
        first_view >= 3,
        "admitted after the restarted group's first view: {first_view}"
    );
    // Its old log was kept, renamed.
    let kept = std::fs::read_dir(&dir)
        .expect("the log directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("set-aside-at-view-"))
        .count();
    assert_eq!(kept, 1, "member 2's old log is kept beside the new one");
    let _ = std::fs::remove_dir_all(&dir);
}
