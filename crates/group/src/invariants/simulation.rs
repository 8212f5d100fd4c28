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
//!          → Checker (every property, after every step)
//!  end: fault-free → every member delivered everything (no gaps);
//!       a member lost → every other member stopped with MemberGone
//! ```
//!
//! A persistent plan may draw a total failure (`restart_at`): every
//! member is killed at once and restarted from its log, and the restart
//! is checked (see [`RestartReport`] and `simulation/restart.rs`).
//!
//! Membership is on: a crash, a stalled member or a partition that
//! outlasts the suspicion timeout makes the survivors install a new view
//! (a minority side stops with `MinorityPartition`, a member the others
//! removed stops with `Removed`); the churn class adds a member joining a
//! running group and one leaving. The checks are safety (what was
//! delivered agrees, per view and across views: virtual synchrony, no
//! loss, one membership per view id) and liveness (after the drain, every
//! running member is in the same view and has delivered everything
//! published in it).
//!
//! It lives under `invariants` because the group crate's `lib.rs` belongs
//! to another change; it belongs in `crate::sim` (see the report of the
//! change that added it).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_fabric::sim::{Sabotage, SimEvent, SimFabric, SimOptions, SimRng, SimWorld};
use spindle_fabric::{Fabric, PeerSet};
use spindle_runtime::Agent;

use super::checker::{Checker, Delivered};
use super::{Logs, ViewEntry, ViewLogs, Violation};
use crate::layout::SmcLayout;
use crate::persist::PersistLog;
use crate::sender::{LargeSend, SendSlot, Sender};
use crate::{DeliveryMode, Group, GroupAgent, GroupConfig, GroupError, SendError, SenderSet};

mod restart;
pub use restart::RestartReport;
use restart::Restarted;

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
    /// Delays, a member joining the running group and one leaving.
    Churn,
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
            "churn" => Ok(FaultClass::Churn),
            "all" => Ok(FaultClass::All),
            other => Err(format!(
                "unknown fault class '{other}': expected none, delays, crash, partition, churn or all"
            )),
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            FaultClass::None => "none",
            FaultClass::Delays => "delays",
            FaultClass::Crash => "crash",
            FaultClass::Partition => "partition",
            FaultClass::Churn => "churn",
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
    /// Whether the applications reserve each burst's slots together
    /// (`Sender::reserve_batch`, one atomic per burst, payloads committed
    /// with `commit_len`) rather than one `Sender::reserve` per message.
    pub reserve_batch: bool,
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
    /// A rank outside the first view that joins at a step.
    pub joiner: Option<(usize, u64)>,
    /// A member that asks to leave at a step.
    pub leaver: Option<(usize, u64)>,
    /// A member that takes no turn from the first step to the second (a
    /// process under SIGSTOP, a paused VM), then runs again. Never drawn:
    /// scenario tests pin it.
    pub pause: Option<(usize, u64, u64)>,
    /// A member whose heartbeat stalls this long is suspected.
    pub suspect_timeout_ns: u64,
    /// Steps after the workload for everything to settle.
    pub drain_steps_max: u64,
    /// Persistent mode: per step, the chance that a member's log syncs
    /// (what its sync thread made durable since the last one).
    pub sync_per_mille: u64,
    /// Persistent mode: `GroupConfig::compact_log_bytes` (0: the logs are
    /// never compacted). Drawn for half the persistent plans; every
    /// compaction is checked (see `Cluster::check_compacted`).
    pub compact_log_bytes: u64,
    /// Per burst, the chance that a sender's application starts a large
    /// message (2 to 6 slots long, sent as fragments beside its small
    /// ones; see [`crate::large`]). Drawn for a third of the plans whose
    /// slots can carry fragments.
    pub large_per_mille: u64,
    /// The members (a bit per rank) whose application takes large
    /// messages fragment by fragment, in place (`Upcalls::takes_fragments`);
    /// it puts them together itself and checks that they continue each
    /// other. Drawn, from its own stream, for half the plans with large
    /// messages.
    pub large_in_place_members: u64,
    /// Subgroups the members are laid out into at every view (drawn from
    /// their own stream; see [`check_subgroup_layouts`]).
    pub subgroups: Vec<crate::subgroup::SubgroupSpec>,
    /// Persistent mode: the step at whose start every member is killed
    /// at once (SIGKILL, or a power cut: what a log had not synced is
    /// lost, a torn part of it may be left) and restarted from its log.
    /// Drawn for half the persistent plans, from its own stream.
    pub restart_at: Option<u64>,
    /// Sabotage for the restart's checks: at the total failure every
    /// disk loses the last quarter of what it had synced (a disk that
    /// acknowledged an fdatasync it did not do). Never drawn: tests pin
    /// it to show the checks catch the loss.
    pub restart_disk_lies: bool,
    /// The group follows an outer view (a shard following the top-level
    /// group, `GroupCore::follow_view`): per member, how many steps
    /// after a member crashed, stopped or was cut off in a minority the
    /// outer view it follows leaves that member out. Suspicion is then
    /// the outer view's alone; a member the outer view leaves out stops.
    /// Drawn for a quarter of the plans without a total failure, from
    /// its own stream.
    pub follow_outer_lag_steps: Option<Vec<u64>>,
}

