//! One member process of a membership run (`spindle view-member`,
//! hidden): the demo's kill scenario, `bench failover` and the process
//! fault tests. It sends at a steady rate, keeps a replicated digest of
//! everything delivered (a [`StateMachine`] that joiners get as a
//! snapshot), and writes into `--dir`:
//!
//! - `member-<rank>.jsonl`: the delivery log, with one view line per
//!   installed view (`{"member","view","members"}`);
//! - `events-<rank>.jsonl`: `{"t_ns","view","members"}` at each install and
//!   `{"t_ns","delivered"}` every 20 ms (CLOCK_MONOTONIC, comparable
//!   across the processes of one host);
//! - `state-<rank>.json` at a clean end: the final view and digest.
//!
//! It stops sending when `<dir>/stop` appears, sends a last `done`
//! message, waits until every member of its view has delivered... its own
//! `done` (so all survivors applied the same messages), then finishes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use spindle::TcpTransport;
use spindle_fabric::tcp::TcpFabric;
use spindle_fabric::Fabric;
use spindle_group::delivery_log::DeliveryLog;
use spindle_group::layout::SmcLayout;
use spindle_group::{
    Delivery, DeliveryMode, Group, GroupConfig, GroupError, Replicated, SenderSet, StateMachine, Upcalls, View,
};
use spindle_runtime::monotonic_ns;

#[derive(Args, Clone, Debug)]
pub struct ViewMemberArgs {
    #[arg(long)]
    pub group: String,
    #[arg(long)]
    pub rank: usize,
    /// Ranks of the group (the most members a view can have).
    #[arg(long)]
    pub ranks: usize,
    /// The first view's ranks, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub initial: Vec<usize>,
    /// Join the running group instead of starting in the first view.
    #[arg(long)]
    pub join: bool,
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Messages per second this member sends (0: none).
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    #[arg(long, default_value_t = 300)]
    pub suspect_timeout_ms: u64,
    #[arg(long, default_value_t = 10)]
    pub peer_check_ms: u64,
    /// shm, tcp, ofi or ofi:PROVIDER (tcp, and ofi's control plane:
    /// member r listens on 127.0.0.1:<base-port + r>).
    #[arg(long, default_value = "shm")]
    pub transport: String,
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// tcp: the addresses of every rank, comma-separated (overrides
    /// --base-port; network namespaces).
    #[arg(long, value_delimiter = ',')]
    pub addresses: Vec<String>,
    #[arg(long, default_value_t = 15_000)]
    pub join_timeout_ms: u64,
}

/// The replicated state: how many messages were applied, and a digest of
/// their bytes in order.
#[derive(Default)]
struct Digest {
    applied: u64,
    hash: u64,
    /// Senders whose `done` was applied in the current view.
    done: Vec<usize>,
}

impl StateMachine for Digest {
    fn apply(&mut self, d: &Delivery<'_>) {
        if d.payload == b"done" {
            self.done.push(d.sender_rank);
            return;
        }
        self.applied += 1;
        self.hash = xxhash_rust::xxh3::xxh3_64_with_seed(d.payload, self.hash);
    }
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.applied.to_le_bytes());
        out.extend_from_slice(&self.hash.to_le_bytes());
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.len() != 16 {
            return Err(format!("a digest snapshot is 16 bytes, got {}", snapshot.len()));
        }
        self.applied = u64::from_le_bytes(snapshot[..8].try_into().expect("8 bytes"));
        self.hash = u64::from_le_bytes(snapshot[8..].try_into().expect("8 bytes"));
        Ok(())
    }
    fn view_installed(&mut self, _view: &View) {
        self.done.clear();
    }
}

/// What the member hands the group: the state machine, plus the logs.
struct App {
    rank: usize,
    state: Replicated<Digest>,
    log: DeliveryLog,
    events: BufWriter<File>,
    delivered: u64,
}

