//! The KV service under network partitions: every member in its own
//! network namespace (as if on its own host, see `common::netns`), 8
//! clients in the root namespace reading, writing and incrementing 4 keys
//! through a link cut (master–backup, backup–backup) or the master cut off
//! from every other member, and through the heal.
//!
//! ```text
//!   clients (root namespace) ──────────── reach every member, always
//!          │            │            │
//!      member 0 ─── member 1 ─── member 2 (─── member 3, a spare)
//!      master       backup       backup
//!          ╳ one link cut by iptables DROP inside one namespace, or
//!          ╳ every link of the master (isolated: the clients still reach it)
//! ```
//!
//! A client finds the master by trying every member's address on the
//! RESP port, each client starting at a different member (only a master
//! listens there); an error reply, a timeout or a broken connection
//! records the operation as "no answer" (it may have happened) and the
//! client reconnects. After each scenario:
//!
//! - the history is linearizable (`spindle_replica::linearizability`);
//! - the service answered operations invoked after the cut — for an
//!   isolated master, answered by another member: a majority exists in
//!   every scenario — and after the heal;
//! - never two masters acknowledge: with `SPINDLE_KV_ACK_LOG=<dir>` every
//!   member appends `<CLOCK_MONOTONIC ns> <rank> <epoch>` to
//!   `<dir>/acks-<rank>.log` per acknowledged batch holding a write.
//!   Merged and sorted by time, the epoch never decreases and each epoch
//!   has one rank; and every write a client saw acknowledged has a line of
//!   the member that answered it between the request and the reply (the
//!   log leaves no acknowledgement out);
//! - an isolated master stops answering and steps down, naming its lease,
//!   stays a member, and after the heal is a backup again (the master at
//!   the end has all its backups);
//! - no member process is left running after the cluster is stopped.
//!
//! `SPINDLE_KV_PARTITIONS_KEEP=1` keeps each scenario's files (member
//! outputs, ack logs) for a look afterwards.
//!
//! Every wait is bounded (liveness bounds, never speed assertions); the
//! scenarios run one at a time. Needs root, iproute2 and iptables; where
//! network namespaces are unavailable each test prints why and returns.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::kv::{read_reply, send_requests};
use common::netns::{self, Hosts};
use spindle_replica::linearizability::{check, Op, OpKind, OpResult};

/// The RESP port (only a master listens on it, in its namespace) and the
/// members' own port, the same in every namespace.
const RESP_PORT: u16 = 6379;
const PEER_PORT: u16 = 7400;
const CLIENTS: usize = 8;
const KEYS: u64 = 4;
/// A request's read and write timeout: past it, no answer.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Each client's pause between operations (keeps a history within what
/// the checker searches quickly) and after a failure.
const OP_PAUSE: Duration = Duration::from_millis(10);
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long each phase lasts at least.
const BEFORE_CUT: Duration = Duration::from_secs(2);
const CUT_MIN: Duration = Duration::from_secs(6);
const HEALED_MIN: Duration = Duration::from_secs(4);
/// Liveness bound: for a first master, for an answer after the cut and
/// for one at the end (never a speed assertion).
const LIVENESS_MAX: Duration = Duration::from_secs(30);
/// A member's clean stop (SIGTERM) before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);
/// Every member process runs under `timeout`: ended even if this test's
/// own cleanup never runs.
const MEMBER_TIMEOUT_S: u32 = 300;
/// Set (to anything): keep each scenario's files (config, member outputs,
/// ack logs, segments) under /dev/shm for a look after the test.
const KEEP_ENV: &str = "SPINDLE_KV_PARTITIONS_KEEP";
/// The members' addresses: 10.213.x.0/24 (`common::netns`).
const SECOND_OCTET: u8 = 213;

/// One scenario at a time: their timing stays comparable and the machine
/// is not flooded with clusters.
static SERIAL: Mutex<()> = Mutex::new(());

/// CLOCK_MONOTONIC in ns: the clock of the members' ack logs (one clock
/// for every namespace of the host).
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Master,
    Backup1,
    Backup2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Cut the link between two members: DROP inside the first one's
    /// namespace, both directions, for the second one's address only.
    Link(Role, Role),
    /// Cut the master off from every other member (the clients still
    /// reach it).
    IsolateMaster,
}

#[test]
fn cut_between_master_and_backup1() {
    scenario("cut master–backup1", 0, 2, 0, Fault::Link(Role::Master, Role::Backup1));
}

#[test]
fn cut_between_master_and_backup2() {
    scenario("cut master–backup2", 1, 2, 0, Fault::Link(Role::Master, Role::Backup2));
}

#[test]
fn cut_between_the_backups() {
    scenario(
        "cut backup1–backup2",
        2,
        2,
        0,
        Fault::Link(Role::Backup1, Role::Backup2),
    );
}

