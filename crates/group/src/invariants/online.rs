//! The same properties as the log checkers, checked one delivery (or one
//! view installation) at a time (O(1) or O(log n) each, except a view
//! change, which compares the sets delivered in the view that ended), so
//! the simulator can check after every step of every member without
//! re-reading whole logs. Property names match the log checkers.
//!
//! It knows what was sent ([`OnlineChecker::record_sent`]: per sender, in
//! send order, each message's length and xxh3) and which view each member
//! is in ([`OnlineChecker::new`] puts members `0..member_count` in the
//! first view; [`OnlineChecker::on_view`] moves one member to a later
//! view), so it checks more than the logs alone can show:
//!
//! - **delivery in the sending view**: a member delivers only in the view it
//!   installed last, only from members of that view;
//! - **integrity**: only senders of the view (when the view's senders are
//!   known), only messages that were sent, in the sender's send order,
//!   with their bytes; every member got the same bytes for a
//!   `(view, sender, index)`;
//! - **no duplication** and **per-sender FIFO**: within a view, indices
//!   strictly increase per sender;
//! - **no gaps**: while a member is still in the first view, its `j`-th
//!   delivery from a sender is that sender's `j`-th message. After a view
//!   change messages beyond the ragged edge are legitimately never
//!   delivered, so a member that changed views may skip messages of a
//!   sender (its deliveries from each sender stay a subsequence of what
//!   the sender sent, in order); no loss and virtual synchrony take over;
//! - **total order** (ordered mode), per view: seq strictly increases, `seq =
//!   index × senders + sender position` (when the view's senders are known),
//!   and every member's delivery sequence in the view is a prefix of one
//!   agreed sequence (the first member to deliver position `k` fixes it);
//! - **view chain**: a member's views strictly increase, one membership (and
//!   one sender list) per view id, a member installs only views that list
//!   it, a new view keeps a majority of the previous known view;
//! - **virtual synchrony** and **no loss**, when a member installs a view
//!   after `v`: what it delivered in `v` equals what the first member to move
//!   past `v` delivered in it (it lacks something: no loss; it has more:
//!   virtual synchrony); a member of `v` that moves past `v` without ever
//!   installing it must not have missed anything either (no loss).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{LogEntry, Violation};

/// One delivery as the simulator saw it.
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
}

/// A view as the checker knows it.
#[derive(Clone, Debug)]
struct ViewInfo {
    /// Ascending member ids.
    members: Vec<usize>,
    /// The senders, in sender-position order, when known.
    senders: Option<Vec<usize>>,
    /// The first member that installed it (for the evidence).
    first: usize,
}

/// What the members did in one view.
#[derive(Default)]
struct ViewState {
    /// Ordered mode: the agreed sequence: (sender, index, seq) and who delivered it first.
    agreed: Vec<(usize, u64, u64, usize)>,
    /// Every message delivered in the view: its bytes and who delivered it first.
    content: HashMap<(usize, u64), (u64, u64, usize)>,
    /// The first member that moved past the view, with what it delivered in it.
    reference: Option<(usize, BTreeSet<(usize, u64)>)>,
    /// Members of the view that moved past it without installing it, before
    /// any reference existed.
    skipped: Vec<usize>,
}

#[derive(Clone, Default)]
struct MemberState {
    /// The view it installed last (None: none yet, e.g. a joiner).
    view: Option<u64>,
    /// Still in the first view, given by [`OnlineChecker::new`]: strict no-gaps.
    first_view: bool,
    /// [`OnlineChecker::on_view`] was called for its current view.
    confirmed: bool,
    /// In the current view: per sender, the last index.
    last_index: HashMap<usize, u64>,
    last_seq: Option<u64>,
    /// In the current view: how many delivered, and which.
    in_view: u64,
    set: BTreeSet<(usize, u64)>,
    /// Per sender id, across views: where in the sender's sent messages the
    /// next delivery from it is.
    next_sent: Vec<usize>,
    delivered: u64,
}

/// How far the lookahead goes to tell a gap from corrupted bytes.
const GAP_LOOKAHEAD_MAX: usize = 64;

pub struct OnlineChecker {
    ordered: bool,
    /// Known views by id.
    views: BTreeMap<u64, ViewInfo>,
    /// Per view id: what members delivered in it.
    per_view: HashMap<u64, ViewState>,
    /// Per sender id, in send order: (len, xxh3).
    sent: Vec<Vec<(u64, u64)>>,
    /// Per member id.
    members: Vec<MemberState>,
    /// Members that left on request (they count toward the majority rule:
    /// they agreed to the view that dropped them).
    left: BTreeSet<usize>,
}

fn get_or_zero(v: &[usize], i: usize) -> usize {
    v.get(i).copied().unwrap_or(0)
}

