//! Scenarios for the life of a shm group file: creation, sharing, refusal
//! of bad or conflicting opens, clean removal, and recovery from crashes.
//!
//! Crashes are real: the test binary re-runs itself as a child process
//! (`SPINDLE_TEST_CHILD=open_and_abort`, test [`child_open_and_abort`]),
//! which opens the group and calls `abort()`, so the kernel drops its locks
//! exactly as it would for a member killed in production. Every wait is
//! bounded by [`STALL_MAX`] (a liveness bound, not a speed assertion).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use spindle_fabric::shm::{GroupFile, ShmFabric, ShmOptions};
use spindle_fabric::{Fabric, FabricError, PeerSet};

/// A wait that sees no progress for this long fails (liveness, not speed).
/// Generous: a child is a fresh process of the test binary.
const STALL_MAX: Duration = Duration::from_secs(60);
const ROW_BYTES: usize = 256;
const TAG: u64 = 0x5EED;

const CHILD_ENV: &str = "SPINDLE_TEST_CHILD";
const CHILD_DIR_ENV: &str = "SPINDLE_TEST_DIR";
const CHILD_GROUP_ENV: &str = "SPINDLE_TEST_GROUP";
const CHILD_MEMBERS_ENV: &str = "SPINDLE_TEST_MEMBERS";
const CHILD_RANK_ENV: &str = "SPINDLE_TEST_RANK";

/// Held while a child is spawned, and around every open that is expected
/// to fail after taking locks (`RankTaken`, `LayoutMismatch`).
///
/// Why: a refused `ShmFabric::open` releases its "live" read lock only by
/// closing its file, and an open-file-description lock lives as long as
/// any descriptor of that description. A child forked by a concurrent test
/// holds copies of every descriptor until it execs, so a close in that
/// window leaves the lock alive, and the last member of the refused
/// group then believes someone is still live and leaves its file behind.
static FORK_GUARD: Mutex<()> = Mutex::new(());

fn fork_guard() -> MutexGuard<'static, ()> {
    FORK_GUARD.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An open that must be refused; returns why.
fn open_refused(options: &ShmOptions, rank: usize) -> FabricError {
    let _guard = fork_guard();
    match ShmFabric::open(options, rank) {
        Ok(_) => panic!("opening member {rank} of '{}' must fail", options.group),
        Err(e) => e,
    }
}

fn options(dir: &Path, group: &str, member_count: usize) -> ShmOptions {
    let mut options = ShmOptions::new(group, member_count, ROW_BYTES, TAG);
    options.dir = dir.to_path_buf();
    options
}

fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("spindle-lifecycle-")
        .tempdir()
        .expect("create a temporary directory")
}

fn dir_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("list the test directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn file_is_created_readable_by_the_owner_only() {
    let dir = scratch_dir();
    let options = options(dir.path(), "mode", 2);
    let fabric = ShmFabric::open(&options, 0).expect("open");
    assert_eq!(fabric.path(), options.path());
    assert!(fabric.recovered_stale().is_none(), "a new file is not a recovery");
    let mode = std::fs::metadata(options.path())
        .expect("the group file exists while a member is open")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "group file mode is {:o}", mode & 0o777);
}

#[test]
fn file_is_removed_when_the_last_member_leaves() {
    let dir = scratch_dir();
    let options = options(dir.path(), "cleanup", 2);
    let member0 = ShmFabric::open(&options, 0).expect("open member 0");
    let member1 = ShmFabric::open(&options, 1).expect("open member 1");
    assert_eq!(member0.joined(), PeerSet(0b11));
    drop(member0);
    assert!(options.path().exists(), "member 1 is still open: the file must stay");
    assert!(
        matches!(member1.check_peers(), Err(FabricError::PeerLeft { rank: 0 })),
        "a clean leave is a departure, not a crash"
    );
    drop(member1);
    assert!(
        !options.path().exists(),
        "the last member out removes {}",
        options.path().display()
    );
    assert!(dir_entries(dir.path()).is_empty());
}

