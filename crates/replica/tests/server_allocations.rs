//! No allocation while the KV service answers reads: a counting global
//! allocator (`spindle_runtime::alloc_count`) counts *every* thread of
//! this process (the server's event loop, the master's and the backup's
//! failover drivers and threads) while one client, once warm, pipelines
//! GETs of an existing key and reads the replies into a fixed buffer.
//! (A SET stores its value, which allocates by design.)

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_replica::node::Node;
use spindle_replica::server::{serve, ServeOptions};
use spindle_runtime::alloc_count::{self, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const GETS_PER_BATCH: usize = 16;
const WARM_UP_BATCHES: usize = 2_000;
const MEASURED_BATCHES: usize = 5_000;
/// Windows measured at most (see the test).
const WINDOWS_MAX: usize = 3;

/// Send a batch, read exactly its replies.
fn round_trip(stream: &mut TcpStream, batch: &[u8], reply: &mut [u8]) {
    stream.write_all(batch).expect("send a batch");
    stream.read_exact(reply).expect("read its replies");
}

#[test]
fn answering_pipelined_gets_allocates_nothing_once_warm() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs dir");
    let group = format!("rsrvalloc-{}", std::process::id());
    let config = || common::node_config(&group, 2, 1, 64 * 1024, dir.path());
    let backup_stop = Arc::new(AtomicBool::new(false));
    let backup = {
        let (config, stop) = (config(), backup_stop.clone());
        std::thread::spawn(move || -> Result<bool, String> {
            let node = Node::open(config, 1)?;
            Ok(node.run_until_master(&stop)?.is_some())
        })
    };
    let node = Node::open(config(), 0).expect("open rank 0");
    let leader = node
        .run_until_master(&AtomicBool::new(false))
        .expect("run")
        .expect("rank 0 leads");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let stop = AtomicBool::new(false);
    let windows = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let options = ServeOptions {
                clients_max: 4,
                idle_timeout: Duration::ZERO,
                poll_spin_after_work: spindle_replica::server::POLL_SPIN_AFTER_WORK_DEFAULT,
                value_bytes_max: 2048,
                info_extra: String::new(),
                stop: Some(&stop),
            };
            serve(&listener, leader, options)
        });
        let mut client = TcpStream::connect(addr).expect("connect");
        client.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let value = "v".repeat(100);
        let set = format!("*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n${}\r\n{value}\r\n", value.len());
        let mut ok = [0u8; 5];
        round_trip(&mut client, set.as_bytes(), &mut ok);
        assert_eq!(&ok, b"+OK\r\n");
        let get = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n".repeat(GETS_PER_BATCH);
        let one_reply = format!("$100\r\n{value}\r\n");
        let mut replies = vec![0u8; one_reply.len() * GETS_PER_BATCH];
        for _ in 0..WARM_UP_BATCHES {
            round_trip(&mut client, &get, &mut replies);
        }
        assert_eq!(&replies[..one_reply.len()], one_reply.as_bytes());
        // Up to WINDOWS_MAX windows, until one counts nothing: the backup's
        // flusher writes the open segment to disk once, up to 50 ms after
        // the SET (`OPEN_SEGMENT_FLUSH_INTERVAL`; naming its file
        // allocates), and that may fall into the first window. What
        // happens per request, per tick or per round would be in every
        // window.
        let mut windows = Vec::new();
        for _ in 0..WINDOWS_MAX {
            alloc_count::reset();
            alloc_count::count_every_thread(true);
            for _ in 0..MEASURED_BATCHES {
                round_trip(&mut client, &get, &mut replies);
            }
            alloc_count::count_every_thread(false);
            windows.push((alloc_count::allocations(), alloc_count::first_backtrace()));
            if windows.last().is_some_and(|w| w.0 == 0) {
                break;
            }
        }
        assert_eq!(replies, one_reply.repeat(GETS_PER_BATCH).as_bytes(), "every reply");
        // Release: pairs with the Acquire load in the server's stop check.
        stop.store(true, Ordering::Release);
        drop(client);
        let leader = server.join().expect("server thread").expect("a clean stop");
        drop(leader);
        windows
    });
    backup_stop.store(true, Ordering::Release);
    let _ = backup.join();
    drop(node);
    let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &group));
    let counts: Vec<u64> = windows.iter().map(|w| w.0).collect();
    assert!(
        counts.contains(&0),
        "allocations in the process in each window of {} GETs: {counts:?}; the first of the last window:\n{}",
        GETS_PER_BATCH * MEASURED_BATCHES,
        windows.last().and_then(|w| w.1.clone()).unwrap_or_default()
    );
}
