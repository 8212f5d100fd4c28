//! Re-laying the shards out at every top-level view change
//! ([`GroupBuilder::join_sharded_elastic`]).
//!
//! The members run one more group beside their shards: the *top-level
//! group* `{group}.layout`, of every member, in which nobody sends. Its
//! views are the top-level views: a member that fails or leaves is
//! removed from it, a member that starts later joins it. At each of its
//! view changes every member lays the new view out with the layout
//! function, from the previous layout ([`LayoutKeeper`], a pure
//! function of the view sequence, so every member gets the same
//! layout without a message), and then:
//!
//! - a member laid into a shard it was not in joins that shard's group as
//!   a joiner: the shard's members admit it in a view change of their
//!   own, and its application starts from their snapshot (Derecho's state
//!   transfer, the group layer's join protocol). A join that fails is
//!   tried again ([`SHARD_JOIN_ATTEMPTS_MAX`] attempts in all, spaced by
//!   [`SHARD_JOIN_RETRY_DELAY`] × the attempts so far) while the layout
//!   still lays the member into the shard;
//! - a member laid out of a shard (a user layout function may move
//!   survivors) leaves that shard's group by dropping it;
//! - a departed member's shard groups remove it on their own (each runs
//!   the membership protocol).
//!
//! ```text
//!  top-level view 0: 0 1 2 3 4        view 1: 0 2 3 4 (1 failed)
//!  kv shard 0: {0, 1}                 kv shard 0: {0, 4}  4 joins kv.0, gets 0's state
//!  kv shard 1: {2, 3}   spare: 4      kv shard 1: {2, 3}  unchanged
//! ```
//!
//! On tcp and ofi each group listens on ports of its own
//! ([`offset_ports`]; on ofi, its control plane):
//! the top-level group on the members' addresses, shard `k` on the ports
//! `k + 1` higher.
//!
//! Every shard group is numbered by top-level rank (it has a row for
//! every member of the top-level group, and its first view is the
//! shard's members), so a member joins a shard under its own rank and
//! never takes over a departed member's row. A member that joins the
//! top-level group later gets the layout it needs with the top-level
//! group's state transfer ([`Layout::encode`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spindle_group::config::{DeliveryMode, SenderSet};
use spindle_group::subgroup::{self, Layout, LayoutError, LayoutFunction, StickyLayout, SubgroupSpec};
use spindle_group::{Delivery, GroupConfig, Upcalls, View};

use crate::builder::GroupBuilder;
use crate::group::Group;
use crate::sharded::{Shard, Sharded};
use crate::transport::{OfiTransport, TcpTransport, Transport};
use crate::Error;

/// Layouts computed and not yet applied: [`Sharded::poll`] takes them
/// after every pass of the top-level group, which installs at most a few
/// views per pass.
const FRESH_LAYOUTS_MAX: usize = 64;

/// The top-level group's application: it lays out every view it
/// installs, from the layout before.
pub(crate) struct LayoutKeeper {
    specs: Vec<SubgroupSpec>,
    function: Arc<dyn LayoutFunction>,
    members: usize,
    /// The newest layout (none: a joiner before its state transfer).
    layout: Option<Layout>,
    /// The layout a joiner was given with the state transfer.
    restored: Option<Layout>,
    /// Layouts computed at view changes, oldest first, not yet applied.
    fresh: VecDeque<Layout>,
    /// Why the newest view could not be laid out (too small), if so.
    inadequate: Option<LayoutError>,
}

