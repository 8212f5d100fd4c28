//! What every rt command shares: checking arguments, building the
//! scenario, spawning the member processes, and the per-node rows of the
//! reports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::rt::scenario::{
    MemberReport, NodeClockSpec, RunReport, Scenario, ScenarioSpec, StageSpec, Summary, TransportSpec,
};
use serde::Serialize;
use spindle_rt::interference::AdmissionMode;
use spindle_rt::node::{calibrate_host, CalibrationPlan, CALIBRATION_NS_MAX, INTERFERENCE_PROBE_NS};
use spindle_rt::os::{drop_rt_priority, request_rt_privileges};
use spindle_rt::spin::{calibrate_spin, spin_cap_ns, SpinReport};

use super::{host_record, CommonArgs, MS, US};
use crate::cluster::{read_results, Cluster};
use spindle_rt::interference::{Figure, HostRecord};

// ───────────────────────────── arguments ─────────────────────────────

pub(super) fn parse_list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("{flag}: '{x}' is not a valid number"))
        })
        .collect()
}

pub(super) fn clocks_of(common: &CommonArgs, members: usize) -> Result<Vec<NodeClockSpec>, String> {
    let offsets: Vec<i64> = parse_list("--offset-us", &common.offset_us)?;
    let drifts: Vec<f64> = parse_list("--drift-ppm", &common.drift_ppm)?;
    if let Some(d) = drifts.iter().find(|d| d.abs() > 150.0) {
        return Err(format!(
            "--drift-ppm {d} is beyond ±150 ppm, outside the estimator's assumed tolerance"
        ));
    }
    Ok((0..members)
        .map(|n| NodeClockSpec {
            offset_ns: offsets.get(n).copied().unwrap_or(0) * US as i64,
            drift_ppb: (drifts.get(n).copied().unwrap_or(0.0) * 1_000.0) as i64,
            jumps: vec![],
        })
        .collect())
}

pub(super) fn check_common(common: &CommonArgs) -> Result<(), String> {
    if common.clock_budget_us == 0 || common.clock_budget_us > 100_000 {
        return Err(format!(
            "--clock-budget-us {} must be in 1..=100000",
            common.clock_budget_us
        ));
    }
    if common.jitter_samples == 0 || common.jitter_samples > 100_000 {
        return Err(format!(
            "--jitter-samples {} must be in 1..=100000",
            common.jitter_samples
        ));
    }
    if let Some(spin) = common.spin_us.filter(|s| *s > 10_000) {
        return Err(format!("--spin-us {spin} must be at most 10000"));
    }
    if common.calibration_ms > CALIBRATION_NS_MAX / MS {
        return Err(format!(
            "--calibration-ms {} must be at most {}",
            common.calibration_ms,
            CALIBRATION_NS_MAX / MS
        ));
    }
    if let Some(i) = common.declared_interference_us.filter(|i| *i > 1_000_000) {
        return Err(format!("--declared-interference-us {i} must be at most 1000000"));
    }
    if let Some(h) = common.interference_headroom_pct.filter(|h| !(100..=1_000).contains(h)) {
        return Err(format!(
            "--interference-headroom-pct {h} must be in 100..=1000 (100: the interference as measured)"
        ));
    }
    AdmissionMode::parse(&common.admission, common.miss_budget)?;
    Ok(())
}

pub(super) fn check_sizes(sizes: &[usize]) -> Result<(), String> {
    if sizes.is_empty() {
        return Err("--sizes: give at least one size".into());
    }
    if let Some(s) = sizes.iter().find(|s| **s < 8 || **s > 65_536) {
        return Err(format!(
            "--sizes: {s} must be in 8..=65536 (messages carry an 8-byte timestamp)"
        ));
    }
    Ok(())
}

