//! No duplication: a member delivers each (sender, index) at most once.

use std::collections::HashSet;

use super::{Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    for (member, entries) in logs {
        let mut seen = HashSet::with_capacity(entries.len());
        for e in entries {
            if !seen.insert((e.sender, e.index)) {
                return Err(Violation::new(
                    "no duplication",
                    format!("member {member} delivered sender {} index {} twice", e.sender, e.index),
                ));
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
    fn duplicate_is_caught() {
        let logs = Logs::from([(0, vec![entry(0, 1, 0, 1), entry(0, 1, 0, 1)])]);
        assert_eq!(check(&logs).unwrap_err().property, "no duplication");
    }
}
