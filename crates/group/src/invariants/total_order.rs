//! Total order agreement, per view: within each view, every member's
//! delivery sequence in that view is a prefix of the longest one among
//! members (members that moved on delivered the whole agreed sequence of
//! the view, a member that crashed in it a prefix), `seq` strictly
//! increases within a view (it restarts in each view), and a member's
//! views never go back.

use std::collections::BTreeMap;

use super::{LogEntry, Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    // Per view, per member: its deliveries in that view (contiguous once
    // the views never go back).
    let mut by_view: BTreeMap<u64, Vec<(usize, &[LogEntry])>> = BTreeMap::new();
    for (member, entries) in logs {
        if let Some(w) = entries.windows(2).find(|w| w[1].view < w[0].view) {
            return Err(Violation::new(
                "total order",
                format!(
                    "member {member} delivered in view {} after delivering in view {}",
                    w[1].view, w[0].view
                ),
            ));
        }
        if let Some(w) = entries
            .windows(2)
            .find(|w| w[1].view == w[0].view && w[1].seq <= w[0].seq)
        {
            return Err(Violation::new(
                "total order",
                format!(
                    "member {member} delivered seq {} after seq {} in view {}",
                    w[1].seq, w[0].seq, w[0].view
                ),
            ));
        }
        for run in entries.chunk_by(|a, b| a.view == b.view) {
            by_view.entry(run[0].view).or_default().push((*member, run));
        }
    }
    for (view, runs) in &by_view {
        let Some((longest_member, longest)) = runs.iter().max_by_key(|(_, e)| e.len()) else {
            continue;
        };
        for (member, entries) in runs {
            for (pos, (a, b)) in entries.iter().zip(longest.iter()).enumerate() {
                if (a.sender, a.index, a.seq) != (b.sender, b.index, b.seq) {
                    return Err(Violation::new(
                        "total order",
                        format!(
                            "view {view} delivery #{pos}: member {member} delivered (sender {}, index {}, seq {}) but member {longest_member} delivered (sender {}, index {}, seq {})",
                            a.sender, a.index, a.seq, b.sender, b.index, b.seq
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{entry, scenario, ventry};
    use super::*;

    #[test]
    fn disagreement_is_caught() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 1, 0, 1), entry(1, 0, 0, 0)]),
        ]);
        assert_eq!(check(&logs).unwrap_err().property, "total order");
    }

    #[test]
    fn prefixes_agree() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 0, 0, 0)]),
        ]);
        assert!(check(&logs).is_ok());
    }

    #[test]
    fn multi_view_prefixes_agree_and_seq_restarts() {
        let (_, (logs, _)) = scenario::healthy();
        check(&logs).unwrap();
    }

    #[test]
    fn disagreement_in_a_later_view_is_caught() {
        // Same order in view 0, different in view 1.
        let logs = Logs::from([
            (
                0,
                vec![ventry(0, 0, 0, 0, 0), ventry(0, 1, 0, 0, 0), ventry(0, 1, 1, 0, 1)],
            ),
            (1, vec![ventry(1, 0, 0, 0, 0), ventry(1, 1, 1, 0, 1)]),
        ]);
        let err = check(&logs).unwrap_err();
        assert_eq!(err.property, "total order");
        assert!(err.detail.contains("view 1"), "{err}");
    }

    #[test]
    fn views_going_back_are_caught() {
        let logs = Logs::from([(0, vec![ventry(0, 1, 0, 0, 0), ventry(0, 0, 0, 1, 2)])]);
        assert!(check(&logs).unwrap_err().detail.contains("after delivering in view 1"));
    }

    #[test]
    fn seq_going_back_within_a_view_is_caught() {
        let logs = Logs::from([(0, vec![ventry(0, 2, 0, 1, 2), ventry(0, 2, 1, 0, 1)])]);
        assert_eq!(check(&logs).unwrap_err().property, "total order");
        // ... but not across views.
        let ok = Logs::from([(0, vec![ventry(0, 2, 0, 1, 2), ventry(0, 3, 1, 0, 1)])]);
        check(&ok).unwrap();
    }
}