pub(super) fn base_spec(scenario: Scenario, common: &CommonArgs, members: usize) -> Result<ScenarioSpec, String> {
    check_common(common)?;
    let admission = AdmissionMode::parse(&common.admission, common.miss_budget)?;
    // This host's record: worst-case admission takes at least its figures.
    let host_record = host_record::path_of(common);
    let (jitter_recorded_ns, interference_recorded_ns) = match &host_record {
        Some(path) => host_record::load(path, &host_record::hostname())?.floor(admission),
        None => (0, 0),
    };
    let result_dir = std::env::temp_dir().join(format!(
        "spindle-rt-{}-{}",
        std::process::id(),
        spindle_runtime::monotonic_ns()
    ));
    // Created by `run_members` (which removes it), so an argument error
    // found later leaves nothing behind.
    Ok(ScenarioSpec {
        scenario,
        group: format!("rt-{}", std::process::id()),
        members,
        period_ns: vec![],
        periods: 0,
        sizes: vec![],
        stages: vec![],
        wraps: false,
        clocks: clocks_of(common, members)?,
        clock_bound_budget_ns: common.clock_budget_us * US,
        jitter_samples: common.jitter_samples,
        release_jitter_declared_ns: common.declared_jitter_us.map(|j| j * US),
        spin_ns: common.spin_us.unwrap_or(0) * US,
        spin_auto: common.spin_us.is_none(),
        fifo: !common.no_fifo,
        force: common.force,
        lead_ns: 200 * MS,
        duration_ns: 0,
        sample_interval_ns: 10 * MS,
        seed: 1,
        start_mono_ns: spindle_runtime::monotonic_ns(),
        result_dir,
        join_timeout_ms: 20_000,
        best_effort_quota: 2,
        transport: transport_of(common, members)?,
        watchdog: !common.no_watchdog,
        admission,
        calibration_ns: common.calibration_ms * MS,
        interference_declared_ns: common.declared_interference_us.map(|i| i * US),
        interference_headroom_pct: common.interference_headroom_pct.unwrap_or(100),
        release_jitter_recorded_ns: jitter_recorded_ns,
        interference_recorded_ns,
        host_record,
    })
}

/// The transport the members use: shm, or tcp on loopback ports, on the
/// given addresses, or in the given network namespaces.
pub(super) fn transport_of(common: &CommonArgs, members: usize) -> Result<TransportSpec, String> {
    let list = |flag: &str, value: &Option<String>| -> Result<Vec<String>, String> {
        let Some(v) = value else { return Ok(vec![]) };
        let items: Vec<String> = v.split(',').map(|x| x.trim().to_string()).collect();
        if items.len() != members || items.iter().any(String::is_empty) {
            return Err(format!(
                "{flag} '{v}': give {members} non-empty values (one per member, by rank)"
            ));
        }
        Ok(items)
    };
    let mut addresses = list("--addresses", &common.addresses)?;
    let netns = list("--netns", &common.netns)?;
    match common.transport.as_str() {
        "shm" => {
            if !addresses.is_empty() || !netns.is_empty() {
                return Err("--addresses and --netns need --transport tcp".into());
            }
            Ok(TransportSpec::default())
        }
        "tcp" => {
            if let Some(a) = addresses.iter().find(|a| a.parse::<std::net::SocketAddr>().is_err()) {
                return Err(format!("--addresses: '{a}' is not ip:port"));
            }
            if let Some(ns) = netns.iter().find(|n| !Path::new("/var/run/netns").join(n).exists()) {
                return Err(format!(
                    "--netns: network namespace '{ns}' does not exist (/var/run/netns/{ns}; create it with ip netns add)"
                ));
            }
            if !netns.is_empty() && addresses.is_empty() {
                return Err("--netns needs --addresses (each member's address inside its namespace)".into());
            }
            if addresses.is_empty() {
                addresses = (0..members)
                    .map(|_| crate::baseline::tcp::free_loopback_addr())
                    .collect::<Result<_, _>>()?;
            }
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
                .map_err(|e| format!("read /dev/urandom for the group key: {e}"))?;
            Ok(TransportSpec {
                kind: "tcp".into(),
                addresses,
                key_hex: spindle::config::hex_encode(&key),
                netns,
            })
        }
        other => Err(format!("--transport '{other}': expected shm or tcp")),
    }
}

