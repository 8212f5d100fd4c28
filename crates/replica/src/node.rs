//! One member of a replicated store, on shm, tcp or ofi: a backup (or a spare)
//! until it becomes the master, through as many failovers as it takes.
//!
//! ```text
//!  epoch e, master m            every backup                     epoch e+1
//!  ───────────────── m dies ──▶ stops and seals epoch e ───────▶ backup n of epoch e, elected by a
//!  (or loses its majority)      when its failover engine moves  majority (`crate::failover`):
//!                               on (whole log on disk + guard)    replay its log (latest epoch
//!                                                                 with a complete snapshot),
//!                                                                 publish epoch e+1 with R backups,
//!                                                                 wait for them to follow, write the
//!                                                                 snapshot + SnapshotDone, serve
//!
//!  m rolls (clean, replace)      backups see `stopped = e+1`, seal e; m publishes e+1 with a new
//!                                backup set (a spare replaces a dead backup) and re-appends the
//!                                live objects; once e+1's snapshot is on a backup's disk it
//!                                deletes epochs < e+1 (log cleaning)
//!
//!  start (or restart)            every member publishes what its disk holds (`disk_epoch`); the
//!                                member with the newest log leads epoch (newest + 1), recovering
//!                                from its own disk (sealed or not: torn tail dropped)
//! ```
//!
//! Who leads is the failover engine's decision ([`crate::failover`], run by
//! [`crate::driver`]): a majority elects, a lease fences the old master,
//! and every change of the backup set is a new epoch asked of a majority.
//! Liveness ([`Membership`]) only helps it: on shm a member is alive while
//! its slot in the group file says *running* and its process exists (a
//! crashed process is found by pid; a member thread that leaves sets its
//! slot to *left*), and a gone member is gone for certain; on tcp a member
//! (and on ofi) is alive while its connection is up, and nothing is certain.
//!
//! Members beyond `1 + backups` are **spares**: they follow no epoch until
//! a master puts them in its backup set (replacing a dead backup).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::tcp::{PeerStatus, TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, PeerSet};
use spindle_runtime::{monotonic_coarse_ns, IdleStrategy};

use crate::backup::Backup;
use crate::disk::SegmentDisk;
use crate::driver::Driver;
use crate::failover::Timing;
use crate::layout::{Completion, Durability, ReplicaLayout, ROLE_MASTER, ROLE_STOPPED};
use crate::log::LogGeometry;
use crate::master::{Master, Mode};
use crate::record::{RecordKind, HEADER_BYTES};
use crate::replay::replay_into;
use crate::store::ObjectMap;

/// A fabric that can tell whether a member is alive.
pub trait Membership: Fabric + Send + Sync + 'static {
    fn member_alive(&self, rank: usize) -> bool;
    /// Whether `rank` is gone for certain (it joined, and its process has
    /// left or is gone): the failover then counts it out of the majority.
    /// Never true on a fabric whose losses may be cut links (tcp).
    fn member_gone(&self, rank: usize) -> bool;
    /// The process of `rank`, where the fabric knows it (shm): its
    /// failover driver then waits on that process's pidfd between ticks
    /// and sees its death at once ([`crate::liveness::ProcessWatch`]).
    fn member_pid(&self, _rank: usize) -> Option<u32> {
        None
    }
}

/// Slot states in the shm group file header (see the fabric's file
/// layout diagram): a slot never joined is empty.
const SLOT_EMPTY: u32 = 0;

impl Membership for ShmFabric {
    fn member_alive(&self, rank: usize) -> bool {
        alive(self, rank)
    }
    fn member_gone(&self, rank: usize) -> bool {
        // Partner: the Release store of the slot state by the fabric.
        let joined = self.header().members[rank].state.load(Ordering::Acquire) != SLOT_EMPTY;
        joined && !alive(self, rank)
    }
    fn member_pid(&self, rank: usize) -> Option<u32> {
        let slot = &self.header().members[rank];
        // Partner: the Release store of the slot state by the fabric (it
        // stores the pid before).
        (slot.state.load(Ordering::Acquire) == SLOT_RUNNING).then(|| slot.pid.load(Ordering::Relaxed))
    }
}

impl Membership for TcpFabric {
    fn member_alive(&self, rank: usize) -> bool {
        rank == self.member_rank() || self.peer_status(rank).0 == PeerStatus::Connected
    }
    /// A broken connection may be a cut link: nothing is certain on tcp.
    fn member_gone(&self, _rank: usize) -> bool {
        false
    }
}

