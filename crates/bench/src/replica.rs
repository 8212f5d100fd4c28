//! `spindle bench replica`: end-to-end write latency of one-sided vs RPC
//! replication (the RAMCloud seed's figure), by object size and number of
//! backups, plus the failover time of the KV service.
//!
//! Each configuration runs a fresh group in this process, on shm or on
//! tcp (loopback): the master on the calling thread, each backup on its
//! own threads with its own fabric (the same code as `spindle kv
//! member`). A sample is one `append` from the call to the
//! acknowledgement (all backups complete), back to back, after a warm-up.
//! On tcp a one-sided write completes when every backup's echo of the
//! guard came back ([`Completion::Echo`]): a push there only hands bytes
//! to the kernel. On ofi (`--transport ofi[:<provider>]`, built with the
//! `ofi` feature) it completes when the master's completion queue reports
//! every `fi_write` delivered (`FI_DELIVERY_COMPLETE`,
//! [`Completion::Queue`]): no backup code runs on the path. The rpc rows
//! on ofi are the same two-sided baseline as on the other fabrics: a
//! backup thread copies each request out of its area and answers with its
//! own guard, both moved by `fi_write`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;
use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_replica::backup::Backup;
use spindle_replica::config::ServiceConfig;
use spindle_replica::disk::SegmentDisk;
use spindle_replica::layout::{Completion, ReplicaLayout};
use spindle_replica::log::LogGeometry;
use spindle_replica::master::Master;
use spindle_replica::node::Membership;
use spindle_replica::record::RecordKind;
use spindle_replica::Mode;
use spindle_runtime::{monotonic_ns, IdleStrategy};

use crate::cluster::{Cluster, Output};
use crate::report::{Machine, Percentiles};

#[derive(Args, Debug)]
pub struct ReplicaArgs {
    /// Object sizes in bytes, comma-separated.
    #[arg(long, default_value = "100,1000,10000,100000,1000000")]
    pub object_size: String,
    /// Backup counts, comma-separated (each 1..=63).
    #[arg(long, default_value = "1,2,3")]
    pub backups: String,
    /// one-sided, rpc, or both. On ofi, rpc also runs over the provider's
    /// messages (fi_send / fi_recv; rows of mode rpc-msg).
    #[arg(long, default_value = "both")]
    pub mode: String,
    /// Fabrics, comma-separated: shm, tcp (loopback), ofi or
    /// ofi:PROVIDER (libfabric, built with `--features ofi`; `ofi` is
    /// its tcp provider, on loopback). shm and tcp by default, in one run.
    #[arg(long, default_value = "shm,tcp")]
    pub transport: String,
    /// Samples per configuration (fewer for big objects: at most 256 MiB written per configuration).
    #[arg(long, default_value_t = 20_000)]
    pub count: usize,
    /// Cap the offered write bandwidth (MB/s; 0: back to back). Back to
    /// back, large objects outrun the backups' disks and every write waits
    /// for an fsync (flow control); the cap measures replication latency
    /// instead. Waiting happens outside the timed region.
    #[arg(long, default_value_t = 200)]
    pub rate_mbps: u64,
    /// How the rpc backups' receive threads idle: backoff or spin.
    #[arg(long, default_value = "backoff")]
    pub idle: String,
    /// Also measure the KV service's failover time over this many trials (0: skip).
    #[arg(long, default_value_t = 0)]
    pub failover: usize,
    /// Only the failover measurement.
    #[arg(long)]
    pub failover_only: bool,
    /// Write the rows as a JSON list to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot (latency vs object size) to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One row of results.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub kind: String,
    pub transport: String,
    pub mode: String,
    pub backups: usize,
    pub object_size: usize,
    pub latency_ns: Percentiles,
    /// Appends that waited on a backup: the ring full while backups fsync
    /// (flow control), or, in rpc mode, every reply wait that spun.
    pub flow_waits: u64,
    /// Offered bandwidth cap in MB/s (0: back to back).
    pub rate_mbps: u64,
    pub idle: String,
    pub machine: Machine,
}

const BYTES_PER_CONFIG_MAX: usize = 256 << 20;
const WARMUP: usize = 200;

