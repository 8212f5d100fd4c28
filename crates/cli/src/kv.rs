//! `spindle kv …`: the replicated key-value service speaking RESP.
//!
//! `spindle kv serve` is a supervisor: it starts one process per member
//! (`spindle kv member`, hidden) on shm or tcp — the master, its backups
//! and any spares — and reports what happens to them. The master serves
//! RESP on `bind:port`; when it dies (or loses its majority) a backup
//! elected by a majority recovers, becomes the master of a new epoch and
//! takes over the same address, so clients reconnect to where they were. Kill the master (`kill -9 <pid>`,
//! the pids are printed) to watch a failover; kill a backup with a spare
//! configured to watch the spare replace it.
//!
//! Stopping (Ctrl-C, SIGTERM) is clean: the supervisor sends SIGTERM to
//! the master first, which stops taking writes and waits until every
//! backup has sealed its log on disk, then to the others. With
//! `--data-dir`, a later `spindle kv serve` with the same directory
//! recovers the store from the backups' segments.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Subcommand};
use spindle_replica::config::{ServiceConfig, Transport};
use spindle_replica::layout::Durability;
use spindle_replica::node::{Leader, Membership, Node};
use spindle_replica::server::{bind, serve, ServeOptions};
use spindle_replica::Mode;

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Serve the replicated key-value store (RESP: redis-cli and
    /// redis-benchmark work against it). Without --config: a local store
    /// with 3 backups on shm at 127.0.0.1:6380.
    Serve(ServeArgs),
    /// Simulate the failover (majority election, lease, epochs) with
    /// crashes, pauses and partitions, seed by seed, checking
    /// linearizability and that two masters never answer at once.
    Sim(spindle_bench::kv_sim::KvSimArgs),
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
    /// Spare members that replace a dead backup (overrides the file).
    #[arg(long)]
    pub spares: Option<usize>,
    /// Replication mode: one-sided or rpc (overrides the file).
    #[arg(long)]
    pub mode: Option<String>,
    /// When a write is acknowledged: memory (every backup has it in
    /// memory; the default) or disk (every backup has fdatasynced it)
    /// (overrides the file).
    #[arg(long)]
    pub durability: Option<String>,
    /// Fabric between the members: shm, tcp, or ofi / ofi:PROVIDER
    /// (libfabric; a build with `--features ofi`) (overrides the file; tcp
    /// and ofi without `peers` in the file: loopback, ports port+1 …).
    #[arg(long)]
    pub transport: Option<String>,
    /// shm group name (overrides the file).
    #[arg(long)]
    pub group: Option<String>,
    /// Where backups keep their segments (overrides the file; default: a
    /// fresh directory under the temp dir, removed at exit). A directory
    /// holding an earlier run's segments is recovered from.
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
        KvCommand::Sim(args) => spindle_bench::kv_sim::run(args),
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
    if let Some(n) = args.spares {
        config.spares = n;
    }
    if let Some(t) = &args.transport {
        config.transport = Transport::parse(t).map_err(|e| format!("--transport: {e}"))?;
    }
    if let Some(m) = &args.mode {
        config.mode = Mode::parse(m).map_err(|e| format!("--mode: {e}"))?;
    }
    if let Some(d) = &args.durability {
        config.durability = Durability::parse(d).map_err(|e| format!("--durability: {e}"))?;
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
    let _ = MASTER_FILE.set(config.data_dir.join("master.rank"));
    let _ = std::fs::remove_file(master_file());
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
        "spindle kv: RESP on {}:{} — {} replication to {} backups ({} spares, durability {}) on {} (group '{}', segments in {})",
        config.bind,
        config.port,
        config.mode.as_str(),
        config.backups,
        config.spares,
        config.durability.as_str(),
        config.transport.as_str(),
        config.group,
        config.data_dir.display()
    );
    for (rank, c) in children.iter().enumerate() {
        let pid = c.as_ref().map(|c| c.id()).unwrap_or(0);
        println!(
            "  member {rank}: pid {pid}{}",
            if rank == 0 {
                " (master, unless a restart picks the member with the newest log)"
            } else if rank <= config.backups {
                " (backup)"
            } else {
                " (spare)"
            }
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
    // tcp members that keep their rows in a stat file and exit without
    // unwinding (a master's clean stop ends with `exit`) leave it behind.
    for rank in 0..config.members() {
        let _ = std::fs::remove_file(format!(
            "/dev/shm/{}{}@{rank}",
            spindle_fabric::tcp::stat::STAT_FILE_PREFIX,
            config.group
        ));
    }
    if temp_data {
        let _ = std::fs::remove_dir_all(&config.data_dir);
    }
    if alive == 0 && !STOP.load(Ordering::Acquire) {
        return Err("every member exited".into());
    }
    Ok(())
}

/// How long a clean stop may take before members are killed.
const STOP_WAIT: Duration = Duration::from_secs(20);

/// Stop every member: SIGTERM to the master first (it stops taking
/// writes, waits for every backup to seal its log and exits; the backups
/// then exit on their own), then to the rest; whoever is still there
/// after [`STOP_WAIT`] is killed. Every member is reaped.
fn stop_all(children: &mut [Option<Child>]) {
    let term = |c: &Child| {
        // SAFETY: kill(2) on the pid of a child we have not reaped yet
        // (so the pid is not reused); no memory effects.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
    };
    let started = std::time::Instant::now();
    let wait_exit = |c: &mut Child, until: Duration| loop {
        if !matches!(c.try_wait(), Ok(None)) || started.elapsed() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let master = master_rank(children);
    if let Some(Some(c)) = master.map(|m| &mut children[m]) {
        term(c);
        wait_exit(c, STOP_WAIT / 2);
    }
    for c in children.iter_mut().flatten() {
        if matches!(c.try_wait(), Ok(None)) {
            term(c);
        }
    }
    for c in children.iter_mut().flatten() {
        wait_exit(c, STOP_WAIT);
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The rank whose member serves the RESP port now: the member that
/// announced it in the pid file, else the lowest running rank.
fn master_rank(children: &mut [Option<Child>]) -> Option<usize> {
    let announced = std::fs::read_to_string(master_file())
        .ok()
        .and_then(|t| t.trim().parse::<usize>().ok())
        .filter(|r| *r < children.len());
    announced.or_else(|| {
        children
            .iter_mut()
            .position(|c| c.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None))))
    })
}

/// Where the current master writes its rank (in the data directory).
fn master_file() -> PathBuf {
    MASTER_FILE
        .get()
        .cloned()
        .unwrap_or_else(|| std::env::temp_dir().join("spindle-kv-master-unknown"))
}

static MASTER_FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn run_member(args: MemberArgs) -> Result<(), String> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects; it makes the
    // kernel kill this member when the supervisor dies, so members never
    // outlive `spindle kv serve`. The handlers only store to an atomic
    // (async-signal-safe); SIGINT (a terminal's Ctrl-C reaches the whole
    // process group) is ignored: the supervisor orders the stop.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
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
    let node_config = config.node_config(Duration::from_secs(30));
    match &config.transport {
        Transport::Shm => member_main(
            Node::open_with(node_config, args.rank, config.durability)?,
            &config,
            args.rank,
        ),
        Transport::Tcp => {
            let addresses = config.tcp_addresses()?;
            let key = config.key.as_bytes().to_vec();
            member_main(
                Node::open_tcp_with(node_config, args.rank, addresses, key, None, config.durability)?,
                &config,
                args.rank,
            )
        }
        Transport::Ofi(_) => ofi_member(node_config, &config, args.rank),
    }
}

/// A member over libfabric: writes complete by the provider's completion
/// queue (no echo thread on the backups).
#[cfg(feature = "ofi")]
fn ofi_member(
    node_config: spindle_replica::node::NodeConfig,
    config: &ServiceConfig,
    rank: usize,
) -> Result<(), String> {
    let addresses = config.tcp_addresses()?;
    let key = config.key.as_bytes().to_vec();
    let provider = config.transport.ofi_provider().unwrap_or("tcp");
    member_main(
        Node::open_ofi(node_config, rank, addresses, key, provider, None, config.durability)?,
        config,
        rank,
    )
}

#[cfg(not(feature = "ofi"))]
fn ofi_member(
    _node_config: spindle_replica::node::NodeConfig,
    config: &ServiceConfig,
    _rank: usize,
) -> Result<(), String> {
    Err(format!(
        "transport = \"{}\": this spindle was built without libfabric support; rebuild with \
         `cargo build --release -p spindle-cli --features ofi` (needs libfabric-dev)",
        config.transport.as_str()
    ))
}

/// One member: follow (a backup or spare) until this member leads, then
/// serve. A master that stepped down (it lost its majority: a partition)
/// drops its objects and its listener and follows the new master again;
/// any other serving failure ends the process.
fn member_main<F: Membership>(node: Node<F>, config: &ServiceConfig, rank: usize) -> Result<(), String> {
    loop {
        let Some(leader) = node.run_until_master(&STOP)? else {
            return Ok(());
        };
        match serve_as_master(leader, config, rank)? {
            Served::Stopped => std::process::exit(0),
            Served::SteppedDown(e) => {
                eprintln!("spindle kv: {e}; member {rank} stepped down and follows the new master");
            }
        }
    }
}

/// How a term as master ended.
enum Served {
    /// Stopped cleanly (SIGTERM), every backup's log sealed.
    Stopped,
    /// The failover engine stepped down (why).
    SteppedDown(String),
}

/// Serve clients as the master until a clean stop or a step-down; a
/// replication failure of a master that still leads ends the process.
fn serve_as_master<F: Membership>(leader: Leader<F>, config: &ServiceConfig, rank: usize) -> Result<Served, String> {
    let driver = leader.driver().clone();
    let addr = format!("{}:{}", config.bind, config.port);
    let listener = bind(&addr, Duration::from_secs(10))?;
    let _ = std::fs::write(config.data_dir.join("master.rank"), rank.to_string());
    let mut info_extra = format!("member_rank:{rank}\r\ntransport:{}\r\n", config.transport.as_str());
    match &leader.recovery {
        Some(r) => {
            println!(
                "spindle kv: member {} is master of epoch {} (recovered {} objects from epoch {}{}: {} records, log end {} ≥ guard {}{}; {:.1} ms)",
                rank,
                leader.master.epoch(),
                r.objects,
                r.from_epoch,
                if r.unsealed { ", unsealed" } else { "" },
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
        None => println!("spindle kv: member {rank} is master of epoch 0, serving {addr}"),
    }
    let served = serve(
        &listener,
        leader,
        ServeOptions {
            clients_max: config.clients_max,
            idle_timeout: config.idle_timeout,
            poll_spin_after_work: config.poll_spin,
            value_bytes_max: config.value_bytes_max,
            info_extra,
            stop: Some(&STOP),
        },
    );
    match served {
        // Stopped cleanly, every backup's log sealed: leave at once, as a
        // member process always has (the backups still read our row).
        Ok(_leader) => Ok(Served::Stopped),
        Err(e @ spindle_replica::server::ServeError::Replication(_)) => {
            // Writes nobody may see were in the objects (dropped with the
            // leader; no reply went out). A master that lost its lease
            // steps down within the election time: it then follows the new
            // master. Otherwise exit; the backups fail over from their logs.
            let waited = std::time::Instant::now();
            let bound = Duration::from_nanos(2 * driver.timing().election_ns);
            while driver.stepped_down().is_none() && waited.elapsed() < bound {
                std::thread::sleep(Duration::from_millis(1));
            }
            if driver.stepped_down().is_some() {
                // No longer the master: take back the announcement (unless
                // the new master, on this host, has made its own already).
                let announced = config.data_dir.join("master.rank");
                if std::fs::read_to_string(&announced).is_ok_and(|t| t.trim() == rank.to_string()) {
                    let _ = std::fs::remove_file(&announced);
                }
                return Ok(Served::SteppedDown(e.to_string()));
            }
            eprintln!("spindle kv: {e}; master exits");
            std::process::exit(70);
        }
        Err(e) => Err(e.to_string()),
    }
}
