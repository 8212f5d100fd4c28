//! Integrity: all members delivered the same bytes (length and xxh3) for
//! the same message `(view, sender, index)`.

use std::collections::HashMap;

use super::{Logs, Violation};

pub fn check(logs: &Logs) -> Result<(), Violation> {
    let mut first: HashMap<(u64, usize, u64), (usize, u64, &str)> = HashMap::new();
    for (member, entries) in logs {
        for e in entries {
            let key = (e.view, e.sender, e.index);
            match first.get(&key) {
                None => {
                    first.insert(key, (*member, e.len, e.xxh3.as_str()));
                }
                Some((m, len, hash)) if (*len, *hash) != (e.len, e.xxh3.as_str()) => {
                    return Err(Violation::new(
                        "integrity",
                        format!(
                            "view {} sender {} index {}: member {m} got {len} B xxh3 {hash}, member {member} got {} B xxh3 {}",
                            e.view, e.sender, e.index, e.len, e.xxh3
                        ),
                    ));
                }
                Some(_) => {}
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
    fn different_bytes_are_caught() {
        let mut bad = entry(1, 0, 0, 0);
        bad.xxh3 = "ffff".into();
        let logs = Logs::from([(0, vec![entry(0, 0, 0, 0)]), (1, vec![bad])]);
        assert_eq!(check(&logs).unwrap_err().property, "integrity");
    }

    #[test]
    fn same_index_in_another_view_may_differ() {
        let logs = Logs::from([(0, vec![ventry(0, 0, 0, 0, 0)]), (1, vec![ventry(1, 1, 0, 0, 0)])]);
        check(&logs).unwrap();
        let (_, (mut logs, _)) = scenario::healthy();
        check(&logs).unwrap();
        let e = logs.get_mut(&4).unwrap().last_mut().unwrap();
        e.len += 1;
        assert_eq!(check(&logs).unwrap_err().property, "integrity");
    }
}
