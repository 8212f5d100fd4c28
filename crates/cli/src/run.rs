//! `spindle run --config FILE --member ID`: one member of a (multi-host)
//! group described by a configuration file (docs/config.md). It joins the
//! group, multicasts its share of a workload (every byte written),
//! delivers everything (every byte read), leaves cleanly when every member
//! is done, and prints what it measured. Any member failing (a wrong key,
//! an unreachable address, a minority partition) stops it with a clear
//! error and a non-zero exit; a peer that dies or hangs is removed by a
//! view change and the others finish without it.
//!
//! Lifecycle:
//! - `--count N` (default 1000): done when every sender still in the
//!   view has had its N messages delivered here (a removed sender's up to
//!   its ragged edge);
//! - `--seconds N`: each sender sends for N seconds, then ends its
//!   stream; `--service`: sends until stopped;
//! - SIGTERM or SIGINT: the member stops sending, **leaves** the group
//!   (the others install a view without it at once), flushes its delivery
//!   log, removes its files and exits 0. A second signal exits at once
//!   (status 128 + the signal), still removing its files.
//!
//! A file with `[[subgroups]]` makes a sharded member: the members are
//! laid out into shards by the default layout (`StickyLayout` over the
//! file's members, the layout the file was checked with), and the member
//! runs the workload in every shard it is in, each shard its own group
//! (`{group.name}.{subgroup}.{shard}`) with the subgroup's mode and
//! senders, at once, one thread each. It reports per shard; a member in
//! no shard says so and exits 0.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;

