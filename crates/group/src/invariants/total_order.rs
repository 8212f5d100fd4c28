//! Total order agreement: every member's delivery sequence is a prefix of
//! the longest one, and sequence numbers strictly increase.

use super::{Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    for (member, entries) in logs {
        if let Some(w) = entries.windows(2).find(|w| w[1].seq <= w[0].seq) {
            return Err(Violation::new(
                "total order",
                format!("member {member} delivered seq {} after seq {}", w[1].seq, w[0].seq),
            ));
        }
    }
    let Some((longest_member, longest)) = logs.iter().max_by_key(|(_, e)| e.len()) else {
        return Ok(());
    };
    for (member, entries) in logs {
        for (pos, (a, b)) in entries.iter().zip(longest.iter()).enumerate() {
            if (a.sender, a.index, a.seq) != (b.sender, b.index, b.seq) {
                return Err(Violation::new(
                    "total order",
                    format!(
                        "delivery #{pos}: member {member} delivered (sender {}, index {}, seq {}) but member {longest_member} delivered (sender {}, index {}, seq {})",
                        a.sender, a.index, a.seq, b.sender, b.index, b.seq
                    ),
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
    fn disagreement_is_caught() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 1, 0, 1), entry(1, 0, 0, 0)]),
        ]);
        assert_eq!(check(&logs).unwrap_err().property, "total order");
    }

    #[test]
    fn prefixes_agree() {
        let logs = Logs::from([
            (0, vec![entry(0, 0, 0, 0), entry(0, 1, 0, 1)]),
            (1, vec![entry(1, 0, 0, 0)]),
        ]);
        assert!(check(&logs).is_ok());
    }
}
