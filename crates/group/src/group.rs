//! [`Group`]: the application's handle on one member of a static group.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_fabric::doorbell::Doorbell;
use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::Fabric;
use spindle_runtime::idle::SYSCALL_PASS_SPINS_MAX;
use spindle_runtime::{monotonic_coarse_ns, Agent, AgentRunner, IdleStrategy, Idler, ThreadingMode};

use crate::config::{DeliveryMode, GroupConfig};
use crate::core::GroupCore;
use crate::layout::SmcLayout;
use crate::membership::{Upcalls, View};
use crate::persist::{self, PersistLog};
use crate::restart;
use crate::sender::Sender;
use crate::{GroupError, SendError};

/// One member of a group. In invoker mode the application drives it with
/// [`Group::poll`]; [`Group::spawn`] moves it onto a progress thread.
///
/// ```no_run
/// use spindle_group::{Group, GroupConfig};
/// let mut group = Group::join_shm(GroupConfig::new("doc-group", 1), 0).unwrap();
/// group.sender().unwrap().send(b"hello").unwrap();
/// let mut got = Vec::new();
/// while got.is_empty() {
///     group.poll(&mut |d: &spindle_group::Delivery<'_>| got.push(d.payload.to_vec())).unwrap();
/// }
/// assert_eq!(got[0], b"hello");
/// ```
pub struct Group<F: Fabric> {
    core: GroupCore<F>,
    idler: Idler,
    config: GroupConfig,
}

impl Group<ShmFabric> {
    /// Join group `config.name` on this host's shared memory as member
    /// `rank`, waiting (up to `config.join_timeout`) for every member.
    pub fn join_shm(config: GroupConfig, rank: usize) -> Result<Group<ShmFabric>, GroupError> {
        let fabric = Arc::new(Group::open_shm(&config, rank)?);
        Group::join(fabric, config)
    }

    /// Join a running group on this host's shared memory as rank `rank`
    /// (a rank outside the current view: never started, or its member
    /// died or left), with `app` receiving the state snapshot.
    pub fn join_running_shm<U: Upcalls + ?Sized>(
        config: GroupConfig,
        rank: usize,
        app: &mut U,
    ) -> Result<Group<ShmFabric>, GroupError> {
        let fabric = Arc::new(Group::open_shm(&config, rank)?);
        Group::join_running(fabric, config, app)
    }

    fn open_shm(config: &GroupConfig, rank: usize) -> Result<ShmFabric, GroupError> {
        config.validate()?;
        let layout = SmcLayout::new(config);
        let mut options = ShmOptions::new(
            &config.name,
            config.members,
            layout.row.row_len_bytes(),
            layout.row.tag(),
        );
        options.layout_description = layout.row.summary();
        Ok(ShmFabric::open(&options, rank)?)
    }
}

impl<F: Fabric> Group<F> {
    fn from_parts(core: GroupCore<F>, config: GroupConfig) -> Group<F> {
        Group {
            idler: idler_for(core.fabric().as_ref(), config.idle),
            core,
            config,
        }
    }

    /// Join over an opened fabric as a member of the first view, waiting
    /// for every member of the first view to join.
    ///
    /// Persistent mode: a start over logs restarts the group from them
    /// (see [`crate::restart`]). A member the restart leaves out sets its
    /// log aside and comes back *joining* the restarted group: it is
    /// admitted by later polls ([`Group::is_joining`] turns false, and
    /// [`Group::wait_admitted`] polls until then; the `spindle` builder's
    /// `join()` does).
    pub fn join(fabric: Arc<F>, config: GroupConfig) -> Result<Group<F>, GroupError> {
        config.validate()?;
        let layout = SmcLayout::new(&config);
        let initial = config.initial_ranks();
        if !initial.contains(&fabric.member_rank()) {
            return Err(GroupError::Config(format!(
                "rank {} is not in initial_members {initial:?}: join a running group with join_running",
                fabric.member_rank()
            )));
        }
        let opened = open_log(&fabric, &config)?;
        wait_joined(fabric.as_ref(), &config, &initial)?;
        let Some((log, recovered)) = opened else {
            let core = GroupCore::new(fabric, &config, layout)?;
            return Ok(Group::from_parts(core, config));
        };
        // Persistent mode: every start compares the members' logs (see
        // `crate::restart`); a group whose logs are all empty starts anew.
        let initial_mask = initial.iter().fold(0u64, |m, r| m | 1 << r);
        let summary = recovered.summary(initial_mask);
        let summaries = restart::exchange(fabric.as_ref(), &layout, &summary, &initial, config.join_timeout).map_err(
            |e| match e {
                GroupError::JoinFailed { rank, reason, .. } => GroupError::JoinFailed {
                    rank,
                    group: config.name.clone(),
                    reason,
                },
                e => e,
            },
        )?;
        let (group, restarted) = Group::start_from_log(fabric, config, log, &recovered, &summaries)?;
        if let Some(line) = restarted {
            tracing_line(&line);
        }
        Ok(group)
    }

