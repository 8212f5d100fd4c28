//! RTPS interoperability with Cyclone DDS (`ddsperf` from Debian's
//! `cyclonedds-tools`, installed by `.ci/run`), on loopback only: Spindle
//! with `--loopback-only`, Cyclone with `CYCLONEDDS_URI` =
//! `spindle dds sub --print-cyclone-uri`. Each test has its own RTPS
//! domain id, so the tests may run at once. The late-joiner test's reader
//! is Python's `cyclonedds` (PyPI, installed by `.ci/run`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

const SPINDLE: &str = env!("CARGO_BIN_EXE_spindle");
/// The longest any process of a test may run.
const PROCESS_WAIT: Duration = Duration::from_secs(120);

/// Whether `program args…` runs and exits 0.
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn ddsperf() -> String {
    let found = runs("sh", &["-c", "command -v ddsperf"]);
    assert!(
        found,
        "ddsperf not found: install Cyclone DDS's tools (`apt-get install cyclonedds-tools`; .ci/run does)"
    );
    "ddsperf".into()
}

fn cyclone_uri() -> String {
    let out = Command::new(SPINDLE)
        .args(["dds", "sub", "--print-cyclone-uri"])
        .output()
        .expect("run spindle");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Kills the child when dropped (a failed test leaves nothing running).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait for `child` to exit (bounded): its output.
fn finish(child: Reaped, what: &str) -> Output {
    let started = Instant::now();
    let mut child = child;
    loop {
        if child.0.try_wait().expect("try_wait").is_some() {
            break;
        }
        assert!(
            started.elapsed() < PROCESS_WAIT,
            "{what} did not finish within {PROCESS_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = Output {
        status: child.0.wait().expect("wait"),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    if let Some(mut s) = child.0.stdout.take() {
        let _ = s.read_to_end(&mut out.stdout);
    }
    if let Some(mut s) = child.0.stderr.take() {
        let _ = s.read_to_end(&mut out.stderr);
    }
    out
}

fn json_file(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// Cyclone's `ddsperf pub` (reliable, keyed `KeyedSeq`, keep-all) writes;
/// `spindle dds sub --rtps` takes 10,000 samples in order per key.
fn cyclone_to_spindle(domain: u16, size: usize, rate_hz: u32) {
    cyclone_to_spindle_with(domain, size, rate_hz, false);
}

/// As [`cyclone_to_spindle`]; with `malformed`, a thread sends malformed
/// RTPS datagrams to every UDP port of the Spindle process meanwhile.
fn cyclone_to_spindle_with(domain: u16, size: usize, rate_hz: u32, malformed: bool) {
    let ddsperf = ddsperf();
    let (_dir, json) = json_file("sub.json");
    let sub = Reaped(
        Command::new(SPINDLE)
            .args([
                "dds",
                "sub",
                "--rtps",
                "--loopback-only",
                "--domain",
                &domain.to_string(),
            ])
            .args(["--count", "10000", "--seconds", "90", "--json"])
            .arg(&json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn spindle dds sub"),
    );
    let _publisher = Reaped(
        Command::new(&ddsperf)
            .env("CYCLONEDDS_URI", cyclone_uri())
            .args(["-i", &domain.to_string(), "-k", "all", "-D", "100", "pub"])
            .args([&format!("{rate_hz}Hz"), "size", &size.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ddsperf pub"),
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let garbage = malformed.then(|| {
        let (pid, stop) = (sub.0.id(), stop.clone());
        std::thread::spawn(move || send_malformed(pid, &stop))
    });
    let out = finish(sub, "spindle dds sub");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent_malformed = garbage.map(|g| {
        let (sent, ports) = g.join().expect("the malformed-datagram thread");
        assert!(
            sent >= 100 && ports > 0,
            "malformed datagrams reached Spindle: {sent} to {ports} ports"
        );
        sent
    });
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "spindle dds sub failed: {}{stderr}",
        String::from_utf8_lossy(&out.stdout),
    );
    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let counted = result["bridge"]["malformed_datagrams"].as_u64();
    match sent_malformed {
        // Counted, and said in a line. Not every datagram sent is counted:
        // some reach a port after the subscriber's participant closed it,
        // and a short-DATA or bogus-payload datagram parses as RTPS (its
        // sample is dropped by the CDR decoding or never completes).
        Some(sent) => {
            let counted = counted.unwrap_or_else(|| panic!("no malformed-datagram count: {result}"));
            assert!(
                counted > 0 && counted <= sent,
                "{counted} counted of {sent} sent: {result}"
            );
            assert!(
                stderr.contains("dropped a malformed RTPS datagram"),
                "a line says it: {stderr}"
            );
            let first = stderr.lines().find(|l| l.contains("malformed")).unwrap_or_default();
            eprintln!("{counted} of {sent} malformed datagrams counted; the first line: {first}");
        }
        None => assert_eq!(counted, Some(0), "nothing malformed was sent: {result}"),
    }
    assert!(result["samples"].as_u64().unwrap() >= 10_000, "{result}");
    assert_eq!(result["in_order"], true, "every key's seq rises by one: {result}");
    assert_eq!(result["bridge"]["rtps_dropped"], 0, "{result}");
    assert_eq!(
        result["bridge"]["rtps_samples_lost"], 0,
        "no gap in the writer's sequence numbers, and none reported: {result}"
    );
    let per_sample = result["bytes"].as_u64().unwrap() / result["samples"].as_u64().unwrap();
    assert_eq!(per_sample as usize, size, "the right bytes: {result}");
}

/// `spindle dds pub --rtps` writes 10,000 samples; Cyclone's `ddsperf
/// sub` (reliable, keep-all) counts them and the gaps it saw.
/// Returns the publisher's JSON result.
fn spindle_to_cyclone(domain: u16, size: usize, rate_hz: u32) -> serde_json::Value {
    let ddsperf = ddsperf();
    let mut sub = Reaped(
        Command::new(&ddsperf)
            .env("CYCLONEDDS_URI", cyclone_uri())
            .args([
                "-i",
                &domain.to_string(),
                "-k",
                "all",
                "-D",
                "60",
                "-Qsamples:10000",
                "sub",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ddsperf sub"),
    );
    // ddsperf's report lines as they come (it writes one line at a time),
    // and all of them once it exits.
    let stdout = sub.0.stdout.take().expect("ddsperf stdout is piped");
    let (line_tx, lines) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = line_tx.send(line);
        }
        all
    });
    let (_dir, json) = json_file("pub.json");
    let publisher = Reaped(
        Command::new(SPINDLE)
            .args([
                "dds",
                "pub",
                "--rtps",
                "--loopback-only",
                "--domain",
                &domain.to_string(),
            ])
            .args(["--size", &size.to_string(), "--count", "10000", "--seconds", "60"])
            .args(["--rate", &rate_hz.to_string(), "--json"])
            .arg(&json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn spindle dds pub"),
    );
    let out = finish(publisher, "spindle dds pub");
    assert!(
        out.status.success(),
        "spindle dds pub failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(result["acked"], true, "every RTPS reader acknowledged: {result}");
    assert_eq!(result["bridge"]["to_rtps"], 10_000, "{result}");
    // ddsperf prints "... total N lost L ..." in the second after new
    // samples were taken (and nothing when none were). Every reader
    // acknowledged the last sample, but ddsperf may take and count it
    // later on a loaded host: wait for its report of all 10,000, bounded,
    // then stop it. A run that never reports them fails below.
    let is_report = |l: &str| l.contains(" total ") && l.contains(&format!("size {size} "));
    let waited = Instant::now();
    while waited.elapsed() < DDSPERF_REPORT_WAIT {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(l) if is_report(&l) && report_field(&l, "total") >= 10_000 => break,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // SAFETY: kill(2) on the ddsperf child's pid: no memory effects.
    unsafe {
        libc::kill(sub.0.id() as i32, libc::SIGINT);
    }
    let _ = sub.0.wait();
    let out = finish(sub, "ddsperf sub");
    let stdout = reader.join().expect("ddsperf stdout reader");
    let text = stdout + &String::from_utf8_lossy(&out.stderr);
    let last = text
        .lines()
        .rfind(|l| is_report(l))
        .unwrap_or_else(|| panic!("no ddsperf report line: {text}"));
    assert_eq!(
        report_field(last, "total"),
        10_000,
        "ddsperf got every sample once: {last}"
    );
    assert_eq!(report_field(last, "lost"), 0, "ddsperf saw no gap: {last}");
    result
}

/// How long `spindle_to_cyclone` waits, after the publisher is done, for
/// ddsperf to report every sample (a liveness bound, not a speed target).
const DDSPERF_REPORT_WAIT: Duration = Duration::from_secs(30);

/// The number after `name` in a ddsperf report line.
fn report_field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .skip_while(|w| *w != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

#[test]
fn cyclone_publishes_16_byte_samples_and_spindle_takes_them_in_order() {
    cyclone_to_spindle(61, 16, 5000);
}

/// Malformed RTPS datagrams at Spindle's RTPS ports while Cyclone
/// publishes: every kind below is dropped (by rustdds's message parser,
/// or by the CDR decoding that `cdr_decoding_fuzz` in the spindle crate
/// fuzzes), the participant does not crash, and every one of the
/// 10,000 real samples still arrives once, in order, with its bytes.
#[test]
fn malformed_rtps_datagrams_are_dropped_and_every_sample_still_arrives() {
    cyclone_to_spindle_with(63, 16, 5000, true);
}

/// The UDP ports process `pid` has open (from `ss`).
fn udp_ports_of(pid: u32) -> Vec<u16> {
    let out = Command::new("ss")
        .args(["-H", "-u", "-a", "-n", "-p"])
        .output()
        .expect("run ss (iproute2)");
    let needle = format!("pid={pid},");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&needle))
        .filter_map(|l| l.split_whitespace().nth(3)?.rsplit(':').next()?.parse().ok())
        .collect()
}

/// Datagram `i` of a deterministic series of malformed RTPS messages.
fn malformed_datagram(i: u64, rng: &mut u64) -> Vec<u8> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    // "RTPS", protocol 2.3, vendor, a 12-byte GUID prefix.
    let mut header = b"RTPS\x02\x03\x01\x0f".to_vec();
    header.extend((0..12).map(|_| next() as u8));
    let mut random = |n: usize| -> Vec<u8> { (0..n).map(|_| next() as u8).collect() };
    match i % 7 {
        // Nothing, or a header cut short.
        0 => Vec::new(),
        1 => header[..(i as usize % 20)].to_vec(),
        // A submessage whose length runs past the datagram.
        2 => [header, vec![0x15, 0x01, 0xff, 0x7f], random(8)].concat(),
        // A DATA submessage shorter than its fixed fields.
        3 => [header, vec![0x15, 0x05, 0x04, 0x00], random(4)].concat(),
        // A DATA submessage of plausible shape from an unknown writer,
        // with a bogus serialized payload (a huge sequence length).
        4 => {
            let mut d = vec![0x15, 0x05, 0x28, 0x00, 0x00, 0x00, 0x10, 0x00];
            d.extend(random(8)); // reader and writer ids
            d.extend([0, 0, 0, 0, 1, 0, 0, 0]); // sequence number 1
            d.extend([0x00, 0x01, 0x00, 0x00]); // CDR, little endian
            d.extend([1, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
            d.extend(random(4));
            [header, d].concat()
        }
        // Random bytes after a valid header, and random bytes alone.
        5 => [header, random(20 + (i as usize * 37) % 1000)].concat(),
        _ => random(1 + (i as usize * 53) % 1400),
    }
}

/// Send malformed datagrams to every UDP port of `pid` until `stop`
/// (bounded: at most 40,000, about 2,000 a second); (sent, the most
/// ports seen at once).
fn send_malformed(pid: u32, stop: &std::sync::atomic::AtomicBool) -> (u64, usize) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket");
    let mut ports = Vec::new();
    // The most ports seen at once (the last look may come after the
    // participant exited, and find none).
    let mut ports_max = 0;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut sent = 0u64;
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 40_000 {
        if i.is_multiple_of(200) {
            // The participant opens its ports as it starts: look again.
            ports = udp_ports_of(pid);
            ports_max = ports_max.max(ports.len());
        }
        let datagram = malformed_datagram(i, &mut rng);
        for &port in &ports {
            if socket.send_to(&datagram, ("127.0.0.1", port)).is_ok() {
                sent += 1;
            }
        }
        i += 1;
        std::thread::sleep(Duration::from_micros(500));
    }
    (sent, ports_max)
}

#[test]
fn spindle_publishes_16_byte_samples_and_cyclone_gets_every_one() {
    spindle_to_cyclone(62, 16, 5000);
}

/// Unpaced 1 KiB samples, 10 MiB in all: the bridge waits for Cyclone's
/// acknowledgments after each `RTPS_IN_FLIGHT_BYTES_MAX` (1 MiB). Without
/// those waits a burst overflowed ddsperf's UDP receive buffer and
/// rustdds's repair (8 KiB a round) held the reader at ~760 samples/s.
#[test]
fn spindle_publishes_1_kib_samples_unpaced_and_cyclone_gets_every_one() {
    let result = spindle_to_cyclone(60, 1024, 0);
    let waits = result["bridge"]["rtps_window_waits"].as_u64().unwrap();
    assert!(waits >= 9, "a wait per MiB written: {result}");
}

/// Unpaced: the 10,000 go out as fast as the bridge writes them, right
/// after the match. Before the bridge waited for a new reader's first
/// acknowledgment (`RTPS_SYNC_WAIT`), Cyclone's volatile reader skipped
/// a block of them and acknowledged it anyway (ddsperf: "lost 49"; a
/// block from seq 1486 in `bench/results/rtps-unpaced-gaps.json`).
#[test]
fn spindle_publishes_16_byte_samples_unpaced_and_cyclone_gets_every_one() {
    spindle_to_cyclone(69, 16, 0);
}

/// 64 KB samples (RTPS fragments them: DATA_FRAG, reassembled by the
/// reader), 10,000 of them each way, paced.
#[test]
fn cyclone_publishes_64_kib_samples_and_spindle_takes_them_in_order() {
    cyclone_to_spindle(64, 65_536, 500);
}

#[test]
fn spindle_publishes_64_kib_samples_and_cyclone_gets_every_one() {
    spindle_to_cyclone(65, 65_536, 500);
}

/// The Python interpreter with Cyclone DDS's binding (PyPI `cyclonedds`,
/// installed by `.ci/run`): `$SPINDLE_CYCLONEDDS_PYTHON`, else `python3`.
fn cyclonedds_python() -> String {
    let python = std::env::var("SPINDLE_CYCLONEDDS_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = runs(&python, &["-c", "import cyclonedds.domain"]);
    assert!(
        found,
        "{python} cannot import cyclonedds: `python3 -m pip install cyclonedds==11.0.1` (.ci/run does), or set SPINDLE_CYCLONEDDS_PYTHON"
    );
    python
}

/// A Spindle writer (transient-local, keep-all) writes 1,000 samples over
/// 4 keys with no reader anywhere, then lingers; a Cyclone reader that
/// joins only after that (Python `cyclonedds`, transient-local) gets the
/// whole history, in order per key, with the right sizes. (Without
/// `--transient-local` on the writer the same reader gets nothing.)
#[test]
fn a_late_joining_transient_local_cyclone_reader_gets_the_history() {
    use std::io::BufRead;
    let python = cyclonedds_python();
    let domain = "66";
    let publisher = Reaped(
        Command::new(SPINDLE)
            .args(["dds", "pub", "--rtps", "--loopback-only", "--domain", domain])
            .args(["--transient-local", "--readers", "0", "--count", "1000", "--keys", "4"])
            .args(["--size", "64", "--linger-s", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn spindle dds pub"),
    );
    let mut publisher = publisher;
    let stdout = publisher.0.stdout.take().expect("piped stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    // Bounded: the writes are done when the publisher says it lingers.
    let started = Instant::now();
    loop {
        let left = PROCESS_WAIT.saturating_sub(started.elapsed());
        let line = lines
            .recv_timeout(left)
            .expect("spindle dds pub did not report its writes in time");
        if line.contains("serving late readers") {
            assert!(line.contains("1000 samples written"), "{line}");
            break;
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/cyclone_late_reader.py");
    let reader = Reaped(
        Command::new(&python)
            .env("CYCLONEDDS_URI", cyclone_uri())
            .args([script, domain, "1000", "40"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the python cyclonedds reader"),
    );
    let out = finish(reader, "the late cyclonedds reader");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the late reader failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        result["samples"], 1000,
        "the whole history reached the late reader: {result}"
    );
    assert_eq!(result["keys"], 4, "{result}");
    assert_eq!(result["in_order"], true, "every key's seq from 0 up by one: {result}");
    assert_eq!(result["sizes"], serde_json::json!([64]), "the right bytes: {result}");
}

/// `spindle dds perf pair` between two Spindle participants with their
/// RTPS gateways up, with and without the topic bridged out: every sample
/// written is received (no RTPS reader is matched, so the bridge's Spindle
/// reader never joins the topic); bad combinations are refused by name.
#[test]
fn dds_perf_runs_with_the_gateway_present_and_with_the_topic_bridged() {
    for (domain, bridge) in [("67", false), ("68", true)] {
        let (_dir, json) = json_file("perf.json");
        let mut command = Command::new(SPINDLE);
        command
            .args(["dds", "perf", "pair", "--size", "64", "--seconds", "1", "--rtps"])
            .args(["--domain", domain, "--json"])
            .arg(&json);
        if bridge {
            command.arg("--rtps-bridge");
        }
        let out = finish(
            Reaped(command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()),
            "spindle dds perf pair --rtps",
        );
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(result["rtps"], true);
        assert_eq!(result["rtps_bridge"], bridge);
        let written = result["written"].as_u64().unwrap();
        assert!(written > 0, "{result}");
        assert_eq!(
            result["received"].as_u64().unwrap(),
            written,
            "every sample once: {result}"
        );
    }
    let out = Command::new(SPINDLE)
        .args(["dds", "perf", "pair", "--rtps-bridge"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rtps"));
    let out = Command::new(SPINDLE)
        .args(["dds", "perf", "pair", "--rtps", "--domain", "300", "--seconds", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("0..=232"), "{text}");
}

#[test]
fn a_topic_bridged_twice_and_a_participant_without_rtps_give_clear_errors() {
    use spindle::dds::rtps::{KeyedSeq, RtpsConfig};
    use spindle::dds::{DomainParticipant, ReaderQos, WriterQos};
    let plain = DomainParticipant::builder(0x5000_0000 | std::process::id())
        .participants(1)
        .join()
        .unwrap();
    let topic = plain.create_topic::<KeyedSeq>("t").unwrap();
    let e = plain
        .bridge_rtps(&topic, WriterQos::default(), ReaderQos::default())
        .err()
        .expect("no RTPS configured");
    assert!(e.to_string().contains("ParticipantBuilder::rtps"), "{e}");
    drop(plain);
    let p = DomainParticipant::builder(0x5100_0000 | std::process::id())
        .participants(1)
        .rtps(RtpsConfig::new(63).loopback_only(true))
        .join()
        .unwrap();
    let topic = p.create_topic::<KeyedSeq>("t").unwrap();
    let bridge = p
        .bridge_rtps(&topic, WriterQos::default(), ReaderQos::default())
        .unwrap();
    let e = p
        .bridge_rtps(&topic, WriterQos::default(), ReaderQos::default())
        .err()
        .expect("bridged twice");
    assert!(e.to_string().contains("bridged to RTPS already"), "{e}");
    assert_eq!(bridge.failure(), None);
    drop(bridge);
    let bad = DomainParticipant::builder(0x5200_0000 | std::process::id())
        .participants(1)
        .rtps(RtpsConfig::new(500))
        .join()
        .unwrap();
    let topic = bad.create_topic::<KeyedSeq>("t").unwrap();
    let e = bad
        .bridge_rtps(&topic, WriterQos::default(), ReaderQos::default())
        .err()
        .expect("domain out of range");
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn a_size_below_the_fixed_part_a_linger_or_a_window_out_of_range_are_refused() {
    for (command, window) in [("sub", "100"), ("sub", "2048"), ("pub", "8"), ("pub", "0")] {
        let out = Command::new(SPINDLE)
            .args(["dds", command, "--seconds", "1", "--window", window])
            .output()
            .unwrap();
        assert!(!out.status.success(), "dds {command} --window {window} ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--window {window}: expected a power of two in 16..=1024")),
            "dds {command} --window {window}: {err}"
        );
    }
    let out = Command::new(SPINDLE)
        .args(["dds", "pub", "--rtps", "--size", "4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size 4 must be in 12"));
    for linger in ["-1", "3601", "NaN"] {
        let out = Command::new(SPINDLE)
            .args(["dds", "pub", "--rtps", &format!("--linger-s={linger}")])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--linger-s") && err.contains("0..=3600"),
            "{linger}: {err}"
        );
    }
}
