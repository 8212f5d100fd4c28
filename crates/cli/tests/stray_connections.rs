//! Stray connections to a `spindle run` member that waits for its group:
//! a connect-then-close, 128 random bytes and an HTTP GET arrive before the
//! other members start. The waiting member counts them as failed
//! handshakes (`spindle stat --json` shows `handshakes_failed`) and goes on
//! waiting; the group forms and every member exits 0. Loopback only; every
//! wait is bounded; the processes are killed if the test fails.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{spindle, text};

/// Liveness bound for every wait (a hang fails the test; never a speed
/// assertion).
const STALL_MAX: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    spindle_bench::cluster::free_port().expect("a free loopback port")
}

fn write_group(dir: &Path, group: &str, ports: &[u16]) -> std::path::PathBuf {
    common::write_key_file(&dir.join("g.key"), "a stray-connections key, 32 b..");
    let mut config =
        format!("[group]\nname = \"{group}\"\nkey_file = \"g.key\"\nwindow_slots = 64\njoin_timeout_ms = 30000\n");
    for (id, port) in ports.iter().enumerate() {
        config += &format!("[[members]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\n");
    }
    let path = dir.join("g.toml");
    std::fs::write(&path, config).unwrap();
    path
}

fn start(config: &Path, member: usize) -> Child {
    spindle()
        .args(["run", "--config"])
        .arg(config)
        .args(["--member", &member.to_string(), "--count", "200", "--size", "64"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Kills the members still running when the test ends (a failed assert).
struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait until `ok()` holds, or panic naming `what`.
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < STALL_MAX, "stalled waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `handshakes_failed` of member `rank`'s own stat file, from `spindle stat --json`.
fn handshakes_failed(group: &str, rank: u64) -> Option<u64> {
    let out = spindle()
        .args(["stat", "--json", "--group", group])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    doc["groups"]
        .as_array()?
        .iter()
        .find(|g| g["view_of"].as_u64() == Some(rank))?["handshakes"]["handshakes_failed"]
        .as_u64()
}

#[test]
fn stray_connections_to_a_waiting_member_do_not_stop_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let group = format!("stray-{}", std::process::id());
    let ports = [free_port(), free_port(), free_port()];
    let config = write_group(dir.path(), &group, &ports);
    let mut members = Members(vec![start(&config, 0)]);
    let addr = format!("127.0.0.1:{}", ports[0]);

    // Member 0 listens and waits for 1 and 2. The first stray connection
    // is the probe that finds it listening: a connect-then-close.
    wait_until("member 0 to listen", || TcpStream::connect(&addr).is_ok());
    let mut random = TcpStream::connect(&addr).unwrap();
    let noise: Vec<u8> = (0..128u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    random.write_all(&noise).unwrap();
    let mut http = TcpStream::connect(&addr).unwrap();
    http.write_all(
        format!("GET / HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\nAccept-Language: en\r\nConnection: keep-alive\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    drop(TcpStream::connect(&addr).unwrap());
    wait_until("member 0 to count the stray connections (spindle stat)", || {
        handshakes_failed(&group, 0).is_some_and(|n| n >= 4)
    });
    assert!(
        members.0[0].try_wait().unwrap().is_none(),
        "member 0 exited because of the stray connections"
    );

    members.0.push(start(&config, 1));
    members.0.push(start(&config, 2));
    for m in 0..3 {
        wait_until(&format!("member {m} to exit"), || {
            members.0[m].try_wait().unwrap().is_some()
        });
    }
    for (m, child) in std::mem::take(&mut members.0).into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "member {m}: {}", text(&out));
        assert!(
            text(&out).contains("delivered 600 messages"),
            "member {m}: {}",
            text(&out)
        );
    }
    drop((random, http));
}