impl OnlineChecker {
    /// For a first view `view` of members `0..member_count`, whose senders
    /// are `sender_ranks` (in sender-position order).
    pub fn new(view: u64, member_count: usize, sender_ranks: &[usize], ordered: bool) -> OnlineChecker {
        let members: Vec<usize> = (0..member_count).collect();
        OnlineChecker::with_members(view, &members, member_count, sender_ranks, ordered)
    }

    /// A group whose first view `view` has `members` out of `capacity`
    /// ranks (the others may join later).
    pub fn with_members(
        view: u64,
        members: &[usize],
        capacity: usize,
        sender_ranks: &[usize],
        ordered: bool,
    ) -> OnlineChecker {
        let info = ViewInfo {
            members: members.to_vec(),
            senders: Some(sender_ranks.to_vec()),
            first: members.first().copied().unwrap_or(0),
        };
        OnlineChecker {
            ordered,
            views: BTreeMap::from([(view, info)]),
            per_view: HashMap::new(),
            sent: Vec::new(),
            members: (0..capacity)
                .map(|m| MemberState {
                    view: members.contains(&m).then_some(view),
                    first_view: members.contains(&m),
                    ..MemberState::default()
                })
                .collect(),
            left: BTreeSet::new(),
        }
    }

    /// `member` left the group on request.
    pub fn on_leave(&mut self, member: usize) {
        self.left.insert(member);
    }

    /// The application of `sender_rank` sent its next message (in any
    /// view: the checker keeps one send order per sender).
    pub fn record_sent(&mut self, sender_rank: usize, len: u64, xxh3: u64) {
        if self.sent.len() <= sender_rank {
            self.sent.resize(sender_rank + 1, Vec::new());
        }
        self.sent[sender_rank].push((len, xxh3));
    }

    /// Messages sent so far by `sender_rank`.
    pub fn sent_by(&self, sender_rank: usize) -> u64 {
        self.sent.get(sender_rank).map_or(0, |s| s.len() as u64)
    }

    /// Data messages `member` has delivered, in all views.
    pub fn delivered_by(&self, member: usize) -> u64 {
        self.members.get(member).map_or(0, |m| m.delivered)
    }

    /// Whether `member` has delivered every message sent so far by the
    /// senders of its current view (the members of the view when its
    /// senders are not known), after the last one it delivered from each.
    /// In a static group: everything sent so far. Messages a sender sent
    /// in a view that ended and the ragged edge trimmed count only while
    /// nothing later of that sender has been delivered.
    pub fn has_everything(&self, member: usize) -> bool {
        let Some(state) = self.members.get(member) else {
            return false;
        };
        let Some(info) = state.view.and_then(|v| self.views.get(&v)) else {
            return false;
        };
        let senders = info.senders.as_deref().unwrap_or(&info.members);
        senders
            .iter()
            .all(|s| get_or_zero(&state.next_sent, *s) == self.sent.get(*s).map_or(0, |x| x.len()))
    }

    /// The view `member` installed last (None: not a member yet).
    pub fn view_of(&self, member: usize) -> Option<u64> {
        self.members.get(member).and_then(|m| m.view)
    }

    /// The members of view `view`, if some member installed it.
    pub fn members_of(&self, view: u64) -> Option<&[usize]> {
        self.views.get(&view).map(|v| v.members.as_slice())
    }

    /// `member` installed `view`, whose members are `members` (ascending):
    /// checks the view chain and, when it leaves a view, virtual synchrony
    /// and no loss for that view (and for views it skipped). Calling it for
    /// the first view given to [`OnlineChecker::new`] is allowed (once per
    /// member) and checks the membership. The senders of a view installed
    /// this way are not known: see [`OnlineChecker::on_view_with_senders`].
    ///
    /// Call it in the member's own order of events: after checking its last
    /// delivery of the view it leaves (the ragged edge included), before its
    /// first delivery of `view`.
    pub fn on_view(&mut self, member: usize, view: u64, members: &[usize]) -> Result<(), Violation> {
        self.install(member, view, members, None)
    }

    /// [`OnlineChecker::on_view`] for a view whose senders are known
    /// (`senders`, in sender-position order: `seq = index × senders.len() +
    /// position`): delivery checks then use them as for the first view.
    pub fn on_view_with_senders(
        &mut self,
        member: usize,
        view: u64,
        members: &[usize],
        senders: &[usize],
    ) -> Result<(), Violation> {
        self.install(member, view, members, Some(senders))
    }