impl Upcalls for LayoutKeeper {
    fn deliver(&mut self, _d: &Delivery<'_>) {}

    fn view_installed(&mut self, view: &View) {
        let Some(previous) = self.layout.as_ref() else {
            // A joiner gets its layout with the snapshot, before the view.
            return;
        };
        if view.id <= previous.view_id {
            return;
        }
        match subgroup::lay_out(&*self.function, &self.specs, view.id, &view.members, Some(previous)) {
            Ok(next) => {
                self.inadequate = None;
                // Sharded::poll takes every layout after each pass of the
                // top-level group, which installs one view at most.
                assert!(
                    self.fresh.len() < FRESH_LAYOUTS_MAX,
                    "layout agreement: {FRESH_LAYOUTS_MAX} layouts not yet applied (each must be, in sequence)"
                );
                self.fresh.push_back(next.clone());
                self.layout = Some(next);
            }
            Err(e) => {
                tracing::warn!(view = view.id, error = %e, "the top-level view cannot be laid out; the shards keep their members");
                self.inadequate = Some(e);
            }
        }
    }

    fn snapshot(&mut self, out: &mut Vec<u8>) {
        if let Some(layout) = &self.layout {
            layout.encode(out);
        }
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let layout = Layout::decode(snapshot, &self.specs, self.members)
            .map_err(|e| format!("the layout given by the top-level group: {e}"))?;
        self.restored = Some(layout.clone());
        self.layout = Some(layout);
        Ok(())
    }
}

/// A shard group this member is joining, on a thread of its own.
struct PendingJoin<U> {
    subgroup_index: usize,
    shard: usize,
    /// The shard's first view this attempt was started with.
    initial: Vec<usize>,
    /// Attempts at this join so far, this one included.
    attempts: u32,
    handle: JoinHandle<Result<Group<U>, Error>>,
}

/// A shard join that failed and is tried again once `due`.
struct RetryJoin {
    subgroup_index: usize,
    shard: usize,
    initial: Vec<usize>,
    attempts: u32,
    due: Instant,
}

/// Attempts at joining one shard's group before `Sharded::poll` returns
/// the error: a join can fail for a while and then succeed (a port still
/// held by a process that is going away, a shard member busy in a view
/// change past the join timeout).
const SHARD_JOIN_ATTEMPTS_MAX: u32 = 4;
/// The wait before attempt `n + 1` is `n` times this.
const SHARD_JOIN_RETRY_DELAY: Duration = Duration::from_millis(250);

/// How long `join_sharded_elastic` waits for its shard joins: every
/// attempt may take the join timeout, the waits between attempts add
/// up, and one more join timeout covers a joiner's top-level admission.
fn startup_join_budget(join_timeout: Duration) -> Duration {
    let waits: Duration = (1..SHARD_JOIN_ATTEMPTS_MAX).map(|n| SHARD_JOIN_RETRY_DELAY * n).sum();
    join_timeout * (SHARD_JOIN_ATTEMPTS_MAX + 1) + waits
}

/// Whether a failed shard join may succeed if tried again: not a setting
/// that is wrong, nor a thread that panicked.
fn join_may_succeed_later(e: &Error) -> bool {
    !matches!(e, Error::Config(_) | Error::File(_) | Error::Thread(_))
}

/// Starts joining shard `shard` of a subgroup on a thread, with the
/// shard's first view `initial`: made by `join_sharded_elastic`, which
/// holds the application maker, the configuration and the transport.
/// The third argument is the shard's place among every shard of every
/// subgroup ([`shard_place`]: its port offset on tcp).
type SpawnJoin<U> = Box<
    dyn FnMut(&SubgroupSpec, usize, usize, Vec<usize>) -> Result<JoinHandle<Result<Group<U>, Error>>, Error> + Send,
>;

/// Shard `s` of subgroup `g`'s place among every shard of every
/// subgroup, in the specification's order: `0..total shards`.
fn shard_place(specs: &[SubgroupSpec], g: usize, s: usize) -> usize {
    specs[..g].iter().map(|x| x.shards).sum::<usize>() + s
}

/// On tcp and ofi, the transport of the group at port offset `offset`
/// (0: the top-level group, `1 + shard_place`: a shard's): every member's
/// address (and the listen address) with its port `offset` higher (on
/// ofi, the control plane's; libfabric's endpoints get their addresses
/// through it). Shared memory as is.
fn offset_ports(transport: &Transport, offset: usize) -> Result<Transport, Error> {
    let shift = |a: std::net::SocketAddr| -> Result<std::net::SocketAddr, Error> {
        let port = usize::from(a.port()) + offset;
        let port = u16::try_from(port).map_err(|_| {
            Error::Config(format!(
                "address {a}: join_sharded_elastic on tcp needs ports {} to {port} free at it (one for the \
                 top-level group, one per shard), past the last port",
                a.port()
            ))
        })?;
        Ok(std::net::SocketAddr::new(a.ip(), port))
    };
    let shift_all = |tcp: &TcpTransport| -> Result<TcpTransport, Error> {
        let mut tcp = tcp.clone();
        tcp.members = tcp.members.iter().map(|a| shift(*a)).collect::<Result<_, _>>()?;
        tcp.listen = tcp.listen.map(shift).transpose()?;
        Ok(tcp)
    };
    match transport {
        Transport::Tcp(tcp) => Ok(Transport::Tcp(shift_all(tcp)?)),
        Transport::Ofi(ofi) => Ok(Transport::Ofi(OfiTransport {
            tcp: shift_all(&ofi.tcp)?,
            provider: ofi.provider.clone(),
        })),
        Transport::Shm => Ok(Transport::Shm),
    }
}

/// The tcp settings (on ofi, the control plane's) of `transport`.
fn tcp_of(transport: &Transport) -> Option<&TcpTransport> {
    match transport {
        Transport::Tcp(tcp) | Transport::Ofi(OfiTransport { tcp, .. }) => Some(tcp),
        Transport::Shm => None,
    }
}

/// What [`Sharded`] holds to re-lay out at run time.
pub(crate) struct Elastic<U> {
    control: Group<LayoutKeeper>,
    spawn_join: SpawnJoin<U>,
    pending: Vec<PendingJoin<U>>,
    /// Failed joins waiting to be tried again.
    retries: Vec<RetryJoin>,
    /// Shard joins that failed and were tried again, since the start.
    join_retries: u64,
    /// The top-level view the shard groups were last told to follow
    /// (none: tell them again).
    followed_view: Option<u64>,
    /// Every rank that was in a top-level view this member installed.
    ever_top: u64,
    /// By subgroup, by shard: every rank this member's applied layouts
    /// put in that shard.
    ever_in_shard: Vec<Vec<u64>>,
}

fn mask_of(ranks: &[usize]) -> u64 {
    ranks.iter().fold(0u64, |mask, r| mask | (1u64 << r))
}

impl<U> Elastic<U> {
    /// Shards being joined, or waiting to be tried again: (subgroup
    /// index, shard).
    pub(crate) fn joining(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let pending = self.pending.iter().map(|p| (p.subgroup_index, p.shard));
        pending.chain(self.retries.iter().map(|r| (r.subgroup_index, r.shard)))
    }

