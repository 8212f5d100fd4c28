//! Shards laid out again when a member fails: 5 members, the subgroup
//! "kv" in 2 shards of 2, and a spare.
//!
//! ```sh
//! cargo run --release -p spindle --example elastic_shards
//! ```
//!
//! Each member (a thread here, on shared memory; processes work the same
//! way) joins with `join_sharded_elastic`: members 0 and 1 hold kv shard
//! 0, members 2 and 3 kv shard 1, member 4 is in no shard. Member 0 puts
//! keys into shard 0; then member 1 fails (it drops its groups without
//! leaving). The top-level view loses member 1, every member lays the new
//! view out the same way (`StickyLayout`: member 4 takes member 1's
//! place), member 4 joins shard 0's group and gets its map by state
//! transfer before its first delivery, and the shard goes on: member 4
//! puts a key of its own, and both members of shard 0 end with the same
//! map.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use spindle::{Group, Replicated, Sharded, SubgroupSpec};

mod common;
use common::{digest, Map};

const MEMBERS: usize = 5;
const KEYS: usize = 200;
const FAILING: usize = 1;
const SPARE: usize = 4;

/// Survivors done with their part (each keeps polling, so the others
/// progress, until all are).
static READY: AtomicUsize = AtomicUsize::new(0);

/// When member 1 failed (for the time the spare took to take over).
static FAILED_AT: OnceLock<Instant> = OnceLock::new();

type Member = Sharded<Replicated<Map>>;

fn keys(m: &Member) -> usize {
    m.shard("kv").map_or(0, |s| s.group.app().state.entries.len())
}

fn member(name: &str, rank: usize) -> Result<Option<(usize, u64)>, spindle::Error> {
    let mut m = Group::builder(name)
        .members(MEMBERS)
        .rank(rank)
        .join_timeout(Duration::from_secs(30))
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .join_sharded_elastic(|_subgroup, _shard| Replicated::new(Map::default()))?;
    println!(
        "member {rank}: top-level view {:?}, kv shards {:?}, in shard {:?}",
        m.top_level_view().map(|v| v.members).unwrap_or_default(),
        m.layout().shards[0],
        m.my_shard("kv")
    );
    if rank == 0 {
        for i in 0..KEYS {
            let put = format!("user{i}=member 0");
            while m.send("kv", put.as_bytes()).is_err() {
                m.poll()?;
            }
        }
    }
    if rank == FAILING {
        m.run_until(Duration::from_secs(30), |m| keys(m) == KEYS)?;
        println!("member {rank}: holds {KEYS} keys, and fails now");
        FAILED_AT.get_or_init(Instant::now);
        drop(m);
        return Ok(None);
    }
    // Wait for the new layout (and, for the spare, its place in shard 0).
    m.run_until(Duration::from_secs(30), |m| {
        m.top_level_view().is_some_and(|v| !v.members.contains(&FAILING)) && m.joining_shards().is_empty()
    })?;
    println!(
        "member {rank}: top-level view {:?}, kv shards {:?}, in shard {:?}",
        m.top_level_view().map(|v| v.members).unwrap_or_default(),
        m.layout().shards[0],
        m.my_shard("kv")
    );
    if rank == SPARE {
        let took = FAILED_AT.get().map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        println!(
            "member {rank}: joined kv shard 0 holding {} keys (its state transfer), {took:.1} ms after member {FAILING} failed",
            keys(&m)
        );
        while m.send("kv", b"user-new=member 4").is_err() {
            m.poll()?;
        }
    }
    let in_shard_0 = m.my_shard("kv") == Some(0);
    m.run_until(Duration::from_secs(30), |m| !in_shard_0 || keys(m) == KEYS + 1)?;
    READY.fetch_add(1, Ordering::SeqCst);
    m.run_until(Duration::from_secs(30), |_| READY.load(Ordering::SeqCst) == MEMBERS - 1)?;
    let shard = m.my_shard("kv");
    let maps = m.finish_together(Duration::from_secs(30))?;
    let map = &maps[0].state;
    println!(
        "member {rank}: kv shard {shard:?} holds {} keys, digest {:016x}",
        map.entries.len(),
        digest(map)
    );
    Ok(in_shard_0.then(|| (map.entries.len(), digest(map))))
}

fn main() {
    let name = format!("elastic-{}", std::process::id());
    let threads: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || member(&name, rank))
        })
        .collect();
    let mut shard_0 = Vec::new();
    for (rank, t) in threads.into_iter().enumerate() {
        match t.join().expect("member thread") {
            Ok(Some(map)) => shard_0.push((rank, map)),
            Ok(None) => {}
            Err(e) => {
                eprintln!("member {rank}: {e}");
                std::process::exit(1);
            }
        }
    }
    let ranks: Vec<usize> = shard_0.iter().map(|(r, _)| *r).collect();
    if ranks != [0, SPARE] || shard_0[0].1 != shard_0[1].1 || shard_0[0].1 .0 != KEYS + 1 {
        eprintln!(
            "FAILED: kv shard 0 ended as {shard_0:?} (expected members 0 and {SPARE}, one map of {} keys)",
            KEYS + 1
        );
        std::process::exit(1);
    }
    println!(
        "OK: member {SPARE} took member {FAILING}'s place in kv shard 0 with its {KEYS} keys; both members hold the same {} keys",
        KEYS + 1
    );
}
