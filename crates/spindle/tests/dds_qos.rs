//! Every DDS QoS policy, enforced: each test fails if its policy were not
//! (participants are threads of this process, one group per test).

mod common_dds;

use std::collections::HashMap;
use std::time::Duration;

use common_dds::*;
use serde::{Deserialize, Serialize};
use spindle::dds::{
    DdsError, DomainParticipant, InstanceState, Keyed, QosPolicyId, ReaderQos, ResourceLimits, WriterQos,
};

const BLOCK: Duration = Duration::from_secs(5);

fn reliable_reader() -> ReaderQos {
    ReaderQos::default().reliable(BLOCK).keep_all()
}

fn reliable_writer() -> WriterQos {
    WriterQos::default().reliable(BLOCK).keep_all()
}

#[test]
fn reliable_keep_all_delivers_every_sample_in_order_to_a_slow_reader() {
    let d = join_all(domain_id(1), 2, |b| b.window_slots(16).ack_every(4));
    let topic = d[0].create_topic::<Reading>("rel").unwrap();
    let writer = d[0].create_writer(&topic, reliable_writer()).unwrap();
    let limits = ResourceLimits {
        max_samples: 48,
        max_instances: 4,
        max_samples_per_instance: 48,
    };
    let reader = d[1]
        .create_topic::<Reading>("rel")
        .and_then(|t| d[1].create_reader(&t, reliable_reader().resource_limits(limits)))
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    const N: u64 = 400;
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            for n in 0..N {
                writer
                    .write(&Reading::new(1, n))
                    .expect("a reliable write within its blocking time");
            }
        });
        let mut got = Vec::new();
        while got.len() < N as usize {
            reader.wait_for_data(Duration::from_millis(50));
            // A slow reader: a few samples at a time.
            got.extend(reader.take(5).unwrap().into_iter().filter(|s| s.info.valid_data));
            std::thread::sleep(Duration::from_micros(200));
        }
        got
    });
    let values: Vec<u64> = got.iter().map(|s| s.data.as_ref().unwrap().n).collect();
    assert_eq!(values, (0..N).collect::<Vec<_>>(), "every sample, in order");
    assert_eq!(reader.status().cache.samples_lost, 0);
    assert_eq!(reader.status().cache.samples_rejected, 0);
}

#[test]
fn best_effort_under_a_full_window_drops_and_counts() {
    let d = join_all(domain_id(2), 2, |b| b.window_slots(16).ack_every(4));
    // A reliable keep-all reader that never reads stops rank 1 receiving:
    // rank 0's send window fills.
    let block_topic = d[0].create_topic::<Reading>("block").unwrap();
    let blocker = d[0]
        .create_writer(&block_topic, WriterQos::default().reliable(Duration::from_millis(100)))
        .unwrap();
    let limits = ResourceLimits {
        max_samples: 40,
        max_instances: 4,
        max_samples_per_instance: 40,
    };
    let stuck = d[1]
        .create_reader(
            &d[1].create_topic::<Reading>("block").unwrap(),
            reliable_reader().resource_limits(limits),
        )
        .unwrap();
    blocker.wait_for_readers(1, WAIT).unwrap();
    let be_topic = d[0].create_topic::<Reading>("be").unwrap();
    let be = d[0]
        .create_writer(&be_topic, WriterQos::default().best_effort())
        .unwrap();
    let _be_reader = d[1]
        .create_reader(&d[1].create_topic::<Reading>("be").unwrap(), ReaderQos::default())
        .unwrap();
    be.wait_for_readers(1, WAIT).unwrap();
    let mut n = 0;
    while matches!(blocker.write(&Reading::new(1, n)), Ok(())) {
        n += 1;
        assert!(n < 10_000, "the stuck reader never filled the window");
    }
    for n in 0..100 {
        be.write(&Reading::new(2, n))
            .expect("best effort never blocks nor fails");
    }
    let st = be.status();
    assert!(
        st.samples_dropped > 0,
        "a full window drops best-effort samples: {st:?}"
    );
    assert_eq!(st.samples_written + st.samples_dropped, 100, "{st:?}");
    // The stuck reader resumes: the window drains (so that the writers'
    // retirements find room when they drop).
    wait_until("the window drains", || {
        let _ = stuck.take(usize::MAX);
        blocker.window_occupancy() == 0
    });
}

