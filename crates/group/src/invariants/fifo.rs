//! Per-sender FIFO: within each view, each member delivers each sender's
//! messages in increasing index order (indices restart in each view). The
//! same index twice is a duplicate ([`super::no_duplication`]), not a
//! reordering.

use std::collections::HashMap;

use super::checker::{Context, Event, Property};
use super::Violation;

pub const PROPERTY: &str = "per-sender FIFO";

/// Per (member, view, sender): the last index delivered.
#[derive(Default)]
pub struct Fifo {
    last: HashMap<(usize, u64, usize), u64>,
}

impl Property for Fifo {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, _ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::Delivery(d) = event else {
            return Ok(());
        };
        match self.last.insert((d.member, d.view, d.sender), d.index) {
            Some(prev) if d.index < prev => Err(Violation::new(
                PROPERTY,
                format!(
                    "member {} delivered sender {} index {} after index {prev} in view {}",
                    d.member, d.sender, d.index, d.view
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{check_all, entry, interleave, scenario, tests_support::both, ventry, Logs, ViewLogs};
    use super::*;

    fn check(logs: &Logs) -> Option<Violation> {
        // Unordered: total order would name a reordering too.
        both(&interleave(logs, &ViewLogs::new()), false)
    }

    #[test]
    fn reordering_within_a_sender_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 1, 3, 7), entry(0, 1, 2, 5)])]);
        let e = check(&logs).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert_eq!(e.detail, "member 0 delivered sender 1 index 2 after index 3 in view 0");
        // Ordered, the seq going back breaks total order too: FIFO is named.
        assert_eq!(
            check_all(&logs, &Default::default(), true).unwrap_err().property,
            PROPERTY
        );
        let ok = Logs::from([(0, vec![entry(0, 1, 2, 5), entry(0, 1, 3, 7)])]);
        assert_eq!(check(&ok), None);
    }

    #[test]
    fn indices_restart_in_each_view() {
        let logs = Logs::from([(0, vec![ventry(0, 0, 1, 3, 7), ventry(0, 1, 1, 0, 1)])]);
        assert_eq!(check(&logs), None);
        let (_, (logs, views)) = scenario::healthy();
        assert_eq!(both(&interleave(&logs, &views), true), None);
        let bad = Logs::from([(
            0,
            vec![ventry(0, 0, 1, 3, 7), ventry(0, 1, 1, 2, 5), ventry(0, 1, 1, 1, 3)],
        )]);
        assert_eq!(check(&bad).unwrap().property, PROPERTY);
    }
}