const PLAN_STREAM: u64 = 0x504C_414E;
const WORLD_STREAM: u64 = 0x574F_524C;
const WORKLOAD_STREAM: u64 = 0x574B_4C44;
/// Persistent mode's draws (its own stream: plans and runs of the other
/// modes are what they were before persistent mode existed).
const PERSIST_STREAM: u64 = 0x5045_5253;
/// Log compaction's draws (their own stream, like persistent mode's).
const COMPACT_STREAM: u64 = 0x434D_5054;
/// Large messages' draws (their own stream, like persistent mode's).
const LARGE_STREAM: u64 = 0x4C52_4745;
/// Which members take large messages in place (their own stream).
const IN_PLACE_STREAM: u64 = 0x494E_504C;
/// Subgroup layouts' draws (their own stream, like the above).
const SUBGROUP_STREAM: u64 = 0x5347_5250;
/// A total failure's draws (when; each disk's torn tail; the new world).
const RESTART_STREAM: u64 = 0x5253_5452;
/// Following an outer view's draws (their own stream, like the above).
const FOLLOW_STREAM: u64 = 0x464F_4C57;

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
            FaultClass::Churn if n < 3 => FaultClass::Delays,
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
            reserve_batch: false,
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
            joiner: None,
            leaver: None,
            pause: None,
            suspect_timeout_ns: 0,
            drain_steps_max: 4_000,
            sync_per_mille: 0,
            compact_log_bytes: 0,
            large_per_mille: 0,
            large_in_place_members: 0,
            subgroups: Vec::new(),
            restart_at: None,
            restart_disk_lies: false,
            follow_outer_lag_steps: None,
        };
        // One ordered plan in three is persistent; the draw comes from its
        // own stream, after everything else.
        let mut persist_rng = SimRng::new(spec.seed).fork(PERSIST_STREAM);
        if plan.mode == DeliveryMode::Ordered && persist_rng.chance(333) {
            plan.mode = DeliveryMode::Persistent;
            plan.sync_per_mille = persist_rng.range(50, 1000);
            let mut compact_rng = SimRng::new(spec.seed).fork(COMPACT_STREAM);
            if compact_rng.chance(500) {
                plan.compact_log_bytes = compact_rng.range(
                    crate::config::defaults::COMPACT_LOG_BYTES_MIN,
                    4 * crate::config::defaults::COMPACT_LOG_BYTES_MIN,
                );
            }
            let mut restart_rng = SimRng::new(spec.seed).fork(RESTART_STREAM);
            if restart_rng.chance(500) {
                plan.restart_at = Some(restart_rng.range(1, spec.steps.max(1)));
            }
        }
        let mut large_rng = SimRng::new(spec.seed).fork(LARGE_STREAM);
        if plan.slot_payload_max >= crate::large::FRAGMENT_HEADER_BYTES + 8 && large_rng.chance(333) {
            plan.large_per_mille = large_rng.range(20, 300);
            let mut in_place_rng = SimRng::new(spec.seed).fork(IN_PLACE_STREAM);
            if in_place_rng.chance(500) {
                // Some members or all of them: a view mixes both kinds.
                plan.large_in_place_members = in_place_rng.next_u64() | in_place_rng.range(0, 2).wrapping_neg();
            }
        }
        plan.subgroups = draw_subgroups(&mut SimRng::new(spec.seed).fork(SUBGROUP_STREAM), n);
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
        // Suspicion must outlast what a healthy member can be late by, or
        // every run ends in a storm of false suspicions; sometimes (1 in 8)
        // it does not, on purpose.
        plan.suspect_timeout_ns = if rng.chance(125) {
            plan.detect_timeout_ns.max(2 * plan.peer_check_interval_ns)
        } else {
            plan.healthy_suspect_timeout_ns()
        };
        if matches!(class, FaultClass::Churn | FaultClass::All) && n >= 2 {
            // The joiner is the last rank; some other rank must send.
            if rng.chance(700) && plan.senders.ranks(n).iter().any(|r| *r != n - 1) {
                plan.joiner = Some((n - 1, rng.below(fault_steps)));
            }
            if rng.chance(500) {
                let leaver = rng.below(n as u64 - 1) as usize;
                plan.leaver = Some((leaver, rng.below(fault_steps)));
            }
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
        // Drawn last, so that the draws above stay what they were before
        // this field existed.
        plan.reserve_batch = rng.chance(500);
        let mut follow_rng = SimRng::new(spec.seed).fork(FOLLOW_STREAM);
        if plan.restart_at.is_none() && follow_rng.chance(250) {
            plan.follow_outer_lag_steps = Some((0..n).map(|_| follow_rng.below(200)).collect());
        }
        plan
    }

    /// A suspicion timeout that a healthy member never exceeds: the
    /// detection timeout plus what its turns (slow members) and the links
    /// (slow links) can make its heartbeat late by. Scenario tests that
    /// pin a plan's speeds or links call it again.
    pub fn healthy_suspect_timeout_ns(&self) -> u64 {
        let slowest_per_mille = self.speed_per_mille.iter().copied().min().unwrap_or(1000).max(1);
        // The drain's steps are longer (see `Cluster::run`).
        let tick_ns = self.tick_ns_max.max(self.detect_timeout_ns / 8);
        let turn_gap_ns = tick_ns * 1000 / slowest_per_mille;
        let link_ns = self
            .slow_links
            .iter()
            .map(|l| l.2)
            .max()
            .unwrap_or(0)
            .max(self.delay_ns_max);
        self.detect_timeout_ns + 8 * turn_gap_ns + 4 * link_ns + 4 * self.peer_check_interval_ns
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
            "senders={} mode={} window_slots={} slot_payload_max={} batching={} send={}‰ burst≤{} abandon={}‰ reserve_batch={} tick≤{}ns \
             delay≤{}ns split≤{} slow_links={:?} speed‰={:?} detect_timeout={}ns suspect_timeout={}ns crash={:?} \
             partition={:?} joiner={:?} leaver={:?} pause={:?} large={}‰ in_place={:#x} subgroups={:?} compact_log_bytes={} restart_at={:?} follow_outer_lag_steps={:?}",
            self.senders.as_str(),
            self.mode.as_str(),
            self.window_slots,
            self.slot_payload_max,
            self.batching,
            self.send_per_mille,
            self.burst_max,
            self.abandon_per_mille,
            self.reserve_batch,
            self.tick_ns_max,
            self.delay_ns_max,
            self.split_chunks_max,
            self.slow_links,
            self.speed_per_mille,
            self.detect_timeout_ns,
            self.suspect_timeout_ns,
            self.crash,
            self.partition,
            self.joiner,
            self.leaver,
            self.pause,
            self.large_per_mille,
            self.large_in_place_members,
            self.subgroups
                .iter()
                .map(|g| format!("{}:{}x{}{}", g.name, g.shards, g.members_per_shard, if g.overlapping { "+" } else { "" }))
                .collect::<Vec<_>>(),
            self.compact_log_bytes,
            self.restart_at,
            self.follow_outer_lag_steps
        )
    }
}

/// How a member's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEnd {
    Running,
    Crashed,
    /// It stopped on this error (removed, minority partition) after a fault.
    Stopped(String),
    /// It left the group on request.
    Left,
    /// A joiner that has not started yet.
    NotStarted,
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
    /// Every member's deliveries, as delivery-log lines. After a total
    /// failure, a restarted member's log is the history its state holds:
    /// what it delivered before its snapshot's position, the history it
    /// was replayed, then what it delivered in the restarted group.
    pub logs: Logs,
    /// Every member's installed views, in order.
    pub view_logs: ViewLogs,
    /// Large messages that counted as sent (every fragment committed),
    /// and those of them a view change cut (delivered nowhere, said).
    pub large_sent: u64,
    pub large_cut: u64,
    /// Persistent mode: log compactions checked (see `compact_log_bytes`).
    pub log_compactions: u64,
    /// Subgroup layouts computed and checked (member × view), and the
    /// views too small for the drawn subgroups (inadequate).
    pub layouts_checked: u64,
    pub layouts_inadequate: u64,
    /// The total failure and restart, as checked (see `restart_at`).
    pub restart: Option<RestartReport>,
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
        view_logs: ViewLogs::new(),
        large_sent: 0,
        large_cut: 0,
        log_compactions: 0,
        layouts_checked: 0,
        layouts_inadequate: 0,
        restart: None,
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
    let before = cluster.restart.as_ref().map(|r| r.totals_before.clone());
    report.sent = cluster.sent.iter().sum::<u64>() + before.as_ref().map_or(0, |t| t.sent);
    report.delivered = (0..spec.members)
        .map(|m| cluster.checker.delivered_by(m) + before.as_ref().map_or(0, |t| t.delivered[m]))
        .collect();
    report.ends = cluster.ends.clone();
    report.failure = failure;
    report.trace = cluster.world.trace().iter().map(|e| e.to_string()).collect();
    report.trace_digest = cluster.world.trace_digest();
    report.events = cluster.world.events();
    report.logs = std::mem::take(&mut cluster.logs);
    report.view_logs = std::mem::take(&mut cluster.view_logs);
    report.large_sent = cluster.large_sent_ids.iter().map(|ids| ids.len() as u64).sum::<u64>()
        + before.as_ref().map_or(0, |t| t.large_sent);
    report.large_cut = cluster.cut_sent.iter().sum::<u64>() + before.as_ref().map_or(0, |t| t.large_cut);
    report.log_compactions =
        cluster.compactions_checked.iter().sum::<u64>() + before.as_ref().map_or(0, |t| t.log_compactions);
    report.restart = cluster.restart.as_ref().map(|r| r.report.clone());
    if report.failure.is_none() {
        match check_subgroup_layouts(&report.plan.subgroups, &report.view_logs) {
            Ok((checked, inadequate)) => {
                report.layouts_checked = checked;
                report.layouts_inadequate = inadequate;
            }
            Err(detail) => {
                report.failure = Some(SimFailure {
                    step: report.steps_run,
                    property: "subgroup layout".into(),
                    detail,
                })
            }
        }
    }
    report
}