    fn install(
        &mut self,
        member: usize,
        view: u64,
        members: &[usize],
        senders: Option<&[usize]>,
    ) -> Result<(), Violation> {
        let chain = |detail: String| Err(Violation::new("view chain", detail));
        if members.windows(2).any(|w| w[1] <= w[0]) {
            return chain(format!(
                "member {member} installed view {view} with members {members:?}: not ascending and unique"
            ));
        }
        if members.binary_search(&member).is_err() {
            return chain(format!(
                "member {member} installed view {view} whose members {members:?} do not include it"
            ));
        }
        if let Some(s) = senders.and_then(|s| s.iter().find(|s| members.binary_search(s).is_err())) {
            return chain(format!(
                "view {view} has sender {s}, which is not one of its members {members:?}"
            ));
        }
        if self.members.len() <= member {
            self.members.resize(member + 1, MemberState::default());
        }
        let current = self.members[member].view;
        if let Some(cur) = current {
            let confirming = view == cur && !self.members[member].confirmed;
            if view < cur || (view == cur && !confirming) {
                return chain(format!("member {member} installed view {view} after view {cur}"));
            }
        }
        match self.views.get_mut(&view) {
            Some(info) => {
                if info.members != members {
                    return chain(format!(
                        "split brain: member {} installed view {view} as {:?}, member {member} as {members:?}",
                        info.first, info.members
                    ));
                }
                match (&info.senders, senders) {
                    (Some(known), Some(s)) if known.as_slice() != s => {
                        return chain(format!(
                            "member {} installed view {view} with senders {known:?}, member {member} with {s:?}",
                            info.first
                        ));
                    }
                    (None, Some(s)) => info.senders = Some(s.to_vec()),
                    _ => {}
                }
            }
            None => {
                if let Some((prev_id, prev)) = self.views.range(..view).next_back() {
                    let kept = prev
                        .members
                        .iter()
                        .filter(|m| members.binary_search(m).is_ok() || self.left.contains(m))
                        .count();
                    if kept * 2 <= prev.members.len() {
                        return chain(format!(
                            "view {view} {members:?} keeps {kept} of the {} members of view {prev_id} {:?}: not a majority",
                            prev.members.len(),
                            prev.members
                        ));
                    }
                }
                self.views.insert(
                    view,
                    ViewInfo {
                        members: members.to_vec(),
                        senders: senders.map(|s| s.to_vec()),
                        first: member,
                    },
                );
            }
        }
        if current == Some(view) {
            self.members[member].confirmed = true;
            return Ok(());
        }
        // Leaving `current` (if any), and skipping the views between that list it.
        // Virtual synchrony and no loss are properties of ordered delivery:
        // unordered delivery hands a message over on receipt, before any
        // other member may have it.
        if let (Some(old), true) = (current, self.ordered) {
            let set = std::mem::take(&mut self.members[member].set);
            self.moved_past(member, old, view, set)?;
        }
        let skipped: Vec<u64> = self
            .views
            .range(..view)
            .filter(|(id, info)| current.is_none_or(|c| **id > c) && info.members.binary_search(&member).is_ok())
            .map(|(id, _)| *id)
            .collect();
        // A joiner not yet admitted (no current view) that skipped views
        // listing it was a failed incarnation in them, not a survivor.
        if self.ordered && current.is_some() {
            for u in skipped {
                self.skipped_view(member, u, view)?;
            }
        }
        let state = &mut self.members[member];
        state.view = Some(view);
        state.first_view = false;
        state.confirmed = true;
        state.last_index.clear();
        state.last_seq = None;
        state.in_view = 0;
        state.set.clear();
        Ok(())
    }