fn parse_list(s: &str, what: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("--{what}: '{x}' is not a number"))
        })
        .collect()
}

pub fn run(args: ReplicaArgs) -> Result<(), String> {
    let transports: Vec<&str> = args.transport.split(',').map(str::trim).collect();
    if let Some(t) = transports
        .iter()
        .find(|t| !matches!(**t, "shm" | "tcp") && !crate::member::is_ofi(t))
    {
        return Err(format!(
            "--transport {t}: expected a comma-separated list of shm, tcp, ofi or ofi:<provider>"
        ));
    }
    let sizes = parse_list(&args.object_size, "object-size")?;
    let backups = parse_list(&args.backups, "backups")?;
    if let Some(s) = sizes.iter().find(|s| **s == 0 || **s > 16 << 20) {
        return Err(format!("--object-size {s}: expected 1..=16777216"));
    }
    if let Some(b) = backups.iter().find(|b| **b == 0 || **b > 63) {
        return Err(format!("--backups {b}: expected 1..=63"));
    }
    let modes = match args.mode.as_str() {
        "both" => vec![Mode::OneSided, Mode::Rpc],
        m => vec![Mode::parse(m).map_err(|e| format!("--mode: {e}"))?],
    };
    let idle = IdleStrategy::parse(&args.idle).map_err(|e| format!("--idle: {e}"))?;
    if args.count == 0 {
        return Err("--count must be at least 1".into());
    }
    let machine = Machine::detect();
    let mut rows = Vec::new();
    if !args.failover_only {
        println!(
            "spindle bench replica: write latency to the acknowledgement (ns), {}, offered ≤ {} MB/s, {} CPUs ({})",
            transports.join(" and "),
            args.rate_mbps,
            machine.cpus,
            machine.cpu_model
        );
        println!(
            "{:>9} {:>10} {:>8} {:>12} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}",
            "transport", "mode", "backups", "object_size", "samples", "p50", "p99", "p99.9", "max", "flow_waits"
        );
        for &transport in &transports {
            for &mode in &modes {
                for &b in &backups {
                    for &size in &sizes {
                        let count = args.count.min((BYTES_PER_CONFIG_MAX / size).max(100));
                        let mut row = |mode: &str, latency_ns: Percentiles, flow_waits: u64| {
                            println!(
                                "{:>9} {:>10} {:>8} {:>12} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}",
                                transport,
                                mode,
                                b,
                                size,
                                latency_ns.samples,
                                latency_ns.p50,
                                latency_ns.p99,
                                latency_ns.p999,
                                latency_ns.max,
                                flow_waits
                            );
                            rows.push(Row {
                                kind: "write".into(),
                                transport: transport.into(),
                                mode: mode.into(),
                                backups: b,
                                object_size: size,
                                latency_ns,
                                flow_waits,
                                rate_mbps: args.rate_mbps,
                                idle: args.idle.clone(),
                                machine: machine.clone(),
                            });
                        };
                        let (latency_ns, flow_waits) = measure(transport, mode, b, size, count, idle, args.rate_mbps)?;
                        row(mode.as_str(), latency_ns, flow_waits);
                        if mode == Mode::Rpc && crate::member::is_ofi(transport) {
                            // The same baseline over the provider's messages
                            // (fi_send / fi_recv), as in the RAMCloud seed.
                            row(RPC_MSG, measure_rpc_msg(transport, b, size, count)?, 0);
                        }
                    }
                }
            }
        }
        summarize(&rows);
    }
    if args.failover > 0 {
        let p = measure_failover(args.failover)?;
        println!(
            "failover (master SIGKILLed → next write acknowledged), 3 backups, one-sided, {} trials: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            p.samples,
            p.p50 as f64 / 1e6,
            p.p99 as f64 / 1e6,
            p.max as f64 / 1e6
        );
        rows.push(Row {
            kind: "failover".into(),
            transport: "shm".into(),
            mode: "one-sided".into(),
            backups: 3,
            object_size: 16,
            latency_ns: p,
            flow_waits: 0,
            rate_mbps: 0,
            idle: "backoff".into(),
            machine: machine.clone(),
        });
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        write_plot(path, &rows)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

fn summarize(rows: &[Row]) {
    let mut transports: Vec<&str> = rows.iter().map(|r| r.transport.as_str()).collect();
    transports.dedup();
    for transport in transports {
        let find = |mode: &str| {
            rows.iter()
                .find(|r| r.transport == transport && r.mode == mode && r.backups == 3 && r.object_size == 100)
                .map(|r| r.latency_ns.p50)
        };
        if let (Some(one), Some(msg)) = (find("one-sided"), find(RPC_MSG)) {
            println!(
                "{transport}, 100 B, 3 backups: one-sided p50 {one} ns vs rpc over fi_send p50 {msg} ns: {:.1}×",
                msg as f64 / one.max(1) as f64
            );
        }
        if let (Some(one), Some(rpc)) = (find("one-sided"), find("rpc")) {
            println!(
                "{transport}, 100 B, 3 backups: one-sided p50 {one} ns vs rpc p50 {rpc} ns: {:.1}×{}",
                rpc as f64 / one.max(1) as f64,
                if transport == "shm" {
                    " (goal ≥ 3×; p50 goal ≤ 2000 ns)"
                } else {
                    ""
                }
            );
        }
    }
}

/// One configuration: a fresh group, `backups` backup threads, `count` appends.
fn measure(
    transport: &str,
    mode: Mode,
    backups: usize,
    size: usize,
    count: usize,
    idle: IdleStrategy,
    rate_mbps: u64,
) -> Result<(Percentiles, u64), String> {
    let members = backups + 1;
    let value_bytes_max = size.max(64);
    let segment_bytes =
        (2 * spindle_replica::record::encoded_len(spindle_replica::record::KEY_BYTES_MAX, value_bytes_max))
            .next_multiple_of(64)
            .max(1 << 20);
    let geometry = LogGeometry {
        segment_bytes,
        segments_max: 4,
    };
    let group = format!("rbench-{}-{}", std::process::id(), monotonic_ns() % 1_000_000);
    let spec = MasterSpec {
        mode,
        backups,
        size,
        count,
        value_bytes_max,
        rate_mbps,
        idle,
    };
    if crate::member::is_ofi(transport) {
        measure_ofi(transport, members, geometry, &spec, &group)
    } else if transport == "tcp" {
        let layout = ReplicaLayout::with_completion(members, geometry, mode.as_str(), Completion::Echo);
        let (addresses, listeners) = loopback_listeners(members)?;
        let mut options = TcpOptions::new(
            &group,
            layout.row.row_len_bytes(),
            layout.row.tag(),
            addresses,
            b"spindle bench replica".to_vec(),
        );
        options.join_timeout = Duration::from_secs(30);
        let open = move |rank: usize| -> Result<Arc<TcpFabric>, String> {
            let listener = take_listener(&listeners, rank)?;
            Ok(Arc::new(
                TcpFabric::open_with_listener(&options, rank, listener).map_err(|e| e.to_string())?,
            ))
        };
        run_config(Arc::new(open), layout, &spec, &group)
    } else {
        let layout = ReplicaLayout::new(members, geometry, mode.as_str());
        let mut options = ShmOptions::new(&group, members, layout.row.row_len_bytes(), layout.row.tag());
        options.layout_description = layout.row.summary();
        let open = move |rank: usize| -> Result<Arc<ShmFabric>, String> {
            Ok(Arc::new(ShmFabric::open(&options, rank).map_err(|e| e.to_string())?))
        };
        run_config(Arc::new(open), layout, &spec, &group)
    }
}

/// The mode name of the rpc baseline over libfabric messages.
const RPC_MSG: &str = "rpc-msg";

/// The rpc baseline over `fi_send` / `fi_recv` ([`crate::replica_msg`]).
#[cfg(feature = "ofi")]
fn measure_rpc_msg(transport: &str, backups: usize, size: usize, count: usize) -> Result<Percentiles, String> {
    crate::replica_msg::measure(crate::member::ofi_provider(transport), backups, size, count, WARMUP)
}

#[cfg(not(feature = "ofi"))]
fn measure_rpc_msg(transport: &str, _backups: usize, _size: usize, _count: usize) -> Result<Percentiles, String> {
    Err(format!("--transport {transport}: built without libfabric support"))
}

/// Listeners bound before any member starts, each taken once.
type Listeners = std::sync::Mutex<Vec<Option<std::net::TcpListener>>>;

/// Bind a loopback listener per member first (port 0): no race for free
/// ports.
fn loopback_listeners(members: usize) -> Result<(Vec<std::net::SocketAddr>, Listeners), String> {
    let mut listeners = Vec::new();
    let mut addresses = Vec::new();
    for _ in 0..members {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind a loopback port: {e}"))?;
        addresses.push(l.local_addr().map_err(|e| e.to_string())?);
        listeners.push(Some(l));
    }
    Ok((addresses, std::sync::Mutex::new(listeners)))
}

/// Member `rank`'s listener (each is taken once).
fn take_listener(listeners: &Listeners, rank: usize) -> Result<std::net::TcpListener, String> {
    listeners.lock().unwrap_or_else(|p| p.into_inner())[rank]
        .take()
        .ok_or_else(|| format!("member {rank} opened twice"))
}

/// One configuration over libfabric: one-sided writes complete by the
/// provider's completion queue ([`Completion::Queue`]).
#[cfg(feature = "ofi")]
fn measure_ofi(
    transport: &str,
    members: usize,
    geometry: LogGeometry,
    spec: &MasterSpec,
    group: &str,
) -> Result<(Percentiles, u64), String> {
    use spindle_fabric::ofi::{OfiFabric, OfiOptions};
    let layout = ReplicaLayout::with_completion(members, geometry, spec.mode.as_str(), Completion::Queue);
    let (addresses, listeners) = loopback_listeners(members)?;
    let mut options = OfiOptions::new(
        group,
        layout.row.row_len_bytes(),
        layout.row.tag(),
        addresses,
        b"spindle bench replica".to_vec(),
        crate::member::ofi_provider(transport),
    );
    options.tcp.join_timeout = Duration::from_secs(30);
    options.delivery_complete = true;
    let open = move |rank: usize| -> Result<Arc<OfiFabric>, String> {
        let listener = take_listener(&listeners, rank)?;
        Ok(Arc::new(
            OfiFabric::open_with_listener(&options, rank, listener).map_err(|e| e.to_string())?,
        ))
    };
    run_config(Arc::new(open), layout, spec, group)
}

#[cfg(not(feature = "ofi"))]
fn measure_ofi(
    transport: &str,
    _members: usize,
    _geometry: LogGeometry,
    _spec: &MasterSpec,
    _group: &str,
) -> Result<(Percentiles, u64), String> {
    Err(format!(
        "--transport {transport}: this spindle was built without libfabric support; rebuild with \
         `cargo build --release -p spindle-cli --features ofi` (needs libfabric-dev)"
    ))
}

type Opener<F> = Arc<dyn Fn(usize) -> Result<Arc<F>, String> + Send + Sync>;

/// Backups on threads, the master on this one, over any fabric.
fn run_config<F: Membership>(
    open: Opener<F>,
    layout: ReplicaLayout,
    spec: &MasterSpec,
    group: &str,
) -> Result<(Percentiles, u64), String> {
    let (mode, idle) = (spec.mode, spec.idle);
    let data_dir = crate::tempdir("replica")?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for rank in 1..=spec.backups {
        let (open, layout, stop, dir, group) = (
            open.clone(),
            layout.clone(),
            stop.clone(),
            data_dir.clone(),
            group.to_string(),
        );
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let fabric = open(rank)?;
            spindle_fabric::wait_all_joined(
                fabric.as_ref() as &dyn spindle_fabric::Fabric,
                &group,
                Duration::from_secs(30),
            )
            .map_err(|e| e.to_string())?;
            let disk = SegmentDisk::new(dir.join(format!("member-{rank}")));
            let mut backup = Backup::follow(fabric.clone(), layout, mode, disk, 0, 0, idle)?;
            // Partner: the Release store of `stop` below.
            while !stop.load(Ordering::Acquire) && !backup.failed() {
                std::thread::sleep(Duration::from_millis(2));
            }
            let r = backup.stop();
            // Keep the fabric (and its connections) until the master is done.
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(2));
            }
            drop(fabric);
            r
        }));
    }
    let result = run_master(open.as_ref(), layout, spec, group);
    // Partner: the Acquire loads in the backup threads.
    stop.store(true, Ordering::Release);
    let mut first_err = result.as_ref().err().cloned();
    for t in threads {
        if let Err(e) = t.join().unwrap_or_else(|_| Err("backup thread panicked".into())) {
            first_err.get_or_insert(e);
        }
    }
    let _ = std::fs::remove_dir_all(&data_dir);
    match first_err {
        Some(e) => Err(e),
        None => result,
    }
}

