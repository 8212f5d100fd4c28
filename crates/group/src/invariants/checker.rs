//! The one checker: every property, fed one event at a time.
//!
//! An [`Event`] is a delivery or a view installation at one member, in
//! that member's order. [`Checker::observe`] hands it to each property
//! (one type per property, each in the file named after it) and then
//! records it in the shared [`Context`]: which views exist, which view
//! each member installed last, and, when the driver knows it, what each
//! sender sent. [`Checker::finish`] checks what only the end of a run can
//! show (no gaps).
//!
//! The simulator drives it online, after every step of every member, and
//! stops at the first violation; the log checks replay delivery logs into
//! it (`replay`) and go on to the end, keeping each property's
//! first violation. Each property keeps only what it needs (O(1) or
//! O(log n) per delivery; a view change compares the sets delivered in
//! the view that ended).

use std::collections::{BTreeMap, BTreeSet};

use super::{fifo, integrity, no_duplication, no_gaps, no_loss, sending_view, total_order, view_chain};
use super::{virtual_synchrony, LogEntry, Violation};

/// One delivery at a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub member: usize,
    pub view: u64,
    pub sender: usize,
    pub index: u64,
    pub seq: u64,
    pub len: u64,
    pub xxh3: u64,
}

impl Delivered {
    /// The delivery-log line for it.
    pub fn to_log_entry(&self) -> LogEntry {
        LogEntry {
            member: self.member,
            view: self.view,
            sender: self.sender,
            index: self.index,
            seq: self.seq,
            len: self.len,
            xxh3: format!("{:016x}", self.xxh3),
        }
    }

    /// The delivery a log line records (`Err`: its xxh3 is not hex).
    pub fn from_log_entry(e: &LogEntry) -> Result<Delivered, Violation> {
        let xxh3 = u64::from_str_radix(&e.xxh3, 16).map_err(|_| {
            Violation::new(
                "integrity",
                format!(
                    "member {} delivered sender {} index {} in view {} with xxh3 '{}', which is not hex",
                    e.member, e.sender, e.index, e.view, e.xxh3
                ),
            )
        })?;
        Ok(Delivered {
            member: e.member,
            view: e.view,
            sender: e.sender,
            index: e.index,
            seq: e.seq,
            len: e.len,
            xxh3,
        })
    }
}

/// A view installation at a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Installed<'a> {
    pub member: usize,
    pub view: u64,
    /// Ascending member ids.
    pub members: &'a [usize],
    /// The senders in sender-position order (`seq = index × senders.len()
    /// + position`), when the driver knows them.
    pub senders: Option<&'a [usize]>,
}

/// What happened at a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    View(Installed<'a>),
    Delivery(&'a Delivered),
}

/// A view as the checker knows it: as the first member that installed it
/// listed it.
#[derive(Clone, Debug)]
pub struct ViewInfo {
    /// Ascending member ids.
    pub members: Vec<usize>,
    /// The senders, in sender-position order, when known.
    pub senders: Option<Vec<usize>>,
    /// The first member that installed it (for the evidence).
    pub first: usize,
}

/// A member as the checker knows it.
#[derive(Clone, Debug, Default)]
pub struct MemberInfo {
    /// The view it installed last (None: none yet, e.g. a joiner).
    pub view: Option<u64>,
    /// Its deliveries are checked against its installed view (false for a
    /// log without view lines).
    pub tracked: bool,
    /// Still in the first view given to [`Checker::with_members`].
    pub first_view: bool,
    /// A view event was seen for its current view (the first view given
    /// to [`Checker::with_members`] may be confirmed once).
    pub confirmed: bool,
    /// Deliveries, in all views.
    pub delivered: u64,
}