#[test]
fn second_open_of_a_live_rank_is_refused() {
    let dir = scratch_dir();
    let options = options(dir.path(), "taken", 2);
    let first = ShmFabric::open(&options, 0).expect("first open");
    let err = open_refused(&options, 0);
    match &err {
        FabricError::RankTaken { group, rank, pid } => {
            assert_eq!((group.as_str(), *rank), ("taken", 0));
            assert_eq!(*pid, std::process::id(), "the error names the holder");
        }
        other => panic!("expected RankTaken, got {other:?}"),
    }
    assert!(err.to_string().contains("already running"), "{err}");
    // The refused open left the first member and the file alone.
    first.check_peers().expect("no peer is gone");
    assert_eq!(first.joined(), PeerSet(0b01));
    let other_rank = ShmFabric::open(&options, 1).expect("rank 1 is free");
    drop(other_rank);
    drop(first);
    assert!(!options.path().exists());
}

#[test]
fn different_layout_is_refused_with_the_group_name() {
    let dir = scratch_dir();
    let good = options(dir.path(), "layout-grp", 2);
    let first = ShmFabric::open(&good, 0).expect("open member 0");

    let mut other_tag = good.clone();
    other_tag.layout_tag = TAG + 1;
    other_tag.layout_description = "the other layout".to_string();
    let mut other_count = options(dir.path(), "layout-grp", 3);
    other_count.layout_description = "three members".to_string();
    let mut other_row = options(dir.path(), "layout-grp", 2);
    other_row.row_len_bytes = ROW_BYTES * 2;

    for (what, bad) in [
        ("layout_tag", &other_tag),
        ("member_count", &other_count),
        ("row_len_bytes", &other_row),
    ] {
        let err = open_refused(bad, 1);
        match &err {
            FabricError::LayoutMismatch { group, found, expected } => {
                assert_eq!(group, "layout-grp");
                assert_eq!(found, &good.layout_description, "found: what the file holds");
                assert_eq!(expected, &bad.layout_description);
            }
            other => panic!("a different {what}: expected LayoutMismatch, got {other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains("'layout-grp'"),
            "the message names the group: {message}"
        );
    }
    // The refused members changed nothing: a matching member still joins.
    let second = ShmFabric::open(&good, 1).expect("matching layout joins");
    assert_eq!(first.joined(), PeerSet(0b11));
    drop((first, second));
    assert!(dir_entries(dir.path()).is_empty());
}

#[test]
fn invalid_group_names_are_refused_before_touching_the_disk() {
    let dir = scratch_dir();
    let long = "g".repeat(100);
    for name in ["a/b", "", long.as_str(), "..", ".hidden", "sp ace"] {
        match ShmFabric::open(&options(dir.path(), name, 2), 0) {
            Err(FabricError::InvalidGroupName { name: got }) => assert_eq!(got, name),
            Err(other) => panic!("group name {name:?}: expected InvalidGroupName, got {other}"),
            Ok(_) => panic!("group name {name:?} was accepted"),
        }
    }
    let longest_ok = "g".repeat(48);
    drop(ShmFabric::open(&options(dir.path(), &longest_ok, 1), 0).expect("48 characters are fine"));
    assert!(
        dir_entries(dir.path()).is_empty(),
        "nothing may be created for a refused name"
    );
}

#[test]
fn rank_out_of_range_is_refused() {
    let dir = scratch_dir();
    for (rank, member_count) in [(2, 2), (64, 3), (usize::MAX, 1)] {
        match ShmFabric::open(&options(dir.path(), "range", member_count), rank) {
            Err(FabricError::RankOutOfRange {
                rank: r,
                member_count: n,
            }) => assert_eq!((r, n), (rank, member_count)),
            Err(other) => panic!("rank {rank} of {member_count}: got {other}"),
            Ok(_) => panic!("rank {rank} of {member_count} was accepted"),
        }
    }
    assert!(dir_entries(dir.path()).is_empty());
}

#[test]
fn stale_file_of_a_crashed_run_is_replaced_and_reported() {
    let dir = scratch_dir();
    let options = options(dir.path(), "stale", 2);
    let child = spawn_child_member(dir.path(), "stale", 2, 0);
    let child_pid = child.id();
    expect_abort(wait_for_exit(child));

    assert!(options.path().exists(), "a crashed member leaves its file behind");
    let left = GroupFile::open(dir.path(), "stale").expect("the stale file is a group file");
    assert!(!left.live, "nobody holds the live lock after the crash");
    assert_eq!(left.member_state(0), "crashed");
    assert_eq!(left.member_state(1), "empty");
    drop(left);

    let fabric = ShmFabric::open(&options, 0).expect("a stale file does not block a new run");
    let report = fabric.recovered_stale().expect("the recovery is reported").to_string();
    assert!(report.contains("crashed"), "report: {report}");
    assert!(report.contains("member 0"), "report: {report}");
    assert!(
        report.contains(&format!("pid {child_pid}")),
        "report names the crashed process: {report}"
    );
    assert_eq!(fabric.joined(), PeerSet(0b01), "the crashed member's slot was cleared");
    fabric.check_peers().expect("no peer of the new run is gone");
    drop(fabric);
    assert!(!options.path().exists());
}

#[test]
fn crashed_peer_is_reported_gone_by_check_peers() {
    let dir = scratch_dir();
    let options = options(dir.path(), "crash", 2);
    let fabric = ShmFabric::open(&options, 0).expect("open member 0");
    fabric.check_peers().expect("member 1 has not joined yet");

    let mut child = spawn_child_member(dir.path(), "crash", 2, 1);
    let started = Instant::now();
    while !fabric.joined().contains(1) {
        if let Some(status) = child.try_wait().expect("poll the child") {
            panic!(
                "member 1 exited ({status}) before it joined:\n{}",
                output_text(&wait_for_exit(child))
            );
        }
        assert!(
            started.elapsed() < STALL_MAX,
            "member 1 did not join within {} s (liveness bound)",
            STALL_MAX.as_secs()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    expect_abort(wait_for_exit(child));

    let started = Instant::now();
    let err = loop {
        match fabric.check_peers() {
            Err(e) => break e,
            Ok(()) => assert!(
                started.elapsed() < STALL_MAX,
                "the crash of member 1 was not noticed within {} s (liveness bound)",
                STALL_MAX.as_secs()
            ),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(
        matches!(err, FabricError::PeerGone { rank: 1 }),
        "expected PeerGone {{ rank: 1 }}, got {err:?}"
    );
    assert!(err.to_string().contains("member 1 is gone"), "{err}");
    assert!(fabric.joined().contains(1), "a crashed member stays joined");

    // The crashed member does not keep the file alive.
    drop(fabric);
    assert!(!options.path().exists());
}

// ---- the child process ---------------------------------------------------

/// Child side of the crash scenarios: open the group named by the
/// environment, then abort without any cleanup. Run without
/// `SPINDLE_TEST_CHILD` (an ordinary `cargo test`), it does nothing.
#[test]
fn child_open_and_abort() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("open_and_abort") {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"));
    let members: usize = var(CHILD_MEMBERS_ENV).parse().expect("member count");
    let rank: usize = var(CHILD_RANK_ENV).parse().expect("rank");
    let options = options(Path::new(&var(CHILD_DIR_ENV)), &var(CHILD_GROUP_ENV), members);
    let fabric = ShmFabric::open(&options, rank).expect("child: open the group");
    assert!(fabric.joined().contains(rank));
    disable_core_dumps();
    std::process::abort();
}

fn disable_core_dumps() {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on this process; `none` is a valid rlimit
    // that lives across the call. Failure only means a core file may be
    // written, which does not affect the scenario.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Re-run this test binary as member `rank` that opens and aborts.
fn spawn_child_member(dir: &Path, group: &str, members: usize, rank: usize) -> Child {
    let exe = std::env::current_exe().expect("path of the test binary");
    let _guard = fork_guard();
    Command::new(exe)
        .args(["--exact", "child_open_and_abort", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "open_and_abort")
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_GROUP_ENV, group)
        .env(CHILD_MEMBERS_ENV, members.to_string())
        .env(CHILD_RANK_ENV, rank.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child member")
}

/// Wait (bounded) for the child to exit and collect its output.
fn wait_for_exit(mut child: Child) -> Output {
    let started = Instant::now();
    while child.try_wait().expect("poll the child").is_none() {
        if started.elapsed() > STALL_MAX {
            let _ = child.kill();
            let output = child.wait_with_output().expect("reap the killed child");
            panic!(
                "the child member did not exit within {} s (liveness bound):\n{}",
                STALL_MAX.as_secs(),
                output_text(&output)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("collect the child's output")
}

fn expect_abort(output: Output) {
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGABRT),
        "the child member should have opened the group and aborted; it exited with {}:\n{}",
        output.status,
        output_text(&output)
    );
}

fn output_text(output: &Output) -> String {
    format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
