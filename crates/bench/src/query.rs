//! `spindle bench query`: the round trip of a point-to-point query, a read
//! sent to one replica of another shard and answered from its state
//! (`Sharded::query`).
//!
//! Four members run as threads of this process on shared memory, with
//! "kv" in 2 shards of 2. Member 0, in shard 0, asks member 2, in shard 1,
//! for a key `--count` times, one query at a time. With `--load`, shard 1's
//! two members multicast writes in their shard the whole time, so the
//! answerer answers between deliveries. In the same run, a cache line's
//! round trip between two threads is measured, the floor for any reply.
//! `--transport tcp` puts every member and its query channel on loopback
//! ports instead (the comparison with a Redis GET:
//! `bench/peers/query-vs-redis.sh`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spindle::{Callbacks, Group, SubgroupSpec, TcpTransport, Transport};

/// `spindle bench query` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct QueryArgs {
    /// Queries to time (after 1,000 not timed).
    #[arg(long, default_value_t = 200_000)]
    pub count: u64,
    /// Reply bytes (at most 4,064, one query box).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// The answerer's shard multicasts writes the whole time.
    #[arg(long)]
    pub load: bool,
    /// shm (one region per shard and one for the queries) or tcp (every
    /// member and its query channel on a loopback port of its own).
    #[arg(long, default_value = "shm", value_parser = ["shm", "tcp"])]
    pub transport: String,
    /// Write the result here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

const WAIT: Duration = Duration::from_secs(120);

/// What a run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryResult {
    pub queries: u64,
    pub reply_bytes: usize,
    pub load: bool,
    pub transport: String,
    pub latency_ns: crate::report::Percentiles,
    pub queries_per_s: f64,
    /// Writes the answerer's shard delivered while the queries ran.
    pub writes_delivered_during: u64,
    pub cache_line_round_trip_ns: f64,
    pub p50_over_cache_line_round_trip: f64,
    pub machine: crate::report::Machine,
}