/// ofi: alive while its writes land and its control connection is up;
/// as on tcp, a lost connection may be a cut link, so nothing is certain.
#[cfg(feature = "ofi")]
impl Membership for spindle_fabric::ofi::OfiFabric {
    fn member_alive(&self, rank: usize) -> bool {
        self.peer_alive(rank)
    }
    fn member_gone(&self, _rank: usize) -> bool {
        false
    }
}

/// What one member needs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub group: String,
    pub members: usize,
    /// R: backups per epoch; members beyond `1 + backups` are spares.
    pub backups: usize,
    pub mode: Mode,
    pub geometry: LogGeometry,
    pub value_bytes_max: usize,
    pub memory_bytes_max: usize,
    /// Log cleaning: the master rolls once the epoch's log is longer than
    /// twice the live data plus this many segments ([`log_bytes_max`];
    /// default [`CLEAN_SLACK_SEGMENTS_DEFAULT`]).
    pub clean_slack_segments: u64,
    /// Each member keeps its segments in `<data_dir>/member-<rank>`; what
    /// is there at open is recovered (restart after a total stop).
    pub data_dir: PathBuf,
    /// How the rpc copier, the tcp echo thread and the disk syncer idle:
    /// a backoff's spins, at most 200 of them (none over tcp, where
    /// nobody receives while they spin), then a park of at least 10 ms,
    /// never a yield (`backup::reply_idle`); a busy spin as is.
    pub idle: IdleStrategy,
    pub join_timeout: Duration,
    /// The master's lease ([`crate::failover`]): it answers only while a
    /// majority renewed it within this; a new master is elected only after
    /// `lease × 5/3` without heartbeats (tcp: the failover time).
    pub lease: Duration,
}

/// The default lease (`lease_ms` in the service's config).
pub const LEASE_DEFAULT: Duration = Duration::from_millis(400);

impl NodeConfig {
    /// Spares: members that are neither the master nor one of its R backups.
    pub fn spares(&self) -> usize {
        self.members.saturating_sub(1 + self.backups)
    }
}

/// When the master rolls to a new epoch to clean its log: once the
/// epoch's log is longer than `LOG_LIVE_FACTOR` × the live objects' log
/// bytes plus `clean_slack_segments` segments. The disk of a backup then
/// holds at most about three epochs of at most that many bytes each.
pub const LOG_LIVE_FACTOR: u64 = 2;

/// The default slack of log cleaning, in segments (32 MiB with the
/// default 2 MiB segments).
///
/// The slack pays for the roll's fixed cost, which does not shrink with
/// the live data: a majority's promise of the new epoch, every backup's
/// seal (its open segment and the `sealed` marker written with fsync) and
/// the backups following again, 15-90 ms in all with 3 backups on this
/// project's 2-vCPU VM (bench/RESULTS-replica.md, "The pause of a
/// cleaning roll"). With 2 segments of slack, a few hot keys (every
/// `redis-benchmark -t set` writes one key) rolled every 4 MiB of log,
/// 4-7 times a second, and writes waited in rolls a tenth of the time;
/// with 16, 8× less often. The price: up to that much more log per epoch
/// on a backup's disk and to replay at a failover or restart (measured
/// on shm: a failover 28-43 ms with 3.5 MiB of log, 115-190 ms with
/// 28 MiB). A service that must fail over fast and overwrites a few keys
/// at a high rate sets it lower.
pub const CLEAN_SLACK_SEGMENTS_DEFAULT: u64 = 16;
/// How often the master looks for dead backups (a system call per
/// backup on shm), at most.
pub const CHECK_INTERVAL_NS: u64 = 10_000_000;

/// The log length at which a master with `objects` rolls (cleans).
pub fn log_bytes_max(objects: &ObjectMap, geometry: &LogGeometry, clean_slack_segments: u64) -> u64 {
    let live = objects.bytes() as u64 + objects.len() as u64 * HEADER_BYTES as u64;
    LOG_LIVE_FACTOR * live + clean_slack_segments * geometry.segment_bytes as u64
}

