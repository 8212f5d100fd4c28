//! The simulator (TigerBeetle's VOPR for Spindle): every member's real
//! [`GroupCore`](crate::GroupCore) in one process, one thread, over the
//! deterministic [`spindle_fabric::sim`] fabric, driven step by step with
//! simulated time, a random workload and random faults, all drawn from one
//! seed; the invariants are checked after every step of every member.
//!
//! ```text
//!  seed ─► SimPlan (group shape, workload, network, faults)
//!  for step in 0..steps + drain:            drain: no new sends, bounded
//!      advance time; inject the faults due now; deliver the chunks due
//!      for each member (random order, slow ones skip turns):
//!          application sends a burst → GroupCore::step(its clock) → deliveries
//!          → OnlineChecker (every property, after every step)
//!  end: fault-free → every member delivered everything (log checkers too);
//!       a member lost → every other member stopped with MemberGone
//! ```
//!
//! The membership is static, so a crash or a partition that outlasts the
//! detection timeout stops the survivors with `GroupError::MemberGone`:
//! that is the correct outcome today; the checks are safety (what was
//! delivered agrees) and detection (everyone stops). A membership protocol
//! will change the expected outcome here (survivors install a new view).
//!
//! It lives under `invariants` because the group crate's `lib.rs` belongs
//! to another change; it belongs in `crate::sim` (see the report of the
//! change that added it).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_fabric::sim::{Sabotage, SimEvent, SimFabric, SimOptions, SimRng, SimWorld};
use spindle_fabric::PeerSet;
use spindle_sst::Agent;

use super::online::{Delivered, OnlineChecker};
use super::{Logs, Violation};
use crate::layout::SmcLayout;
use crate::sender::Sender;
use crate::{DeliveryMode, Group, GroupAgent, GroupConfig, GroupError, SenderSet};

/// Which faults a run may draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultClass {
    /// Random scheduling only: no delays, splits, slow members or offsets.
    None,
    /// Delays, split pushes, slow links, slow members, clock offsets.
    Delays,
    /// Delays and one crash (often inside a push).
    Crash,
    /// Delays and one partition (held or dropped, healed or not).
    Partition,
    /// Per seed, one of the above (or a crash and a partition).
    All,
}

impl FaultClass {
    pub fn parse(s: &str) -> Result<FaultClass, String> {
        match s {
            "none" => Ok(FaultClass::None),
            "delays" => Ok(FaultClass::Delays),
            "crash" => Ok(FaultClass::Crash),
            "partition" => Ok(FaultClass::Partition),
            "all" => Ok(FaultClass::All),
            other => Err(format!(
                "unknown fault class '{other}': expected none, delays, crash, partition or all"
            )),
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            FaultClass::None => "none",
            FaultClass::Delays => "delays",
            FaultClass::Crash => "crash",
            FaultClass::Partition => "partition",
            FaultClass::All => "all",
        }
    }
}

/// What to simulate: everything else is drawn from the seed.
#[derive(Clone, Debug)]
pub struct SimSpec {
    pub seed: u64,
    pub members: usize,
    /// Steps with the workload running; a bounded drain follows.
    pub steps: u64,
    pub faults: FaultClass,
    /// Break the fabric on purpose (to show the checkers catch it).
    pub sabotage: Option<Sabotage>,
    /// Scheduler events kept for the failure trace.
    pub trace_events_max: usize,
    /// Per reservation, the chance (‰) that the application abandons it
    /// (see [`SimPlan::abandon_per_mille`]; 0 unless asked for).
    pub abandon_per_mille: u64,
}

impl SimSpec {
    pub fn new(seed: u64, members: usize, steps: u64, faults: FaultClass) -> SimSpec {
        SimSpec {
            seed,
            members,
            steps,
            faults,
            sabotage: None,
            trace_events_max: 64,
            abandon_per_mille: 0,
        }
    }

    /// The command line that replays this run.
    pub fn command_line(&self) -> String {
        let sabotage = match self.sabotage {
            None => "",
            Some(Sabotage::ReorderPushes) => " --sabotage reorder",
            Some(Sabotage::CorruptBytes) => " --sabotage corrupt",
        };
        let abandon = match self.abandon_per_mille {
            0 => String::new(),
            n => format!(" --abandon {n}"),
        };
        format!(
            "spindle sim --seed {} --members {} --steps {} --faults {}{sabotage}{abandon}",
            self.seed,
            self.members,
            self.steps,
            self.faults.as_str()
        )
    }
}

