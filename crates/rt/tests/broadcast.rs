//! A broadcast channel (one sender, two receivers) driven through the
//! `RtNode` API directly, one member per thread with its own `ShmFabric`:
//! declare → register computation tasks → collective commit → run →
//! uncommit → commit again. Timing is not asserted: every message is
//! either received or counted as missed.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::{wait_all_joined, PeerSet};
use spindle_rt::clock::InjectedClock;
use spindle_rt::clock_service::{ClockService, ClockServiceConfig};
use spindle_rt::node::{layout_for, ChannelKind, ChannelSpec, CommitConfig, RtNode};
use spindle_rt::{IteratorPolicy, TaskKind, TaskSpec, TimeQos};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const PERIOD_NS: u64 = 4 * MS;
const PERIODS: u64 = 20;

fn channel() -> ChannelSpec {
    ChannelSpec {
        name: "broadcast".into(),
        kind: ChannelKind::TimeDriven,
        sender: 0,
        receivers: PeerSet(0b110),
        message_bytes_max: 32,
        messages_per_period_max: 2,
        buffer_count: 4,
        policy: IteratorPolicy::Sorted,
        send_qos: TimeQos::new(500 * US, PERIOD_NS, 500 * US),
        receive_qos: TimeQos::new(1_500 * US, PERIOD_NS, 500 * US),
        send_compute_ns: 20 * US,
        receive_compute_ns: 20 * US,
    }
}

/// What each member saw: (messages received in order, misses counted).
fn member(group: String, rank: usize) -> (Vec<u64>, u64, u64) {
    let channels = vec![channel()];
    let layout = Arc::new(layout_for(3, &channels));
    let options = ShmOptions::new(&group, 3, layout.row.row_len_bytes(), layout.row.tag());
    let fabric = Arc::new(ShmFabric::open(&options, rank).unwrap());
    wait_all_joined(&*fabric, &group, Duration::from_secs(20)).unwrap();
    let injected = InjectedClock::new(spindle_runtime::monotonic_ns(), rank as i64 * 1_000_000, 0);
    let service = ClockService::start(fabric.clone(), layout.clone(), injected, ClockServiceConfig::default());
    service.wait_synced(200 * US, Duration::from_secs(20)).unwrap();
    let mut node = RtNode::new(fabric.clone(), layout, service.clock().clone(), channels).unwrap();
    let ch = node.channel("broadcast").unwrap();
    let received = Rc::new(RefCell::new(Vec::new()));
    let config = CommitConfig {
        clock_bound_budget_ns: 200 * US,
        release_jitter_ns: 0,
        lead_ns: 30 * MS,
        periods: PERIODS,
        timeout: Duration::from_secs(20),
        force: false,
    };
    let mut missed = 0;
    let mut epochs = Vec::new();
    // Two commit cycles: uncommit releases everything, commit works again.
    for _cycle in 0..2 {
        let log = received.clone();
        let (offset, name) = if rank == 0 {
            (0, "producer")
        } else {
            (2_000 * US, "consumer")
        };
        let task = TaskSpec::new(
            name,
            TaskKind::Computation,
            TimeQos::new(offset, PERIOD_NS, 500 * US),
            20 * US,
        );
        let mut buf = [0u8; 32];
        node.register_computation(
            task,
            Box::new(move |ctx| {
                let k = ctx.job.period;
                if rank == 0 {
                    // Two messages per period; the sorted iterator sends the
                    // smaller key first whatever the insertion order.
                    let _ = ctx.insert(ch, &(2 * k + 1).to_le_bytes(), 2 * k + 1);
                    let _ = ctx.insert(ch, &(2 * k).to_le_bytes(), 2 * k);
                } else {
                    while let Some((n, _)) = ctx.take_into(ch, &mut buf) {
                        log.borrow_mut().push(u64::from_le_bytes(buf[..n].try_into().unwrap()));
                    }
                }
            }),
        )
        .unwrap();
        let committed = node.commit(&config).unwrap();
        assert!(committed.verdicts.iter().all(|v| v.is_none()));
        epochs.push(committed.epoch_start_ns);
        let stats = node.run(50 * US, &mut |_| {}).unwrap();
        missed += stats.counters.messages_missing + stats.counters.messages_torn + stats.counters.missed_early;
        assert_eq!(
            stats.counters.released,
            stats.counters.completed + stats.counters.missed_early
        );
        node.uncommit();
        assert!(!node.is_committed());
    }
    assert!(
        epochs[1] > epochs[0] + PERIODS * PERIOD_NS,
        "the second epoch starts after the first ran"
    );
    drop(node);
    drop(service);
    let got = received.borrow().clone();
    (got, missed, epochs[0])
}

#[test]
fn broadcast_reaches_every_receiver_in_sorted_order_across_two_commits() {
    let group = format!("rt-bcast-{}", std::process::id());
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let group = group.clone();
            std::thread::spawn(move || member(group, rank))
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.iter().all(|r| r.2 == results[0].2), "one agreed epoch_start");
    let missed_anywhere: u64 = results.iter().map(|r| r.1).sum();
    for (rank, (got, _, _)) in results.iter().enumerate().skip(1) {
        // Within a period the smaller key comes first (sorted iterator).
        for pair in got.chunks(2).filter(|c| c.len() == 2 && c[0] / 2 == c[1] / 2) {
            assert!(pair[0] < pair[1], "rank {rank}: {pair:?} not sorted");
        }
        // Every period's pair arrived, or some member counted a miss
        // (a producer's dropped job is counted at the producer).
        assert!(
            got.len() as u64 == 2 * 2 * PERIODS || missed_anywhere > 0,
            "rank {rank}: {} messages, no miss counted",
            got.len()
        );
    }
    assert!(!std::path::Path::new("/dev/shm")
        .join(format!("spindle-{group}"))
        .exists());
}
