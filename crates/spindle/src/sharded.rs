//! [`Sharded`]: one member of a group laid out into subgroups and shards.
//!
//! Name the subgroups on the builder ([`GroupBuilder::subgroup`]); the
//! layout function (default [`StickyLayout`]) assigns the group's
//! members to shards, and `join_sharded` joins this member to the group
//! of every shard it is in. Each shard is its own group: its own rings,
//! senders, delivery mode and total order, delivered only to its
//! members. `join_sharded` keeps the first view's layout;
//! [`GroupBuilder::join_sharded_elastic`] lays the members out again at
//! every view change of a top-level group of them all (shared memory or tcp).
//!
//! ```no_run
//! use spindle::group_layer::subgroup::SubgroupSpec;
//! use spindle::{Callbacks, Group};
//! // 4 members: shard 0 of "kv" is members {0, 1}, shard 1 is {2, 3}.
//! let rank = 0;
//! let mut member = Group::builder("store")
//!     .members(4)
//!     .rank(rank)
//!     .subgroup(SubgroupSpec::new("kv", 2, 2))
//!     .join_sharded(|_subgroup, _shard| Callbacks::default())?;
//! let key = b"user:42";
//! if member.shard_of_key("kv", key)? == member.my_shard("kv").unwrap() {
//!     member.send("kv", b"user:42=alice")?;
//! }
//! member.poll()?;
//! # Ok::<(), spindle::Error>(())
//! ```

use std::time::Duration;

use spindle_group::subgroup::{self, Layout, LayoutFunction, StickyLayout, SubgroupSpec};
use spindle_group::Upcalls;

use spindle_group::{QueryChannel, QueryError, QueryTarget};

use crate::builder::GroupBuilder;
use crate::group::Group;
use crate::relayout::Elastic;
use crate::transport::{AnyFabric, Transport};
use crate::Error;

/// One shard this member is in, and the group that carries it.
pub struct Shard<U> {
    /// The subgroup's name.
    pub subgroup: String,
    /// The subgroup's index in the specification.
    pub subgroup_index: usize,
    /// The shard's index in its subgroup.
    pub shard: usize,
    /// The shard's members (top-level ranks), in shard-rank order.
    pub members: Vec<usize>,
    /// The shard's group (this member's rank in it is its index in
    /// `members`).
    pub group: Group<U>,
}

/// One member of a group laid out into subgroups: the shards it is in.
pub struct Sharded<U> {
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) specs: Vec<SubgroupSpec>,
    pub(crate) layout: Layout,
    pub(crate) shards: Vec<Shard<U>>,
    /// The point-to-point query channel ([`GroupBuilder::queries`]).
    pub(crate) queries: Option<QueryChannel<AnyFabric>>,
    /// The top-level group and what re-lays out at its view changes
    /// ([`GroupBuilder::join_sharded_elastic`]); none for `join_sharded`.
    pub(crate) elastic: Option<Elastic<U>>,
}

impl<A: Upcalls> GroupBuilder<A> {
    /// Lay the group's members out into this subgroup too (in the order
    /// the subgroups are added; see [`spindle_group::subgroup`]).
    pub fn subgroup(mut self, spec: SubgroupSpec) -> Self {
        self.subgroups.push(spec);
        self
    }

    /// Open the point-to-point query channel too: any member can then
    /// ask one member of any shard a read and get its reply
    /// ([`Sharded::query`]), answered by that shard's application
    /// ([`Upcalls::query`], [`crate::Callbacks::with_query`],
    /// `StateMachine::query`). On shared memory it is the region
    /// `{group}.p2p`; on tcp it needs [`GroupBuilder::query_addresses`].
    /// Every member must turn it on (`join_sharded` waits for all).
    pub fn queries(mut self, on: bool) -> Self {
        self.queries = on;
        self
    }

    /// On tcp (and ofi): the address each member's query channel listens
    /// on, by rank (not the members' own addresses, which carry their
    /// shards' groups).
    pub fn query_addresses(mut self, addresses: Vec<std::net::SocketAddr>) -> Self {
        self.query_addresses = Some(addresses);
        self
    }

    /// Lay out with `function` instead of the default [`StickyLayout`]
    /// (its result is checked: every shard full, shards disjoint, only
    /// members of the view).
    pub fn layout_function(mut self, function: impl LayoutFunction + 'static) -> Self {
        self.layout_function = Some(Box::new(function));
        self
    }