#[test]
fn keep_last_keeps_only_the_last_n_per_instance_and_keep_all_keeps_all() {
    let d = join_all(domain_id(3), 2, |b| b);
    let t0 = d[0].create_topic::<Reading>("hist").unwrap();
    let t1 = d[1].create_topic::<Reading>("hist").unwrap();
    let writer = d[0].create_writer(&t0, reliable_writer()).unwrap();
    let last3 = d[1]
        .create_reader(&t1, ReaderQos::default().reliable(BLOCK).keep_last(3))
        .unwrap();
    let all = d[1].create_reader(&t1, reliable_reader()).unwrap();
    writer.wait_for_readers(2, WAIT).unwrap();
    for n in 0..10 {
        for sensor in 0..3 {
            writer.write(&Reading::new(sensor, n)).unwrap();
        }
    }
    writer.wait_for_acknowledgments(WAIT).unwrap();
    wait_until("30 samples in keep-all", || all.len() == 30);
    wait_until("keep-last settles", || last3.status().cache.replaced == 21);
    let mut per: HashMap<u32, Vec<u64>> = HashMap::new();
    for s in last3.take(usize::MAX).unwrap() {
        let r = s.data.unwrap();
        per.entry(r.sensor).or_default().push(r.n);
    }
    for sensor in 0..3 {
        assert_eq!(per[&sensor], vec![7, 8, 9], "sensor {sensor}: the last 3");
    }
    assert_eq!(all.take(usize::MAX).unwrap().len(), 30);
}

/// Sensors 0 and 1 got values 0..5 before the reader existed, then 5:
/// the reader must see exactly 3 and 4 of each (keep-last 2), then the
/// live ones, in order.
fn check_late_reader(reader: &spindle::dds::DataReader<Reading>, live: u64) {
    let got = take_valid(reader, 6);
    let pairs: Vec<(u32, u64)> = got
        .iter()
        .map(|s| (s.data.as_ref().unwrap().sensor, s.data.as_ref().unwrap().n))
        .collect();
    assert_eq!(pairs.len(), 6, "{pairs:?}");
    for sensor in 0..2 {
        let history: Vec<u64> = pairs[..4].iter().filter(|p| p.0 == sensor).map(|p| p.1).collect();
        assert_eq!(history, vec![3, 4], "sensor {sensor}: the last 2, {pairs:?}");
    }
    assert_eq!(
        pairs[4..],
        [(0, live), (1, live)],
        "then the live samples, in order: {pairs:?}"
    );
}

#[test]
fn transient_local_late_readers_get_the_last_n_per_instance_then_live_samples() {
    let domain = domain_id(4);
    let mut d = join_all(domain, 2, |b| b.participants(3).initial_members(vec![0, 1]));
    // join_all set participants(2) first; the closure overrode it to 3.
    let t0 = d[0].create_topic::<Reading>("tl").unwrap();
    let qos_w = WriterQos::default().reliable(BLOCK).keep_last(2).transient_local();
    let qos_r = ReaderQos::default().reliable(BLOCK).keep_all().transient_local();
    let writer = d[0].create_writer(&t0, qos_w).unwrap();
    // A volatile reader elsewhere, present from the start, acknowledges.
    let early = d[1]
        .create_reader(&d[1].create_topic::<Reading>("tl").unwrap(), reliable_reader())
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    for n in 0..5 {
        for sensor in 0..2 {
            writer.write(&Reading::new(sensor, n)).unwrap();
        }
    }
    writer.wait_for_acknowledgments(WAIT).unwrap();
    assert_eq!(take_valid(&early, 10).len(), 10);
    // Late in the writer's own participant and in the other one.
    let same = d[0].create_reader(&t0, qos_r.clone()).unwrap();
    let other = d[1]
        .create_reader(&d[1].create_topic::<Reading>("tl").unwrap(), qos_r.clone())
        .unwrap();
    // A participant that joins the running domain later.
    let late = DomainParticipant::builder(domain)
        .participants(3)
        .rank(2)
        .initial_members(vec![0, 1])
        .join()
        .unwrap();
    let late_reader = late
        .create_reader(&late.create_topic::<Reading>("tl").unwrap(), qos_r)
        .unwrap();
    writer.wait_for_readers(4, WAIT).unwrap();
    for sensor in 0..2 {
        writer.write(&Reading::new(sensor, 5)).unwrap();
    }
    check_late_reader(&same, 5);
    check_late_reader(&other, 5);
    check_late_reader(&late_reader, 5);
    d.push(late);
}

