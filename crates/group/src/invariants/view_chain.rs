//! View chain (Derecho's membership agreement): the views form one chain
//! that every member agrees on.
//!
//! - per member, installed view ids strictly increase (the first view a
//!   [`Checker::with_members`](super::Checker::with_members) group starts
//!   in may be confirmed once);
//! - a view lists its members ascending, each once, and its senders (when
//!   known) among them;
//! - one membership (and one sender list) per view id: two members that
//!   installed view `v` list the same members (no split brain: two
//!   partitions never both install their own view `v`);
//! - a member installs view `v` only if `v` lists it;
//! - each view contains a majority (more than half) of the members of the
//!   previous known view (the known view with the largest id below it),
//!   counting members that left on request (they agreed to the view that
//!   dropped them); a view that turns up between two known views must
//!   also be kept a majority of by the next. The majority rule is what
//!   makes a minority partition unable to go on. A group that follows an
//!   outer group's view (a shard following the top-level group) takes
//!   that group's majority instead
//!   ([`Checker::majority_decided_outside`](super::Checker::majority_decided_outside)).

use super::checker::{Context, Event, Installed, Property};
use super::Violation;

pub const PROPERTY: &str = "view chain";

/// Checks each view installation against the views known so far.
pub struct ViewChain;

fn violation(detail: String) -> Result<(), Violation> {
    Err(Violation::new(PROPERTY, detail))
}

impl Property for ViewChain {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::View(v) = event else {
            return Ok(());
        };
        well_formed(v)?;
        if let Some(cur) = ctx.view_of(v.member) {
            let confirming = v.view == cur && ctx.member(v.member).is_some_and(|m| !m.confirmed);
            if v.view < cur || (v.view == cur && !confirming) {
                return violation(format!(
                    "member {} installed view {} after view {cur}",
                    v.member, v.view
                ));
            }
        }
        match ctx.view(v.view) {
            Some(info) if info.members != v.members => violation(format!(
                "split brain: member {} installed view {} as {:?}, member {} as {:?}",
                info.first, v.view, info.members, v.member, v.members
            )),
            Some(info) => match (&info.senders, v.senders) {
                (Some(known), Some(s)) if known.as_slice() != s => violation(format!(
                    "member {} installed view {} with senders {known:?}, member {} with {s:?}",
                    info.first, v.view, v.member
                )),
                _ => Ok(()),
            },
            // Following an outer view, the outer group's majority rules
            // (checked by whoever knows the outer view).
            None if ctx.majority_outside() => Ok(()),
            None => majority(ctx, v),
        }
    }
}

fn well_formed(v: &Installed<'_>) -> Result<(), Violation> {
    let (member, view, members) = (v.member, v.view, v.members);
    if members.windows(2).any(|w| w[1] <= w[0]) {
        return violation(format!(
            "member {member} installed view {view} with members {members:?}: not ascending and unique"
        ));
    }
    if members.binary_search(&member).is_err() {
        return violation(format!(
            "member {member} installed view {view} whose members {members:?} do not include it"
        ));
    }
    if let Some(s) = v
        .senders
        .and_then(|s| s.iter().find(|s| members.binary_search(s).is_err()))
    {
        return violation(format!(
            "view {view} has sender {s}, which is not one of its members {members:?}"
        ));
    }
    Ok(())
}