/// When a planned crash happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashTrigger {
    /// At the start of this step.
    AtStep(u64),
    /// Inside the victim's n-th push (from 1): some peers get it, some do
    /// not. A victim that has not pushed that often by the end of the
    /// workload crashes then.
    AtPush(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    pub rank: usize,
    pub trigger: CrashTrigger,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionPlan {
    /// One side of the cut (the rest is the other).
    pub side: PeerSet,
    /// Held traffic flows after the heal; dropped traffic breaks the links.
    pub hold: bool,
    pub start_step: u64,
    pub heal_step: Option<u64>,
}

/// Everything a seed decides. Fields are public so that scenario tests can
/// draw a plan and then pin the part they are about.
#[derive(Clone, Debug)]
pub struct SimPlan {
    pub senders: SenderSet,
    pub mode: DeliveryMode,
    pub window_slots: usize,
    pub slot_payload_max: usize,
    pub batching: bool,
    /// Per step, the chance that a sender's application sends a burst.
    pub send_per_mille: u64,
    pub burst_max: u64,
    /// Per reservation, the chance that the application drops it without
    /// a commit (a skip slot). 0 unless the spec asks: in ordered mode a skip
    /// slot at the tail of a sender's published slots is released only
    /// when a later message is delivered, so a window full of them stalls
    /// that sender for good (found by this simulator; the fix belongs in
    /// `GroupCore::deliver_stable`, see `sim_scenarios.rs`).
    pub abandon_per_mille: u64,
    /// Simulated time per step: `0..=tick_ns_max`.
    pub tick_ns_max: u64,
    pub delay_ns_max: u64,
    pub split_chunks_max: usize,
    /// (src, dst, delay_ns_max) of links slower than the rest.
    pub slow_links: Vec<(usize, usize, u64)>,
    /// Per member, the chance of taking its turn in a step.
    pub speed_per_mille: Vec<u64>,
    pub clock_offset_ns: Vec<u64>,
    pub detect_timeout_ns: u64,
    pub peer_check_interval_ns: u64,
    pub crash: Option<CrashPlan>,
    pub partition: Option<PartitionPlan>,
    /// Steps after the workload for everything to settle.
    pub drain_steps_max: u64,
}

const PLAN_STREAM: u64 = 0x504C_414E;
const WORLD_STREAM: u64 = 0x574F_524C;
const WORKLOAD_STREAM: u64 = 0x574B_4C44;

impl SimPlan {
    /// Draw a plan from the seed (independent of everything but the spec).
    pub fn draw(spec: &SimSpec) -> SimPlan {
        let n = spec.members;
        let mut rng = SimRng::new(spec.seed).fork(PLAN_STREAM);
        let class = match spec.faults {
            FaultClass::All => [
                FaultClass::None,
                FaultClass::Delays,
                FaultClass::Crash,
                FaultClass::Partition,
                FaultClass::All,
            ][rng.below(5) as usize],
            c => c,
        };
        let senders = match rng.below(4) {
            0 => SenderSet::All,
            1 => SenderSet::Half,
            2 => SenderSet::One,
            _ => {
                let mask = rng.next_u64() & PeerSet::all(n).0;
                let ranks: Vec<usize> = PeerSet(mask).iter().collect();
                if ranks.is_empty() {
                    SenderSet::All
                } else {
                    SenderSet::Ranks(ranks)
                }
            }
        };
        let mut plan = SimPlan {
            senders,
            mode: if rng.chance(800) {
                DeliveryMode::Ordered
            } else {
                DeliveryMode::Unordered
            },
            window_slots: 1 << rng.range(1, 5),
            slot_payload_max: [1, 8, 16, 64, 100, 256, 1000][rng.below(7) as usize],
            batching: rng.chance(850),
            send_per_mille: rng.range(20, 900),
            burst_max: rng.range(1, 8),
            abandon_per_mille: spec.abandon_per_mille,
            tick_ns_max: rng.range(1_000, 40_000),
            delay_ns_max: 0,
            split_chunks_max: 1,
            slow_links: Vec::new(),
            speed_per_mille: vec![1000; n],
            clock_offset_ns: vec![0; n],
            detect_timeout_ns: rng.range(500_000, 3_000_000),
            peer_check_interval_ns: rng.range(50_000, 500_000),
            crash: None,
            partition: None,
            drain_steps_max: 4_000,
        };
        if class != FaultClass::None {
            plan.draw_delays(&mut rng, n);
        }
        let fault_steps = (spec.steps * 3 / 4).max(1);
        if matches!(class, FaultClass::Crash | FaultClass::All) {
            let rank = rng.below(n as u64) as usize;
            let trigger = if rng.chance(600) {
                CrashTrigger::AtPush(rng.range(1, 60))
            } else {
                CrashTrigger::AtStep(rng.below(fault_steps))
            };
            plan.crash = Some(CrashPlan { rank, trigger });
        }
        if matches!(class, FaultClass::Partition | FaultClass::All) && n >= 2 {
            let mut side = rng.next_u64() & PeerSet::all(n).0;
            if side == 0 || side == PeerSet::all(n).0 {
                side = 1 << rng.below(n as u64);
            }
            let start_step = rng.below(fault_steps);
            let heal_step = rng
                .chance(600)
                .then(|| start_step + rng.range(1, spec.steps.max(2) / 2));
            plan.partition = Some(PartitionPlan {
                side: PeerSet(side),
                hold: rng.chance(700),
                start_step,
                heal_step,
            });
        }
        plan
    }

    fn draw_delays(&mut self, rng: &mut SimRng, n: usize) {
        self.delay_ns_max = [1_000, 20_000, 200_000, 2_000_000][rng.below(4) as usize];
        self.split_chunks_max = rng.range(1, 4) as usize;
        // Steps long enough that a run sees many round trips.
        self.tick_ns_max = self.tick_ns_max.max(self.delay_ns_max / rng.range(4, 40));
        for _ in 0..rng.below(3) {
            let (src, dst) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            self.slow_links.push((src, dst, self.delay_ns_max * rng.range(2, 10)));
        }
        for m in 0..n {
            if rng.chance(300) {
                self.speed_per_mille[m] = rng.range(50, 600);
            }
            self.clock_offset_ns[m] = rng.below(1_000_000_000);
        }
    }

    /// One line for the failure report.
    pub fn summary(&self) -> String {
        format!(
            "senders={} mode={} window_slots={} slot_payload_max={} batching={} send={}‰ burst≤{} abandon={}‰ tick≤{}ns \
             delay≤{}ns split≤{} slow_links={:?} speed‰={:?} detect_timeout={}ns crash={:?} partition={:?}",
            self.senders.as_str(),
            self.mode.as_str(),
            self.window_slots,
            self.slot_payload_max,
            self.batching,
            self.send_per_mille,
            self.burst_max,
            self.abandon_per_mille,
            self.tick_ns_max,
            self.delay_ns_max,
            self.split_chunks_max,
            self.slow_links,
            self.speed_per_mille,
            self.detect_timeout_ns,
            self.crash,
            self.partition
        )
    }
}

/// How a member's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEnd {
    Running,
    Crashed,
    /// It stopped on this error (today: `MemberGone` after a fault).
    Stopped(String),
}