    /// Join the group of every shard this member is in, making each
    /// shard's application with `make_app(subgroup, shard)`. The joins run
    /// at once, one thread each, so a member in several shards is in all
    /// of them while it waits for the others' members. A member in no
    /// shard gets a `Sharded` with none (it may still ask
    /// [`Sharded::shard_of_key`]).
    ///
    /// On tcp (and ofi) each shard's group uses its members' addresses
    /// from the transport, so a member may be in one shard only there
    /// (overlapping subgroups need shared memory).
    pub fn join_sharded<U: Upcalls + Send>(
        self,
        mut make_app: impl FnMut(&str, usize) -> U,
    ) -> Result<Sharded<U>, Error> {
        self.check_sharded()?;
        let view: Vec<usize> = self.config.initial_ranks();
        let function: &dyn LayoutFunction = match &self.layout_function {
            Some(f) => f.as_ref(),
            None => &StickyLayout,
        };
        let layout = subgroup::lay_out(function, &self.subgroups, 0, &view, None)
            .map_err(|e| Error::Config(format!("subgroups: {e}")))?;
        let mine: Vec<(usize, usize, usize)> = layout.shards_of(self.rank).collect();
        if mine.len() > 1 && !matches!(self.transport, Transport::Shm) {
            return Err(Error::Config(format!(
                "member {} is in {} shards: on tcp or ofi a member may be in one shard only \
                 (each shard's group listens on the member's one address); use shared memory \
                 or disjoint subgroups",
                self.rank,
                mine.len()
            )));
        }
        // Every shard's builder first (the applications made here, on
        // the caller's thread), then all joins at once: a member in
        // several shards is not missing from one while it waits in
        // another's join.
        let mut joins = Vec::with_capacity(mine.len());
        for (g, s, shard_rank) in mine {
            let spec = &self.subgroups[g];
            let shard_members = layout.shards[g][s].clone();
            let mut config = self.config.clone();
            config.name = subgroup::shard_group_name(&self.config.name, &spec.name, s);
            config.members = shard_members.len();
            config.mode = spec.mode;
            config.senders = spec.senders.clone();
            config.initial_members = None;
            let builder = GroupBuilder::from_config(config)
                .rank(shard_rank)
                .transport(shard_transport(&self.transport, &shard_members))
                .app(make_app(&spec.name, s));
            joins.push((spec.name.clone(), g, s, shard_members, Some(builder)));
        }
        let joined: Vec<Result<Group<U>, Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = joins
                .iter_mut()
                .map(|(_, _, _, _, builder)| {
                    let builder = builder.take().expect("each shard's builder is joined once");
                    scope.spawn(move || builder.join())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Thread("a shard's join panicked".into())))
                })
                .collect()
        });
        let mut shards = Vec::with_capacity(joins.len());
        for ((name, g, s, members, _), group) in joins.into_iter().zip(joined) {
            let group = group.map_err(|e| match e {
                Error::Config(why) => Error::Config(format!("subgroup {name:?} shard {s}: {why}")),
                other => other,
            })?;
            shards.push(Shard {
                subgroup: name,
                subgroup_index: g,
                shard: s,
                members,
                group,
            });
        }
        let queries = self.open_queries()?;
        Ok(Sharded {
            name: self.config.name.clone(),
            rank: self.rank,
            specs: self.subgroups,
            layout,
            shards,
            queries,
            elastic: None,
        })
    }

    /// The checks `join_sharded` and `join_sharded_elastic` share.
    pub(crate) fn check_sharded(&self) -> Result<(), Error> {
        if self.subgroups.is_empty() {
            return Err(Error::Config(
                "join_sharded: no subgroups (add them with GroupBuilder::subgroup)".into(),
            ));
        }
        self.config.validate()?;
        let members = self.config.members;
        if self.rank >= members {
            return Err(Error::Config(format!(
                "rank {} is not a member: the group has {members} members",
                self.rank
            )));
        }
        let addresses = match &self.transport {
            Transport::Shm => None,
            Transport::Tcp(tcp) => Some(tcp.members.len()),
            Transport::Ofi(ofi) => Some(ofi.tcp.members.len()),
        };
        if let Some(n) = addresses.filter(|n| *n != members) {
            return Err(Error::Config(format!(
                "the transport lists {n} member addresses but the group has {members} members"
            )));
        }
        for spec in &self.subgroups {
            let last = subgroup::shard_group_name(&self.config.name, &spec.name, spec.shards.saturating_sub(1));
            spindle_fabric::shm::validate_group_name(&last).map_err(|e| {
                Error::Config(format!(
                    "subgroup {:?}: its shards' group names ({last}) are not valid group names: {e}",
                    spec.name
                ))
            })?;
        }
        Ok(())
    }

    /// The point-to-point query channel, if [`GroupBuilder::queries`].
    pub(crate) fn open_queries(&self) -> Result<Option<QueryChannel<AnyFabric>>, Error> {
        let members = self.config.members;
        Ok(if self.queries {
            let name = format!("{}.p2p", self.config.name);
            spindle_fabric::shm::validate_group_name(&name).map_err(|e| {
                Error::Config(format!(
                    "queries: the query channel's name {name} is not a valid group name: {e}"
                ))
            })?;
            let fabric = crate::transport::open_query_fabric(
                &self.transport,
                &name,
                members,
                self.rank,
                self.query_addresses.as_deref(),
                self.config.join_timeout,
            )?;
            Some(QueryChannel::new(std::sync::Arc::new(fabric))?)
        } else {
            if self.query_addresses.is_some() {
                return Err(Error::Config(
                    "query_addresses is set but queries are off (GroupBuilder::queries(true))".into(),
                ));
            }
            None
        })
    }
}

