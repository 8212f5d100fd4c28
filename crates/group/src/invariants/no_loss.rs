//! No loss (Derecho's "a message delivered by a member that survives the
//! view change is delivered by every survivor"): what the first member to
//! move past view `v` (the reference) delivered in `v`, every member of
//! `v` that moves past it delivered in `v` too, even one that went past
//! `v` without installing it. A member that moves on having delivered
//! more than the reference breaks [`super::virtual_synchrony`].
//!
//! Deliveries of members that stopped in `v` oblige nobody: in unordered
//! mode a member may deliver what it received before the others did, and
//! crash. A joiner that had no view yet when it went past `v` was a failed
//! incarnation there (admitted, never showed up, removed, joined again),
//! not a survivor.

use std::collections::HashMap;

use super::checker::{Context, Event, Installed, Property};
use super::survivors::{Move, Survivors};
use super::Violation;

pub const PROPERTY: &str = "no loss";

#[derive(Default)]
pub struct NoLoss {
    survivors: Survivors,
    /// Per view: members of it that went past it without installing it,
    /// before any member moved past it.
    skipped: HashMap<u64, Vec<usize>>,
}

impl Property for NoLoss {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Some((mv, v)) = self.survivors.observe(ctx, event) else {
            return Ok(());
        };
        let from = mv.from;
        self.moved_past(mv)?;
        self.skipped_views(ctx, v, from)
    }
}

impl NoLoss {
    fn moved_past(&mut self, mv: Move) -> Result<(), Violation> {
        let (member, v, next) = (mv.member, mv.from, mv.to);
        let Some((r, rset)) = self.survivors.reference(v) else {
            let skipper = self.skipped.get(&v).and_then(|s| s.first());
            if let (Some(skipper), Some((s, i))) = (skipper, mv.set.first()) {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {member} delivered (sender {s}, index {i}) in view {v} and moved on to view {next}; member {skipper}, a member of view {v}, moved past it without installing it"
                    ),
                ));
            }
            self.survivors.set_reference(mv);
            return Ok(());
        };
        match rset.difference(&mv.set).next() {
            Some((s, i)) => Err(Violation::new(
                PROPERTY,
                format!(
                    "member {member} moved from view {v} to view {next} without delivering (sender {s}, index {i}), which member {r} delivered in view {v} before moving on ({} vs {} messages)",
                    mv.set.len(),
                    rset.len()
                ),
            )),
            None => Ok(()),
        }
    }

    /// The member went from `from` to `v.view` past views that list it.
    fn skipped_views(&mut self, ctx: &Context, v: &Installed<'_>, from: u64) -> Result<(), Violation> {
        let (member, next) = (v.member, v.view);
        let skipped = ctx
            .views_in(from + 1..next)
            .filter(|(_, info)| info.members.binary_search(&member).is_ok());
        for (u, _) in skipped {
            match self.survivors.reference(*u) {
                Some((r, rset)) => {
                    if let Some((s, i)) = rset.first() {
                        return Err(Violation::new(
                            PROPERTY,
                            format!(
                                "member {r} delivered (sender {s}, index {i}) in view {u} and moved on; member {member}, a member of view {u}, went to view {next} without installing view {u}"
                            ),
                        ));
                    }
                }
                None => self.skipped.entry(*u).or_default().push(member),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::scenario::{self, View};
    use super::super::{interleave, tests_support::both, Checker, Scope};
    use super::*;

    #[test]
    fn a_healthy_multi_view_run_passes() {
        let (views, _) = scenario::healthy();
        assert_eq!(both(&scenario::healthy_lines(&views), true), None);
    }

    #[test]
    fn a_survivor_missing_a_message_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 1 loses the last view-1 message that members 0 and 2 delivered.
        let lost = logs[&1].iter().rposition(|e| e.view == 1).unwrap();
        logs.get_mut(&1).unwrap().remove(lost);
        let e = both(&interleave(&logs, &views), true).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert!(
            e.detail.contains("member 1 moved from view 1 to view 2 without delivering (sender 0, index 1), which member 0 delivered in view 1 before moving on"),
            "{e}"
        );
    }

    #[test]
    fn a_member_that_skipped_the_view_is_still_bound() {
        // Member 1 is in view 1 but its log goes from view 0 to view 2
        // without delivering what member 0 delivered in view 1.
        let views = vec![
            View::new(0, &[0, 1, 2], &[(0, 0)]),
            View::new(1, &[0, 1], &[(0, 0), (1, 0)]),
            View::new(2, &[0, 1], &[]),
        ];
        let lines = scenario::build_lines(
            &views,
            &[(0, &[(0, 1), (1, 2), (2, 0)]), (1, &[(0, 1), (2, 0)]), (2, &[(0, 1)])],
        );
        let e = both(&lines, true).unwrap();
        assert!(
            e.detail
                .contains("member 1, a member of view 1, went to view 2 without installing view 1"),
            "{e}"
        );
        // Virtual synchrony alone does not see it: member 1 never installed view 1.
        let mut c = Checker::new(Scope {
            total_order: true,
            survivors: true,
        });
        super::super::replay::feed(&mut c, &lines, false).unwrap();
        let broken: Vec<_> = c.violations().into_iter().map(|v| v.property).collect();
        assert_eq!(broken, vec![PROPERTY]);
    }

    #[test]
    fn a_member_that_skipped_first_is_bound_by_the_later_reference() {
        // Member 1 goes from view 0 to view 2 before member 0 leaves view 1.
        let views = [
            View::new(0, &[0, 1], &[(0, 0)]),
            View::new(1, &[0, 1], &[(0, 0)]),
            View::new(2, &[0, 1], &[]),
        ];
        let mut c = Checker::new_static(0, 2, &[0, 1], true);
        c.record_sent(0, 8, 1);
        c.on_view(0, 1, &views[1].members).unwrap();
        c.on_view(1, 2, &views[2].members).unwrap();
        let d = crate::invariants::Delivered {
            member: 0,
            view: 1,
            sender: 0,
            index: 0,
            seq: 0,
            len: 8,
            xxh3: 1,
        };
        c.check(&d).unwrap();
        let e = c.on_view(0, 2, &views[2].members).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(
            e.detail
                .contains("member 1, a member of view 1, moved past it without installing it"),
            "{e}"
        );
    }

    #[test]
    fn deliveries_of_a_crashed_member_oblige_nobody() {
        let views = vec![View::new(0, &[0, 1, 2], &[(0, 0), (2, 0)]), View::new(1, &[0, 1], &[])];
        // Member 2 delivered its own message and crashed; the survivors
        // trimmed it at the ragged edge.
        let lines = scenario::build_lines(
            &views,
            &[(0, &[(0, 1), (1, 0)]), (1, &[(0, 1), (1, 0)]), (2, &[(0, 2)])],
        );
        assert_eq!(both(&lines, true), None);
    }
}
