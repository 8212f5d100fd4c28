//! Scenarios over real shm fabrics, one member per thread (each with its
//! own `ShmFabric`). No wall-clock bounds are asserted: a machine that
//! preempts the dispatchers may miss messages, but every miss must be
//! counted (never silent), and infeasible sets must be rejected by name.

use std::path::{Path, PathBuf};

use spindle_rt::AdmissionMode;

use spindle_bench::rt::scenario::{
    run_member, MemberReport, NodeClockSpec, Scenario, ScenarioSpec, StageSpec, TransportSpec,
};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// A result directory removed when dropped (also when a test panics).
fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("spindle-rt-test-").tempdir().unwrap()
}

fn stage(node: usize, kind: &str, offset_ns: u64, compute_ns: u64, deadline_ns: u64) -> StageSpec {
    StageSpec {
        node,
        kind: kind.into(),
        offset_ns,
        compute_ns,
        deadline_ns,
    }
}

fn base_spec(scenario: Scenario, group: &str, members: usize, dir: &Path) -> ScenarioSpec {
    ScenarioSpec {
        scenario,
        group: format!("{group}-{}", std::process::id()),
        members,
        period_ns: vec![4 * MS],
        periods: 30,
        sizes: vec![16],
        stages: vec![
            stage(0, "user", 0, 20 * US, 500 * US),
            stage(0, "send", 500 * US, 20 * US, 500 * US),
            stage(1, "recv", 1_500 * US, 20 * US, 500 * US),
            stage(1, "user", 2_000 * US, 20 * US, 500 * US),
        ],
        wraps: false,
        clocks: vec![
            NodeClockSpec::default(),
            NodeClockSpec {
                offset_ns: 2_500_000,
                drift_ppb: 30_000,
                jumps: vec![],
            },
        ],
        clock_bound_budget_ns: 200 * US,
        jitter_samples: 20,
        // Declared, so that admission does not depend on this machine's load.
        release_jitter_declared_ns: Some(0),
        spin_ns: 50 * US,
        spin_auto: false,
        fifo: false,
        force: false,
        lead_ns: 30 * MS,
        duration_ns: 300 * MS,
        sample_interval_ns: 5 * MS,
        seed: 7,
        start_mono_ns: spindle_runtime::monotonic_ns(),
        result_dir: dir.to_path_buf(),
        join_timeout_ms: 20_000,
        best_effort_quota: 2,
        transport: TransportSpec::default(),
        watchdog: true,
        admission: AdmissionMode::WorstCase,
        // A short calibration, and interference declared (like the jitter)
        // so that admission does not depend on this machine's load.
        calibration_ns: 0,
        interference_declared_ns: Some(0),
        interference_headroom_pct: 100,
        // No host record: the tests never read or write this host's.
        release_jitter_recorded_ns: 0,
        interference_recorded_ns: 0,
        host_record: None,
    }
}

