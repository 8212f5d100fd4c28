//! Point-to-point queries between the members of a sharded group: a read
//! sent to one replica of a shard, answered from that replica's state,
//! on shared memory and on tcp; and every way a query can fail, each
//! with its reason.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle::{Callbacks, Error, Group, GroupBuilder, QueryError, SubgroupSpec, TcpTransport, Transport};

fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

const WAIT: Duration = Duration::from_secs(60);

/// A shard's replicated map: `key=value` messages set keys; a query is
/// a key, answered with its value.
fn map_app(map: Arc<Mutex<BTreeMap<String, String>>>) -> Callbacks {
    let reads = map.clone();
    Callbacks::delivering(move |d| {
        let text = String::from_utf8_lossy(d.payload).into_owned();
        if let Some((k, v)) = text.split_once('=') {
            map.lock().unwrap().insert(k.to_string(), v.to_string());
        }
    })
    .with_query(move |request, reply| {
        let key = String::from_utf8_lossy(request).into_owned();
        match reads.lock().unwrap().get(&key) {
            Some(v) => {
                reply.extend_from_slice(v.as_bytes());
                Ok(())
            }
            None => Err(format!("no key {key:?}")),
        }
    })
}

/// Counters the members of one test share: how many are ready to be
/// asked, how many finished asking.
#[derive(Default)]
struct Phases {
    ready: AtomicUsize,
    done: AtomicUsize,
}

/// Member `rank` of a 4-member group in "kv" (2 shards of 2): sets
/// `key-{rank}` in its shard, then reads every member's key from that
/// member (through the query channel, or locally for its own), and
/// checks the ways a query fails.
fn member(builder: GroupBuilder, rank: usize, phases: Arc<Phases>) -> Result<(), Error> {
    let map = Arc::new(Mutex::new(BTreeMap::new()));
    let mut sharded = builder
        .members(4)
        .rank(rank)
        .join_timeout(WAIT)
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .queries(true)
        .join_sharded(|_, _| map_app(map.clone()))?;
    let pair = format!("key-{rank}=value-{rank}");
    sharded.send("kv", pair.as_bytes())?;
    // Both keys of the shard are in this replica.
    sharded.run_until(WAIT, |_| map.lock().unwrap().len() == 2)?;
    phases.ready.fetch_add(1, Ordering::SeqCst);
    sharded.run_until(WAIT, |_| phases.ready.load(Ordering::SeqCst) == 4)?;
    for x in 0..4 {
        let shard = sharded
            .layout()
            .shards_of(x)
            .next()
            .expect("every member is in a kv shard")
            .1;
        let reply = sharded.query("kv", shard, x, format!("key-{x}").as_bytes(), WAIT)?;
        assert_eq!(
            reply,
            format!("value-{x}").as_bytes(),
            "member {rank} read member {x}'s key from it"
        );
    }
    // The other shard's keys are not in this shard's replicas.
    let mine = sharded.my_shard("kv").unwrap();
    let partner = *sharded.shard_members("kv", mine)?.iter().find(|m| **m != rank).unwrap();
    let other = (rank + 2) % 4;
    match sharded.query("kv", mine, partner, format!("key-{other}").as_bytes(), WAIT) {
        Err(Error::Query(QueryError::Refused { peer, reason })) => {
            assert_eq!(peer, partner);
            assert!(reason.contains("no key"), "{reason}");
        }
        other => panic!("a missing key is refused with the reason, not {other:?}"),
    }
    // Bad input, said before anything is sent.
    let other_shard = 1 - mine;
    match sharded.query("kv", other_shard, partner, b"key-0", WAIT) {
        Err(Error::Config(why)) => assert!(why.contains("is not in shard"), "{why}"),
        other => panic!("a member outside the shard is refused, not {other:?}"),
    }
    match sharded.query("kv", 7, partner, b"key-0", WAIT) {
        Err(Error::Config(why)) => assert!(why.contains("there is no shard 7"), "{why}"),
        other => panic!("a shard out of range is refused, not {other:?}"),
    }
    match sharded.query("nope", 0, partner, b"key-0", WAIT) {
        Err(Error::Config(why)) => assert!(why.contains("no subgroup"), "{why}"),
        other => panic!("an unknown subgroup is refused, not {other:?}"),
    }
    match sharded.query("kv", mine, partner, &vec![b'k'; 5000], WAIT) {
        Err(Error::Query(QueryError::TooLong { len: 5000, max })) => assert!(max < 5000),
        other => panic!("a request longer than a box is refused, not {other:?}"),
    }
    // The channel goes on after the failures.
    let again = sharded.query("kv", mine, partner, format!("key-{partner}").as_bytes(), WAIT)?;
    assert_eq!(again, format!("value-{partner}").as_bytes());
    // Keep answering until every member has asked everything.
    phases.done.fetch_add(1, Ordering::SeqCst);
    sharded.run_until(WAIT, |_| phases.done.load(Ordering::SeqCst) == 4)?;
    sharded.finish_together(WAIT)?;
    Ok(())
}

