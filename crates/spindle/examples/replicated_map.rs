//! A replicated key-value map that survives a member being killed.
//!
//! ```sh
//! cargo run --release -p spindle --example replicated_map
//! ```
//!
//! The example starts 3 member processes (itself, with `member <rank>`) on
//! shared memory. Each puts keys into the map by multicasting `key=value`
//! commands; every member applies them in the same (delivery) order. After
//! a while the example kills member 2 with SIGKILL: members 0 and 1 install
//! a new view without it and go on. Then a new process joins as rank 2: it
//! gets a snapshot of the map from the group and applies what follows. At
//! the end every member prints a digest of its map; they are equal.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use spindle::{Group, GroupBuilder, Replicated};

mod common;
use common::{digest, Map};

fn builder(rank: usize) -> GroupBuilder<Replicated<Map>> {
    let name = format!("replicated-map-{}", std::env::var("MAP_RUN").expect("set by main"));
    Group::builder(&name)
        .members(3)
        .rank(rank)
        .suspect_timeout(Duration::from_millis(300))
        .state_machine(Map {
            print_views: true,
            ..Map::default()
        })
}

/// One member: put a key every millisecond until `stop` appears, then
/// send `done`, wait until every member's `done` is applied (so every
/// member applied the same commands), finish with everyone and print the
/// map's digest.
fn member(rank: usize, joining: bool, dir: &Path) -> Result<(), spindle::Error> {
    let mut group = if joining {
        builder(rank).join_running()?
    } else {
        builder(rank).join()?
    };
    let mut next = 0u64;
    let mut last_put = Instant::now();
    while !dir.join("stop").exists() {
        if last_put.elapsed() >= Duration::from_millis(1) {
            let command = format!("key{}={rank}:{next}", next % 100);
            if group.send(command.as_bytes()).is_ok() {
                next += 1;
            }
            last_put = Instant::now();
        }
        group.poll_or_idle()?;
    }
    while group.send(b"done").is_err() {
        group.poll_or_idle()?;
    }
    let members = group.view().members;
    group.run_until(Duration::from_secs(10), |map| {
        members.iter().all(|m| map.state.done.contains(m))
    })?;
    let view = group.view();
    let map = group.finish_together(Duration::from_secs(10))?;
    let digest = digest(&map.state);
    println!(
        "member {rank}: view {} members {:?}, {} keys, digest {digest:016x}",
        view.id,
        view.members,
        map.state.entries.len()
    );
    std::fs::write(dir.join(format!("digest-{rank}")), format!("{digest:016x}"))
        .map_err(|e| spindle::Error::Config(e.to_string()))
}

fn spawn(rank: usize, joining: bool, dir: &Path) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg("member").arg(rank.to_string()).arg(dir);
    if joining {
        cmd.arg("join");
    }
    cmd.spawn().expect("spawn a member")
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 4 && args[1] == "member" {
        let rank = args[2].parse().map_err(|e| format!("rank: {e}"))?;
        return member(rank, args.get(4).is_some_and(|a| a == "join"), &PathBuf::from(&args[3]))
            .map_err(|e| e.to_string());
    }
    let run = std::process::id().to_string();
    std::env::set_var("MAP_RUN", &run);
    let dir = std::env::temp_dir().join(format!("spindle-replicated-map-{run}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut members: Vec<Child> = (0..3).map(|r| spawn(r, false, &dir)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    println!("killing member 2 (SIGKILL)");
    members[2].kill().map_err(|e| e.to_string())?;
    members[2].wait().map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(1500));
    println!("a new process joins as member 2");
    members[2] = spawn(2, true, &dir);
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(dir.join("stop"), b"").map_err(|e| e.to_string())?;
    for (rank, child) in members.iter_mut().enumerate() {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("member {rank} failed: {status}"));
        }
    }
    let digests: Vec<String> = (0..3)
        .map(|r| std::fs::read_to_string(dir.join(format!("digest-{r}"))).unwrap_or_default())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    if digests.iter().all(|d| *d == digests[0]) {
        println!("all members hold the same map (digest {})", digests[0]);
        Ok(())
    } else {
        Err(format!("the maps differ: {digests:?}"))
    }
}
