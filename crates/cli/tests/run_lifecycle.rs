//! The lifecycle of `spindle run` members (issue: robust as a service):
//!
//! - a member killed with SIGKILL, or stopped with SIGSTOP, mid-run: the
//!   survivors install a view without it, finish the run (every message
//!   of every surviving sender delivered, the dead one's up to its ragged
//!   edge) and exit 0; their delivery logs pass the checkers and account
//!   for every index (deliveries and null runs: no gaps);
//! - SIGTERM: the member leaves the group (the others install a view
//!   without it and suspect nobody), flushes its log, removes its stat
//!   file and result folder, and exits 0; a second signal exits at once,
//!   still removing them;
//! - the delivery log is on disk while the member runs (flushed every
//!   100 ms), not only at a clean exit.
//!
//! Members run over tcp on loopback. Every wait is a bounded poll that
//! fails with what it was waiting for; every child is killed on the way
//! out.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::spindle;
use spindle_group::invariants;

/// Upper bound of every wait (generous: CI machines are loaded).
const WAIT_MAX: Duration = Duration::from_secs(90);

/// One group at a time: each test runs 2 or 3 member processes, and a
/// machine has 2 cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_ports(n: usize) -> Vec<u16> {
    let base = spindle_bench::cluster::free_ports(n as u16).expect("free loopback ports");
    (base..base + n as u16).collect()
}

/// A group file for `members` members on loopback, with a fresh key.
fn write_group(dir: &Path, group: &str, members: usize, extra: &str) -> PathBuf {
    let key = dir.join("group.key");
    common::write_key_file(&key, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    let mut text = format!(
        "[group]\nname = \"{group}\"\nkey_file = \"{}\"\nwindow_slots = 64\njoin_timeout_ms = 20000\n{extra}\n",
        key.display()
    );
    for (id, port) in free_ports(members).iter().enumerate() {
        text += &format!("[[members]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\n");
    }
    let path = dir.join("group.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// One running member, its output collected by two reader threads.
struct Member {
    child: Child,
    output: Arc<Mutex<String>>,
    id: usize,
}

impl Member {
    fn start(config: &Path, id: usize, logs: &Path, dir: &Path, args: &[&str]) -> Member {
        let mut child = spindle()
            .args(["run", "--config"])
            .arg(config)
            .args(["--member", &id.to_string(), "--size", "64", "--delivery-log"])
            .arg(logs)
            .arg("--json")
            .arg(dir.join(format!("result-{id}.json")))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for pipe in [Box::new(out) as Box<dyn std::io::Read + Send>, Box::new(err)] {
            let sink = Arc::clone(&output);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut text = sink.lock().unwrap();
                    text.push_str(&line);
                    text.push('\n');
                }
            });
        }
        Member { child, output, id }
    }

    fn text(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) has no memory effects; the pid is our own
        // child's, not yet reaped (it is reaped only in `wait`).
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "signal member {}", self.id);
    }

    /// Wait for the exit (bounded); the status code, or 128 + signal.
    fn wait(&mut self) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                // Let the reader threads take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            }
            assert!(
                start.elapsed() < WAIT_MAX,
                "member {} did not exit; its output:\n{}",
                self.id,
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until the output holds `needle` (bounded).
    fn wait_for_output(&mut self, needle: &str) {
        let start = Instant::now();
        while !self.text().contains(needle) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "member {} exited ({status}) before printing {needle:?}:\n{}",
                    self.id,
                    self.text()
                );
            }
            assert!(
                start.elapsed() < WAIT_MAX,
                "member {} never printed {needle:?}; its output:\n{}",
                self.id,
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait until member `id`'s delivery log on disk holds `lines` lines:
/// the log is flushed while the member runs.
fn wait_for_log_lines(logs: &Path, id: usize, lines: usize) {
    let path = logs.join(format!("member-{id}.jsonl"));
    let start = Instant::now();
    loop {
        let have = std::fs::read_to_string(&path).map_or(0, |t| t.lines().count());
        if have >= lines {
            return;
        }
        assert!(
            start.elapsed() < WAIT_MAX,
            "member {id}'s delivery log {} holds {have} lines, never {lines}: it is not flushed while the member runs",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every checker over the logs, and no gaps by index (deliveries and
/// null runs account for every index of every sender in every view).
fn check_logs(logs: &Path) -> (invariants::MemberLines, invariants::NullRuns) {
    let (lines, nulls) = invariants::read_lines_and_nulls(logs).unwrap();
    invariants::check_lines(&lines, true).unwrap_or_else(|v| panic!("delivery logs break an invariant: {v}"));
    invariants::index_gaps(&lines, &nulls).unwrap_or_else(|e| panic!("delivery logs: {e}"));
    (lines, nulls)
}

/// Data messages member `member` delivered from `sender`, over all views.
fn delivered_from(lines: &invariants::MemberLines, member: usize, sender: usize) -> usize {
    lines[&member]
        .iter()
        .filter(|l| matches!(l, invariants::LogLine::Delivery(e) if e.sender == sender))
        .count()
}

fn result_counter(dir: &Path, id: usize, name: &str) -> u64 {
    let text = std::fs::read_to_string(dir.join(format!("result-{id}.json"))).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {text}"))
}

/// The files a tcp member keeps while it runs: its stat file, and its
/// result folder `spindle-run-<pid>-…` in the temporary directory.
fn member_files(group: &str, id: usize, pid: i32) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(format!("/dev/shm/spindle@tcp-{group}@{id}"))];
    let prefix = format!("spindle-run-{pid}-");
    for entry in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            files.push(entry.path());
        }
    }
    files
}

fn unique_group(what: &str) -> String {
    format!("life-{what}-{}", std::process::id())
}

/// Kill (or stop) member 2 of 3 mid-run; the survivors finish the run.
fn survivors_finish_after(signal: i32, what: &str) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let group = unique_group(what);
    let config = write_group(dir.path(), &group, 3, "");
    let count = 4000u64;
    let args = ["--count", "4000", "--rate", "1000"];
    let mut members: Vec<Member> = (0..3)
        .map(|id| Member::start(&config, id, &logs, dir.path(), &args))
        .collect();
    // Mid-run: member 0 has delivered (and flushed) some hundreds.
    wait_for_log_lines(&logs, 0, 300);
    members[2].signal(signal);
    for m in &mut members[..2] {
        let code = m.wait();
        assert_eq!(code, 0, "survivor {} failed:\n{}", m.id, m.text());
        assert!(
            m.text().contains("installed: members [0, 1]"),
            "survivor {} never installed a view without member 2:\n{}",
            m.id,
            m.text()
        );
    }
    let (lines, _) = check_logs(&logs);
    for survivor in [0usize, 1] {
        for sender in [0usize, 1] {
            assert_eq!(
                delivered_from(&lines, survivor, sender) as u64,
                count,
                "survivor {survivor} must deliver every message of surviving sender {sender}"
            );
        }
        let dead = delivered_from(&lines, survivor, 2) as u64;
        assert!(
            dead < count,
            "member 2 was stopped mid-run, yet {dead} of its messages arrived"
        );
        assert!(result_counter(dir.path(), survivor, "views_installed") >= 1);
    }
    // Both survivors delivered the dead member's messages up to one edge.
    assert_eq!(delivered_from(&lines, 0, 2), delivered_from(&lines, 1, 2));
    if signal == libc::SIGSTOP {
        // Woken up, the stopped member learns it was removed and fails.
        members[2].signal(libc::SIGCONT);
        let code = members[2].wait();
        assert_ne!(code, 0, "a removed member must not exit 0:\n{}", members[2].text());
    } else {
        members[2].wait();
    }
}

