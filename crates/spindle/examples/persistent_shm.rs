//! Persistent delivery: three members on shared memory, each with its own
//! on-disk log. Every member multicasts 100 messages; each message is
//! delivered once all three members have it on disk. Afterwards each log
//! is read back and holds exactly what its member delivered, in order.
//!
//! ```sh
//! cargo run --release -p spindle --example persistent_shm
//! ```

use std::path::Path;
use std::time::Duration;

use spindle::{Delivery, DeliveryMode, Group, Upcalls};

/// The application: (view, seq, payload) of each delivery, in order.
struct Received(Vec<(u64, u64, Vec<u8>)>);

impl Upcalls for Received {
    fn deliver(&mut self, d: &Delivery<'_>) {
        self.0.push((d.view, d.seq, d.payload.to_vec()));
    }
}

const PER_MEMBER: usize = 100;

fn member(rank: usize, name: &str, dir: &Path) -> Result<Vec<(u64, u64, Vec<u8>)>, spindle::Error> {
    let mut group = Group::builder(name)
        .members(3)
        .rank(rank)
        .mode(DeliveryMode::Persistent)
        .persist_dir(dir)
        .app(Received(Vec::new()))
        .join()?;
    for i in 0..PER_MEMBER {
        group.send(format!("order {i} from member {rank}").as_bytes())?;
    }
    group.run_until(Duration::from_secs(30), |r| r.0.len() == 3 * PER_MEMBER)?;
    Ok(group.finish_together(Duration::from_secs(30))?.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("persist-shm-{}", std::process::id());
    // A real disk is what persistence is for; a temporary directory keeps
    // the example tidy.
    let dir = std::env::temp_dir().join(format!("{name}-logs"));
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let (name, dir) = (name.clone(), dir.clone());
            std::thread::spawn(move || member(rank, &name, &dir))
        })
        .collect();
    let delivered = threads
        .into_iter()
        .map(|t| t.join().expect("a member thread panicked"))
        .collect::<Result<Vec<_>, _>>()?;
    assert!(
        delivered.iter().all(|d| *d == delivered[0]),
        "total order: every member delivers the same sequence"
    );
    for (rank, mine) in delivered.iter().enumerate() {
        let path = spindle::persist::log_path(&dir, &name, rank);
        let log = spindle::persist::recover(&path)?;
        let history: Vec<(u64, u64, Vec<u8>)> = log
            .history()
            .iter()
            .map(|m| (m.view, m.seq, m.payload.to_vec()))
            .collect();
        assert_eq!(&history, mine, "member {rank}'s log holds what it delivered");
        println!(
            "member {rank}: delivered {} messages; its log {} ({} bytes) holds the same {}, in order",
            mine.len(),
            path.display(),
            log.valid_bytes,
            history.len()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    println!("OK: every message was on every member's disk before it was delivered");
    Ok(())
}