/// A new view keeps a majority of the previous known view, and the next
/// known view (if it came first) keeps a majority of it.
fn majority(ctx: &Context, v: &Installed<'_>) -> Result<(), Violation> {
    let kept = |prev: &[usize], next: &[usize]| {
        prev.iter()
            .filter(|m| next.binary_search(m).is_ok() || ctx.has_left(**m))
            .count()
    };
    let previous = ctx.views_in(..v.view).next_back();
    let pairs = [
        previous.map(|(id, info)| ((*id, info.members.as_slice()), (v.view, v.members))),
        ctx.views_in(v.view + 1..)
            .next()
            .map(|(id, info)| ((v.view, v.members), (*id, info.members.as_slice()))),
    ];
    for ((prev_id, prev), (id, members)) in pairs.into_iter().flatten() {
        let kept = kept(prev, members);
        if kept * 2 <= prev.len() {
            return violation(format!(
                "view {id} {members:?} keeps {kept} of the {} members of view {prev_id} {prev:?}: not a majority",
                prev.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{scenario, tests_support::both, LogLine, MemberLines, ViewEntry};
    use super::*;

    fn v(member: usize, view: u64, members: &[usize]) -> LogLine {
        LogLine::View(ViewEntry {
            member,
            view,
            members: members.to_vec(),
        })
    }

    /// The view-chain violation of `lines`, found the same on the log and
    /// online.
    fn err(lines: MemberLines) -> String {
        let e = both(&lines, true).expect("a violation");
        assert_eq!(e.property, PROPERTY, "{e}");
        e.detail
    }

    #[test]
    fn a_chain_with_a_crash_a_leave_and_a_join_passes() {
        let (views, _) = scenario::healthy();
        assert_eq!(both(&scenario::healthy_lines(&views), true), None);
        assert_eq!(both(&MemberLines::new(), true), None);
    }

    #[test]
    fn views_going_back_or_repeating_are_caught() {
        let back = MemberLines::from([(0, vec![v(0, 0, &[0, 1]), v(0, 2, &[0, 1]), v(0, 1, &[0, 1])])]);
        assert!(err(back).contains("installed view 1 after view 2"));
        let twice = MemberLines::from([(0, vec![v(0, 0, &[0, 1]), v(0, 0, &[0, 1])])]);
        assert!(err(twice).contains("installed view 0 after view 0"));
    }

    #[test]
    fn split_brain_is_caught() {
        // A partition {0, 1} | {2}: both sides install their own view 1.
        let lines = MemberLines::from([
            (0, vec![v(0, 0, &[0, 1, 2]), v(0, 1, &[0, 1])]),
            (1, vec![v(1, 0, &[0, 1, 2]), v(1, 1, &[0, 1])]),
            (2, vec![v(2, 0, &[0, 1, 2]), v(2, 1, &[2])]),
        ]);
        assert!(err(lines).contains("split brain: member 0 installed view 1 as [0, 1], member 2 as [2]"));
    }

    #[test]
    fn installing_a_view_without_being_in_it_is_caught() {
        let lines = MemberLines::from([(2, vec![v(2, 0, &[0, 1, 2]), v(2, 1, &[0, 1])])]);
        assert!(err(lines).contains("member 2 installed view 1 whose members [0, 1] do not include it"));
    }

    #[test]
    fn a_minority_view_is_caught() {
        // {0, 1, 2, 3} → {0, 1}: half is not a majority.
        let lines = MemberLines::from([(0, vec![v(0, 0, &[0, 1, 2, 3]), v(0, 1, &[0, 1])])]);
        assert!(err(lines).contains("not a majority"));
        // A joiner's first view counts too: {0, 1, 2} → {2, 3, 4}.
        let lines = MemberLines::from([(0, vec![v(0, 0, &[0, 1, 2])]), (3, vec![v(3, 1, &[2, 3, 4])])]);
        assert!(err(lines).contains("keeps 1 of the 3"));
        // {0, 1, 2} → {0, 1} → {0, 1, 3}: majorities all along.
        let lines = MemberLines::from([
            (0, vec![v(0, 0, &[0, 1, 2]), v(0, 1, &[0, 1]), v(0, 2, &[0, 1, 3])]),
            (3, vec![v(3, 2, &[0, 1, 3])]),
        ]);
        assert_eq!(both(&lines, true), None);
    }

    #[test]
    fn a_view_between_two_known_views_is_checked_both_ways() {
        let mut c = super::super::Checker::new_static(0, 3, &[0, 1, 2], true);
        c.on_view(0, 2, &[0, 1, 2]).unwrap();
        let e = c.on_view(1, 1, &[1]).unwrap_err();
        assert!(e.detail.contains("view 1 [1] keeps 1 of the 3"), "{e}");
        // {0, 1, 2} → {0, 1, 3, 4} is a majority, but {0, 1, 2, 5, 6} in between is not kept.
        let mut c = super::super::Checker::new_static(0, 3, &[0, 1, 2], true);
        c.on_view(0, 2, &[0, 1, 3, 4]).unwrap();
        let e = c.on_view(1, 1, &[0, 1, 2, 5, 6]).unwrap_err();
        assert!(e.detail.contains("view 2 [0, 1, 3, 4] keeps 2 of the 5"), "{e}");
    }

    #[test]
    fn a_badly_formed_membership_is_caught() {
        let lines = MemberLines::from([(0, vec![v(0, 0, &[1, 0])])]);
        assert!(err(lines).contains("not ascending"));
        let lines = MemberLines::from([(0, vec![v(1, 0, &[0, 1])])]);
        assert!(err(lines).contains("holds a line of member 1"));
    }
}
