//! No gaps: every member delivers every message each sender sent.
//!
//! - Online, when what was sent is known (the simulator), while a member
//!   is still in the first view: its `j`-th delivery from a sender is that
//!   sender's `j`-th message (a later one is a gap; bytes that match no
//!   sent message are [`super::integrity`]'s business).
//! - At the end ([`Checker::finish`](super::Checker::finish) with the
//!   number of messages each sender sent): every member delivered exactly
//!   that many from each sender, and none from anyone else (data
//!   messages; nulls take indices but are never delivered, so indices
//!   alone cannot show a gap).
//!
//! Both hold only while the membership never changed: after a view change
//! the ragged edge may trim messages of the old view for good, and
//! [`super::no_loss`] and [`super::virtual_synchrony`] take over.

use std::collections::BTreeMap;

use super::checker::{Context, Delivered, Event, Property};
use super::Violation;

pub const PROPERTY: &str = "no gaps";

#[derive(Default)]
pub struct NoGaps {
    /// Per member, per sender: how many it delivered.
    got: BTreeMap<usize, BTreeMap<usize, u64>>,
}

impl Property for NoGaps {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::Delivery(d) = event else {
            return Ok(());
        };
        let got = self.got.entry(d.member).or_default().entry(d.sender).or_default();
        let j = *got as usize;
        *got += 1;
        match ctx.sent(d.sender) {
            Some(sent) if ctx.member(d.member).is_some_and(|m| m.first_view) => next_sent(d, j, sent),
            _ => Ok(()),
        }
    }

    fn finish(&mut self, ctx: &Context) -> Result<(), Violation> {
        let Some(expected) = ctx.expected_per_sender() else {
            return Ok(());
        };
        if ctx.membership_changed() {
            return Ok(());
        }
        let none = BTreeMap::new();
        for (member, _) in ctx.members() {
            let got = self.got.get(member).unwrap_or(&none);
            for (sender, want) in expected {
                let have = got.get(sender).copied().unwrap_or(0);
                if have != *want {
                    return Err(Violation::new(
                        PROPERTY,
                        format!("member {member} delivered {have} messages from sender {sender}, which sent {want}"),
                    ));
                }
            }
            if let Some(extra) = got.keys().find(|s| !expected.contains_key(s)) {
                return Err(Violation::new(
                    PROPERTY,
                    format!("member {member} delivered from {extra}, which is not a sender"),
                ));
            }
        }
        Ok(())
    }
}

/// The member's `j`-th delivery from the sender is its `j`-th message.
fn next_sent(d: &Delivered, j: usize, sent: &[(u64, u64)]) -> Result<(), Violation> {
    let this = (d.len, d.xxh3);
    if sent.get(j) == Some(&this) {
        return Ok(());
    }
    match sent.iter().skip(j + 1).position(|x| *x == this) {
        Some(k) => Err(Violation::new(
            PROPERTY,
            format!(
                "member {} delivered sender {}'s message #{} (index {}) but never its message #{j}",
                d.member,
                d.sender,
                j + 1 + k,
                d.index
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{check_all, check_all_views, entry, scenario, Checker, Logs};
    use super::*;

    #[test]
    fn missing_message_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0)])]);
        let e = check_all(&logs, &BTreeMap::from([(0, 2)]), true).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert_eq!(e.detail, "member 0 delivered 1 messages from sender 0, which sent 2");
        check_all(&logs, &BTreeMap::from([(0, 1)]), true).unwrap();
        // A member that delivered nothing at all.
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0)]), (1, vec![])]);
        let e = check_all(&logs, &BTreeMap::from([(0, 1)]), true).unwrap_err();
        assert!(e.detail.starts_with("member 1 delivered 0 messages"), "{e}");
        let e = check_all(&logs, &BTreeMap::from([(1, 0)]), true).unwrap_err();
        assert!(e.detail.contains("delivered from 0, which is not a sender"), "{e}");
    }

    #[test]
    fn the_same_stream_online_names_the_gap_as_it_happens() {
        // Sender 0 sent three messages; member 0 delivers #0 then #2.
        let mut c = Checker::new_static(0, 1, &[0], true);
        for k in 0..3 {
            c.record_sent(0, 8, k);
        }
        let d = |index, xxh3| Delivered {
            member: 0,
            view: 0,
            sender: 0,
            index,
            seq: index,
            len: 8,
            xxh3,
        };
        c.check(&d(0, 0)).unwrap();
        let e = c.check(&d(1, 2)).unwrap_err();
        assert_eq!(e.property, PROPERTY);
        assert!(
            e.detail.contains("message #2 (index 1) but never its message #1"),
            "{e}"
        );
        // The same deliveries as a log: the count at the end names it.
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0), entry(0, 0, 1, 1)])]);
        let e = check_all(&logs, &BTreeMap::from([(0, 3)]), true).unwrap_err();
        assert_eq!(e.detail, "member 0 delivered 2 messages from sender 0, which sent 3");
    }

    #[test]
    fn a_membership_change_lifts_it() {
        let (_, (logs, views)) = scenario::healthy();
        check_all_views(&logs, &views, &BTreeMap::from([(0, 1000)]), true).unwrap();
    }
}
