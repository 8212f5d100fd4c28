//! `spindle kv …`: the replicated key-value service speaking RESP.
//!
//! `spindle kv serve` is a supervisor: it starts one process per member
//! (`spindle kv member`, hidden) on shm — the master (rank 0) and its
//! backups — and reports what happens to them. The master serves RESP on
//! `bind:port`; when it dies the lowest live backup recovers, becomes the
//! master of a new epoch and takes over the same address, so clients
//! reconnect to where they were. Kill the master (`kill -9 <pid>`, the
//! pids are printed) to watch a failover.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Subcommand};
use spindle_replica::config::ServiceConfig;
use spindle_replica::node::{Node, NodeConfig};
use spindle_replica::server::{bind, serve, ServeOptions, Store};
use spindle_replica::Mode;
use spindle_sst::IdleStrategy;

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Serve the replicated key-value store (RESP: redis-cli and
    /// redis-benchmark work against it). Without --config: a local store
    /// with 3 backups on shm at 127.0.0.1:6380.
    Serve(ServeArgs),
    /// (internal) one member process of `spindle kv serve`.
    #[command(hide = true)]
    Member(MemberArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Configuration file (`key = value` lines; see the replica crate's config docs).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Port (overrides the file).
    #[arg(long)]
    pub port: Option<u16>,
    /// Backups R (overrides the file).
    #[arg(long)]
    pub backups: Option<usize>,
    /// Replication mode: one-sided or rpc (overrides the file).
    #[arg(long)]
    pub mode: Option<String>,
    /// shm group name (overrides the file).
    #[arg(long)]
    pub group: Option<String>,
    /// Where backups keep their segments (overrides the file; default: a
    /// fresh directory under the temp dir, removed at exit).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct MemberArgs {
    #[arg(long)]
    pub config: PathBuf,
    #[arg(long)]
    pub rank: usize,
}

pub fn run(command: KvCommand) -> Result<(), String> {
    match command {
        KvCommand::Serve(args) => run_serve(args),
        KvCommand::Member(args) => run_member(args),
    }
}

fn effective_config(args: &ServeArgs) -> Result<(ServiceConfig, bool), String> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
            ServiceConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => ServiceConfig::local_default(),
    };
    let mut temp_data = args.config.is_none();
    if let Some(p) = args.port {
        config.port = p;
    }
    if let Some(b) = args.backups {
        config.backups = b;
    }
    if let Some(m) = &args.mode {
        config.mode = Mode::parse(m).map_err(|e| format!("--mode: {e}"))?;
    }
    if let Some(g) = &args.group {
        config.group = g.clone();
    }
    if let Some(d) = &args.data_dir {
        config.data_dir = d.clone();
        temp_data = false;
    } else if temp_data {
        config.data_dir = std::env::temp_dir().join(format!("spindle-kv-{}", std::process::id()));
    }
    config.validate()?;
    Ok((config, temp_data))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

fn run_serve(args: ServeArgs) -> Result<(), String> {
    let (config, temp_data) = effective_config(&args)?;
    // Fail fast, before any member starts, when the address is taken.
    let addr = format!("{}:{}", config.bind, config.port);
    drop(std::net::TcpListener::bind(&addr).map_err(|e| format!("cannot serve on {addr}: {e}"))?);
    std::fs::create_dir_all(&config.data_dir).map_err(|e| format!("create {}: {e}", config.data_dir.display()))?;
    let config_path = config.data_dir.join("service.conf");
    std::fs::write(&config_path, config.to_text()).map_err(|e| format!("write {}: {e}", config_path.display()))?;
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let exe = std::env::current_exe().map_err(|e| format!("find own executable: {e}"))?;
    let mut children: Vec<Option<Child>> = Vec::new();
    for rank in 0..config.members() {
        match Command::new(&exe)
            .args(["kv", "member", "--rank", &rank.to_string(), "--config"])
            .arg(&config_path)
            .spawn()
        {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                stop_all(&mut children);
                return Err(format!("spawn member {rank}: {e}"));
            }
        }
    }
    println!(
        "spindle kv: RESP on {}:{} — {} replication to {} backups on shm (group '{}', segments in {})",
        config.bind,
        config.port,
        config.mode.as_str(),
        config.backups,
        config.group,
        config.data_dir.display()
    );
    for (rank, c) in children.iter().enumerate() {
        let pid = c.as_ref().map(|c| c.id()).unwrap_or(0);
        println!(
            "  member {rank}: pid {pid}{}",
            if rank == 0 { " (master)" } else { " (backup)" }
        );
    }
    println!("kill the master's pid to watch a failover; Ctrl-C stops the service");
    let mut alive = children.len();
    while alive > 0 && !STOP.load(Ordering::Acquire) {
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Ok(Some(status)) = child.try_wait() {
                println!("spindle kv: member {rank} (pid {}) exited: {status}", child.id());
                *slot = None;
                alive -= 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_all(&mut children);
    // Every member is reaped: nobody maps the group file any more (members
    // killed by a signal never ran their fabric's cleanup).
    let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(
        std::path::Path::new("/dev/shm"),
        &config.group,
    ));
    if temp_data {
        let _ = std::fs::remove_dir_all(&config.data_dir);
    }
    if alive == 0 && !STOP.load(Ordering::Acquire) {
        return Err("every member exited".into());
    }
    Ok(())
}

/// Kill every member first, backups before the master, then reap them
/// (killing and reaping one by one would start failovers on the way out).
fn stop_all(children: &mut [Option<Child>]) {
    for child in children.iter_mut().rev().flatten() {
        let _ = child.kill();
    }
    for child in children.iter_mut().flatten() {
        let _ = child.wait();
    }
}

fn run_member(args: MemberArgs) -> Result<(), String> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects; it makes the
    // kernel kill this member when the supervisor dies, so members never
    // outlive `spindle kv serve`.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let text = std::fs::read_to_string(&args.config).map_err(|e| format!("read {}: {e}", args.config.display()))?;
    let config = ServiceConfig::parse(&text)?;
    if args.rank >= config.members() {
        return Err(format!(
            "--rank {} out of range: {} members",
            args.rank,
            config.members()
        ));
    }
    let node = Node::open(
        NodeConfig {
            group: config.group.clone(),
            members: config.members(),
            mode: config.mode,
            geometry: config.geometry,
            value_bytes_max: config.value_bytes_max,
            memory_bytes_max: config.memory_bytes_max,
            data_dir: config.data_dir.clone(),
            idle: IdleStrategy::DEFAULT_BACKOFF,
            join_timeout: Duration::from_secs(30),
        },
        args.rank,
    )?;
    let stop = AtomicBool::new(false);
    let Some(leader) = node.run_until_master(&stop)? else {
        return Ok(());
    };
    let addr = format!("{}:{}", config.bind, config.port);
    let listener = bind(&addr, Duration::from_secs(10))?;
    let mut info_extra = format!("member_rank:{}\r\n", args.rank);
    match &leader.recovery {
        Some(r) => {
            println!(
                "spindle kv: member {} is master of epoch {} (recovered {} objects from epoch {}: {} records, log end {} ≥ guard {}{}; {:.1} ms)",
                args.rank,
                leader.master.epoch(),
                r.objects,
                r.from_epoch,
                r.records,
                r.end,
                r.guard,
                r.torn.as_ref().map(|t| format!(", torn tail dropped: {t}")).unwrap_or_default(),
                r.replay_ns as f64 / 1e6
            );
            info_extra.push_str(&format!(
                "recovered_from_epoch:{}\r\nrecovered_objects:{}\r\n",
                r.from_epoch, r.objects
            ));
        }
        None => println!("spindle kv: member {} is master of epoch 0, serving {addr}", args.rank),
    }
    serve(
        listener,
        Store {
            master: leader.master,
            objects: leader.objects,
        },
        ServeOptions {
            clients_max: config.clients_max,
            value_bytes_max: config.value_bytes_max,
            info_extra,
        },
    )
}
