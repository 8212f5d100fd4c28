//! `spindle run --config FILE --member ID`: one member of a (multi-host)
//! group described by a configuration file (docs/config.md). It joins the
//! group, multicasts its share of a workload (every byte written),
//! delivers everything (every byte read), leaves cleanly when every member
//! is done, and prints what it measured. Any member failing (a peer gone,
//! a wrong key, an unreachable address) stops it with a clear error and a
//! non-zero exit.

use std::path::PathBuf;

use clap::Args;

use spindle::config::GroupFile;
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
    /// Messages each sender multicasts.
    #[arg(long, default_value_t = 1000)]
    pub count: u64,
    /// Payload bytes per message (16..=the slot size).
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
    if args.size < PAYLOAD_BYTES_MIN || args.size > file.slot_payload_max {
        return Err(format!(
            "--size {} must be in {}..={} (group.slot_payload_max)",
            args.size, PAYLOAD_BYTES_MIN, file.slot_payload_max
        ));
    }
    let config = file.group_config().map_err(|e| e.to_string())?;
    let key_hex = if file.transport == "tcp" {
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
    let result_dir = spindle_bench::tempdir("run")?;
    let spec = MemberSpec {
        group: file.name.clone(),
        members: file.members.len(),
        senders: config.senders.ranks(file.members.len()),
        mode: file.mode.as_str().to_string(),
        window: file.window_slots,
        slot_payload_max: file.slot_payload_max,
        batching: file.batching,
        idle: file.idle.clone(),
        size: args.size,
        count: args.count,
        rate: args.rate,
        sample_every: if args.rate > 0 {
            1
        } else {
            (args.count / 100_000).max(1)
        },
        self_check: false,
        pin: false,
        delivery_log: args.delivery_log.clone(),
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
        burst_bytes: spindle_bench::member::BURST_BYTES,
    };
    println!(
        "spindle run: member {rank} of group '{}' ({} members over {}, {} delivery), {} × {} B per sender",
        spec.group, spec.members, spec.transport, spec.mode, spec.count, spec.size
    );
    let outcome = spindle_bench::member::run_member(&spec, rank).map_err(|e| format!("member {rank}: {e}"));
    let result = outcome.and_then(|()| {
        let path = MemberSpec::result_path(&result_dir, rank);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let result = serde_json::from_str::<MemberResult>(&text).map_err(|e| e.to_string())?;
        let (own, all) = latencies(&result_dir, rank)?;
        if let Some(out) = &args.json {
            let mut value = serde_json::to_value(&result).map_err(|e| e.to_string())?;
            if let Some(map) = value.as_object_mut() {
                map.insert(
                    "latency_own_ns".into(),
                    serde_json::to_value(own).map_err(|e| e.to_string())?,
                );
                map.insert(
                    "latency_ns".into(),
                    serde_json::to_value(all).map_err(|e| e.to_string())?,
                );
            }
            let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
            std::fs::write(out, text + "\n").map_err(|e| format!("write {}: {e}", out.display()))?;
        }
        Ok((result, own, all))
    });
    let _ = std::fs::remove_dir_all(&result_dir);
    let (r, own, all) = result?;
    println!(
        "member {rank}: delivered {} messages ({} B) in {:.3} s: {:.3} GB/s, {:.0} msgs/s; sequence digest {}",
        r.delivered_msgs,
        r.delivered_bytes,
        r.elapsed_ns as f64 / 1e9,
        r.delivered_gbps,
        r.delivered_msgs_per_s,
        r.sequence_digest
    );
    println!(
        "member {rank}: latency commit → delivery here (ns): own messages p50 {} p99 {} ({} samples); all senders p50 {} p99 {} ({} samples)",
        own.p50, own.p99, own.samples, all.p50, all.p99, all.samples
    );
    Ok(())
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