#[test]
fn deadline_missed_count_grows_once_the_writer_stops() {
    let d = join_all(domain_id(5), 2, |b| b);
    let writer = d[0]
        .create_writer(
            &d[0].create_topic::<Reading>("dl").unwrap(),
            reliable_writer().deadline(Duration::from_millis(20)),
        )
        .unwrap();
    let reader = d[1]
        .create_reader(
            &d[1].create_topic::<Reading>("dl").unwrap(),
            reliable_reader().deadline(Duration::from_millis(40)),
        )
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    writer.write(&Reading::new(1, 0)).unwrap();
    take_valid(&reader, 1);
    let before = reader.status().cache.deadline_missed_total;
    wait_until("missed deadlines", || {
        reader.status().cache.deadline_missed_total >= before + 3
    });
    assert_eq!(
        reader.status().cache.last_instance_missed,
        spindle::dds::InstanceHandle(reader_instance(1))
    );
}

fn reader_instance(sensor: u32) -> u64 {
    use spindle::dds::TopicType;
    Reading::new(sensor, 0).instance().0
}

#[test]
fn liveliness_is_lost_when_the_writers_participant_closes() {
    let mut d = join_all(domain_id(6), 2, |b| b);
    let writer = d[1]
        .create_writer(
            &d[1].create_topic::<Reading>("live").unwrap(),
            reliable_writer().liveliness_lease(Duration::from_secs(1)),
        )
        .unwrap();
    let reader = d[0]
        .create_reader(
            &d[0].create_topic::<Reading>("live").unwrap(),
            reliable_reader().liveliness_lease(Duration::from_secs(2)),
        )
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    writer.write(&Reading::new(7, 0)).unwrap();
    let first = take_valid(&reader, 1);
    assert_eq!(first[0].info.instance_state, InstanceState::Alive);
    let wid = writer.id();
    std::mem::forget(writer); // its participant goes; no clean retire
    d.pop().unwrap().close().ok();
    wait_until("liveliness lost", || reader.status().liveliness_lost.contains(&wid));
    let notice = reader.take(usize::MAX).unwrap();
    assert!(
        notice
            .iter()
            .any(|s| s.info.instance_state == InstanceState::NotAliveNoWriters),
        "the instance has no writers: {:?}",
        notice.iter().map(|s| s.info).collect::<Vec<_>>()
    );
    assert_eq!(reader.status().matched_writers, 0);
}

