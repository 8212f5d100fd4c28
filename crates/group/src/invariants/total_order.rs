//! Total order agreement (ordered delivery), per view: every member's
//! delivery sequence in a view is a prefix of one agreed sequence (the
//! first member to deliver position `k` fixes it: members that moved on
//! delivered the whole agreed sequence of the view, a member that crashed
//! in it a prefix); `seq` strictly increases within a view (it restarts
//! in each view) and, when the view's senders are known, `seq = index ×
//! senders + sender position`; a member's views never go back.

use std::collections::HashMap;

use super::checker::{Context, Delivered, Event, Property};
use super::Violation;

pub const PROPERTY: &str = "total order";

/// Where a member is: the view of its last delivery, its seq, and how
/// many it delivered in that view.
struct Position {
    view: u64,
    seq: u64,
    count: usize,
}

#[derive(Default)]
pub struct TotalOrder {
    members: HashMap<usize, Position>,
    /// Per view: the agreed sequence, (sender, index, seq) and who
    /// delivered it first.
    agreed: HashMap<u64, Vec<(usize, u64, u64, usize)>>,
}

fn violation(detail: String) -> Result<(), Violation> {
    Err(Violation::new(PROPERTY, detail))
}

impl Property for TotalOrder {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::Delivery(d) = event else {
            return Ok(());
        };
        let m = d.member;
        check_seq_formula(ctx, d)?;
        let pos = match self.members.get(&m) {
            Some(p) if d.view < p.view => {
                return violation(format!(
                    "member {m} delivered in view {} after delivering in view {}",
                    d.view, p.view
                ))
            }
            Some(p) if d.view == p.view && d.seq <= p.seq => {
                return violation(format!(
                    "member {m} delivered seq {} after seq {} in view {}",
                    d.seq, p.seq, d.view
                ))
            }
            Some(p) if d.view == p.view => p.count,
            _ => 0,
        };
        self.members.insert(
            m,
            Position {
                view: d.view,
                seq: d.seq,
                count: pos + 1,
            },
        );
        let agreed = self.agreed.entry(d.view).or_default();
        match agreed.get(pos) {
            None => {
                debug_assert_eq!(pos, agreed.len(), "members append to the agreed sequence in order");
                agreed.push((d.sender, d.index, d.seq, m));
                Ok(())
            }
            Some(&(sender, index, seq, first)) if (sender, index, seq) != (d.sender, d.index, d.seq) => violation(format!(
                "view {} delivery #{pos}: member {m} delivered (sender {}, index {}, seq {}) but member {first} delivered (sender {sender}, index {index}, seq {seq})",
                d.view, d.sender, d.index, d.seq
            )),
            Some(_) => Ok(()),
        }
    }
}

/// When the view's senders are known: `seq = index × senders + position`.
fn check_seq_formula(ctx: &Context, d: &Delivered) -> Result<(), Violation> {
    let Some(senders) = ctx.view(d.view).and_then(|v| v.senders.as_deref()) else {
        return Ok(());
    };
    let Some(s) = senders.iter().position(|s| *s == d.sender) else {
        return Ok(()); // integrity names a sender outside the view
    };
    let n = senders.len();
    if d.seq != d.index * n as u64 + s as u64 {
        return violation(format!(
            "member {} delivered sender {} index {} with seq {} in view {}, not index × {n} + {s}",
            d.member, d.sender, d.index, d.seq, d.view
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{entry, interleave, scenario, tests_support::both, ventry, Logs, ViewLogs};
    use super::*;

    fn check(logs: &Logs) -> Option<Violation> {
        both(&interleave(logs, &ViewLogs::new()), true)
    }

    #[test]
    fn disagreement_is_caught() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 1, 0, 0), entry(1, 0, 0, 1)]),
        ]);
        let e = check(&logs).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert_eq!(
            e.detail,
            "view 0 delivery #0: member 1 delivered (sender 1, index 0, seq 0) but member 0 delivered (sender 0, index 0, seq 0)"
        );
    }

    #[test]
    fn prefixes_agree() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 0, 0, 0)]),
        ]);
        assert_eq!(check(&logs), None);
    }

    #[test]
    fn multi_view_prefixes_agree_and_seq_restarts() {
        let (_, (logs, views)) = scenario::healthy();
        assert_eq!(both(&interleave(&logs, &views), true), None);
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
        let err = check(&logs).unwrap();
        assert_eq!(err.property, "total order");
        assert!(err.detail.contains("view 1"), "{err}");
    }

    #[test]
    fn views_going_back_are_caught() {
        let logs = Logs::from([(0, vec![ventry(0, 1, 0, 0, 0), ventry(0, 0, 0, 1, 2)])]);
        let e = check(&logs).unwrap();
        assert_eq!(e.detail, "member 0 delivered in view 0 after delivering in view 1");
    }

    #[test]
    fn seq_going_back_within_a_view_is_caught() {
        let logs = Logs::from([(0, vec![ventry(0, 2, 0, 1, 2), ventry(0, 2, 1, 0, 1)])]);
        assert_eq!(
            check(&logs).unwrap().detail,
            "member 0 delivered seq 1 after seq 2 in view 2"
        );
        // ... but not across views.
        let ok = Logs::from([(0, vec![ventry(0, 2, 0, 1, 2), ventry(0, 3, 1, 0, 1)])]);
        assert_eq!(check(&ok), None);
    }
}
