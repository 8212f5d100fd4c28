//! Many seeds of the simulator (the real `GroupCore` of every member over
//! the deterministic sim fabric), reproducibility of a seed, and proof that
//! the checkers catch a broken run.

use std::collections::BTreeMap;

use spindle_fabric::sim::Sabotage;
use spindle_group::invariants::simulation::{self, FaultClass, MemberEnd, SimReport, SimSpec};
use spindle_group::invariants::{self, Logs};

/// Seeds CI runs on every `cargo test` (the issue asks for at least 2,000).
const CI_SEEDS: u64 = 2_000;
const CI_STEPS: u64 = 300;

fn spec(seed: u64) -> SimSpec {
    // 2 to 5 members, every fault class drawn per seed.
    SimSpec::new(seed, 2 + (seed % 4) as usize, CI_STEPS, FaultClass::All)
}

fn describe(r: &SimReport) -> String {
    let f = r.failure.as_ref().expect("a failure");
    format!(
        "seed {} step {}: {} violated: {}\n  plan: {}\n  replay: {} --trace",
        r.spec.seed,
        f.step,
        f.property,
        f.detail,
        r.plan.summary(),
        r.spec.command_line()
    )
}

#[test]
fn two_thousand_seeds_hold_every_invariant() {
    let (mut lost, mut complete, mut crashed, mut stopped, mut delivered) = (0, 0, 0, 0, 0u64);
    let mut went_on = 0;
    let (mut persistent, mut persistent_went_on, mut persistent_delivered) = (0, 0, 0u64);
    let (mut large_runs, mut large_sent, mut large_cut) = (0, 0u64, 0u64);
    let (mut in_place_runs, mut in_place_sent) = (0, 0u64);
    let (mut compacting_runs, mut compactions) = (0, 0u64);
    let mut restarts = Restarts::default();
    let mut failures = Vec::new();
    for seed in 0..CI_SEEDS {
        let r = simulation::run(&spec(seed));
        if r.failure.is_some() {
            failures.push(describe(&r));
            continue;
        }
        delivered += r.delivered.iter().sum::<u64>();
        let view_changed = r.logs.values().any(|log| log.iter().any(|e| e.view > 0));
        if view_changed {
            went_on += 1;
        }
        if r.plan.mode == spindle_group::DeliveryMode::Persistent {
            persistent += 1;
            persistent_went_on += view_changed as u64;
            persistent_delivered += r.delivered.iter().sum::<u64>();
        }
        large_runs += (r.plan.large_per_mille > 0) as u64;
        large_sent += r.large_sent;
        large_cut += r.large_cut;
        if r.plan.large_per_mille > 0 && r.plan.large_in_place_members != 0 {
            in_place_runs += 1;
            in_place_sent += r.large_sent;
        }
        compacting_runs += (r.plan.compact_log_bytes > 0) as u64;
        compactions += r.log_compactions;
        restarts.add(&r);
        crashed += r.ends.iter().filter(|e| **e == MemberEnd::Crashed).count();
        stopped += r.ends.iter().filter(|e| matches!(e, MemberEnd::Stopped(_))).count();
        if r.lost_members() > 0 {
            lost += 1;
        } else {
            complete += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CI_SEEDS} seeds broke an invariant:\n{}",
        failures.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    // The seeds must exercise what they claim to: faults that stop the
    // static group, and runs that deliver everything.
    assert!(lost > CI_SEEDS / 10, "only {lost} runs lost a member");
    assert!(complete > CI_SEEDS / 4, "only {complete} runs ran to completion");
    assert!(crashed > 0 && stopped > 0, "crashed {crashed}, stopped {stopped}");
    assert!(delivered > CI_SEEDS * 50, "only {delivered} deliveries checked");
    // Membership: survivors of crashes, partitions, joins and leaves went
    // on delivering in a later view.
    assert!(
        went_on > CI_SEEDS / 10,
        "only {went_on} runs delivered after a view change"
    );
    // Persistent mode is drawn (a third of the ordered plans), delivers,
    // and goes through view changes ("persisted before delivered" is
    // checked at every delivery).
    assert!(persistent > CI_SEEDS / 10, "only {persistent} persistent runs");
    assert!(
        persistent_delivered > persistent * 20,
        "persistent runs delivered only {persistent_delivered}"
    );
    assert!(
        persistent_went_on > persistent / 20,
        "only {persistent_went_on} persistent runs changed views"
    );
    // Large messages are drawn (a third of the plans whose slots carry
    // fragments), delivered whole (integrity checks their bytes), and some
    // are cut by a view change (no loss allows only those, said to their
    // sender).
    assert!(large_runs > CI_SEEDS / 10, "only {large_runs} runs with large messages");
    assert!(large_sent > large_runs * 5, "only {large_sent} large messages sent");
    assert!(large_cut > 0, "no large message was cut by a view change");
    // Half of those runs have members that take them in place, fragment
    // by fragment (their application checks the fragments continue each
    // other and hands the checker the whole message).
    assert!(
        in_place_runs > large_runs / 4 && in_place_sent > in_place_runs * 5,
        "only {in_place_runs} of {large_runs} runs with large messages took them in place ({in_place_sent} sent)"
    );
    // Half the persistent plans compact their logs; every compaction is
    // checked (its snapshot holds exactly the deliveries before it, and
    // everything delivered after it is in the log).
    assert!(
        compacting_runs > persistent / 4,
        "only {compacting_runs} of {persistent} persistent runs compact"
    );
    assert!(
        compactions > compacting_runs,
        "only {compactions} compactions in {compacting_runs} runs"
    );
    // Half the persistent plans kill every member at once and restart
    // them from their logs; every restart is checked (nothing delivered
    // lost, nothing invented, the same history everywhere).
    restarts.check(persistent);
    eprintln!(
        "{CI_SEEDS} seeds: {persistent} persistent runs, {compacting_runs} compacting, {compactions} compactions checked; {restarts:?}"
    );
}

/// What the total failures of a set of seeds exercised.
#[derive(Debug, Default)]
struct Restarts {
    runs: u64,
    /// Restarts that brought a history back (the logs were not empty).
    with_history: u64,
    delivered_before: u64,
    history_messages: u64,
    snapshots_restored: u64,
    torn_tails_dropped: u64,
    members_excluded: u64,
    /// Members left out that joined the restarted group afresh, and
    /// those of them that were admitted and delivered there.
    members_rejoined: u64,
    rejoined_delivered: u64,
    /// Restarted groups that delivered new messages after the restart.
    went_on: u64,
}

impl Restarts {
    fn add(&mut self, r: &SimReport) {
        let Some(t) = &r.restart else { return };
        self.runs += 1;
        self.with_history += (t.first_view > 0) as u64;
        self.delivered_before += t.delivered_before;
        self.history_messages += t.history_messages;
        self.snapshots_restored += t.snapshots_restored;
        self.torn_tails_dropped += t.torn_tails_dropped;
        self.members_excluded += t.excluded.len() as u64;
        self.members_rejoined += t.rejoined.len() as u64;
        self.rejoined_delivered += t
            .rejoined
            .iter()
            .filter(|m| r.logs[m].iter().any(|e| e.view > t.first_view))
            .count() as u64;
        self.went_on += r
            .logs
            .values()
            .any(|l| l.iter().any(|e| e.view >= t.first_view && t.first_view > 0)) as u64;
    }

    fn check(&self, persistent: u64) {
        assert!(
            self.runs > persistent / 4,
            "only {} of {persistent} persistent runs restarted",
            self.runs
        );
        assert!(self.with_history > self.runs / 2, "{self:?}");
        assert!(self.delivered_before > self.runs * 10, "{self:?}");
        assert!(self.history_messages >= self.delivered_before / 2, "{self:?}");
        assert!(self.snapshots_restored > 0 && self.torn_tails_dropped > 0, "{self:?}");
        assert!(self.members_excluded > 0, "{self:?}");
        assert!(self.members_rejoined > 0 && self.rejoined_delivered > 0, "{self:?}");
        assert!(self.went_on > self.runs / 4, "{self:?}");
    }
}

#[test]
fn a_seed_reproduces_exactly() {
    for seed in [3, 17, 1234] {
        let mut s = spec(seed);
        s.trace_events_max = 100_000;
        let (a, b) = (simulation::run(&s), simulation::run(&s));
        assert!(a.events > 100, "seed {seed}: a real run");
        assert_eq!(a.trace, b.trace, "seed {seed}: same trace");
        assert_eq!(a.trace_digest, b.trace_digest);
        assert_eq!(
            (a.steps_run, a.sent, &a.delivered, &a.ends),
            (b.steps_run, b.sent, &b.delivered, &b.ends)
        );
        assert_eq!(a.logs, b.logs, "seed {seed}: same deliveries");
        let other = simulation::run(&spec(seed + 1));
        assert_ne!(
            a.trace_digest,
            other.trace_digest,
            "seeds {seed} and {} differ",
            seed + 1
        );
    }
}

#[test]
fn a_broken_fabric_is_caught_and_the_failure_replays() {
    for sabotage in [Sabotage::ReorderPushes, Sabotage::CorruptBytes] {
        let failed = (0..100)
            .map(|seed| {
                let mut s = spec(seed);
                s.sabotage = Some(sabotage);
                simulation::run(&s)
            })
            .find(|r| r.failure.is_some())
            .unwrap_or_else(|| panic!("{sabotage:?}: no seed of 100 was caught"));
        let again = simulation::run(&failed.spec);
        assert_eq!(
            again.failure, failed.failure,
            "{sabotage:?}: the failure replays from its seed"
        );
        assert_eq!(again.trace, failed.trace);
        assert!(failed.spec.command_line().contains("--sabotage"));
    }
}

/// A total failure on disks that lose a quarter of what they synced (they
/// acknowledged fdatasyncs they did not do): the restart's checks catch
/// the delivered messages that are gone, and the failure replays.
#[test]
fn a_lying_disk_is_caught_at_the_restart() {
    let (mut restarts, mut caught) = (0, 0);
    for seed in 0..400 {
        let s = spec(seed);
        let mut plan = simulation::SimPlan::draw(&s);
        if plan.restart_at.is_none() {
            continue;
        }
        plan.restart_disk_lies = true;
        restarts += 1;
        let r = simulation::run_plan(&s, plan.clone());
        let Some(f) = &r.failure else { continue };
        // What a lying disk breaks: delivered messages are gone, or the
        // logs no longer agree on a restart at all.
        assert!(
            [
                "no loss of delivered messages",
                "restart after a total failure",
                "liveness",
                "total order"
            ]
            .contains(&f.property.as_str()),
            "seed {seed}: {}: {}",
            f.property,
            f.detail
        );
        caught += (f.property == "no loss of delivered messages") as u64;
        let again = simulation::run_plan(&s, plan);
        assert_eq!(again.failure, r.failure, "seed {seed}: the failure replays");
    }
    assert!(restarts > 10, "only {restarts} plans restart");
    assert!(
        caught > restarts / 4,
        "the lost messages were caught in only {caught} of {restarts} restarts"
    );
    eprintln!("lying disks: {caught} of {restarts} restarts caught losing delivered messages");
}

/// The log checkers catch a deliberately corrupted log taken from a real run.
#[test]
fn a_corrupted_delivery_log_is_caught() {
    let mut s = SimSpec::new(5, 3, 300, FaultClass::None);
    s.trace_events_max = 0;
    let r = simulation::run(&s);
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let logs = r.logs.clone();
    let senders: BTreeMap<usize, u64> = {
        let mut counts = BTreeMap::new();
        for e in &logs[&0] {
            *counts.entry(e.sender).or_default() += 1;
        }
        counts
    };
    assert!(logs[&0].len() >= 4, "the run delivered enough to corrupt");
    invariants::check_all(&logs, &senders, true).expect("the real log passes");
    let corrupt = |f: &dyn Fn(&mut Logs)| {
        let mut bad = logs.clone();
        f(&mut bad);
        invariants::check_all(&bad, &senders, true).unwrap_err().property
    };
    assert_eq!(
        corrupt(&|l| {
            let first = l[&1][0].clone();
            l.get_mut(&1).unwrap().push(first);
        }),
        "no duplication"
    );
    assert_eq!(
        corrupt(&|l| l.get_mut(&2).unwrap()[1].xxh3 = "0".repeat(16)),
        "integrity"
    );
    assert_eq!(
        corrupt(&|l| {
            l.get_mut(&1).unwrap().pop();
        }),
        "no gaps"
    );
    let swapped = corrupt(&|l| l.get_mut(&0).unwrap().swap(0, 1));
    assert!(swapped == "total order" || swapped == "per-sender FIFO", "{swapped}");
}