/// The transport of a shard's group: shared memory as is; on tcp and ofi
/// the addresses of the shard's members, in shard-rank order.
fn shard_transport(transport: &Transport, shard_members: &[usize]) -> Transport {
    let pick = |tcp: &crate::TcpTransport| {
        let mut tcp = tcp.clone();
        tcp.members = shard_members.iter().map(|m| tcp.members[*m]).collect();
        tcp
    };
    match transport {
        Transport::Shm => Transport::Shm,
        Transport::Tcp(tcp) => Transport::Tcp(pick(tcp)),
        Transport::Ofi(ofi) => {
            let mut ofi = ofi.clone();
            ofi.tcp = pick(&ofi.tcp);
            Transport::Ofi(ofi)
        }
    }
}

impl<U: Upcalls + Send> Sharded<U> {
    /// The top-level group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This member's top-level rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The layout in force: the members of every shard (the first
    /// view's for `join_sharded`; with `join_sharded_elastic`, that of the
    /// newest top-level view this member has applied).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// With `join_sharded_elastic`: the top-level group's current view
    /// (none for `join_sharded`).
    pub fn top_level_view(&self) -> Option<spindle_group::View> {
        self.elastic.as_ref().map(|e| e.top_view())
    }

    /// With `join_sharded_elastic`: why the newest top-level view could
    /// not be laid out (too few members for the specification: the
    /// shards keep their members and run short until joiners come), if
    /// it could not.
    pub fn layout_error(&self) -> Option<&subgroup::LayoutError> {
        self.elastic.as_ref().and_then(|e| e.inadequate())
    }

    /// With `join_sharded_elastic`: the shards this member was laid into
    /// and is still joining, as (subgroup, shard).
    pub fn joining_shards(&self) -> Vec<(&str, usize)> {
        self.elastic
            .iter()
            .flat_map(|e| e.joining())
            .map(|(g, s)| (self.specs[g].name.as_str(), s))
            .collect()
    }

    /// Shard joins that failed and were tried again since the start
    /// (`join_sharded_elastic`; each failure is also logged with its
    /// error). A join that keeps failing is returned by
    /// [`Sharded::poll`] after its last attempt.
    pub fn shard_join_retries(&self) -> u64 {
        self.elastic.as_ref().map_or(0, |e| e.join_retries())
    }

    /// The subgroups, as specified.
    pub fn specs(&self) -> &[SubgroupSpec] {
        &self.specs
    }

    /// The shards this member is in.
    pub fn shards(&self) -> &[Shard<U>] {
        &self.shards
    }

    /// The shards this member is in, mutably (to drive or send in one).
    pub fn shards_mut(&mut self) -> &mut [Shard<U>] {
        &mut self.shards
    }

    fn subgroup_index(&self, subgroup: &str) -> Result<usize, Error> {
        self.specs.iter().position(|s| s.name == subgroup).ok_or_else(|| {
            let known: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
            Error::Config(format!(
                "no subgroup {subgroup:?}: the subgroups are {}",
                known.join(", ")
            ))
        })
    }

    /// The shard of `subgroup` that holds `key` (see
    /// [`subgroup::shard_of_key`]).
    pub fn shard_of_key(&self, subgroup: &str, key: &[u8]) -> Result<usize, Error> {
        let g = self.subgroup_index(subgroup)?;
        Ok(subgroup::shard_of_key(key, self.specs[g].shards))
    }

    /// The shard of `subgroup` this member is in, if any.
    pub fn my_shard(&self, subgroup: &str) -> Option<usize> {
        self.shards.iter().find(|s| s.subgroup == subgroup).map(|s| s.shard)
    }

