//! Subgroups and shards through the builder: each shard delivers its own
//! messages, in one order at all its members, to its members only; a
//! member in two subgroups gets both; bad layouts are refused with the
//! reason.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle::{Callbacks, Error, Group, SubgroupSpec, TcpTransport, Transport};

fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// Deliveries by (subgroup, shard): (sender's shard rank, payload).
type Seen = Arc<Mutex<Vec<(String, usize, usize, Vec<u8>)>>>;

const MESSAGES_PER_SENDER: usize = 200;

/// Member `rank` of a 4-member group laid out as "kv" (2 shards of 2,
/// disjoint) and "log" (1 shard of 2, overlapping: members 0 and 1):
/// sends its messages in every shard it is in, and runs until it has
/// delivered every message of its shards.
fn member(name: &str, rank: usize, seen: Seen) -> Result<Vec<usize>, Error> {
    let mut log = SubgroupSpec::new("log", 1, 2);
    log.overlapping = true;
    let mut sharded = Group::builder(name)
        .members(4)
        .rank(rank)
        .join_timeout(Duration::from_secs(30))
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .subgroup(log)
        .join_sharded(|subgroup, shard| {
            let seen = seen.clone();
            let subgroup = subgroup.to_string();
            Callbacks::delivering(move |d| {
                seen.lock()
                    .unwrap()
                    .push((subgroup.clone(), shard, d.sender_rank, d.payload.to_vec()))
            })
        })?;
    let mine: Vec<(String, usize)> = sharded.shards().iter().map(|s| (s.subgroup.clone(), s.shard)).collect();
    for (subgroup, shard) in &mine {
        for i in 0..MESSAGES_PER_SENDER {
            let payload = format!("{subgroup}/{shard} from {rank} #{i}");
            loop {
                match sharded.send(subgroup, payload.as_bytes()) {
                    Ok(()) => break,
                    Err(Error::Send(spindle::SendError::WouldBlock)) => {
                        sharded.poll()?;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    let expected = mine.len() * 2 * MESSAGES_PER_SENDER;
    sharded.run_until(Duration::from_secs(60), |_| seen.lock().unwrap().len() >= expected)?;
    let shards = sharded.shards().iter().map(|s| s.shard).collect();
    sharded.finish_together(Duration::from_secs(30))?;
    Ok(shards)
}

#[test]
fn each_shard_delivers_its_own_messages_in_one_order_to_its_members_only() {
    let name = unique("sg-kv");
    let seen: Vec<Seen> = (0..4).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let threads: Vec<_> = (0..4)
        .map(|rank| {
            let (name, seen) = (name.clone(), seen[rank].clone());
            std::thread::spawn(move || member(&name, rank, seen))
        })
        .collect();
    for (rank, t) in threads.into_iter().enumerate() {
        t.join()
            .expect("member thread")
            .unwrap_or_else(|e| panic!("member {rank}: {e}"));
    }
    let of = |rank: usize, subgroup: &str| -> Vec<(usize, usize, Vec<u8>)> {
        seen[rank]
            .lock()
            .unwrap()
            .iter()
            .filter(|(g, ..)| g == subgroup)
            .map(|(_, s, r, p)| (*s, *r, p.clone()))
            .collect()
    };
    // kv: members 0, 1 are shard 0; members 2, 3 shard 1.
    for (a, b, shard) in [(0, 1, 0), (2, 3, 1)] {
        let (at_a, at_b) = (of(a, "kv"), of(b, "kv"));
        assert_eq!(
            at_a.len(),
            2 * MESSAGES_PER_SENDER,
            "member {a}: every message of its kv shard"
        );
        assert_eq!(
            at_a, at_b,
            "total order in kv shard {shard}: members {a} and {b} delivered one sequence"
        );
        for (s, _, payload) in &at_a {
            assert_eq!(*s, shard);
            let text = String::from_utf8(payload.clone()).unwrap();
            assert!(
                text.starts_with(&format!("kv/{shard} from ")),
                "only shard {shard}'s messages: {text}"
            );
        }
        // No duplication: every payload once.
        let mut payloads: Vec<_> = at_a.iter().map(|(_, _, p)| p.clone()).collect();
        payloads.sort();
        payloads.dedup();
        assert_eq!(payloads.len(), 2 * MESSAGES_PER_SENDER);
    }
    // log: members 0 and 1 only (overlapping the kv shard 0).
    assert_eq!(of(0, "log").len(), 2 * MESSAGES_PER_SENDER);
    assert_eq!(of(0, "log"), of(1, "log"), "total order in the log subgroup");
    assert!(
        of(2, "log").is_empty() && of(3, "log").is_empty(),
        "log is delivered to its members only"
    );
}

#[test]
fn bad_layouts_are_refused_with_the_reason() {
    let e = Group::builder(&unique("sg-none"))
        .members(2)
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("no subgroups");
    assert!(e.to_string().contains("no subgroups"), "{e}");

    let e = Group::builder(&unique("sg-small"))
        .members(3)
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("3 members cannot fill 2 shards of 2");
    assert!(e.to_string().contains("inadequate"), "{e}");
    assert!(e.to_string().contains("\"kv\" shard 1 needs 2 members"), "{e}");

    let e = Group::builder(&unique("sg-bad"))
        .members(2)
        .subgroup(SubgroupSpec::new("k v", 1, 2))
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("a bad name");
    assert!(e.to_string().contains("subgroup \"k v\""), "{e}");

    let e = Group::builder(&unique("sg-a-group-name-of-some-length"))
        .members(2)
        .subgroup(SubgroupSpec::new("a-subgroup-name-too", 1, 2))
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("a shard group name over 48 bytes");
    assert!(e.to_string().contains("are not valid group names"), "{e}");

    let listeners: Vec<_> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut twice = SubgroupSpec::new("b", 1, 2);
    twice.overlapping = true;
    let e = Group::builder(&unique("sg-tcp"))
        .transport(Transport::Tcp(TcpTransport::new(
            addresses,
            b"a-sixteen-byte-key!".to_vec(),
        )))
        .subgroup(SubgroupSpec::new("a", 1, 2))
        .subgroup(twice)
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("one member in two shards over tcp");
    assert!(e.to_string().contains("in 2 shards: on tcp or ofi"), "{e}");

    let two = TcpTransport::new(
        listeners.iter().map(|l| l.local_addr().unwrap()).collect(),
        b"a-sixteen-byte-key!".to_vec(),
    );
    let e = Group::builder(&unique("sg-count"))
        .transport(Transport::Tcp(two))
        .members(4)
        .rank(3)
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("4 members, 2 addresses");
    assert!(
        e.to_string()
            .contains("lists 2 member addresses but the group has 4 members"),
        "{e}"
    );
}

#[test]
fn a_message_goes_to_the_shard_of_its_key_and_a_member_outside_a_subgroup_is_told() {
    let name = unique("sg-key");
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || -> Result<(), Error> {
                let mut sharded = Group::builder(&name)
                    .members(2)
                    .rank(rank)
                    .subgroup(SubgroupSpec::new("one", 1, 1))
                    .join_sharded(|_, _| Callbacks::default())?;
                assert_eq!(sharded.shard_of_key("one", b"any key")?, 0);
                let e = sharded.shard_of_key("two", b"k").expect_err("no such subgroup");
                assert!(
                    e.to_string().contains("no subgroup \"two\": the subgroups are one"),
                    "{e}"
                );
                if rank == 1 {
                    // Member 1 is in no shard of "one" (it holds member 0).
                    assert!(sharded.shards().is_empty());
                    let e = sharded.send("one", b"x").expect_err("not in the subgroup");
                    assert!(
                        e.to_string().contains("member 1 is in no shard of subgroup \"one\""),
                        "{e}"
                    );
                } else {
                    assert_eq!(sharded.my_shard("one"), Some(0));
                    sharded.send("one", b"x")?;
                    sharded.run_until(Duration::from_secs(30), |s| {
                        s.shards()[0].group.inner().core().counters().values
                            [spindle::group_layer::counters::DELIVERED_MSGS]
                            == 1
                    })?;
                }
                sharded.finish_together(Duration::from_secs(30))?;
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("member thread").expect("member");
    }
}
