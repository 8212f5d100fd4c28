//! Exclusive ownership failover: a primary (strength 10) and a backup
//! (strength 5) both publish the pump's setpoint; the monitor sees only
//! the primary's. The primary's participant closes; the backup takes over.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spindle::dds::{DataReader, DomainParticipant, Keyed, ReaderQos, WriterQos};

#[derive(Serialize, Deserialize, Debug)]
struct Setpoint {
    pump: u32,
    from: String,
    n: u32,
}
impl Keyed for Setpoint {
    type Key = u32;
    fn key(&self) -> u32 {
        self.pump
    }
}

fn take(r: &DataReader<Setpoint>, count: usize) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let (mut got, start) = (Vec::new(), Instant::now());
    while got.len() < count {
        assert!(start.elapsed() < Duration::from_secs(10), "got only {got:?}");
        r.wait_for_data(Duration::from_millis(100));
        got.extend(
            r.take(16)?
                .into_iter()
                .filter_map(|s| s.data)
                .map(|s| format!("{}#{}", s.from, s.n)),
        );
    }
    Ok(got)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let domain = std::process::id() % 100_000 * 10 + 3;
    let mut ps: Vec<DomainParticipant> = (0..3)
        .map(|rank| std::thread::spawn(move || DomainParticipant::builder(domain).participants(3).rank(rank).join()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("join thread"))
        .collect::<Result<_, _>>()?;
    let qos = |strength| {
        WriterQos::default()
            .reliable(Duration::from_secs(5))
            .exclusive(strength)
    };
    let monitor = ps[0].create_reader(
        &ps[0].create_topic::<Setpoint>("pump")?,
        ReaderQos::default()
            .reliable(Duration::from_secs(5))
            .keep_all()
            .exclusive(),
    )?;
    let primary = ps[1].create_writer(&ps[1].create_topic::<Setpoint>("pump")?, qos(10))?;
    let backup = ps[2].create_writer(&ps[2].create_topic::<Setpoint>("pump")?, qos(5))?;
    monitor.wait_for_writers(2, Duration::from_secs(10))?;
    let set = |from: &str, n| Setpoint {
        pump: 1,
        from: from.into(),
        n,
    };
    primary.write(&set("primary", 0))?;
    take(&monitor, 1)?;
    for n in 1..4 {
        primary.write(&set("primary", n))?;
        backup.write(&set("backup", n))?;
    }
    let got = take(&monitor, 3)?;
    println!("while both publish, the monitor sees {got:?}");
    assert!(got.iter().all(|g| g.starts_with("primary")));
    println!("closing the primary's participant");
    ps.remove(1).close()?;
    drop(primary); // after its participant left: no clean unregister

    let start = Instant::now();
    while monitor.status().matched_writers != 1 {
        assert!(start.elapsed() < Duration::from_secs(10), "the primary never left");
        std::thread::sleep(Duration::from_millis(5));
    }
    for n in 4..7 {
        backup.write(&set("backup", n))?;
    }
    let got = take(&monitor, 3)?;
    println!("after failover the monitor sees {got:?}");
    assert_eq!(got, ["backup#4", "backup#5", "backup#6"]);
    println!("OK");
    Ok(())
}