    /// This member's shard of `subgroup`.
    pub fn shard(&self, subgroup: &str) -> Option<&Shard<U>> {
        self.shards.iter().find(|s| s.subgroup == subgroup)
    }

    /// This member's shard of `subgroup`, mutably.
    pub fn shard_mut(&mut self, subgroup: &str) -> Option<&mut Shard<U>> {
        self.shards.iter_mut().find(|s| s.subgroup == subgroup)
    }

    /// Multicast `payload` in this member's shard of `subgroup`: every
    /// member of that shard delivers it in the shard's order, no one else
    /// does. Never waits (a full window is `SendError::WouldBlock`).
    pub fn send(&self, subgroup: &str, payload: &[u8]) -> Result<(), Error> {
        let g = self.subgroup_index(subgroup)?;
        let shard = self.shards.iter().find(|s| s.subgroup_index == g).ok_or_else(|| {
            let joining = self.layout.shards[g].iter().position(|m| m.contains(&self.rank));
            Error::Config(match joining {
                Some(s) => format!(
                    "member {} is laid into shard {s} of subgroup {subgroup:?} but is still joining its group \
                     (join_sharded_elastic): send once Sharded::joining_shards is empty",
                    self.rank
                ),
                None => format!(
                    "member {} is in no shard of subgroup {subgroup:?} (its shards: {:?})",
                    self.rank, self.layout.shards[g]
                ),
            })
        })?;
        shard.group.send(payload)
    }

    /// One progress pass over every shard, and the queries that arrived
    /// answered; returns the work done.
    pub fn poll(&mut self) -> Result<u32, Error> {
        let mut work = crate::relayout::step(self)?;
        for shard in &mut self.shards {
            work += shard.group.poll()?;
        }
        if let Some(channel) = &mut self.queries {
            let (me, shards, layout) = (self.rank, &mut self.shards, &self.layout);
            work += channel.serve(&mut |asker, target, request, reply| {
                let (g, s) = (target.subgroup as usize, target.shard as usize);
                match shards.iter_mut().find(|x| x.subgroup_index == g && x.shard == s) {
                    Some(shard) => shard.group.app_mut().query(request, reply),
                    None => Err(format!(
                        "member {me} is not in shard {s} of subgroup {g} (member {asker} asked it; that shard's members: {:?})",
                        layout.shards.get(g).and_then(|x| x.get(s))
                    )),
                }
            })?;
        }
        Ok(work)
    }

    /// The members of shard `shard` of `subgroup` (top-level ranks, in
    /// shard-rank order).
    pub fn shard_members(&self, subgroup: &str, shard: usize) -> Result<&[usize], Error> {
        let g = self.subgroup_index(subgroup)?;
        self.layout.shards[g].get(shard).map(|m| m.as_slice()).ok_or_else(|| {
            Error::Config(format!(
                "subgroup {subgroup:?} has {} shards: there is no shard {shard}",
                self.layout.shards[g].len()
            ))
        })
    }