#[test]
fn sigkill_of_a_member_the_survivors_finish_and_their_logs_have_no_gaps() {
    survivors_finish_after(libc::SIGKILL, "kill");
}

#[test]
fn sigstop_of_a_member_the_survivors_finish_and_their_logs_have_no_gaps() {
    survivors_finish_after(libc::SIGSTOP, "stop");
}

#[test]
fn sigterm_leaves_the_group_cleanly_and_removes_the_members_files() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let group = unique_group("term");
    let config = write_group(dir.path(), &group, 3, "");
    let args = ["--service", "--rate", "500"];
    let mut members: Vec<Member> = (0..3)
        .map(|id| Member::start(&config, id, &logs, dir.path(), &args))
        .collect();
    wait_for_log_lines(&logs, 2, 200);
    let pid = members[2].pid();
    assert!(
        member_files(&group, 2, pid).iter().all(|f| f.exists()) && member_files(&group, 2, pid).len() == 2,
        "a running member has a stat file and a result folder"
    );
    members[2].signal(libc::SIGTERM);
    let code = members[2].wait();
    assert_eq!(code, 0, "SIGTERM must exit 0:\n{}", members[2].text());
    assert!(members[2].text().contains("left the group"), "{}", members[2].text());
    let left_behind: Vec<_> = member_files(&group, 2, pid)
        .into_iter()
        .filter(|f| f.exists())
        .collect();
    assert!(left_behind.is_empty(), "SIGTERM left files behind: {left_behind:?}");
    for m in &mut members[..2] {
        m.wait_for_output("installed: members [0, 1]");
    }
    // Then the rest stop the same way: member 1 leaves, member 0 is last.
    for id in [1usize, 0] {
        members[id].signal(libc::SIGTERM);
        let code = members[id].wait();
        assert_eq!(code, 0, "member {id} on SIGTERM:\n{}", members[id].text());
    }
    // A leave is not a failure: nobody suspected anybody.
    for id in 0..3 {
        assert_eq!(
            result_counter(dir.path(), id, "suspicions"),
            0,
            "member {id} suspected a member that left cleanly"
        );
    }
    check_logs(&logs);
}