#[test]
fn master_isolated_from_every_member() {
    scenario("isolate the master", 3, 2, 0, Fault::IsolateMaster);
}

#[test]
fn master_isolated_with_a_spare() {
    scenario(
        "isolate the master (2 backups + 1 spare)",
        4,
        2,
        1,
        Fault::IsolateMaster,
    );
}

#[test]
fn cut_between_master_and_backup1_with_a_spare() {
    scenario(
        "cut master–backup1 (2 backups + 1 spare)",
        5,
        2,
        1,
        Fault::Link(Role::Master, Role::Backup1),
    );
}

/// When the phases began (CLOCK_MONOTONIC ns).
struct Timeline {
    start_ns: u64,
    cut_ns: u64,
    heal_ns: u64,
}

impl Timeline {
    fn at(&self, t_ns: u64) -> String {
        let s = |from: u64| (t_ns as f64 - from as f64) / 1e9;
        if t_ns >= self.heal_ns && self.heal_ns > 0 {
            format!("heal{:+.2}s", s(self.heal_ns))
        } else if t_ns >= self.cut_ns && self.cut_ns > 0 {
            format!("cut{:+.2}s", s(self.cut_ns))
        } else {
            format!("start{:+.2}s", s(self.start_ns))
        }
    }
}

fn scenario(name: &str, lane: u32, backups: usize, spares: usize, fault: Fault) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = netns::unavailable() {
        eprintln!("SKIPPED {name}: {why}");
        return;
    }
    let mut cluster = match Cluster::start(lane, backups, spares) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED {name}: cannot create network namespaces here: {why}");
            return;
        }
    };
    let mut time = Timeline {
        start_ns: now_ns(),
        cut_ns: 0,
        heal_ns: 0,
    };
    let master = cluster.wait_for_master();
    let others: Vec<usize> = (0..cluster.members.len()).filter(|r| *r != master).collect();
    let rank = |role: Role| match role {
        Role::Master => master,
        Role::Backup1 => others[0],
        Role::Backup2 => others[1],
    };
    let clients = Clients::start(cluster.resp_addrs());
    let mut failures = Vec::new();

    cluster.watch(BEFORE_CUT);
    if !cluster.wait_until(|| clients.answered_after(time.start_ns, None)) {
        failures.push(format!(
            "no operation was answered before the cut within {LIVENESS_MAX:?}"
        ));
    }
    time.cut_ns = now_ns();
    match fault {
        Fault::Link(a, b) => cluster.hosts.cut(rank(a), rank(b)),
        Fault::IsolateMaster => cluster.hosts.isolate(master),
    }
    .unwrap_or_else(|e| panic!("cut: {e}"));
    cluster.watch(CUT_MIN);
    let majority_side = (fault == Fault::IsolateMaster).then_some(master);
    if !cluster.wait_until(|| clients.answered_after(time.cut_ns, majority_side)) {
        failures.push(format!(
            "no operation invoked after the cut was answered{} within {LIVENESS_MAX:?} of the cut: a majority \
             of the members can still reach each other",
            if majority_side.is_some() {
                " by a member other than the isolated master"
            } else {
                ""
            }
        ));
    }
    time.heal_ns = now_ns();
    match fault {
        Fault::Link(a, b) => cluster.hosts.heal(rank(a), rank(b)),
        Fault::IsolateMaster => cluster.hosts.rejoin(master),
    }
    .unwrap_or_else(|e| panic!("heal: {e}"));
    cluster.watch(HEALED_MIN);
    // Available at the end, not only just after the heal.
    let end_ns = now_ns();
    if !cluster.wait_until(|| clients.answered_after(end_ns, None)) {
        failures.push(format!(
            "unavailable at the end: no operation invoked {HEALED_MIN:?} after the heal was answered within \
             {LIVENESS_MAX:?}"
        ));
    }

    let (history, anomalies) = clients.stop();
    failures.extend(anomalies);
    let masters_at_end = cluster.masters_now();
    let backups_at_end = match masters_at_end[..] {
        [(m, _)] => cluster.connected_slaves(m),
        _ => None,
    };
    cluster.stop(&masters_at_end);
    let leftovers = cluster.leftover_processes();
    let mut report = format!(
        "kv_partitions: {name}: {} members, first master {master}, {:.1} s\n",
        cluster.members.len(),
        (now_ns() - time.start_ns) as f64 / 1e9
    );
    let end = End {
        fault,
        master,
        backups_at_end,
    };
    judge(&cluster, &history, &time, &end, &mut failures, &mut report);
    let _ = writeln!(
        report,
        "  master(s) answering INFO at the end (rank, epoch): {masters_at_end:?}"
    );
    report += &cluster.describe_members(&time);
    if !leftovers.is_empty() {
        failures.push(format!("member processes left running after the stop: {leftovers:?}"));
    }
    eprintln!("{report}");
    assert!(
        failures.is_empty(),
        "{name}: {} failure(s):\n- {}",
        failures.len(),
        failures.join("\n- ")
    );
}