/// What the master of one configuration does.
struct MasterSpec {
    mode: Mode,
    backups: usize,
    size: usize,
    count: usize,
    value_bytes_max: usize,
    rate_mbps: u64,
    idle: IdleStrategy,
}

fn run_master<F: Membership>(
    open: &(dyn Fn(usize) -> Result<Arc<F>, String> + Send + Sync),
    layout: ReplicaLayout,
    spec: &MasterSpec,
    group: &str,
) -> Result<(Percentiles, u64), String> {
    let &MasterSpec {
        mode,
        backups,
        size,
        count,
        value_bytes_max,
        rate_mbps,
        ..
    } = spec;
    let fabric = open(0)?;
    spindle_fabric::wait_all_joined(
        fabric.as_ref() as &dyn spindle_fabric::Fabric,
        group,
        Duration::from_secs(30),
    )
    .map_err(|e| e.to_string())?;
    let live = fabric.clone();
    let mut master = Master::start(
        fabric.clone(),
        layout,
        mode,
        0,
        (1..=backups).collect(),
        value_bytes_max,
        Box::new(move |r| live.member_alive(r)),
    )?;
    master.append_record(RecordKind::SnapshotDone, &[], &[], 0)?;
    let value = vec![0x5au8; size];
    let mut key = *b"object-00000000";
    let mut h = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    // Per write at the capped rate: size bytes / (rate_mbps × 10^6 B/s).
    let gap_ns = (size as u64 * 1000).checked_div(rate_mbps).unwrap_or(0);
    let started = monotonic_ns();
    for i in 0..WARMUP + count {
        let due = started + gap_ns * i as u64;
        let now = monotonic_ns();
        if due > now + 50_000 {
            std::thread::sleep(Duration::from_nanos(due - now));
        }
        key[7..].copy_from_slice(format!("{:08}", i % 100_000_000).as_bytes());
        let t0 = monotonic_ns();
        master.append_record(RecordKind::Put, &key, &value, i as u64 + 1)?;
        let t1 = monotonic_ns();
        if i >= WARMUP {
            h.record((t1 - t0).max(1)).map_err(|e| e.to_string())?;
        }
    }
    Ok((Percentiles::from_histogram(&h), master.flow_waits()))
}

