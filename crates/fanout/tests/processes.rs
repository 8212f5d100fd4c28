//! Domains of processes: member processes (this test binary re-executed
//! with `--member ...`) attached to one `/dev/shm` domain.
//!
//! - random joins, leaves and multicasts from three member processes, in
//!   every layout (for the broadcast, `tree`, this process relays at the
//!   root): every multicast reaches exactly its snapshot of members,
//!   once, and completes;
//! - a member process killed (SIGKILL) without leaving: the next
//!   multicast returns `AckTimeout` naming its slot (not a hang), and its
//!   slot is taken over once the process is reaped;
//! - the bad inputs of create/open/attach each have their error.
//!
//! Bounded: by operation counts and per-call timeouts; the parent kills
//! any child still running after `CHILD_DEADLINE` and fails. Every domain
//! file is removed by a guard, also when a check fails. (`harness =
//! false`: `main` runs the cases, or one member when re-executed.)

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spindle_fanout::model::Rng;

mod common;
use spindle_fanout::{Domain, FanoutError, Layout, Shape, Tree, WaitConfig};

/// A liveness bound (a hang guard, never a speed target): waits for the
/// other processes, multicast acknowledgements and leaves.
const TIMEOUT: Duration = Duration::from_secs(60);
const CHILD_DEADLINE: Duration = Duration::from_secs(120);
const OPS_PER_MEMBER: usize = 200;

fn wait_config() -> WaitConfig {
    WaitConfig {
        spins: 200,
        yields: 16,
        park_max: Duration::from_millis(2),
    }
}

/// Removes a domain's file when dropped (a failed check included).
struct ShmGuard(String);

impl Drop for ShmGuard {
    fn drop(&mut self) {
        let _ = Domain::remove_shm(&self.0);
    }
}

