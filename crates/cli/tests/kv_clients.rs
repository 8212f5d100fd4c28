//! Real Redis clients against `spindle kv serve`: redis-py (the newest
//! from PyPI, RESP2 and RESP3), `redis-cli`, `redis-benchmark` and
//! go-redis v9 (RESP3 by default), plus the server's client limits: a
//! client over `clients_max` is told so, and the idle timeout frees the
//! slots of clients that hold half-sent commands.
//!
//! A client that is not installed FAILS its test with how to install it
//! (CI installs them all: see `.ci/run`), unless `SPINDLE_SKIP_CLIENTS=1`
//! is set (a developer's machine without them).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output as ProcessOutput, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::kv::reserve_port;
use spindle_bench::cluster::{Cluster, Output};

/// How long a test waits for a line from the supervisor.
const LINE_WAIT: Duration = Duration::from_secs(60);
/// How long one client program may run.
const CLIENT_WAIT: Duration = Duration::from_secs(300);

/// A running `spindle kv serve` (shm, 2 backups), stopped on drop.
struct Service {
    _cluster: Cluster,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Service {
    /// A service with `config` lines in its configuration file.
    fn start(config: &str) -> Service {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let port = reserve_port(4000);
        let config_path = dir.path().join("kv.conf");
        std::fs::write(&config_path, config).unwrap();
        let group = format!("kvc-{}-{port}", std::process::id());
        let mut cluster = Cluster::with_exe(env!("CARGO_BIN_EXE_spindle"), 1)
            .streams(Output::Capture, Output::Capture)
            .fail_on_panics()
            .stop_with(libc::SIGTERM, Duration::from_secs(10));
        let data = dir.path().join("data");
        let args = [
            "kv".to_string(),
            "serve".into(),
            "--config".into(),
            config_path.display().to_string(),
            "--port".into(),
            port.to_string(),
            "--group".into(),
            group,
            "--backups".into(),
            "2".into(),
            "--data-dir".into(),
            data.display().to_string(),
        ];
        cluster.start(0, args).expect("spawn spindle kv serve");
        cluster
            .wait_line(0, "is master of epoch", LINE_WAIT)
            .unwrap_or_else(|e| panic!("{e}"));
        Service {
            _cluster: cluster,
            port,
            _dir: dir,
        }
    }
}

/// Whether `program` runs (`program args` exits, whatever its status).
fn installed(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Fail (or, with SPINDLE_SKIP_CLIENTS=1, skip with a note) when a client
/// is missing. Returns whether the test goes on.
fn require(what: &str, present: bool, install: &str) -> bool {
    if present {
        return true;
    }
    if std::env::var("SPINDLE_SKIP_CLIENTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED (SPINDLE_SKIP_CLIENTS=1): {what} is not installed; install it with: {install}");
        return false;
    }
    panic!(
        "{what} is not installed; install it with: {install} (or set SPINDLE_SKIP_CLIENTS=1 to skip the client tests)"
    );
}

/// Run a command to its end, bounded by [`CLIENT_WAIT`] (killed after).
fn run_bounded(command: &mut Command) -> ProcessOutput {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    let deadline = Instant::now() + CLIENT_WAIT;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{command:?} ran for more than {CLIENT_WAIT:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn expect_success(what: &str, out: &ProcessOutput) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed ({}): {text}", out.status);
    text
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

#[test]
fn redis_py_works_with_resp2_and_resp3() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let present = Command::new(&python)
        .args(["-c", "import redis"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !require("redis-py (Python package 'redis')", present, "pip install -U redis") {
        return;
    }
    let service = Service::start("");
    let out = run_bounded(
        Command::new(&python)
            .arg(clients_dir().join("redis_py_client.py"))
            .arg(service.port.to_string()),
    );
    let text = expect_success("redis-py", &out);
    assert!(text.contains("all checks passed"), "{text}");
}

/// `redis-cli` one command per run, RESP2 and RESP3 (`-3`: HELLO 3).
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = run_bounded(
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args),
    );
    expect_success("redis-cli", &out).trim_end().to_string()
}

#[test]
fn redis_cli_works() {
    if !require(
        "redis-cli",
        installed("redis-cli", &["--version"]),
        "apt-get install -y redis-tools",
    ) {
        return;
    }
    let service = Service::start("");
    let p = service.port;
    assert_eq!(redis_cli(p, &["PING"]), "PONG");
    assert_eq!(redis_cli(p, &["SET", "cli:a", "hello", "EX", "100"]), "OK");
    assert_eq!(redis_cli(p, &["GET", "cli:a"]), "hello");
    assert_eq!(redis_cli(p, &["TTL", "cli:a"]), "100");
    assert_eq!(redis_cli(p, &["INCRBY", "cli:n", "5"]), "5");
    assert_eq!(redis_cli(p, &["APPEND", "cli:a", "!"]), "6");
    assert_eq!(redis_cli(p, &["STRLEN", "cli:a"]), "6");
    assert_eq!(redis_cli(p, &["-3", "GET", "cli:nope"]), "", "RESP3 null");
    assert_eq!(redis_cli(p, &["-3", "GET", "cli:a"]), "hello!");
    assert_eq!(redis_cli(p, &["KEYS", "cli:*"]).lines().count(), 2);
    assert_eq!(redis_cli(p, &["DEL", "cli:a", "cli:n", "cli:nope"]), "2");
    assert!(redis_cli(p, &["INFO"]).contains("server_name:spindle"));
    assert!(redis_cli(p, &["LPUSH", "l", "1"]).contains("unknown command"));
    // Interactive-style session on stdin (redis-cli probes COMMAND DOCS).
    let mut child = Command::new("redis-cli")
        .args(["-p", &p.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SET cli:s 1\nINCR cli:s\nGET cli:s\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    // Not a terminal: raw replies.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\n2\n2\n");
}

#[test]
fn redis_benchmark_works() {
    if !require(
        "redis-benchmark",
        installed("redis-benchmark", &["--version"]),
        "apt-get install -y redis-tools",
    ) {
        return;
    }
    let service = Service::start("");
    let out = run_bounded(Command::new("redis-benchmark").args([
        "-h",
        "127.0.0.1",
        "-p",
        &service.port.to_string(),
        "-t",
        "ping,set,get,incr,mset",
        "-n",
        "2000",
        "-c",
        "4",
        "-P",
        "4",
        "--csv",
    ]));
    let text = expect_success("redis-benchmark", &out);
    for test in ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "MSET (10 keys)"] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("\"{test}\""))),
            "no {test} result: {text}"
        );
    }
    assert!(!text.contains("ERR"), "server errors: {text}");
    // The benchmark's keys are there: it really wrote.
    let mut c = connect(service.port);
    assert_eq!(
        request(&mut c, b"EXISTS key:__rand_int__ counter:__rand_int__\r\n"),
        b":2\r\n"
    );
}

