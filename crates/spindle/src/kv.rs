//! [`KvService`]: the replicated key-value service (one-sided
//! primary-backup, speaking RESP) started inside this process, for
//! examples, tests and programs that embed it.
//!
//! ```no_run
//! let service = spindle::kv::KvService::builder().backups(2).start()?;
//! println!("redis-cli -p {}", service.addr().port());
//! // … any Redis client: SET, GET, DEL, EXISTS, MGET, MSET, INCR …
//! service.stop()?;
//! # Ok::<(), spindle::kv::KvError>(())
//! ```
//!
//! Every member (the master and each backup) runs on its own thread with
//! its own mapping of one shm group file, exactly as the member processes
//! of `spindle kv serve` do: the master appends each write to the backups'
//! logs with one-sided writes and answers once they all have it. The
//! listening socket is bound before any member starts (so the address is
//! known at once) and is shared by the members: if the master's thread
//! fails, a backup elected by a majority recovers from its log and serves
//! on the same address.
//!
//! [`KvService::stop`] (and `Drop`) stops cleanly: the master stops taking
//! requests, ends its epoch with every backup's log sealed on disk, every
//! thread is joined, and the shm group file and the service's temporary
//! data directory are removed. With [`KvBuilder::data_dir`] the segments
//! stay there, and a later service on the same directory recovers them.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use spindle_fabric::shm::ShmFabric;
use spindle_replica::config::ServiceConfig;
use spindle_replica::node::{Leader, Node, NodeConfig};
use spindle_replica::server::{serve, ServeOptions};
use spindle_replica::Mode;

/// How long the members may take to find each other (and start waits for
/// a master beyond it, for recovery from a data directory).
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra time [`KvBuilder::start`] allows a master to recover and publish
/// its first epoch after the members joined.
const LEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Why starting or stopping a [`KvService`] failed.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// A setting is invalid (the message names it).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The RESP address could not be bound.
    #[error("cannot serve on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The data directory could not be created.
    #[error("create the data directory {}: {source}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A member failed (opening the group, recovering, replicating, sealing).
    #[error("member {rank}: {message}")]
    Member {
        /// The member's rank (0 is the first master).
        rank: usize,
        /// What went wrong.
        message: String,
    },
    /// No member became the master in time.
    #[error("timed out after {waited_ms} ms waiting for a member to become the master")]
    Timeout {
        /// How long start waited.
        waited_ms: u64,
    },
    /// A member's thread panicked (or could not be started).
    #[error("member {rank}'s thread: {message}")]
    Thread {
        /// The member's rank.
        rank: usize,
        /// The panic or spawn error.
        message: String,
    },
}

/// Settings of a [`KvService`]; every one has the default of
/// `spindle kv serve` except the port (0: any free port) and the data
/// directory (a fresh temporary one, removed at stop).
#[derive(Clone, Debug)]
pub struct KvBuilder {
    config: ServiceConfig,
    data_dir: Option<PathBuf>,
}

impl KvBuilder {
    /// Backups R that hold every write (1..=63; default 3).
    pub fn backups(mut self, backups: usize) -> KvBuilder {
        self.config.backups = backups;
        self
    }

    /// Serve RESP on `127.0.0.1:port` (0, the default: a free port; see
    /// [`KvService::addr`]).
    pub fn port(mut self, port: u16) -> KvBuilder {
        self.config.port = port;
        self
    }

    /// Replication by one-sided writes (the default) or the two-sided RPC
    /// baseline.
    pub fn mode(mut self, mode: Mode) -> KvBuilder {
        self.config.mode = mode;
        self
    }

    /// Keep the backups' segments in `dir` (kept at stop); a directory
    /// holding an earlier service's segments is recovered from.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> KvBuilder {
        self.data_dir = Some(dir.into());
        self
    }

    /// The largest value a client may write, in bytes (default 1 MiB).
    pub fn value_bytes_max(mut self, bytes: usize) -> KvBuilder {
        self.config.value_bytes_max = bytes;
        self
    }

    /// Start the members and return once one of them is the master,
    /// serving on [`KvService::addr`].
    pub fn start(self) -> Result<KvService, KvError> {
        KvService::start(self)
    }
}

/// A running local service: its members' threads and the RESP address.
/// Stop it with [`KvService::stop`] to see errors; dropping it stops it
/// too.
pub struct KvService {
    addr: SocketAddr,
    group: String,
    data_dir: PathBuf,
    remove_data_dir: bool,
    stop: Arc<AtomicBool>,
    members: Vec<(usize, JoinHandle<MemberExit>)>,
    backups: usize,
}

/// What a member's thread ends with: the master's leader and node, kept
/// until every backup has returned (they read the master's row to the end).
type MemberExit = Result<Option<(Leader<ShmFabric>, Node<ShmFabric>)>, String>;

/// What the member threads share.
struct Shared {
    stop: Arc<AtomicBool>,
    listener: TcpListener,
    clients_max: usize,
    idle_timeout: std::time::Duration,
    poll_spin: std::time::Duration,
    value_bytes_max: usize,
}

/// Distinguishes the services one process starts (shm group names).
static SERVICES: AtomicU64 = AtomicU64::new(0);

impl KvService {
    /// Settings for a local service on shm: 3 backups, one-sided, any free port.
    pub fn builder() -> KvBuilder {
        let mut config = ServiceConfig::local_default();
        config.port = 0;
        KvBuilder { config, data_dir: None }
    }