impl Upcalls for App {
    fn deliver(&mut self, d: &Delivery<'_>) {
        self.state.deliver(d);
        self.delivered += 1;
        self.log.record(d).expect("write the delivery log");
    }
    fn view_installed(&mut self, view: &View) {
        self.state.view_installed(view);
        self.log
            .record_view(view.id, &view.members)
            .expect("write the delivery log");
        let _ = writeln!(
            self.events,
            "{{\"t_ns\":{},\"member\":{},\"view\":{},\"members\":{:?}}}",
            monotonic_ns(),
            self.rank,
            view.id,
            view.members
        );
        let _ = self.events.flush();
        let _ = self.log.flush();
    }
    fn snapshot(&mut self, out: &mut Vec<u8>) {
        self.state.snapshot(out);
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.state.restore(snapshot)
    }
}

/// The end state a member writes after a clean finish.
#[derive(Debug, Serialize, Deserialize)]
pub struct EndState {
    pub member: usize,
    pub view: u64,
    pub members: Vec<usize>,
    pub applied: u64,
    pub digest: String,
}

pub fn state_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("state-{rank}.json"))
}

pub fn events_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("events-{rank}.jsonl"))
}

pub fn config(args: &ViewMemberArgs) -> Result<GroupConfig, String> {
    let mut config = GroupConfig::new(&args.group, args.ranks);
    config.senders = SenderSet::All;
    config.mode = DeliveryMode::Ordered;
    config.slot_payload_max = args.size.max(64);
    config.window_slots = 256;
    config.suspect_timeout = Duration::from_millis(args.suspect_timeout_ms);
    config.peer_check_interval = Duration::from_millis(args.peer_check_ms);
    config.join_timeout = Duration::from_millis(args.join_timeout_ms);
    if !args.initial.is_empty() {
        config.initial_members = Some(args.initial.clone());
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

pub fn run(args: ViewMemberArgs) -> Result<(), String> {
    let config = config(&args)?;
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("create {}: {e}", args.dir.display()))?;
    let events = File::create(events_path(&args.dir, args.rank)).map_err(|e| format!("create events file: {e}"))?;
    let mut app = App {
        rank: args.rank,
        state: Replicated::new(Digest::default()),
        log: DeliveryLog::create(&args.dir, args.rank).map_err(|e| format!("create delivery log: {e}"))?,
        events: BufWriter::new(events),
        delivered: 0,
    };
    match args.transport.as_str() {
        "shm" => {
            let group = if args.join {
                Group::join_running_shm(config, args.rank, &mut app)
            } else {
                Group::join_shm(config, args.rank)
            }
            .map_err(|e| e.to_string())?;
            drive(group, &args, &mut app)
        }
        "tcp" => {
            let fabric = Arc::new(open_tcp(&args, &config)?);
            let group = if args.join {
                Group::join_running(fabric, config, &mut app)
            } else {
                Group::join(fabric, config)
            }
            .map_err(|e| e.to_string())?;
            drive(group, &args, &mut app)
        }
        t if crate::member::is_ofi(t) => view_member_ofi(&args, config, &mut app),
        other => Err(format!(
            "unknown transport '{other}': expected shm, tcp, ofi or ofi:<provider>"
        )),
    }
}

/// Over libfabric: the tcp recipe's options become the control plane's.
#[cfg(feature = "ofi")]
fn view_member_ofi(args: &ViewMemberArgs, config: GroupConfig, app: &mut App) -> Result<(), String> {
    let tcp = tcp_options(args, &config)?;
    let options = spindle::transport::ofi_options(tcp, crate::member::ofi_provider(&args.transport));
    let fabric = Arc::new(spindle_fabric::ofi::OfiFabric::open(&options, args.rank).map_err(|e| e.to_string())?);
    let group = if args.join {
        Group::join_running(fabric, config, app)
    } else {
        Group::join(fabric, config)
    }
    .map_err(|e| e.to_string())?;
    drive(group, args, app)
}

#[cfg(not(feature = "ofi"))]
fn view_member_ofi(args: &ViewMemberArgs, _config: GroupConfig, _app: &mut App) -> Result<(), String> {
    Err(format!(
        "--transport {}: this spindle was built without libfabric support; rebuild with \
         `cargo build --release -p spindle-cli --features ofi` (needs libfabric-dev)",
        args.transport
    ))
}

fn open_tcp(args: &ViewMemberArgs, config: &GroupConfig) -> Result<TcpFabric, String> {
    TcpFabric::open(&tcp_options(args, config)?, args.rank).map_err(|e| e.to_string())
}

/// The tcp options of this member (for tcp, and ofi's control plane).
fn tcp_options(args: &ViewMemberArgs, config: &GroupConfig) -> Result<spindle_fabric::tcp::TcpOptions, String> {
    let addresses = if args.addresses.is_empty() {
        (0..args.ranks)
            .map(|r| format!("127.0.0.1:{}", args.base_port as usize + r))
            .collect()
    } else {
        args.addresses.clone()
    };
    let addresses = addresses
        .iter()
        .map(|a| spindle::config::resolve(a).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let tcp = TcpTransport::new(addresses, group_key(&args.group));
    // The one recipe for a tcp group's options: one stuck peer cannot
    // stall the heartbeats to the others (the send stall is below the
    // suspicion timeout); at open a member waits only for the first view's
    // other members, a joiner for nobody (it is admitted once the group
    // hears it: late joins are accepted by the fabric's link thread).
    spindle::transport::tcp_options(&tcp, config, &SmcLayout::new(config), args.rank, args.join)
        .map_err(|e| e.to_string())
}

/// The group key of a test or bench group: derived from its name (these
/// groups run on loopback or in test namespaces; every member knows the
/// name, and the key only has to be long enough).
fn group_key(group: &str) -> Vec<u8> {
    format!("spindle-view-member:{group}").into_bytes()
}

fn drive<F: Fabric>(mut group: Group<F>, args: &ViewMemberArgs, app: &mut App) -> Result<(), String> {
    // A persistent member that a restart left out comes back joining.
    group.wait_admitted(app).map_err(|e| e.to_string())?;
    let stop = args.dir.join("stop");
    let interval_ns = 1_000_000_000u64.checked_div(args.rate).unwrap_or(u64::MAX);
    let sender = group.sender();
    let mut payload = vec![0u8; args.size];
    let mut next_send_ns = monotonic_ns();
    let mut next_event_ns = monotonic_ns();
    let mut counter = 0u64;
    let fail = |e: GroupError| format!("member {}: {e}", args.rank);
    loop {
        let now = monotonic_ns();
        if now >= next_event_ns {
            next_event_ns = now + 20_000_000;
            let _ = writeln!(
                app.events,
                "{{\"t_ns\":{now},\"member\":{},\"delivered\":{}}}",
                args.rank, app.delivered
            );
            let _ = app.events.flush();
            if stop.exists() {
                break;
            }
        }
        if let Some(sender) = &sender {
            if now >= next_send_ns && group.core().members().contains(&args.rank) {
                payload[..8.min(args.size)].copy_from_slice(&counter.to_le_bytes()[..8.min(args.size)]);
                if sender.send(&payload).is_ok() {
                    counter += 1;
                    next_send_ns = next_send_ns
                        .saturating_add(interval_ns)
                        .max(now.saturating_sub(interval_ns * 4));
                }
            }
        }
        group.poll_or_idle(app).map_err(fail)?;
    }
    // A last `done`, then wait until every member's `done` is applied: all
    // survivors applied the same messages.
    if let Some(sender) = &sender {
        while sender.send(b"done").is_err() {
            group.poll_or_idle(app).map_err(fail)?;
        }
    }
    let deadline = monotonic_ns() + args.join_timeout_ms * 1_000_000;
    loop {
        let senders = group.core().sender_ranks();
        if senders.iter().all(|s| app.state.state.done.contains(s)) {
            break;
        }
        if monotonic_ns() > deadline {
            return Err(format!(
                "member {}: the other members' last messages did not arrive within {} ms",
                args.rank, args.join_timeout_ms
            ));
        }
        group.poll_or_idle(app).map_err(fail)?;
    }
    let mut deliver = |d: &Delivery<'_>| app.deliver(d);
    group
        .finish_together(&mut deliver, Duration::from_millis(args.join_timeout_ms))
        .map_err(fail)?;
    app.log.flush().map_err(|e| format!("flush the delivery log: {e}"))?;
    let _ = app.events.flush();
    let view = group.view();
    let end = EndState {
        member: args.rank,
        view: view.id,
        members: view.members.clone(),
        applied: app.state.state.applied,
        digest: format!("{:016x}", app.state.state.hash),
    };
    let text = serde_json::to_string(&end).map_err(|e| e.to_string())?;
    std::fs::write(state_path(&args.dir, args.rank), text).map_err(|e| format!("write state: {e}"))
}
