//! Virtual synchrony (Derecho's view-change guarantee): members that go
//! through a view change together delivered the same set of messages in
//! the view that ended. When view `v` ends, the ragged edge (the messages
//! some but not all members received) is cleaned up: each message of it
//! is delivered by every survivor or by none.
//!
//! The first member to install a view after `v` (having installed `v`) is
//! the reference; every later one must not have delivered in `v` a
//! message the reference did not (one that lacks a message the reference
//! delivered breaks [`super::no_loss`]). A member that stopped in `v`
//! (crashed or still running) may have delivered less and is not
//! compared: total order checks that it delivered a prefix.

use super::checker::{Context, Event, Property};
use super::survivors::Survivors;
use super::Violation;

pub const PROPERTY: &str = "virtual synchrony";

#[derive(Default)]
pub struct VirtualSynchrony {
    survivors: Survivors,
}

impl Property for VirtualSynchrony {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Some((mv, _)) = self.survivors.observe(ctx, event) else {
            return Ok(());
        };
        let Some((r, rset)) = self.survivors.reference(mv.from) else {
            self.survivors.set_reference(mv);
            return Ok(());
        };
        match mv.set.difference(rset).next() {
            Some((s, i)) => Err(Violation::new(
                PROPERTY,
                format!(
                    "member {} delivered (sender {s}, index {i}) in view {} and moved on to view {}; member {r} moved on from view {} without it ({} vs {} messages)",
                    mv.member,
                    mv.from,
                    mv.to,
                    mv.from,
                    mv.set.len(),
                    rset.len()
                ),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::scenario::{self, View};
    use super::super::{interleave, tests_support::both};
    use super::*;

    #[test]
    fn survivors_agree_and_crashed_or_running_members_may_lag() {
        // Member 3 crashed in view 0 after 2 of 5; in view 3 members 0
        // and 4 delivered 2, member 1 delivered 3 (no later view).
        let (views, _) = scenario::healthy();
        assert_eq!(both(&scenario::healthy_lines(&views), true), None);
    }

    #[test]
    fn a_ragged_edge_that_reached_only_a_later_mover_is_caught() {
        let views = vec![
            View::new(0, &[0, 1, 2], &[(0, 0), (1, 0), (2, 0), (0, 1)]),
            View::new(1, &[0, 1], &[(0, 0)]),
        ];
        // Member 2 crashed; the last message (0, 1) reached member 1's
        // delivery but not member 0's, and both installed view 1: member 0
        // moved on first (the reference), member 1 has more.
        let lines = scenario::build_lines(
            &views,
            &[(0, &[(0, 3), (1, 1)]), (1, &[(0, 4), (1, 1)]), (2, &[(0, 4)])],
        );
        let e = both(&lines, true).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert!(
            e.detail.contains("member 1 delivered (sender 0, index 1) in view 0 and moved on to view 1; member 0 moved on from view 0 without it (4 vs 3 messages)"),
            "{e}"
        );
    }

    #[test]
    fn equal_sets_in_different_orders_pass() {
        // Unordered mode: the same set in another order is virtual synchrony.
        let views = vec![View::new(0, &[0, 1], &[(0, 0), (1, 0)]), View::new(1, &[0, 1], &[])];
        let (mut logs, view_logs) = scenario::build(&views, &[(0, &[(0, 2), (1, 0)]), (1, &[(0, 2), (1, 0)])]);
        logs.get_mut(&1).unwrap().swap(0, 1);
        assert_eq!(both(&interleave(&logs, &view_logs), false), None);
    }
}
