//! A sensor publisher and a monitor subscriber on keyed instances (one
//! instance per sensor): 3 sensors x 20 readings, reliable, then sensor
//! 2 is disposed. The monitor checks every reading arrived in order per
//! sensor and that sensor 2 is NotAliveDisposed.
//!
//! ```sh
//! cargo run --release -p spindle --example dds_sensor             # two threads
//! cargo run --release -p spindle --example dds_sensor -- sub 42 & # two processes
//! cargo run --release -p spindle --example dds_sensor -- pub 42
//! ```

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spindle::dds::{DdsError, DomainParticipant, InstanceState, Keyed, ReaderQos, WriterQos};

#[derive(Serialize, Deserialize, Debug)]
struct Reading {
    sensor: u32,
    n: u32,
    celsius: f64,
}
impl Keyed for Reading {
    type Key = u32;
    fn key(&self) -> u32 {
        self.sensor
    }
}

const SENSORS: u32 = 3;
const READINGS: u32 = 20;
const TOPIC: &str = "sensors/temperature";

fn publisher(domain: u32) -> Result<(), DdsError> {
    let p = DomainParticipant::builder(domain).participants(2).rank(0).join()?;
    let w = p.create_writer(
        &p.create_topic::<Reading>(TOPIC)?,
        WriterQos::default().reliable(Duration::from_secs(5)),
    )?;
    w.wait_for_readers(1, Duration::from_secs(10))?;
    for n in 0..READINGS {
        for sensor in 0..SENSORS {
            w.write(&Reading {
                sensor,
                n,
                celsius: 20.0 + sensor as f64 + n as f64 / 10.0,
            })?;
        }
    }
    w.dispose(&Reading {
        sensor: 2,
        n: 0,
        celsius: 0.0,
    })?; // sensor 2 is decommissioned
    w.wait_for_acknowledgments(Duration::from_secs(10))?;
    println!("publisher: wrote {} readings, disposed sensor 2", SENSORS * READINGS);
    std::thread::sleep(Duration::from_millis(200)); // let the monitor finish before leaving
    p.close()
}

fn monitor(domain: u32) -> Result<(), Box<dyn std::error::Error>> {
    let p = DomainParticipant::builder(domain).participants(2).rank(1).join()?;
    let qos = ReaderQos::default().reliable(Duration::from_secs(5)).keep_all();
    let r = p.create_reader(&p.create_topic::<Reading>(TOPIC)?, qos)?;
    let mut next = [0u32; SENSORS as usize];
    let mut disposed = false;
    let start = Instant::now();
    while next.iter().sum::<u32>() < SENSORS * READINGS || !disposed {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "monitor: timed out, got {next:?}"
        );
        r.wait_for_data(Duration::from_millis(100));
        for s in r.take(64)? {
            match s.data {
                Some(reading) => {
                    assert_eq!(reading.n, next[reading.sensor as usize], "in order per sensor");
                    next[reading.sensor as usize] += 1;
                }
                None if s.info.instance_state == InstanceState::NotAliveDisposed => disposed = true,
                None => {}
            }
        }
    }
    println!("monitor: readings per sensor {next:?}; sensor 2 NotAliveDisposed");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let domain = args
        .get(2)
        .map_or(Ok(std::process::id() % 100_000 * 10 + 1), |d| d.parse())?;
    match args.get(1).map(String::as_str) {
        Some("pub") => publisher(domain)?,
        Some("sub") => monitor(domain)?,
        _ => {
            let pubber = std::thread::spawn(move || publisher(domain).map_err(|e| e.to_string()));
            monitor(domain)?;
            pubber.join().expect("publisher thread")?;
        }
    }
    println!("OK");
    Ok(())
}
