//! No duplication: a member delivers each message at most once. A message
//! is named by `(view, sender, index)`: indices restart in each view.

use std::collections::HashSet;

use super::{Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    for (member, entries) in logs {
        let mut seen = HashSet::with_capacity(entries.len());
        for e in entries {
            if !seen.insert((e.view, e.sender, e.index)) {
                return Err(Violation::new(
                    "no duplication",
                    format!(
                        "member {member} delivered sender {} index {} twice in view {}",
                        e.sender, e.index, e.view
                    ),
                ));
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
    fn duplicate_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 1, 0, 1), entry(0, 1, 0, 1)])]);
        assert_eq!(check(&logs).unwrap_err().property, "no duplication");
    }

    #[test]
    fn same_index_in_two_views_is_two_messages() {
        let logs = Logs::from([(0, vec![ventry(0, 0, 1, 0, 1), ventry(0, 1, 1, 0, 1)])]);
        check(&logs).unwrap();
        let (_, (logs, _)) = scenario::healthy();
        check(&logs).unwrap();
    }

    #[test]
    fn duplicate_within_a_later_view_is_caught() {
        let (_, (mut logs, _)) = scenario::healthy();
        let again = logs[&1].iter().find(|e| e.view == 2).unwrap().clone();
        logs.get_mut(&1).unwrap().push(again);
        assert_eq!(check(&logs).unwrap_err().property, "no duplication");
    }
}