/// How a report names the transport: shm, tcp (loopback or addresses),
/// or tcp-netns (each member in its own network namespace).
pub(super) fn transport_label(spec: &ScenarioSpec) -> String {
    match (spec.transport.name(), spec.transport.netns.is_empty()) {
        ("tcp", false) => "tcp-netns".into(),
        (name, _) => name.into(),
    }
}

pub(super) fn stage(node: usize, kind: &str, offset_ns: u64, compute_ns: u64, deadline_ns: u64) -> StageSpec {
    StageSpec {
        node,
        kind: kind.into(),
        offset_ns,
        compute_ns,
        deadline_ns,
    }
}

/// A pipeline over `nodes` (user, send, recv, user, send, recv, …): each
/// stage starts at the previous one's deadline, plus twice the clock
/// budget between a send and its receive (the receiver's clock may be
/// ahead by the budget and the sender's behind by it).
pub(super) fn pipeline(
    nodes: &[usize],
    wraps: bool,
    d_ns: u64,
    user_c_ns: u64,
    chan_c_ns: u64,
    eps_ns: u64,
) -> Vec<StageSpec> {
    let mut stages = Vec::new();
    let mut t = 0;
    for (i, &n) in nodes.iter().enumerate() {
        if i > 0 {
            stages.push(stage(n, "recv", t, chan_c_ns, d_ns));
            t += d_ns;
        }
        stages.push(stage(n, "user", t, user_c_ns, d_ns));
        t += d_ns;
        let last = i + 1 == nodes.len();
        if !last || wraps {
            stages.push(stage(n, "send", t, chan_c_ns, d_ns));
            t += d_ns + 2 * eps_ns;
        }
    }
    if wraps {
        stages.push(stage(nodes[0], "recv", t, chan_c_ns, d_ns));
    }
    stages
}

/// Length of a pipeline's schedule with deadline `d` (ns).
pub(super) fn pipeline_span_ns(stages: &[StageSpec]) -> u64 {
    stages.iter().map(|s| s.offset_ns + s.deadline_ns).max().unwrap_or(0)
}

/// The largest deadline (a multiple of 25 µs) whose pipeline fits the period.
pub(super) fn largest_deadline_ns(nodes: &[usize], wraps: bool, period_ns: u64, eps_ns: u64) -> u64 {
    let mut d = 25 * US;
    while pipeline_span_ns(&pipeline(nodes, wraps, d + 25 * US, 1, 1, eps_ns)) <= period_ns {
        d += 25 * US;
    }
    d
}

// ───────────────────────────── members ─────────────────────────────

/// Spawn one process per member, wait for all, read their reports, and
/// remove the result directory.
pub(super) fn run_members(spec: &ScenarioSpec, timeout: Duration) -> Result<Vec<MemberReport>, String> {
    let dir = &spec.result_dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let result = spawn_and_wait(spec, timeout);
    let reports = result.and_then(|()| read_results(spec.members, |rank| MemberReport::path(&spec.result_dir, rank)));
    let _ = std::fs::remove_dir_all(&spec.result_dir);
    if let (Ok(reports), Some(path)) = (&reports, &spec.host_record) {
        // The time the runs that were not rejected took.
        let run_ns: u64 = reports.first().map_or(0, |r: &MemberReport| {
            r.runs
                .iter()
                .filter(|run| run.rejected_at_commit.is_none())
                .map(|run| spec.periods.saturating_mul(run.period_ns))
                .sum()
        });
        record_observations(path, spec.scenario.name(), &mut |r, now| {
            host_record::merge_reports(r, spec.scenario.name(), reports, run_ns, now)
        });
    }
    reports
}

/// Merge what was observed into the host record at `path` and say so
/// when it grew; a record that cannot be written is reported, not fatal
/// (the measurement stands).
pub(super) fn record_observations(path: &Path, what: &str, merge: &mut dyn FnMut(&mut HostRecord, u64) -> bool) {
    match host_record::update(path, merge) {
        Ok(Some(r)) => println!("host record {} (after {what}): {}", path.display(), r.describe()),
        Ok(None) => {}
        Err(e) => eprintln!("{e}: not updated"),
    }
}

