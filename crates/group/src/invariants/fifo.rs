//! Per-sender FIFO: within each view, each member delivers each sender's
//! messages in increasing index order (indices restart in each view).

use std::collections::HashMap;

use super::{Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    for (member, entries) in logs {
        let mut last: HashMap<(u64, usize), u64> = HashMap::new();
        for e in entries {
            if let Some(prev) = last.insert((e.view, e.sender), e.index) {
                if e.index <= prev {
                    return Err(Violation::new(
                        "per-sender FIFO",
                        format!(
                            "member {member} delivered sender {} index {} after index {prev} in view {}",
                            e.sender, e.index, e.view
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
    fn reordering_within_a_sender_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 1, 3, 7), entry(0, 1, 2, 5)])]);
        assert_eq!(check(&logs).unwrap_err().property, "per-sender FIFO");
        let ok = Logs::from([(0, vec![entry(0, 1, 2, 5), entry(0, 1, 3, 7)])]);
        assert!(check(&ok).is_ok());
    }

    #[test]
    fn indices_restart_in_each_view() {
        let logs = Logs::from([(0, vec![ventry(0, 0, 1, 3, 7), ventry(0, 1, 1, 0, 1)])]);
        check(&logs).unwrap();
        let (_, (logs, _)) = scenario::healthy();
        check(&logs).unwrap();
        let bad = Logs::from([(
            0,
            vec![ventry(0, 0, 1, 3, 7), ventry(0, 1, 1, 2, 5), ventry(0, 1, 1, 1, 3)],
        )]);
        assert_eq!(check(&bad).unwrap_err().property, "per-sender FIFO");
    }
}
