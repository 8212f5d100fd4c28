//! End-to-end tests of `spindle kv serve`: real member processes on shm
//! (and on the tcp fabric), driven over TCP with raw RESP and with a real
//! Redis client library (the `redis` crate), through failovers (the
//! master SIGKILLed), with a concurrent client history checked for
//! linearizability; a spare replacing a killed backup; a restart from the
//! data directory after a clean stop.

use std::cell::RefCell;
use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::kv::{reserve_port, Resp};
use spindle_bench::cluster::{signal_pid, Cluster, Output};
use spindle_replica::linearizability::{check, Op, OpKind, OpResult};

/// A running `spindle kv serve` with its members.
struct Service {
    /// The supervisor in slot 0, stopped cleanly on drop (SIGTERM: it
    /// stops its members), killed after 10 s. First, so it stops before
    /// the data directory is removed.
    cluster: RefCell<Cluster>,
    port: u16,
    member_pids: Vec<u32>,
    data_dir: std::path::PathBuf,
    group: String,
    _dir: Option<tempfile::TempDir>,
}

/// How long a test waits for a line from the supervisor.
const LINE_WAIT: Duration = Duration::from_secs(60);
/// A RESP client's read timeout, and how long it retries connecting.
const RESP_READ_TIMEOUT: Duration = Duration::from_secs(30);
const RESP_CONNECT_WAIT: Duration = Duration::from_secs(60);

impl Service {
    fn start(backups: usize, mode: &str) -> Service {
        // Segment files on tmpfs: fsyncs on a disk shared with busy builds
        // can stall for seconds; these tests check the service, not the disk.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().to_path_buf();
        Service::start_with(backups, mode, &[], &path, Some(dir))
    }