/// What every property may read: the views, the members, what was sent.
#[derive(Clone, Debug, Default)]
pub struct Context {
    views: BTreeMap<u64, ViewInfo>,
    members: BTreeMap<usize, MemberInfo>,
    /// Per sender id, in send order: (len, xxh3); None: not known (logs).
    sent: Option<Vec<Vec<(u64, u64)>>>,
    /// Members that left on request (they count toward the majority rule:
    /// they agreed to the view that dropped them).
    left: BTreeSet<usize>,
    /// View ids seen in view events and deliveries.
    view_ids: BTreeSet<u64>,
    /// Two members listed one view id differently.
    split: bool,
    /// For [`Checker::finish`]: how many messages each sender sent.
    expected_per_sender: Option<BTreeMap<usize, u64>>,
    /// The group follows an outer view ([`Checker::majority_decided_outside`]).
    majority_outside: bool,
}

impl Context {
    pub fn view(&self, id: u64) -> Option<&ViewInfo> {
        self.views.get(&id)
    }

    /// Known views with ids in `range`, ascending.
    pub fn views_in(
        &self,
        range: impl std::ops::RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = (&u64, &ViewInfo)> {
        self.views.range(range)
    }

    pub fn member(&self, m: usize) -> Option<&MemberInfo> {
        self.members.get(&m)
    }

    pub fn members(&self) -> impl Iterator<Item = (&usize, &MemberInfo)> {
        self.members.iter()
    }

    pub fn view_of(&self, m: usize) -> Option<u64> {
        self.members.get(&m).and_then(|i| i.view)
    }

    /// What `sender` sent, in order (None: what was sent is not known).
    pub fn sent(&self, sender: usize) -> Option<&[(u64, u64)]> {
        self.sent
            .as_ref()
            .map(|s| s.get(sender).map_or(&[][..], |x| x.as_slice()))
    }

    pub fn has_left(&self, m: usize) -> bool {
        self.left.contains(&m)
    }

    /// Whether the majority rule is an outer group's (see
    /// [`Checker::majority_decided_outside`]).
    pub fn majority_outside(&self) -> bool {
        self.majority_outside
    }

    pub fn expected_per_sender(&self) -> Option<&BTreeMap<usize, u64>> {
        self.expected_per_sender.as_ref()
    }

    /// More than one view id seen, or two memberships for one view id:
    /// messages of a view that ended may never be delivered (the ragged
    /// edge trims them), so counts per sender say nothing.
    pub fn membership_changed(&self) -> bool {
        self.view_ids.len() > 1 || self.split
    }

    fn apply(&mut self, event: &Event<'_>) {
        match event {
            Event::View(v) => self.install(v),
            Event::Delivery(d) => {
                self.view_ids.insert(d.view);
                self.members.entry(d.member).or_insert_with(tracked).delivered += 1;
            }
        }
    }

    fn install(&mut self, v: &Installed<'_>) {
        self.view_ids.insert(v.view);
        let info = self.views.entry(v.view).or_insert_with(|| ViewInfo {
            members: v.members.to_vec(),
            senders: None,
            first: v.member,
        });
        self.split |= info.members != v.members;
        if info.senders.is_none() {
            info.senders = v.senders.map(|s| s.to_vec());
        }
        let state = self.members.entry(v.member).or_insert_with(tracked);
        state.first_view &= state.view == Some(v.view);
        state.view = Some(v.view);
        state.confirmed = true;
    }
}

fn tracked() -> MemberInfo {
    MemberInfo {
        tracked: true,
        ..MemberInfo::default()
    }
}

/// One property: told every event after the properties before it and
/// before the [`Context`] records it.
pub trait Property {
    /// The property's name, as [`Violation::property`] carries it.
    fn name(&self) -> &'static str;
    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation>;
    /// What only the end of the run can show.
    fn finish(&mut self, _ctx: &Context) -> Result<(), Violation> {
        Ok(())
    }
}

/// Which properties apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    /// Total order (ordered delivery only).
    pub total_order: bool,
    /// No loss and virtual synchrony: what members that moved on from a
    /// view delivered in it agrees. Delivered on receipt (unordered), a
    /// message may reach one member and not another before its sender
    /// fails, so the simulator asks for them in ordered mode only.
    pub survivors: bool,
}