    /// Whether no shard join is under way or waiting to be tried again.
    fn joins_done(&self) -> bool {
        self.pending.is_empty() && self.retries.is_empty()
    }

    /// Shard joins that failed and were tried again, since the start.
    pub(crate) fn join_retries(&self) -> u64 {
        self.join_retries
    }

    /// Why the newest top-level view could not be laid out, if so.
    pub(crate) fn inadequate(&self) -> Option<&LayoutError> {
        self.control.app().inadequate.as_ref()
    }

    /// The top-level group's current view.
    pub(crate) fn top_view(&self) -> View {
        self.control.view()
    }
}

/// A shard's group configuration, numbered by top-level rank: a row for
/// every member, the first view `initial`.
fn shard_config(top: &GroupConfig, spec: &SubgroupSpec, shard: usize, initial: Vec<usize>) -> GroupConfig {
    let mut config = top.clone();
    config.name = subgroup::shard_group_name(&top.name, &spec.name, shard);
    config.mode = spec.mode;
    config.senders = SenderSet::All;
    config.initial_members = Some(initial);
    config
}

impl<U> Elastic<U> {
    /// Join shard `s` of subgroup `g` on a thread: as a member of its
    /// first view if `initial` holds this member, else as a joiner.
    fn start_join(&mut self, specs: &[SubgroupSpec], g: usize, s: usize, initial: Vec<usize>) -> Result<(), Error> {
        self.start_attempt(specs, g, s, initial, 1)
    }

