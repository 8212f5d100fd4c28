//! [`Group`]: one member of a running group, with its application.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use spindle_fabric::doorbell::Doorbell;
use spindle_group::{Delivery, FragmentDelivery, Sender, Upcalls, View};
use spindle_runtime::{Agent, AgentRunner, ThreadingMode};

use crate::builder::GroupBuilder;
use crate::transport::AnyFabric;
use crate::Error;

/// A delivery closure, boxed.
pub type DeliverFn = Box<dyn FnMut(&Delivery<'_>) + Send>;
/// A view-change closure, boxed.
pub type ViewChangeFn = Box<dyn FnMut(&View) + Send>;
/// A query-answering closure, boxed (see [`Callbacks::with_query`]).
pub type QueryFn = Box<dyn FnMut(&[u8], &mut Vec<u8>) -> Result<(), String> + Send>;
/// A closure taking large messages fragment by fragment, boxed (see
/// [`GroupBuilder::on_large_fragment`]).
pub type FragmentFn = Box<dyn FnMut(&FragmentDelivery<'_>) + Send>;
/// A closure told of a large message delivered nowhere, boxed (see
/// [`GroupBuilder::on_large_message_cut`]): `(view, sender_rank,
/// message_id, len_bytes)`.
pub type LargeCutFn = Box<dyn FnMut(u64, usize, u64, u64) + Send>;

/// The application a builder makes from `on_deliver` / `on_view_change`
/// (either may be absent: a member that only sends).
#[derive(Default)]
pub struct Callbacks {
    pub(crate) deliver: Option<DeliverFn>,
    pub(crate) view_change: Option<ViewChangeFn>,
    pub(crate) query: Option<QueryFn>,
    pub(crate) large_fragment: Option<FragmentFn>,
    pub(crate) large_cut: Option<LargeCutFn>,
}

impl Callbacks {
    /// An application that calls `f` with every delivered message (for
    /// `join_sharded`, which makes one per shard).
    pub fn delivering(f: impl FnMut(&Delivery<'_>) + Send + 'static) -> Callbacks {
        Callbacks {
            deliver: Some(Box::new(f)),
            ..Callbacks::default()
        }
    }

    /// Also answer point-to-point queries from other members with `f`
    /// (`f(request, reply)` fills `reply`, or says why it does not
    /// answer; see [`crate::Sharded::query`]).
    pub fn with_query(
        mut self,
        f: impl FnMut(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + 'static,
    ) -> Callbacks {
        self.query = Some(Box::new(f));
        self
    }

    /// Also call `f` with every view installed.
    pub fn with_view_change(mut self, f: impl FnMut(&View) + Send + 'static) -> Callbacks {
        self.view_change = Some(Box::new(f));
        self
    }
}

impl Upcalls for Callbacks {
    #[inline]
    fn deliver(&mut self, d: &Delivery<'_>) {
        if let Some(f) = &mut self.deliver {
            f(d)
        }
    }
    fn view_installed(&mut self, view: &View) {
        if let Some(f) = &mut self.view_change {
            f(view)
        }
    }
    fn takes_fragments(&self) -> bool {
        self.large_fragment.is_some()
    }
    #[inline]
    fn deliver_fragment(&mut self, fragment: &FragmentDelivery<'_>) {
        if let Some(f) = &mut self.large_fragment {
            f(fragment)
        }
    }
    fn large_message_cut(&mut self, view: u64, sender_rank: usize, message_id: u64, len_bytes: u64) {
        if let Some(f) = &mut self.large_cut {
            f(view, sender_rank, message_id, len_bytes)
        }
    }
    fn query(&mut self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), String> {
        match &mut self.query {
            Some(f) => f(request, reply),
            None => Err("this member answers no queries (its Callbacks have no with_query)".into()),
        }
    }
}

/// One member of a group and its application `A` (the upcalls: see
/// [`Upcalls`]). Made by [`Group::builder`] … `.join()`.
///
/// Driving: in invoker mode (as returned) the application calls
/// [`Group::poll`] (never blocks) or [`Group::poll_or_idle`] (blocks at
/// most the idle strategy's park time, 1 ms by default) in its own loop,
/// or [`Group::run_until`]; [`Group::spawn`] moves it onto a progress
/// thread instead. Sending never waits for the progress loop: a full
/// window returns [`crate::SendError::WouldBlock`].
pub struct Group<A = Callbacks> {
    inner: spindle_group::Group<AnyFabric>,
    app: A,
    sender: Option<Sender<AnyFabric>>,
}

impl Group {
    /// The one way in: a builder for group `name` (see [`GroupBuilder`]).
    pub fn builder(name: &str) -> GroupBuilder {
        GroupBuilder::new(name)
    }
}

impl<A: Upcalls> Group<A> {
    pub(crate) fn new(inner: spindle_group::Group<AnyFabric>, app: A) -> Group<A> {
        let sender = inner.sender();
        Group { inner, app, sender }
    }

    /// One progress pass: send what was committed, receive, deliver what
    /// is stable, run the membership protocol. Never blocks; returns how
    /// much work it did (0: nothing to do).
    #[inline]
    pub fn poll(&mut self) -> Result<u32, Error> {
        Ok(self.inner.poll(&mut self.app)?)
    }

    /// [`Group::poll`], then, if the pass found nothing, the idle strategy
    /// (spin, yield, then park on the doorbell for at most its park time).
    #[inline]
    pub fn poll_or_idle(&mut self) -> Result<u32, Error> {
        Ok(self.inner.poll_or_idle(&mut self.app)?)
    }

    /// Poll (with the idle strategy) until `done(app)` holds; fails with
    /// [`Error::Timeout`] after `timeout`.
    pub fn run_until(&mut self, timeout: Duration, mut done: impl FnMut(&A) -> bool) -> Result<(), Error> {
        let started = Instant::now();
        while !done(&self.app) {
            self.poll_or_idle()?;
            if started.elapsed() > timeout {
                return Err(Error::Timeout {
                    waiting_for: "the condition of run_until".into(),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
        }
        Ok(())
    }

    /// Multicast `payload` (copied into a slot of this member's ring; for
    /// zero-copy, reserve a slot through [`Group::sender`]). Never waits:
    /// a full window is [`crate::SendError::WouldBlock`]; poll and retry.
    pub fn send(&self, payload: &[u8]) -> Result<(), Error> {
        let sender = self.sender.as_ref().ok_or(crate::SendError::NotASender {
            rank: self.inner.my_rank(),
        })?;
        Ok(sender.send(payload)?)
    }

    /// Multicast `message` of any length up to the group's
    /// `large_message_max_bytes` (above a slot it goes as fragments, one
    /// slot each, and every member delivers it whole, as one payload, in
    /// the total order). Returns once every fragment is in the window,
    /// running [`Group::poll`] (deliveries to the application) while the
    /// window is full. A view change in the middle cuts the message:
    /// every member is told with `Upcalls::large_message_cut` and nobody
    /// delivers it; send it again. For the non-blocking form, see
    /// [`crate::LargeSend`] through [`Group::sender`].
    pub fn send_large(&mut self, message: &[u8]) -> Result<(), Error> {
        Ok(self.inner.send_large(message, &mut self.app)?)
    }

    /// A sending handle (clone it into other threads), if this member sends.
    pub fn sender(&self) -> Option<Sender<AnyFabric>> {
        self.sender.clone()
    }

    /// This member's rank.
    pub fn rank(&self) -> usize {
        self.inner.my_rank()
    }

    /// The current view.
    pub fn view(&self) -> View {
        self.inner.view()
    }

    /// The application.
    pub fn app(&self) -> &A {
        &self.app
    }

    /// The application, mutably.
    pub fn app_mut(&mut self) -> &mut A {
        &mut self.app
    }

    /// Pause (or resume) receiving and delivering while heartbeats and
    /// membership go on: back-pressure from an application that cannot
    /// take more (the senders' windows fill; nothing is dropped).
    pub fn pause_receive(&mut self, paused: bool) {
        self.inner.pause_receive(paused);
    }

    /// Persistent mode: compact this member's log to the application's
    /// snapshot at the next poll that can (see
    /// [`spindle_group::Group::compact_log`]; the builder's
    /// [`GroupBuilder::compact_log_bytes`] does it every so many bytes).
    pub fn compact_log(&mut self) -> Result<(), Error> {
        Ok(self.inner.compact_log()?)
    }

    /// The group layer's member, mutably (within this crate).
    pub(crate) fn inner_mut(&mut self) -> &mut spindle_group::Group<AnyFabric> {
        &mut self.inner
    }

    /// The lower layer's member (for the counters and positions).
    pub fn inner(&self) -> &spindle_group::Group<AnyFabric> {
        &self.inner
    }

    /// Leave while the others go on: they install a view without this
    /// member (no suspicion timeout). Deliveries up to the old view's end
    /// still reach the application. Needs membership on (the default);
    /// a static group ends with [`Group::finish_together`].
    pub fn leave(mut self, timeout: Duration) -> Result<A, Error> {
        self.inner.leave(&mut self.app, timeout)?;
        Ok(self.app)
    }

    /// End the group together: every member calls it when it is done
    /// sending; it returns once all have (delivering meanwhile), so no
    /// member mistakes another's exit for a crash.
    pub fn finish_together(mut self, timeout: Duration) -> Result<A, Error> {
        self.inner.finish_together(&mut self.app, timeout)?;
        Ok(self.app)
    }
}

impl<A: Upcalls + Send + 'static> Group<A> {
    /// Run the protocol on a progress thread of its own (dedicated mode):
    /// the application's upcalls run there.
    pub fn spawn(self) -> RunningGroup<A> {
        let idle = self.inner.config().idle;
        let app = Arc::new(Mutex::new(self.app));
        let sender = self.sender;
        let agent = GroupAgent {
            group: self.inner,
            app: app.clone(),
        };
        RunningGroup {
            runner: AgentRunner::start(ThreadingMode::Dedicated, vec![agent], idle),
            app,
            sender,
        }
    }
}

/// A group on its own progress thread.
pub struct RunningGroup<A: Upcalls + Send + 'static> {
    runner: AgentRunner<GroupAgent<A>>,
    app: Arc<Mutex<A>>,
    sender: Option<Sender<AnyFabric>>,
}

impl<A: Upcalls + Send + 'static> RunningGroup<A> {
    /// A sending handle, if this member sends.
    pub fn sender(&self) -> Option<Sender<AnyFabric>> {
        self.sender.clone()
    }

    /// The application, locked (the progress thread waits meanwhile: keep
    /// it short).
    pub fn app(&self) -> MutexGuard<'_, A> {
        self.app.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the progress thread has stopped with an error (see `stop`).
    pub fn has_failed(&self) -> bool {
        self.runner.any_finished()
    }

    /// Stop the progress thread and get the member back in invoker mode,
    /// or the error that stopped it.
    pub fn stop(self) -> Result<Group<A>, Error> {
        let mut agents = self.runner.stop().map_err(Error::from)?;
        let agent = agents
            .pop()
            .ok_or_else(|| Error::Thread("the progress thread returned no group".into()))?;
        drop(agent.app);
        let app = Arc::try_unwrap(self.app)
            .map_err(|_| Error::Thread("the application is still shared".into()))?
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(Group {
            inner: agent.group,
            app,
            sender: self.sender,
        })
    }
}

/// The progress thread's agent: one pass per `do_work`, the application
/// locked once per pass (never per message).
struct GroupAgent<A> {
    group: spindle_group::Group<AnyFabric>,
    app: Arc<Mutex<A>>,
}

impl<A: Upcalls + Send + 'static> Agent for GroupAgent<A> {
    type Error = spindle_group::GroupError;
    fn do_work(&mut self, _now_ns: u64) -> Result<u32, Self::Error> {
        let mut app = self.app.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.group.poll(&mut *app)
    }
    fn has_work(&self) -> bool {
        self.group.has_work()
    }
    fn doorbell(&self) -> &dyn Doorbell {
        self.group.doorbell()
    }
    fn record_idle(&mut self, parks: u64, yields: u64) {
        self.group.record_idle(parks, yields);
    }
    fn name(&self) -> String {
        format!("{}#{}", self.group.config().name, self.group.my_rank())
    }
}
