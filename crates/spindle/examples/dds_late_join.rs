//! Transient-local late join: rank 0 writes 10 readings of 2 sensors
//! (keep-last 3, transient-local) while only rank 1 is there; rank 2 joins
//! the running domain afterwards, and its reader gets exactly the last 3
//! readings per sensor, then the live ones.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spindle::dds::{DomainParticipant, Keyed, ReaderQos, WriterQos};

#[derive(Serialize, Deserialize, Debug)]
struct Reading {
    sensor: u32,
    n: u32,
}
impl Keyed for Reading {
    type Key = u32;
    fn key(&self) -> u32 {
        self.sensor
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let domain = std::process::id() % 100_000 * 10 + 2;
    let builder = move |rank| {
        DomainParticipant::builder(domain)
            .participants(3)
            .rank(rank)
            .initial_members(vec![0, 1])
    };
    let other = std::thread::spawn(move || builder(1).join());
    let p0 = builder(0).join()?;
    let _p1 = other.join().expect("rank 1")?;
    let qos = WriterQos::default()
        .reliable(Duration::from_secs(5))
        .keep_last(3)
        .transient_local();
    let w = p0.create_writer(&p0.create_topic::<Reading>("readings")?, qos)?;
    for n in 0..10 {
        for sensor in 0..2 {
            w.write(&Reading { sensor, n })?;
        }
    }
    w.wait_for_acknowledgments(Duration::from_secs(10))?;
    println!("rank 0 wrote readings 0..10 of sensors 0 and 1");

    let p2 = builder(2).join()?; // joins the running domain: gets the histories
    let qos = ReaderQos::default()
        .reliable(Duration::from_secs(5))
        .keep_all()
        .transient_local();
    let r = p2.create_reader(&p2.create_topic::<Reading>("readings")?, qos)?;
    w.wait_for_readers(1, Duration::from_secs(10))?;
    w.write(&Reading { sensor: 0, n: 10 })?; // a live one
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < 7 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "late reader got only {got:?}"
        );
        r.wait_for_data(Duration::from_millis(100));
        got.extend(r.take(16)?.into_iter().filter_map(|s| s.data).map(|d| (d.sensor, d.n)));
    }
    println!("late reader on rank 2 got {got:?}");
    for sensor in 0..2 {
        let history: Vec<u32> = got[..6].iter().filter(|g| g.0 == sensor).map(|g| g.1).collect();
        assert_eq!(history, [7, 8, 9], "sensor {sensor}: exactly the last 3");
    }
    assert_eq!(got[6], (0, 10), "then the live reading");
    println!("OK");
    Ok(())
}