/// The host record as one line for a report ("none": no file or disabled).
pub(super) fn describe_host_record(spec: &ScenarioSpec) -> String {
    match &spec.host_record {
        None => "host record: not used (--no-host-record or SPINDLE_RT_HOST_RECORD=off)".into(),
        Some(path) => match host_record::load(path, &host_record::hostname()) {
            Ok(r) if r.observations == 0 => format!("host record {}: none yet", path.display()),
            Ok(r) => format!("host record {}: {}", path.display(), r.describe()),
            Err(e) => e,
        },
    }
}

pub(super) fn spawn_and_wait(spec: &ScenarioSpec, timeout: Duration) -> Result<(), String> {
    let json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
    // Members that were killed remove no group file: the cluster does.
    let mut procs = Cluster::new(spec.members)?.owns_group(&spec.group, 0);
    procs.start_each(spec.members, |rank| {
        vec![
            "rt".into(),
            "member".into(),
            "--rank".into(),
            rank.to_string(),
            "--spec".into(),
            json.clone(),
        ]
    })?;
    // The others see the failed member's verdict or its absence and stop.
    Ok(procs.wait_all(timeout, Duration::from_secs(5), Duration::from_millis(100), &mut || {})?)
}

/// What the launcher measured here to choose default parameters.
#[derive(Debug, Clone, Default)]
pub(super) struct Here {
    /// Wake-up lateness (release jitter) and lost time (interference).
    pub(super) jitter: Summary,
    pub(super) lost: Summary,
    /// The margins the admission mode takes from them.
    pub(super) jitter_margin_ns: u64,
    pub(super) interference_margin_ns: u64,
    pub(super) duration_ns: u64,
    /// Privileges and spin window, as text.
    pub(super) text: String,
}

/// Release jitter and interference of this machine, measured here (with
/// SCHED_FIFO when asked and permitted) over `duration_ns` to choose
/// default parameters, as the members will (`calibrate_host`). Without
/// `--spin-us`, the spin window is first tuned from 1 ms sleeps (capped at
/// 1 ms, as for a 16 ms period); the text says which window was used.
pub(super) fn calibrate_here(common: &CommonArgs, spec: &ScenarioSpec, duration_ns: u64) -> Result<Here, String> {
    let mode = spec.admission;
    let (jitter_recorded_ns, interference_recorded_ns) =
        (spec.release_jitter_recorded_ns, spec.interference_recorded_ns);
    let (fifo, samples, spin) = (!common.no_fifo, common.jitter_samples, common.spin_us);
    std::thread::spawn(move || {
        let p = request_rt_privileges(fifo, 80, false);
        let (window, how) = match spin {
            Some(us) => (us * US, format!("spin window {us} µs")),
            None => {
                let (tuner, report) = calibrate_spin(samples.min(1_000), MS, spin_cap_ns(16 * MS));
                (tuner.window_ns(), report.describe())
            }
        };
        // Wake-ups at least 4 spin windows apart (as the members calibrate).
        let host = calibrate_host(CalibrationPlan {
            wakeups_min: samples,
            duration_ns,
            gap_ns: (4 * window).max(MS),
            spin_ns: window,
            probe_ns: INTERFERENCE_PROBE_NS,
            phase_ns: 0,
        });
        drop_rt_priority();
        Here {
            jitter: Summary::of(&host.release_jitter_ns),
            lost: Summary::of(&host.lost_ns),
            // At least what this host has ever shown (its record).
            jitter_margin_ns: mode.margin_ns(&host.release_jitter_ns).max(jitter_recorded_ns),
            interference_margin_ns: mode.margin_ns(&host.lost_ns).max(interference_recorded_ns),
            duration_ns: host.duration_ns,
            text: format!("{}; {how}", p.describe()),
        }
    })
    .join()
    .map_err(|_| "the calibrating thread panicked".to_string())
    .inspect(|here| {
        if let Some(path) = &spec.host_record {
            record_observations(path, "the launcher's calibration", &mut |r, now| {
                let source = "the launcher's calibration";
                let mut grew = r.watched(here.duration_ns);
                grew |= r.observe(
                    Figure::Interference,
                    here.lost.max,
                    now,
                    &format!("{source}, lost time"),
                );
                grew | r.observe(
                    Figure::ReleaseJitter,
                    here.jitter.max,
                    now,
                    &format!("{source}, wake-up lateness"),
                )
            });
        }
    })
}