    /// Start a persistent member from its log, once every configured
    /// member's [`persist::LogSummary`] is known (`summaries`, by rank):
    /// [`Group::join`] exchanges them over the fabric; the simulator,
    /// which restarts every member of a group after a total failure in
    /// one thread, hands them over itself. Returns the group and, after a
    /// total failure, the line that says what this member restarted from
    /// (`None`: every log was empty, a first start).
    pub fn start_from_log(
        fabric: Arc<F>,
        config: GroupConfig,
        mut log: PersistLog,
        recovered: &persist::RecoveredLog,
        summaries: &[(usize, persist::LogSummary)],
    ) -> Result<(Group<F>, Option<String>), GroupError> {
        config.validate()?;
        let layout = SmcLayout::new(&config);
        let rank = fabric.member_rank();
        let initial_mask = config.initial_ranks().iter().fold(0u64, |m, r| m | 1 << r);
        let summary = recovered.summary(initial_mask);
        let plan = restart::plan(summaries).map_err(|e| GroupError::Persist {
            rank,
            reason: format!("restart after a total failure: {e}"),
        })?;
        let mut config = config;
        let mut restarted = None;
        let mut core = match plan {
            None => GroupCore::new(fabric, &config, layout)?,
            Some(plan) if plan.excluded(rank, &summary).is_some() => {
                // It cannot rebuild the state: its log is set aside (kept,
                // renamed) and it joins the restarted group afresh, with
                // an empty log and the state a member sends it.
                let why = plan.excluded(rank, &summary).expect("matched");
                if !config.membership {
                    // A static group admits no joiner: keep the log where
                    // it is and say so.
                    return Err(GroupError::Persist {
                        rank,
                        reason: format!(
                            "restart after a total failure: member {rank} does not take part: {why}; \
                             with membership off it cannot join the restarted group"
                        ),
                    });
                }
                let label = format!("set-aside-at-view-{}", plan.first_view);
                let (fresh, aside) = log.set_aside(rank, &label)?;
                log = fresh;
                let kept = aside.map_or(String::new(), |p| {
                    format!("its log was set aside as {}, and ", p.display())
                });
                restarted = Some(format!(
                    "spindle: member {rank}: does not take part in the restart after a total failure ({why}); \
                     {kept}it joins the restarted group (view {} on, members {:?}) with an empty log, \
                     from the state a member sends it",
                    plan.first_view,
                    spindle_fabric::PeerSet(plan.members).iter().collect::<Vec<_>>()
                ));
                config.initial_members = Some(spindle_fabric::PeerSet(plan.members).iter().collect());
                GroupCore::new_joiner_of_restarted(fabric, &config, layout, plan.first_view)?
            }
            Some(plan) => {
                let replay = restart::seal(&mut log, recovered, &summary, &plan)
                    .map_err(|reason| GroupError::Persist { rank, reason })?;
                let from_snapshot = match &replay.snapshot {
                    Some(s) => format!(
                        "the snapshot it was compacted to ({} B, view {} seq {}), then ",
                        s.len(),
                        replay.snapshot_at.0,
                        replay.snapshot_at.1
                    ),
                    None => String::new(),
                };
                restarted = Some(format!(
                    "spindle: member {rank}: restarted from its log: {from_snapshot}{} messages of views up to {} (view {} cut at seq {}); \
                     the group goes on in view {} with members {:?}",
                    replay.messages.len(),
                    plan.last_view,
                    plan.last_view,
                    plan.cut_seq,
                    plan.first_view,
                    spindle_fabric::PeerSet(plan.members).iter().collect::<Vec<_>>()
                ));
                config.initial_members = Some(spindle_fabric::PeerSet(plan.members).iter().collect());
                let mut core = GroupCore::new_restarted(fabric, &config, layout, plan.first_view)?;
                core.set_replay(replay);
                core
            }
        };
        core.attach_log(log);
        Ok((Group::from_parts(core, config), restarted))
    }

