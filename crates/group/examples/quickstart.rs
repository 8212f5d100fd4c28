//! Three members of one group, each on its own thread (as three processes
//! would be), every one multicasting; member 0 prints what it delivers.
//!
//! ```sh
//! cargo run --release -p spindle-group --example quickstart
//! ```

use std::time::Duration;

use spindle_group::{DeliveryMode, Group, GroupConfig, SendError, SenderSet};

const MEMBERS: usize = 3;
const MESSAGES_PER_MEMBER: u64 = 4;

fn member(rank: usize, config: GroupConfig) -> Result<Vec<String>, String> {
    let mut group = Group::join_shm(config, rank).map_err(|e| e.to_string())?;
    let sender = group.sender().expect("every member sends");
    let mut sent = 0;
    let mut lines = Vec::new();
    while lines.len() < MEMBERS * MESSAGES_PER_MEMBER as usize {
        if sent < MESSAGES_PER_MEMBER {
            let text = format!("hello #{sent} from member {rank}");
            match sender.send(text.as_bytes()) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        group
            .poll_or_idle(&mut |d| {
                lines.push(format!("seq {:>2}  {}", d.seq, String::from_utf8_lossy(d.payload)));
            })
            .map_err(|e| e.to_string())?;
    }
    group
        .finish(&mut |_| {}, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    Ok(lines)
}

fn main() -> Result<(), String> {
    let mut config = GroupConfig::new(&format!("quickstart-{}", std::process::id()), MEMBERS);
    config.senders = SenderSet::All;
    config.mode = DeliveryMode::Ordered;
    config.slot_payload_max = 64;
    let threads: Vec<_> = (0..MEMBERS)
        .map(|rank| {
            let config = config.clone();
            std::thread::spawn(move || member(rank, config))
        })
        .collect();
    let logs: Vec<Vec<String>> = threads
        .into_iter()
        .map(|t| t.join().expect("member thread"))
        .collect::<Result<_, _>>()?;
    println!("member 0 delivered, in the group's total order:");
    for line in &logs[0] {
        println!("  {line}");
    }
    assert!(
        logs.iter().all(|l| *l == logs[0]),
        "every member delivered the same sequence"
    );
    println!(
        "all {MEMBERS} members delivered the same {} messages in the same order",
        logs[0].len()
    );
    Ok(())
}