/// The order the log checks name violations in when a log breaks several
/// properties (the first broken of these is reported).
pub const REPORT_ORDER: [&str; 9] = [
    no_duplication::PROPERTY,
    fifo::PROPERTY,
    integrity::PROPERTY,
    total_order::PROPERTY,
    view_chain::PROPERTY,
    sending_view::PROPERTY,
    no_loss::PROPERTY,
    virtual_synchrony::PROPERTY,
    no_gaps::PROPERTY,
];

/// Every property of `scope`, fed one event at a time.
pub struct Checker {
    ctx: Context,
    /// In the order one event is checked (the first to object names it).
    properties: Vec<Box<dyn Property>>,
    /// Per property: its first violation (a broken property hears no more).
    broken: Vec<Option<Violation>>,
}

impl Checker {
    /// No members, no views, what was sent not known (log replay).
    pub fn new(scope: Scope) -> Checker {
        let mut properties: Vec<Box<dyn Property>> = vec![
            Box::new(view_chain::ViewChain),
            Box::new(sending_view::SendingView),
            Box::new(no_duplication::NoDuplication::default()),
            Box::new(fifo::Fifo::default()),
            Box::new(integrity::Integrity::default()),
            Box::new(no_gaps::NoGaps::default()),
        ];
        if scope.total_order {
            properties.push(Box::new(total_order::TotalOrder::default()));
        }
        if scope.survivors {
            properties.push(Box::new(no_loss::NoLoss::default()));
            properties.push(Box::new(virtual_synchrony::VirtualSynchrony::default()));
        }
        let broken = vec![None; properties.len()];
        Checker {
            ctx: Context::default(),
            properties,
            broken,
        }
    }

    /// For a first view `view` of members `0..member_count`, whose senders
    /// are `sender_ranks` (in sender-position order).
    pub fn new_static(view: u64, member_count: usize, sender_ranks: &[usize], ordered: bool) -> Checker {
        let members: Vec<usize> = (0..member_count).collect();
        Checker::with_members(view, &members, member_count, sender_ranks, ordered)
    }

    /// A group whose first view `view` has `members` out of `capacity`
    /// ranks (the others may join later), whose senders are
    /// `sender_ranks`; what each sender sends is told with
    /// [`Checker::record_sent`]. Total order, no loss and virtual
    /// synchrony apply when `ordered`.
    pub fn with_members(
        view: u64,
        members: &[usize],
        capacity: usize,
        sender_ranks: &[usize],
        ordered: bool,
    ) -> Checker {
        let mut c = Checker::new(Scope {
            total_order: ordered,
            survivors: ordered,
        });
        let info = ViewInfo {
            members: members.to_vec(),
            senders: Some(sender_ranks.to_vec()),
            first: members.first().copied().unwrap_or(0),
        };
        c.ctx.views.insert(view, info);
        c.ctx.view_ids.insert(view);
        c.ctx.sent = Some(Vec::new());
        for m in 0..capacity {
            let first = members.contains(&m);
            let state = MemberInfo {
                view: first.then_some(view),
                first_view: first,
                ..tracked()
            };
            c.ctx.members.insert(m, state);
        }
        c
    }

    /// `member` exists (it may never deliver); `tracked`: its deliveries
    /// are checked against the views it installed.
    pub fn add_member(&mut self, member: usize, tracked: bool) {
        self.ctx.members.entry(member).or_default().tracked = tracked;
    }

    /// The group follows an outer group's view (a shard following the
    /// top-level group: `GroupCore::follow_view`): the outer group's
    /// majority decides who is out, so the view chain does not check a
    /// majority of the previous view (the caller checks instead that each
    /// view leaves out only members the outer view left out).
    pub fn majority_decided_outside(&mut self) {
        self.ctx.majority_outside = true;
    }

    /// `member` left the group on request.
    pub fn on_leave(&mut self, member: usize) {
        self.ctx.left.insert(member);
    }