pub(super) fn write_json<T: Serialize>(path: &Option<PathBuf>, value: &T) -> Result<(), String> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

pub(super) fn unix_time_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// One node's figures, as printed and recorded.
#[derive(Debug, Clone, Serialize)]
pub(super) struct NodeRow {
    pub(super) node: usize,
    pub(super) privileges: String,
    pub(super) fifo_granted: bool,
    pub(super) calibration_jitter_ns: Summary,
    /// The host's interference: calibrated, admitted, seen in the run.
    pub(super) interference: spindle_rt::interference::InterferenceReport,
    pub(super) interference_log: Vec<String>,
    /// The commit was rejected (nothing ran): why.
    pub(super) rejected_at_commit: Option<String>,
    /// How the node's spin window was chosen.
    pub(super) spin: SpinReport,
    /// The widest spin window used in the run, and the mean.
    pub(super) spin_window_max_ns: u64,
    pub(super) spin_window_mean_ns: u64,
    pub(super) admission: String,
    pub(super) clock_bound_ns_at_commit: u64,
    pub(super) app_missed: u64,
    pub(super) user_jobs_missed: u64,
    pub(super) missed_early: u64,
    /// Of `missed_early`: reported by the watchdog at the critical start.
    pub(super) missed_by_watchdog: u64,
    pub(super) overruns: u64,
    pub(super) messages_moved: u64,
    pub(super) messages_missing: u64,
    /// Of `messages_moved`: taken from the slot a missed receive left
    /// (late for the application's period, not lost).
    pub(super) messages_caught_up: u64,
    pub(super) messages_torn: u64,
    pub(super) release_jitter_ns: Summary,
    pub(super) send_exec_ns: Summary,
    pub(super) receive_exec_ns: Summary,
    pub(super) clock_over_budget: u64,
    pub(super) clock_bound_ns_max: u64,
    /// Releases > 10 µs late whose sleep overshot the spin window / whose
    /// spin was interrupted / that had no sleep.
    pub(super) late_wakes_sleep: u64,
    pub(super) late_wakes_spin: u64,
    pub(super) late_wakes_no_sleep: u64,
    pub(super) miss_log: Vec<String>,
}

pub(super) fn node_row(r: &MemberReport, run: &RunReport) -> NodeRow {
    NodeRow {
        node: r.rank,
        privileges: r.privileges.clone(),
        fifo_granted: r.fifo_granted,
        calibration_jitter_ns: r.calibration_jitter_ns,
        interference: r.interference,
        interference_log: run.interference_log.clone(),
        rejected_at_commit: run.rejected_at_commit.clone(),
        spin: r.spin,
        spin_window_max_ns: run.spin_window_max_ns,
        spin_window_mean_ns: run.spin_window_mean_ns,
        admission: run.admission.clone(),
        clock_bound_ns_at_commit: r.clock_bound_ns_at_commit,
        app_missed: run.app_missed,
        user_jobs_missed: run.user_jobs_missed,
        missed_early: run.counters.missed_early,
        missed_by_watchdog: run.counters.missed_by_watchdog,
        overruns: run.counters.overruns,
        messages_moved: run.counters.messages_moved,
        messages_missing: run.counters.messages_missing,
        messages_caught_up: run.counters.messages_caught_up,
        messages_torn: run.counters.messages_torn,
        release_jitter_ns: run.release_jitter_ns,
        send_exec_ns: run.send_exec_ns,
        receive_exec_ns: run.receive_exec_ns,
        clock_over_budget: run.counters.clock_over_budget,
        clock_bound_ns_max: run.counters.clock_bound_ns_max,
        late_wakes_sleep: run.counters.late_wakes_sleep,
        late_wakes_spin: run.counters.late_wakes_spin,
        late_wakes_no_sleep: run.counters.late_wakes_no_sleep,
        miss_log: run.miss_log.clone(),
    }
}

