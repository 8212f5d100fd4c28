//! Three members of one group on shared memory, each on its own thread (as
//! three processes would be): every member multicasts one message, and
//! every member delivers all three in the same total order.
//!
//! ```sh
//! cargo run --release -p spindle --example hello_shm
//! ```

use std::time::Duration;

use spindle::{Delivery, Group, Upcalls};

/// The application: what this member delivered, in order.
struct Received(Vec<String>);

impl Upcalls for Received {
    fn deliver(&mut self, d: &Delivery<'_>) {
        let text = String::from_utf8_lossy(d.payload);
        self.0
            .push(format!("seq {} from member {}: {text}", d.seq, d.sender_rank));
    }
}

fn member(rank: usize, name: &str) -> Result<Vec<String>, spindle::Error> {
    let mut group = Group::builder(name)
        .members(3)
        .rank(rank)
        .app(Received(Vec::new()))
        .join()?;
    group.send(format!("hello from member {rank}").as_bytes())?;
    group.run_until(Duration::from_secs(10), |received| received.0.len() == 3)?;
    Ok(group.finish_together(Duration::from_secs(10))?.0)
}

fn main() -> Result<(), spindle::Error> {
    let name = format!("hello-shm-{}", std::process::id());
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || member(rank, &name))
        })
        .collect();
    let logs = threads
        .into_iter()
        .map(|t| t.join().expect("a member thread panicked"))
        .collect::<Result<Vec<_>, _>>()?;
    logs[0].iter().for_each(|line| println!("{line}"));
    assert!(
        logs.iter().all(|log| *log == logs[0]),
        "total order: every member delivers the same sequence"
    );
    println!("OK: 3 members delivered the same 3 messages in the same total order");
    Ok(())
}
