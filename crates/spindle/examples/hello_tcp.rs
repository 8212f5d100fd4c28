//! Three members of a tcp group on 127.0.0.1, opened from one config file
//! (`hello_tcp.toml` beside this file): every member multicasts one
//! message, and every member delivers all three in the same total order.
//!
//! ```sh
//! cargo run --release -p spindle --example hello_tcp                # 3 members on threads
//! cargo run --release -p spindle --example hello_tcp -- FILE ID     # one member per process (ids 0, 1, 2)
//! ```

use std::time::Duration;

use spindle::GroupFile;

fn member(file: &GroupFile, id: usize) -> Result<Vec<String>, spindle::Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let on_deliver = move |d: &spindle::Delivery<'_>| {
        let text = String::from_utf8_lossy(d.payload);
        let _ = tx.send(format!("seq {} from member {}: {text}", d.seq, d.sender_rank));
    };
    let mut group = file.builder(id)?.on_deliver(on_deliver).join()?;
    group.send(format!("hello from member {id}").as_bytes())?;
    let mut lines = Vec::new();
    while lines.len() < 3 {
        group.poll_or_idle()?;
        lines.extend(rx.try_iter());
    }
    group.finish_together(Duration::from_secs(10))?;
    Ok(lines)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let default_file = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hello_tcp.toml").to_string();
    let file = GroupFile::load(std::env::args().nth(1).unwrap_or(default_file))?;
    file.create_key_if_missing()?; // a real group makes its key once and copies it to every host
    let ids: Vec<usize> = match std::env::args().nth(2) {
        Some(id) => vec![id.parse()?],
        None => (0..file.members.len()).collect(),
    };
    let logs = std::thread::scope(|s| {
        let file = &file;
        let members: Vec<_> = ids.iter().map(|&id| s.spawn(move || member(file, id))).collect();
        members
            .into_iter()
            .map(|m| m.join().expect("member thread"))
            .collect::<Result<Vec<_>, _>>()
    })?;
    assert!(
        logs.iter().all(|log| *log == logs[0]),
        "total order: every member delivers the same sequence"
    );
    logs[0].iter().for_each(|line| println!("{line}"));
    println!("OK: member(s) {ids:?} delivered the same 3 messages in the same total order");
    Ok(())
}
