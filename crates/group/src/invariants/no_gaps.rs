//! No gaps: every member delivered exactly as many messages from each
//! sender as that sender sent (data messages; nulls take indices but are
//! never delivered, so indices alone cannot show a gap).
//!
//! Counts are over all views, so this holds only for a run whose
//! membership never changed: after a view change the ragged edge may trim
//! messages of the old view for good, and [`super::no_loss`] and
//! [`super::virtual_synchrony`] take over ([`super::check_all_views`]
//! skips this checker when [`super::membership_changed`]).

use std::collections::{BTreeMap, HashMap};

use super::{Logs, Violation};

pub fn check(logs: &Logs, expected_per_sender: &BTreeMap<usize, u64>) -> Result<(), Violation> {
    for (member, entries) in logs {
        let mut got: HashMap<usize, u64> = HashMap::new();
        for e in entries {
            *got.entry(e.sender).or_default() += 1;
        }
        for (sender, want) in expected_per_sender {
            let have = got.get(sender).copied().unwrap_or(0);
            if have != *want {
                return Err(Violation::new(
                    "no gaps",
                    format!("member {member} delivered {have} messages from sender {sender}, which sent {want}"),
                ));
            }
        }
        if let Some(extra) = got.keys().find(|s| !expected_per_sender.contains_key(s)) {
            return Err(Violation::new(
                "no gaps",
                format!("member {member} delivered from {extra}, which is not a sender"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::entry;
    use super::*;

    #[test]
    fn missing_message_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0)])]);
        let expected = BTreeMap::from([(0, 2)]);
        assert_eq!(check(&logs, &expected).unwrap_err().property, "no gaps");
        assert!(check(&logs, &BTreeMap::from([(0, 1)])).is_ok());
    }
}