    /// Ask `member` of shard `shard` of `subgroup` a read, and wait (up to
    /// `timeout`) for its reply: its shard application's answer
    /// ([`Upcalls::query`]) from its replica as it is, beside the shard's
    /// total order. This member keeps its own shards going and answers
    /// the queries it is asked while it waits. A query to itself is
    /// answered locally. The request and the reply are at most
    /// [`spindle_group::query::QUERY_PAYLOAD_BYTES_MAX`] bytes.
    pub fn query(
        &mut self,
        subgroup: &str,
        shard: usize,
        member: usize,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        let g = self.subgroup_index(subgroup)?;
        let members = self.shard_members(subgroup, shard)?;
        if !members.contains(&member) {
            return Err(Error::Config(format!(
                "member {member} is not in shard {shard} of subgroup {subgroup:?} (its members: {members:?})"
            )));
        }
        let too_long = QueryError::TooLong {
            len: request.len(),
            max: spindle_group::query::QUERY_PAYLOAD_BYTES_MAX,
        };
        if member == self.rank {
            if request.len() > spindle_group::query::QUERY_PAYLOAD_BYTES_MAX {
                return Err(too_long.into());
            }
            let Some(local) = self
                .shards
                .iter_mut()
                .find(|x| x.subgroup_index == g && x.shard == shard)
            else {
                return Err(Error::Config(format!(
                    "member {member} is laid into shard {shard} of subgroup {subgroup:?} but is still joining \
                     its group (join_sharded_elastic): ask again once Sharded::joining_shards is empty"
                )));
            };
            let mut reply = Vec::new();
            local
                .group
                .app_mut()
                .query(request, &mut reply)
                .map_err(|reason| QueryError::Refused { peer: member, reason })?;
            return Ok(reply);
        }
        let Some(channel) = self.queries.as_mut() else {
            return Err(Error::Config(
                "queries are off: turn them on with GroupBuilder::queries(true), on every member".into(),
            ));
        };
        let target = QueryTarget {
            subgroup: g as u32,
            shard: shard as u32,
        };
        channel.ask(member, target, request)?;
        let started = std::time::Instant::now();
        let mut last_check = started;
        let mut idle_passes: u32 = 0;
        let mut reply = Vec::new();
        loop {
            let channel = self.queries.as_mut().expect("checked above");
            if let Some(answer) = channel.take_reply(member, &mut reply) {
                answer?;
                return Ok(reply);
            }
            let gave_up = if last_check.elapsed() >= Duration::from_millis(10) {
                last_check = std::time::Instant::now();
                channel
                    .peer_gone(member)
                    .then_some(Error::Query(QueryError::PeerGone { peer: member }))
            } else {
                None
            }
            .or_else(|| {
                (started.elapsed() > timeout).then(|| Error::Timeout {
                    waiting_for: format!(
                        "member {member}'s reply to a query on shard {shard} of subgroup {subgroup:?}"
                    ),
                    waited_ms: timeout.as_millis() as u64,
                })
            });
            if let Some(e) = gave_up {
                // A late reply is dropped; the next query goes on.
                channel.abandon(member);
                return Err(e);
            }
            if self.poll()? > 0 {
                idle_passes = 0;
            } else {
                idle_passes = idle_passes.saturating_add(1);
                self.idle(idle_passes);
            }
        }
    }

    /// A pass that found nothing: spin, yield, then wait briefly (50 µs),
    /// parked on the query channel when there is one (a query or a reply
    /// wakes it), else asleep. So several processes on 2 cores still
    /// progress, and every shard is polled at least every 50 µs.
    pub(crate) fn idle(&self, idle_passes: u32) {
        match idle_passes {
            0..=63 => std::hint::spin_loop(),
            64..=127 => std::thread::yield_now(),
            _ => match &self.queries {
                Some(channel) => channel.park(Duration::from_micros(50)),
                None => std::thread::sleep(Duration::from_micros(50)),
            },
        }
    }

    /// Poll every shard until `done(self)` holds; fails with
    /// [`Error::Timeout`] after `timeout`. A pass that finds nothing
    /// backs off (spin, yield, then a 50 µs nap; one shard parks on its
    /// doorbell).
    pub fn run_until(&mut self, timeout: Duration, mut done: impl FnMut(&Self) -> bool) -> Result<(), Error> {
        let started = std::time::Instant::now();
        let mut idle_passes: u32 = 0;
        while !done(self) {
            if let (None, None, [only]) = (&self.queries, &self.elastic, self.shards.as_mut_slice()) {
                // One shard and no queries: its own idle strategy (parks
                // on its doorbell).
                only.group.poll_or_idle()?;
            } else if self.poll()? > 0 {
                idle_passes = 0;
            } else {
                // Several doorbells: spin, yield, then wait briefly.
                idle_passes = idle_passes.saturating_add(1);
                self.idle(idle_passes);
            }
            if started.elapsed() > timeout {
                return Err(Error::Timeout {
                    waiting_for: "the condition of Sharded::run_until".into(),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
        }
        Ok(())
    }

    /// End every shard together (see [`Group::finish_together`]), all
    /// at once (a member in several shards keeps each going while it
    /// waits in another); returns the shards' applications in the order
    /// of [`Sharded::shards`].
    pub fn finish_together(mut self, timeout: Duration) -> Result<Vec<U>, Error> {
        // With join_sharded_elastic: the top-level group ends beside the
        // shards, once no shard join is pending.
        let control = self.take_control(timeout)?;
        std::thread::scope(|scope| {
            let top = control.map(|c| scope.spawn(move || c.finish_together(timeout).map(drop)));
            let handles: Vec<_> = self
                .shards
                .into_iter()
                .map(|s| scope.spawn(move || s.group.finish_together(timeout)))
                .collect();
            let apps = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Thread("a shard's finish panicked".into())))
                })
                .collect();
            if let Some(top) = top {
                top.join()
                    .unwrap_or_else(|_| Err(Error::Thread("the top-level group's finish panicked".into())))?;
            }
            apps
        })
    }
}