    /// Attempt number `attempts` at joining shard `s` of subgroup `g`.
    fn start_attempt(
        &mut self,
        specs: &[SubgroupSpec],
        g: usize,
        s: usize,
        initial: Vec<usize>,
        attempts: u32,
    ) -> Result<(), Error> {
        let handle = (self.spawn_join)(&specs[g], s, shard_place(specs, g, s), initial.clone())?;
        self.pending.push(PendingJoin {
            subgroup_index: g,
            shard: s,
            initial,
            attempts,
            handle,
        });
        Ok(())
    }
}

/// The thread that joins a shard's group (see [`SpawnJoin`]).
fn spawn_join<U: Upcalls + Send + 'static>(
    mut make_app: impl FnMut(&str, usize) -> U + Send + 'static,
    top: GroupConfig,
    transport: Transport,
    rank: usize,
) -> SpawnJoin<U> {
    Box::new(
        move |spec: &SubgroupSpec, s: usize, place: usize, initial: Vec<usize>| {
            let builder = GroupBuilder::from_config(shard_config(&top, spec, s, initial))
                .rank(rank)
                .transport(offset_ports(&transport, 1 + place)?)
                .app(make_app(&spec.name, s));
            std::thread::Builder::new()
                .name(format!("spindle-join-{}-{s}", spec.name))
                .spawn(move || builder.join())
                .map_err(|e| {
                    Error::Thread(format!(
                        "could not start the thread that joins shard {s} of subgroup {:?}: {e}",
                        spec.name
                    ))
                })
        },
    )
}

