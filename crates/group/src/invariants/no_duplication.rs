//! No duplication: a member delivers each message at most once. A message
//! is named by `(view, sender, index)`: indices restart in each view.
//!
//! Per member it keeps every message it delivered (one entry per
//! delivery: the run's simulated or logged length bounds it).

use std::collections::{HashMap, HashSet};

use super::checker::{Context, Event, Property};
use super::Violation;

pub const PROPERTY: &str = "no duplication";

/// Per member: every `(view, sender, index)` it delivered.
#[derive(Default)]
pub struct NoDuplication {
    seen: HashMap<usize, HashSet<(u64, usize, u64)>>,
}

impl Property for NoDuplication {
    fn name(&self) -> &'static str {
        PROPERTY
    }

    fn observe(&mut self, _ctx: &Context, event: &Event<'_>) -> Result<(), Violation> {
        let Event::Delivery(d) = event else {
            return Ok(());
        };
        if !self
            .seen
            .entry(d.member)
            .or_default()
            .insert((d.view, d.sender, d.index))
        {
            return Err(Violation::new(
                PROPERTY,
                format!(
                    "member {} delivered sender {} index {} twice in view {}",
                    d.member, d.sender, d.index, d.view
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{entry, interleave, scenario, tests_support::both, ventry, Logs, ViewLogs};
    use super::*;

    fn check(logs: &Logs) -> Option<Violation> {
        both(&interleave(logs, &ViewLogs::new()), true)
    }

    #[test]
    fn duplicate_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 1, 0, 1), entry(0, 1, 0, 1)])]);
        let e = check(&logs).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert_eq!(e.detail, "member 0 delivered sender 1 index 0 twice in view 0");
        // Not next to each other (also out of FIFO order: duplication is named first).
        let logs = Logs::from([(0, vec![entry(0, 1, 0, 1), entry(0, 1, 1, 3), entry(0, 1, 0, 1)])]);
        assert_eq!(check(&logs).unwrap().property, PROPERTY);
    }

    #[test]
    fn same_index_in_two_views_is_two_messages() {
        let logs = Logs::from([(0, vec![ventry(0, 0, 1, 0, 1), ventry(0, 1, 1, 0, 1)])]);
        assert_eq!(check(&logs), None);
        let (_, (logs, views)) = scenario::healthy();
        assert_eq!(both(&interleave(&logs, &views), true), None);
    }

    #[test]
    fn duplicate_within_a_later_view_is_caught() {
        let (_, (mut logs, views)) = scenario::healthy();
        let at = logs[&1].iter().position(|e| e.view == 2).unwrap();
        let again = logs[&1][at].clone();
        logs.get_mut(&1).unwrap().insert(at + 1, again.clone());
        let e = both(&interleave(&logs, &views), true).unwrap();
        assert_eq!(e.property, PROPERTY);
        assert!(
            e.detail.contains("member 1 delivered sender 1 index 0 twice in view 2"),
            "{e}"
        );
        // Again after the member moved on: out of its view too, but the
        // log check names the duplicate first.
        logs.get_mut(&1).unwrap().remove(at + 1);
        logs.get_mut(&1).unwrap().push(again);
        let e = super::super::check_all_views(&logs, &views, &Default::default(), true).unwrap_err();
        assert_eq!(e.property, PROPERTY, "{e}");
    }
}
