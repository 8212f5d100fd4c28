//! Delivery in the sending view (Derecho's "messages are delivered in the
//! view in which they were sent"): a member delivers a message only in the
//! view it installed last, and only from a member of that view. A view
//! change is a barrier: nothing of view `v` is delivered after the member
//! installs `v + 1`, nothing of `v + 1` before.
//!
//! A member whose log has no view lines is not tracked: only the sender
//! is checked, against the view's membership when some member installed
//! that view. Split logs ([`super::check_views`]) lose the interleaving;
//! they are replayed with each view line just before the first delivery
//! of that view ([`super::interleave`]), the most lenient reading.

use super::checker::{Context, Event, Property};
use super::Violation;

pub const PROPERTY: &str = "delivery in the sending view";

/// Checks each delivery against its member's installed view.
pub struct SendingView;

impl Property for SendingView {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::Delivery(d) = event else {
            return Ok(());
        };
        let m = d.member;
        let tracked = ctx.member(m).is_none_or(|i| i.tracked);
        match ctx.view_of(m) {
            None if tracked => {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {m} delivered sender {} index {} in view {} before installing any view",
                        d.sender, d.index, d.view
                    ),
                ))
            }
            Some(cur) if tracked && d.view != cur => {
                return Err(Violation::new(
                    PROPERTY,
                    format!(
                        "member {m} delivered sender {} index {} in view {}, but its current view is {cur}",
                        d.sender, d.index, d.view
                    ),
                ))
            }
            _ => {}
        }
        match ctx.view(d.view) {
            Some(info) if info.members.binary_search(&d.sender).is_err() => Err(Violation::new(
                PROPERTY,
                format!(
                    "member {m} delivered sender {} index {} in view {}, whose members {:?} do not include the sender",
                    d.sender, d.index, d.view, info.members
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{entry, interleave, scenario, tests_support::both, ventry, LogLine, Logs, ViewLogs};
    use super::*;

    fn err(lines: &super::super::MemberLines) -> String {
        let e = both(lines, true).expect("a violation");
        assert_eq!(e.property, PROPERTY, "{e}");
        e.detail
    }

    #[test]
    fn a_healthy_multi_view_run_passes() {
        let (views, _) = scenario::healthy();
        assert_eq!(both(&scenario::healthy_lines(&views), true), None);
    }

    #[test]
    fn logs_without_view_lines_pass() {
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)])]);
        assert_eq!(both(&interleave(&logs, &ViewLogs::new()), true), None);
    }

    #[test]
    fn delivery_in_a_view_never_installed_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 4 joined in view 3: it cannot deliver a view-2 message.
        logs.get_mut(&4).unwrap().insert(0, ventry(4, 2, 1, 0, 1));
        let d = err(&interleave(&logs, &views));
        assert!(
            d.contains("member 4 delivered sender 1 index 0 in view 2 before installing any view"),
            "{d}"
        );
    }

    #[test]
    fn delivery_of_an_old_view_after_a_newer_one_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 0 delivers a view-0 message after view-1 ones.
        logs.get_mut(&0).unwrap().insert(7, ventry(0, 0, 3, 1, 7));
        // Unordered: in ordered mode the log check names total order first.
        let e = both(&interleave(&logs, &views), false).unwrap();
        assert_eq!(e.property, PROPERTY);
        let d = e.detail;
        assert!(d.contains("in view 0, but its current view is 1"), "{d}");
    }

    #[test]
    fn a_sender_outside_the_view_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        // Member 3 crashed in view 0 and is not in view 1: no view-1 message from it.
        logs.get_mut(&2).unwrap().push(ventry(2, 1, 3, 1, 7));
        let d = err(&interleave(&logs, &views));
        assert!(d.contains("do not include the sender"), "{d}");
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
        assert_eq!(both(&interleave(&logs, &view_logs), false), None);
        let d = err(&bad);
        assert!(d.contains("in view 1, but its current view is 0"), "{d}");
        // A delivery before any view line.
        let mut first = good;
        first.get_mut(&0).unwrap().swap(0, 1);
        assert!(err(&first).contains("before installing any view"));
    }
}