    /// [`Group::join`] with a log of the caller's (persistent mode): the
    /// simulator's in memory, or one a tool opened.
    pub fn join_with_log(fabric: Arc<F>, config: GroupConfig, log: PersistLog) -> Result<Group<F>, GroupError> {
        config.validate()?;
        let layout = SmcLayout::new(&config);
        let initial = config.initial_ranks();
        wait_joined(fabric.as_ref(), &config, &initial)?;
        let mut core = if initial.contains(&fabric.member_rank()) {
            GroupCore::new(fabric, &config, layout)?
        } else {
            GroupCore::new_joiner(fabric, &config, layout)?
        };
        core.attach_log(log);
        Ok(Group::from_parts(core, config))
    }

    /// Join a running group over an opened fabric (a rank outside the
    /// current view), waiting up to `join_timeout` to be admitted; `app`
    /// gets the state snapshot and the first view.
    pub fn join_running<U: Upcalls + ?Sized>(
        fabric: Arc<F>,
        config: GroupConfig,
        app: &mut U,
    ) -> Result<Group<F>, GroupError> {
        config.validate()?;
        let mut group = Group::start_join(fabric, config)?;
        group.wait_admitted(app)?;
        Ok(group)
    }

    /// Poll until this member, joining, is admitted to a view (at most the
    /// join timeout): after [`Group::start_join`], or after a
    /// [`Group::join`] of a persistent member that a restart left out
    /// (its log set aside, it joins afresh). Returns at once for a member
    /// that is not joining.
    pub fn wait_admitted<U: Upcalls + ?Sized>(&mut self, app: &mut U) -> Result<(), GroupError> {
        let started = Instant::now();
        while self.core.is_joining() {
            self.poll_or_idle(app)?;
            if started.elapsed() > self.config.join_timeout {
                return Err(GroupError::JoinFailed {
                    rank: self.core.my_rank(),
                    group: self.config.name.clone(),
                    reason: format!(
                        "not admitted within {} ms (is a majority of the group running?)",
                        self.config.join_timeout.as_millis()
                    ),
                });
            }
        }
        Ok(())
    }

    /// A sending handle, if this member is a sender.
    pub fn sender(&self) -> Option<Sender<F>> {
        self.core.ring.as_ref().map(|ring| {
            Sender::new(self.core.fabric().clone(), ring.clone(), self.core.layout.clone())
                .with_large_message_max(self.config.large_message_max_bytes)
        })
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }
    pub fn core(&self) -> &GroupCore<F> {
        &self.core
    }

    /// The protocol engine, mutable (tools and the simulator: its log).
    pub fn core_mut(&mut self) -> &mut GroupCore<F> {
        &mut self.core
    }

    /// Pause (or resume) receiving and delivering; see
    /// [`GroupCore::pause_receive`].
    pub fn pause_receive(&mut self, paused: bool) {
        self.core.pause_receive(paused);
    }
    pub fn my_rank(&self) -> usize {
        self.core.my_rank()
    }

    /// One progress pass: every upcall of the pass goes to `app`
    /// (deliveries, view changes, snapshots: see [`Upcalls`]; a delivery
    /// closure `|d: &Delivery<'_>| …` is an `Upcalls`). Never blocks: a
    /// pass does a bounded amount of work (at most one window per sender)
    /// and returns how much it did (0: nothing to do).
    #[inline]
    /// Send `message`, of any length up to the group's
    /// `large_message_max_bytes`, and return once every fragment is in the
    /// window (see [`Sender::send_large`]), running the progress loop
    /// (deliveries to `app`) while the window is full. For a sender that
    /// drives its group from one thread; [`crate::LargeSend`] is the
    /// non-blocking form.
    pub fn send_large<U: Upcalls + ?Sized>(&mut self, message: &[u8], app: &mut U) -> Result<(), GroupError> {
        let sender = self.sender().ok_or(SendError::NotASender {
            rank: self.core.my_rank,
        })?;
        let mut tx = sender.send_large(message.len())?;
        while !tx.push(message)? {
            let work = self.poll(app)?;
            self.idle(work);
        }
        Ok(())
    }