fn run_four(builders: Vec<GroupBuilder>) {
    let phases = Arc::new(Phases::default());
    let handles: Vec<_> = builders
        .into_iter()
        .enumerate()
        .map(|(rank, builder)| {
            let phases = phases.clone();
            std::thread::spawn(move || member(builder, rank, phases))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        h.join()
            .expect("member thread")
            .unwrap_or_else(|e| panic!("member {rank}: {e}"));
    }
}

fn free_addresses(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<_> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

#[test]
fn reads_reach_one_replica_of_any_shard_on_shared_memory() {
    let name = unique("q-shm");
    run_four((0..4).map(|_| Group::builder(&name)).collect());
}

#[test]
fn reads_reach_one_replica_of_any_shard_on_tcp() {
    let addresses = free_addresses(8);
    let (members, queries) = addresses.split_at(4);
    let name = unique("q-tcp");
    run_four(
        (0..4)
            .map(|_| {
                Group::builder(&name)
                    .transport(Transport::Tcp(TcpTransport::new(
                        members.to_vec(),
                        b"a-sixteen-byte-key!".to_vec(),
                    )))
                    .query_addresses(queries.to_vec())
            })
            .collect(),
    );
}

/// Three members: "kv" is 2 shards of 1 ({0}, {1}), member 2 is in no
/// shard and only asks. Member 1 answers one query and exits; the next
/// query to it fails and names it. Member 0's application answers no
/// queries: its refusal says so.
#[test]
fn a_query_to_a_member_that_is_gone_or_does_not_answer_fails_with_the_reason() {
    let name = unique("q-gone");
    let answered = Arc::new(AtomicUsize::new(0));
    let exited = Arc::new(AtomicUsize::new(0));
    let start = |rank: usize| {
        let name = name.clone();
        let (answered, exited) = (answered.clone(), exited.clone());
        std::thread::spawn(move || -> Result<(), Error> {
            let map = Arc::new(Mutex::new(BTreeMap::from([("k".to_string(), "v".to_string())])));
            let mut sharded = Group::builder(&name)
                .members(3)
                .rank(rank)
                .join_timeout(WAIT)
                .subgroup(SubgroupSpec::new("kv", 2, 1))
                .queries(true)
                .join_sharded(|_, shard| {
                    if shard == 0 {
                        Callbacks::default()
                    } else {
                        map_app(map.clone())
                    }
                })?;
            match rank {
                0 => sharded.run_until(WAIT, |_| exited.load(Ordering::SeqCst) == 2),
                1 => {
                    // Serve until member 2 has its answer, then exit
                    // without a goodbye (the process would be gone).
                    sharded.run_until(WAIT, |_| answered.load(Ordering::SeqCst) == 1)?;
                    exited.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
                _ => {
                    assert_eq!(sharded.my_shard("kv"), None);
                    assert_eq!(sharded.query("kv", 1, 1, b"k", WAIT)?, b"v");
                    match sharded.query("kv", 0, 0, b"k", WAIT) {
                        Err(Error::Query(QueryError::Refused { peer: 0, reason })) => {
                            assert!(reason.contains("answers no queries"), "{reason}")
                        }
                        other => panic!("member 0 answers no queries, not {other:?}"),
                    }
                    answered.store(1, Ordering::SeqCst);
                    while exited.load(Ordering::SeqCst) == 0 {
                        sharded.poll()?;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    match sharded.query("kv", 1, 1, b"k", WAIT) {
                        Err(Error::Query(QueryError::PeerGone { peer: 1 })) => {}
                        other => panic!("a query to a member that exited names it, not {other:?}"),
                    }
                    exited.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }
        })
    };
    let handles: Vec<_> = (0..3).map(start).collect();
    for (rank, h) in handles.into_iter().enumerate() {
        h.join()
            .expect("member thread")
            .unwrap_or_else(|e| panic!("member {rank}: {e}"));
    }
}

#[test]
fn queries_off_or_without_tcp_addresses_are_refused_with_the_reason() {
    // Off: a query to another member says how to turn them on.
    let name = unique("q-off2");
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || -> Result<(), Error> {
                let mut sharded = Group::builder(&name)
                    .members(2)
                    .rank(rank)
                    .join_timeout(WAIT)
                    .subgroup(SubgroupSpec::new("kv", 2, 1))
                    .join_sharded(|_, _| Callbacks::default())?;
                if rank == 0 {
                    match sharded.query("kv", 1, 1, b"k", WAIT) {
                        Err(Error::Config(why)) => assert!(why.contains("queries are off"), "{why}"),
                        other => panic!("queries off are refused with how to turn them on, not {other:?}"),
                    }
                }
                sharded.finish_together(WAIT)?;
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("member thread").expect("member");
    }
    // A query to itself is answered locally, by its own application.
    let mut lone = Group::builder(&unique("q-off"))
        .members(1)
        .subgroup(SubgroupSpec::new("kv", 1, 1))
        .join_sharded(|_, _| Callbacks::default())
        .unwrap();
    match lone.query("kv", 0, 0, b"k", WAIT) {
        Err(Error::Query(QueryError::Refused { reason, .. })) => assert!(reason.contains("answers no queries")),
        other => panic!("its own application answers locally: {other:?}"),
    }
    // On tcp, the query channel needs addresses of its own.
    let addresses = free_addresses(1);
    let refused = |name: &str, query_addresses: Option<Vec<SocketAddr>>| -> String {
        let mut builder = Group::builder(&unique(name))
            .members(1)
            .transport(Transport::Tcp(TcpTransport::new(
                addresses.clone(),
                b"a-sixteen-byte-key!".to_vec(),
            )))
            .subgroup(SubgroupSpec::new("kv", 1, 1))
            .queries(true);
        if let Some(a) = query_addresses {
            builder = builder.query_addresses(a);
        }
        builder
            .join_sharded(|_, _| Callbacks::default())
            .err()
            .expect("refused")
            .to_string()
    };
    let e = refused("q-tcp-bad", None);
    assert!(e.contains("query_addresses"), "{e}");
    let e = refused("q-tcp-same", Some(addresses.clone()));
    assert!(e.contains("addresses of its own"), "{e}");
    let e = Group::builder(&unique("q-addr-off"))
        .members(1)
        .subgroup(SubgroupSpec::new("kv", 1, 1))
        .query_addresses(free_addresses(1))
        .join_sharded(|_, _| Callbacks::default())
        .err()
        .expect("addresses without queries");
    assert!(e.to_string().contains("queries are off"), "{e}");
}