/// A member that has become the master: its log writer and its objects.
pub struct Leader<F: Membership = ShmFabric> {
    pub master: Master<F>,
    pub objects: ObjectMap,
    /// How the objects were recovered (`None` for a fresh store).
    pub recovery: Option<RecoveryReport>,
    fabric: Arc<F>,
    driver: Arc<Driver<F>>,
    backups_wanted: usize,
    geometry: LogGeometry,
    clean_slack_segments: u64,
    last_check_ns: u64,
    /// Epoch rolls done to clean the log.
    pub cleanings: u64,
    /// Dead backups replaced by spares.
    pub replacements: u64,
    /// How long the last roll (cleaning, replacement or a dropped backup)
    /// held writes, from asking for the epoch to its snapshot on every
    /// backup; and the longest so far (`INFO`: `roll_pause_us_*`).
    pub roll_pause_ns_last: u64,
    pub roll_pause_ns_max: u64,
}

/// What a new master replayed.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub from_epoch: u64,
    pub guard: u64,
    pub end: u64,
    pub records: u64,
    pub objects: usize,
    pub torn: Option<String>,
    pub replay_ns: u64,
    /// The epoch was not sealed (a restart after every member stopped
    /// without a clean stop): replayed up to the first invalid record.
    pub unsealed: bool,
}

/// One member of the store.
pub struct Node<F: Membership = ShmFabric> {
    fabric: Arc<F>,
    layout: ReplicaLayout,
    config: NodeConfig,
    disk: SegmentDisk,
    start_epoch: u64,
    start_master: usize,
    driver: Arc<Driver<F>>,
}

/// Slot state "running" in the shm group file header (see the fabric's
/// file layout diagram).
const SLOT_RUNNING: u32 = 1;

/// Whether `rank` is alive (see the module docs).
pub fn alive(fabric: &ShmFabric, rank: usize) -> bool {
    let slot = &fabric.header().members[rank];
    // Partner: the Release store of the slot state by the fabric.
    if slot.state.load(Ordering::Acquire) != SLOT_RUNNING {
        return false;
    }
    let pid = slot.pid.load(Ordering::Relaxed);
    pid == std::process::id() || process_alive(pid)
}

/// A process exists and is not a zombie (one `poll(2)` of its pidfd once
/// watched: [`crate::liveness`]).
pub use crate::liveness::process_alive;

/// A following backup's (or spare's) first nap between looks at its
/// master's stop word and its own backup threads; each nap with nothing
/// new doubles, up to [`FOLLOW_NAP_MAX`]. A failover or roll does not wait
/// for it: the driver wakes the thread ([`Driver::wait_view`]). At a fixed
/// 500 µs, each idle backup's main thread was about 3% of a core.
const FOLLOW_NAP_MIN: Duration = Duration::from_micros(500);
/// The longest such nap: how late a master's clean stop (or a backup
/// thread's failure, or `stop`) may be seen.
const FOLLOW_NAP_MAX: Duration = Duration::from_millis(4);

/// How a wait on the master ended.
enum Seen {
    /// It leads the epoch waited for, with this backup set.
    Published(u64),
    /// It stopped cleanly: the service is shutting down.
    Stopped,
    /// The failover engine moved on (or `stop` was set).
    Gone,
}

impl Node<ShmFabric> {
    /// Open the group's shm file as `rank` and wait for every member
    /// (memory durability).
    pub fn open(config: NodeConfig, rank: usize) -> Result<Node<ShmFabric>, String> {
        Node::open_with(config, rank, Durability::Memory)
    }

    /// As [`Node::open`], acknowledging writes as `durability` says
    /// (every member must say the same: it is part of the layout tag).
    pub fn open_with(config: NodeConfig, rank: usize, durability: Durability) -> Result<Node<ShmFabric>, String> {
        let layout = replica_layout(&config, Completion::Push, durability)?;
        let mut options = ShmOptions::new(
            &config.group,
            config.members,
            layout.row.row_len_bytes(),
            layout.row.tag(),
        );
        options.layout_description = layout.row.summary();
        let fabric = Arc::new(ShmFabric::open(&options, rank).map_err(|e| e.to_string())?);
        Node::start(fabric, layout, config)
    }
}

impl Node<TcpFabric> {
    /// Open member `rank` of a group over tcp: `addresses[r]` is where
    /// member `r` listens, `key` the group's shared secret. One-sided
    /// writes complete by echo ([`Completion::Echo`]).
    pub fn open_tcp(
        config: NodeConfig,
        rank: usize,
        addresses: Vec<std::net::SocketAddr>,
        key: Vec<u8>,
    ) -> Result<Node<TcpFabric>, String> {
        Node::open_tcp_on(config, rank, addresses, key, None)
    }

