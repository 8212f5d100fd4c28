//! No allocation on the replication path: a counting global allocator
//! watches the master's thread while, once warm, it appends thousands of
//! records to 2 backups (`Master::append_record`, one-sided), on shared
//! memory and on loopback tcp (where each append waits for the backups'
//! echoes). The segments roll several times inside the window. Only the
//! master's thread is counted (the backups' threads and the fabric's
//! receive thread are not: they are not the caller's path), and only the
//! log append: applying the write to the object map (which stores the
//! value) is the caller's.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use spindle_replica::node::{Leader, Membership, Node, NodeConfig};
use spindle_replica::record::RecordKind;
use spindle_runtime::alloc_count::{self, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const MEMBERS: usize = 3;
const BACKUPS: usize = 2;
const SEGMENT_BYTES: usize = 64 * 1024;
const WARM_UP: u64 = 2_000;
const MEASURED: u64 = 5_000;

fn config(group: &str, dir: &Path) -> NodeConfig {
    common::node_config(group, MEMBERS, BACKUPS, SEGMENT_BYTES, dir)
}

/// Start every member on its own thread, take the leader, append
/// `WARM_UP` then, counted, `MEASURED` records of 64-byte values (keys
/// cycle over 100, so the log holds overwrites: nothing here cleans it),
/// stop cleanly. Returns the allocations counted and the first one's
/// backtrace.
fn allocations_while_appending<F: Membership>(
    open: Arc<dyn Fn(usize) -> Result<Node<F>, String> + Send + Sync>,
) -> (u64, Option<String>) {
    alloc_count::reset();
    let (tx, leaders) = mpsc::channel::<(Leader<F>, Node<F>)>();
    let stops: Vec<Arc<AtomicBool>> = (0..MEMBERS).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let threads: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let (open, tx, stop) = (open.clone(), tx.clone(), stops[rank].clone());
            std::thread::spawn(move || -> Result<(), String> {
                let node = open(rank)?;
                if let Some(leader) = node.run_until_master(&stop)? {
                    let _ = tx.send((leader, node));
                }
                Ok(())
            })
        })
        .collect();
    let (mut leader, node) = leaders.recv_timeout(Duration::from_secs(60)).expect("a member leads");
    let value = [b'v'; 64];
    let mut keys: Vec<Vec<u8>> = (0..100).map(|i| format!("key-{i:03}").into_bytes()).collect();
    let append = |leader: &mut Leader<F>, i: u64| {
        let key = &keys[(i % 100) as usize];
        let version = i + 1;
        leader
            .master
            .append_record(RecordKind::Put, key, &value, version)
            .expect("append");
    };
    for i in 0..WARM_UP {
        append(&mut leader, i);
    }
    let head_before = leader.master.head();
    alloc_count::count_this_thread(true);
    for i in WARM_UP..WARM_UP + MEASURED {
        append(&mut leader, i);
    }
    alloc_count::count_this_thread(false);
    let appended = leader.master.head() - head_before;
    assert!(
        appended >= 4 * SEGMENT_BYTES as u64,
        "the window spans several segments: {appended} bytes appended"
    );
    keys.clear();
    leader.stop().expect("clean stop");
    for stop in &stops {
        stop.store(true, Ordering::Release);
    }
    for t in threads {
        t.join().expect("member thread").expect("member ran cleanly");
    }
    drop((leader, node));
    let first = alloc_count::first_backtrace();
    (alloc_count::allocations(), first)
}

/// One test for both fabrics, one after the other (the counters are
/// process-wide).
#[test]
fn appending_records_allocates_nothing_once_warm() {
    let mut failures = Vec::new();
    let mut check = |case: &str, (allocations, first): (u64, Option<String>)| {
        if allocations != 0 {
            failures.push(format!(
                "{case}: {allocations} allocations on the master's thread while it appended {MEASURED} records; the first:\n{}",
                first.unwrap_or_default()
            ));
        }
    };
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs dir");
    let shm_group = format!("rnoalloc-{}-shm", std::process::id());
    let shm_dir = dir.path().join("shm");
    let shm = {
        let (group, dir) = (shm_group.clone(), shm_dir.clone());
        Arc::new(move |rank| Node::open(config(&group, &dir), rank))
    };
    check("shm", allocations_while_appending(shm));
    let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &shm_group));
    let (listeners, addresses) = common::loopback_listeners(MEMBERS);
    let listeners = Mutex::new(listeners);
    let tcp_group = format!("rnoalloc-{}-tcp", std::process::id());
    let tcp_dir = dir.path().join("tcp");
    let tcp = Arc::new(move |rank: usize| {
        let listener = listeners.lock().expect("listeners")[rank].take();
        Node::open_tcp_on(
            config(&tcp_group, &tcp_dir),
            rank,
            addresses.clone(),
            b"no allocation test".to_vec(),
            listener,
        )
    });
    check("tcp", allocations_while_appending(tcp));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
