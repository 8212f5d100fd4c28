//! A DDS writer in another process, SIGKILLed mid-stream: the reader
//! reports its liveliness lost and its instances NotAliveNoWriters, and
//! never delivers a torn sample. The child is this test binary re-run
//! with `DDS_CHILD_WRITER=<domain>`. The domain has 3 participants (ranks
//! 0 and 2 here, rank 1 the child) so that a majority survives the kill.

mod common_dds;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common_dds::*;
use spindle::dds::{DomainParticipant, InstanceState, ReaderQos, WriterQos};

const CHILD_ENV: &str = "DDS_CHILD_WRITER";
const CHILD_PARTICIPANTS_ENV: &str = "DDS_CHILD_PARTICIPANTS";
const PAYLOAD_BYTES: usize = 4000;

/// The child's part (a no-op unless `DDS_CHILD_WRITER` is set): rank 1,
/// writes 4 KB samples until it is killed.
#[test]
fn child_writer_process() {
    let Ok(domain) = std::env::var(CHILD_ENV) else { return };
    let domain: u32 = domain.parse().expect("a domain id");
    let participants: usize = std::env::var(CHILD_PARTICIPANTS_ENV).map_or(3, |n| n.parse().expect("a count"));
    let p = DomainParticipant::builder(domain)
        .participants(participants)
        .rank(1)
        .join()
        .expect("the child joins");
    let topic = p.create_topic::<Reading>("killed").unwrap();
    let writer = p
        .create_writer(
            &topic,
            WriterQos::default()
                .reliable(Duration::from_secs(5))
                .liveliness_lease(Duration::from_secs(1)),
        )
        .unwrap();
    writer.wait_for_readers(1, WAIT).unwrap();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(60) {
        let payload = vec![(n % 251) as u8; PAYLOAD_BYTES];
        writer
            .write(&Reading {
                sensor: (n % 3) as u32,
                n,
                payload,
            })
            .unwrap();
        n += 1;
        std::thread::sleep(Duration::from_micros(300));
    }
}

#[test]
fn a_sigkilled_writer_process_loses_liveliness_and_no_torn_sample_is_delivered() {
    kill_the_writer_process(domain_id(50), 3);
}

/// The default domain size, 2: after the kill the survivor is no
/// majority, so its participant stops (it cannot install a view alone);
/// its readers still report every writer's liveliness lost.
#[test]
fn a_sigkilled_writer_process_in_a_two_participant_domain_loses_liveliness() {
    kill_the_writer_process(domain_id(51), 2);
}

/// The child writes as rank 1 of `participants`; this process holds the
/// other ranks (rank 0 reads).
fn kill_the_writer_process(domain: u32, participants: usize) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "child_writer_process", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, domain.to_string())
        .env(CHILD_PARTICIPANTS_ENV, participants.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the writer process");
    let (p, _others) = std::thread::scope(|s| {
        let others: Vec<_> = (2..participants)
            .map(|rank| {
                s.spawn(move || {
                    DomainParticipant::builder(domain)
                        .participants(participants)
                        .rank(rank)
                        .join()
                        .expect("rank 2.. joins")
                })
            })
            .collect();
        let p = DomainParticipant::builder(domain)
            .participants(participants)
            .rank(0)
            .join()
            .expect("rank 0 joins");
        let others: Vec<_> = others.into_iter().map(|h| h.join().expect("rank thread")).collect();
        (p, others)
    });
    let topic = p.create_topic::<Reading>("killed").unwrap();
    let reader = p
        .create_reader(
            &topic,
            ReaderQos::default()
                .reliable(Duration::from_secs(5))
                .keep_all()
                .liveliness_lease(Duration::from_secs(2)),
        )
        .unwrap();
    reader.wait_for_writers(1, WAIT).unwrap();
    let mut got: Vec<Reading> = take_valid(&reader, 50).into_iter().map(|s| s.data.unwrap()).collect();
    child.kill().expect("SIGKILL the writer");
    let _ = child.wait();
    let killed_at = Instant::now();
    wait_until("liveliness lost", || !reader.status().liveliness_lost.is_empty());
    eprintln!("liveliness lost reported {:?} after the kill", killed_at.elapsed());
    let rest = reader.take(usize::MAX).unwrap();
    let mut not_alive = std::collections::HashSet::new();
    for s in &rest {
        if s.info.valid_data {
            got.push(s.data.clone().expect("valid data decodes"));
        } else if s.info.instance_state == InstanceState::NotAliveNoWriters {
            not_alive.insert(s.info.instance);
        }
    }
    assert_eq!(not_alive.len(), 3, "every instance of the dead writer has no writers");
    let values: Vec<u64> = got.iter().map(|r| r.n).collect();
    assert_eq!(values, (0..values.len() as u64).collect::<Vec<_>>(), "in order, no gap");
    for r in &got {
        assert_eq!(
            r.payload,
            vec![(r.n % 251) as u8; PAYLOAD_BYTES],
            "sample {} is whole",
            r.n
        );
    }
    assert_eq!(reader.status().matched_writers, 0);
}