use spindle::config::GroupFile;
use spindle::{LayoutFunction, StickyLayout};
use spindle_bench::member::{MemberSpec, TlsPaths};
use spindle_bench::payload::PAYLOAD_BYTES_MIN;
use spindle_bench::report::{MemberResult, Percentiles};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The group's configuration file (TOML).
    #[arg(long)]
    pub config: PathBuf,
    /// This member's id in the configuration.
    #[arg(long)]
    pub member: usize,
    /// Messages each sender multicasts (the run ends when every sender
    /// still in the group has had them delivered everywhere).
    #[arg(long, default_value_t = 1000, conflicts_with_all = ["seconds", "service"])]
    pub count: u64,
    /// Send for this many seconds instead of a count, then end together.
    #[arg(long, conflicts_with = "service")]
    pub seconds: Option<u64>,
    /// Run as a service: send until stopped by SIGTERM or SIGINT (then
    /// leave the group cleanly).
    #[arg(long)]
    pub service: bool,
    /// Payload bytes per message (16..=group.large_message_max_bytes;
    /// above group.slot_payload_max each goes as fragments).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Offered rate per sender in messages/s (0: as fast as the window allows).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Write this member's delivery log (JSON lines) into this directory.
    #[arg(long)]
    pub delivery_log: Option<PathBuf>,
    /// Write this member's results (JSON) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> Result<(), String> {
    let file = GroupFile::load(&args.config).map_err(|e| e.to_string())?;
    // `rank_of` fails only for an id outside the file: say it with the flag.
    let rank = file.rank_of(args.member).map_err(|_| {
        format!(
            "--member {} is not in the configuration (its members are ids 0..={})",
            args.member,
            file.members.len().saturating_sub(1)
        )
    })?;
    if args.size < PAYLOAD_BYTES_MIN || args.size as u64 > file.large_message_max_bytes {
        return Err(format!(
            "--size {} must be in {}..={} (group.large_message_max_bytes; above group.slot_payload_max = {} a message goes as fragments)",
            args.size, PAYLOAD_BYTES_MIN, file.large_message_max_bytes, file.slot_payload_max
        ));
    }
    let config = file.group_config().map_err(|e| e.to_string())?;
    // tcp and ofi (whose control plane is tcp) prove the group key.
    let key_hex = if file.transport != "shm" {
        spindle::config::hex_encode(&file.read_key().map_err(|e| e.to_string())?)
    } else {
        String::new()
    };
    let tls = match (file.transport == "tcp", &file.tls) {
        (true, Some(tls)) => {
            file.check_tls_files().map_err(|e| e.to_string())?;
            Some(TlsPaths {
                cert: tls.cert.clone(),
                key: tls.key.clone(),
                ca: tls.ca.clone(),
            })
        }
        _ => None,
    };
    if args.seconds == Some(0) {
        return Err("--seconds must be at least 1".into());
    }
    remove_stale_run_dirs();
    let result_dir = spindle_bench::tempdir("run")?;
    let count = if args.seconds.is_some() || args.service {
        0
    } else {
        args.count
    };
    let spec = MemberSpec {
        group: file.name.clone(),
        members: file.members.len(),
        senders: config.senders.ranks(file.members.len()),
        mode: file.mode.as_str().to_string(),
        window: file.window_slots,
        slot_payload_max: file.slot_payload_max,
        large_message_max_bytes: file.large_message_max_bytes,
        large_in_place: false,
        batching: file.batching,
        idle: file.idle.clone(),
        size: args.size,
        count,
        seconds: args.seconds.unwrap_or(0),
        rate: args.rate,
        sample_every: if args.rate > 0 || count == 0 {
            1
        } else {
            (count / 100_000).max(1)
        },
        self_check: false,
        pin: false,
        pin_cpu_base: 0,
        delivery_log: args.delivery_log.clone(),
        persist_dir: file.persist_dir.clone(),
        compact_log_bytes: file.compact_log_bytes,
        result_dir: result_dir.clone(),
        join_timeout_ms: file.join_timeout_ms,
        transport: file.transport.clone(),
        addresses: file.members.iter().map(|m| m.address.clone()).collect(),
        listen: file.members[rank].listen.clone(),
        key_hex,
        peer_timeout_ms: file.peer_timeout_ms,
        membership: file.membership,
        suspect_timeout_ms: file.suspect_timeout_ms,
        check_source_addr: file.check_source_addr,
        tls,
        handshake_timeout_ms: file.handshake_timeout_ms,
        handshakes_pending_max: file.handshakes_pending_max,
        burst_bytes: spindle_bench::member::BURST_BYTES,
    };
    let runs = if file.subgroups.is_empty() {
        Ok(vec![MemberRun {
            shard: None,
            rank,
            spec,
        }])
    } else {
        shard_runs(&file, &spec, rank)
    };
    let runs = match runs {
        Ok(runs) => runs,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&result_dir);
            return Err(e);
        }
    };
    let mut own_files = vec![result_dir.clone()];
    if file.transport == "tcp" {
        for run in &runs {
            own_files.push(spindle_fabric::tcp::stat::stat_file_path(
                Path::new("/dev/shm"),
                &run.spec.group,
                run.rank,
            ));
        }
    }
    let stop = match on_signals(own_files) {
        Ok(stop) => stop,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&result_dir);
            return Err(e);
        }
    };
    if runs.is_empty() {
        let _ = std::fs::remove_dir_all(&result_dir);
        println!(
            "spindle run: member {rank} of group '{}' is in no shard of its {} subgroup(s): nothing to run",
            file.name,
            file.subgroups.len()
        );
        return Ok(());
    }
    let share = match (count, args.seconds) {
        (0, Some(s)) => format!("{s} s"),
        (0, None) => "until stopped".to_string(),
        (n, _) => format!("{n}"),
    };
    for run in &runs {
        let spec = &run.spec;
        println!(
            "spindle run: {} of group '{}' ({} members over {}, {} delivery), {share} × {} B per sender",
            run.who(rank),
            spec.group,
            spec.members,
            spec.transport,
            spec.mode,
            spec.size
        );
    }
    let outcomes: Vec<Result<RunReport, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|run| {
                let stop = &stop;
                scope.spawn(move || run_one(run, rank, stop))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a shard's member thread panicked".into()))
            })
            .collect()
    });
    if stop.load(Ordering::Relaxed) {
        println!("member {rank}: stopped by a signal: left the group");
    }
    let _ = std::fs::remove_dir_all(&result_dir);
    let mut reports = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(report) => reports.push(report),
            Err(e) => errors.push(e),
        }
    }
    if let Some(out) = &args.json {
        // The file's group: its member's result, as before subgroups
        // (nothing when it failed). Shards: each one's, and the errors.
        let value = match (file.subgroups.is_empty(), reports.first()) {
            (true, Some(report)) => Some(report.json.clone()),
            (true, None) => None,
            (false, _) => Some(serde_json::json!({
                "member": rank,
                "shards": reports.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
                "errors": errors,
            })),
        };
        if let Some(value) = value {
            let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
            std::fs::write(out, text + "\n").map_err(|e| format!("write {}: {e}", out.display()))?;
        }
    }
    for report in &reports {
        report.print();
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// One group this process runs a member of: the file's group, or one
/// shard of its subgroups.
struct MemberRun {
    /// `(subgroup, shard index, the shard's members as top-level ranks)`;
    /// `None`: the file's group itself.
    shard: Option<(String, usize, Vec<usize>)>,
    /// This member's rank in that group.
    rank: usize,
    spec: MemberSpec,
}

impl MemberRun {
    /// How the member is named in its report lines.
    fn who(&self, top_rank: usize) -> String {
        match &self.shard {
            None => format!("member {top_rank}"),
            Some((subgroup, shard, members)) => format!(
                "member {top_rank} (shard {subgroup}.{shard}: rank {} of {})",
                self.rank,
                members.len()
            ),
        }
    }
}

/// The shards `rank` is in, by the default layout over the file's
/// members, each as the member run of its own group: the subgroup's
/// mode and senders, the shard members' addresses, and its own result
/// folder and delivery log folder.
fn shard_runs(file: &GroupFile, base: &MemberSpec, rank: usize) -> Result<Vec<MemberRun>, String> {
    use spindle::group_layer::subgroup::shard_group_name;
    let view: Vec<usize> = (0..file.members.len()).collect();
    let layout = StickyLayout
        .layout(&file.subgroups, 0, &view, None)
        .map_err(|e| format!("[[subgroups]] over the {} members: {e}", view.len()))?;
    let mut runs = Vec::new();
    for (subgroup, shard, shard_rank) in layout.shards_of(rank) {
        let sub = &file.subgroups[subgroup];
        let members = layout.shards[subgroup][shard].clone();
        let mut spec = base.clone();
        spec.group = shard_group_name(&file.name, &sub.name, shard);
        spec.members = members.len();
        spec.senders = sub.senders.ranks(members.len());
        spec.mode = sub.mode.as_str().to_string();
        spec.addresses = members.iter().map(|&m| file.members[m].address.clone()).collect();
        spec.result_dir = base.result_dir.join(&spec.group);
        spec.delivery_log = base.delivery_log.as_ref().map(|d| d.join(&spec.group));
        runs.push(MemberRun {
            shard: Some((sub.name.clone(), shard, members)),
            rank: shard_rank,
            spec,
        });
    }
    if runs.len() > 1 && file.transport != "shm" {
        return Err(format!(
            "member {rank} is in {} shards, but over {} a member listens at one address, for one shard \
             (overlapping subgroups need transport = \"shm\")",
            runs.len(),
            file.transport
        ));
    }
    Ok(runs)
}

/// What one member run measured, printed and written as JSON.
struct RunReport {
    who: String,
    result: MemberResult,
    own: Percentiles,
    all: Percentiles,
    json: serde_json::Value,
}

/// Run one member to its end and read what it measured.
fn run_one(run: &MemberRun, top_rank: usize, stop: &AtomicBool) -> Result<RunReport, String> {
    let who = run.who(top_rank);
    let spec = &run.spec;
    std::fs::create_dir_all(&spec.result_dir).map_err(|e| format!("create {}: {e}", spec.result_dir.display()))?;
    spindle_bench::member::run_member_until(spec, run.rank, stop).map_err(|e| format!("{who}: {e}"))?;
    let path = MemberSpec::result_path(&spec.result_dir, run.rank);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let result = serde_json::from_str::<MemberResult>(&text).map_err(|e| e.to_string())?;
    let (own, all) = latencies(&spec.result_dir, run.rank)?;
    let mut json = serde_json::to_value(&result).map_err(|e| e.to_string())?;
    if let Some(map) = json.as_object_mut() {
        map.insert(
            "latency_own_ns".into(),
            serde_json::to_value(own).map_err(|e| e.to_string())?,
        );
        map.insert(
            "latency_ns".into(),
            serde_json::to_value(all).map_err(|e| e.to_string())?,
        );
        if let Some((subgroup, shard, members)) = &run.shard {
            map.insert("subgroup".into(), subgroup.clone().into());
            map.insert("shard".into(), (*shard).into());
            map.insert("group".into(), spec.group.clone().into());
            map.insert("shard_rank".into(), run.rank.into());
            map.insert("shard_members".into(), serde_json::json!(members));
        }
    }
    Ok(RunReport {
        who,
        result,
        own,
        all,
        json,
    })
}

impl RunReport {
    fn print(&self) {
        let (who, r, own, all) = (&self.who, &self.result, &self.own, &self.all);
        let replayed_msgs = r.counters.get("replayed_msgs").copied().unwrap_or(0);
        if r.counters.get("snapshots_restored").copied().unwrap_or(0) > 0 {
            println!(
                "{who}: restored the snapshot its persistent log was compacted to (group.compact_log_bytes), \
                 then the messages after it"
            );
        }
        if replayed_msgs > 0 {
            println!(
                "{who}: replayed {replayed_msgs} messages of earlier runs from its persistent log \
                 (history: not counted below)"
            );
        }
        println!(
            "{who}: delivered {} messages ({} B) in {:.3} s: {:.3} GB/s, {:.0} msgs/s; sequence digest {}",
            r.delivered_msgs,
            r.delivered_bytes,
            r.elapsed_ns as f64 / 1e9,
            r.delivered_gbps,
            r.delivered_msgs_per_s,
            r.sequence_digest
        );
        println!(
            "{who}: latency commit → delivery here (ns): own messages p50 {} p99 {} ({} samples); all senders p50 {} p99 {} ({} samples)",
            own.p50, own.p99, own.samples, all.p50, all.p99, all.samples
        );
    }
}

/// Latency percentiles at this member: of its own messages (a round trip
/// through ordered delivery: stable means every member has received it),
/// and of every sender's (clocks of other hosts are not comparable, so
/// only own samples are exact across hosts).
fn latencies(dir: &std::path::Path, rank: usize) -> Result<(Percentiles, Percentiles), String> {
    let mut own = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut all = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for (sender, _, ns) in spindle_bench::member::read_samples(dir, rank)? {
        let ns = (ns as u64).max(1);
        all.record(ns).map_err(|e| e.to_string())?;
        if sender as usize == rank {
            own.record(ns).map_err(|e| e.to_string())?;
        }
    }
    Ok((Percentiles::from_histogram(&own), Percentiles::from_histogram(&all)))
}

/// Install the SIGTERM/SIGINT handling of a member: the first signal sets
/// the returned flag (the member leaves the group and exits 0); a second
/// one removes `own_files` (this member's stat file and result folder)
/// and exits at once with status 128 + the signal.
fn on_signals(own_files: Vec<PathBuf>) -> Result<Arc<AtomicBool>, String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).map_err(|e| format!("install signal handlers: {e}"))?;
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("spindle-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if !flag.swap(true, Ordering::Relaxed) {
                    eprintln!("spindle run: signal {signal}: leaving the group (a second signal exits at once)");
                    continue;
                }
                for path in &own_files {
                    let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
                }
                eprintln!("spindle run: second signal {signal}: exiting now");
                std::process::exit(128 + signal);
            }
        })
        .map_err(|e| format!("start the signal thread: {e}"))?;
    Ok(stop)
}

/// Remove result folders (`spindle-run-<pid>-…` in the temporary
/// directory) left by members that died without cleaning up: their
/// process is gone.
fn remove_stale_run_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("spindle-run-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive =
            unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