#[test]
fn resource_limits_reject_beyond_max_instances_and_max_samples_per_instance() {
    let d = join_all(domain_id(7), 2, |b| b);
    let writer = d[0]
        .create_writer(&d[0].create_topic::<Reading>("rl").unwrap(), reliable_writer())
        .unwrap();
    let limits = ResourceLimits {
        max_samples: 100,
        max_instances: 2,
        max_samples_per_instance: 4,
    };
    let reader = d[1]
        .create_reader(
            &d[1].create_topic::<Reading>("rl").unwrap(),
            ReaderQos::default().keep_all().resource_limits(limits),
        )
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    for n in 0..6 {
        for sensor in 0..3 {
            writer.write(&Reading::new(sensor, n)).unwrap();
        }
    }
    writer.wait_for_acknowledgments(WAIT).unwrap();
    wait_until("18 samples accepted or rejected", || {
        let st = reader.status().cache;
        st.samples as u64 + st.samples_rejected == 18
    });
    let st = reader.status().cache;
    assert_eq!(st.instances, 2, "{st:?}");
    assert_eq!(st.samples, 8, "{st:?}");
    assert_eq!(st.samples_rejected, 10, "{st:?}");
    let mut per: HashMap<u32, Vec<u64>> = HashMap::new();
    for s in reader.take(usize::MAX).unwrap() {
        let r = s.data.unwrap();
        per.entry(r.sensor).or_default().push(r.n);
    }
    assert_eq!(per.len(), 2);
    assert!(per.values().all(|v| *v == vec![0, 1, 2, 3]), "{per:?}");
}

#[test]
fn lifespan_expired_samples_are_not_returned() {
    let d = join_all(domain_id(8), 2, |b| b);
    let writer = d[0]
        .create_writer(
            &d[0].create_topic::<Reading>("ls").unwrap(),
            reliable_writer().lifespan(Duration::from_millis(300)),
        )
        .unwrap();
    let reader = d[1]
        .create_reader(&d[1].create_topic::<Reading>("ls").unwrap(), reliable_reader())
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    // Expired on arrival (written 10 s ago).
    writer.write_at(&Reading::new(1, 0), now_ns - 10_000_000_000).unwrap();
    writer.wait_for_acknowledgments(WAIT).unwrap();
    wait_until("expired on arrival", || reader.status().cache.expired >= 1);
    assert!(reader.take(usize::MAX).unwrap().is_empty());
    // Expires while held.
    writer.write(&Reading::new(1, 1)).unwrap();
    writer.wait_for_acknowledgments(WAIT).unwrap();
    wait_until("expired while held", || reader.status().cache.expired >= 2);
    assert!(
        reader.take(usize::MAX).unwrap().is_empty(),
        "an expired sample is never returned"
    );
    // A fresh one is (its lifespan counts from now).
    writer
        .write_at(&Reading::new(1, 2), now_ns + 3_600_000_000_000)
        .unwrap();
    assert_eq!(take_valid(&reader, 1)[0].data.as_ref().unwrap().n, 2);
}

#[test]
fn exclusive_ownership_takes_the_strongest_and_fails_over_when_it_closes() {
    let mut d = join_all(domain_id(9), 3, |b| b);
    let reader = d[0]
        .create_reader(
            &d[0].create_topic::<Reading>("own").unwrap(),
            reliable_reader().exclusive(),
        )
        .unwrap();
    let weak = d[2]
        .create_writer(
            &d[2].create_topic::<Reading>("own").unwrap(),
            reliable_writer().exclusive(5),
        )
        .unwrap();
    let strong = d[1]
        .create_writer(
            &d[1].create_topic::<Reading>("own").unwrap(),
            reliable_writer().exclusive(10),
        )
        .unwrap();
    reader.wait_for_writers(2, WAIT).unwrap();
    weak.wait_for_readers(1, WAIT).unwrap();
    strong.wait_for_readers(1, WAIT).unwrap();
    strong.write(&Reading::new(1, 1000)).unwrap();
    let first = take_valid(&reader, 1);
    assert_eq!(first[0].info.writer, strong.id());
    for n in 0..20 {
        strong.write(&Reading::new(1, 1001 + n)).unwrap();
        weak.write(&Reading::new(1, n)).unwrap();
    }
    strong.wait_for_acknowledgments(WAIT).unwrap();
    weak.wait_for_acknowledgments(WAIT).unwrap();
    let got = take_valid(&reader, 20);
    assert!(
        got.iter().all(|s| s.info.writer == strong.id()),
        "only the owner's samples"
    );
    wait_until("weak samples refused", || reader.status().cache.not_owner == 20);
    let strong_id = strong.id();
    std::mem::forget(strong);
    d.remove(1).close().ok();
    wait_until("the strong writer is gone", || reader.status().matched_writers == 1);
    for n in 100..105 {
        weak.write(&Reading::new(1, n)).unwrap();
    }
    let after = take_valid(&reader, 5);
    assert!(after
        .iter()
        .all(|s| s.info.writer == weak.id() && s.info.writer != strong_id));
    let values: Vec<u64> = after.iter().map(|s| s.data.as_ref().unwrap().n).collect();
    assert_eq!(values, vec![100, 101, 102, 103, 104], "the weaker writer took over");
}