/// Start the service (4 processes), write continuously, SIGKILL the
/// master, time until the next write is acknowledged; `trials` times.
fn measure_failover(trials: usize) -> Result<Percentiles, String> {
    let mut h = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    for trial in 0..trials {
        let dir = crate::tempdir("failover")?;
        let port = 20_000 + (std::process::id() % 20_000) as u16 + trial as u16;
        let mut config = ServiceConfig::local_default();
        config.group = format!("fo-{}-{trial}", std::process::id());
        config.port = port;
        config.data_dir = dir.clone();
        config.geometry = LogGeometry {
            segment_bytes: 256 << 10,
            segments_max: 4,
        };
        config.value_bytes_max = 64 << 10;
        let path = dir.join("service.conf");
        std::fs::write(&path, config.to_text()).map_err(|e| e.to_string())?;
        let mut members = Cluster::new(config.members())?
            .streams(Output::Null, Output::Inherit)
            .owns_group(&config.group, config.members());
        let result = members
            .start_each(config.members(), |rank| {
                let config = path.display().to_string();
                ["kv", "member", "--rank", &rank.to_string(), "--config", &config]
                    .map(String::from)
                    .to_vec()
            })
            .map_err(String::from)
            .and_then(|()| one_failover(&mut members, port));
        drop(members);
        let _ = std::fs::remove_dir_all(&dir);
        h.record(result?.max(1)).map_err(|e| e.to_string())?;
    }
    Ok(Percentiles::from_histogram(&h))
}