fn run_all(spec: &ScenarioSpec) -> Vec<Result<MemberReport, String>> {
    let handles: Vec<_> = (0..spec.members)
        .map(|rank| {
            let spec = spec.clone();
            std::thread::spawn(move || run_member(&spec, rank))
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let shm = PathBuf::from("/dev/shm").join(format!("spindle-{}", spec.group));
    assert!(!shm.exists(), "the group file {} was left behind", shm.display());
    out
}

/// Run a 2-member pipeline; every message arrived or was counted missing.
fn run_pipeline(spec: &ScenarioSpec) -> Vec<MemberReport> {
    let reports: Vec<MemberReport> = run_all(spec).into_iter().map(|r| r.unwrap()).collect();
    let (sender, receiver) = (&reports[0].runs[0], &reports[1].runs[0]);
    assert!(sender.verdicts.iter().all(|v| v.is_none()), "{:?}", sender.verdicts);
    assert_eq!(sender.epoch_start_ns, receiver.epoch_start_ns, "one agreed epoch_start");
    let delivered = receiver.extracted_ns.iter().filter(|t| **t > 0).count() as u64;
    // Every message either arrived, or the application counted it missing,
    // or the application's job was itself reported missed. A job the
    // watchdog reported as not started may still run late (a stalled
    // dispatcher resumes) and take its message: then it counts in both,
    // so the sum may exceed the periods, but nothing is unaccounted and
    // the application never counts one period twice.
    assert!(
        delivered + receiver.app_missed <= spec.periods,
        "no period counted twice: {delivered} delivered + {} missed > {} periods",
        receiver.app_missed,
        spec.periods
    );
    assert!(
        delivered + receiver.app_missed + receiver.user_jobs_missed >= spec.periods,
        "every message accounted for: {delivered} delivered + {} missed + {} jobs missed < {} periods",
        receiver.app_missed,
        receiver.user_jobs_missed,
        spec.periods
    );
    // Every released job either completed or was reported as missed.
    for r in [sender, receiver] {
        assert_eq!(r.counters.released, r.counters.completed + r.counters.missed_early);
    }
    reports
}

#[test]
fn zero_sided_pipeline_delivers_or_counts_every_message() {
    let dir = tempdir();
    let spec = base_spec(Scenario::Latency, "rt-pipe", 2, dir.path());
    let reports = run_pipeline(&spec);
    let (sender, receiver) = (&reports[0].runs[0], &reports[1].runs[0]);
    // Latency is measured for each delivered message against the sender's insert.
    for k in 0..spec.periods as usize {
        if receiver.extracted_ns[k] > 0 {
            assert!(sender.inserted_ns[k] > 0 && sender.inserted_ns[k] < receiver.extracted_ns[k]);
        }
    }
}

#[test]
fn a_self_tuned_spin_window_is_calibrated_reported_and_capped() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Latency, "rt-autospin", 2, dir.path());
    spec.spin_auto = true;
    let reports = run_pipeline(&spec);
    let cap = spindle_rt::spin::spin_cap_ns(spec.period_ns[0]);
    for r in &reports {
        assert!(r.spin.auto, "rank {}: {:?}", r.rank, r.spin);
        assert_eq!(r.spin.cap_ns, cap);
        assert!(r.spin.calibration_sleeps > 0);
        assert!(
            (spindle_rt::spin::SPIN_MIN_NS.min(cap)..=cap).contains(&r.spin.window_ns),
            "{:?}",
            r.spin
        );
        let run = &r.runs[0];
        // The run never spins less than the window its release jitter was
        // calibrated with, nor more than the cap.
        assert!(run.spin_window_max_ns >= r.spin.window_ns && run.spin_window_max_ns <= cap);
        assert!(run.spin_window_end_ns >= r.spin.window_ns && run.spin_window_end_ns <= cap);
    }
}

#[test]
fn an_infeasible_set_is_rejected_everywhere_with_the_task_and_reason() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Latency, "rt-reject", 2, dir.path());
    // Receiver's user overlaps its receive task: 2 × 250 µs of work in a
    // window of 300 µs (500 µs − the 200 µs clock budget) on node 1.
    spec.stages = vec![
        stage(0, "user", 0, 20 * US, 500 * US),
        stage(0, "send", 500 * US, 20 * US, 500 * US),
        stage(1, "recv", 1_500 * US, 250 * US, 500 * US),
        stage(1, "user", 1_500 * US, 250 * US, 500 * US),
    ];
    let results = run_all(&spec);
    for result in &results {
        // A rejection is an answer (every member reports it), not a failure.
        let report = result.clone().expect("a rejection is reported, not an error");
        let err = report.runs[0].rejected_at_commit.clone().expect("rejected at commit");
        assert!(report.runs[0].counters.released == 0, "nothing ran");
        assert!(err.contains("rejected by node 1"), "{err} (all: {results:?})");
        assert!(err.contains("task 'n"), "names the task: {err}");
        assert!(err.contains("demand") || err.contains("utilization"), "says why: {err}");
    }
}

#[test]
fn interference_that_makes_the_set_infeasible_rejects_it_at_commit_with_task_bound_and_interference() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Latency, "rt-reject-interference", 2, dir.path());
    // 500 µs deadlines − the 200 µs clock budget leave 300 µs; a host that
    // takes the CPU for 400 µs at once cannot promise them.
    spec.interference_declared_ns = Some(400 * US);
    let results = run_all(&spec);
    for result in results {
        let report = result.expect("a rejection is an answer, not a failure");
        assert!(report.runs.iter().all(|r| r.counters.released == 0), "nothing ran");
        let reason = report.runs[0].rejected_at_commit.clone().expect("rejected at commit");
        for needle in [
            "rejected by node",
            "task 'n",
            "needs a deadline of at least",
            "interference 400000 ns measured",
        ] {
            assert!(reason.contains(needle), "'{needle}' not in: {reason}");
        }
        assert_eq!(report.interference.interference_admitted_ns, 400 * US);
    }
}