/// One pass of the top-level group, then the layouts it computed applied
/// and the shard joins that finished taken in; returns the work done.
pub(crate) fn step<U: Upcalls + Send>(sharded: &mut Sharded<U>) -> Result<u32, Error> {
    let Sharded {
        rank,
        specs,
        layout,
        shards,
        elastic,
        ..
    } = sharded;
    let Some(el) = elastic.as_mut() else {
        return Ok(0);
    };
    let rank = *rank;
    let mut work = match el.control.poll() {
        Ok(work) => work,
        Err(e) => {
            // Out of the top-level view (removed, or its group failed):
            // out of every shard too, so that no shard group keeps a
            // member the layout no longer lists.
            shards.clear();
            return Err(e);
        }
    };
    while let Some(next) = el.control.app_mut().fresh.pop_front() {
        let previous = std::mem::replace(layout, next);
        for (g, shards_of_g) in layout.shards.iter().enumerate() {
            for (s, members) in shards_of_g.iter().enumerate() {
                el.ever_in_shard[g][s] |= mask_of(members);
            }
        }
        el.followed_view = None;
        let in_layout = |l: &Layout, g: usize, s: usize| l.members(g, s).is_some_and(|m| m.contains(&rank));
        // Laid out of a shard: drop it (the others remove this member,
        // which their layout leaves out of it).
        shards.retain(|x| in_layout(layout, x.subgroup_index, x.shard));
        for x in shards.iter_mut() {
            x.members = layout.shards[x.subgroup_index][x.shard].clone();
        }
        // Laid into a shard: join it. Its members that were in it before
        // hold its state; if none is left, it starts afresh.
        let entered: Vec<(usize, usize)> = layout
            .shards_of(rank)
            .map(|(g, s, _)| (g, s))
            .filter(|&(g, s)| {
                !shards.iter().any(|x| x.subgroup_index == g && x.shard == s)
                    && !el.pending.iter().any(|p| p.subgroup_index == g && p.shard == s)
                    && !el.retries.iter().any(|r| r.subgroup_index == g && r.shard == s)
            })
            .collect();
        for (g, s) in entered {
            let now = layout.shards[g][s].clone();
            let kept: Vec<usize> = previous
                .members(g, s)
                .unwrap_or(&[])
                .iter()
                .copied()
                .filter(|m| now.contains(m) && *m != rank)
                .collect();
            let initial = if kept.is_empty() {
                tracing::warn!(
                    subgroup = %specs[g].name,
                    shard = s,
                    "no member of the shard is left: it starts afresh, its state is lost"
                );
                now
            } else {
                kept
            };
            el.start_join(specs, g, s, initial)?;
        }
        work += 1;
    }
    let mut i = 0;
    while i < el.pending.len() {
        if !el.pending[i].handle.is_finished() {
            i += 1;
            continue;
        }
        let p = el.pending.swap_remove(i);
        let spec = &specs[p.subgroup_index];
        let still_laid_in = layout
            .members(p.subgroup_index, p.shard)
            .is_some_and(|m| m.contains(&rank));
        let joined = p
            .handle
            .join()
            .unwrap_or_else(|_| Err(Error::Thread("a shard's join panicked".into())));
        work += 1;
        let group = match joined {
            Ok(group) => group,
            Err(e) if !still_laid_in => {
                // Laid out of it meanwhile: nothing left to join.
                tracing::info!(subgroup = %spec.name, shard = p.shard, error = %e,
                    "a join failed for a shard the layout has since moved this member out of");
                continue;
            }
            Err(e) if join_may_succeed_later(&e) && p.attempts < SHARD_JOIN_ATTEMPTS_MAX => {
                tracing::warn!(subgroup = %spec.name, shard = p.shard, attempt = p.attempts, error = %e,
                    "joining the shard's group failed; trying again");
                el.join_retries += 1;
                el.retries.push(RetryJoin {
                    subgroup_index: p.subgroup_index,
                    shard: p.shard,
                    initial: p.initial,
                    attempts: p.attempts,
                    due: Instant::now() + SHARD_JOIN_RETRY_DELAY * p.attempts,
                });
                continue;
            }
            Err(e) => {
                let attempts = match p.attempts {
                    1 => String::new(),
                    n => format!(", attempt {n} of {SHARD_JOIN_ATTEMPTS_MAX}"),
                };
                return Err(match e {
                    Error::Config(why) => Error::Config(format!("subgroup {:?} shard {}: {why}", spec.name, p.shard)),
                    Error::Timeout { waiting_for, waited_ms } => Error::Timeout {
                        waiting_for: format!("subgroup {:?} shard {} ({waiting_for}{attempts})", spec.name, p.shard),
                        waited_ms,
                    },
                    other => Error::ShardJoin {
                        subgroup: spec.name.clone(),
                        shard: p.shard,
                        attempts: p.attempts,
                        attempts_max: SHARD_JOIN_ATTEMPTS_MAX,
                        cause: Box::new(other),
                    },
                });
            }
        };
        el.followed_view = None;
        match layout.members(p.subgroup_index, p.shard) {
            // Laid out of it again while joining: leave it.
            Some(members) if members.contains(&rank) => shards.push(Shard {
                subgroup: spec.name.clone(),
                subgroup_index: p.subgroup_index,
                shard: p.shard,
                members: members.to_vec(),
                group,
            }),
            _ => drop(group),
        }
    }
    // Failed joins, tried again once due while the layout still lays
    // this member into the shard (and nothing else joins it already).
    let mut k = 0;
    while k < el.retries.len() {
        let (g, s) = (el.retries[k].subgroup_index, el.retries[k].shard);
        let laid_in = layout.members(g, s).is_some_and(|m| m.contains(&rank));
        let busy = shards.iter().any(|x| x.subgroup_index == g && x.shard == s)
            || el.pending.iter().any(|p| p.subgroup_index == g && p.shard == s);
        debug_assert!(
            !busy,
            "no double join: a shard waiting to be tried again is neither joined nor being joined (a new layout skips it)"
        );
        if !laid_in || busy {
            el.retries.swap_remove(k);
            continue;
        }
        if el.retries[k].due > Instant::now() {
            k += 1;
            continue;
        }
        let r = el.retries.swap_remove(k);
        // The shard's first view as the first attempt saw it, less the
        // members the layout has since moved out (all gone: the shard
        // starts afresh with its members now, as in a first attempt).
        let now = layout.members(g, s).unwrap_or(&[]);
        let mut initial: Vec<usize> = r.initial.into_iter().filter(|m| now.contains(m)).collect();
        if initial.is_empty() {
            initial = now.to_vec();
        }
        el.start_attempt(specs, g, s, initial, r.attempts + 1)?;
        work += 1;
    }
    // Each shard's group takes its failures from the top-level view and
    // the layout: it removes exactly the members that the top-level view
    // left out or the layout moved out of the shard (no shard decides
    // alone, so a shard of two survives one failure and no shard splits).
    // A member this member has not seen in a view or a layout yet (one
    // being admitted while this member lags) is not left out.
    let core = el.control.inner().core();
    if el.followed_view != Some(core.view()) {
        let top = mask_of(core.members());
        el.ever_top |= top;
        for x in shards.iter_mut() {
            let (g, s) = (x.subgroup_index, x.shard);
            let in_shard = layout.members(g, s).map_or(0, mask_of);
            let left_out = (el.ever_top & !top) | (el.ever_in_shard[g][s] & !in_shard);
            let ranks: Vec<usize> = (0..64).filter(|r| left_out >> r & 1 == 1).collect();
            x.group.inner_mut().follow_view(Some(&ranks));
        }
        el.followed_view = Some(core.view());
    }
    Ok(work)
}