#[test]
fn a_second_signal_exits_at_once_and_still_removes_the_files() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let group = unique_group("twice");
    // A suspicion timeout far beyond the test: a member that cannot leave
    // (its peer is stopped; the peer's kernel still acknowledges its tcp
    // segments) waits for the second signal.
    let config = write_group(dir.path(), &group, 2, "suspect_timeout_ms = 600000");
    let args = ["--service", "--rate", "500"];
    let mut members: Vec<Member> = (0..2)
        .map(|id| Member::start(&config, id, &logs, dir.path(), &args))
        .collect();
    wait_for_log_lines(&logs, 1, 100);
    // With member 0 stopped, member 1's leave cannot finish.
    members[0].signal(libc::SIGSTOP);
    let pid = members[1].pid();
    members[1].signal(libc::SIGTERM);
    members[1].wait_for_output("leaving the group");
    members[1].signal(libc::SIGTERM);
    let code = members[1].wait();
    assert_eq!(code, 128 + libc::SIGTERM, "{}", members[1].text());
    let left_behind: Vec<_> = member_files(&group, 1, pid)
        .into_iter()
        .filter(|f| f.exists())
        .collect();
    assert!(
        left_behind.is_empty(),
        "a second signal left files behind: {left_behind:?}"
    );
    members[0].signal(libc::SIGCONT);
}

/// A 2-member persistent tcp group run twice over the same logs, `COUNT`
/// messages per sender each time, with `extra` in its group file:
/// every member must exit 0 and count exactly its own run's messages,
/// and both runs' delivery logs must pass the checkers; `check(round,
/// member, output, counter)` looks at the rest (`counter(name)`: one of
/// the member's result counters).
fn two_persistent_runs(tag: &str, extra: &str, check: impl Fn(usize, usize, &str, &dyn Fn(&str) -> u64)) {
    const COUNT: u64 = 300;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let group = unique_group(tag);
    let config = write_group(
        dir.path(),
        &group,
        2,
        &format!("membership = true\nmode = \"persistent\"\npersist_dir = \"logs-{tag}\"\n{extra}"),
    );
    let count = COUNT.to_string();
    let args = ["--count", count.as_str()];
    for round in 0..2 {
        let logs = dir.path().join(format!("delivery-{round}"));
        let mut members: Vec<Member> = (0..2)
            .map(|id| Member::start(&config, id, &logs, dir.path(), &args))
            .collect();
        for m in &mut members {
            let code = m.wait();
            assert_eq!(code, 0, "round {round}: member {} failed:\n{}", m.id, m.text());
            let text = m.text();
            assert!(
                text.contains(&format!("delivered {} messages", 2 * COUNT)),
                "round {round}: member {} must count this run's {} messages only:\n{text}",
                m.id,
                2 * COUNT
            );
            check(round, m.id, &text, &|name| result_counter(dir.path(), m.id, name));
        }
        let (lines, _) = check_logs(&logs);
        for member in 0..2 {
            for sender in 0..2 {
                assert_eq!(delivered_from(&lines, member, sender) as u64, COUNT);
            }
        }
    }
}

/// A persistent group run twice over the same logs: the second run first
/// replays the first one's history (said, and not counted as its own
/// traffic), then delivers exactly its own run's messages.
#[test]
fn a_persistent_run_over_an_earlier_log_counts_only_its_own_messages() {
    two_persistent_runs("again", "", |round, id, text, counter| {
        let replayed = counter("replayed_msgs");
        if round == 0 {
            assert_eq!(replayed, 0, "a first run has no history:\n{text}");
        } else {
            // Everything the first run delivered is history now.
            assert_eq!(replayed, 600, "member {id} replayed:\n{text}");
            assert!(
                text.contains(&format!("replayed {replayed} messages of earlier runs")),
                "member {id} does not say it replayed history:\n{text}"
            );
        }
    });
}
/// The same over logs compacted every 4 KiB: the second run restores
/// each member's snapshot, then replays only the records after it.
#[test]
fn a_persistent_run_over_a_compacted_log_restores_its_snapshot_then_the_rest() {
    two_persistent_runs("compact", "compact_log_bytes = 4096", |round, id, text, counter| {
        let (compactions, restored, replayed) = (
            counter("log_compactions"),
            counter("snapshots_restored"),
            counter("replayed_msgs"),
        );
        if round == 0 {
            // 600 messages of 64 B and more are far beyond 4 KiB.
            assert!(compactions > 0, "member {id} never compacted its log:\n{text}");
            assert_eq!((restored, replayed), (0, 0), "a first run has no history:\n{text}");
        } else {
            // The history is the snapshot plus the records after it:
            // fewer than the first run's 600 messages are replayed.
            assert_eq!(restored, 1, "member {id} restored no snapshot:\n{text}");
            assert!(replayed < 600, "member {id} replayed {replayed}:\n{text}");
            assert!(
                text.contains("restored the snapshot its persistent log was compacted to"),
                "member {id} does not say it restored a snapshot:\n{text}"
            );
        }
    });
}