/// Draw 1 to 3 subgroups for `n` members: 1 to 3 shards of 1 to 3
/// members, overlapping one time in four (some specifications need more
/// members than a view has: those views are inadequate, and counted).
fn draw_subgroups(rng: &mut SimRng, n: usize) -> Vec<crate::subgroup::SubgroupSpec> {
    let count = rng.range(1, 4) as usize;
    (0..count)
        .map(|g| {
            let mut spec = crate::subgroup::SubgroupSpec::new(
                &format!("g{g}"),
                rng.range(1, 4) as usize,
                rng.range(1, (n as u64).clamp(1, 3) + 1) as usize,
            );
            spec.overlapping = rng.chance(250);
            spec
        })
        .collect()
}

/// Lay out every member's views with the default layout function, as a
/// member would at each view change, and check:
/// - **layout agreement**: every member that installed a view computed
///   the same layout of it (a joiner starts from the layout of the view
///   before its first, which it receives with the state transfer);
/// - **layout invariants** ([`crate::subgroup::check_layout`]): every
///   shard full, its members in the view, shards disjoint;
/// - **stickiness**: a member of consecutive adequate views stays in the
///   shards it was in, at the same shard rank (its replicated state does
///   not move).
///
/// Returns (layouts checked, inadequate views).
pub fn check_subgroup_layouts(
    specs: &[crate::subgroup::SubgroupSpec],
    view_logs: &ViewLogs,
) -> Result<(u64, u64), String> {
    use crate::subgroup::{check_layout, Layout, LayoutFunction, StickyLayout};
    if specs.is_empty() {
        return Ok((0, 0));
    }
    // Every view's members (view agreement is checked elsewhere), in
    // view order, and the reference layouts along that chain.
    let mut views: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for entries in view_logs.values() {
        for e in entries {
            views.entry(e.view).or_insert_with(|| e.members.clone());
        }
    }
    let mut reference: BTreeMap<u64, Option<Layout>> = BTreeMap::new();
    let mut last: Option<Layout> = None;
    let mut inadequate = 0;
    for (view, members) in &views {
        match StickyLayout.layout(specs, *view, members, last.as_ref()) {
            Ok(layout) => {
                check_layout(specs, members, &layout).map_err(|e| format!("view {view}: {e}"))?;
                if let Some(before) = &last {
                    for m in members {
                        for (g, s, rank) in before.shards_of(*m) {
                            if layout.shards[g][s].get(rank) != Some(m) {
                                return Err(format!(
                                    "stickiness: member {m} left its place (rank {rank}) in shard {s} of subgroup {g} \
                                     from view {} to view {view}",
                                    before.view_id
                                ));
                            }
                        }
                    }
                }
                last = Some(layout.clone());
                reference.insert(*view, Some(layout));
            }
            Err(crate::subgroup::LayoutError::Inadequate { .. }) => {
                inadequate += 1;
                reference.insert(*view, None);
            }
            Err(e) => return Err(format!("view {view}: {e}")),
        }
    }
    let mut checked = 0;
    // The last adequate layout before `view`: what a member that did not
    // lay out the views before it starts from (a joiner receives it with
    // the state transfer).
    let transferred = |view: u64| reference.range(..view).rev().find_map(|(_, l)| l.clone());
    for (member, entries) in view_logs {
        let mut previous: Option<Layout> = None;
        let mut previous_view: Option<u64> = None;
        for e in entries {
            // A member's log holds the view it had at the end of each
            // step: two views installed within one step show as one. Where
            // the log skips the chain's view before this one, the member
            // laid that one out too; start from the group's layout of it.
            let predecessor = views.range(..e.view).next_back().map(|(v, _)| *v);
            if previous_view.is_none() || previous_view != predecessor {
                previous = transferred(e.view);
            }
            previous_view = Some(e.view);
            let mine = StickyLayout.layout(specs, e.view, &e.members, previous.as_ref()).ok();
            let expected = reference.get(&e.view).cloned().flatten();
            if mine != expected {
                return Err(format!(
                    "layout agreement: member {member} laid view {} out as {:?}, the group as {:?}",
                    e.view,
                    mine.map(|l| l.shards),
                    expected.map(|l| l.shards)
                ));
            }
            checked += 1;
            if mine.is_some() {
                previous = mine;
            }
        }
    }
    Ok((checked, inadequate))
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
/// The ids of a member's own large messages it was told were cut.
type OwnCuts = Arc<Mutex<Vec<u64>>>;

/// A simulated member's application: deliveries go to its inbox, the cuts
/// of its own large messages to its list. Its state, for a log
/// compaction, is how many messages it delivered (a joiner counts from
/// its join: it keeps its count when it is sent a state).
struct SimApp {
    rank: usize,
    inbox: Inbox,
    own_cuts: OwnCuts,
    delivered: u64,
    /// After a restart, the restarted group's first view: the cuts of
    /// views before it are part of the replayed history (the app counts
    /// no message of its own as cut there: those are another epoch's).
    history_below_view: u64,
    /// It takes large messages in place (`Upcalls::takes_fragments`):
    /// per sender rank, the message it is putting together from the
    /// fragments handed over (its id and bytes), so that the whole
    /// message goes to the checker as a whole delivery would.
    in_place: Option<Vec<Staged>>,
}

/// A large message being put together from fragments handed over in
/// place: its id and bytes so far.
type Staged = Option<(u64, Vec<u8>)>;

impl SimApp {
    fn new(rank: usize, inbox: &Inbox, own_cuts: &OwnCuts, first_view: u64, in_place: bool) -> SimApp {
        SimApp {
            rank,
            inbox: Arc::clone(inbox),
            own_cuts: Arc::clone(own_cuts),
            delivered: 0,
            history_below_view: first_view,
            in_place: in_place.then(|| vec![None; spindle_fabric::MEMBERS_MAX]),
        }
    }
}

impl crate::Upcalls for SimApp {
    fn takes_fragments(&self) -> bool {
        self.in_place.is_some()
    }
    fn deliver_fragment(&mut self, f: &crate::FragmentDelivery<'_>) {
        let staged = self
            .in_place
            .as_mut()
            .expect("handed fragments only when it takes them");
        let slot = &mut staged[f.sender_rank];
        if f.offset == 0 {
            assert!(
                slot.is_none(),
                "virtual synchrony: member {} was handed a new large message of {} while message {} was neither delivered nor cut",
                self.rank,
                f.sender_rank,
                slot.as_ref().map_or(0, |(id, _)| *id)
            );
            *slot = Some((f.message_id, Vec::with_capacity(f.total_len as usize)));
        }
        let Some((id, bytes)) = slot.as_mut() else {
            panic!(
                "no gaps: member {} was handed bytes {}.. of large message {} of {} without its start",
                self.rank, f.offset, f.message_id, f.sender_rank
            );
        };
        assert!(
            *id == f.message_id && bytes.len() as u64 == f.offset && f.offset + f.data.len() as u64 <= f.total_len,
            "no gaps: member {} was handed bytes {}..+{} of large message {} of {}, after {} bytes of message {}",
            self.rank,
            f.offset,
            f.data.len(),
            f.message_id,
            f.sender_rank,
            bytes.len(),
            id
        );
        bytes.extend_from_slice(f.data);
        if f.is_last() {
            let (_, whole) = slot.take().expect("staged above");
            self.deliver(&f.whole(&whole));
        }
    }
    fn deliver(&mut self, d: &crate::Delivery<'_>) {
        self.delivered += 1;
        self.inbox.lock().expect("inbox").push(Delivered {
            member: self.rank,
            view: d.view,
            sender: d.sender_rank,
            index: d.index,
            seq: d.seq,
            len: d.payload.len() as u64,
            xxh3: xxhash_rust::xxh3::xxh3_64(d.payload),
        });
    }
    fn large_message_cut(&mut self, view: u64, sender_rank: usize, message_id: u64, _len_bytes: u64) {
        if let Some(staged) = self.in_place.as_mut() {
            // What was staged of it is dropped (it may have had no
            // fragment here: a cut is said for the message as begun).
            if staged[sender_rank].as_ref().is_some_and(|(id, _)| *id == message_id) {
                staged[sender_rank] = None;
            }
        }
        if sender_rank == self.rank && view >= self.history_below_view {
            self.own_cuts.lock().expect("own cuts").push(message_id);
        }
    }
    fn snapshot(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.delivered.to_le_bytes());
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        match snapshot.len() {
            0 => Ok(()),
            8 => {
                // A restarted member's log snapshot holds its count (its
                // history before the snapshot is in its log: see
                // `total_failure`); a joiner's state transfer does not
                // change its count (it counts from its join).
                if self.history_below_view > 0 {
                    self.delivered = u64::from_le_bytes(snapshot.try_into().expect("8 bytes"));
                }
                Ok(())
            }
            n => Err(format!("a simulated member's state is 8 bytes, not {n}")),
        }
    }
    fn takes_snapshots(&self) -> bool {
        true
    }
}