    /// The application of `sender_rank` sent its next message (in any
    /// view: the checker keeps one send order per sender).
    pub fn record_sent(&mut self, sender_rank: usize, len: u64, xxh3: u64) {
        let sent = self.ctx.sent.get_or_insert_with(Vec::new);
        if sent.len() <= sender_rank {
            sent.resize(sender_rank + 1, Vec::new());
        }
        sent[sender_rank].push((len, xxh3));
    }

    /// One event, in its member's order: the first violation it causes
    /// (properties already broken are not asked again).
    pub fn observe(&mut self, event: &Event<'_>) -> Result<(), Violation> {
        let mut first = None;
        for (p, broken) in self.properties.iter_mut().zip(self.broken.iter_mut()) {
            if broken.is_some() {
                continue;
            }
            if let Err(v) = p.observe(&self.ctx, event) {
                debug_assert_eq!(v.property, p.name(), "a property reports only itself");
                first.get_or_insert_with(|| v.clone());
                *broken = Some(v);
            }
        }
        self.ctx.apply(event);
        first.map_or(Ok(()), Err)
    }

    /// `member` installed `view`, whose members are `members` (ascending),
    /// senders unknown. Call it in the member's own order of events: after
    /// its last delivery of the view it leaves, before its first of `view`.
    pub fn on_view(&mut self, member: usize, view: u64, members: &[usize]) -> Result<(), Violation> {
        self.observe(&Event::View(Installed {
            member,
            view,
            members,
            senders: None,
        }))
    }

    /// [`Checker::on_view`] for a view whose senders are known.
    pub fn on_view_with_senders(
        &mut self,
        member: usize,
        view: u64,
        members: &[usize],
        senders: &[usize],
    ) -> Result<(), Violation> {
        self.observe(&Event::View(Installed {
            member,
            view,
            members,
            senders: Some(senders),
        }))
    }

    /// One delivery, in the order `d.member` delivered it.
    pub fn check(&mut self, d: &Delivered) -> Result<(), Violation> {
        self.observe(&Event::Delivery(d))
    }

    /// The end of the run: `expected_per_sender` (how many messages each
    /// sender id sent) for no gaps, which applies only when the membership
    /// never changed. Returns the first violation of the run, if any.
    pub fn finish(&mut self, expected_per_sender: Option<&BTreeMap<usize, u64>>) -> Result<(), Violation> {
        self.ctx.expected_per_sender = expected_per_sender.cloned();
        for (p, broken) in self.properties.iter_mut().zip(self.broken.iter_mut()) {
            if broken.is_none() {
                *broken = p.finish(&self.ctx).err();
            }
        }
        self.violations().into_iter().next().map_or(Ok(()), Err)
    }

    /// Each broken property's first violation, in [`REPORT_ORDER`].
    pub fn violations(&self) -> Vec<Violation> {
        let mut all: Vec<Violation> = self.broken.iter().flatten().cloned().collect();
        all.sort_by_key(|v| REPORT_ORDER.iter().position(|p| *p == v.property));
        all
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Deliveries by `member`, in all views.
    pub fn delivered_by(&self, member: usize) -> u64 {
        self.ctx.member(member).map_or(0, |m| m.delivered)
    }

    /// Messages sent so far by `sender_rank`.
    pub fn sent_by(&self, sender_rank: usize) -> u64 {
        self.ctx.sent(sender_rank).map_or(0, |s| s.len() as u64)
    }

    /// The view `member` installed last (None: not a member yet).
    pub fn view_of(&self, member: usize) -> Option<u64> {
        self.ctx.view_of(member)
    }

    /// The members of view `view`, if some member installed it.
    pub fn members_of(&self, view: u64) -> Option<&[usize]> {
        self.ctx.view(view).map(|v| v.members.as_slice())
    }

    /// See [`Context::membership_changed`].
    pub fn membership_changed(&self) -> bool {
        self.ctx.membership_changed()
    }
}