/// How a scenario ended: its fault, its first master, and how many backups
/// the master at the end had (INFO `connected_slaves`).
struct End {
    fault: Fault,
    master: usize,
    backups_at_end: Option<usize>,
}

/// Every check on what the scenario recorded, in order of importance:
/// linearizability first, then the ack log, then how the isolated master
/// ended.
fn judge(
    cluster: &Cluster,
    history: &[Record],
    time: &Timeline,
    end: &End,
    failures: &mut Vec<String>,
    report: &mut String,
) {
    let End {
        fault,
        master,
        backups_at_end,
    } = *end;
    report.push_str(&describe_history(history, time));
    let ops: Vec<Op> = history.iter().map(|r| r.op.clone()).collect();
    match check(&ops) {
        Ok(()) => report.push_str("  linearizable: yes\n"),
        Err(e) => {
            let _ = writeln!(report, "  linearizable: NO: {e}");
            failures.insert(0, format!("the history is not linearizable: {e}"));
        }
    }
    match read_acks(&cluster.ack_dir(), cluster.members.len()) {
        Ok(None) => failures.push(format!(
            "no ack log: no member wrote {}/acks-<rank>.log (SPINDLE_KV_ACK_LOG is set for every member; members \
             that predate the ack log ignore it), so \"never two masters acknowledge\" is unchecked",
            cluster.ack_dir().display()
        )),
        Ok(Some(mut acks)) => match check_acks(&mut acks, time) {
            Ok(summary) => {
                report.push_str(&summary);
                if let Err(e) = acks_cover_answers(&acks, history, time) {
                    failures.push(e);
                }
            }
            Err(e) => failures.push(e),
        },
        Err(e) => failures.push(e),
    }
    if fault == Fault::IsolateMaster {
        // The isolated master steps down (its stderr names its lease), stays
        // a member and, after the heal, is back as a backup: the master at
        // the end has all its backups again.
        let m = &cluster.members[master];
        let stderr = std::fs::read_to_string(cluster.stderr_path(master)).unwrap_or_default();
        let stepped_down = stderr.contains("lease") && stderr.contains("stepped down and follows the new master");
        if !stepped_down || m.exit.is_some_and(|(_, _, by_test)| !by_test) {
            failures.push(format!(
                "the isolated master (member {master}) must stop acknowledging, step down naming its lease and                  stay a member; it {}; its stderr: {}",
                match m.exit {
                    Some((t, status, false)) => format!("exited at {} ({status})", time.at(t)),
                    Some((_, status, true)) => format!("ran until the test stopped it ({status})"),
                    None => "was still running".into(),
                },
                tail(&stderr, 3)
            ));
        }
        if backups_at_end != Some(cluster.backups) {
            failures.push(format!(
                "after the heal the master should have its {} backups again (the old master back among them); INFO                  says connected_slaves:{backups_at_end:?}",
                cluster.backups
            ));
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let shown = all[all.len().saturating_sub(lines)..].join(" | ");
    if shown.is_empty() {
        "(empty)".into()
    } else {
        shown
    }
}

// ---------------------------------------------------------------------
// The cluster: members in namespaces, started and stopped by the test.

/// A member process and how it ended: (when, status, stopped by the test).
struct Member {
    child: Option<Child>,
    exit: Option<(u64, ExitStatus, bool)>,
}

/// Members, each `ip netns exec <ns> timeout … spindle kv member`, their
/// namespaces and their files (config, segments, outputs, ack logs).
/// Dropping it kills every member (a member dies with its `timeout`
/// parent: PR_SET_PDEATHSIG), then removes the namespaces and the files.
struct Cluster {
    members: Vec<Member>,
    /// R: backups per epoch.
    backups: usize,
    hosts: Hosts,
    group: String,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start(lane: u32, backups: usize, spares: usize) -> Result<Cluster, String> {
        let count = 1 + backups + spares;
        let hosts = Hosts::create(SECOND_OCTET, lane, count)?;
        // Segments on tmpfs: a disk shared with busy builds can stall
        // fsyncs for seconds; this test checks failover, not the disk.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let group = format!("kvpart-{}-{lane}", std::process::id());
        let peers: Vec<String> = (0..count).map(|i| format!("{}:{PEER_PORT}", hosts.addr(i))).collect();
        let config = dir.path().join("service.conf");
        std::fs::write(
            &config,
            format!(
                "group = \"{group}\"\ntransport = \"tcp\"\npeers = \"{}\"\nkey = \"kv partitions test key\"\n\
                 backups = {backups}\nspares = {spares}\nbind = \"0.0.0.0\"\nport = {RESP_PORT}\ndata_dir = \"{}\"\n",
                peers.join(","),
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let mut cluster = Cluster {
            members: Vec::new(),
            backups,
            hosts,
            group,
            config,
            dir,
        };
        std::fs::create_dir_all(cluster.ack_dir()).unwrap();
        let exe = common::spindle().get_program().to_owned();
        for rank in 0..count {
            let out = std::fs::File::create(cluster.dir.path().join(format!("member-{rank}.out"))).unwrap();
            let err = std::fs::File::create(cluster.stderr_path(rank)).unwrap();
            let child = cluster
                .hosts
                .command(rank, MEMBER_TIMEOUT_S, &exe)
                .args(["kv", "member", "--rank", &rank.to_string(), "--config"])
                .arg(&cluster.config)
                .env("SPINDLE_KV_ACK_LOG", cluster.ack_dir())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("start a member");
            cluster.members.push(Member {
                child: Some(child),
                exit: None,
            });
        }
        Ok(cluster)
    }

    fn ack_dir(&self) -> PathBuf {
        self.dir.path().join("acks")
    }
    fn stderr_path(&self, rank: usize) -> PathBuf {
        self.dir.path().join(format!("member-{rank}.err"))
    }
    fn resp_addrs(&self) -> Vec<SocketAddr> {
        (0..self.members.len())
            .map(|r| format!("{}:{RESP_PORT}", self.hosts.addr(r)).parse().unwrap())
            .collect()
    }

    /// Note members that exited (not stopped by the test).
    fn reap(&mut self) {
        for m in &mut self.members {
            if let Some(child) = &mut m.child {
                if let Ok(Some(status)) = child.try_wait() {
                    m.exit = Some((now_ns(), status, false));
                    m.child = None;
                }
            }
        }
    }

    /// Let `duration` pass, noting exits as they come.
    fn watch(&mut self, duration: Duration) {
        let started = Instant::now();
        while started.elapsed() < duration {
            self.reap();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until `done`, at most [`LIVENESS_MAX`]; whether it came.
    fn wait_until(&mut self, done: impl Fn() -> bool) -> bool {
        let started = Instant::now();
        while !done() {
            if started.elapsed() > LIVENESS_MAX {
                return false;
            }
            self.reap();
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// The first master's rank (a fresh store: every member starts, one
    /// leads epoch 0 and listens on the RESP port).
    fn wait_for_master(&mut self) -> usize {
        let started = Instant::now();
        loop {
            if let Some((rank, _)) = self.masters_now().first() {
                return *rank;
            }
            self.reap();
            let exited: Vec<usize> = (0..self.members.len())
                .filter(|r| self.members[*r].exit.is_some())
                .collect();
            assert!(
                exited.is_empty() && started.elapsed() < LIVENESS_MAX,
                "no master within {LIVENESS_MAX:?} (members exited: {exited:?}):\n{}",
                self.outputs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Members that answer `INFO` on the RESP port now: (rank, epoch).
    /// INFO `connected_slaves` of the member at `rank`'s address.
    fn connected_slaves(&self, rank: usize) -> Option<usize> {
        let addr = self.resp_addrs()[rank];
        let info = Conn::open(rank, &addr)?.call(&["INFO"]).ok()?;
        info.split("\r\n")
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|v| v.trim().parse().ok())
    }

    fn masters_now(&self) -> Vec<(usize, u64)> {
        self.resp_addrs()
            .iter()
            .enumerate()
            .filter_map(|(r, addr)| {
                let mut conn = Conn::open(r, addr)?;
                let info = conn.call(&["INFO"]).ok()?;
                let field = |name: &str| {
                    info.split("\r\n")
                        .find_map(|l| l.strip_prefix(name))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                };
                let rank = field("member_rank:").unwrap_or(r as u64);
                assert_eq!(rank, r as u64, "INFO of the member at member {r}'s address: {info}");
                Some((r, field("epoch:")?))
            })
            .collect()
    }

    /// Stop every member still running: SIGTERM to the masters first
    /// (a master waits for its backups to seal their logs), then to the
    /// others; SIGKILL past [`STOP_WAIT`]. `timeout` passes SIGTERM on.
    fn stop(&mut self, masters: &[(usize, u64)]) {
        self.reap();
        let first: Vec<usize> = masters.iter().map(|(r, _)| *r).collect();
        let rest: Vec<usize> = (0..self.members.len()).filter(|r| !first.contains(r)).collect();
        for ranks in [first, rest] {
            for rank in &ranks {
                if let Some(child) = &self.members[*rank].child {
                    // SAFETY: kill(2) on our child, not reaped yet (its pid
                    // is not reused); no memory effects.
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                }
            }
            self.wait_exits(&ranks, STOP_WAIT);
        }
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                m.exit = Some((now_ns(), child.wait().expect("wait for a member"), true));
            }
        }
    }

    /// Wait (at most `max`) for members `ranks`, signalled to stop, to
    /// exit: exits from now on count as stopped by the test.
    fn wait_exits(&mut self, ranks: &[usize], max: Duration) {
        let started = Instant::now();
        loop {
            for m in &mut self.members {
                if let Some(child) = &mut m.child {
                    if let Ok(Some(status)) = child.try_wait() {
                        m.exit = Some((now_ns(), status, true));
                        m.child = None;
                    }
                }
            }
            if ranks.iter().all(|r| self.members[*r].child.is_none()) || started.elapsed() > max {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Member processes of this cluster still running (bounded wait for
    /// the kernel to finish killing them).
    fn leftover_processes(&self) -> Vec<(u32, String)> {
        let needle = self.config.to_str().unwrap().to_string();
        let started = Instant::now();
        loop {
            let left = netns::processes_with_arg(&needle);
            if left.is_empty() || started.elapsed() > STOP_WAIT {
                return left;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn describe_members(&self, time: &Timeline) -> String {
        let mut text = String::new();
        for (rank, m) in self.members.iter().enumerate() {
            let out = std::fs::read_to_string(self.dir.path().join(format!("member-{rank}.out"))).unwrap_or_default();
            let led: Vec<&str> = out
                .lines()
                .filter_map(|l| l.split(" is master of epoch ").nth(1))
                .filter_map(|rest| rest.split([' ', ',']).next())
                .collect();
            let how = match m.exit {
                Some((t, status, false)) => format!("EXITED by itself at {} ({status})", time.at(t)),
                Some((_, status, true)) => format!("stopped by the test ({status})"),
                None => "still running".into(),
            };
            let stderr = std::fs::read_to_string(self.stderr_path(rank)).unwrap_or_default();
            let _ = writeln!(
                text,
                "  member {rank}: led epochs {led:?}; {how}; stderr: {}",
                tail(&stderr, 2)
            );
        }
        text
    }

    fn outputs(&self) -> String {
        (0..self.members.len())
            .map(|r| {
                let err = std::fs::read_to_string(self.stderr_path(r)).unwrap_or_default();
                format!("member {r}: {}", tail(&err, 5))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(child) = &mut m.child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // A tcp member killed by a signal leaves its stat file behind.
        for rank in 0..self.members.len() {
            let _ = std::fs::remove_file(format!("/dev/shm/spindle@tcp-{}@{rank}", self.group));
        }
        // A member that panicked (an assertion of its own) fails the test
        // even when a failover carried the service past it.
        let panics: Vec<String> = (0..self.members.len())
            .flat_map(|rank| {
                let stderr = std::fs::read(self.stderr_path(rank)).unwrap_or_default();
                let stderr = String::from_utf8_lossy(&stderr);
                let lines: Vec<&str> = stderr.lines().collect();
                // Each panic's marker line with its message (up to the
                // backtrace note).
                (0..lines.len())
                    .filter(|&i| lines[i].contains("panicked at"))
                    .map(|i| {
                        let message = lines[i + 1..]
                            .iter()
                            .take(6)
                            .take_while(|l| !l.starts_with("note: ") && !l.contains("panicked at"));
                        let mut report = format!("member {rank}: {}", lines[i]);
                        for l in message {
                            report.push_str("\n    ");
                            report.push_str(l);
                        }
                        report
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let failed = !panics.is_empty() && !std::thread::panicking();
        if std::env::var_os(KEEP_ENV).is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kv_partitions: kept {}", self.dir.path().display());
        }
        assert!(!failed, "a member panicked:\n{}", panics.join("\n"));
        // Then `hosts` (namespaces, bridge) and `dir` (every file) go.
    }
}

// ---------------------------------------------------------------------
// Clients: 8 threads in the root namespace, one operation at a time.

/// One connection to a member's RESP port.
struct Conn {
    member: usize,
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(member: usize, addr: &SocketAddr) -> Option<Conn> {
        let stream = TcpStream::connect_timeout(addr, CONNECT_TIMEOUT).ok()?;
        stream.set_read_timeout(Some(OP_TIMEOUT)).ok()?;
        stream.set_write_timeout(Some(OP_TIMEOUT)).ok()?;
        let _ = stream.set_nodelay(true);
        Some(Conn {
            member,
            stream,
            buf: Vec::new(),
        })
    }

    /// The first member, from `first` on, that accepts a connection.
    fn any(addrs: &[SocketAddr], first: usize) -> Option<Conn> {
        (0..addrs.len()).find_map(|k| {
            let m = (first + k) % addrs.len();
            Conn::open(m, &addrs[m])
        })
    }

    fn call(&mut self, args: &[&str]) -> std::io::Result<String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        send_requests(&mut self.stream, &[&args])?;
        read_reply(&mut self.stream, &mut self.buf)
    }
}

/// An operation of the history and the member it was sent to.
struct Record {
    op: Op,
    member: usize,
}

struct Shared {
    stop: AtomicBool,
    /// Per member: the latest invocation (ns) of an operation it answered.
    answered_invoke_ns: Vec<AtomicU64>,
}

struct Clients {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<(Vec<Record>, Vec<String>)>>,
}

impl Clients {
    fn start(addrs: Vec<SocketAddr>) -> Clients {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            answered_invoke_ns: (0..addrs.len()).map(|_| AtomicU64::new(0)).collect(),
        });
        let threads = (0..CLIENTS)
            .map(|id| {
                let (addrs, shared) = (addrs.clone(), shared.clone());
                std::thread::spawn(move || client(id, &addrs, &shared))
            })
            .collect();
        Clients { shared, threads }
    }

    /// Whether an operation invoked after `t_ns` was answered by a member
    /// other than `except`.
    fn answered_after(&self, t_ns: u64, except: Option<usize>) -> bool {
        self.shared
            .answered_invoke_ns
            .iter()
            .enumerate()
            .any(|(m, at)| Some(m) != except && at.load(Ordering::Relaxed) > t_ns)
    }

    /// Stop the clients: the history, and replies no operation explains.
    fn stop(mut self) -> (Vec<Record>, Vec<String>) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let (mut history, mut anomalies) = (Vec::new(), Vec::new());
        for t in std::mem::take(&mut self.threads) {
            let (h, a) = t.join().expect("a client thread panicked");
            history.extend(h);
            anomalies.extend(a);
        }
        (history, anomalies)
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        // A test that fails early still ends its clients.
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// One client: operations one at a time, reconnecting (from the next
/// member on) after a failure, until told to stop.
fn client(id: usize, addrs: &[SocketAddr], shared: &Shared) -> (Vec<Record>, Vec<String>) {
    let (mut history, mut anomalies) = (Vec::new(), Vec::new());
    let mut rng = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(id as u64 + 1) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut conn: Option<Conn> = None;
    let mut first = id % addrs.len();
    let mut i = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = Conn::any(addrs, first);
            if conn.is_none() {
                std::thread::sleep(RETRY_PAUSE);
            }
            continue;
        };
        let key = format!("k{}", next() % KEYS);
        let kind = match next() % 3 {
            0 => OpKind::Get,
            1 => OpKind::Set(format!("{}", id as u64 * 1_000_000 + i).into_bytes()),
            _ => OpKind::Incr,
        };
        i += 1;
        let invoke_ns = now_ns();
        let reply = match &kind {
            OpKind::Get => c.call(&["GET", &key]),
            OpKind::Set(v) => c.call(&["SET", &key, std::str::from_utf8(v).unwrap()]),
            OpKind::Incr => c.call(&["INCR", &key]),
        };
        let complete_ns = now_ns();
        let member = c.member;
        let result = classify(&kind, reply).unwrap_or_else(|unexpected| {
            anomalies.push(format!("client {id}: member {member}: {unexpected}"));
            None
        });
        if result.is_some() {
            shared.answered_invoke_ns[member].fetch_max(invoke_ns, Ordering::Relaxed);
        } else {
            conn = None;
            first = (member + 1) % addrs.len();
        }
        history.push(Record {
            op: Op {
                client: id,
                key: key.into_bytes(),
                complete_ns: result.as_ref().map(|_| complete_ns),
                kind,
                invoke_ns,
                result,
            },
            member,
        });
        std::thread::sleep(if conn.is_some() { OP_PAUSE } else { RETRY_PAUSE });
    }
    (history, anomalies)
}

/// A reply as a result; `None`: no answer (a broken connection, a
/// timeout, or an error reply: the write may have happened).
fn classify(kind: &OpKind, reply: std::io::Result<String>) -> Result<Option<OpResult>, String> {
    let Ok(r) = reply else { return Ok(None) };
    if r.starts_with('-') {
        return Ok(None);
    }
    match kind {
        OpKind::Get if r == "nil" => Ok(Some(OpResult::Value(None))),
        OpKind::Get if !r.starts_with(['+', ':', '[', '?']) => Ok(Some(OpResult::Value(Some(r.into_bytes())))),
        OpKind::Set(_) if r == "+OK" => Ok(Some(OpResult::Ok)),
        OpKind::Incr if r.starts_with(':') => r[1..]
            .parse()
            .map(|n| Some(OpResult::Integer(n)))
            .map_err(|_| format!("INCR answered {r:?}")),
        _ => Err(format!("{kind:?} answered {r:?}")),
    }
}

fn describe_history(history: &[Record], time: &Timeline) -> String {
    let phase = |t: u64| usize::from(t >= time.cut_ns) + usize::from(t >= time.heal_ns);
    let mut answered = [0usize; 3];
    let mut unanswered = [0usize; 3];
    // Per phase and member: (answered, of which writes).
    let mut by_member: [std::collections::BTreeMap<usize, (usize, usize)>; 3] = Default::default();
    for r in history {
        let p = phase(r.op.invoke_ns);
        if r.op.result.is_some() {
            answered[p] += 1;
            let counts = by_member[p].entry(r.member).or_default();
            counts.0 += 1;
            counts.1 += usize::from(!matches!(r.op.kind, OpKind::Get));
        } else {
            unanswered[p] += 1;
        }
    }
    let mut text = format!(
        "  operations: {} ({} answered, {} no answer)\n",
        history.len(),
        answered.iter().sum::<usize>(),
        unanswered.iter().sum::<usize>()
    );
    // When each member answered (first invocation .. last answer): two
    // overlapping spans are two members serving at once.
    let mut spans: std::collections::BTreeMap<usize, (u64, u64)> = Default::default();
    for r in history {
        if let Some(done) = r.op.complete_ns {
            let span = spans.entry(r.member).or_insert((r.op.invoke_ns, done));
            (span.0, span.1) = (span.0.min(r.op.invoke_ns), span.1.max(done));
        }
    }
    let spans: Vec<String> = spans
        .iter()
        .map(|(m, (a, b))| format!("member {m} {} .. {}", time.at(*a), time.at(*b)))
        .collect();
    let _ = writeln!(text, "    answers came from: {}", spans.join("; "));
    for (p, name) in ["before the cut", "during the cut", "after the heal"]
        .iter()
        .enumerate()
    {
        let members: Vec<String> = by_member[p]
            .iter()
            .map(|(m, (n, writes))| format!("member {m}: {n} ({writes} writes)"))
            .collect();
        let _ = writeln!(
            text,
            "    {name}: {} answered ({}), {} no answer",
            answered[p],
            members.join(", "),
            unanswered[p]
        );
    }
    text
}

// ---------------------------------------------------------------------
// The ack log: never two masters acknowledge.

/// One acknowledged batch holding a write, as a member logged it.
#[derive(Clone, Copy, Debug)]
struct Ack {
    t_ns: u64,
    rank: usize,
    epoch: u64,
}

/// Every member's ack lines; `None` when no member wrote a log at all. A
/// last line without its newline (a member killed while writing it) is
/// left out; any other line that does not parse is an error.
fn read_acks(dir: &Path, members: usize) -> Result<Option<Vec<Ack>>, String> {
    let mut acks = Vec::new();
    let mut any = false;
    for rank in 0..members {
        let path = dir.join(format!("acks-{rank}.log"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        any = true;
        for (n, line) in text.split_inclusive('\n').enumerate() {
            let Some(line) = line.strip_suffix('\n') else { break };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let bad = || {
                format!(
                    "{} line {}: expected '<ns> <rank> <epoch>', found {line:?}",
                    path.display(),
                    n + 1
                )
            };
            let [t, r, e] = fields[..] else { return Err(bad()) };
            let ack = Ack {
                t_ns: t.parse().map_err(|_| bad())?,
                rank: r.parse().map_err(|_| bad())?,
                epoch: e.parse().map_err(|_| bad())?,
            };
            if ack.rank != rank {
                return Err(format!(
                    "{} line {}: rank {} in member {rank}'s log",
                    path.display(),
                    n + 1,
                    ack.rank
                ));
            }
            acks.push(ack);
        }
    }
    Ok(any.then_some(acks))
}

/// Merged and sorted by time, the epoch never decreases, and each epoch
/// is acknowledged by one rank; a summary (epoch: rank, acks, first and
/// last) when it holds.
fn check_acks(acks: &mut [Ack], time: &Timeline) -> Result<String, String> {
    acks.sort_by_key(|a| (a.t_ns, a.epoch, a.rank));
    let mut epochs: std::collections::BTreeMap<u64, (usize, usize, u64, u64)> = Default::default();
    let mut newest: Option<Ack> = None;
    for a in acks.iter() {
        let entry = epochs.entry(a.epoch).or_insert((a.rank, 0, a.t_ns, a.t_ns));
        if entry.0 != a.rank {
            return Err(format!(
                "two masters: epoch {} acknowledged by member {} (from {}) and by member {} (at {})",
                a.epoch,
                entry.0,
                time.at(entry.2),
                a.rank,
                time.at(a.t_ns)
            ));
        }
        (entry.1, entry.3) = (entry.1 + 1, a.t_ns);
        if let Some(n) = newest.filter(|n| a.epoch < n.epoch) {
            return Err(format!(
                "two masters acknowledged: member {} acknowledged epoch {} at {}, after member {} had acknowledged \
                 epoch {} at {}",
                a.rank,
                a.epoch,
                time.at(a.t_ns),
                n.rank,
                n.epoch,
                time.at(n.t_ns)
            ));
        }
        newest = Some(*a);
    }
    let mut text = format!(
        "  ack log: {} acknowledged batches with writes; never two masters\n",
        acks.len()
    );
    for (epoch, (rank, n, first, last)) in epochs {
        let _ = writeln!(
            text,
            "    epoch {epoch}: member {rank}, {n} batches, {} .. {}",
            time.at(first),
            time.at(last)
        );
    }
    Ok(text)
}

/// Every write a client saw acknowledged has a line of the member that
/// answered it, timed between the request and the reply: the ack log
/// leaves out no acknowledgement (else the check above proves little).
fn acks_cover_answers(acks: &[Ack], history: &[Record], time: &Timeline) -> Result<(), String> {
    let mut by_rank: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
    for a in acks {
        by_rank.entry(a.rank).or_default().push(a.t_ns);
    }
    let writes = history
        .iter()
        .filter(|r| !matches!(r.op.kind, OpKind::Get))
        .filter_map(|r| Some((r, r.op.complete_ns?)));
    let (mut total, mut missing, mut first) = (0usize, 0usize, None);
    for (r, complete_ns) in writes {
        total += 1;
        let times = by_rank.get(&r.member).map(Vec::as_slice).unwrap_or(&[]);
        let at = times.partition_point(|t| *t < r.op.invoke_ns);
        if times.get(at).is_none_or(|t| *t > complete_ns) {
            missing += 1;
            first.get_or_insert_with(|| format!("member {} at {}", r.member, time.at(r.op.invoke_ns)));
        }
    }
    if missing == 0 {
        return Ok(());
    }
    Err(format!(
        "the ack log leaves out acknowledgements: {missing} of {total} acknowledged writes have no line of the \
         member that answered them between request and reply (first: {})",
        first.unwrap_or_default()
    ))
}

/// The ack-log checks on made-up logs (no namespaces needed): they pass a
/// clean handover, catch two masters both ways, and catch a log that
/// leaves out an acknowledgement a client saw.
#[test]
fn ack_log_checks_catch_two_masters_and_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let time = Timeline {
        start_ns: 1_000,
        cut_ns: 5_000,
        heal_ns: 9_000,
    };
    // Member 0 leads epoch 0, member 1 epoch 1 after it; member 2's last
    // line is torn (killed while writing) and left out.
    std::fs::write(dir.path().join("acks-0.log"), "1100 0 0\n1500 0 0\n").unwrap();
    std::fs::write(dir.path().join("acks-1.log"), "6000 1 1\n").unwrap();
    std::fs::write(dir.path().join("acks-2.log"), "7000 2").unwrap();
    let mut acks = read_acks(dir.path(), 3).unwrap().expect("logs");
    assert_eq!(acks.len(), 3, "the torn line is left out");
    let summary = check_acks(&mut acks, &time).expect("one master at a time");
    assert!(summary.contains("epoch 1: member 1, 1 batches"), "{summary}");
    let write = |member: usize, invoke_ns: u64, complete_ns: u64| Record {
        op: Op {
            client: 0,
            key: b"k0".to_vec(),
            kind: OpKind::Set(b"1".to_vec()),
            invoke_ns,
            complete_ns: Some(complete_ns),
            result: Some(OpResult::Ok),
        },
        member,
    };
    acks_cover_answers(&acks, &[write(0, 1_400, 1_600), write(1, 5_900, 6_100)], &time).expect("covered");
    let gap = acks_cover_answers(&acks, &[write(0, 1_600, 1_700)], &time).unwrap_err();
    assert!(gap.contains("1 of 1 acknowledged writes"), "{gap}");
    let gap = acks_cover_answers(&acks, &[write(1, 1_400, 1_600)], &time).unwrap_err();
    assert!(gap.contains("member 1"), "another member's line does not count: {gap}");

    // The old master acknowledges after the new one did: two masters.
    let mut late = acks.clone();
    late.push(Ack {
        t_ns: 6_500,
        rank: 0,
        epoch: 0,
    });
    let e = check_acks(&mut late, &time).unwrap_err();
    assert!(
        e.contains("member 0 acknowledged epoch 0") && e.contains("member 1"),
        "{e}"
    );
    // Two members acknowledge in one epoch.
    let mut shared = acks.clone();
    shared.push(Ack {
        t_ns: 6_600,
        rank: 2,
        epoch: 1,
    });
    let e = check_acks(&mut shared, &time).unwrap_err();
    assert!(
        e.contains("epoch 1 acknowledged by member 1") && e.contains("by member 2"),
        "{e}"
    );

    // A line that does not parse, or names another rank, is an error; no
    // file at all is "no ack log".
    std::fs::write(dir.path().join("acks-2.log"), "7000 2 x\n").unwrap();
    assert!(read_acks(dir.path(), 3).unwrap_err().contains("acks-2.log line 1"));
    std::fs::write(dir.path().join("acks-2.log"), "7000 1 1\n").unwrap();
    assert!(read_acks(dir.path(), 3)
        .unwrap_err()
        .contains("rank 1 in member 2's log"));
    assert!(read_acks(&dir.path().join("none"), 3).unwrap().is_none());
}