    /// `member` leaves view `v` for `next` having delivered `set` in it.
    fn moved_past(&mut self, member: usize, v: u64, next: u64, set: BTreeSet<(usize, u64)>) -> Result<(), Violation> {
        let vs = self.per_view.entry(v).or_default();
        match &vs.reference {
            None => {
                if let (Some(skipper), Some((s, i))) = (vs.skipped.first(), set.first()) {
                    return Err(Violation::new(
                        "no loss",
                        format!(
                            "member {member} delivered (sender {s}, index {i}) in view {v} and moved on to view {next}; member {skipper}, a member of view {v}, moved past it without installing it"
                        ),
                    ));
                }
                vs.reference = Some((member, set));
                Ok(())
            }
            Some((r, rset)) => {
                if let Some((s, i)) = rset.difference(&set).next() {
                    return Err(Violation::new(
                        "no loss",
                        format!(
                            "member {member} moved from view {v} to view {next} without delivering (sender {s}, index {i}), which member {r} delivered in view {v} before moving on ({} vs {} messages)",
                            set.len(),
                            rset.len()
                        ),
                    ));
                }
                if let Some((s, i)) = set.difference(rset).next() {
                    return Err(Violation::new(
                        "virtual synchrony",
                        format!(
                            "member {member} delivered (sender {s}, index {i}) in view {v} and moved on to view {next}; member {r} moved on from view {v} without it ({} vs {} messages)",
                            set.len(),
                            rset.len()
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    /// `member`, listed in view `u`, installed `next` > `u` without installing `u`.
    fn skipped_view(&mut self, member: usize, u: u64, next: u64) -> Result<(), Violation> {
        let vs = self.per_view.entry(u).or_default();
        match &vs.reference {
            Some((r, rset)) => match rset.first() {
                Some((s, i)) => Err(Violation::new(
                    "no loss",
                    format!(
                        "member {r} delivered (sender {s}, index {i}) in view {u} and moved on; member {member}, a member of view {u}, went to view {next} without installing view {u}"
                    ),
                )),
                None => Ok(()),
            },
            None => {
                vs.skipped.push(member);
                Ok(())
            }
        }
    }

    /// Check one delivery, in the order `d.member` delivered it.
    pub fn check(&mut self, d: &Delivered) -> Result<(), Violation> {
        let m = d.member;
        let Some(cur) = self.members.get(m).and_then(|s| s.view) else {
            return Err(Violation::new(
                "delivery in the sending view",
                format!(
                    "member {m} delivered sender {} index {} in view {} before installing any view",
                    d.sender, d.index, d.view
                ),
            ));
        };
        if d.view != cur {
            return Err(Violation::new(
                "delivery in the sending view",
                format!(
                    "member {m} delivered sender {} index {} in view {}, but its current view is {cur}",
                    d.sender, d.index, d.view
                ),
            ));
        }
        let info = &self.views[&cur];
        if info.members.binary_search(&d.sender).is_err() {
            return Err(Violation::new(
                "delivery in the sending view",
                format!(
                    "member {m} delivered sender {} index {} in view {cur}, whose members {:?} do not include the sender",
                    d.sender, d.index, info.members
                ),
            ));
        }
        let position = match &info.senders {
            Some(senders) => match senders.iter().position(|s| *s == d.sender) {
                Some(p) => Some((p, senders.len())),
                None => {
                    return Err(Violation::new(
                        "integrity",
                        format!(
                            "member {m} delivered a message from {}, which is not a sender of the view",
                            d.sender
                        ),
                    ))
                }
            },
            None => None,
        };
        self.check_fifo(d)?;
        let next = self.check_content(d)?;
        self.check_same_bytes(d)?;
        if self.ordered {
            self.check_order(d, position)?;
        }
        let state = &mut self.members[m];
        if state.next_sent.len() <= d.sender {
            state.next_sent.resize(d.sender + 1, 0);
        }
        state.next_sent[d.sender] = next;
        state.last_index.insert(d.sender, d.index);
        state.last_seq = Some(d.seq);
        state.in_view += 1;
        state.set.insert((d.sender, d.index));
        state.delivered += 1;
        Ok(())
    }

    fn check_fifo(&self, d: &Delivered) -> Result<(), Violation> {
        match self.members[d.member].last_index.get(&d.sender).copied() {
            Some(last) if d.index == last => Err(Violation::new(
                "no duplication",
                format!(
                    "member {} delivered sender {} index {} twice in view {}",
                    d.member, d.sender, d.index, d.view
                ),
            )),
            Some(last) if d.index < last => Err(Violation::new(
                "per-sender FIFO",
                format!(
                    "member {} delivered sender {} index {} after index {last} in view {}",
                    d.member, d.sender, d.index, d.view
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Which of the sender's sent messages this is; returns the position
    /// after it.
    fn check_content(&self, d: &Delivered) -> Result<usize, Violation> {
        let state = &self.members[d.member];
        let j = get_or_zero(&state.next_sent, d.sender);
        let sent = self.sent.get(d.sender).map_or(&[][..], |s| s.as_slice());
        let this = (d.len, d.xxh3);
        if sent.get(j) == Some(&this) {
            return Ok(j + 1);
        }
        if !state.first_view {
            // After a view change: any later message of the sender (the
            // ragged edge may have trimmed some).
            if let Some(k) = sent.iter().skip(j + 1).position(|x| *x == this) {
                return Ok(j + 2 + k);
            }
            return Err(Violation::new(
                "integrity",
                format!(
                    "member {} delivered sender {} index {} in view {} as {} B xxh3 {:016x}: no message the sender sent after its message #{j} has these bytes (it sent {})",
                    d.member, d.sender, d.index, d.view, d.len, d.xxh3, sent.len()
                ),
            ));
        }
        let ahead = sent.iter().enumerate().skip(j + 1).take(GAP_LOOKAHEAD_MAX);
        if let Some((k, _)) = ahead.into_iter().find(|(_, x)| **x == this) {
            return Err(Violation::new(
                "no gaps",
                format!(
                    "member {} delivered sender {}'s message #{k} (index {}) but never its message #{j}",
                    d.member, d.sender, d.index
                ),
            ));
        }
        let detail = match sent.get(j) {
            Some((len, hash)) => format!(
                "member {} delivered sender {} message #{j} (index {}) as {} B xxh3 {:016x}; it was sent as {len} B xxh3 {hash:016x}",
                d.member, d.sender, d.index, d.len, d.xxh3
            ),
            None => format!(
                "member {} delivered a message #{j} (index {}) from sender {}, which sent only {}",
                d.member, d.index, d.sender, sent.len()
            ),
        };
        Err(Violation::new("integrity", detail))
    }

    /// Every member delivers the same bytes for a (view, sender, index).
    fn check_same_bytes(&mut self, d: &Delivered) -> Result<(), Violation> {
        let vs = self.per_view.entry(d.view).or_default();
        match vs.content.get(&(d.sender, d.index)) {
            None => {
                vs.content.insert((d.sender, d.index), (d.len, d.xxh3, d.member));
                Ok(())
            }
            Some(&(len, hash, first)) if (len, hash) != (d.len, d.xxh3) => Err(Violation::new(
                "integrity",
                format!(
                    "view {} sender {} index {}: member {first} got {len} B xxh3 {hash:016x}, member {} got {} B xxh3 {:016x}",
                    d.view, d.sender, d.index, d.member, d.len, d.xxh3
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    fn check_order(&mut self, d: &Delivered, position: Option<(usize, usize)>) -> Result<(), Violation> {
        let m = d.member;
        if let Some((s, senders)) = position {
            if d.seq != d.index * senders as u64 + s as u64 {
                return Err(Violation::new(
                    "total order",
                    format!(
                        "member {m} delivered sender {} index {} with seq {} in view {}, not index × {senders} + {s}",
                        d.sender, d.index, d.seq, d.view
                    ),
                ));
            }
        }
        let state = &self.members[m];
        if let Some(last) = state.last_seq {
            if d.seq <= last {
                return Err(Violation::new(
                    "total order",
                    format!("member {m} delivered seq {} after seq {last} in view {}", d.seq, d.view),
                ));
            }
        }
        let pos = state.in_view as usize;
        let agreed = &mut self.per_view.entry(d.view).or_default().agreed;
        match agreed.get(pos) {
            None => {
                debug_assert_eq!(pos, agreed.len(), "members append to the agreed sequence in order");
                agreed.push((d.sender, d.index, d.seq, m));
                Ok(())
            }
            Some(&(sender, index, seq, first)) if (sender, index, seq) != (d.sender, d.index, d.seq) => Err(Violation::new(
                "total order",
                format!(
                    "view {} delivery #{pos}: member {m} delivered (sender {}, index {}, seq {}) but member {first} delivered (sender {sender}, index {index}, seq {seq})",
                    d.view, d.sender, d.index, d.seq
                ),
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(member: usize, sender: usize, index: u64, len: u64) -> Delivered {
        Delivered {
            member,
            view: 0,
            sender,
            index,
            seq: index * 2 + sender as u64,
            len,
            xxh3: len * 31,
        }
    }

    fn checker() -> OnlineChecker {
        let mut c = OnlineChecker::new(0, 2, &[0, 1], true);
        for len in [1, 2, 3] {
            c.record_sent(0, len, len * 31);
            c.record_sent(1, len + 10, (len + 10) * 31);
        }
        c
    }

    #[test]
    fn a_correct_run_passes() {
        let mut c = checker();
        for m in 0..2 {
            for (s, i, len) in [(0, 0, 1), (1, 0, 11), (0, 1, 2), (1, 2, 12)] {
                c.check(&d(m, s, i, len)).unwrap();
            }
        }
        assert_eq!(c.delivered_by(1), 4);
        assert!(!c.has_everything(0));
    }

    #[test]
    fn each_broken_property_is_named() {
        let cases: Vec<(Vec<Delivered>, &str)> = vec![
            (vec![d(0, 0, 0, 1), d(0, 0, 0, 1)], "no duplication"),
            (vec![d(0, 0, 3, 1), d(0, 0, 1, 2)], "per-sender FIFO"),
            (vec![d(0, 0, 0, 2)], "no gaps"),
            (vec![d(0, 0, 0, 9)], "integrity"),
            (vec![d(0, 1, 0, 11), d(0, 0, 0, 1)], "total order"),
            (vec![d(0, 0, 0, 1), d(1, 1, 0, 11)], "total order"),
            (
                vec![Delivered {
                    view: 3,
                    ..d(0, 0, 0, 1)
                }],
                "delivery in the sending view",
            ),
            (
                vec![Delivered {
                    seq: 5,
                    ..d(0, 0, 0, 1)
                }],
                "total order",
            ),
        ];
        for (deliveries, property) in cases {
            let mut c = checker();
            let err = deliveries.iter().try_for_each(|x| c.check(x)).unwrap_err();
            assert_eq!(err.property, property, "{deliveries:?}: {err}");
        }
    }

    /// Sender `s`'s `k`-th message: its length and xxh3.
    fn msg(s: usize, k: u64) -> (u64, u64) {
        let len = 100 * s as u64 + k + 1;
        (len, len * 31)
    }

    /// (sender, index, seq, which of the sender's messages).
    type Agreed = [(usize, u64, u64, u64)];

    fn dv(member: usize, view: u64, (sender, index, seq, k): (usize, u64, u64, u64)) -> Delivered {
        let (len, xxh3) = msg(sender, k);
        Delivered {
            member,
            view,
            sender,
            index,
            seq,
            len,
            xxh3,
        }
    }

    fn deliver(c: &mut OnlineChecker, member: usize, view: u64, order: &Agreed) -> Result<(), Violation> {
        order.iter().try_for_each(|x| c.check(&dv(member, view, *x)))
    }

    /// View 0 = {0, 1, 2, 3}, all senders: member 3 crashes after 2
    /// deliveries; the ragged edge delivers (0, 1) to every survivor and
    /// trims sender 1's message #1.
    const V0: &Agreed = &[(0, 0, 0, 0), (1, 0, 1, 0), (2, 0, 2, 0), (3, 0, 3, 0), (0, 1, 4, 1)];
    /// View 1 = {0, 1, 2} (senders not told): sender 1 goes on with #2.
    const V1: &Agreed = &[(0, 0, 0, 2), (1, 0, 1, 2), (2, 0, 2, 1)];
    /// View 2 = {0, 1} (member 2 left), senders [0, 1].
    const V2: &Agreed = &[(0, 0, 0, 3), (1, 0, 1, 3)];
    /// View 3 = {0, 1, 4} (member 4 joined).
    const V3: &Agreed = &[(0, 0, 0, 4), (1, 0, 1, 4), (4, 0, 2, 0)];

    fn multi() -> OnlineChecker {
        let mut c = OnlineChecker::new(0, 4, &[0, 1, 2, 3], true);
        for s in 0..4 {
            for k in 0..5 {
                let (len, hash) = msg(s, k);
                c.record_sent(s, len, hash);
            }
        }
        c
    }

    /// Everything up to view 2 installed by members 0 and 1, with the
    /// members moving at different times.
    fn through_view_2() -> OnlineChecker {
        let mut c = multi();
        deliver(&mut c, 3, 0, &V0[..2]).unwrap(); // then crashes
        deliver(&mut c, 0, 0, V0).unwrap();
        c.on_view(0, 1, &[0, 1, 2]).unwrap();
        deliver(&mut c, 0, 1, &V1[..1]).unwrap();
        deliver(&mut c, 1, 0, V0).unwrap();
        deliver(&mut c, 2, 0, V0).unwrap();
        c.on_view(2, 1, &[0, 1, 2]).unwrap();
        c.on_view(1, 1, &[0, 1, 2]).unwrap();
        for m in [2, 1] {
            deliver(&mut c, m, 1, V1).unwrap();
        }
        deliver(&mut c, 0, 1, &V1[1..]).unwrap();
        for m in [1, 0] {
            c.on_view_with_senders(m, 2, &[0, 1], &[0, 1]).unwrap();
            deliver(&mut c, m, 2, V2).unwrap();
        }
        c
    }

    #[test]
    fn a_crash_a_ragged_edge_a_leave_and_a_join_pass() {
        let mut c = through_view_2();
        assert_eq!(c.view_of(0), Some(2));
        assert_eq!(c.view_of(2), Some(1));
        assert_eq!(c.view_of(3), Some(0));
        assert_eq!(c.members_of(1), Some(&[0, 1, 2][..]));
        assert!(c.has_everything(0) == c.has_everything(1));
        assert_eq!(c.delivered_by(0), 10);
        assert_eq!(c.delivered_by(3), 2);
        // Member 4 joins.
        let (len, hash) = msg(4, 0);
        c.record_sent(4, len, hash);
        assert_eq!(c.sent_by(4), 1);
        c.on_view(4, 3, &[0, 1, 4]).unwrap();
        c.on_view(0, 3, &[0, 1, 4]).unwrap();
        deliver(&mut c, 4, 3, V3).unwrap();
        deliver(&mut c, 0, 3, &V3[..2]).unwrap();
        c.on_view(1, 3, &[0, 1, 4]).unwrap();
        deliver(&mut c, 1, 3, V3).unwrap();
        assert_eq!(c.delivered_by(4), 3);
        assert!(c.has_everything(4)); // every message of 0, 1 and 4 sent so far
        assert!(!c.has_everything(0)); // not (4, 0) yet
        deliver(&mut c, 0, 3, &V3[2..]).unwrap();
        assert!(c.has_everything(0));
        // Confirming the first view (once) is allowed.
        let mut c = multi();
        c.on_view(0, 0, &[0, 1, 2, 3]).unwrap();
        deliver(&mut c, 0, 0, V0).unwrap();
        c.on_view(1, 0, &[0, 1, 2, 3]).unwrap();
    }

    fn property(r: Result<(), Violation>) -> &'static str {
        r.unwrap_err().property
    }

    #[test]
    fn delivery_outside_the_current_view_is_caught() {
        let mut c = through_view_2();
        // Member 0 is in view 2: a late view-1 message.
        assert_eq!(
            property(c.check(&dv(0, 1, (2, 1, 5, 2)))),
            "delivery in the sending view"
        );
        // A view-2 message from member 2, which left.
        assert_eq!(
            property(c.check(&dv(1, 2, (2, 0, 2, 2)))),
            "delivery in the sending view"
        );
        // A joiner before it installed its first view.
        assert_eq!(
            property(c.check(&dv(4, 3, (0, 0, 0, 4)))),
            "delivery in the sending view"
        );
        // Member 2 (still in view 1) delivers in view 2.
        assert_eq!(
            property(c.check(&dv(2, 2, (0, 0, 0, 3)))),
            "delivery in the sending view"
        );
    }

    #[test]
    fn a_ragged_edge_that_reaches_some_survivors_only_is_caught() {
        // Member 1 moves on without the last message of view 0 that member 0 delivered.
        let mut c = multi();
        deliver(&mut c, 0, 0, V0).unwrap();
        c.on_view(0, 1, &[0, 1, 2]).unwrap();
        deliver(&mut c, 1, 0, &V0[..4]).unwrap();
        let e = c.on_view(1, 1, &[0, 1, 2]).unwrap_err();
        assert_eq!(e.property, "no loss");
        assert!(e.detail.contains("without delivering (sender 0, index 1)"), "{e}");
        // The other way round: the one that moved first lacks it.
        let mut c = multi();
        deliver(&mut c, 1, 0, &V0[..4]).unwrap();
        c.on_view(1, 1, &[0, 1, 2]).unwrap();
        deliver(&mut c, 0, 0, V0).unwrap();
        let e = c.on_view(0, 1, &[0, 1, 2]).unwrap_err();
        assert_eq!(e.property, "virtual synchrony");
        assert!(e.detail.contains("member 1 moved on from view 0 without it"), "{e}");
        // A member still in view 0 (or crashed there) may lag.
        let mut c = multi();
        deliver(&mut c, 0, 0, V0).unwrap();
        deliver(&mut c, 1, 0, V0).unwrap();
        deliver(&mut c, 2, 0, &V0[..1]).unwrap();
        c.on_view(0, 1, &[0, 1, 2]).unwrap();
        c.on_view(1, 1, &[0, 1, 2]).unwrap();
    }

    #[test]
    fn a_member_that_skips_a_view_it_is_in_is_caught() {
        let mut c = multi();
        for m in [0, 1] {
            deliver(&mut c, m, 0, V0).unwrap();
        }
        c.on_view(0, 1, &[0, 1, 2]).unwrap();
        deliver(&mut c, 0, 1, &V1[..1]).unwrap();
        c.on_view(0, 2, &[0, 1]).unwrap();
        let e = c.on_view(1, 2, &[0, 1]).unwrap_err();
        assert_eq!(e.property, "no loss");
        assert!(e.detail.contains("without installing view 1"), "{e}");
        // Skipping first, then the reference moves on with messages of view 1.
        let mut c = multi();
        for m in [0, 1, 2] {
            deliver(&mut c, m, 0, V0).unwrap();
        }
        c.on_view(0, 1, &[0, 1, 2]).unwrap();
        c.on_view(2, 2, &[0, 1, 2]).unwrap(); // member 2 goes from view 0 to view 2
        deliver(&mut c, 0, 1, &V1[..1]).unwrap();
        let e = c.on_view(0, 2, &[0, 1, 2]).unwrap_err();
        assert_eq!(e.property, "no loss");
        assert!(
            e.detail
                .contains("member 2, a member of view 1, moved past it without installing it"),
            "{e}"
        );
        // Nothing delivered in the skipped view: nothing lost.
        let mut c = multi();
        for m in [0, 1, 2] {
            deliver(&mut c, m, 0, V0).unwrap();
        }
        c.on_view(0, 1, &[0, 1, 2]).unwrap();
        c.on_view(2, 2, &[0, 1, 2]).unwrap();
        c.on_view(0, 2, &[0, 1, 2]).unwrap();
    }

    #[test]
    fn view_chain_violations_are_caught() {
        let chain = |f: &dyn Fn(&mut OnlineChecker) -> Result<(), Violation>| {
            let mut c = through_view_2();
            let e = f(&mut c).unwrap_err();
            assert_eq!(e.property, "view chain", "{e}");
            e.detail
        };
        // Split brain: member 2 installs its own view 2.
        assert!(chain(&|c| c.on_view(2, 2, &[2])).contains("split brain"));
        // Going back, or installing the same view twice.
        assert!(chain(&|c| c.on_view(0, 1, &[0, 1, 2])).contains("after view 2"));
        assert!(chain(&|c| c.on_view(0, 2, &[0, 1])).contains("after view 2"));
        // Not listed in the view.
        assert!(chain(&|c| c.on_view(2, 3, &[0, 1])).contains("do not include it"));
        // Not ascending.
        assert!(chain(&|c| c.on_view(0, 3, &[1, 0])).contains("not ascending"));
        // Not a majority of view 2 {0, 1}.
        assert!(chain(&|c| c.on_view(4, 3, &[1, 4, 5])).contains("not a majority"));
        // Senders that disagree, or that are not members.
        assert!(chain(&|c| c.on_view_with_senders(0, 3, &[0, 1], &[2])).contains("not one of its members"));
        let mut c = multi();
        c.on_view_with_senders(0, 1, &[0, 1, 2], &[0, 1]).unwrap();
        let e = c.on_view_with_senders(1, 1, &[0, 1, 2], &[0]).unwrap_err();
        assert!(e.detail.contains("with senders [0, 1]"), "{e}");
        // Confirming the first view twice.
        let mut c = multi();
        c.on_view(0, 0, &[0, 1, 2, 3]).unwrap();
        assert_eq!(property(c.on_view(0, 0, &[0, 1, 2, 3])), "view chain");
        assert_eq!(property(c.on_view(1, 0, &[0, 1, 2])), "view chain");
    }

    #[test]
    fn per_view_properties_are_caught_after_a_view_change() {
        let cases: Vec<(&Agreed, &Agreed, &str)> = vec![
            // Member 1 disagrees with member 0 on position 0 of view 1.
            (&V1[..1], &[(1, 0, 1, 2)], "total order"),
            // Duplicate and reordering within view 1.
            (&[], &[(0, 0, 0, 2), (0, 0, 0, 2)], "no duplication"),
            (&[], &[(0, 2, 6, 2), (0, 1, 3, 3)], "per-sender FIFO"),
            // Seq going back within view 1.
            (&[], &[(1, 0, 1, 2), (0, 0, 0, 2)], "total order"),
            // Bytes never sent by sender 0 after what member 1 delivered.
            (&[], &[(0, 0, 0, 0)], "integrity"),
            // Same (view, sender, index), other bytes than member 0's (a later message of sender 0).
            (&V1[..1], &[(0, 0, 0, 3)], "integrity"),
        ];
        for (first, second, want) in cases {
            let mut c = multi();
            for m in [0, 1, 2] {
                deliver(&mut c, m, 0, V0).unwrap();
            }
            for m in [0, 1, 2] {
                c.on_view(m, 1, &[0, 1, 2]).unwrap();
            }
            deliver(&mut c, 0, 1, first).unwrap();
            assert_eq!(property(deliver(&mut c, 1, 1, second)), want, "{second:?}");
        }
        // The same index as in view 0 is a new message in view 1; a
        // trimmed message may be skipped after a view change.
        let mut c = through_view_2();
        // In view 2 the senders are known: seq = index × 2 + position.
        assert_eq!(property(c.check(&dv(0, 2, (0, 1, 3, 4)))), "total order");
        c.check(&dv(0, 2, (0, 1, 2, 4))).unwrap();
    }

    #[test]
    fn the_first_view_keeps_no_gaps_strict() {
        let mut c = multi();
        // Skipping sender 1's message #0 in view 0: a gap, not a trim.
        assert_eq!(property(c.check(&dv(0, 0, (1, 0, 1, 1)))), "no gaps");
        // After a view change the same skip is allowed.
        let mut c = multi();
        c.on_view(0, 1, &[0, 1, 2, 3]).unwrap();
        c.check(&dv(0, 1, (1, 0, 1, 1))).unwrap();
        // But not going back in the sender's send order.
        assert_eq!(property(c.check(&dv(0, 1, (1, 1, 5, 0)))), "integrity");
    }
}