    /// A service with extra `spindle kv serve` arguments, its segments in
    /// `data_dir` (removed with `dir` when given).
    fn start_with(
        backups: usize,
        mode: &str,
        extra: &[&str],
        data_dir: &std::path::Path,
        dir: Option<tempfile::TempDir>,
    ) -> Service {
        static N: AtomicU64 = AtomicU64::new(0);
        let port = reserve_port(0);
        let group = format!("kvt-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let spares: usize = extra
            .iter()
            .position(|a| *a == "--spares")
            .map(|i| extra[i + 1].parse().unwrap())
            .unwrap_or(0);
        let mut cluster = Cluster::with_exe(env!("CARGO_BIN_EXE_spindle"), 1)
            .streams(Output::Capture, Output::Capture)
            .fail_on_panics()
            .stop_with(libc::SIGTERM, Duration::from_secs(10));
        let mut args: Vec<String> = ["kv", "serve", "--port", &port.to_string(), "--group", &group]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--backups".into(), backups.to_string(), "--mode".into(), mode.into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--data-dir".into(), data_dir.display().to_string()]);
        if extra.windows(2).any(|w| w[0] == "--transport" && w[1] != "shm") {
            // The members' ports too (not port + 1 …: see `reserve_port`).
            let peers: Vec<String> = (0..backups + 1 + spares)
                .map(|_| format!("127.0.0.1:{}", reserve_port(0)))
                .collect();
            let config = data_dir.join(format!("{group}-peers.conf"));
            std::fs::create_dir_all(data_dir).unwrap();
            std::fs::write(&config, format!("peers = \"{}\"\n", peers.join(","))).unwrap();
            args.extend(["--config".into(), config.display().to_string()]);
        }
        cluster.start(0, args).expect("spawn spindle kv serve");
        let mut member_pids = Vec::new();
        while member_pids.len() < backups + 1 + spares {
            let line = cluster
                .wait_line(0, "member ", LINE_WAIT)
                .unwrap_or_else(|e| panic!("{e}"));
            if let Some(pid) = line.split("pid ").nth(1).and_then(|s| s.split_whitespace().next()) {
                member_pids.push(pid.parse().unwrap());
            }
        }
        cluster
            .wait_line(0, "is master of epoch", LINE_WAIT)
            .unwrap_or_else(|e| panic!("{e}"));
        Service {
            cluster: RefCell::new(cluster),
            port,
            member_pids,
            data_dir: data_dir.to_path_buf(),
            group: group.clone(),
            _dir: dir,
        }
    }

    /// A line already seen (by `start` too) or the next one containing
    /// `needle`.
    fn wait_line_seen(&self, needle: &str) -> String {
        self.cluster
            .borrow_mut()
            .find_line(0, needle, LINE_WAIT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The next stdout line containing `needle` (bounded wait: a hang
    /// fails the test instead of blocking it).
    fn wait_line(&self, needle: &str) -> String {
        self.cluster
            .borrow_mut()
            .wait_line(0, needle, LINE_WAIT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits for the line of the master elected after member 0 (the
    /// first master) was killed. With three members either backup may
    /// win (the one whose log reaches furthest, then the lower rank),
    /// and a roll may precede the election, so neither the rank nor the
    /// epoch is fixed: any member but 0, at any epoch above 0.
    fn wait_new_master(&self) -> String {
        let line = self.wait_line(" is master of epoch ");
        let rank: usize = line
            .split("member ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no rank in {line:?}"));
        let epoch: u64 = line
            .split(" is master of epoch ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no epoch in {line:?}"));
        assert!(rank != 0 && epoch > 0, "the killed master came back: {line:?}");
        line
    }

    fn connect(&self) -> Resp {
        Resp::connect(self.port, RESP_READ_TIMEOUT, RESP_CONNECT_WAIT)
    }

    fn kill_member(&self, rank: usize) {
        // A member of this service (a child of its supervisor, which
        // reaps it: the pid is still that member's when a test kills it).
        signal_pid(self.member_pids[rank], libc::SIGKILL).unwrap_or_else(|e| panic!("kill member {rank}: {e}"));
    }
}

#[test]
fn raw_resp_session_pipelining_and_errors() {
    let service = Service::start(2, "one-sided");
    let mut c = service.connect();
    assert_eq!(c.call(&["PING"]).unwrap(), "+PONG");
    assert_eq!(c.call(&["SET", "a", "hello"]).unwrap(), "+OK");
    assert_eq!(c.call(&["GET", "a"]).unwrap(), "hello");
    assert_eq!(c.call(&["GET", "missing"]).unwrap(), "nil");
    assert_eq!(c.call(&["MSET", "x", "1", "y", "2"]).unwrap(), "+OK");
    assert_eq!(c.call(&["MGET", "x", "y", "z"]).unwrap(), "[1,2,nil]");
    assert_eq!(c.call(&["INCR", "x"]).unwrap(), ":2");
    assert_eq!(c.call(&["EXISTS", "a", "x", "z"]).unwrap(), ":2");
    assert_eq!(c.call(&["DEL", "a", "z"]).unwrap(), ":1");
    assert_eq!(c.call(&["DBSIZE"]).unwrap(), ":2");
    assert!(c
        .call(&["INCR", "y", "extra"])
        .unwrap()
        .starts_with("-ERR wrong number of arguments"));
    assert!(c
        .call(&["LPUSH", "l", "1"])
        .unwrap()
        .starts_with("-ERR unknown command 'LPUSH'"));
    assert!(c.call(&["INFO"]).unwrap().contains("role:master"));
    // Pipelining: 100 requests in one write, 100 replies in order.
    let mut batch = Vec::new();
    for _ in 0..100 {
        batch.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$1\r\np\r\n");
    }
    c.stream.write_all(&batch).unwrap();
    for i in 1..=100 {
        assert_eq!(c.reply().unwrap(), format!(":{i}"));
    }
    // Inline commands (telnet style).
    c.stream.write_all(b"GET p\r\n").unwrap();
    assert_eq!(c.reply().unwrap(), "100");
    // Oversized requests are protocol errors; the connection closes.
    c.stream.write_all(b"*999999999\r\n").unwrap();
    assert!(c.reply().unwrap().starts_with("-ERR Protocol error"));
    assert!(c.reply().is_err(), "closed after a protocol error");
    assert_eq!(service.connect().call(&["QUIT"]).unwrap(), "+OK");
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.conf");
    std::fs::write(&path, "backups = 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["kv", "serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backups = 0"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn redis_client_library_works_and_survives_a_failover() {
    let service = Service::start(3, "one-sided");
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", service.port)).unwrap();
    let mut con = client.get_connection().expect("redis-rs connects");
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    let v: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    let (a, b): (i64, i64) = redis::pipe()
        .cmd("INCR")
        .arg("n")
        .cmd("INCR")
        .arg("n")
        .query(&mut con)
        .unwrap();
    assert_eq!((a, b), (1, 2));
    let _: () = redis::cmd("MSET")
        .arg("m1")
        .arg("x")
        .arg("m2")
        .arg("y")
        .query(&mut con)
        .unwrap();
    let got: Vec<Option<String>> = redis::cmd("MGET")
        .arg("m1")
        .arg("m2")
        .arg("m3")
        .query(&mut con)
        .unwrap();
    assert_eq!(got, vec![Some("x".into()), Some("y".into()), None]);
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 4);
    let e: redis::RedisResult<()> = redis::cmd("LPUSH").arg("l").arg("1").query(&mut con);
    assert!(e.unwrap_err().to_string().contains("unknown command"));
    for i in 0..500 {
        let _: () = redis::cmd("SET").arg(format!("key{i}")).arg(i).query(&mut con).unwrap();
    }
    service.kill_member(0);
    service.wait_new_master();
    let mut con = client.get_connection().expect("reconnect to the new master");
    for i in 0..500 {
        let v: Option<i64> = redis::cmd("GET").arg(format!("key{i}")).query(&mut con).unwrap();
        assert_eq!(v, Some(i), "durability: acknowledged write lost (key{i})");
    }
    let n: i64 = redis::cmd("INCR").arg("n").query(&mut con).unwrap();
    assert_eq!(n, 3);
}

/// Expiry is decided by the master and replicated: after the master is
/// SIGKILLed, the new master holds the same absolute expiry times (TTLs
/// continue, none is lost), a key the old master expired stays deleted
/// (not resurrected), a PERSISTed key has none, and a key due after the
/// failover expires on the new master.
#[test]
fn expiries_survive_a_failover() {
    let service = Service::start(2, "one-sided");
    let mut c = service.connect();
    assert_eq!(c.call(&["SET", "long", "v", "EX", "1000"]).unwrap(), "+OK");
    assert_eq!(c.call(&["SET", "soon", "v", "PX", "1500"]).unwrap(), "+OK");
    assert_eq!(c.call(&["SET", "gone", "v", "PX", "1"]).unwrap(), "+OK");
    assert_eq!(c.call(&["SET", "kept", "v", "EX", "1000"]).unwrap(), "+OK");
    assert_eq!(c.call(&["PERSIST", "kept"]).unwrap(), ":1");
    // The master deletes "gone" (with a delete record) once it is due.
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.call(&["EXISTS", "gone"]).unwrap() != ":0" {
        assert!(Instant::now() < deadline, "the master never expired 'gone'");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(c.call(&["INFO"]).unwrap().contains("db0:keys=3,expires=2"));
    service.kill_member(0);
    service.wait_new_master();
    let mut c = service.connect();
    assert_eq!(
        c.call(&["GET", "gone"]).unwrap(),
        "nil",
        "an expired key came back after the failover"
    );
    let ttl: i64 = c.call(&["TTL", "long"]).unwrap()[1..].parse().unwrap();
    assert!(
        (1..=1000).contains(&ttl),
        "the expiry of 'long' was lost or changed: TTL {ttl}"
    );
    assert_eq!(c.call(&["TTL", "kept"]).unwrap(), ":-1", "PERSIST was lost");
    assert_eq!(c.call(&["GET", "kept"]).unwrap(), "v");
    // "soon" expires on the new master (its time was in the log).
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.call(&["EXISTS", "soon"]).unwrap() != ":0" {
        assert!(Instant::now() < deadline, "'soon' never expired on the new master");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Concurrent clients read, write and increment three keys while the
/// master is SIGKILLed; the history must be linearizable.
fn linearizable_across_failover(mode: &str) {
    linearizable_across_failover_on(mode, "shm");
}

fn linearizable_across_failover_on(mode: &str, transport: &str) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().to_path_buf();
    let service = Service::start_with(3, mode, &["--transport", transport], &path, Some(dir));
    let started = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let clients = 4;
    let ops_per_client = 250;
    let mut threads = Vec::new();
    for client in 0..clients {
        let (port, done) = (service.port, done.clone());
        threads.push(std::thread::spawn(move || {
            let mut history = Vec::new();
            let mut rng = 0x9E37_79B9u64.wrapping_mul(client as u64 + 1) | 1;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut conn = Some(Resp::connect(port, RESP_READ_TIMEOUT, RESP_CONNECT_WAIT));
            for i in 0..ops_per_client {
                let key = format!("lin{}", next() % 3);
                let kind = match next() % 3 {
                    0 => OpKind::Get,
                    1 => OpKind::Set(format!("{}", client * 100_000 + i).into_bytes()),
                    _ => OpKind::Incr,
                };
                let c = conn.get_or_insert_with(|| Resp::connect(port, RESP_READ_TIMEOUT, RESP_CONNECT_WAIT));
                let invoke_ns = started.elapsed().as_nanos() as u64;
                let reply = match &kind {
                    OpKind::Get => c.call(&["GET", &key]),
                    OpKind::Set(v) => c.call(&["SET", &key, std::str::from_utf8(v).unwrap()]),
                    OpKind::Incr => c.call(&["INCR", &key]),
                };
                let complete_ns = started.elapsed().as_nanos() as u64;
                let result = match (&kind, reply) {
                    (_, Err(_)) => None,
                    // An error reply (before the GET arm: a GET answered
                    // with an error must not count as reading "-ERR …").
                    (_, Ok(r)) if r.starts_with('-') => None,
                    (OpKind::Get, Ok(r)) if r == "nil" => Some(OpResult::Value(None)),
                    (OpKind::Get, Ok(r)) => Some(OpResult::Value(Some(r.into_bytes()))),
                    (OpKind::Set(_), Ok(r)) if r == "+OK" => Some(OpResult::Ok),
                    (OpKind::Incr, Ok(r)) if r.starts_with(':') => Some(OpResult::Integer(r[1..].parse().unwrap())),
                    (_, Ok(r)) => panic!("unexpected reply {r}"),
                };
                if result.is_none() {
                    conn = None;
                }
                let complete_ns = result.as_ref().map(|_| complete_ns);
                history.push(Op {
                    client,
                    key: key.into_bytes(),
                    kind,
                    invoke_ns,
                    complete_ns,
                    result,
                });
                done.fetch_add(1, Ordering::Relaxed);
            }
            history
        }));
    }
    while done.load(Ordering::Relaxed) < (clients * ops_per_client / 3) as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    service.kill_member(0);
    let history: Vec<Op> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    service.wait_new_master();
    let answered = history.iter().filter(|o| o.result.is_some()).count();
    assert!(answered > history.len() / 2, "most operations were answered");
    check(&history).expect("linearizability across a failover");
}

#[test]
fn history_across_a_failover_is_linearizable_one_sided() {
    linearizable_across_failover("one-sided");
}

#[test]
fn history_across_a_failover_is_linearizable_rpc() {
    linearizable_across_failover("rpc");
}

/// Over the tcp fabric, where pipelined writes are group-committed (one
/// wait for every backup's echo per batch).
#[test]
fn history_across_a_failover_is_linearizable_tcp() {
    linearizable_across_failover_on("one-sided", "tcp");
}

/// Over libfabric (a build with `--features ofi`; its tcp provider): a
/// write is acknowledged when the master's completion queue reports it
/// delivered to every backup. (This test found that removing a killed
/// master's address from the survivors' address vectors at once made
/// libfabric 1.17's tcp provider crash or stall: `OfiFabric` now retires
/// addresses late.)
#[cfg(feature = "ofi")]
#[test]
fn history_across_a_failover_is_linearizable_ofi() {
    linearizable_across_failover_on("one-sided", "ofi");
}

#[test]
fn tcp_transport_serves_and_survives_a_failover() {
    transport_serves_and_survives_a_failover("tcp");
}

#[cfg(feature = "ofi")]
#[test]
fn ofi_transport_serves_and_survives_a_failover() {
    transport_serves_and_survives_a_failover("ofi");
}

fn transport_serves_and_survives_a_failover(transport: &str) {
    let service = Service::start_with(
        2,
        "one-sided",
        &["--transport", transport],
        &tempfile::tempdir_in("/dev/shm").unwrap().keep(),
        None,
    );
    let data_dir = service.data_dir.clone();
    let mut c = service.connect();
    assert!(c.call(&["INFO"]).unwrap().contains(&format!("transport:{transport}")));
    for i in 0..300 {
        assert_eq!(c.call(&["SET", &format!("k{i}"), &format!("v{i}")]).unwrap(), "+OK");
    }
    service.kill_member(0);
    service.wait_new_master();
    let mut c = service.connect();
    for i in 0..300 {
        assert_eq!(
            c.call(&["GET", &format!("k{i}")]).unwrap(),
            format!("v{i}"),
            "durability: k{i}"
        );
    }
    assert_eq!(c.call(&["SET", "after", "failover"]).unwrap(), "+OK");
    drop(c);
    drop(service);
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn a_spare_replaces_a_killed_backup() {
    let service = Service::start_with(
        2,
        "one-sided",
        &["--spares", "1"],
        &tempfile::tempdir_in("/dev/shm").unwrap().keep(),
        None,
    );
    let data_dir = service.data_dir.clone();
    let mut c = service.connect();
    for i in 0..100 {
        assert_eq!(c.call(&["SET", &format!("k{i}"), "before"]).unwrap(), "+OK");
    }
    assert!(c.call(&["INFO"]).unwrap().contains("connected_slaves:2"));
    service.kill_member(1);
    // Writes go on; the master replaces the dead backup with the spare at
    // a write after it notices (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    loop {
        assert_eq!(c.call(&["SET", &format!("d{}", i % 10), "during"]).unwrap(), "+OK");
        let info = c.call(&["INFO"]).unwrap();
        if info.contains("connected_slaves:2") && !info.contains("epoch:0\r\n") {
            break;
        }
        assert!(Instant::now() < deadline, "the spare did not replace backup 1: {info}");
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    // The new backup set holds everything: kill the master.
    service.kill_member(0);
    // Backups 2 and 3 (the spare) hold the same log: either may win (the
    // newest log, then the lower rank: 3 wins when 2's log trails).
    let line = service.wait_new_master();
    assert!(
        !line.contains("member 1 is master"),
        "the killed backup came back as master: {line:?}"
    );
    let mut c = service.connect();
    for i in 0..100 {
        assert_eq!(
            c.call(&["GET", &format!("k{i}")]).unwrap(),
            "before",
            "durability: k{i}"
        );
    }
    drop(c);
    drop(service);
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn restart_from_the_data_dir_recovers_the_store() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    {
        let service = Service::start_with(2, "one-sided", &[], dir.path(), None);
        let mut c = service.connect();
        for i in 0..200 {
            assert_eq!(c.call(&["SET", &format!("k{i}"), &format!("v{i}")]).unwrap(), "+OK");
        }
        assert_eq!(c.call(&["DEL", "k7"]).unwrap(), ":1");
        // Dropping the service stops it cleanly (SIGTERM to the supervisor).
    }
    let service = Service::start_with(2, "one-sided", &[], dir.path(), None);
    let line = service.wait_line_seen("recovered");
    assert!(line.contains("recovered 199 objects"), "{line}");
    let mut c = service.connect();
    for i in 0..200 {
        let want = if i == 7 { "nil".to_string() } else { format!("v{i}") };
        assert_eq!(
            c.call(&["GET", &format!("k{i}")]).unwrap(),
            want,
            "durability: k{i} after restart"
        );
    }
    assert_eq!(c.call(&["SET", "after", "restart"]).unwrap(), "+OK");
}

/// Every process killed at once (the supervisor SIGKILLed; its members die
/// with it): nothing is sealed, and a restart recovers what the backups'
/// flushers had put on disk, including the open segment's prefix.
#[test]
fn restart_after_every_process_was_killed_recovers_what_reached_disk() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let group;
    {
        let mut service = Service::start_with(2, "one-sided", &[], dir.path(), None);
        group = service.group.clone();
        let mut c = service.connect();
        for i in 0..100 {
            assert_eq!(c.call(&["SET", &format!("k{i}"), &format!("v{i}")]).unwrap(), "+OK");
        }
        assert_eq!(c.call(&["SET", "marker", "last-write"]).unwrap(), "+OK");
        // Wait (bounded) until both backups' flushers have written the
        // open segment up to the last write.
        let deadline = Instant::now() + Duration::from_secs(60);
        let on_disk = |rank: usize| {
            let seg = dir.path().join(format!("member-{rank}/epoch-0/segment-0"));
            std::fs::read(seg).is_ok_and(|b| b.windows(10).any(|w| w == b"last-write"))
        };
        while !(on_disk(1) && on_disk(2)) {
            assert!(Instant::now() < deadline, "the open segment never reached disk");
            std::thread::sleep(Duration::from_millis(10));
        }
        service.cluster.get_mut().kill(0).unwrap();
        // Members die with the supervisor (PR_SET_PDEATHSIG): wait for it.
        for pid in &service.member_pids {
            while std::path::Path::new(&format!("/proc/{pid}")).exists()
                && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"))
            {
                assert!(Instant::now() < deadline, "member {pid} outlived its supervisor");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    // The killed supervisor never removed the group file.
    let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(
        std::path::Path::new("/dev/shm"),
        &group,
    ));
    let service = Service::start_with(2, "one-sided", &[], dir.path(), None);
    let line = service.wait_line_seen("recovered");
    assert!(line.contains("unsealed"), "{line}");
    let mut c = service.connect();
    for i in 0..100 {
        assert_eq!(
            c.call(&["GET", &format!("k{i}")]).unwrap(),
            format!("v{i}"),
            "k{i} after a total crash"
        );
    }
    assert_eq!(c.call(&["GET", "marker"]).unwrap(), "last-write");
}
