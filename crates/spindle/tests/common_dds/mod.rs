//! Helpers shared by the DDS integration tests: unique domain ids,
//! participants joined on threads, a keyed sample type, bounded waits.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spindle::dds::{DataReader, DomainParticipant, Keyed, ParticipantBuilder, Sample};

/// The longest any wait in these tests may take (a liveness bound only).
pub const WAIT: Duration = Duration::from_secs(10);

/// A sample of one sensor (the key) with the writer's running count.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Reading {
    pub sensor: u32,
    pub n: u64,
    pub payload: Vec<u8>,
}

impl Keyed for Reading {
    type Key = u32;
    fn key(&self) -> u32 {
        self.sensor
    }
}

impl Reading {
    pub fn new(sensor: u32, n: u64) -> Reading {
        Reading {
            sensor,
            n,
            payload: Vec::new(),
        }
    }
}

/// A domain id no other test (of this process or another) uses.
pub fn domain_id(case: u32) -> u32 {
    (std::process::id() % 100_000) * 100 + case
}

/// `n` participants of `domain` joined together on threads; `configure`
/// adjusts each rank's builder.
pub fn join_all(
    domain: u32,
    n: usize,
    configure: impl Fn(ParticipantBuilder) -> ParticipantBuilder + Sync,
) -> Vec<DomainParticipant> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let configure = &configure;
                s.spawn(move || {
                    configure(DomainParticipant::builder(domain).participants(n).rank(rank))
                        .join()
                        .unwrap_or_else(|e| panic!("rank {rank} joins domain {domain}: {e}"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("join thread")).collect()
    })
}

/// Poll `cond` until true (panics with `what` after [`WAIT`]).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Take samples until `count` valid ones arrived (bounded by [`WAIT`]).
pub fn take_valid(reader: &DataReader<Reading>, count: usize) -> Vec<Sample<Reading>> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < count {
        assert!(
            start.elapsed() < WAIT,
            "timed out: {} of {count} samples arrived",
            got.len()
        );
        reader.wait_for_data(Duration::from_millis(50));
        got.extend(
            reader
                .take(usize::MAX)
                .expect("take")
                .into_iter()
                .filter(|s| s.info.valid_data),
        );
    }
    got
}

/// Three free loopback addresses (bound, then released for the test).
pub fn free_addrs(n: usize) -> Vec<std::net::SocketAddr> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners.iter().map(|l| l.local_addr().expect("address")).collect()
}