    pub fn poll<U: Upcalls + ?Sized>(&mut self, app: &mut U) -> Result<u32, GroupError> {
        self.core.step(monotonic_coarse_ns(), app)
    }

    /// [`Group::poll`], then, if the pass found nothing to do, the idle
    /// strategy (`GroupConfig::idle`: spin, then yield, then park on the
    /// fabric's doorbell for at most the strategy's park time, 1 ms by
    /// default). Blocks for at most that park time.
    #[inline]
    pub fn poll_or_idle<U: Upcalls + ?Sized>(&mut self, app: &mut U) -> Result<u32, GroupError> {
        let work = self.core.step(monotonic_coarse_ns(), app)?;
        self.idle(work);
        Ok(work)
    }

    /// Ask to join a running group without waiting: the returned member
    /// is admitted by later polls ([`Group::is_joining`] turns false).
    pub fn start_join(fabric: Arc<F>, config: GroupConfig) -> Result<Group<F>, GroupError> {
        let rank = fabric.member_rank();
        let log = match open_log(&fabric, &config)? {
            Some((log, recovered)) if recovered.records.is_empty() => Some(log),
            Some((log, recovered)) => {
                // A joiner starts with an empty log (it gets the state
                // from the group): an earlier run's log is set aside,
                // renamed and kept, never deleted.
                let path = log.path().map(|p| p.display().to_string()).unwrap_or_default();
                let (fresh, aside) = log.set_aside(rank, "set-aside-at-join")?;
                tracing_line(&format!(
                    "spindle: member {rank}: log {path} held {} records of an earlier run; a joiner starts with an \
                     empty log and the state the group sends it: the old log is kept as {}",
                    recovered.records.len(),
                    aside.map(|p| p.display().to_string()).unwrap_or_default()
                ));
                Some(fresh)
            }
            None => None,
        };
        Group::start_join_with_log(fabric, config, log)
    }

    /// [`Group::start_join`] with a log of the caller's (persistent mode;
    /// see [`Group::join_with_log`]).
    pub fn start_join_with_log(
        fabric: Arc<F>,
        config: GroupConfig,
        log: Option<PersistLog>,
    ) -> Result<Group<F>, GroupError> {
        config.validate()?;
        let layout = SmcLayout::new(&config);
        let mut core = GroupCore::new_joiner(fabric, &config, layout)?;
        if let Some(log) = log {
            core.attach_log(log);
        }
        Ok(Group::from_parts(core, config))
    }

    /// Persistent mode: compact this member's log to the application's
    /// snapshot at the next poll that can (between deliveries, outside a
    /// view change, with no large message half delivered): everything
    /// before that point is replaced by the snapshot, which a restart
    /// restores before replaying the rest (see [`crate::persist`]).
    /// `GroupConfig::compact_log_bytes` does it every so many bytes; the
    /// sync thread rewrites the file, so polls go on meanwhile. The
    /// upcalls must take snapshots ([`Upcalls::takes_snapshots`]).
    pub fn compact_log(&mut self) -> Result<(), GroupError> {
        self.core.request_log_compaction()
    }

    /// Whether this member is still waiting to be admitted.
    pub fn is_joining(&self) -> bool {
        self.core.is_joining()
    }

    /// Follow an outer group's view for failures (see
    /// [`GroupCore::follow_view`]).
    pub fn follow_view(&mut self, left_out: Option<&[usize]>) {
        self.core.follow_view(left_out)
    }

    /// The first half of [`Group::leave`], without waiting: ask for a view
    /// without this member; later polls run the protocol until
    /// [`Group::has_left`].
    pub fn start_leave(&mut self) -> Result<(), GroupError> {
        self.core.request_leave()
    }

