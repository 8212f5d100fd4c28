//! Per-sender FIFO: each member delivers each sender's messages in
//! increasing index order.

use std::collections::HashMap;

use super::{Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    for (member, entries) in logs {
        let mut last: HashMap<usize, u64> = HashMap::new();
        for e in entries {
            if let Some(prev) = last.insert(e.sender, e.index) {
                if e.index <= prev {
                    return Err(Violation::new(
                        "per-sender FIFO",
                        format!(
                            "member {member} delivered sender {} index {} after index {prev}",
                            e.sender, e.index
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
    use super::super::entry;
    use super::*;

    #[test]
    fn reordering_within_a_sender_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 1, 3, 7), entry(0, 1, 2, 5)])]);
        assert_eq!(check(&logs).unwrap_err().property, "per-sender FIFO");
        let ok = Logs::from([(0, vec![entry(0, 1, 2, 5), entry(0, 1, 3, 7)])]);
        assert!(check(&ok).is_ok());
    }
}