pub fn run(args: QueryArgs) -> Result<(), String> {
    if args.size > spindle::group_layer::query::QUERY_PAYLOAD_BYTES_MAX {
        return Err(format!(
            "--size {}: a reply is at most {} B (one query box)",
            args.size,
            spindle::group_layer::query::QUERY_PAYLOAD_BYTES_MAX
        ));
    }
    if args.count == 0 {
        return Err("--count must be at least 1".into());
    }
    let round_trip_ns = crate::fanout::probe::cache_line_round_trip_ns(0, 1 % num_cpus());
    let name = format!("bench-query-{}", std::process::id());
    // tcp: 4 member addresses and 4 query addresses on loopback.
    let addresses: Option<Vec<std::net::SocketAddr>> = if args.transport == "tcp" {
        let listeners: Vec<std::net::TcpListener> = (0..8)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("find free loopback ports: {e}"))?;
        Some(
            listeners
                .iter()
                .map(|l| l.local_addr())
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let result: Arc<Mutex<Measured>> = Arc::default();
    let threads: Vec<_> = (0..4)
        .map(|rank| {
            let (name, stop, done, writes, result) =
                (name.clone(), stop.clone(), done.clone(), writes.clone(), result.clone());
            let args = args.clone();
            let addresses = addresses.clone();
            std::thread::spawn(move || {
                let mut builder = Group::builder(&name);
                if let Some(a) = addresses {
                    builder = builder
                        .transport(Transport::Tcp(TcpTransport::new(
                            a[..4].to_vec(),
                            b"bench-query-group-key".to_vec(),
                        )))
                        .query_addresses(a[4..].to_vec());
                }
                member(builder, rank, &args, &stop, &done, &writes, &result)
            })
        })
        .collect();
    for (rank, t) in threads.into_iter().enumerate() {
        t.join()
            .map_err(|_| format!("member {rank} panicked"))?
            .map_err(|e| format!("member {rank}: {e}"))?;
    }
    let (hist, seconds) = result
        .lock()
        .expect("result")
        .take()
        .ok_or("member 0 measured nothing")?;
    let latency_ns = crate::report::Percentiles::from_histogram(&hist);
    let out = QueryResult {
        queries: hist.len(),
        reply_bytes: args.size,
        load: args.load,
        transport: args.transport.clone(),
        latency_ns,
        queries_per_s: hist.len() as f64 / seconds,
        writes_delivered_during: writes.load(Ordering::SeqCst) as u64,
        cache_line_round_trip_ns: round_trip_ns,
        p50_over_cache_line_round_trip: latency_ns.p50 as f64 / round_trip_ns,
        machine: crate::report::Machine::detect(),
    };
    println!(
        "query round trip on {}, {} B replies{}: p50 {} ns, p99 {} ns, p99.9 {} ns, {:.0} queries/s; \
         cache-line round trip {:.0} ns (p50 is {:.1}×){}",
        out.transport,
        out.reply_bytes,
        if out.load {
            ", the answerer's shard under a write load"
        } else {
            ""
        },
        out.latency_ns.p50,
        out.latency_ns.p99,
        out.latency_ns.p999,
        out.queries_per_s,
        out.cache_line_round_trip_ns,
        out.p50_over_cache_line_round_trip,
        if out.load {
            format!("; {} writes delivered meanwhile", out.writes_delivered_during)
        } else {
            String::new()
        }
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Member 0's round trips and the seconds they took.
type Measured = Option<(hdrhistogram::Histogram<u64>, f64)>;

fn member(
    builder: spindle::GroupBuilder,
    rank: usize,
    args: &QueryArgs,
    stop: &AtomicBool,
    done: &AtomicUsize,
    writes: &AtomicUsize,
    result: &Mutex<Measured>,
) -> Result<(), String> {
    let value = vec![b'v'; args.size];
    let delivered = Arc::new(AtomicUsize::new(0));
    let mut sharded = builder
        .members(4)
        .rank(rank)
        .join_timeout(WAIT)
        .subgroup(SubgroupSpec::new("kv", 2, 2))
        .queries(true)
        .join_sharded(|_, _| {
            let delivered = delivered.clone();
            let value = value.clone();
            Callbacks::delivering(move |_| {
                delivered.fetch_add(1, Ordering::Relaxed);
            })
            .with_query(move |_key, reply| {
                reply.extend_from_slice(&value);
                Ok(())
            })
        })
        .map_err(|e| e.to_string())?;
    let in_loaded_shard = sharded.my_shard("kv") == Some(1);
    if rank == 0 {
        let answerer = sharded.shard_members("kv", 1).map_err(|e| e.to_string())?[0];
        let mut hist = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        for _ in 0..1_000 {
            sharded
                .query("kv", 1, answerer, b"key", WAIT)
                .map_err(|e| e.to_string())?;
        }
        let started = Instant::now();
        for _ in 0..args.count {
            let t = Instant::now();
            let reply = sharded
                .query("kv", 1, answerer, b"key", WAIT)
                .map_err(|e| e.to_string())?;
            hist.record(t.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
            debug_assert_eq!(reply.len(), args.size);
        }
        let seconds = started.elapsed().as_secs_f64();
        *result.lock().expect("result") = Some((hist, seconds));
        stop.store(true, Ordering::SeqCst);
    } else {
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            if args.load && in_loaded_shard {
                let put = format!("k{i}=v");
                if sharded.send("kv", put.as_bytes()).is_ok() {
                    i += 1;
                }
                sharded.poll().map_err(|e| e.to_string())?;
            } else {
                sharded
                    .run_until(Duration::from_millis(10), |_| stop.load(Ordering::SeqCst))
                    .or_else(|e| match e {
                        spindle::Error::Timeout { .. } => Ok(()),
                        e => Err(e.to_string()),
                    })?;
            }
        }
        if in_loaded_shard && sharded.shards()[0].members[0] == rank {
            writes.store(delivered.load(Ordering::Relaxed), Ordering::SeqCst);
        }
    }
    // Every member keeps answering until all are done.
    done.fetch_add(1, Ordering::SeqCst);
    sharded
        .run_until(WAIT, |_| done.load(Ordering::SeqCst) == 4)
        .map_err(|e| e.to_string())?;
    sharded.finish_together(WAIT).map_err(|e| e.to_string())?;
    Ok(())
}
