//! The two phases of the collective commit (prepare/admit everywhere,
//! then activate with the agreed epoch_start, or abort everywhere), and
//! the watchdog's early miss detection when the dispatcher stalls.
//! Members are threads, each with its own `ShmFabric`. No wall-clock
//! bound is asserted: only who reported what, and in which order.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::wait_all_joined;
use spindle_rt::clock::InjectedClock;
use spindle_rt::clock_service::{ClockService, ClockServiceConfig};
use spindle_rt::node::{layout_for, CommitConfig, CommitError, MissKind, MissReport, RtNode};
use spindle_rt::watchdog::WatchdogConfig;
use spindle_rt::{TaskKind, TaskSpec, TimeQos};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

fn config(periods: u64) -> CommitConfig {
    CommitConfig {
        clock_bound_budget_ns: 500 * US,
        release_jitter_ns: 0,
        lead_ns: 30 * MS,
        periods,
        timeout: Duration::from_secs(20),
        force: false,
    }
}

/// Run `body(rank, node)` on `members` member threads over shm, with no
/// channels (computation tasks only), and collect what each returns.
fn members<T: Send + 'static>(
    name: &str,
    members: usize,
    body: impl Fn(usize, &mut RtNode<ShmFabric>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let group = format!("{name}-{}", std::process::id());
    let body = Arc::new(body);
    let handles: Vec<_> = (0..members)
        .map(|rank| {
            let (group, body) = (group.clone(), body.clone());
            std::thread::spawn(move || {
                let layout = Arc::new(layout_for(members, &[]));
                let options = ShmOptions::new(&group, members, layout.row.row_len_bytes(), layout.row.tag());
                let fabric = Arc::new(ShmFabric::open(&options, rank).unwrap());
                wait_all_joined(&*fabric, &group, Duration::from_secs(20)).unwrap();
                let injected = InjectedClock::new(spindle_runtime::monotonic_ns(), rank as i64 * 300_000, 0);
                let service =
                    ClockService::start(fabric.clone(), layout.clone(), injected, ClockServiceConfig::default());
                service.wait_synced(500 * US, Duration::from_secs(20)).unwrap();
                let mut node = RtNode::new(fabric, layout, service.clock().clone(), vec![]).unwrap();
                let out = body(rank, &mut node);
                drop(node);
                drop(service);
                out
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(!std::path::Path::new("/dev/shm")
        .join(format!("spindle-{group}"))
        .exists());
    out
}

fn task(name: &str, offset_ns: u64, compute_ns: u64, deadline_ns: u64) -> TaskSpec {
    TaskSpec::new(
        name,
        TaskKind::Computation,
        TimeQos::new(offset_ns, 10 * MS, deadline_ns),
        compute_ns,
    )
}

#[test]
fn an_abort_in_the_activation_phase_aborts_on_every_node_then_a_retry_activates() {
    let results = members("rt-2pc", 3, |rank, node| {
        node.register_computation(task("tick", 0, 20 * US, 2 * MS), Box::new(|_| {}))
            .unwrap();
        if rank == 2 {
            node.veto_next_activation("no room for the buffers (injected)");
        }
        let first = node.commit(&config(3));
        let committed_after_abort = node.is_committed();
        // Phase 2 aborted: nobody is active, and the same set commits again.
        let second = node.commit(&config(3)).map(|c| c.epoch_start_ns);
        let stats = node.run(0, &mut |_| {}).unwrap();
        node.uncommit();
        (
            first.map(|c| c.epoch_start_ns),
            committed_after_abort,
            second,
            stats.counters,
        )
    });
    for (rank, (first, committed, second, counters)) in results.iter().enumerate() {
        match first {
            Err(CommitError::Aborted { node, reason }) => {
                assert_eq!(*node, 2, "rank {rank}: the aborting node is named");
                assert!(reason.contains("no room for the buffers"), "rank {rank}: {reason}");
            }
            other => panic!("rank {rank}: expected an abort at activation, got {other:?}"),
        }
        assert!(!committed, "rank {rank} stayed uncommitted after the abort");
        assert!(second.is_ok(), "rank {rank}: the retry commits: {second:?}");
        assert_eq!(counters.released, 3, "rank {rank} ran its 3 periods");
    }
    let epochs: Vec<u64> = results.iter().map(|r| *r.2.as_ref().unwrap()).collect();
    assert!(
        epochs.iter().all(|e| *e == epochs[0]),
        "one agreed epoch_start: {epochs:?}"
    );
}

#[test]
fn a_rejection_in_the_admission_phase_names_the_node_the_task_and_the_reason_everywhere() {
    let results = members("rt-reject-2pc", 2, |rank, node| {
        // Node 1's two tasks cannot both fit: 2 × 1.2 ms of compute in the
        // same 2 ms window.
        let compute = if rank == 1 { 1_200 * US } else { 20 * US };
        for name in ["filter", "smooth"] {
            node.register_computation(task(&format!("n{rank} {name}"), 0, compute, 2 * MS), Box::new(|_| {}))
                .unwrap();
        }
        (node.commit(&config(3)).map(|_| ()), node.is_committed())
    });
    for (rank, (result, committed)) in results.iter().enumerate() {
        let Err(CommitError::Rejected { node, reason }) = result else {
            panic!("rank {rank}: expected a rejection, got {result:?}");
        };
        assert_eq!(*node, 1, "rank {rank}");
        assert!(reason.contains("task 'n1 "), "rank {rank}: names the task: {reason}");
        assert!(
            reason.contains("demand") || reason.contains("utilization"),
            "rank {rank}: says why: {reason}"
        );
        assert!(!committed, "rank {rank} never activated");
    }
}

#[test]
fn interference_measured_on_one_node_rejects_the_commit_everywhere_with_task_bound_and_interference() {
    let results = members("rt-reject-interference", 2, |rank, node| {
        // The same feasible task on both nodes; node 1's host was seen
        // taking the CPU for 838 µs, more than the 1 ms deadline leaves.
        node.register_computation(task(&format!("n{rank} user"), 0, 50 * US, MS), Box::new(|_| {}))
            .unwrap();
        let interference_ns = if rank == 1 { 838 * US } else { 0 };
        node.set_admission(spindle_rt::AdmissionMode::WorstCase, interference_ns);
        (node.commit(&config(3)).map(|_| ()), node.is_committed())
    });
    for (rank, (result, committed)) in results.iter().enumerate() {
        let Err(CommitError::Rejected { node, reason }) = result else {
            panic!("rank {rank}: expected a rejection, got {result:?}");
        };
        assert_eq!(*node, 1, "rank {rank}");
        // 50 µs + 838 µs + the 500 µs clock budget.
        for needle in [
            "task 'n1 user'",
            "at least 1388000 ns",
            "interference 838000 ns measured",
        ] {
            assert!(reason.contains(needle), "rank {rank}: '{needle}' not in: {reason}");
        }
        assert!(!committed, "rank {rank} never activated");
    }
}

#[test]
fn members_admitting_in_different_modes_do_not_commit() {
    let results = members("rt-mode-mismatch", 2, |rank, node| {
        node.register_computation(task(&format!("n{rank} user"), 0, 50 * US, 2 * MS), Box::new(|_| {}))
            .unwrap();
        let mode = if rank == 0 {
            spindle_rt::AdmissionMode::WorstCase
        } else {
            spindle_rt::AdmissionMode::Statistical { miss_budget: 1e-4 }
        };
        node.set_admission(mode, 0);
        node.commit(&config(3)).map(|_| ())
    });
    for (rank, result) in results.iter().enumerate() {
        assert!(
            matches!(result, Err(CommitError::Mismatch { .. })),
            "rank {rank}: {result:?}"
        );
    }
}

#[test]
fn the_watchdog_reports_a_job_at_its_critical_start_while_the_dispatcher_is_stalled() {
    let out = members("rt-watchdog", 1, |_, node| {
        let reported = Arc::new(AtomicBool::new(false));
        let seen_during_stall = Arc::new(AtomicBool::new(false));
        let stall_over = Arc::new(AtomicBool::new(false));
        // The staller (released first) blocks the dispatcher until the
        // watchdog has reported the victim (bounded: at most 10 s).
        let (r, seen, over) = (reported.clone(), seen_during_stall.clone(), stall_over.clone());
        let stalled_once = AtomicBool::new(false);
        node.register_computation(
            task("staller", 0, 100 * US, 5 * MS),
            Box::new(move |_| {
                // The first staller job that runs stalls (period 0 unless
                // the dispatcher started so late that it was dropped).
                if stalled_once.swap(true, Ordering::AcqRel) {
                    return;
                }
                for _ in 0..10_000 {
                    if r.load(Ordering::Acquire) {
                        seen.store(true, Ordering::Release);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                over.store(true, Ordering::Release);
            }),
        )
        .unwrap();
        let victim_ran = Arc::new(AtomicU64::new(0));
        let ran = victim_ran.clone();
        node.register_computation(
            // Its absolute deadline (5.1 ms) is after the staller's (5 ms):
            // a dispatcher that wakes after both are due (a host stall at
            // the start) still runs the staller first. (With 4 ms, a 200 µs
            // late start ran the victim first and the watchdog reported
            // period 1 instead: a CI failure on a stall-prone VM.)
            task("victim", 200 * US, MS, 4_900 * US),
            Box::new(move |ctx| {
                ran.fetch_or(1 << ctx.job.period, Ordering::Relaxed);
            }),
        )
        .unwrap();
        let by_watchdog: Arc<Mutex<Vec<(MissReport, bool)>>> = Arc::default();
        let (log, r, over) = (by_watchdog.clone(), reported.clone(), stall_over.clone());
        node.set_watchdog(Some(WatchdogConfig {
            on_interference: None,
            on_miss: Arc::new(move |m| {
                log.lock().unwrap().push((m.clone(), over.load(Ordering::Acquire)));
                r.store(true, Ordering::Release);
            }),
            fifo_priority: None,
        }));
        node.commit(&config(2)).unwrap();
        let mut by_dispatcher = Vec::new();
        let stats = node.run(0, &mut |m| by_dispatcher.push(m.clone())).unwrap();
        let by_watchdog = by_watchdog.lock().unwrap().clone();
        (
            stats.counters,
            by_watchdog,
            by_dispatcher,
            seen_during_stall.load(Ordering::Acquire),
            victim_ran.load(Ordering::Relaxed),
        )
    });
    let (counters, by_watchdog, by_dispatcher, seen_during_stall, victim_ran) = &out[0];
    // The victim job whose critical start came during the stall: period 0,
    // or a later one when a loaded machine started the dispatcher late.
    let (m, stall_was_over) = by_watchdog
        .iter()
        .find(|(m, _)| m.task == "victim")
        .unwrap_or_else(|| panic!("the watchdog reported a victim job: {by_watchdog:?}"));
    let period = m.period;
    assert_eq!(
        by_watchdog
            .iter()
            .filter(|(w, _)| w.task == "victim" && w.period == period)
            .count(),
        1,
        "reported once: {by_watchdog:?}"
    );
    assert_eq!(m.kind, MissKind::NotStarted);
    assert!(!stall_was_over, "reported while the dispatcher was still stalled");
    assert!(*seen_during_stall, "the stalled job saw the report before it returned");
    assert!(
        m.detected_ns >= m.critical_start_ns,
        "never before the critical start: {m:?}"
    );
    assert_eq!(
        victim_ran & (1 << period),
        0,
        "a job reported missed is not run afterwards"
    );
    // Reported once: the dispatcher, resuming, drops it without a second report.
    assert!(
        !by_dispatcher
            .iter()
            .any(|d| d.task == "victim" && d.period == period && d.kind == MissKind::Early),
        "reported twice: {by_dispatcher:?}"
    );
    assert!(counters.missed_by_watchdog >= 1 && counters.missed_early >= counters.missed_by_watchdog);
    assert_eq!(counters.released, counters.completed + counters.missed_early);
    println!(
        "watchdog: victim period {period} detected {} ns after its critical start, {} ns before its deadline",
        m.detected_ns as i64 - m.critical_start_ns as i64,
        m.deadline_ns as i64 - m.detected_ns as i64
    );
}