fn one_failover(members: &mut Cluster, port: u16) -> Result<u64, String> {
    let addr = format!("127.0.0.1:{port}");
    let mut conn = connect_retry(&addr, Duration::from_secs(30))?;
    for i in 0..200 {
        set(&mut conn, i)?;
    }
    let killed_ns = members.kill(0)?;
    let elapsed = || Duration::from_nanos(monotonic_ns().saturating_sub(killed_ns));
    let mut i = 1000;
    loop {
        if elapsed() > Duration::from_secs(30) {
            return Err("no write was acknowledged within 30 s of the failover".into());
        }
        if set(&mut conn, i).is_ok() {
            return Ok(elapsed().as_nanos() as u64);
        }
        i += 1;
        match TcpStream::connect(&addr) {
            Ok(c) => {
                c.set_nodelay(true).ok();
                conn = c;
            }
            Err(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
}

fn connect_retry(addr: &str, wait: Duration) -> Result<TcpStream, String> {
    let started = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(c) => {
                c.set_nodelay(true).ok();
                return Ok(c);
            }
            Err(e) if started.elapsed() > wait => return Err(format!("connect {addr}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn set(conn: &mut TcpStream, i: u64) -> Result<(), String> {
    let value = format!("{i}");
    let req = format!("*3\r\n$3\r\nSET\r\n$4\r\nfkey\r\n${}\r\n{value}\r\n", value.len());
    conn.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let n = conn.read(&mut buf).map_err(|e| e.to_string())?;
    if n >= 5 && &buf[..5] == b"+OK\r\n" {
        Ok(())
    } else {
        Err(format!("unexpected reply {:?}", String::from_utf8_lossy(&buf[..n])))
    }
}

/// Latency p50 by object size, one line per (mode, backups), log-log.
fn write_plot(path: &Path, rows: &[Row]) -> Result<(), String> {
    let writes: Vec<&Row> = rows.iter().filter(|r| r.kind == "write").collect();
    if writes.is_empty() {
        return Err("no write latency rows to plot".into());
    }
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let x_max = writes.iter().map(|r| r.object_size).max().unwrap_or(100) as f64 * 1.5;
        let x_min = writes.iter().map(|r| r.object_size).min().unwrap_or(100) as f64 / 1.5;
        let y_max = writes.iter().map(|r| r.latency_ns.p50).max().unwrap_or(1000) as f64 / 1000.0 * 2.0;
        let y_min = (writes.iter().map(|r| r.latency_ns.p50).min().unwrap_or(100) as f64 / 1000.0 / 2.0).max(0.01);
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "spindle bench replica: median write latency vs object size (shm and tcp loopback)",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("object size (bytes)")
            .y_desc("p50 write latency (µs)")
            .draw()
            .map_err(|e| err(&e))?;
        let palette = [
            RGBColor(0x2b, 0x6c, 0xb0),
            RGBColor(0x38, 0xa1, 0x69),
            RGBColor(0x80, 0x5a, 0xd5),
            RGBColor(0xdd, 0x6b, 0x20),
            RGBColor(0xc5, 0x30, 0x30),
            RGBColor(0x97, 0x5a, 0x16),
        ];
        let mut series: Vec<(String, String, usize)> = writes
            .iter()
            .map(|r| (r.transport.clone(), r.mode.clone(), r.backups))
            .collect();
        series.sort();
        series.dedup();
        for (i, (transport, mode, b)) in series.iter().enumerate() {
            let color = palette[i % palette.len()];
            // tcp lines dashed-looking: thinner, so the two fabrics read apart.
            let width = if transport == "tcp" { 1 } else { 2 };
            let points: Vec<(f64, f64)> = writes
                .iter()
                .filter(|r| &r.transport == transport && &r.mode == mode && r.backups == *b)
                .map(|r| (r.object_size as f64, (r.latency_ns.p50 as f64 / 1000.0).max(y_min)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(width)))
                .map_err(|e| err(&e))?
                .label(format!(
                    "{transport} {mode}, {b} backup{}",
                    if *b == 1 { "" } else { "s" }
                ))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width)));
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    std::fs::write(path, svg).map_err(|e| format!("plot {}: {e}", path.display()))
}