#[test]
fn partitions_that_do_not_match_never_meet_and_a_wildcard_does() {
    let d = join_all(domain_id(10), 2, |b| b);
    let topic0 = d[0].create_topic::<Reading>("part").unwrap();
    let topic1 = d[1].create_topic::<Reading>("part").unwrap();
    let writer = d[0]
        .create_publisher(&["sensors/east"])
        .create_writer(&topic0, reliable_writer())
        .unwrap();
    let other = d[1]
        .create_subscriber(&["actuators"])
        .create_reader(&topic1, reliable_reader())
        .unwrap();
    let wild = d[1]
        .create_subscriber(&["sensors/*"])
        .create_reader(&topic1, reliable_reader())
        .unwrap();
    let default = d[1].create_reader(&topic1, reliable_reader()).unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    for n in 0..5 {
        writer.write(&Reading::new(1, n)).unwrap();
    }
    assert_eq!(take_valid(&wild, 5).len(), 5);
    writer.wait_for_acknowledgments(WAIT).unwrap();
    assert_eq!(writer.matched_readers(), 1, "only the wildcard reader matches");
    assert!(other.take(usize::MAX).unwrap().is_empty());
    assert!(default.take(usize::MAX).unwrap().is_empty());
    assert_eq!(other.status().matched_writers, 0);
}

#[test]
fn incompatible_qos_is_reported_on_both_sides_with_its_policy() {
    let d = join_all(domain_id(11), 2, |b| b);
    let writer = d[0]
        .create_writer(
            &d[0].create_topic::<Reading>("inc").unwrap(),
            WriterQos::default().best_effort(),
        )
        .unwrap();
    let reader = d[1]
        .create_reader(&d[1].create_topic::<Reading>("inc").unwrap(), reliable_reader())
        .unwrap();
    wait_until("the writer reports", || !writer.status().incompatible_qos.is_empty());
    wait_until("the reader reports", || !reader.status().incompatible_qos.is_empty());
    let ws = writer.status();
    let rs = reader.status();
    assert_eq!(ws.incompatible_qos[0].0, reader.id());
    assert!(ws.incompatible_qos[0].1.contains(&QosPolicyId::Reliability), "{ws:?}");
    assert_eq!(rs.incompatible_qos[0].0, writer.id());
    assert!(rs.incompatible_qos[0].1.contains(&QosPolicyId::Reliability), "{rs:?}");
    assert_eq!(ws.matched_readers, 0);
    assert_eq!(rs.matched_writers, 0);
    writer.write(&Reading::new(1, 0)).unwrap();
    writer.wait_for_acknowledgments(WAIT).unwrap();
    assert!(reader.take(usize::MAX).unwrap().is_empty());
}

#[derive(Serialize, Deserialize, Debug)]
struct Alarm {
    code: u16,
}
impl Keyed for Alarm {
    type Key = u16;
    fn key(&self) -> u16 {
        self.code
    }
}

#[test]
fn inconsistent_topic_types_are_reported_and_never_matched() {
    let d = join_all(domain_id(12), 2, |b| b);
    let writer = d[0]
        .create_writer(&d[0].create_topic::<Reading>("typed").unwrap(), reliable_writer())
        .unwrap();
    let reader = d[1]
        .create_reader(&d[1].create_topic::<Alarm>("typed").unwrap(), ReaderQos::default())
        .unwrap();
    wait_until("the writer reports", || !writer.status().inconsistent_topic.is_empty());
    wait_until("the reader reports", || !reader.status().inconsistent_topic.is_empty());
    let why = &reader.status().inconsistent_topic[0].1;
    assert!(why.contains("Reading") && why.contains("Alarm"), "{why}");
    assert_eq!(writer.status().matched_readers, 0);
}

