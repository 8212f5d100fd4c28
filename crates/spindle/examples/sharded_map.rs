//! A sharded replicated map: 4 members, the subgroup "kv" in 2 shards of 2.
//!
//! ```sh
//! cargo run --release -p spindle --example sharded_map
//! ```
//!
//! Each member (a thread here, on shared memory; processes or hosts work
//! the same way) joins its shard's group with `join_sharded`. A key lives
//! on shard `shard_of_key(key)` only: each member puts the keys of its own
//! shard by multicasting `key=value` in that shard, whose two members apply
//! them in the same order. Then each member reads a key of the *other*
//! shard with a point-to-point query to one of that shard's members
//! (`Sharded::query`, answered by its `StateMachine::query`). At the end
//! each member prints its shard, its key count and a digest of its map: the
//! two members of a shard hold the same map, the two shards hold disjoint
//! halves of the keys.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use spindle::{Group, Replicated, SubgroupSpec};

const MEMBERS: usize = 4;
const KEYS: usize = 2_000;

mod common;
use common::{digest, Map};

/// Members that have made their queries (each keeps answering until all
/// have: a member that finishes answers no more).
static QUERIED: AtomicUsize = AtomicUsize::new(0);

/// What a member ends with: (its rank, its shard, the shard's keys).
type Outcome = (usize, usize, BTreeMap<String, String>);

fn member(name: &str, rank: usize) -> Result<Outcome, spindle::Error> {
    let mut sharded = Group::builder(name)
        .members(MEMBERS)
        .rank(rank)
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .queries(true)
        .join_sharded(|_subgroup, _shard| Replicated::new(Map::default()))?;
    let shard = sharded.my_shard("kv").expect("every member is in a kv shard");
    let shard_rank = sharded.shards()[0]
        .members
        .iter()
        .position(|m| *m == rank)
        .expect("in its shard");
    // The keys of this shard; the shard's two members take turns.
    let mut mine: Vec<usize> = Vec::new();
    for i in (0..KEYS).filter(|i| i % 2 == shard_rank) {
        if sharded.shard_of_key("kv", format!("user{i}").as_bytes())? == shard {
            mine.push(i);
        }
    }
    for i in &mine {
        let put = format!("user{i}=member {rank}");
        while sharded.send("kv", put.as_bytes()).is_err() {
            sharded.poll()?;
        }
    }
    while sharded.send("kv", b"done").is_err() {
        sharded.poll()?;
    }
    sharded.run_until(Duration::from_secs(30), |s| {
        s.shards()[0].group.app().state.done.len() == 2
    })?;
    // Read a key of the other shard from one of its members (the one at
    // this member's shard rank). Its shard may still be putting: a key
    // not there yet is refused, so ask again.
    let other = 1 - shard;
    let key = (0..KEYS)
        .map(|i| format!("user{i}"))
        .find(|k| sharded.shard_of_key("kv", k.as_bytes()).ok() == Some(other))
        .expect("some key lives on the other shard");
    let asked = sharded.shard_members("kv", other)?[shard_rank];
    let value = loop {
        match sharded.query("kv", other, asked, key.as_bytes(), Duration::from_secs(30)) {
            Ok(value) => break String::from_utf8_lossy(&value).into_owned(),
            Err(spindle::Error::Query(spindle::QueryError::Refused { .. })) => {
                sharded.poll()?;
            }
            Err(e) => return Err(e),
        }
    };
    println!("member {rank}: read {key} = {value:?} from member {asked} of kv shard {other}");
    QUERIED.fetch_add(1, Ordering::SeqCst);
    sharded.run_until(Duration::from_secs(30), |_| QUERIED.load(Ordering::SeqCst) == MEMBERS)?;
    let map = sharded.finish_together(Duration::from_secs(30))?.remove(0).state;
    println!(
        "member {rank}: kv shard {shard} (rank {shard_rank} of 2), put {} keys, holds {} keys, digest {:016x}",
        mine.len(),
        map.entries.len(),
        digest(&map)
    );
    Ok((rank, shard, map.entries))
}

fn main() {
    let name = format!("sharded-map-{}", std::process::id());
    let threads: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || member(&name, rank))
        })
        .collect();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for (rank, t) in threads.into_iter().enumerate() {
        match t.join().expect("member thread") {
            Ok(o) => outcomes.push(o),
            Err(e) => {
                eprintln!("member {rank}: {e}");
                std::process::exit(1);
            }
        }
    }
    let of_shard =
        |s: usize| -> Vec<&BTreeMap<String, String>> { outcomes.iter().filter(|o| o.1 == s).map(|o| &o.2).collect() };
    let (zero, one) = (of_shard(0), of_shard(1));
    let same = zero.len() == 2 && one.len() == 2 && zero[0] == zero[1] && one[0] == one[1];
    let disjoint = zero[0].keys().all(|k| !one[0].contains_key(k));
    let total = zero[0].len() + one[0].len();
    if !(same && disjoint && total == KEYS) {
        eprintln!("FAILED: replicas equal {same}, shards disjoint {disjoint}, {total} of {KEYS} keys");
        std::process::exit(1);
    }
    println!(
        "OK: each shard's 2 members hold the same map ({} and {} keys); the shards are disjoint and hold all {KEYS} keys",
        zero[0].len(),
        one[0].len()
    );
}
