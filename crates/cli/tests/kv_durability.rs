//! Total failure of `spindle kv serve`, over and over: a client writes
//! distinct keys with SET (pipelines of random depth, so group commit
//! runs) and records every acknowledged write; at a random moment every
//! process of the service — its members and the supervisor — is killed
//! with SIGKILL; the service is restarted on the same data directory and
//! every acknowledged write so far is read back.
//!
//! - `durability = "disk"`: no acknowledged write may be lost, ever.
//! - `durability = "memory"` (the default): the writes acknowledged in the
//!   last moments before the kill may be lost (backups flush the open
//!   segment every 50 ms); what is lost must be a suffix of each round's
//!   acknowledged writes (the log is flushed in order), and the test
//!   reports how many and how long before the kill they were
//!   acknowledged: the measured loss window.
//!
//! `SPINDLE_DURABILITY_ROUNDS` (default 5) sets the rounds,
//! `SPINDLE_DURABILITY_SEED` the seed (printed), `SPINDLE_DURABILITY_DIR`
//! where the data directory goes (default: the system temp dir, a real
//! disk here, so `fdatasync` is real), `SPINDLE_DURABILITY_JSON` a file to
//! write the outcome to (bench/results/kv-durability-killall.json).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::kv::Resp;
use spindle_bench::cluster::{signal_pid, Cluster, Output};

/// How long the test waits for a line from the supervisor, a connection
/// or a reply: a hang fails the test instead of blocking it.
const WAIT: Duration = Duration::from_secs(60);
/// The kill comes this long at most after the round's first ack.
const KILL_AFTER_MS_MAX: u64 = 700;

