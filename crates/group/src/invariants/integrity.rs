//! Integrity: a member delivers only messages that were sent, with their
//! bytes, from senders of the view:
//!
//! - all members delivered the same bytes (length and xxh3) for the same
//!   message `(view, sender, index)`;
//! - when the view's senders are known, the sender is one of them;
//! - when what was sent is known (the simulator), each delivery from a
//!   sender is one of its sent messages, after the one the member
//!   delivered last from it (in the sender's send order, across views).
//!   Skipping some is [`super::no_gaps`]'s business in the first view and
//!   legitimate after a view change (the ragged edge trims them).

use std::collections::HashMap;

use super::checker::{Context, Delivered, Event, Property};
use super::Violation;

pub const PROPERTY: &str = "integrity";

#[derive(Default)]
pub struct Integrity {
    /// Per (view, sender, index): the bytes and who delivered it first.
    first: HashMap<(u64, usize, u64), (u64, u64, usize)>,
    /// Per (member, sender): where in the sender's sent messages the next
    /// delivery from it is.
    next_sent: HashMap<(usize, usize), usize>,
}

impl Property for Integrity {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::Delivery(d) = event else {
            return Ok(());
        };
        let senders = ctx.view(d.view).and_then(|v| v.senders.as_deref());
        if senders.is_some_and(|s| !s.contains(&d.sender)) {
            return Err(Violation::new(
                PROPERTY,
                format!(
                    "member {} delivered a message from {}, which is not a sender of the view",
                    d.member, d.sender
                ),
            ));
        }
        self.check_sent(ctx, d)?;
        self.check_same_bytes(d)
    }
}

impl Integrity {
    fn check_sent(&mut self, ctx: &Context, d: &Delivered) -> Result<(), Violation> {
        let Some(sent) = ctx.sent(d.sender) else {
            return Ok(());
        };
        let next = self.next_sent.entry((d.member, d.sender)).or_default();
        let j = *next;
        let this = (d.len, d.xxh3);
        if let Some(k) = sent.iter().skip(j).position(|x| *x == this) {
            *next = j + k + 1;
            return Ok(());
        }
        let first_view = ctx.member(d.member).is_some_and(|m| m.first_view);
        let detail = match sent.get(j) {
            Some(_) if !first_view => format!(
                "member {} delivered sender {} index {} in view {} as {} B xxh3 {:016x}: no message the sender sent after its message #{j} has these bytes (it sent {})",
                d.member, d.sender, d.index, d.view, d.len, d.xxh3, sent.len()
            ),
            Some((len, hash)) => format!(
                "member {} delivered sender {} message #{j} (index {}) as {} B xxh3 {:016x}; it was sent as {len} B xxh3 {hash:016x}",
                d.member, d.sender, d.index, d.len, d.xxh3
            ),
            None => format!(
                "member {} delivered a message #{j} (index {}) from sender {}, which sent only {}",
                d.member, d.index, d.sender, sent.len()
            ),
        };
        Err(Violation::new(PROPERTY, detail))
    }

    fn check_same_bytes(&mut self, d: &Delivered) -> Result<(), Violation> {
        let key = (d.view, d.sender, d.index);
        match self.first.get(&key) {
            None => {
                self.first.insert(key, (d.len, d.xxh3, d.member));
                Ok(())
            }
            Some(&(len, hash, m)) if (len, hash) != (d.len, d.xxh3) => Err(Violation::new(
                PROPERTY,
                format!(
                    "view {} sender {} index {}: member {m} got {len} B xxh3 {hash:016x}, member {} got {} B xxh3 {:016x}",
                    d.view, d.sender, d.index, d.member, d.len, d.xxh3
                ),
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{entry, interleave, scenario, tests_support::both, ventry, Logs, ViewLogs};
    use super::*;

    #[test]
    fn different_bytes_are_caught() {
        let mut bad = entry(1, 0, 0, 0);
        bad.xxh3 = "ffff".into();
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0)]), (1, vec![bad])]);
        let e = both(&interleave(&logs, &ViewLogs::new()), true).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert_eq!(
            e.detail,
            "view 0 sender 0 index 0: member 0 got 8 B xxh3 0000000000000000, member 1 got 8 B xxh3 000000000000ffff"
        );
        // A hash that is not hex is unreadable, and said so.
        let mut logs = logs;
        logs.get_mut(&1).unwrap()[0].xxh3 = "zz".into();
        let e = super::super::check_all(&logs, &Default::default(), true).unwrap_err();
        assert!(e.detail.contains("xxh3 'zz', which is not hex"), "{e}");
    }

    #[test]
    fn same_index_in_another_view_may_differ() {
        let logs = Logs::from([(0, vec![ventry(0, 0, 0, 0, 0)]), (1, vec![ventry(1, 1, 0, 0, 0)])]);
        assert_eq!(both(&interleave(&logs, &ViewLogs::new()), true), None);
        let (_, (mut logs, views)) = scenario::healthy();
        assert_eq!(both(&interleave(&logs, &views), true), None);
        let e = logs.get_mut(&4).unwrap().last_mut().unwrap();
        e.len += 1;
        assert_eq!(both(&interleave(&logs, &views), true).unwrap().property, PROPERTY);
    }
}