    /// Whether this member has left the group.
    pub fn has_left(&self) -> bool {
        self.core.has_left()
    }

    /// Whether a pass would find work (cheap: the doorbell's check before
    /// a progress loop parks).
    pub fn has_work(&self) -> bool {
        self.core.has_work()
    }

    /// The doorbell this member's peers ring when they push to it.
    pub fn doorbell(&self) -> &dyn Doorbell {
        self.core.fabric().doorbell()
    }

    /// Count a progress loop's parks and yields so far in the live
    /// counters (for loops that idle on their own, not with [`Group::idle`]).
    pub fn record_idle(&mut self, parks: u64, yields: u64) {
        self.core.record_idle(parks, yields);
    }

    /// The current view.
    pub fn view(&self) -> View {
        self.core.current_view()
    }

    /// Leave the group while the others go on: ask for a view without this
    /// member and run the protocol until it is installed (deliveries up to
    /// the old view's end go to `app`). Needs membership on
    /// (`GroupConfig::membership`); in a static group use
    /// [`Group::finish_together`]. Fails with [`GroupError::Timeout`] after
    /// `timeout`.
    pub fn leave<U: Upcalls + ?Sized>(&mut self, app: &mut U, timeout: Duration) -> Result<(), GroupError> {
        self.core.request_leave()?;
        let started = Instant::now();
        while !self.core.has_left() {
            self.poll_or_idle(app)?;
            if started.elapsed() > timeout {
                return Err(GroupError::Timeout {
                    waiting_for: format!("the group to install a view without member {}", self.my_rank()),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
        }
        Ok(())
    }

    /// Apply the idle strategy after a pass of the application's own loop
    /// (`work`: what the pass and the application did; 0 backs off: spin,
    /// then yield, then park on the doorbell).
    #[inline]
    pub fn idle(&mut self, work: u32) {
        let core = &self.core;
        self.idler.idle(work, core.fabric().doorbell(), || core.has_work());
        if work == 0 {
            let (parks, yields) = (self.idler.parks, self.idler.yields);
            self.core.record_idle(parks, yields);
        }
    }

    /// End the group together: mark this member finished, then keep the
    /// protocol running (upcalls to `app`) until every member is finished,
    /// so nobody mistakes another's exit for a crash and no view change
    /// happens. Every member calls it once it is done sending. Fails with
    /// [`GroupError::Timeout`] after `timeout`.
    pub fn finish_together<U: Upcalls + ?Sized>(&mut self, app: &mut U, timeout: Duration) -> Result<(), GroupError> {
        self.core.set_finished()?;
        let started = Instant::now();
        while !self.core.all_finished() {
            self.poll_or_idle(app)?;
            if started.elapsed() > timeout {
                return Err(GroupError::Timeout {
                    waiting_for: "every member to finish".to_string(),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
        }
        self.core.flush_counters();
        Ok(())
    }

    /// Run the protocol on a progress thread (dedicated mode): every
    /// upcall goes to `app` on that thread (a delivery closure, or a
    /// [`crate::Replicated`] state machine, say).
    pub fn spawn<U: Upcalls + Send + 'static>(self, app: U) -> GroupThread<F> {
        let idle = self.config.idle;
        let agent = GroupAgent::new(self, app);
        GroupThread {
            runner: AgentRunner::start(ThreadingMode::Dedicated, vec![agent], idle),
        }
    }
}

type Handler = Box<dyn Upcalls + Send>;

/// The most idle passes a loop over `fabric` spins ([`Idler::cap_spins`]):
/// [`SYSCALL_PASS_SPINS_MAX`] where a pass makes system calls.
fn spins_max_for(fabric: &dyn Fabric) -> u32 {
    if fabric.receive_makes_system_calls() {
        SYSCALL_PASS_SPINS_MAX
    } else {
        u32::MAX
    }
}

/// The idler of a loop over `fabric`: `strategy`, with its spins capped
/// where a pass makes system calls ([`Idler::cap_spins`]).
fn idler_for(fabric: &dyn Fabric, strategy: IdleStrategy) -> Idler {
    let mut idler = Idler::new(strategy);
    idler.cap_spins(spins_max_for(fabric));
    idler
}

/// Wait until every rank of the first view has joined the fabric.
/// Persistent mode: open this member's log in `persist_dir`; its sync
/// thread rings the member's doorbell when the durable frontier moves.
fn open_log<F: Fabric>(
    fabric: &Arc<F>,
    config: &GroupConfig,
) -> Result<Option<(PersistLog, persist::RecoveredLog)>, GroupError> {
    if config.mode != DeliveryMode::Persistent {
        return Ok(None);
    }
    let rank = fabric.member_rank();
    let dir = config.persist_dir.as_ref().ok_or_else(|| {
        GroupError::Config("mode = persistent needs persist_dir (the directory for the members' logs)".into())
    })?;
    let path = persist::log_path(dir, &config.name, rank);
    let ring = Arc::clone(fabric);
    let (log, recovered) = PersistLog::open(&path, rank, Box::new(move || ring.doorbell().ring()))?;
    if let Some(d) = &recovered.dropped {
        eprintln!(
            "spindle: member {rank}: log {}: dropped {} bytes from offset {} ({}{}); kept beside it",
            path.display(),
            d.bytes,
            d.offset,
            d.reason,
            if d.valid_records_after {
                "; well-formed records follow it: the log is damaged inside, not only cut short"
            } else {
                ""
            }
        );
    }
    Ok(Some((log, recovered)))
}

/// One line on stderr for the person running the program (the group
/// layer has no logger of its own).
fn tracing_line(line: &str) {
    eprintln!("{line}");
}

fn wait_joined(fabric: &dyn Fabric, config: &GroupConfig, initial: &[usize]) -> Result<(), GroupError> {
    let want = initial.iter().fold(0u64, |m, r| m | 1 << r);
    let started = Instant::now();
    let mut sleep_us = 50u64;
    loop {
        let joined = fabric.joined().0;
        if joined & want == want {
            return Ok(());
        }
        if started.elapsed() >= config.join_timeout {
            return Err(spindle_fabric::FabricError::JoinTimeout {
                group: config.name.clone(),
                missing: spindle_fabric::PeerSet(want & !joined).iter().collect(),
                waited_ms: config.join_timeout.as_millis() as u64,
            }
            .into());
        }
        std::thread::sleep(Duration::from_micros(sleep_us));
        sleep_us = (sleep_us * 2).min(5_000);
    }
}

/// A group and its delivery handler as a runtime [`Agent`].
pub struct GroupAgent<F: Fabric> {
    pub group: Group<F>,
    handler: Handler,
}

impl<F: Fabric> GroupAgent<F> {
    /// An agent whose every upcall goes to `app` (a delivery closure is
    /// an [`Upcalls`] too).
    pub fn new<U: Upcalls + Send + 'static>(group: Group<F>, app: U) -> GroupAgent<F> {
        GroupAgent {
            group,
            handler: Box::new(app),
        }
    }
}

impl<F: Fabric> Agent for GroupAgent<F> {
    type Error = GroupError;
    fn do_work(&mut self, now_ns: u64) -> Result<u32, GroupError> {
        self.group.core.step(now_ns, &mut *self.handler)
    }
    fn has_work(&self) -> bool {
        self.group.core.has_work()
    }
    fn doorbell(&self) -> &dyn Doorbell {
        self.group.core.fabric().doorbell()
    }
    fn record_idle(&mut self, parks: u64, yields: u64) {
        self.group.core.record_idle(parks, yields);
    }
    fn spins_max(&self) -> u32 {
        spins_max_for(self.group.core.fabric().as_ref())
    }
    fn name(&self) -> String {
        format!("{}#{}", self.group.config.name, self.group.my_rank())
    }
}

/// A group running on its own progress thread.
pub struct GroupThread<F: Fabric> {
    runner: AgentRunner<GroupAgent<F>>,
}

impl<F: Fabric> GroupThread<F> {
    /// Whether the progress thread has stopped (it failed: see `stop`).
    pub fn has_failed(&self) -> bool {
        self.runner.any_finished()
    }

    /// Stop the thread and get the group back (invoker mode again), or the
    /// error that stopped it.
    pub fn stop(self) -> Result<Group<F>, GroupError> {
        let mut agents = self.runner.stop()?;
        Ok(agents.pop().expect("one agent").group)
    }
}