/// The simulator's generator: a seed reproduces the run.
use spindle_fabric::sim::SimRng as Rng;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A RESP port below the ephemeral range (one picked by `bind(0)` can be
/// taken by an outgoing connection before the master binds it).
fn free_port(rng: &mut Rng) -> u16 {
    loop {
        let port = 20_000 + rng.below(10_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A running `spindle kv serve`.
struct Service {
    cluster: Cluster,
    port: u16,
    member_pids: Vec<u32>,
    group: String,
    data_dir: PathBuf,
}

const BACKUPS: usize = 2;

impl Service {
    fn start(durability: &str, data_dir: &Path, rng: &mut Rng) -> Service {
        let port = free_port(rng);
        let group = format!("kvd-{}-{}", std::process::id(), rng.below(1 << 40));
        let mut cluster = Cluster::with_exe(env!("CARGO_BIN_EXE_spindle"), 1)
            .streams(Output::Capture, Output::Capture)
            .fail_on_panics()
            .stop_with(libc::SIGTERM, Duration::from_secs(20));
        let args: Vec<String> = [
            "kv",
            "serve",
            "--port",
            &port.to_string(),
            "--group",
            &group,
            "--backups",
            &BACKUPS.to_string(),
            "--durability",
            durability,
            "--data-dir",
            &data_dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        cluster.start(0, args).expect("spawn spindle kv serve");
        let mut member_pids = Vec::new();
        while member_pids.len() < BACKUPS + 1 {
            let line = cluster.wait_line(0, "member ", WAIT).unwrap_or_else(|e| panic!("{e}"));
            if let Some(pid) = line.split("pid ").nth(1).and_then(|s| s.split_whitespace().next()) {
                member_pids.push(pid.parse().unwrap());
            }
        }
        cluster
            .wait_line(0, "is master of epoch", WAIT)
            .unwrap_or_else(|e| panic!("{e}"));
        Service {
            cluster,
            port,
            member_pids,
            group,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// Every process killed with SIGKILL: the backups first (the master
    /// must not acknowledge what no disk has), then the master, then the
    /// supervisor; returns when all are gone.
    fn kill_everything(mut self) {
        let master = std::fs::read_to_string(self.data_dir.join("master.rank"))
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let mut order: Vec<usize> = (0..self.member_pids.len()).filter(|r| *r != master).collect();
        order.push(master);
        for rank in order {
            // A child of the supervisor, which has not reaped it (it is
            // alive or a zombie): the pid still names that member.
            let _ = signal_pid(self.member_pids[rank], libc::SIGKILL);
        }
        self.cluster.kill(0).expect("kill the supervisor");
        let deadline = Instant::now() + WAIT;
        for pid in &self.member_pids {
            while Path::new(&format!("/proc/{pid}")).exists()
                && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"))
            {
                assert!(Instant::now() < deadline, "member {pid} survived SIGKILL");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // The killed supervisor never removed the group file.
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &self.group));
    }
}

fn key(round: usize, i: usize) -> String {
    format!("r{round}-k{i}")
}

fn value(round: usize, i: usize, seed: u64) -> String {
    format!("v{round}-{i}-{seed:x}")
}

/// The writer: SET `key(round, i)` for i = 0, 1, … in pipelines of random
/// depth (1..=16) until the service goes away; returns when each write
/// was acknowledged, in order (writes are acknowledged in order).
fn write_until_killed(port: u16, round: usize, seed: u64, acked: Arc<Mutex<Vec<Instant>>>) {
    let mut c = Resp::connect(port, WAIT, WAIT);
    let mut rng = Rng::new(seed ^ (round as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut next = 0;
    loop {
        let depth = 1 + rng.below(16) as usize;
        let (keys, values): (Vec<String>, Vec<String>) = (next..next + depth)
            .map(|i| (key(round, i), value(round, i, seed)))
            .unzip();
        let requests: Vec<Vec<&[u8]>> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| vec![&b"SET"[..], k.as_bytes(), v.as_bytes()])
            .collect();
        if c.send_pipeline(&requests.iter().map(Vec::as_slice).collect::<Vec<_>>())
            .is_err()
        {
            return;
        }
        for _ in 0..depth {
            match c.reply() {
                Ok(r) if r == "+OK" => acked.lock().unwrap().push(Instant::now()),
                // Killed (closed, reset) or refused: nothing more is acknowledged.
                _ => return,
            }
            next += 1;
        }
    }
}

/// What one round lost.
struct RoundLoss {
    acked: usize,
    lost: usize,
    /// How long before the kill the first lost write was acknowledged.
    window_ms: f64,
}

/// Read back every write of `rounds` that was acknowledged; returns what
/// each round lost (asserting that the lost writes are a suffix of the
/// round's acknowledged writes, and that nothing reads back wrong).
fn read_back(port: u16, seed: u64, rounds: &[(Vec<Instant>, Instant)], first_round: usize) -> Vec<RoundLoss> {
    let mut c = Resp::connect(port, WAIT, WAIT);
    let mut losses = Vec::new();
    for (offset, (acked, killed_at)) in rounds.iter().enumerate() {
        let round = first_round + offset;
        let mut present = Vec::with_capacity(acked.len());
        for chunk_start in (0..acked.len()).step_by(256) {
            let chunk_end = (chunk_start + 256).min(acked.len());
            let keys: Vec<String> = (chunk_start..chunk_end).map(|i| key(round, i)).collect();
            let requests: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k.as_bytes()]).collect();
            c.send_pipeline(&requests.iter().map(Vec::as_slice).collect::<Vec<_>>())
                .expect("send GETs");
            for i in chunk_start..chunk_end {
                let got = c.reply().expect("GET reply");
                if got == "nil" {
                    present.push(false);
                } else {
                    assert_eq!(got, value(round, i, seed), "round {round} write {i} reads back wrong");
                    present.push(true);
                }
            }
        }
        let kept = present.iter().take_while(|p| **p).count();
        assert!(
            present[kept..].iter().all(|p| !p),
            "round {round}: a write was lost while a later one survived (lost: {:?})",
            present
                .iter()
                .enumerate()
                .filter(|(_, p)| !**p)
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        );
        let window_ms = acked
            .get(kept)
            .map(|t| killed_at.saturating_duration_since(*t).as_secs_f64() * 1e3)
            .unwrap_or(0.0);
        losses.push(RoundLoss {
            acked: acked.len(),
            lost: acked.len() - kept,
            window_ms,
        });
    }
    losses
}

/// Rounds of write, kill everything, restart, read back; returns each
/// round's loss. Each restart reads back the round just killed; the last
/// one reads back every round again (what a round lost stays lost, nothing
/// more).
fn kill_all_rounds(durability: &str, rounds: usize, seed: u64) -> Vec<RoundLoss> {
    let base = std::env::var_os("SPINDLE_DURABILITY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    let mut rng = Rng::new(seed);
    let mut history: Vec<(Vec<Instant>, Instant)> = Vec::new();
    let mut losses: Vec<RoundLoss> = Vec::new();
    for round in 0..=rounds {
        let service = Service::start(durability, dir.path(), &mut rng);
        if let Some(last) = history.last() {
            let loss = read_back(service.port, seed, std::slice::from_ref(last), round - 1).remove(0);
            println!(
                "{durability} round {}: {} acknowledged, {} lost{}",
                round - 1,
                loss.acked,
                loss.lost,
                if loss.lost > 0 {
                    format!(" (the first acknowledged {:.1} ms before the kill)", loss.window_ms)
                } else {
                    String::new()
                }
            );
            losses.push(loss);
        }
        if round == rounds {
            let again = read_back(service.port, seed, &history, 0);
            for (r, (then, now)) in losses.iter().zip(&again).enumerate() {
                assert_eq!(now.lost, then.lost, "round {r}: writes lost at a later restart");
            }
            // Dropping the service stops it cleanly (SIGTERM).
            break;
        }
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let (port, acked) = (service.port, acked.clone());
            std::thread::spawn(move || write_until_killed(port, round, seed, acked))
        };
        let deadline = Instant::now() + WAIT;
        while acked.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "round {round}: no write acknowledged");
            assert!(
                !writer.is_finished(),
                "round {round}: the writer stopped before any ack"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(rng.below(KILL_AFTER_MS_MAX)));
        let killed_at = Instant::now();
        service.kill_everything();
        writer.join().unwrap();
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        history.push((acked, killed_at));
    }
    losses
}

fn seed() -> u64 {
    env_u64("SPINDLE_DURABILITY_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    })
}

/// Run the experiment for `durability`; write its outcome as JSON into
/// the directory `SPINDLE_DURABILITY_JSON` names (when set).
fn experiment(durability: &str) -> Vec<RoundLoss> {
    let rounds = env_u64("SPINDLE_DURABILITY_ROUNDS").unwrap_or(5) as usize;
    let seed = seed();
    println!("{durability}: {rounds} rounds, SPINDLE_DURABILITY_SEED={seed}");
    let started = Instant::now();
    let losses = kill_all_rounds(durability, rounds, seed);
    let acked: usize = losses.iter().map(|l| l.acked).sum();
    let lost: usize = losses.iter().map(|l| l.lost).sum();
    let window_ms_max = losses.iter().map(|l| l.window_ms).fold(0.0, f64::max);
    println!(
        "{durability}: {rounds} rounds, {acked} writes acknowledged, {lost} lost (rounds with a loss: {}; loss window up to {window_ms_max:.1} ms)",
        losses.iter().filter(|l| l.lost > 0).count()
    );
    if let Some(out) = std::env::var_os("SPINDLE_DURABILITY_JSON") {
        let doc = serde_json::json!({
            "durability": durability,
            "rounds": rounds,
            "seed": seed,
            "backups": BACKUPS,
            "kill_after_first_ack_ms_max": KILL_AFTER_MS_MAX,
            "acknowledged": acked,
            "lost": lost,
            "rounds_with_loss": losses.iter().filter(|l| l.lost > 0).count(),
            "loss_window_ms_max": window_ms_max,
            "seconds": started.elapsed().as_secs_f64(),
            "per_round": losses.iter().map(|l| serde_json::json!({
                "acknowledged": l.acked, "lost": l.lost, "first_lost_acked_ms_before_kill": l.window_ms
            })).collect::<Vec<_>>(),
        });
        let path = PathBuf::from(out).join(format!("killall-{durability}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    }
    assert!(acked > 0, "no write was acknowledged: the experiment checked nothing");
    losses
}

#[test]
fn disk_durability_loses_no_acknowledged_write_when_every_process_is_killed() {
    let losses = experiment("disk");
    for (round, l) in losses.iter().enumerate() {
        assert_eq!(
            l.lost, 0,
            "durability: round {round} lost {} of {} acknowledged writes (the first acknowledged {:.1} ms before the kill)",
            l.lost, l.acked, l.window_ms
        );
    }
}

/// Memory durability may lose the last moments' writes, only a suffix of
/// each round's (checked in `read_back`), nothing more at later restarts;
/// how many and how long before the kill is reported (the loss window).
#[test]
fn memory_durability_loses_only_the_last_acknowledged_writes() {
    let losses = experiment("memory");
    assert!(losses.iter().all(|l| l.lost <= l.acked));
}

#[test]
fn a_bad_durability_is_refused_naming_the_key_and_the_choices() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["kv", "serve", "--port", "1", "--durability", "fsync"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run spindle");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("--durability") && text.contains("\"fsync\"") && text.contains("\"memory\" or \"disk\""),
        "{text}"
    );
}