struct Cluster {
    spec: SimSpec,
    plan: SimPlan,
    world: SimWorld,
    agents: Vec<Option<GroupAgent<SimFabric>>>,
    config: GroupConfig,
    /// The view each member last reported.
    views: Vec<Option<u64>>,
    senders: Vec<Option<Sender<SimFabric>>>,
    inboxes: Vec<Inbox>,
    ends: Vec<MemberEnd>,
    checker: Checker,
    logs: Logs,
    view_logs: ViewLogs,
    /// Messages sent per member rank.
    sent: Vec<u64>,
    rng: SimRng,
    /// Persistent mode: when each member's log syncs.
    persist_rng: SimRng,
    /// Large messages: when one starts, its length and bytes.
    large_rng: SimRng,
    /// Per member, the large message being sent (its fragments and bytes).
    large: Vec<Option<(LargeSend<SimFabric>, Vec<u8>)>>,
    /// Per member, the ids of its large messages that counted as sent.
    large_sent_ids: Vec<Vec<u64>>,
    /// Per member, the log compactions checked so far, and its
    /// deliveries when its compacted log was last checked.
    compactions_checked: Vec<u64>,
    compaction_checked_deliveries: Vec<usize>,
    /// Per member, its cut large messages that had counted as sent
    /// (delivered nowhere: the group said so, see `large_message_cut`).
    cut_sent: Vec<u64>,
    own_cuts: Vec<OwnCuts>,
    step: u64,
    /// The member whose step is running (for a panic report).
    stepping: Option<usize>,
    faults_injected: bool,
    /// A total failure's draws (see [`SimPlan::restart_at`]).
    restart_rng: SimRng,
    /// Per member that left the group, its log as it left it (what its
    /// disk holds at a total failure).
    left_disks: Vec<Option<Vec<u8>>>,
    /// After the total failure: what the restart is checked against.
    restart: Option<Restarted>,
    /// Following an outer view: the step from which each member is out
    /// of it (crashed, stopped, or in a partition's minority).
    outer_out_at: Vec<Option<u64>>,
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
        config.membership = true;
        config.suspect_timeout = Duration::from_nanos(plan.suspect_timeout_ns);
        // A scenario may pin another mode over a persistent draw.
        if plan.mode == DeliveryMode::Persistent {
            config.compact_log_bytes = plan.compact_log_bytes;
        }
        if let Some((joiner, _)) = plan.joiner {
            config.initial_members = Some((0..spec.members).filter(|r| *r != joiner).collect());
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    fn new(spec: &SimSpec, plan: SimPlan) -> Result<Cluster, String> {
        let n = spec.members;
        let config = Self::config(spec, &plan)?;
        let layout = SmcLayout::new(&config);
        let mut root = SimRng::new(spec.seed);
        let world = Self::open_world(spec, &plan, &layout, root.fork(WORLD_STREAM).next_u64())?;
        let initial = config.initial_ranks();
        let fabrics: Vec<Arc<SimFabric>> = initial
            .iter()
            .map(|&r| world.open(r).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let mut agents: Vec<Option<GroupAgent<SimFabric>>> = (0..n).map(|_| None).collect();
        let mut senders: Vec<Option<Sender<SimFabric>>> = (0..n).map(|_| None).collect();
        let inboxes: Vec<Inbox> = (0..n).map(|_| Inbox::default()).collect();
        let own_cuts: Vec<OwnCuts> = (0..n).map(|_| OwnCuts::default()).collect();
        let mut ends = vec![MemberEnd::NotStarted; n];
        for fabric in fabrics {
            let rank = fabric.member_rank();
            let group = if plan.mode == DeliveryMode::Persistent {
                Group::join_with_log(fabric, config.clone(), PersistLog::memory())
            } else {
                Group::join(fabric, config.clone())
            }
            .map_err(|e| e.to_string())?;
            senders[rank] = group.sender();
            let in_place = plan.large_in_place_members >> rank & 1 == 1;
            agents[rank] = Some(Self::agent(group, &inboxes[rank], &own_cuts[rank], in_place));
            ends[rank] = MemberEnd::Running;
        }
        if let Some(CrashPlan {
            rank,
            trigger: CrashTrigger::AtPush(p),
        }) = plan.crash
        {
            world.crash_at_push(rank, p);
        }
        let sender_ranks: Vec<usize> = config
            .senders
            .ranks(n)
            .into_iter()
            .filter(|r| initial.contains(r))
            .collect();
        let mut checker = Checker::with_members(0, &initial, n, &sender_ranks, plan.mode.is_total_order());
        if plan.follow_outer_lag_steps.is_some() {
            checker.majority_decided_outside();
        }
        Ok(Cluster {
            checker,
            spec: spec.clone(),
            world,
            agents,
            config,
            views: vec![None; n],
            senders,
            inboxes,
            ends,
            logs: (0..n).map(|m| (m, Vec::new())).collect(),
            view_logs: ViewLogs::new(),
            sent: vec![0; n],
            rng: root.fork(WORKLOAD_STREAM),
            persist_rng: SimRng::new(spec.seed).fork(PERSIST_STREAM).fork(WORKLOAD_STREAM),
            large_rng: SimRng::new(spec.seed).fork(LARGE_STREAM).fork(WORKLOAD_STREAM),
            large: (0..n).map(|_| None).collect(),
            large_sent_ids: vec![Vec::new(); n],
            compactions_checked: vec![0; n],
            compaction_checked_deliveries: vec![0; n],
            cut_sent: vec![0; n],
            own_cuts,
            step: 0,
            stepping: None,
            faults_injected: plan.crash.is_some()
                || plan.partition.is_some()
                || plan.pause.is_some()
                || spec.sabotage.is_some(),
            restart_rng: SimRng::new(spec.seed).fork(RESTART_STREAM).fork(WORKLOAD_STREAM),
            left_disks: vec![None; n],
            restart: None,
            outer_out_at: vec![None; n],
            plan,
        })
    }

    /// The simulated network and shared memory of the plan's members.
    fn open_world(spec: &SimSpec, plan: &SimPlan, layout: &SmcLayout, seed: u64) -> Result<SimWorld, String> {
        let mut options = SimOptions::new(spec.members, layout.row.row_len_bytes(), seed);
        options.delay_ns_max = plan.delay_ns_max;
        options.split_chunks_max = plan.split_chunks_max;
        options.detect_timeout_ns = plan.detect_timeout_ns;
        options.trace_events_max = spec.trace_events_max;
        options.sabotage = spec.sabotage;
        let world = SimWorld::new(options).map_err(|e| e.to_string())?;
        for &(src, dst, delay) in &plan.slow_links {
            world.set_link_delay(src, dst, delay);
        }
        Ok(world)
    }

    /// A member's group with a delivery handler that fills its inbox.
    fn agent(group: Group<SimFabric>, inbox: &Inbox, own_cuts: &OwnCuts, in_place: bool) -> GroupAgent<SimFabric> {
        Self::agent_after(group, inbox, own_cuts, 0, in_place)
    }

    /// [`Cluster::agent`] for a member restarted into view `first_view`.
    fn agent_after(
        group: Group<SimFabric>,
        inbox: &Inbox,
        own_cuts: &OwnCuts,
        first_view: u64,
        in_place: bool,
    ) -> GroupAgent<SimFabric> {
        let app = SimApp::new(group.my_rank(), inbox, own_cuts, first_view, in_place);
        GroupAgent::new(group, app)
    }

    fn group(&self, m: usize) -> &Group<SimFabric> {
        &self.agents[m].as_ref().expect("a started member").group
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
            if self.plan.restart_at == Some(self.step)
                && self.plan.mode == DeliveryMode::Persistent
                && self.restart.is_none()
            {
                self.total_failure()?;
                if self.restart.as_ref().is_some_and(|r| r.report.refused.is_some()) {
                    // Nothing restarted: the run ends at the failure.
                    return Ok(());
                }
            }
            let sending = self.step < self.spec.steps;
            let tick = if sending {
                self.plan.tick_ns_max
            } else {
                self.plan.detect_timeout_ns / 8
            };
            self.world.advance(self.rng.below(tick + 1));
            self.inject_faults();
            self.follow_outer_view();
            self.world.deliver_due();
            self.rng.shuffle(&mut order);
            self.sync_logs();
            for &m in &order {
                if self.ends[m] != MemberEnd::Running || !self.rng.chance(self.plan.speed_per_mille[m]) {
                    continue;
                }
                if matches!(self.plan.pause, Some((r, from, to)) if r == m && (from..to).contains(&self.step)) {
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

    /// Persistent mode: each running member's log syncs with the plan's
    /// chance (its sync thread finished a write and an fdatasync).
    fn sync_logs(&mut self) {
        if self.plan.mode != DeliveryMode::Persistent {
            return;
        }
        for m in 0..self.spec.members {
            if self.ends[m] != MemberEnd::Running || !self.persist_rng.chance(self.plan.sync_per_mille) {
                continue;
            }
            if let Some(log) = self.agents[m]
                .as_mut()
                .and_then(|a| a.group.core_mut().persist_log_mut())
            {
                log.sim_sync();
            }
        }
    }

    /// Persistent mode, "persisted before delivered": the deliverer's own
    /// log has the message on disk, and so has every member of the view
    /// it was delivered in when that is the deliverer's current view (the
    /// ragged edge of a view change is delivered once on the disks of the
    /// members that install the next view, each before it delivers).
    fn check_persisted(&self, m: usize, view: u64, seq: u64) -> Result<(), Violation> {
        let missing = |r: usize| {
            self.agents[r]
                .as_ref()
                .and_then(|a| a.group.core().persist_log())
                .is_some_and(|l| !l.is_durable(view, seq))
        };
        if missing(m) {
            return Err(Violation::new(
                "persisted before delivered",
                format!("member {m} delivered seq {seq} of view {view} before its own log had it on disk"),
            ));
        }
        let core = self.group(m).core();
        // Delivered in the current view: every member of it has it on
        // disk. Delivered in the view before (the ragged edge, at the
        // install): every member of the new view that was in the old one
        // had it on disk when the view was proposed (the edge is the
        // smallest persisted frontier over the survivors).
        let holders: Vec<usize> = if core.view() == view {
            core.view_members.clone()
        } else if core.view() == view + 1 {
            let current = &core.mship.current;
            core.view_members
                .iter()
                .copied()
                .filter(|r| !current.joined.contains(r))
                .collect()
        } else {
            Vec::new()
        };
        for r in holders {
            if missing(r) {
                return Err(Violation::new(
                    "persisted before delivered",
                    format!("member {m} delivered seq {seq} of view {view} before member {r}'s log had it on disk"),
                ));
            }
        }
        Ok(())
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
        if let Some((rank, step)) = self.plan.joiner {
            if step == self.step && self.ends[rank] == MemberEnd::NotStarted {
                let joined = self.world.open(rank).map_err(GroupError::from).and_then(|f| {
                    let log = (self.plan.mode == DeliveryMode::Persistent).then(PersistLog::memory);
                    Group::start_join_with_log(Arc::new(f), self.config.clone(), log)
                });
                match joined {
                    Ok(group) => {
                        self.senders[rank] = group.sender();
                        let in_place = self.plan.large_in_place_members >> rank & 1 == 1;
                        self.agents[rank] =
                            Some(Self::agent(group, &self.inboxes[rank], &self.own_cuts[rank], in_place));
                        self.ends[rank] = MemberEnd::Running;
                    }
                    Err(e) => self.ends[rank] = MemberEnd::Stopped(format!("could not start joining: {e}")),
                }
            }
        }
        if let Some((rank, step)) = self.plan.leaver {
            if step == self.step && self.ends[rank] == MemberEnd::Running {
                if let Some(agent) = self.agents[rank].as_mut() {
                    if agent.group.start_leave().is_err() {
                        self.ends[rank] = MemberEnd::Stopped("could not ask to leave".into());
                    }
                    // From here on it agrees to any view that drops it.
                    self.checker.on_leave(rank);
                }
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

    /// Following an outer view (see [`SimPlan::follow_outer_lag_steps`]):
    /// the outer view leaves out a member from the step it crashed,
    /// stopped or left, and at a partition's start the side without a majority
    /// of its live members (both sides of an even split: the outer group
    /// stops too); each member learns of it its lag later. A member the outer view leaves out stops, as a shard member
    /// out of the top-level view does.
    fn follow_outer_view(&mut self) {
        let Some(lags) = self.plan.follow_outer_lag_steps.clone() else {
            return;
        };
        let n = self.spec.members;
        for r in 0..n {
            // A member that left is gone from the outer view too (a shard
            // member leaves its shard when the layout moves it out, which
            // `Sharded` then lists as left out): the leave's own view
            // change may never reach the others (a leader that crashes
            // right after it installed the view without itself).
            if self.outer_out_at[r].is_none()
                && matches!(
                    self.ends[r],
                    MemberEnd::Crashed | MemberEnd::Stopped(_) | MemberEnd::Left
                )
            {
                self.outer_out_at[r] = Some(self.step);
            }
        }
        if let Some(p) = self.plan.partition {
            if p.start_step == self.step {
                // The outer group keeps the side with a majority of its
                // live members; with none (an even split), neither side.
                let live = (0..n)
                    .filter(|r| self.outer_out_at[*r].is_none())
                    .fold(0u64, |mask, r| mask | (1 << r));
                let side = p.side.0 & live;
                let rest = live & !side;
                let out = if side.count_ones() * 2 > live.count_ones() {
                    rest
                } else if rest.count_ones() * 2 > live.count_ones() {
                    side
                } else {
                    live
                };
                for r in PeerSet(out).iter() {
                    self.outer_out_at[r].get_or_insert(self.step);
                }
            }
        }
        for (m, lag) in lags.iter().enumerate() {
            if self.ends[m] != MemberEnd::Running {
                continue;
            }
            let left_out: Vec<usize> = (0..n)
                .filter(|r| self.outer_out_at[*r].is_some_and(|at| self.step >= at + lag))
                .collect();
            if left_out.contains(&m) {
                let at_ns = self.world.now_ns();
                let text = format!("member {m} stops: the outer view left it out");
                self.world.record(SimEvent::Note { at_ns, text });
                self.ends[m] = MemberEnd::Stopped("the outer view left it out".into());
                self.world.exit(m);
                continue;
            }
            if let Some(agent) = self.agents[m].as_mut() {
                agent.group.follow_view(Some(&left_out));
            }
        }
    }

    /// A burst of sends from `m`'s application (sometimes an abandoned
    /// reservation, which publishes a skip slot), one reservation per
    /// message or, with `reserve_batch`, one for the whole burst.
    fn app_send(&mut self, m: usize) {
        let Some(sender) = self.senders[m].clone() else { return };
        if !self.rng.chance(self.plan.send_per_mille) {
            return;
        }
        let burst = self.rng.range(1, self.plan.burst_max);
        let first = self.sent[m];
        self.app_send_large(&sender, m);
        if self.plan.reserve_batch {
            self.app_send_batch(&sender, m, burst);
        } else {
            for _ in 0..burst {
                let len = self.rng.below(self.plan.slot_payload_max as u64 + 1) as usize;
                let Ok(slot) = sender.reserve(len) else { break };
                if self.rng.chance(self.plan.abandon_per_mille) {
                    drop(slot); // abandoned: a skip slot, no message
                    continue;
                }
                self.fill_and_commit(m, slot, len);
            }
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

    /// The cuts `m`'s application was told of: one being sent is given up
    /// (the app may start another), one that counted as sent is counted
    /// as delivered nowhere.
    fn take_own_cuts(&mut self, m: usize) {
        let ids: Vec<u64> = std::mem::take(&mut *self.own_cuts[m].lock().expect("own cuts"));
        for id in ids {
            if self.large[m].as_ref().is_some_and(|(tx, _)| tx.message_id() == id) {
                self.large[m] = None;
            } else if self.large_sent_ids[m].contains(&id) {
                self.cut_sent[m] += 1;
            } else {
                panic!("member {m} was told its large message {id} was cut, which it never sent");
            }
        }
    }

    /// Go on with `m`'s large message, or (sometimes) start one. It counts
    /// as sent when its last fragment is committed: that is its place in
    /// the sender's order (small messages sent meanwhile come before it).
    fn app_send_large(&mut self, sender: &Sender<SimFabric>, m: usize) {
        if self.plan.large_per_mille == 0 {
            return;
        }
        if self.large[m].is_none() && self.large_rng.chance(self.plan.large_per_mille) {
            let slot = self.plan.slot_payload_max as u64;
            let len = self.large_rng.range(slot + 1, slot * 6) as usize;
            let mut bytes = vec![0u8; len];
            for chunk in bytes.chunks_mut(8) {
                let word = self.large_rng.next_u64().to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
            match sender.send_large(len) {
                Ok(tx) => self.large[m] = Some((tx, bytes)),
                Err(SendError::Stopped) => return,
                Err(e) => panic!("send_large of {len} B refused in a plan that allows it: {e}"),
            }
        }
        let Some((tx, bytes)) = self.large[m].as_mut() else {
            return;
        };
        match tx.push(bytes) {
            Ok(true) => {
                let hash = xxhash_rust::xxh3::xxh3_64(bytes);
                self.checker.record_sent(m, bytes.len() as u64, hash);
                self.sent[m] += 1;
                self.large_sent_ids[m].push(tx.message_id());
                self.large[m] = None;
            }
            Ok(false) => {}
            Err(_) => self.large[m] = None,
        }
    }

    /// The burst's slots reserved together, each committed with a length
    /// drawn after the reservation (`commit_len`); an abandoned slot, or
    /// the batch's untaken rest, becomes a skip slot.
    fn app_send_batch(&mut self, sender: &Sender<SimFabric>, m: usize, burst: u64) {
        let Ok(mut batch) = sender.reserve_batch(burst as usize, self.plan.slot_payload_max) else {
            return;
        };
        while let Some(slot) = batch.next_slot() {
            let len = self.rng.below(self.plan.slot_payload_max as u64 + 1) as usize;
            if self.rng.chance(self.plan.abandon_per_mille) {
                if self.rng.chance(500) {
                    return; // abandoned with the rest of the batch: skip slots
                }
                drop(slot);
                continue;
            }
            self.fill_and_commit(m, slot, len);
        }
        debug_assert_eq!(batch.remaining(), 0, "an unabandoned batch is used up");
    }

    /// Write message `sent[m]`'s pattern into the first `len` bytes of the
    /// slot and commit them.
    fn fill_and_commit(&mut self, m: usize, mut slot: SendSlot<'_, SimFabric>, len: usize) {
        let k = self.sent[m];
        let mut pattern = SimRng::new(self.spec.seed ^ ((m as u64) << 48) ^ k);
        let payload = &mut slot.payload_mut()[..len];
        for chunk in payload.chunks_mut(8) {
            let word = pattern.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        let hash = xxhash_rust::xxh3::xxh3_64(payload);
        slot.commit_len(len);
        self.checker.record_sent(m, len as u64, hash);
        self.sent[m] += 1;
    }

    fn step_member(&mut self, m: usize) -> Result<(), SimFailure> {
        let at_ns = self.world.now_ns();
        let now_ns = at_ns + self.plan.clock_offset_ns[m];
        self.stepping = Some(m);
        let agent = self.agents[m].as_mut().expect("a running member has an agent");
        let result = agent.do_work(now_ns);
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
        self.check_replay_done(m).map_err(|v| self.fail(v))?;
        self.check_compacted(m).map_err(|v| self.fail(v))?;
        self.take_own_cuts(m);
        self.check_view(m)?;
        let churn = self.plan.joiner.is_some() || self.plan.leaver.is_some();
        let slow = self.plan.speed_per_mille.iter().any(|s| *s < 1000) || self.plan.delay_ns_max > 0;
        match result {
            Ok(_) => {
                if self.group(m).has_left() {
                    self.world.record(SimEvent::Note {
                        at_ns,
                        text: format!("member {m} left"),
                    });
                    self.ends[m] = MemberEnd::Left;
                    // Its disk keeps the log (a total failure reads it).
                    self.left_disks[m] = self.agents[m]
                        .as_ref()
                        .and_then(|a| a.group.core().persist_log())
                        .map(|l| l.sim_durable_bytes().to_vec());
                    // Dropping the fabric is the clean leave.
                    self.agents[m] = None;
                    self.senders[m] = None;
                }
                Ok(())
            }
            Err(
                e @ (GroupError::Removed { .. }
                | GroupError::MinorityPartition { .. }
                | GroupError::FellBehind { .. }
                | GroupError::StateTransfer { .. }),
            ) if self.faults_injected || churn || slow => {
                // Following an outer view, only that view takes a member
                // out: no minority of its own, no removal the outer view
                // did not make.
                let outer_holds = match &e {
                    GroupError::MinorityPartition { .. } => true,
                    GroupError::Removed { .. } => self.outer_out_at[m].is_none(),
                    _ => false,
                };
                if self.plan.follow_outer_lag_steps.is_some() && outer_holds {
                    return Err(self.fail(Violation::new(
                        "the view follows the outer view",
                        format!("member {m} stopped although the outer view holds it: {e}"),
                    )));
                }
                let text = format!("member {m} stops: {e}");
                self.world.record(SimEvent::Note { at_ns, text });
                self.ends[m] = MemberEnd::Stopped(e.to_string());
                self.world.exit(m);
                Ok(())
            }
            Err(e) => Err(self.fail(Violation::new("no unexpected errors", format!("member {m}: {e}")))),
        }
    }

    /// Report a view the member installed since its last step.
    fn check_view(&mut self, m: usize) -> Result<(), SimFailure> {
        let Some(agent) = self.agents[m].as_ref() else {
            return Ok(());
        };
        if agent.group.is_joining() || agent.group.has_left() {
            return Ok(());
        }
        let view = agent.group.view();
        if self.views[m] == Some(view.id) {
            return Ok(());
        }
        self.views[m] = Some(view.id);
        let at_ns = self.world.now_ns();
        self.world.record(SimEvent::Note {
            at_ns,
            text: format!("member {m} installs view {} {:?}", view.id, view.members),
        });
        // Following an outer view: a member leaves the view only when the
        // outer view left it out (or it asked to leave).
        if self.plan.follow_outer_lag_steps.is_some() {
            let previous = self.view_logs.get(&m).and_then(|v| v.last()).map(|e| e.members.clone());
            let leaver = self.plan.leaver.map(|(r, _)| r);
            if let Some(gone) = previous
                .unwrap_or_default()
                .into_iter()
                .find(|r| !view.members.contains(r) && self.outer_out_at[*r].is_none() && Some(*r) != leaver)
            {
                return Err(self.fail(Violation::new(
                    "the view follows the outer view",
                    format!(
                        "member {m} installed view {} {:?} without member {gone}, which the outer view still holds",
                        view.id, view.members
                    ),
                )));
            }
        }
        self.view_logs.entry(m).or_default().push(ViewEntry {
            member: m,
            view: view.id,
            members: view.members.clone(),
        });
        self.checker
            .on_view_with_senders(m, view.id, &view.members, &view.senders)
            .map_err(|v| self.fail(v))?;
        Ok(())
    }

    /// Persistent mode, once a member's log was compacted: after every
    /// step that compacted it or delivered, the compacted log reads back
    /// whole; its snapshot holds exactly the messages this member
    /// delivered before the snapshot's position ("a snapshot holds only
    /// delivered messages"), and every message it delivered from there on
    /// is in the log after it, with its bytes ("no loss of persisted
    /// messages": what a restart would replay).
    fn check_compacted(&mut self, m: usize) -> Result<(), Violation> {
        let Some(log) = self.agents[m].as_ref().and_then(|a| a.group.core().persist_log()) else {
            return Ok(());
        };
        let done = log.compactions_done();
        let deliveries = self.logs[&m].len();
        if done == 0 || (done == self.compactions_checked[m] && deliveries == self.compaction_checked_deliveries[m]) {
            return Ok(());
        }
        self.compactions_checked[m] = done;
        self.compaction_checked_deliveries[m] = deliveries;
        let property = "no loss of persisted messages";
        let rec = crate::persist::recover_records(log.sim_durable_bytes(), m as u32);
        if let Some(d) = &rec.dropped {
            return Err(Violation::new(
                property,
                format!("member {m}'s compacted log does not read back: {}", d.reason),
            ));
        }
        let snap = rec
            .snapshot()
            .ok_or_else(|| Violation::new(property, format!("member {m}'s compacted log has no snapshot")))?;
        let at = (snap.view, snap.seq);
        let state = &rec.bytes[snap.state.clone()];
        let count = u64::from_le_bytes(
            state
                .try_into()
                .map_err(|_| Violation::new(property, format!("member {m}'s snapshot is {} bytes", state.len())))?,
        );
        let delivered = &self.logs[&m];
        let before = delivered.iter().filter(|e| (e.view, e.seq) < at).count() as u64;
        if before != count {
            return Err(Violation::new(
                "a snapshot holds only delivered messages",
                format!(
                    "member {m}'s snapshot at view {} seq {} holds {count} messages; it delivered {before} before there",
                    at.0, at.1
                ),
            ));
        }
        let history: std::collections::HashMap<(u64, u64), u64> = rec
            .history()
            .iter()
            .filter(|h| !h.fragment)
            .map(|h| ((h.view, h.seq), xxhash_rust::xxh3::xxh3_64(h.payload)))
            .collect();
        let slot = self.plan.slot_payload_max as u64;
        for e in delivered.iter().filter(|e| (e.view, e.seq) >= at && e.len <= slot) {
            let xxh3 = format!("{:016x}", history.get(&(e.view, e.seq)).copied().unwrap_or(0));
            if !history.contains_key(&(e.view, e.seq)) || xxh3 != e.xxh3 {
                return Err(Violation::new(
                    property,
                    format!(
                        "member {m} delivered seq {} of view {} after its snapshot (view {} seq {}), \
                         but its compacted log does not hold it",
                        e.seq, e.view, at.0, at.1
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_deliveries(&mut self, m: usize) -> Result<(), SimFailure> {
        let batch = std::mem::take(&mut *self.inboxes[m].lock().expect("inbox"));
        for d in batch {
            if let Some(r) = self.restart.as_ref().filter(|r| d.view < r.report.first_view) {
                // The history a restarted member is replayed: checked
                // against what was sent and delivered before the failure.
                r.check_replayed(&d).map_err(|v| self.fail(v))?;
                self.logs.get_mut(&m).expect("log").push(d.to_log_entry());
                continue;
            }
            self.checker.check(&d).map_err(|v| self.fail(v))?;
            if self.plan.mode == DeliveryMode::Persistent {
                self.check_persisted(m, d.view, d.seq).map_err(|v| self.fail(v))?;
            }
            self.logs.get_mut(&m).expect("log").push(d.to_log_entry());
        }
        Ok(())
    }

    /// Nothing left to happen: everyone stopped, or (nobody lost) everyone
    /// delivered everything and nothing is in flight.
    fn settled(&self) -> bool {
        let partition_pending = self.plan.partition.is_some_and(|p| p.start_step >= self.step);
        let churn_pending = self.plan.joiner.is_some_and(|(_, s)| s >= self.step)
            || self.plan.leaver.is_some_and(|(_, s)| s >= self.step)
            || self.plan.pause.is_some_and(|(_, _, to)| to >= self.step);
        !partition_pending && !churn_pending && self.world.in_flight_bytes() == 0 && self.quiescent().is_ok()
    }

    /// Every running member is in the same view, not changing it, and has
    /// delivered (ordered) or received (unordered) everything published
    /// in it; `Err` says who is not.
    fn quiescent(&self) -> Result<(), String> {
        let running: Vec<usize> = (0..self.spec.members)
            .filter(|m| self.ends[*m] == MemberEnd::Running)
            .collect();
        // A joiner cut off by a partition that never heals (or that broke
        // its links for good) cannot be admitted.
        let cut_off = self.plan.partition.is_some_and(|p| !p.hold || p.heal_step.is_none());
        let members: Vec<usize> = running
            .iter()
            .copied()
            .filter(|m| !self.group(*m).is_joining())
            .collect();
        if !cut_off {
            if let Some(m) = running.iter().find(|m| self.group(**m).is_joining()) {
                if !members.is_empty() {
                    return Err(format!("member {m} has not been admitted"));
                }
            }
        }
        // A joiner waits for a running group; with none left it waits for
        // ever (a real one gives up after join_timeout).
        let Some(&first) = members.first() else {
            return Ok(());
        };
        if let Some(m) = members.iter().find(|m| self.group(**m).core().is_replaying()) {
            return Err(format!("member {m} is still replaying the history it restarted from"));
        }
        let view = self.group(first).view();
        let mut published = Vec::new();
        for &m in &members {
            let core = self.group(m).core();
            if core.is_joining() || core.view() != view.id || core.mship.wedged {
                return Err(format!(
                    "member {m} is in view {} (wedged: {})",
                    core.view(),
                    core.mship.wedged
                ));
            }
            if let Some(ring) = &core.ring {
                if core.my_sender_index.is_some() && ring.scan(core.published_slots) > 0 {
                    return Err(format!("member {m} has committed slots not yet published"));
                }
            }
        }
        for (i, &s) in self.group(first).core().sender_ranks.iter().enumerate() {
            let core = self.group(s).core();
            published.push((i, s, core.next_msg_index));
        }
        for &m in &members {
            let core = self.group(m).core();
            for &(i, s, n) in &published {
                if core.recv_msgs.get(i).copied() != Some(n) {
                    return Err(format!(
                        "member {m} received {:?} of sender {s}'s {n} messages in view {}",
                        core.recv_msgs.get(i),
                        view.id
                    ));
                }
            }
            // Ordered: every published index of every sender delivered
            // (nulls fill the gaps between senders).
            let senders = published.len() as u64;
            let need = published
                .iter()
                .filter(|p| p.2 > 0)
                .map(|&(i, _, n)| (n - 1) * senders + i as u64 + 1)
                .max()
                .unwrap_or(0);
            if self.plan.mode.is_total_order() && core.delivered_num < need {
                return Err(format!(
                    "member {m} delivered up to seq {} of {need} published in view {}",
                    core.delivered_num, view.id
                ));
            }
        }
        if self.plan.mode.is_total_order() {
            self.survivors_delivered_every_survivors_message(&members)?;
        }
        Ok(())
    }

    /// No loss for senders that stay (ordered mode): a member that ran
    /// from the first view to the end delivered every message of every
    /// sender still running at the end, whatever view changes came in
    /// between (what a ragged edge trimmed, its sender published again
    /// in the next view). A joiner delivers from the view it joined, so
    /// it is not held to this; nor is a member that joined a restarted
    /// group afresh.
    fn survivors_delivered_every_survivors_message(&self, members: &[usize]) -> Result<(), String> {
        let joiner = self.plan.joiner.map(|(j, _)| j);
        let rejoined: &[usize] = self.restart.as_ref().map_or(&[], |r| &r.report.rejoined);
        let ran_throughout = |m: &usize| Some(*m) != joiner && !rejoined.contains(m);
        for &m in members.iter().filter(|m| ran_throughout(m)) {
            for &s in members
                .iter()
                .filter(|s| self.senders[**s].is_some() && ran_throughout(s))
            {
                // After a restart: what it delivered in the restarted group.
                let first_view = self.restart.as_ref().map_or(0, |r| r.report.first_view);
                let delivered = self.logs[&m]
                    .iter()
                    .filter(|e| e.sender == s && e.view >= first_view)
                    .count() as u64;
                if delivered != self.sent[s] - self.cut_sent[s] {
                    return Err(format!(
                        "no loss: member {m} delivered {delivered} of the {} messages of sender {s}, which stayed",
                        self.sent[s]
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every member's positions, for a liveness failure.
    fn positions(&self) -> String {
        let each: Vec<String> = self
            .agents
            .iter()
            .enumerate()
            .filter_map(|(m, a)| a.as_ref().map(|a| (m, a)))
            .map(|(m, a)| {
                let p = a.group.core().positions();
                let c = &a.group.core().counters().values;
                format!(
                    "member {m} (view {}): published {} next index {} received {:?} frontier {} stable {} delivered {} \
                     (sent {} nulls {} in {} runs, backpressure {})",
                    a.group.core().view(),
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

    /// The end of the run: the checker's end-of-run properties (no gaps,
    /// when the membership never changed), then liveness.
    fn final_checks(&mut self) -> Result<(), SimFailure> {
        let all_running = self
            .ends
            .iter()
            .all(|e| matches!(e, MemberEnd::Running | MemberEnd::NotStarted));
        let rejoiners = self.restart.as_ref().is_some_and(|r| !r.report.rejoined.is_empty());
        let static_run = all_running && self.plan.joiner.is_none() && !rejoiners && !self.checker.membership_changed();
        let expected: Option<BTreeMap<usize, u64>> = static_run.then(|| {
            (0..self.spec.members)
                .filter(|m| self.ends[*m] == MemberEnd::Running && self.senders[*m].is_some())
                .map(|m| (m, self.sent[m]))
                .collect()
        });
        if let Some(r) = &self.restart {
            r.check_all_replayed(&self.ends).map_err(|v| self.fail(v))?;
        }
        if let Err(mut v) = self.checker.finish(expected.as_ref()) {
            if v.property == super::no_gaps::PROPERTY {
                v.detail = format!(
                    "{} after {} drain steps; {}",
                    v.detail,
                    self.plan.drain_steps_max,
                    self.positions()
                );
            }
            return Err(self.fail(v));
        }
        if static_run {
            return Ok(());
        }
        self.quiescent().map_err(|why| {
            self.fail(Violation::new(
                "liveness",
                format!(
                    "{} drain steps after the last fault the survivors have not settled: {why}; {}",
                    self.plan.drain_steps_max,
                    self.positions()
                ),
            ))
        })
    }
}