#[test]
fn a_reader_that_stops_reading_times_out_the_writer_and_nothing_is_lost() {
    let d = join_all(domain_id(13), 2, |b| b.window_slots(16).ack_every(4));
    let writer = d[0]
        .create_writer(
            &d[0].create_topic::<Reading>("stop").unwrap(),
            WriterQos::default().reliable(Duration::from_millis(200)).keep_all(),
        )
        .unwrap();
    let limits = ResourceLimits {
        max_samples: 40,
        max_instances: 4,
        max_samples_per_instance: 40,
    };
    let reader = d[1]
        .create_reader(
            &d[1].create_topic::<Reading>("stop").unwrap(),
            reliable_reader().resource_limits(limits),
        )
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    const N: u64 = 200;
    let mut n = 0;
    let timeout = loop {
        match writer.write(&Reading::new(1, n)) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < N, "the writer never blocked on a reader that does not read");
    };
    assert!(matches!(timeout, DdsError::Timeout { .. }), "{timeout}");
    assert!(timeout.to_string().contains("not written"), "{timeout}");
    // The reader resumes; the writer retries the sample that timed out.
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            while n < N {
                match writer.write(&Reading::new(1, n)) {
                    Ok(()) => n += 1,
                    Err(DdsError::Timeout { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });
        take_valid(&reader, N as usize)
    });
    let values: Vec<u64> = got.iter().map(|s| s.data.as_ref().unwrap().n).collect();
    assert_eq!(values, (0..N).collect::<Vec<_>>(), "nothing lost, nothing twice");
    assert!(writer.status().writes_blocked > 0);
}

#[test]
fn dispose_makes_the_instance_not_alive_disposed() {
    let d = join_all(domain_id(14), 2, |b| b);
    let writer = d[0]
        .create_writer(&d[0].create_topic::<Reading>("disp").unwrap(), reliable_writer())
        .unwrap();
    let reader = d[1]
        .create_reader(&d[1].create_topic::<Reading>("disp").unwrap(), reliable_reader())
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    writer.write(&Reading::new(3, 0)).unwrap();
    writer.write(&Reading::new(4, 0)).unwrap();
    take_valid(&reader, 2);
    writer.dispose(&Reading::new(3, 0)).unwrap();
    wait_until("the dispose", || reader.wait_for_data(Duration::from_millis(10)));
    let got = reader.take(usize::MAX).unwrap();
    assert_eq!(got.len(), 1, "{:?}", got.iter().map(|s| s.info).collect::<Vec<_>>());
    assert_eq!(got[0].info.instance_state, InstanceState::NotAliveDisposed);
    assert!(!got[0].info.valid_data);
    assert_eq!(got[0].info.instance.0, reader_instance(3));
    writer.write(&Reading::new(4, 1)).unwrap();
    assert_eq!(take_valid(&reader, 1)[0].info.instance_state, InstanceState::Alive);
}

#[test]
fn a_sample_larger_than_max_sample_bytes_is_a_clear_error() {
    let d = join_all(domain_id(15), 2, |b| b.max_sample_bytes(4096));
    let topic = d[0].create_topic::<Reading>("big").unwrap();
    match d[0].create_writer(&topic, reliable_writer().max_sample_bytes(8192)) {
        Err(DdsError::Config(why)) => assert!(why.contains("max_sample_bytes"), "{why}"),
        other => panic!("a writer above the participant's slots: {:?}", other.err()),
    }
    let writer = d[0]
        .create_writer(&topic, reliable_writer().max_sample_bytes(256))
        .unwrap();
    let reader = d[1]
        .create_reader(&d[1].create_topic::<Reading>("big").unwrap(), reliable_reader())
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    let big = Reading {
        sensor: 1,
        n: 0,
        payload: vec![7; 1000],
    };
    match writer.write(&big) {
        Err(e @ DdsError::Encode(_)) => assert!(e.to_string().contains("max_sample_bytes"), "{e}"),
        other => panic!("a 1000-byte sample in 256 bytes: {other:?}"),
    }
    writer.write(&Reading::new(1, 1)).unwrap();
    let got = take_valid(&reader, 1);
    assert_eq!(got[0].data.as_ref().unwrap().n, 1, "only the sample that fit arrives");
    writer.wait_for_acknowledgments(WAIT).unwrap();
    assert!(reader.take(usize::MAX).unwrap().is_empty());
}

