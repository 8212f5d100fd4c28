//! The replicated key-value service through an ordinary Redis client.
//!
//! Starts a local service in this process (a master and 2 backups, each a
//! thread over shared memory; every write is on both backups before it is
//! acknowledged), then SETs, GETs, INCRs and DELs a few keys with the
//! `redis` crate, checks every answer and stops the service cleanly.
//!
//! ```text
//! cargo run --release -p spindle --example kv_client
//! ```

use redis::Commands;
use spindle::kv::KvService;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service = KvService::builder().backups(2).port(0).start()?;
    println!("kv service on {} with {} backups", service.addr(), service.backups());

    let client = redis::Client::open(service.url())?;
    let mut con = client.get_connection()?;

    let () = con.set("greeting", "hello")?;
    let () = con.set("answer", 41)?;
    let greeting: String = con.get("greeting")?;
    println!("GET greeting -> {greeting:?}");
    assert_eq!(greeting, "hello");

    // `Commands::incr` sends INCRBY; the service speaks INCR.
    let answer: i64 = redis::cmd("INCR").arg("answer").query(&mut con)?;
    println!("INCR answer -> {answer}");
    assert_eq!(answer, 42);
    let counter: i64 = redis::cmd("INCR").arg("counter").query(&mut con)?; // a missing key counts from 0
    assert_eq!(counter, 1);

    let removed: i64 = con.del(&["greeting", "counter", "no-such-key"])?;
    println!("DEL greeting counter no-such-key -> {removed}");
    assert_eq!(removed, 2);
    let gone: Option<String> = con.get("greeting")?;
    println!("GET greeting -> {gone:?}");
    assert_eq!(gone, None);
    let answer: String = con.get("answer")?;
    assert_eq!(answer, "42");

    drop(con);
    service.stop()?;
    println!("stopped cleanly");
    Ok(())
}