/// A broken invariant, where it broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimFailure {
    pub step: u64,
    pub property: String,
    pub detail: String,
}

/// What one seed did.
#[derive(Clone, Debug)]
pub struct SimReport {
    pub spec: SimSpec,
    pub plan: SimPlan,
    pub steps_run: u64,
    pub sent: u64,
    pub delivered: Vec<u64>,
    pub ends: Vec<MemberEnd>,
    pub failure: Option<SimFailure>,
    /// The last scheduler events (up to `spec.trace_events_max`), oldest first.
    pub trace: Vec<String>,
    /// A digest of every event of the run: equal digests, equal runs.
    pub trace_digest: u64,
    pub events: u64,
    /// Every member's deliveries, as delivery-log lines.
    pub logs: Logs,
}

impl SimReport {
    /// Whether some member crashed or stopped.
    pub fn lost_members(&self) -> usize {
        self.ends.iter().filter(|e| **e != MemberEnd::Running).count()
    }
}

/// Run one seed: draw its plan, simulate, check.
pub fn run(spec: &SimSpec) -> SimReport {
    run_plan(spec, SimPlan::draw(spec))
}

/// Run a given plan (scenario tests pin parts of a drawn plan).
pub fn run_plan(spec: &SimSpec, plan: SimPlan) -> SimReport {
    let mut report = SimReport {
        spec: spec.clone(),
        plan: plan.clone(),
        steps_run: 0,
        sent: 0,
        delivered: vec![0; spec.members],
        ends: vec![MemberEnd::Running; spec.members],
        failure: None,
        trace: Vec::new(),
        trace_digest: 0,
        events: 0,
        logs: Logs::new(),
    };
    let mut cluster = match Cluster::new(spec, plan) {
        Ok(c) => c,
        Err(e) => {
            report.failure = Some(SimFailure {
                step: 0,
                property: "setup".into(),
                detail: e,
            });
            return report;
        }
    };
    let result = catch_unwind(AssertUnwindSafe(|| cluster.run()));
    let failure = match result {
        Ok(r) => r.err(),
        Err(panic) => {
            let at_ns = cluster.world.now_ns();
            let who = cluster
                .stepping
                .map_or("the simulator".to_string(), |m| format!("member {m}"));
            let text = format!("{who} panicked");
            cluster.world.record(SimEvent::Note { at_ns, text });
            Some(SimFailure {
                step: cluster.step,
                property: "protocol assertion".into(),
                detail: format!("{who}: {}", panic_message(&panic)),
            })
        }
    };
    report.steps_run = cluster.step;
    report.sent = cluster.sent.iter().sum();
    report.delivered = (0..spec.members).map(|m| cluster.checker.delivered_by(m)).collect();
    report.ends = cluster.ends.clone();
    report.failure = failure;
    report.trace = cluster.world.trace().iter().map(|e| e.to_string()).collect();
    report.trace_digest = cluster.world.trace_digest();
    report.events = cluster.world.events();
    report.logs = std::mem::take(&mut cluster.logs);
    report
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

type Inbox = Arc<Mutex<Vec<Delivered>>>;

struct Cluster {
    spec: SimSpec,
    plan: SimPlan,
    world: SimWorld,
    agents: Vec<GroupAgent<SimFabric>>,
    senders: Vec<Option<Sender<SimFabric>>>,
    inboxes: Vec<Inbox>,
    ends: Vec<MemberEnd>,
    checker: OnlineChecker,
    logs: Logs,
    /// Messages sent per member rank.
    sent: Vec<u64>,
    rng: SimRng,
    step: u64,
    /// The member whose step is running (for a panic report).
    stepping: Option<usize>,
    faults_injected: bool,
}

impl Cluster {
    /// The group every member joins: what the plan drew.
    fn config(spec: &SimSpec, plan: &SimPlan) -> Result<GroupConfig, String> {
        let mut config = GroupConfig::new("sim", spec.members);
        config.senders = plan.senders.clone();
        config.mode = plan.mode;
        config.window_slots = plan.window_slots;
        config.slot_payload_max = plan.slot_payload_max;
        config.batching = plan.batching;
        config.peer_check_interval = Duration::from_nanos(plan.peer_check_interval_ns);
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    fn new(spec: &SimSpec, plan: SimPlan) -> Result<Cluster, String> {
        let n = spec.members;
        let config = Self::config(spec, &plan)?;
        let layout = SmcLayout::new(&config);
        let mut root = SimRng::new(spec.seed);
        let mut options = SimOptions::new(n, layout.row.row_len_bytes(), root.fork(WORLD_STREAM).next_u64());
        options.delay_ns_max = plan.delay_ns_max;
        options.split_chunks_max = plan.split_chunks_max;
        options.detect_timeout_ns = plan.detect_timeout_ns;
        options.trace_events_max = spec.trace_events_max;
        options.sabotage = spec.sabotage;
        let world = SimWorld::new(options).map_err(|e| e.to_string())?;
        for &(src, dst, delay) in &plan.slow_links {
            world.set_link_delay(src, dst, delay);
        }
        let fabrics: Vec<Arc<SimFabric>> = (0..n)
            .map(|r| world.open(r).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let (mut agents, mut senders, mut inboxes) = (Vec::new(), Vec::new(), Vec::new());
        for (rank, fabric) in fabrics.into_iter().enumerate() {
            let group = Group::join(fabric, config.clone()).map_err(|e| e.to_string())?;
            senders.push(group.sender());
            let inbox: Inbox = Arc::default();
            let sink = Arc::clone(&inbox);
            agents.push(GroupAgent::new(group, move |d: &crate::Delivery<'_>| {
                sink.lock().expect("inbox").push(Delivered {
                    member: rank,
                    view: d.view,
                    sender: d.sender_rank,
                    index: d.index,
                    seq: d.seq,
                    len: d.payload.len() as u64,
                    xxh3: xxhash_rust::xxh3::xxh3_64(d.payload),
                });
            }));
            inboxes.push(inbox);
        }
        if let Some(CrashPlan {
            rank,
            trigger: CrashTrigger::AtPush(p),
        }) = plan.crash
        {
            world.crash_at_push(rank, p);
        }
        let sender_ranks = config.senders.ranks(n);
        Ok(Cluster {
            checker: OnlineChecker::new(0, n, &sender_ranks, plan.mode == DeliveryMode::Ordered),
            spec: spec.clone(),
            world,
            agents,
            senders,
            inboxes,
            ends: vec![MemberEnd::Running; n],
            logs: (0..n).map(|m| (m, Vec::new())).collect(),
            sent: vec![0; n],
            rng: root.fork(WORKLOAD_STREAM),
            step: 0,
            stepping: None,
            faults_injected: plan.crash.is_some() || plan.partition.is_some() || spec.sabotage.is_some(),
            plan,
        })
    }

    fn fail(&self, v: Violation) -> SimFailure {
        SimFailure {
            step: self.step,
            property: v.property.to_string(),
            detail: v.detail,
        }
    }

    fn run(&mut self) -> Result<(), SimFailure> {
        let n = self.spec.members;
        let total = self.spec.steps + self.plan.drain_steps_max;
        let mut order: Vec<usize> = (0..n).collect();
        while self.step < total {
            let sending = self.step < self.spec.steps;
            let tick = if sending {
                self.plan.tick_ns_max
            } else {
                self.plan.detect_timeout_ns / 8
            };
            self.world.advance(self.rng.below(tick + 1));
            self.inject_faults();
            self.world.deliver_due();
            self.rng.shuffle(&mut order);
            for &m in &order {
                if self.ends[m] != MemberEnd::Running || !self.rng.chance(self.plan.speed_per_mille[m]) {
                    continue;
                }
                if sending {
                    self.app_send(m);
                }
                self.step_member(m)?;
            }
            if !sending && self.settled() {
                break;
            }
            self.step += 1;
        }
        self.final_checks()
    }

    fn inject_faults(&mut self) {
        if let Some(CrashPlan { rank, trigger }) = self.plan.crash {
            let due = match trigger {
                CrashTrigger::AtStep(s) => s == self.step,
                CrashTrigger::AtPush(_) => self.step == self.spec.steps,
            };
            if due {
                self.world.crash(rank); // no-op if it already crashed
            }
        }
        if let Some(p) = self.plan.partition {
            if p.start_step == self.step {
                self.world.partition(p.side, p.hold);
            }
            if p.heal_step == Some(self.step) {
                self.world.heal();
            }
        }
        for m in 0..self.spec.members {
            if self.ends[m] == MemberEnd::Running && self.world.is_crashed(m) {
                self.ends[m] = MemberEnd::Crashed;
            }
        }
    }

    /// A burst of sends from `m`'s application (sometimes an abandoned
    /// reservation, which publishes a skip slot).
    fn app_send(&mut self, m: usize) {
        let Some(sender) = &self.senders[m] else { return };
        if !self.rng.chance(self.plan.send_per_mille) {
            return;
        }
        let burst = self.rng.range(1, self.plan.burst_max);
        let first = self.sent[m];
        for _ in 0..burst {
            let len = self.rng.below(self.plan.slot_payload_max as u64 + 1) as usize;
            let Ok(mut slot) = sender.reserve(len) else { break };
            if self.rng.chance(self.plan.abandon_per_mille) {
                drop(slot); // abandoned: a skip slot, no message
                continue;
            }
            let k = self.sent[m];
            let mut pattern = SimRng::new(self.spec.seed ^ ((m as u64) << 48) ^ k);
            for chunk in slot.payload_mut().chunks_mut(8) {
                let word = pattern.next_u64().to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
            let hash = xxhash_rust::xxh3::xxh3_64(slot.payload_mut());
            slot.commit();
            self.checker.record_sent(m, len as u64, hash);
            self.sent[m] += 1;
        }
        if self.sent[m] > first {
            let at_ns = self.world.now_ns();
            self.world.record(SimEvent::Send {
                at_ns,
                rank: m,
                first,
                count: self.sent[m] - first,
            });
        }
    }

    fn step_member(&mut self, m: usize) -> Result<(), SimFailure> {
        let at_ns = self.world.now_ns();
        let now_ns = at_ns + self.plan.clock_offset_ns[m];
        self.stepping = Some(m);
        let result = self.agents[m].do_work(now_ns);
        self.stepping = None;
        let work = *result.as_ref().unwrap_or(&0);
        self.world.record(SimEvent::Step {
            at_ns,
            rank: m,
            now_ns,
            work,
        });
        if self.world.is_crashed(m) {
            self.ends[m] = MemberEnd::Crashed;
        }
        self.check_deliveries(m)?;
        match result {
            Ok(_) => Ok(()),
            Err(GroupError::MemberGone { rank })
                if self.faults_injected || self.ends.iter().any(|e| *e != MemberEnd::Running) =>
            {
                let text = format!("member {m} stops: {}", GroupError::MemberGone { rank });
                self.world.record(SimEvent::Note { at_ns, text });
                self.ends[m] = MemberEnd::Stopped(GroupError::MemberGone { rank }.to_string());
                self.world.exit(m);
                Ok(())
            }
            Err(e @ GroupError::MemberGone { .. }) => Err(self.fail(Violation::new(
                "failure detection",
                format!("member {m} stopped with '{e}' although no fault was injected"),
            ))),
            Err(e) => Err(self.fail(Violation::new("no unexpected errors", format!("member {m}: {e}")))),
        }
    }

    fn check_deliveries(&mut self, m: usize) -> Result<(), SimFailure> {
        let batch = std::mem::take(&mut *self.inboxes[m].lock().expect("inbox"));
        for d in batch {
            self.checker.check(&d).map_err(|v| self.fail(v))?;
            self.logs.get_mut(&m).expect("log").push(d.to_log_entry());
        }
        Ok(())
    }

    /// Nothing left to happen: everyone stopped, or (nobody lost) everyone
    /// delivered everything and nothing is in flight.
    fn settled(&self) -> bool {
        let running: Vec<usize> = (0..self.spec.members)
            .filter(|m| self.ends[*m] == MemberEnd::Running)
            .collect();
        if running.len() < self.spec.members {
            return running.is_empty();
        }
        let partition_pending = self.plan.partition.is_some_and(|p| p.start_step >= self.step);
        !partition_pending
            && running.iter().all(|m| self.checker.has_everything(*m))
            && self.world.in_flight_bytes() == 0
    }

    /// Every member's positions, for a liveness failure.
    fn positions(&self) -> String {
        let each: Vec<String> = self
            .agents
            .iter()
            .enumerate()
            .map(|(m, a)| {
                let p = a.group.core().positions();
                let c = &a.group.core().counters().values;
                format!(
                    "member {m}: published {} next index {} received {:?} frontier {} stable {} delivered {} \
                     (sent {} nulls {} in {} runs, backpressure {})",
                    p.published_slots,
                    p.next_msg_index,
                    p.received_num,
                    p.received_frontier,
                    p.stable,
                    p.delivered_num,
                    c[crate::counters::SENT_MSGS],
                    c[crate::counters::NULLS_SENT],
                    c[crate::counters::NULL_RUNS],
                    c[crate::counters::BACKPRESSURE]
                )
            })
            .collect();
        each.join("; ")
    }

    fn final_checks(&self) -> Result<(), SimFailure> {
        let ordered = self.plan.mode == DeliveryMode::Ordered;
        super::no_duplication::check(&self.logs).map_err(|v| self.fail(v))?;
        super::fifo::check(&self.logs).map_err(|v| self.fail(v))?;
        super::integrity::check(&self.logs).map_err(|v| self.fail(v))?;
        if ordered {
            super::total_order::check(&self.logs).map_err(|v| self.fail(v))?;
        }
        let running: Vec<usize> = (0..self.spec.members)
            .filter(|m| self.ends[*m] == MemberEnd::Running)
            .collect();
        if running.len() == self.spec.members {
            let expected = (0..self.spec.members)
                .filter(|m| self.senders[*m].is_some())
                .map(|m| (m, self.sent[m]))
                .collect();
            return super::no_gaps::check(&self.logs, &expected).map_err(|mut v| {
                v.detail = format!(
                    "{} after {} drain steps; {}",
                    v.detail,
                    self.plan.drain_steps_max,
                    self.positions()
                );
                self.fail(v)
            });
        }
        if let Some(m) = running.first() {
            let lost: Vec<usize> = (0..self.spec.members).filter(|r| !running.contains(r)).collect();
            return Err(self.fail(Violation::new(
                "failure detection",
                format!(
                    "member {m} still runs {} drain steps after members {lost:?} crashed or stopped",
                    self.plan.drain_steps_max
                ),
            )));
        }
        Ok(())
    }
}