/// Children killed (and reaped) when dropped, so a failing case leaves no
/// process behind.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Children {
    /// Wait for every child to exit successfully, at most `CHILD_DEADLINE`.
    fn wait_all(&mut self) {
        let deadline = Instant::now() + CHILD_DEADLINE;
        for (i, c) in self.0.iter_mut().enumerate() {
            loop {
                if let Some(status) = c.try_wait().expect("try_wait") {
                    assert!(status.success(), "member process {i} failed: {status}");
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "member process {i} still running after {CHILD_DEADLINE:?}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

fn unique_name(case: &str) -> String {
    format!("test-{}-{case}", std::process::id())
}

fn member(args: &[String]) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test binary"));
    c.arg("--member").args(args);
    c
}

/// `--member random NAME SLOT SEED LOG`: random joins, leaves, multicasts
/// and serving; deliveries (`D seq slot`) and completions (`C seq
/// targets`) written to LOG.
fn member_random(name: &str, slot: usize, seed: u64, log_path: &Path) {
    let domain = Domain::open_shm(name, wait_config()).expect("open the domain");
    let deliveries: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let log = deliveries.clone();
    let mut port = domain
        .attach(slot, move |d| log.lock().unwrap().push((d.seq, d.slot)))
        .expect("attach");
    // Start together: wait (bounded) until every slot but the root is held.
    let start = Instant::now();
    while (1..domain.state().slots()).any(|s| domain.state().slot_pid(s) == 0) {
        assert!(start.elapsed() < TIMEOUT, "the other members did not attach");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut rng = Rng::new(seed);
    let mut completions = Vec::new();
    let mut joined = false;
    for _ in 0..OPS_PER_MEMBER {
        match rng.below(10) {
            0..=1 if !joined => {
                port.join().expect("join");
                joined = true;
            }
            0..=1 => {
                port.leave(TIMEOUT).expect("leave");
                joined = false;
            }
            2..=4 if joined => {
                let done = port.multicast(slot as u64, TIMEOUT).expect("multicast");
                assert_eq!(done.targets & (1 << slot), 0, "the origin is not its own target");
                completions.push((done.seq, done.targets));
            }
            _ => {
                port.serve(Duration::from_micros(300));
            }
        }
    }
    if joined {
        port.leave(TIMEOUT).expect("leave");
    }
    if domain.state().layout().interrupts_non_members() {
        // A broadcast needs every slot served: keep serving until every
        // member process is done (a marker file each), bounded.
        std::fs::write(log_path.with_extension("done"), "").expect("write the marker");
        let start = Instant::now();
        let all_done =
            || (1..domain.state().slots()).all(|s| log_path.with_file_name(format!("member-{s}.done")).exists());
        while !all_done() {
            assert!(start.elapsed() < TIMEOUT, "the other members did not finish");
            port.serve(Duration::from_millis(1));
        }
    }
    let mut out = String::new();
    for (seq, s) in deliveries.lock().unwrap().iter() {
        out += &format!("D {seq} {s}\n");
    }
    for (seq, targets) in &completions {
        out += &format!("C {seq} {targets}\n");
    }
    std::fs::write(log_path, out).expect("write the log");
}

/// `--member hold NAME SLOT`: attach, join, say `ready`, then serve
/// nothing (sleep) until killed, or exit after `CHILD_DEADLINE`.
fn member_hold(name: &str, slot: usize) {
    let domain = Domain::open_shm(name, wait_config()).expect("open the domain");
    let port = domain.attach(slot, |_| {}).expect("attach");
    port.join().expect("join");
    println!("ready");
    std::io::stdout().flush().expect("flush");
    std::thread::sleep(CHILD_DEADLINE);
}

fn random_members_reach_exactly_the_snapshot(layout: Layout, seed: u64) {
    const SLOTS: usize = 4;
    let name = unique_name(&format!("random-{}", layout.name()));
    let _guard = ShmGuard(name.clone());
    // Slot 0 (the root) has no member: helping forwards on its behalf.
    let domain = Domain::create_shm(
        &name,
        Tree::build(Shape::Kary(2), SLOTS).unwrap(),
        layout,
        wait_config(),
    )
    .expect("create the domain");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let logs: Vec<_> = (1..SLOTS).map(|s| dir.path().join(format!("member-{s}.log"))).collect();
    let mut children = Children(
        (1..SLOTS)
            .map(|slot| {
                let args = [
                    "random".to_string(),
                    name.clone(),
                    slot.to_string(),
                    (seed ^ (slot as u64) << 32).to_string(),
                    logs[slot - 1].display().to_string(),
                ];
                member(&args).spawn().expect("spawn a member process")
            })
            .collect(),
    );
    // The root (slot 0) is no member; a broadcast interrupts it, so here
    // this process serves it as a relay until the members are done.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relay = layout.interrupts_non_members().then(|| {
        let (domain, stop) = (domain.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut port = domain.attach(0, |_| panic!("the relay is no target")).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                port.serve(Duration::from_millis(5));
            }
        })
    });
    children.wait_all();
    stop.store(true, std::sync::atomic::Ordering::Release);
    if let Some(relay) = relay {
        relay.join().expect("the relay thread");
    }
    let mut deliveries = Vec::new();
    let mut completions = Vec::new();
    for path in &logs {
        for line in std::fs::read_to_string(path).expect("a member's log").lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let (a, b): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
            match f[0] {
                "D" => deliveries.push((a, b as usize)),
                "C" => completions.push((a, b)),
                other => panic!("bad log line kind {other}"),
            }
        }
    }
    let delivered = common::check_exactly_the_snapshots(&format!("{layout:?}"), SLOTS, &deliveries, &completions, 11);
    assert!(delivered > 0, "{layout:?}: messages crossed processes");
    print!("({} multicasts, {delivered} deliveries) ", completions.len());
    assert_eq!(domain.state().members(), 0, "{layout:?}: every member left");
    assert_eq!(domain.state().failed_seq(), 0);
    let path = domain.shm_path().expect("a mapped domain").to_path_buf();
    drop(domain);
    assert!(!path.exists(), "the creator removes the file when it drops the domain");
}