#[test]
fn go_redis_works_with_resp3() {
    if !require(
        "go (for go-redis)",
        installed("go", &["version"]),
        "install Go (https://go.dev/dl/, or apt-get install -y golang-go) and run `go mod download` in crates/cli/tests/clients/go",
    ) {
        return;
    }
    let service = Service::start("");
    let dir = clients_dir().join("go");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("goclient");
    let build = run_bounded(
        Command::new("go")
            .current_dir(&dir)
            .args(["build", "-o"])
            .arg(&target)
            .arg("."),
    );
    expect_success(
        "go build of the go-redis client (modules: `go mod download` in crates/cli/tests/clients/go)",
        &build,
    );
    let out = run_bounded(Command::new(&target).arg(format!("127.0.0.1:{}", service.port)));
    let text = expect_success("go-redis client", &out);
    assert!(text.contains("all checks passed"), "{text}");
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Send `bytes`, read one reply line.
fn request(stream: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
    stream.write_all(bytes).unwrap();
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        if stream.read(&mut byte).unwrap() == 0 {
            break;
        }
        reply.push(byte[0]);
    }
    reply
}

/// `clients_max` clients each hold a half-sent command: the next client
/// is refused with Redis's message; once the idle timeout closes the
/// stuck clients, new clients are served again.
#[test]
fn idle_timeout_frees_slots_held_by_half_sent_commands() {
    let clients_max = 64;
    let service = Service::start(&format!("clients_max = {clients_max}\nidle_timeout_s = 3\n"));
    let mut stuck = Vec::new();
    for _ in 0..clients_max {
        let mut s = connect(service.port);
        s.write_all(b"*2\r\n$3\r\nGET\r\n$5\r\nhal").unwrap();
        stuck.push(s);
    }
    // Every slot is taken (the server admits them in order; a bounded
    // wait until it has, as a refused client sees).
    let mut refused = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = connect(service.port);
        let reply = request(&mut c, b"PING\r\n");
        if reply == b"-ERR max number of clients reached\r\n" {
            refused.push(reply);
            break;
        }
        // Served: a slot was still free (or an earlier stuck client already
        // timed out on a very slow machine); that client holds a slot too.
        assert!(reply == b"+PONG\r\n", "{}", String::from_utf8_lossy(&reply));
        assert!(Instant::now() < deadline, "never refused at clients_max");
        stuck.push(c);
    }
    assert_eq!(refused.len(), 1);
    // The idle timeout closes the stuck clients: their reads see EOF.
    for s in &mut stuck {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "a stuck client got {:?}",
            String::from_utf8_lossy(&rest)
        );
    }
    // New clients are served again (bounded retries while the server
    // reaps the closed clients' threads).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = connect(service.port);
        let reply = request(&mut c, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
        if reply == b"+OK\r\n" {
            break;
        }
        assert_eq!(reply, b"-ERR max number of clients reached\r\n");
        assert!(Instant::now() < deadline, "slots were never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Many new clients at once: all served.
    let mut fresh: Vec<TcpStream> = (0..clients_max / 2).map(|_| connect(service.port)).collect();
    for c in &mut fresh {
        assert_eq!(request(c, b"PING\r\n"), b"+PONG\r\n");
    }
}
