//! No loss (Derecho's "a message delivered by a member that survives the
//! view change is delivered by every survivor"): a message delivered in
//! view `v` by any member that later installed a newer view is delivered
//! in `v` by every member of `v` (as the view lines list it) that
//! installed a view after `v`, even one that never logged installing `v`
//! itself.
//!
//! Deliveries of members that stopped in `v` (no later view line) oblige
//! nobody: in unordered mode a member may deliver what it received before
//! the others did, and crash.

use std::collections::{BTreeMap, BTreeSet};

use super::{known_views, last_installed, Logs, ViewLogs, Violation};

const PROPERTY: &str = "no loss";

pub fn check(logs: &Logs, views: &ViewLogs) -> Result<(), Violation> {
    let last = last_installed(views);
    let moved_on = |m: usize, v: u64| last.get(&m).is_some_and(|l| *l > v);
    for (view, (_, members)) in known_views(views) {
        // Everything delivered in `view` by a member that moved on, and by whom.
        let mut must: BTreeMap<(usize, u64), usize> = BTreeMap::new();
        for (member, entries) in logs.iter().filter(|(m, _)| moved_on(**m, view)) {
            for e in entries.iter().filter(|e| e.view == view) {
                must.entry((e.sender, e.index)).or_insert(*member);
            }
        }
        if must.is_empty() {
            continue;
        }
        // A joiner that never ran `view` (its first installed view is
        // later: it was admitted, never showed up, was removed and joined
        // again) was a failed incarnation there, not a survivor.
        let ran = |m: usize| views.get(&m).and_then(|v| v.first()).is_some_and(|f| f.view <= view);
        for &member in members.iter().filter(|m| moved_on(**m, view) && ran(**m)) {
            let got: BTreeSet<(usize, u64)> = logs
                .get(&member)
                .into_iter()
                .flatten()
                .filter(|e| e.view == view)
                .map(|e| (e.sender, e.index))
                .collect();
            if let Some(((sender, index), by)) = must.iter().find(|(k, _)| !got.contains(k)) {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {by} delivered (sender {sender}, index {index}) in view {view} and moved on to view {}; member {member}, a member of view {view} that moved on to view {}, never delivered it",
                        last[by], last[&member]
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::scenario::{self, View};
    use super::*;

    #[test]
    fn a_healthy_multi_view_run_passes() {
        let (_, (logs, views)) = scenario::healthy();
        check(&logs, &views).unwrap();
    }

    #[test]
    fn a_survivor_missing_a_message_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 1 loses the last view-1 message that members 0 and 2 delivered.
        let lost = logs[&1].iter().rposition(|e| e.view == 1).unwrap();
        logs.get_mut(&1).unwrap().remove(lost);
        let e = check(&logs, &views).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(e.detail.contains("member 1, a member of view 1"), "{e}");
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
        let (logs, view_logs) = scenario::build(
            &views,
            &[(0, &[(0, 1), (1, 2), (2, 0)]), (1, &[(0, 1), (2, 0)]), (2, &[(0, 1)])],
        );
        let e = check(&logs, &view_logs).unwrap_err();
        assert!(e.detail.contains("member 1, a member of view 1"), "{e}");
        // Virtual synchrony alone does not see it: member 1 never installed view 1.
        super::super::virtual_synchrony::check(&logs, &view_logs).unwrap();
    }

    #[test]
    fn deliveries_of_a_crashed_member_oblige_nobody() {
        let views = vec![View::new(0, &[0, 1, 2], &[(0, 0), (2, 0)]), View::new(1, &[0, 1], &[])];
        // Member 2 delivered its own message and crashed; the survivors
        // trimmed it at the ragged edge.
        let (logs, view_logs) = scenario::build(
            &views,
            &[(0, &[(0, 1), (1, 0)]), (1, &[(0, 1), (1, 0)]), (2, &[(0, 2)])],
        );
        check(&logs, &view_logs).unwrap();
    }
}