fn a_killed_member_is_named_by_ack_timeout_and_its_slot_taken_over() {
    for layout in [Layout::Flat, Layout::TreeHelpSkip] {
        let name = unique_name(&format!("killed-{}", layout.name()));
        let _guard = ShmGuard(name.clone());
        let domain = Domain::create_shm(&name, Tree::build(Shape::Kary(2), 4).unwrap(), layout, wait_config())
            .expect("create the domain");
        let mut origin = domain.attach(0, |_| {}).unwrap();
        origin.join().unwrap();
        let mut children = Children(vec![member(&["hold".into(), name.clone(), "2".into()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a member process")]);
        let child_pid = children.0[0].id();
        let mut ready = String::new();
        BufReader::new(children.0[0].stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "ready", "{layout:?}");
        assert_eq!(domain.state().members(), 0b101);
        assert_eq!(domain.state().slot_pid(2), child_pid);
        // The slot is held by a live process.
        let e = domain.attach(2, |_| {}).err().expect("a live process holds slot 2");
        assert_eq!(
            e,
            FanoutError::SlotTaken {
                slot: 2,
                pid: child_pid
            },
            "{layout:?}"
        );
        assert!(e.to_string().contains("held by process"), "{e}");
        // SIGKILL: no leave, no detach.
        children.0[0].kill().unwrap();
        children.0[0].wait().unwrap();
        let e = origin.multicast(9, Duration::from_millis(200)).unwrap_err();
        match &e {
            FanoutError::AckTimeout { missing, origin: 0, .. } => assert_eq!(missing, &vec![2], "{layout:?}"),
            other => panic!("{layout:?}: expected AckTimeout, got {other}"),
        }
        assert_eq!(domain.state().members(), 0b1, "{layout:?}: the dead member was evicted");
        // Reaped: its slot is free to take over (as a non-member now).
        let mut heir = domain.attach(2, |_| {}).expect("the dead process's slot is taken over");
        assert_eq!(domain.state().slot_pid(2), std::process::id());
        heir.join().unwrap();
        heir.leave(Duration::from_millis(10)).unwrap();
        drop(heir);
        assert_eq!(domain.state().slot_pid(2), 0, "a dropped port frees its slot");
    }
}

fn bad_inputs_of_processes_have_their_errors() {
    let name = unique_name("bad");
    let _guard = ShmGuard(name.clone());
    let tree = || Tree::build(Shape::Kary(2), 3).unwrap();
    // A missing domain.
    let e = Domain::open_shm(&name, wait_config()).err().unwrap();
    assert!(matches!(e, FanoutError::ShmMissing { .. }), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    // A bad name.
    let e = Domain::create_shm("a/b", tree(), Layout::Flat, wait_config())
        .err()
        .unwrap();
    assert!(matches!(e, FanoutError::BadShmName { .. }), "{e}");
    // Too many slots for one membership word.
    let e = Domain::create_shm(
        &name,
        Tree::build(Shape::Flat, 64).unwrap(),
        Layout::Flat,
        wait_config(),
    )
    .err()
    .unwrap();
    assert_eq!(e, FanoutError::TooManyLiveSlots { slots: 64, max: 63 });
    // Created twice.
    let domain = Domain::create_shm(&name, tree(), Layout::TreeHelpSkip, wait_config()).unwrap();
    let path = domain.shm_path().unwrap().to_path_buf();
    let e = Domain::create_shm(&name, tree(), Layout::Flat, wait_config())
        .err()
        .unwrap();
    assert!(matches!(e, FanoutError::ShmExists { .. }), "{e}");
    // Opened: the creator's tree and layout; one port per slot.
    let opened = Domain::open_shm(&name, wait_config()).unwrap();
    assert_eq!(opened.state().layout(), Layout::TreeHelpSkip);
    assert_eq!(opened.state().slots(), 3);
    let port = domain.attach(1, |_| {}).unwrap();
    port.join().unwrap();
    assert_eq!(opened.state().members(), 0b10, "one region seen by both");
    let e = opened.attach(1, |_| {}).err().unwrap();
    assert_eq!(e, FanoutError::SlotAttached { slot: 1 });
    drop(port);
    drop(opened);
    // A region another build wrote: a different version word.
    let bytes = std::fs::read(&path).unwrap();
    let mut other = bytes.clone();
    other[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &other).unwrap();
    let e = Domain::open_shm(&name, wait_config()).err().unwrap();
    assert!(e.to_string().contains("version 99"), "{e}");
    // A layout tag this build does not know.
    let mut other = bytes.clone();
    other[12..16].copy_from_slice(&7u32.to_le_bytes());
    std::fs::write(&path, &other).unwrap();
    let e = Domain::open_shm(&name, wait_config()).err().unwrap();
    assert!(e.to_string().contains("unknown multicast layout tag 7"), "{e}");
    // Another tree (the slot count says 4, the hash is of 3).
    let mut other = bytes.clone();
    other[24..28].copy_from_slice(&4u32.to_le_bytes());
    std::fs::write(&path, &other).unwrap();
    let e = Domain::open_shm(&name, wait_config()).err().unwrap();
    assert!(e.to_string().contains("differs from the one built here"), "{e}");
    // Not a region: no magic; and the wrong size.
    std::fs::write(&path, vec![0u8; bytes.len()]).unwrap();
    let e = Domain::open_shm(&name, wait_config()).err().unwrap();
    assert!(
        matches!(e, FanoutError::ShmMismatch { .. }) && e.to_string().contains("magic"),
        "{e}"
    );
    std::fs::write(&path, b"short").unwrap();
    let e = Domain::open_shm(&name, wait_config()).err().unwrap();
    assert!(e.to_string().contains("5 bytes"), "{e}");
    // The creator's drop removes the file; remove_shm then finds none.
    drop(domain);
    assert!(!path.exists());
    assert!(!Domain::remove_shm(&name).unwrap());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--member") {
        match args.get(2).map(String::as_str) {
            Some("random") => member_random(
                &args[3],
                args[4].parse().unwrap(),
                args[5].parse().unwrap(),
                Path::new(&args[6]),
            ),
            Some("hold") => member_hold(&args[3], args[4].parse().unwrap()),
            other => panic!("unknown member role {other:?}"),
        }
        return;
    }
    type Case = (&'static str, fn());
    let cases: [Case; 6] = [
        (
            "bad_inputs_of_processes_have_their_errors",
            bad_inputs_of_processes_have_their_errors,
        ),
        (
            "a_killed_member_is_named_by_ack_timeout_and_its_slot_taken_over",
            a_killed_member_is_named_by_ack_timeout_and_its_slot_taken_over,
        ),
        ("random_members_reach_exactly_the_snapshot_tree", || {
            random_members_reach_exactly_the_snapshot(Layout::Tree, 10)
        }),
        ("random_members_reach_exactly_the_snapshot_flat", || {
            random_members_reach_exactly_the_snapshot(Layout::Flat, 11)
        }),
        ("random_members_reach_exactly_the_snapshot_tree_help", || {
            random_members_reach_exactly_the_snapshot(Layout::TreeHelp, 12)
        }),
        ("random_members_reach_exactly_the_snapshot_tree_help_skip", || {
            random_members_reach_exactly_the_snapshot(Layout::TreeHelpSkip, 13)
        }),
    ];
    // `cargo test` passes filters and libtest's flags through: run the
    // cases whose name contains every filter; `--list` lists them (in
    // libtest's terse format), `--ignored` runs none (none is ignored).
    const FLAGS_WITH_VALUE: [&str; 6] = ["--test-threads", "--skip", "--color", "--format", "--logfile", "-Z"];
    let mut filters = Vec::new();
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        if FLAGS_WITH_VALUE.contains(&arg.as_str()) {
            rest.next();
        } else if !arg.starts_with('-') {
            filters.push(arg);
        }
    }
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &cases {
            println!("{name}: test");
        }
        return;
    }
    if args.iter().any(|a| a == "--ignored") {
        return;
    }
    let mut ran = 0;
    for (name, case) in cases {
        if filters.iter().all(|f| name.contains(f.as_str())) {
            print!("test {name} ... ");
            std::io::stdout().flush().unwrap();
            case();
            println!("ok");
            ran += 1;
        }
    }
    println!("\ntest result: ok. {ran} passed");
}