/// Merge summaries by taking the worst of each percentile (conservative).
pub(super) fn worst(summaries: impl Iterator<Item = Summary>) -> Summary {
    summaries.fold(Summary::default(), |a, b| Summary {
        p50: a.p50.max(b.p50),
        p99: a.p99.max(b.p99),
        max: a.max.max(b.max),
        samples: a.samples + b.samples,
    })
}

/// Latencies of the hops `from → to` of a pipeline: extract[to][k] − insert[from][k].
pub(super) fn hop_latencies(from: &RunReport, to: &RunReport) -> Vec<u64> {
    from.inserted_ns
        .iter()
        .zip(&to.extracted_ns)
        .filter(|(i, e)| **i > 0 && **e > 0)
        .map(|(i, e)| e.saturating_sub(*i))
        .collect()
}

pub(super) fn jitter_of(latencies: &[u64]) -> Vec<u64> {
    let median = Summary::of(latencies).p50;
    latencies.iter().map(|l| l.abs_diff(median)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn common(args: &[&str]) -> CommonArgs {
        Cli::parse_from(std::iter::once("rt").chain(args.iter().copied())).common
    }

    #[test]
    fn bad_lists_name_the_flag_and_value() {
        let e = parse_list::<u64>("--sizes", "8,x").unwrap_err();
        assert!(e.contains("--sizes") && e.contains("'x'"), "{e}");
        assert!(check_sizes(&[4]).unwrap_err().contains('4'));
    }

    #[test]
    fn hop_latency_pairs_inserts_with_extracts() {
        let from = RunReport {
            inserted_ns: vec![100, 0, 300],
            ..RunReport::default()
        };
        let to = RunReport {
            extracted_ns: vec![150, 250, 0],
            ..RunReport::default()
        };
        assert_eq!(hop_latencies(&from, &to), vec![50]);
        assert_eq!(jitter_of(&[10, 12, 20]), vec![2, 0, 8]);
    }

    #[test]
    fn transports_are_checked_and_name_the_bad_value() {
        assert_eq!(transport_of(&common(&[]), 3).unwrap(), TransportSpec::default());
        let t = transport_of(&common(&["--transport", "tcp"]), 3).unwrap();
        assert_eq!((t.addresses.len(), t.key_hex.len()), (3, 64));
        assert!(t.addresses.iter().all(|a| a.starts_with("127.0.0.1:")));
        let e = transport_of(&common(&["--transport", "udp"]), 3).unwrap_err();
        assert!(e.contains("'udp'"), "{e}");
        let e = transport_of(
            &common(&["--transport", "tcp", "--addresses", "10.0.0.1:1,x:2,10.0.0.3:3"]),
            3,
        )
        .unwrap_err();
        assert!(e.contains("'x:2'"), "{e}");
        let e = transport_of(&common(&["--transport", "tcp", "--addresses", "10.0.0.1:1"]), 3).unwrap_err();
        assert!(e.contains("give 3"), "{e}");
        let e = transport_of(&common(&["--netns", "a,b,c"]), 3).unwrap_err();
        assert!(e.contains("--transport tcp"), "{e}");
        let args = [
            "--transport",
            "tcp",
            "--addresses",
            "10.0.0.1:1,10.0.0.2:1,10.0.0.3:1",
            "--netns",
            "no-such-ns-a,b,c",
        ];
        let e = transport_of(&common(&args), 3).unwrap_err();
        assert!(e.contains("'no-such-ns-a'"), "{e}");
    }
}
