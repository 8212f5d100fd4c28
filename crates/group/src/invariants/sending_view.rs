//! Delivery in the sending view (Derecho's "messages are delivered in the
//! view in which they were sent"): a member delivers a message only in the
//! view it installed last, and only from a member of that view. A view
//! change is a barrier: nothing of view `v` is delivered after the member
//! installs `v + 1`, nothing of `v + 1` before.
//!
//! [`check`] works on the deliveries and view lines apart, where the exact
//! interleaving is lost: for a member whose log has view lines, each
//! delivery's view must be one the member installed, and its deliveries'
//! views never go back (together: there is an interleaving in which each
//! delivery follows the installation of its view). [`check_lines`] checks
//! the exact property on the interleaved lines. Both check the sender
//! against the view's membership when some member's log names that view.

use std::collections::BTreeMap;

use super::{known_views, LogEntry, LogLine, Logs, MemberLines, ViewLogs, Violation};

const PROPERTY: &str = "delivery in the sending view";

fn sender_in_view(member: usize, e: &LogEntry, known: &BTreeMap<u64, (usize, &[usize])>) -> Result<(), Violation> {
    match known.get(&e.view) {
        Some((_, members)) if !members.contains(&e.sender) => Err(Violation::new(
            PROPERTY,
            format!(
                "member {member} delivered sender {} index {} in view {}, whose members {members:?} do not include the sender",
                e.sender, e.index, e.view
            ),
        )),
        _ => Ok(()),
    }
}

pub fn check(logs: &Logs, views: &ViewLogs) -> Result<(), Violation> {
    let known = known_views(views);
    for (member, entries) in logs {
        let installed = views.get(member).map_or(&[][..], |v| v.as_slice());
        let mut prev: Option<u64> = None;
        for e in entries {
            if let Some(p) = prev.filter(|p| e.view < *p) {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {member} delivered sender {} index {} in view {} after delivering in view {p}",
                        e.sender, e.index, e.view
                    ),
                ));
            }
            prev = Some(e.view);
            if !installed.is_empty() && !installed.iter().any(|v| v.view == e.view) {
                let ids: Vec<u64> = installed.iter().map(|v| v.view).collect();
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {member} delivered sender {} index {} in view {}, which it never installed (it installed {ids:?})",
                        e.sender, e.index, e.view
                    ),
                ));
            }
            sender_in_view(*member, e, &known)?;
        }
    }
    Ok(())
}

/// The exact form, on interleaved lines: in a log with view lines, every
/// delivery's view is the view installed by the last view line before it.
pub fn check_lines(lines: &MemberLines) -> Result<(), Violation> {
    let (_, views) = super::split_lines(lines);
    let known = known_views(&views);
    for (member, member_lines) in lines {
        let has_views = member_lines.iter().any(|l| matches!(l, LogLine::View(_)));
        let mut current: Option<u64> = None;
        for line in member_lines {
            match line {
                LogLine::View(v) => current = Some(v.view),
                LogLine::Delivery(e) => {
                    if has_views && current != Some(e.view) {
                        let current = current.map_or("none yet".to_string(), |c| format!("view {c}"));
                        return Err(Violation::new(
                            PROPERTY,
                            format!(
                                "member {member} delivered sender {} index {} of view {} while its installed view was {current}",
                                e.sender, e.index, e.view
                            ),
                        ));
                    }
                    sender_in_view(*member, e, &known)?;
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
    fn a_healthy_multi_view_run_passes() {
        let (views, (logs, view_logs)) = scenario::healthy();
        check(&logs, &view_logs).unwrap();
        let lives: &[(usize, &[(u64, usize)])] = &[
            (0, &[(0, 5), (1, 3), (2, 2), (3, 2)]),
            (1, &[(0, 5), (1, 3), (2, 2), (3, 3)]),
            (3, &[(0, 2)]),
            (4, &[(3, 2)]),
        ];
        check_lines(&scenario::build_lines(&views, lives)).unwrap();
    }

    #[test]
    fn logs_without_view_lines_pass() {
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)])]);
        check(&logs, &ViewLogs::new()).unwrap();
    }

    #[test]
    fn delivery_in_a_view_never_installed_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 4 joined in view 3: it cannot deliver a view-2 message.
        logs.get_mut(&4).unwrap().insert(0, ventry(4, 2, 1, 0, 1));
        let e = check(&logs, &views).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(e.detail.contains("never installed"), "{e}");
    }

    #[test]
    fn delivery_of_an_old_view_after_a_newer_one_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 0 delivers a view-0 message after view-1 ones.
        logs.get_mut(&0).unwrap().insert(7, ventry(0, 0, 3, 1, 7));
        let e = check(&logs, &views).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(e.detail.contains("after delivering in view 1"), "{e}");
    }

    #[test]
    fn a_sender_outside_the_view_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 3 crashed in view 0 and is not in view 1: no view-1 message from it.
        logs.get_mut(&2).unwrap().push(ventry(2, 1, 3, 1, 7));
        let e = check(&logs, &views).unwrap_err();
        assert!(e.detail.contains("do not include the sender"), "{e}");
    }

    #[test]
    fn delivery_before_the_view_line_is_caught_on_lines() {
        let (views, _) = scenario::healthy();
        let lives: &[(usize, &[(u64, usize)])] = &[(0, &[(0, 5), (1, 3)])];
        let good = scenario::build_lines(&views, lives);
        // Move view 1's line after its first delivery: that delivery
        // happened while view 0 was installed. The split logs cannot tell.
        let mut bad = good.clone();
        bad.get_mut(&0).unwrap().swap(6, 7);
        assert!(matches!(bad[&0][6], LogLine::Delivery(_)));
        let (logs, view_logs) = super::super::split_lines(&bad);
        check(&logs, &view_logs).unwrap();
        let e = check_lines(&bad).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(
            e.detail.contains("of view 1 while its installed view was view 0"),
            "{e}"
        );
        // A delivery before any view line.
        let mut first = good;
        first.get_mut(&0).unwrap().swap(0, 1);
        assert!(check_lines(&first).unwrap_err().detail.contains("none yet"));
    }
}
