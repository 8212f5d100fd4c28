//! Virtual synchrony (Derecho's view-change guarantee): members that go
//! through a view change together delivered the same set of messages in
//! the view that ended. When view `v` ends, the ragged edge (the messages
//! some but not all members received) is cleaned up: each message of it
//! is delivered by every survivor or by none. So for every two members
//! that installed `v` and a later view, the sets of `(sender, index)` they
//! delivered in `v` are equal.
//!
//! A member that stopped in `v` (crashed or still running: no later view
//! line) may have delivered less and is not compared: in ordered mode
//! [`super::total_order`] checks that it delivered a prefix.

use std::collections::{BTreeMap, BTreeSet};

use super::{last_installed, Logs, ViewLogs, Violation};

const PROPERTY: &str = "virtual synchrony";

pub fn check(logs: &Logs, views: &ViewLogs) -> Result<(), Violation> {
    let last = last_installed(views);
    // Per view: the members that installed it and a later view.
    let mut movers: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (member, entries) in views {
        for v in entries.iter().filter(|v| v.view < last[member]) {
            movers.entry(v.view).or_default().push(*member);
        }
    }
    for (view, members) in &movers {
        let set = |m: usize| -> BTreeSet<(usize, u64)> {
            logs.get(&m)
                .into_iter()
                .flatten()
                .filter(|e| e.view == *view)
                .map(|e| (e.sender, e.index))
                .collect()
        };
        let first = members[0];
        let reference = set(first);
        for &other in &members[1..] {
            let theirs = set(other);
            if theirs == reference {
                continue;
            }
            let (has, lacks, msg) = match reference.difference(&theirs).next() {
                Some(m) => (first, other, *m),
                None => (
                    other,
                    first,
                    *theirs.difference(&reference).next().expect("sets differ"),
                ),
            };
            return Err(Violation::new(
                PROPERTY,
                format!(
                    "members {first} and {other} both moved on from view {view}, but member {has} delivered (sender {}, index {}) in it and member {lacks} did not ({} vs {} messages)",
                    msg.0,
                    msg.1,
                    reference.len(),
                    theirs.len()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::scenario::{self, View};
    use super::*;

    #[test]
    fn survivors_agree_and_crashed_or_running_members_may_lag() {
        // Member 3 crashed in view 0 after 2 of 5; in view 3 members 0
        // and 4 delivered 2, member 1 delivered 3 (no later view).
        let (_, (logs, views)) = scenario::healthy();
        check(&logs, &views).unwrap();
    }

    #[test]
    fn a_ragged_edge_reaching_some_survivors_only_is_caught() {
        let views = vec![
            View::new(0, &[0, 1, 2], &[(0, 0), (1, 0), (2, 0), (0, 1)]),
            View::new(1, &[0, 1], &[(0, 0)]),
        ];
        // Member 2 crashed; the last message (0, 1) reached member 0's
        // delivery but not member 1's, and both installed view 1.
        let (logs, view_logs) = scenario::build(
            &views,
            &[(0, &[(0, 4), (1, 1)]), (1, &[(0, 3), (1, 1)]), (2, &[(0, 4)])],
        );
        let e = check(&logs, &view_logs).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(e.detail.contains("member 0 delivered (sender 0, index 1)"), "{e}");
        assert!(e.detail.contains("member 1 did not"), "{e}");
        // The same from the other side (the first member is the one that lacks).
        let (logs, view_logs) = scenario::build(&views, &[(0, &[(0, 3), (1, 1)]), (1, &[(0, 4), (1, 1)])]);
        assert!(check(&logs, &view_logs)
            .unwrap_err()
            .detail
            .contains("member 1 delivered"));
    }

    #[test]
    fn equal_sets_in_different_orders_pass() {
        // Unordered mode: the same set in another order is virtual synchrony.
        let views = vec![View::new(0, &[0, 1], &[(0, 0), (1, 0)]), View::new(1, &[0, 1], &[])];
        let (mut logs, view_logs) = scenario::build(&views, &[(0, &[(0, 2), (1, 0)]), (1, &[(0, 2), (1, 0)])]);
        logs.get_mut(&1).unwrap().swap(0, 1);
        check(&logs, &view_logs).unwrap();
    }
}