    fn start(builder: KvBuilder) -> Result<KvService, KvError> {
        let mut config = builder.config;
        let n = SERVICES.fetch_add(1, Ordering::Relaxed);
        config.group = format!("kv-{}-{n}", std::process::id());
        let remove_data_dir = builder.data_dir.is_none();
        config.data_dir = builder
            .data_dir
            .unwrap_or_else(|| std::env::temp_dir().join(&config.group));
        config.validate().map_err(KvError::Config)?;
        let addr = format!("{}:{}", config.bind, config.port);
        let bind_err = |source| KvError::Bind {
            addr: addr.clone(),
            source,
        };
        let listener = TcpListener::bind(&addr).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        std::fs::create_dir_all(&config.data_dir).map_err(|source| KvError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            stop: stop.clone(),
            listener,
            clients_max: config.clients_max,
            idle_timeout: config.idle_timeout,
            poll_spin: config.poll_spin,
            value_bytes_max: config.value_bytes_max,
        });
        let mut service = KvService {
            addr: local,
            group: config.group.clone(),
            data_dir: config.data_dir.clone(),
            remove_data_dir,
            stop,
            members: Vec::new(),
            backups: config.backups,
        };
        let (ready_tx, ready) = mpsc::channel();
        for rank in 0..config.members() {
            let (node_config, shared, ready_tx) = (config.node_config(JOIN_TIMEOUT), shared.clone(), ready_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("kv-member-{rank}"))
                .spawn(move || {
                    let exit = member(node_config, rank, &shared, &ready_tx);
                    if let Err(e) = &exit {
                        let _ = ready_tx.send(Err((rank, e.clone())));
                    }
                    exit
                });
            match spawned {
                Ok(handle) => service.members.push((rank, handle)),
                Err(e) => {
                    let _ = service.shutdown();
                    return Err(KvError::Thread {
                        rank,
                        message: e.to_string(),
                    });
                }
            }
        }
        drop(ready_tx);
        let waited = JOIN_TIMEOUT + LEAD_TIMEOUT;
        let first = ready.recv_timeout(waited);
        match first {
            Ok(Ok(_master)) => Ok(service),
            Ok(Err((rank, message))) => {
                let _ = service.shutdown();
                Err(KvError::Member { rank, message })
            }
            Err(_) => {
                let _ = service.shutdown();
                Err(KvError::Timeout {
                    waited_ms: waited.as_millis() as u64,
                })
            }
        }
    }

    /// Where the master serves RESP (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address as a Redis URL (`redis://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Backups R holding every write.
    pub fn backups(&self) -> usize {
        self.backups
    }

    /// Where the backups keep their segments.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Stop cleanly: the master ends its epoch with every backup's log
    /// sealed on disk; every member's thread is joined; the shm group file
    /// and a temporary data directory are removed. The error is the first
    /// member's that failed (the rest is cleaned up all the same).
    pub fn stop(mut self) -> Result<(), KvError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), KvError> {
        // Release: pairs with the Acquire loads of the flag in the server's
        // `Service::stopping` (spindle_replica::server) and in
        // `run_until_master`.
        self.stop.store(true, Ordering::Release);
        let mut first_error = None;
        let mut held = Vec::new();
        for (rank, handle) in self.members.drain(..) {
            let error = match handle.join() {
                Ok(Ok(leader)) => {
                    held.extend(leader);
                    None
                }
                Ok(Err(message)) => Some(KvError::Member { rank, message }),
                Err(panic) => Some(KvError::Thread {
                    rank,
                    message: panic_message(&panic),
                }),
            };
            first_error = first_error.or(error);
        }
        // Every backup has returned: the master's row may go now.
        drop(held);
        let _ = std::fs::remove_file(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), &self.group));
        if self.remove_data_dir {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for KvService {
    fn drop(&mut self) {
        if !self.members.is_empty() {
            let _ = self.shutdown();
        }
    }
}

impl std::fmt::Debug for KvService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvService")
            .field("addr", &self.addr)
            .field("group", &self.group)
            .field("backups", &self.backups)
            .field("data_dir", &self.data_dir)
            .finish()
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panicked".into())
}

/// One member: a backup until it becomes the master, then the server
/// until the stop flag (or a failed replication) ends it.
fn member(
    config: NodeConfig,
    rank: usize,
    shared: &Shared,
    ready: &mpsc::Sender<Result<usize, (usize, String)>>,
) -> MemberExit {
    let node = Node::open(config, rank)?;
    let Some(leader) = node.run_until_master(&shared.stop)? else {
        return Ok(None);
    };
    let _ = ready.send(Ok(rank));
    let options = ServeOptions {
        clients_max: shared.clients_max,
        idle_timeout: shared.idle_timeout,
        poll_spin_after_work: shared.poll_spin,
        value_bytes_max: shared.value_bytes_max,
        info_extra: format!("member_rank:{rank}\r\ntransport:shm\r\n"),
        stop: Some(&shared.stop),
    };
    // A failed replication ends this thread with the error; the node is
    // dropped with it (this member leaves) and a backup takes over on the
    // same listener.
    let leader = serve(&shared.listener, leader, options).map_err(|e| e.to_string())?;
    Ok(Some((leader, node)))
}