fn tcp_builder(domain: u32, rank: usize, addrs: &[std::net::SocketAddr]) -> spindle::dds::ParticipantBuilder {
    let transport = spindle::TcpTransport::new(addrs.to_vec(), b"dds-test-group-key-0123456789abcdef".to_vec());
    DomainParticipant::builder(domain)
        .participants(2)
        .rank(rank)
        .transport(spindle::Transport::Tcp(transport))
        .join_timeout(Duration::from_secs(3))
}

#[test]
fn tcp_a_participant_of_another_domain_is_refused() {
    let addrs = free_addrs(2);
    let results = std::thread::scope(|s| {
        let a = s.spawn(|| tcp_builder(domain_id(16), 0, &addrs).join());
        let b = s.spawn(|| tcp_builder(domain_id(17), 1, &addrs).join());
        [a.join().unwrap(), b.join().unwrap()]
    });
    for r in results {
        match r {
            Ok(_) => panic!("two domains formed one group"),
            Err(e) => {
                let why = e.to_string();
                eprintln!("refused: {why}");
                assert!(
                    why.contains("belongs to group 'dds-"),
                    "the refusal names the domains' groups: {why}"
                );
            }
        }
    }
}

#[test]
fn tcp_pub_sub_smoke() {
    let addrs = free_addrs(2);
    let domain = domain_id(18);
    let d: Vec<DomainParticipant> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn({
                    let addrs = &addrs;
                    move || tcp_builder(domain, r, addrs).join().unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let writer = d[0]
        .create_writer(&d[0].create_topic::<Reading>("tcp").unwrap(), reliable_writer())
        .unwrap();
    let reader = d[1]
        .create_reader(&d[1].create_topic::<Reading>("tcp").unwrap(), reliable_reader())
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    for n in 0..100 {
        writer
            .write(&Reading {
                sensor: (n % 4) as u32,
                n,
                payload: vec![n as u8; 1000],
            })
            .unwrap();
    }
    let got = take_valid(&reader, 100);
    let values: Vec<u64> = got.iter().map(|s| s.data.as_ref().unwrap().n).collect();
    assert_eq!(values, (0..100).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|s| s.data.as_ref().unwrap().payload == vec![s.data.as_ref().unwrap().n as u8; 1000]));
}

#[test]
fn a_reliable_keep_all_reader_smaller_than_one_delivery_pass_is_refused() {
    // 2 participants x 16 slots: a history under 32 samples would pause
    // its participant's receiving for good (nothing, not even discovery,
    // would arrive); it is refused instead.
    let d = join_all(domain_id(19), 2, |b| b.window_slots(16).ack_every(4));
    let limits = ResourceLimits {
        max_samples: 20,
        max_instances: 4,
        max_samples_per_instance: 20,
    };
    let topic = d[1].create_topic::<Reading>("small").unwrap();
    match d[1].create_reader(&topic, reliable_reader().resource_limits(limits)) {
        Err(DdsError::Config(why)) => assert!(why.contains("max_samples >= participants x window_slots = 32"), "{why}"),
        other => panic!("a 20-sample reliable keep-all history: {:?}", other.err()),
    }
    // Best effort (no back-pressure) or keep-last is fine.
    d[1].create_reader(&topic, ReaderQos::default().keep_all().resource_limits(limits))
        .unwrap();
}