    /// As [`Node::open_tcp`], on a listener the caller bound already
    /// (tests bind port 0 first).
    pub fn open_tcp_on(
        config: NodeConfig,
        rank: usize,
        addresses: Vec<std::net::SocketAddr>,
        key: Vec<u8>,
        listener: Option<std::net::TcpListener>,
    ) -> Result<Node<TcpFabric>, String> {
        Node::open_tcp_with(config, rank, addresses, key, listener, Durability::Memory)
    }

    /// As [`Node::open_tcp_on`], acknowledging writes as `durability`
    /// says (every member must say the same).
    pub fn open_tcp_with(
        config: NodeConfig,
        rank: usize,
        addresses: Vec<std::net::SocketAddr>,
        key: Vec<u8>,
        listener: Option<std::net::TcpListener>,
        durability: Durability,
    ) -> Result<Node<TcpFabric>, String> {
        if addresses.len() != config.members {
            return Err(format!(
                "{} tcp addresses given for {} members",
                addresses.len(),
                config.members
            ));
        }
        let layout = replica_layout(&config, Completion::Echo, durability)?;
        let mut options = TcpOptions::new(
            &config.group,
            layout.row.row_len_bytes(),
            layout.row.tag(),
            addresses,
            key,
        );
        options.join_timeout = config.join_timeout;
        let fabric = match listener {
            Some(l) => TcpFabric::open_with_listener(&options, rank, l),
            None => TcpFabric::open(&options, rank),
        };
        Node::start(Arc::new(fabric.map_err(|e| e.to_string())?), layout, config)
    }
}

#[cfg(feature = "ofi")]
impl Node<spindle_fabric::ofi::OfiFabric> {
    /// Open member `rank` of a group over libfabric's `provider`
    /// (`"verbs"`, `"efa"`, `"tcp"`, ...): `addresses[r]` is where member
    /// `r`'s control plane listens, `key` the group's shared secret.
    /// One-sided writes complete when the provider's completion queue
    /// reports them delivered ([`Completion::Queue`]): no echo thread.
    pub fn open_ofi(
        config: NodeConfig,
        rank: usize,
        addresses: Vec<std::net::SocketAddr>,
        key: Vec<u8>,
        provider: &str,
        listener: Option<std::net::TcpListener>,
        durability: Durability,
    ) -> Result<Node<spindle_fabric::ofi::OfiFabric>, String> {
        use spindle_fabric::ofi::{OfiFabric, OfiOptions};
        if addresses.len() != config.members {
            return Err(format!(
                "{} addresses given for {} members",
                addresses.len(),
                config.members
            ));
        }
        let layout = replica_layout(&config, Completion::Queue, durability)?;
        let mut options = OfiOptions::new(
            &config.group,
            layout.row.row_len_bytes(),
            layout.row.tag(),
            addresses,
            key,
            provider,
        );
        options.tcp.join_timeout = config.join_timeout;
        options.delivery_complete = true;
        let fabric = match listener {
            Some(l) => OfiFabric::open_with_listener(&options, rank, l),
            None => OfiFabric::open(&options, rank),
        };
        Node::start(Arc::new(fabric.map_err(|e| e.to_string())?), layout, config)
    }
}

/// The row layout of a member with `config` (its geometry checked first).
fn replica_layout(
    config: &NodeConfig,
    completion: Completion,
    durability: Durability,
) -> Result<ReplicaLayout, String> {
    config.geometry.validate(config.value_bytes_max)?;
    Ok(ReplicaLayout::with_durability(
        config.members,
        config.geometry,
        config.mode.as_str(),
        completion,
        durability,
    ))
}

/// What a member's disk holds, as published in `disk_epoch`:
/// `1 + 2·(newest epoch + 1) + sealed` (1: nothing; 0: not published yet).
fn disk_score(disk: &SegmentDisk) -> u64 {
    for epoch in disk.epochs() {
        let sealed = disk.sealed_guard(epoch).is_some();
        if sealed || disk.has_segments(epoch) {
            return 1 + 2 * (epoch + 1) + sealed as u64;
        }
    }
    1
}

