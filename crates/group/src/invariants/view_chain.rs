//! View chain (Derecho's membership agreement): the views form one chain
//! that every member agrees on.
//!
//! - per member, installed view ids strictly increase;
//! - a view lists its members ascending, each once;
//! - one membership per view id: two members that installed view `v` list
//!   the same members (no split brain: two partitions never both install
//!   their own view `v`);
//! - a member installs view `v` only if `v` lists it;
//! - each view after the first contains a majority (more than half) of the
//!   members of the previous view, the previous view being the known view
//!   (installed by some member in the logs) with the largest id below it.
//!   With every member's log at hand that is the immediate predecessor;
//!   the majority rule is what makes a minority partition unable to go on.

use std::collections::BTreeMap;

use super::{ViewLogs, Violation};

const PROPERTY: &str = "view chain";

pub fn check(views: &ViewLogs) -> Result<(), Violation> {
    check_with_left(views, &std::collections::BTreeSet::new())
}

/// [`check`], counting members known to have left on request toward the
/// majority (they agreed to the view that dropped them).
pub fn check_with_left(views: &ViewLogs, left: &std::collections::BTreeSet<usize>) -> Result<(), Violation> {
    let mut known: BTreeMap<u64, (usize, &[usize])> = BTreeMap::new();
    for (member, entries) in views {
        let mut last: Option<u64> = None;
        for v in entries {
            if v.member != *member {
                return Err(Violation::new(
                    PROPERTY,
                    format!("the view log of member {member} holds a line of member {}", v.member),
                ));
            }
            if let Some(prev) = last.filter(|p| v.view <= *p) {
                return Err(Violation::new(
                    PROPERTY,
                    format!("member {member} installed view {} after view {prev}", v.view),
                ));
            }
            last = Some(v.view);
            if v.members.windows(2).any(|w| w[1] <= w[0]) {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {member} installed view {} with members {:?}: not ascending and unique",
                        v.view, v.members
                    ),
                ));
            }
            if v.members.binary_search(member).is_err() {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {member} installed view {} whose members {:?} do not include it",
                        v.view, v.members
                    ),
                ));
            }
            match known.get(&v.view) {
                None => {
                    known.insert(v.view, (*member, v.members.as_slice()));
                }
                Some((first, members)) if *members != v.members.as_slice() => {
                    return Err(Violation::new(
                        PROPERTY,
                        format!(
                            "split brain: member {first} installed view {} as {members:?}, member {member} as {:?}",
                            v.view, v.members
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for ((prev_id, (_, prev)), (id, (_, members))) in known.iter().zip(known.iter().skip(1)) {
        let kept = prev
            .iter()
            .filter(|m| members.binary_search(m).is_ok() || left.contains(m))
            .count();
        if kept * 2 <= prev.len() {
            return Err(Violation::new(
                PROPERTY,
                format!(
                    "view {id} {members:?} keeps {kept} of the {} members of view {prev_id} {prev:?}: not a majority",
                    prev.len()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{scenario, ViewEntry};
    use super::*;

    fn v(member: usize, view: u64, members: &[usize]) -> ViewEntry {
        ViewEntry {
            member,
            view,
            members: members.to_vec(),
        }
    }

    fn err(views: ViewLogs) -> String {
        let e = check(&views).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        e.detail
    }

    #[test]
    fn a_chain_with_a_crash_a_leave_and_a_join_passes() {
        let (_, (_, views)) = scenario::healthy();
        check(&views).unwrap();
        check(&ViewLogs::new()).unwrap();
    }

    #[test]
    fn views_going_back_or_repeating_are_caught() {
        let back = ViewLogs::from([(0, vec![v(0, 0, &[0, 1]), v(0, 2, &[0, 1]), v(0, 1, &[0, 1])])]);
        assert!(err(back).contains("installed view 1 after view 2"));
        let twice = ViewLogs::from([(0, vec![v(0, 0, &[0, 1]), v(0, 0, &[0, 1])])]);
        assert!(err(twice).contains("installed view 0 after view 0"));
    }

    #[test]
    fn split_brain_is_caught() {
        // A partition {0, 1} | {2}: both sides install their own view 1.
        let views = ViewLogs::from([
            (0, vec![v(0, 0, &[0, 1, 2]), v(0, 1, &[0, 1])]),
            (1, vec![v(1, 0, &[0, 1, 2]), v(1, 1, &[0, 1])]),
            (2, vec![v(2, 0, &[0, 1, 2]), v(2, 1, &[2])]),
        ]);
        assert!(err(views).contains("split brain"));
    }

    #[test]
    fn installing_a_view_without_being_in_it_is_caught() {
        let views = ViewLogs::from([(2, vec![v(2, 0, &[0, 1, 2]), v(2, 1, &[0, 1])])]);
        assert!(err(views).contains("do not include it"));
    }

    #[test]
    fn a_minority_view_is_caught() {
        // {0, 1, 2, 3} → {0, 1}: half is not a majority.
        let views = ViewLogs::from([(0, vec![v(0, 0, &[0, 1, 2, 3]), v(0, 1, &[0, 1])])]);
        assert!(err(views).contains("not a majority"));
        // A joiner's first view counts too: {0, 1, 2} → {2, 3, 4}.
        let views = ViewLogs::from([(0, vec![v(0, 0, &[0, 1, 2])]), (3, vec![v(3, 1, &[2, 3, 4])])]);
        assert!(err(views).contains("keeps 1 of the 3"));
        // {0, 1, 2} → {0, 1} → {0, 1, 3}: majorities all along.
        let views = ViewLogs::from([
            (0, vec![v(0, 0, &[0, 1, 2]), v(0, 1, &[0, 1]), v(0, 2, &[0, 1, 3])]),
            (3, vec![v(3, 2, &[0, 1, 3])]),
        ]);
        check(&views).unwrap();
    }

    #[test]
    fn a_badly_formed_membership_is_caught() {
        let views = ViewLogs::from([(0, vec![v(0, 0, &[1, 0])])]);
        assert!(err(views).contains("not ascending"));
        let views = ViewLogs::from([(0, vec![v(1, 0, &[0, 1])])]);
        assert!(err(views).contains("holds a line of member 1"));
    }
}