#[test]
fn calibrated_interference_is_reported_and_statistical_admission_uses_the_quantile() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Latency, "rt-statistical", 2, dir.path());
    spec.admission = AdmissionMode::Statistical { miss_budget: 1e-2 };
    spec.interference_declared_ns = None;
    spec.release_jitter_declared_ns = None;
    // Long deadlines: whatever this machine shows, the set is admitted.
    spec.period_ns = vec![40 * MS];
    spec.periods = 5;
    spec.stages = vec![
        stage(0, "user", 0, 20 * US, 5 * MS),
        stage(0, "send", 5 * MS, 20 * US, 5 * MS),
        stage(1, "recv", 15 * MS, 20 * US, 5 * MS),
        stage(1, "user", 20 * MS, 20 * US, 5 * MS),
    ];
    spec.clock_bound_budget_ns = 2 * MS;
    spec.calibration_ns = 100 * MS;
    let results = run_all(&spec);
    for result in results {
        let report = result.unwrap();
        let i = report.interference;
        assert!(
            i.wakeups >= spec.jitter_samples as u64 && i.calibration_ns >= spec.calibration_ns,
            "{i:?}"
        );
        assert!(i.lost_p99_ns <= i.lost_max_ns);
        // Statistical with 1e-2: at most 1 % of the calibration samples above what was admitted.
        assert!(i.interference_admitted_ns <= i.lost_max_ns, "{i:?}");
        if report.runs[0].rejected_at_commit.is_none() {
            assert!(report.runs[0].counters.released > 0);
        }
    }
}

#[test]
fn clock_with_injected_offset_and_drift_keeps_the_truth_inside_the_bound() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Clock, "rt-clock", 3, dir.path());
    spec.clocks.push(NodeClockSpec {
        offset_ns: -700_000,
        drift_ppb: -20_000,
        jumps: vec![(150 * MS, 400_000)],
    });
    let reports: Vec<MemberReport> = run_all(&spec).into_iter().map(|r| r.unwrap()).collect();
    for r in &reports[1..] {
        assert!(!r.clock_samples.is_empty());
        let outside = r.clock_samples.iter().filter(|s| !s.inside).count();
        assert_eq!(outside, 0, "rank {}: true time outside the interval", r.rank);
    }
}

/// Free loopback addresses (bound to port 0, then released).
fn loopback_addresses(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

fn tcp(spec: &mut ScenarioSpec) {
    spec.transport = TransportSpec {
        kind: "tcp".into(),
        addresses: loopback_addresses(spec.members),
        key_hex: "00112233445566778899aabbccddeeff".into(),
        netns: vec![],
    };
}

#[test]
fn the_pipeline_runs_over_tcp_and_delivers_or_counts_every_message() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Latency, "rt-pipe-tcp", 2, dir.path());
    tcp(&mut spec);
    // Loopback round trips through two receive threads on a loaded
    // machine: the largest budget this schedule admits (recv at 1,500 µs
    // ≥ send deadline 1,000 µs + 2 × budget).
    spec.clock_bound_budget_ns = 250 * US;
    run_pipeline(&spec);
}

#[test]
fn the_clock_over_tcp_keeps_the_truth_inside_the_bound() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Clock, "rt-clock-tcp", 3, dir.path());
    spec.clocks.push(NodeClockSpec {
        offset_ns: -700_000,
        drift_ppb: -20_000,
        jumps: vec![],
    });
    tcp(&mut spec);
    let reports: Vec<MemberReport> = run_all(&spec).into_iter().map(|r| r.unwrap()).collect();
    for r in &reports[1..] {
        assert!(!r.clock_samples.is_empty(), "rank {} took no sample", r.rank);
        let outside = r.clock_samples.iter().filter(|s| !s.inside).count();
        assert_eq!(outside, 0, "rank {}: true time outside the interval", r.rank);
    }
}

#[test]
fn a_bad_transport_names_the_bad_value() {
    let dir = tempdir();
    let mut spec = base_spec(Scenario::Latency, "rt-bad-transport", 2, dir.path());
    spec.transport.kind = "carrier-pigeon".into();
    let err = run_member(&spec, 0).unwrap_err();
    assert!(err.contains("carrier-pigeon"), "{err}");
    spec.transport = TransportSpec {
        kind: "tcp".into(),
        addresses: vec!["127.0.0.1:1".into(), "nowhere".into()],
        key_hex: "00".into(),
        netns: vec![],
    };
    let err = run_member(&spec, 0).unwrap_err();
    assert!(err.contains("'nowhere'"), "{err}");
}