impl<F: Membership> Node<F> {
    /// Wait for every member, then agree on where to start: every member
    /// publishes what its disk holds; the newest log leads.
    pub fn start(fabric: Arc<F>, layout: ReplicaLayout, config: NodeConfig) -> Result<Node<F>, String> {
        Timing::from_lease_ms(config.lease.as_millis() as u64)
            .validate()
            .map_err(|e| format!("lease {:?}: {e}", config.lease))?;
        if config.backups == 0 || config.backups >= config.members {
            return Err(format!(
                "backups = {}: expected 1..={} with {} members",
                config.backups,
                config.members - 1,
                config.members
            ));
        }
        spindle_fabric::wait_all_joined(fabric.as_ref() as &dyn Fabric, &config.group, config.join_timeout)
            .map_err(|e| e.to_string())?;
        let rank = fabric.member_rank();
        let disk = SegmentDisk::new(config.data_dir.join(format!("member-{rank}")));
        let cell = layout.disk_epoch.offset();
        // Partner: the Acquire loads below, by every other member.
        fabric
            .row(rank)
            .u64_at(cell)
            .store(disk_score(&disk), Ordering::Release);
        fabric
            .push(cell..cell + 8, PeerSet::all_except(rank, config.members))
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut scores = vec![0u64; config.members];
        loop {
            for (r, score) in scores.iter_mut().enumerate() {
                // Partner: the Release store above, by member r.
                *score = fabric.row(r).u64_at(cell).load(Ordering::Acquire);
            }
            if scores.iter().all(|s| *s != 0) {
                break;
            }
            if started.elapsed() > config.join_timeout {
                let missing: Vec<usize> = (0..config.members).filter(|r| scores[*r] == 0).collect();
                return Err(format!(
                    "members {missing:?} did not say what their disks hold within {:?}",
                    config.join_timeout
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Highest score, lowest rank on ties; a fresh store starts at 0.
        let (start_master, best) = scores
            .iter()
            .enumerate()
            .fold((0, 1), |(br, bs), (r, s)| if *s > bs { (r, *s) } else { (br, bs) });
        let start_epoch = if best <= 1 { 0 } else { (best - 1) / 2 };
        let timing = Timing::from_lease_ms(config.lease.as_millis() as u64);
        let driver = Driver::start(
            fabric.clone(),
            layout.clone(),
            timing,
            start_epoch,
            start_master,
            config.mode,
        )?;
        Ok(Node {
            fabric,
            layout,
            config,
            disk,
            start_epoch,
            start_master,
            driver,
        })
    }

    pub fn fabric(&self) -> &Arc<F> {
        &self.fabric
    }
    pub fn rank(&self) -> usize {
        self.fabric.member_rank()
    }
    pub fn disk(&self) -> &SegmentDisk {
        &self.disk
    }
    /// The epoch and master this member starts with (> 0: a restart).
    pub fn start_point(&self) -> (u64, usize) {
        (self.start_epoch, self.start_master)
    }

    fn alive(&self, rank: usize) -> bool {
        self.fabric.member_alive(rank)
    }

    fn load(&self, rank: usize, offset: usize) -> u64 {
        self.fabric.row(rank).u64_at(offset).load(Ordering::Acquire)
    }

    /// The failover driver of this member.
    pub fn driver(&self) -> &Arc<Driver<F>> {
        &self.driver
    }

    /// The epoch and master this member's failover engine follows now.
    fn view(&self) -> crate::driver::View {
        self.driver.view()
    }

    /// Run as a backup or spare (through failovers and epoch rolls) until
    /// this member becomes the master; `None` when `stop` was set first
    /// (a backup seals its log first) or the master stopped cleanly.
    ///
    /// Whom to follow is the failover engine's choice ([`crate::failover`]:
    /// the master this member promised its epoch to); the data path follows
    /// that master's log of that epoch, and seals it on disk as soon as the
    /// engine moves on (a failover or a roll).
    pub fn run_until_master(&self, stop: &AtomicBool) -> Result<Option<Leader<F>>, String> {
        let me = self.rank();
        // The driver wakes this thread when the view moves (a failover, a
        // roll): the naps below only bound how late a master's clean stop,
        // a failed backup thread or `stop` is seen.
        self.driver.watch_view();
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            let (leading, (epoch, master)) = self.view();
            if let Some(e) = leading {
                return self.lead(e).map(Some);
            }
            if master == me {
                // A candidate (or a master that gave up): wait for the vote.
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            let set = match self.wait_published(master, epoch, stop) {
                Seen::Published(set) => set,
                Seen::Stopped => return Ok(None),
                Seen::Gone => continue,
            };
            if set & (1 << me) == 0 {
                // A spare: wait until the engine moves (a roll may take us).
                let mut nap = FOLLOW_NAP_MIN;
                while self.view() == (None, (epoch, master)) && !stop.load(Ordering::Acquire) {
                    if self.clean_stop_of(master, epoch) {
                        return Ok(None);
                    }
                    self.driver.wait_view(nap);
                    nap = (nap * 2).min(FOLLOW_NAP_MAX);
                }
                continue;
            }
            let mut backup = Backup::follow(
                self.fabric.clone(),
                self.layout.clone(),
                self.config.mode,
                self.disk.clone(),
                master,
                epoch,
                self.config.idle,
            )?;
            self.driver.set_backup_of(Some(epoch));
            let mut nap = FOLLOW_NAP_MIN;
            let ended_cleanly = loop {
                if stop.load(Ordering::Acquire) {
                    self.driver.set_backup_of(None);
                    // A clean stop keeps everything on disk for a restart.
                    backup.seal()?;
                    return Ok(None);
                }
                if self.load(master, self.layout.stopped.offset()) == epoch + 1 {
                    break true;
                }
                if self.view() != (None, (epoch, master)) {
                    break false;
                }
                if backup.failed() {
                    return backup.stop().and(Err("a backup thread stopped".into()));
                }
                self.driver.wait_view(nap);
                nap = (nap * 2).min(FOLLOW_NAP_MAX);
            };
            self.driver.set_backup_of(None);
            backup.seal()?;
            if ended_cleanly && self.load(master, self.layout.role.offset()) == ROLE_STOPPED {
                return Ok(None);
            }
        }
    }

    /// `master` stopped the service cleanly at the end of `epoch`.
    fn clean_stop_of(&self, master: usize, epoch: u64) -> bool {
        self.load(master, self.layout.stopped.offset()) == epoch + 1
            && self.load(master, self.layout.role.offset()) == ROLE_STOPPED
    }

    /// Wait until `master`'s data path leads `epoch` (its backup set), for
    /// as long as the engine follows it there.
    fn wait_published(&self, master: usize, epoch: u64, stop: &AtomicBool) -> Seen {
        loop {
            // Partner: the Release store of `epoch` in Master::begin_epoch.
            let e = self.load(master, self.layout.epoch.offset());
            let role = self.load(master, self.layout.role.offset());
            if e == epoch && role == ROLE_MASTER {
                return Seen::Published(self.load(master, self.layout.backup_set.offset()));
            }
            if e >= epoch && role == ROLE_STOPPED {
                return Seen::Stopped;
            }
            if stop.load(Ordering::Acquire) || self.view() != (None, (epoch, master)) {
                return Seen::Gone;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Become master of `epoch`: recover, take R live others as backups,
    /// re-replicate the objects, mark the snapshot done.
    fn lead(&self, epoch: u64) -> Result<Leader<F>, String> {
        let started = Instant::now();
        let (objects, mut recovery) = if epoch == 0 {
            (ObjectMap::new(self.config.memory_bytes_max), None)
        } else {
            let (o, r) = recover(&self.disk, &self.config.geometry, self.config.memory_bytes_max)?;
            (o, Some(r))
        };
        let me = self.rank();
        // Those who elected us first (they answer), then other live ones.
        let voters = self.driver.engine().followers();
        let mut backups: Vec<usize> = Vec::new();
        for r in voters.into_iter().chain(0..self.config.members) {
            if backups.len() < self.config.backups
                && r != me
                && !backups.contains(&r)
                && self.alive(r)
                && self.driver.responsive(r)
            {
                backups.push(r);
            }
        }
        backups.sort_unstable();
        let master = Master::start(
            self.fabric.clone(),
            self.layout.clone(),
            self.config.mode,
            epoch,
            backups,
            self.config.value_bytes_max,
            liveness(&self.fabric, &self.driver),
        )?;
        let mut leader = Leader {
            master,
            objects,
            recovery: None,
            fabric: self.fabric.clone(),
            driver: self.driver.clone(),
            backups_wanted: self.config.backups,
            geometry: self.config.geometry,
            clean_slack_segments: self.config.clean_slack_segments,
            last_check_ns: monotonic_coarse_ns(),
            cleanings: 0,
            replacements: 0,
            roll_pause_ns_last: 0,
            roll_pause_ns_max: 0,
        };
        if leader.master.backups().is_empty() {
            // Nothing to replicate to: serve reads; writes are refused
            // (`-ERR replication failed: no live backup left`).
            eprintln!("spindle replica: member {me} leads epoch {epoch} with no live backup: read-only");
        } else {
            leader.write_snapshot()?;
        }
        leader.establish();
        if let Some(r) = recovery.as_mut() {
            r.replay_ns = started.elapsed().as_nanos() as u64;
        }
        leader.recovery = recovery;
        Ok(leader)
    }
}

impl<F: Membership> Leader<F> {
    /// Re-append every live object and the `SnapshotDone` marker: the
    /// start of every epoch's log.
    fn write_snapshot(&mut self) -> Result<(), String> {
        // Disk durability: group commit for the whole snapshot (one sync
        // round per flow-control wait, not one per object); the marker's
        // append waits for all of it.
        let deferred = self.master.durability() == Durability::Disk;
        self.master.set_deferred(deferred);
        let appended = self.objects.iter().try_for_each(|(key, object)| {
            self.master
                .append_record(RecordKind::Put, key, &object.value, object.version)?;
            if object.expires_at_ms != 0 {
                let at = crate::record::expire_value(object.expires_at_ms);
                self.master
                    .append_record(RecordKind::Expire, key, &at, object.version)?;
            }
            Ok::<(), String>(())
        });
        self.master.set_deferred(false);
        appended?;
        self.master.append_snapshot_done(self.objects.version_max())
    }

    /// Housekeeping between requests (cheap unless there is work): drop
    /// dead backups and replace them with live spares (R copies again), and
    /// roll to a new epoch when the log is longer than
    /// [`log_bytes_max`] (cleaning). A backup dropped during the epoch
    /// (dead, or not answering the failover's heartbeats) always rolls: an
    /// epoch's every backup must hold every write acknowledged in it, the
    /// rule that lets any of them take over ([`crate::failover`]). A roll
    /// re-appends every live object, so it pauses writes for the time it
    /// takes to copy them. An error leaves the master unable to answer.
    pub fn maintain(&mut self) -> Result<(), String> {
        let now = monotonic_coarse_ns();
        let too_long = self.master.head() > log_bytes_max(&self.objects, &self.geometry, self.clean_slack_segments);
        if !too_long && !self.master.dropped() && now.saturating_sub(self.last_check_ns) < CHECK_INTERVAL_NS {
            return Ok(());
        }
        self.last_check_ns = now;
        // No allocation unless a roll is due (rare): the check runs
        // between requests at most every CHECK_INTERVAL_NS.
        let left = self.master.check_backups();
        let dropped = self.master.dropped();
        let me = self.fabric.member_rank();
        let is_spare = |r: usize| {
            r != me && !self.master.backups().contains(&r) && self.fabric.member_alive(r) && self.driver.responsive(r)
        };
        let missing = self.backups_wanted.saturating_sub(left);
        let replace = missing > 0 && (0..self.fabric.member_count()).any(is_spare);
        if !replace && !dropped && (!too_long || left == 0) {
            return Ok(());
        }
        let spares: Vec<usize> = (0..self.fabric.member_count())
            .filter(|r| is_spare(*r))
            .take(missing)
            .collect();
        let mut backups = self.master.backups().to_vec();
        self.replacements += spares.len() as u64;
        backups.extend(spares);
        backups.sort_unstable();
        if too_long {
            self.cleanings += 1;
        }
        self.roll(backups)
    }

    /// Move to a new epoch with `backups`: the failover engine asks a
    /// majority for it first (bounded: twice the election timeout), then
    /// the log moves and starts with a snapshot; the epoch is established
    /// once every backup holds it.
    fn roll(&mut self, backups: Vec<usize>) -> Result<(), String> {
        let started_ns = spindle_runtime::monotonic_ns();
        let old = self.master.epoch();
        {
            let mut engine = self.driver.engine();
            if let Some(why) = engine.stepped_down() {
                return Err(format!("rolling from epoch {old}: the master stepped down: {why}"));
            }
            engine
                .roll(spindle_runtime::monotonic_ns())
                .map_err(|e| e.to_string())?;
        }
        self.driver.publish_now();
        let waited = Instant::now();
        let bound = Duration::from_nanos(2 * self.driver.timing().election_ns);
        let next = loop {
            {
                let engine = self.driver.engine();
                match (engine.leading(), engine.rolling_to()) {
                    (Some(e), None) if e > old => break e,
                    (None, _) => {
                        return Err(format!(
                            "rolling from epoch {old}: {}",
                            engine
                                .stepped_down()
                                .map_or("no longer the master".into(), |s| s.to_string())
                        ))
                    }
                    _ => {}
                }
            }
            if waited.elapsed() > bound {
                return Err(format!(
                    "rolling from epoch {old}: no majority promised a new epoch within {bound:?}"
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        self.master.roll(next, backups)?;
        if !self.master.backups().is_empty() {
            self.write_snapshot()?;
        }
        self.establish();
        self.roll_pause_ns_last = spindle_runtime::monotonic_ns().saturating_sub(started_ns);
        self.roll_pause_ns_max = self.roll_pause_ns_max.max(self.roll_pause_ns_last);
        Ok(())
    }

    /// Every backup of the epoch holds its first snapshot: tell the
    /// failover engine (the epoch answers once a majority knows).
    fn establish(&mut self) {
        self.driver.engine().establish(self.master.epoch());
        self.driver.publish_now();
    }

    /// This master's rank.
    pub fn master_rank(&self) -> usize {
        self.fabric.member_rank()
    }

    /// Whether this master may answer a client now (lease and epoch).
    pub fn may_answer(&self) -> bool {
        self.driver.may_answer()
    }

    /// Wait until this master may answer (after a roll, or while a
    /// heartbeat is late), at most the election timeout; an error once it
    /// cannot: it stepped down, or the wait ran out (others may elect).
    pub fn wait_answerable(&self) -> Result<(), String> {
        if self.driver.may_answer() {
            return Ok(());
        }
        let waited = Instant::now();
        let bound = Duration::from_nanos(self.driver.timing().election_ns);
        loop {
            if self.driver.may_answer() {
                return Ok(());
            }
            if let Some(why) = self.driver.stepped_down() {
                return Err(format!("the master stepped down: {why}"));
            }
            if waited.elapsed() > bound {
                return Err(format!(
                    "the master lost its lease: no majority renewed it within {bound:?}"
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// The failover driver of this member.
    pub fn driver(&self) -> &Arc<Driver<F>> {
        &self.driver
    }

    /// Stop serving cleanly: end the epoch with every backup's log sealed
    /// on disk (a later start with the same data directory recovers it).
    pub fn stop(&mut self) -> Result<(), String> {
        self.master.end_epoch(true)
    }
}

/// The master's view of a backup: alive (the fabric) and answering the
/// failover's heartbeats.
fn liveness<F: Membership>(fabric: &Arc<F>, driver: &Arc<Driver<F>>) -> crate::master::Liveness {
    let (fabric, driver) = (fabric.clone(), driver.clone());
    Box::new(move |r| fabric.member_alive(r) && driver.responsive(r))
}

/// Replay the newest epoch on disk whose snapshot is complete: a sealed
/// epoch up to its guard, an unsealed one (every member stopped without
/// sealing) up to its first invalid record.
pub fn recover(
    disk: &SegmentDisk,
    geometry: &LogGeometry,
    memory_bytes_max: usize,
) -> Result<(ObjectMap, RecoveryReport), String> {
    for epoch in disk.epochs() {
        let sealed = disk.sealed_guard(epoch);
        let guard = sealed.unwrap_or(0);
        let segments = disk.read_segments(epoch)?;
        let mut objects = ObjectMap::new(memory_bytes_max);
        let outcome = replay_into(
            geometry,
            epoch,
            guard,
            |k| segments.get(k as usize).map(|s| &s[..]),
            &mut objects,
        )
        .map_err(|e| format!("replaying epoch {epoch} from {}: {e}", disk.dir().display()))?;
        if outcome.snapshot_done {
            let report = RecoveryReport {
                from_epoch: epoch,
                guard,
                end: outcome.end,
                records: outcome.records,
                objects: objects.len(),
                torn: outcome.torn,
                replay_ns: 0,
                unsealed: sealed.is_none(),
            };
            return Ok((objects, report));
        }
    }
    Ok((ObjectMap::new(memory_bytes_max), RecoveryReport::default()))
}