impl<U: Upcalls + Send> Sharded<U> {
    /// Drive everything until no shard join is pending; fails after
    /// `timeout`.
    fn wait_joins(&mut self, timeout: Duration) -> Result<(), Error> {
        self.run_until(timeout, |s| s.elastic.as_ref().is_none_or(|e| e.joins_done()))
            .map_err(|e| match e {
                Error::Timeout { waited_ms, .. } => Error::Timeout {
                    waiting_for: "this member's shard groups to admit it".into(),
                    waited_ms,
                },
                other => other,
            })
    }

    /// Split off the top-level group (for `finish_together`), once every
    /// pending join is done (up to `timeout`).
    /// The shards decide failures alone again from here (nothing applies
    /// the top-level views any more): a member that fails during the
    /// finish is removed by heartbeat, and a shard of two then stops with
    /// an error rather than wait for ever.
    pub(crate) fn take_control(&mut self, timeout: Duration) -> Result<Option<Group<LayoutKeeper>>, Error> {
        self.wait_joins(timeout)?;
        let control = self.elastic.take().map(|e| e.control);
        if control.is_some() {
            for x in self.shards.iter_mut() {
                x.group.inner_mut().follow_view(None);
            }
        }
        Ok(control)
    }
}

impl<A: Upcalls> GroupBuilder<A> {
    /// Like [`GroupBuilder::join_sharded`], but the shards are laid out
    /// again at every view change of the top-level group (every member):
    /// a member that fails or leaves is replaced in its shards by a spare
    /// member (one that no shard holds, or one that joins later), which
    /// joins the shard's group and gets its state from the shard's
    /// members before its first delivery. Each shard's group has a row
    /// for every member and is numbered by top-level rank (a shard
    /// member's rank in its group is its own rank).
    ///
    /// Shared memory, tcp or ofi. On tcp and ofi each group listens on
    /// ports of its own (on ofi, its control plane): the top-level group
    /// on each member's address,
    /// shard `k` (counting every shard of every subgroup, in the
    /// specification's order, from 0) on the member's port `k + 1`
    /// higher, so each member needs its port and the next
    /// `total shards` free.
    ///
    /// `make_app(subgroup, shard)` makes a shard's application whenever
    /// this member enters a shard, now or later, so it is kept (`'static`).
    /// A rank outside `initial_members` joins the running group: it gets
    /// the layout with the top-level group's state transfer and waits in
    /// the shards it is laid into until they admit it.
    ///
    /// Needs membership on, every member of a shard a sender, and a
    /// mode other than persistent. Returns once this member is in every
    /// shard the layout gives it (up to the join timeout per attempt
    /// at a shard's join, and the waits between attempts, plus one
    /// join timeout).
    pub fn join_sharded_elastic<U: Upcalls + Send + 'static>(
        mut self,
        make_app: impl FnMut(&str, usize) -> U + Send + 'static,
    ) -> Result<Sharded<U>, Error> {
        self.check_sharded()?;
        // On tcp and ofi every group has ports of its own: the top-level
        // group the members' addresses, shard k (in specification order)
        // the ports k + 1 higher. Check them all now, and that the query
        // channel's addresses are none of them.
        let shards_total: usize = self.subgroups.iter().map(|x| x.shards).sum();
        let taken = offset_ports(&self.transport, shards_total)?;
        if let (Some(tcp), Some(queries)) = (tcp_of(&self.transport), &self.query_addresses) {
            let last = tcp_of(&taken).expect("offset_ports keeps the transport");
            let clash = queries.iter().find(|q| {
                tcp.members
                    .iter()
                    .zip(&last.members)
                    .any(|(first, last)| q.ip() == first.ip() && (first.port()..=last.port()).contains(&q.port()))
            });
            if let Some(q) = clash {
                return Err(Error::Config(format!(
                    "query address {q} is one of the ports the top-level group and the shards listen on \
                     (each member's port and the {shards_total} above it)"
                )));
            }
        }
        if !self.config.membership {
            return Err(Error::Config(
                "join_sharded_elastic lays out again at membership changes: turn membership on".into(),
            ));
        }
        for spec in &self.subgroups {
            if spec.senders != SenderSet::All {
                return Err(Error::Config(format!(
                    "subgroup {:?}: join_sharded_elastic needs every member of a shard to send (senders = all): \
                     a member laid into a shard takes no sender rank",
                    spec.name
                )));
            }
            if spec.mode == DeliveryMode::Persistent {
                return Err(Error::Config(format!(
                    "subgroup {:?}: join_sharded_elastic does not take persistent subgroups yet \
                     (use join_sharded)",
                    spec.name
                )));
            }
        }
        subgroup::validate_specs(&self.subgroups).map_err(|e| Error::Config(format!("subgroups: {e}")))?;
        let function: Arc<dyn LayoutFunction> = match self.layout_function.take() {
            Some(f) => Arc::from(f),
            None => Arc::new(StickyLayout),
        };
        let initial_view = self.config.initial_ranks();
        let joining = !initial_view.contains(&self.rank);
        let first = if joining {
            None
        } else {
            Some(
                subgroup::lay_out(&*function, &self.subgroups, 0, &initial_view, None)
                    .map_err(|e| Error::Config(format!("subgroups: {e}")))?,
            )
        };
        let keeper = LayoutKeeper {
            specs: self.subgroups.clone(),
            function,
            members: self.config.members,
            layout: first.clone(),
            restored: None,
            fresh: VecDeque::new(),
            inadequate: None,
        };
        let mut top = self.config.clone();
        top.name = format!("{}.layout", self.config.name);
        spindle_fabric::shm::validate_group_name(&top.name).map_err(|e| {
            Error::Config(format!(
                "the top-level group's name {} is not a valid group name: {e}",
                top.name
            ))
        })?;
        // Nobody sends in it: the smallest rings.
        top.mode = DeliveryMode::Ordered;
        top.senders = SenderSet::All;
        top.window_slots = 4;
        top.slot_payload_max = 64;
        let control = GroupBuilder::from_config(top)
            .rank(self.rank)
            .transport(self.transport.clone())
            .app(keeper)
            .join()?;
        let start = match first {
            Some(first) => first,
            None => control.app().restored.clone().ok_or_else(|| {
                Error::Config("joined the top-level group but its state transfer gave no layout".into())
            })?,
        };
        let queries = self.open_queries()?;
        let join_timeout = self.config.join_timeout;
        let ever_in_shard: Vec<Vec<u64>> = start
            .shards
            .iter()
            .map(|of_g| of_g.iter().map(|members| mask_of(members)).collect())
            .collect();
        let mut sharded = Sharded {
            name: self.config.name.clone(),
            rank: self.rank,
            specs: self.subgroups,
            layout: start,
            shards: Vec::new(),
            queries,
            elastic: Some(Elastic {
                control,
                spawn_join: spawn_join(make_app, self.config, self.transport, self.rank),
                pending: Vec::new(),
                retries: Vec::new(),
                join_retries: 0,
                followed_view: None,
                ever_top: 0,
                ever_in_shard,
            }),
        };
        if !joining {
            let mine: Vec<(usize, usize)> = sharded.layout.shards_of(sharded.rank).map(|(g, s, _)| (g, s)).collect();
            for (g, s) in mine {
                let initial = sharded.layout.shards[g][s].clone();
                let el = sharded.elastic.as_mut().expect("made above");
                el.start_join(&sharded.specs, g, s, initial)?;
            }
        }
        // A joiner applies the layout of the view it joined in here.
        sharded.poll()?;
        sharded.wait_joins(startup_join_budget(join_timeout))?;
        Ok(sharded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keeper(layout: Option<Layout>) -> LayoutKeeper {
        LayoutKeeper {
            specs: vec![SubgroupSpec::new("kv", 2, 2)],
            function: Arc::new(StickyLayout),
            members: 6,
            layout,
            restored: None,
            fresh: VecDeque::new(),
            inadequate: None,
        }
    }

    fn view(id: u64, members: &[usize]) -> View {
        View {
            id,
            members: members.to_vec(),
            senders: members.to_vec(),
            joined: Vec::new(),
            departed: Vec::new(),
            prev_final_seq: 0,
        }
    }

    #[test]
    fn each_view_is_laid_out_from_the_one_before_and_a_small_one_keeps_the_shards() {
        let first = StickyLayout
            .layout(&[SubgroupSpec::new("kv", 2, 2)], 0, &[0, 1, 2, 3, 4], None)
            .unwrap();
        let mut k = keeper(Some(first));
        k.view_installed(&view(1, &[0, 2, 3, 4]));
        assert_eq!(k.fresh.pop_front().unwrap().shards, vec![vec![vec![0, 4], vec![2, 3]]]);
        // Too small: the layout stays, and says why.
        k.view_installed(&view(2, &[0, 2, 3]));
        assert!(k.fresh.is_empty());
        assert!(matches!(k.inadequate, Some(LayoutError::Inadequate { .. })));
        assert_eq!(k.layout.as_ref().unwrap().view_id, 1);
        // A joiner fills the hole at the departed member's shard rank.
        k.view_installed(&view(3, &[0, 2, 3, 5]));
        assert_eq!(k.fresh.pop_front().unwrap().shards, vec![vec![vec![0, 5], vec![2, 3]]]);
        assert!(k.inadequate.is_none());
        // An old view again changes nothing.
        k.view_installed(&view(3, &[0, 2, 3, 5]));
        assert!(k.fresh.is_empty());
    }

    #[test]
    fn a_joiner_lays_out_from_the_layout_it_is_given() {
        let given = StickyLayout
            .layout(&[SubgroupSpec::new("kv", 2, 2)], 4, &[0, 1, 2, 3], None)
            .unwrap();
        let mut provider = keeper(Some(given.clone()));
        let mut bytes = Vec::new();
        provider.snapshot(&mut bytes);
        let mut joiner = keeper(None);
        joiner.view_installed(&view(5, &[0, 2, 3, 5]));
        assert!(joiner.fresh.is_empty(), "no layout before the state transfer");
        joiner.restore(&bytes).unwrap();
        assert_eq!(joiner.restored.as_ref(), Some(&given));
        joiner.view_installed(&view(5, &[0, 2, 3, 5]));
        provider.view_installed(&view(5, &[0, 2, 3, 5]));
        assert_eq!(joiner.layout, provider.layout, "layout agreement");
        assert_eq!(joiner.layout.unwrap().shards, vec![vec![vec![0, 5], vec![2, 3]]]);
        let err = keeper(None).restore(&bytes[..5]).unwrap_err();
        assert!(err.contains("the layout given by the top-level group"), "{err}");
    }
}
