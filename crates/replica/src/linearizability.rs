//! A linearizability checker for key-value histories (sans-IO).
//!
//! Keys are independent registers, so a history is linearizable when each
//! key's sub-history is (locality). Per key this is the Wing & Gong search
//! with memoization of (operations linearized, register value): pick any
//! operation that was invoked before every pending-response operation
//! completed, check it against the register, recurse. Operations without
//! a response (the client lost its connection in a failover) may take
//! effect at any point after their invocation, or never.

use std::collections::{BTreeMap, HashSet};

/// What a client did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    Get,
    Set(Vec<u8>),
    Incr,
}

/// What it got back (`None` in [`Op::result`]: no answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// GET: the value, or nil.
    Value(Option<Vec<u8>>),
    /// SET: OK.
    Ok,
    /// INCR: the new value.
    Integer(i64),
}

/// One operation of a history.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub key: Vec<u8>,
    pub kind: OpKind,
    pub invoke_ns: u64,
    /// `None`: no answer (failed or cut off); the op may or may not have happened.
    pub complete_ns: Option<u64>,
    pub result: Option<OpResult>,
}

/// The search budget per key (states visited) before giving up.
pub const STATES_MAX: usize = 2_000_000;

/// Why a history is not (shown) linearizable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinearizabilityError {
    #[error("linearizability violated on key '{key}': no order of its {ops} operations explains the results")]
    Violated { key: String, ops: usize },
    #[error("search budget exhausted on key '{key}' ({ops} operations)")]
    Budget { key: String, ops: usize },
}

/// Check a whole history, key by key.
///
/// Unanswered operations that cannot matter are left out first (they make
/// the search explode after a failover, when many requests go unanswered):
/// a GET without an answer constrains nothing, and a SET without an answer
/// whose value no operation observed — no GET returned it, no INCR
/// returned it plus one, directly or through unanswered INCRs after it —
/// may be taken as never having happened: had it been the last write
/// before a GET or an INCR, that one would have observed its value (or,
/// after `k` unanswered INCRs, its value plus `k`). INCRs are kept (later
/// INCRs see their effect).
pub fn check(history: &[Op]) -> Result<(), LinearizabilityError> {
    let observed: HashSet<(&[u8], Vec<u8>)> = history
        .iter()
        .filter_map(|op| match &op.result {
            Some(OpResult::Value(Some(v))) => Some((&op.key[..], v.clone())),
            Some(OpResult::Integer(n)) => Some((&op.key[..], (n - 1).to_string().into_bytes())),
            _ => None,
        })
        .collect();
    // Per key, how many INCRs went unanswered: an unanswered SET of `v`
    // followed by `k` of them is observed as `v + k`.
    let mut unanswered_incrs: BTreeMap<&[u8], i64> = BTreeMap::new();
    for op in history
        .iter()
        .filter(|op| op.kind == OpKind::Incr && op.result.is_none())
    {
        *unanswered_incrs.entry(&op.key[..]).or_default() += 1;
    }
    let observed_through_incrs = |key: &[u8], v: &[u8]| {
        let incrs = unanswered_incrs.get(key).copied().unwrap_or(0);
        let Some(base) = std::str::from_utf8(v).ok().and_then(|t| t.parse::<i64>().ok()) else {
            return false;
        };
        (1..=incrs).any(|k| {
            base.checked_add(k)
                .is_some_and(|w| observed.contains(&(key, w.to_string().into_bytes())))
        })
    };
    let matters = |op: &&Op| match (&op.kind, &op.result) {
        (OpKind::Get, None) => false,
        (OpKind::Set(v), None) => observed.contains(&(&op.key[..], v.clone())) || observed_through_incrs(&op.key, v),
        _ => true,
    };
    let mut by_key: BTreeMap<&[u8], Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(matters) {
        by_key.entry(&op.key).or_default().push(op);
    }
    for (key, ops) in by_key {
        let name = String::from_utf8_lossy(key).escape_debug().to_string();
        check_key(&ops).map_err(|budget| {
            if budget {
                LinearizabilityError::Budget {
                    key: name.clone(),
                    ops: ops.len(),
                }
            } else {
                LinearizabilityError::Violated {
                    key: name,
                    ops: ops.len(),
                }
            }
        })?;
    }
    Ok(())
}

/// `Err(true)`: budget exhausted; `Err(false)`: violated.
fn check_key(ops: &[&Op]) -> Result<(), bool> {
    let n = ops.len();
    let words = n.div_ceil(64);
    let mut seen: HashSet<(Vec<u64>, Option<Vec<u8>>)> = HashSet::new();
    let mut stack: Vec<(Vec<u64>, Option<Vec<u8>>)> = vec![(vec![0; words], None)];
    let completed_total = ops.iter().filter(|o| o.complete_ns.is_some()).count();
    while let Some((done, value)) = stack.pop() {
        let completed_done = (0..n)
            .filter(|i| is_set(&done, *i) && ops[*i].complete_ns.is_some())
            .count();
        if completed_done == completed_total {
            return Ok(());
        }
        if !seen.insert((done.clone(), value.clone())) {
            continue;
        }
        if seen.len() > STATES_MAX {
            return Err(true);
        }
        // An op may go next only if it was invoked before every other
        // remaining op's response.
        let horizon = (0..n)
            .filter(|i| !is_set(&done, *i))
            .filter_map(|i| ops[i].complete_ns)
            .min()
            .unwrap_or(u64::MAX);
        for i in (0..n).filter(|i| !is_set(&done, *i)) {
            let op = ops[i];
            if op.invoke_ns > horizon {
                continue;
            }
            if let Some(next) = step(&value, op) {
                let mut d = done.clone();
                d[i / 64] |= 1 << (i % 64);
                stack.push((d, next));
            }
        }
    }
    Err(false)
}

fn is_set(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

/// The register after `op`, if `op`'s result is consistent with `value`.
fn step(value: &Option<Vec<u8>>, op: &Op) -> Option<Option<Vec<u8>>> {
    match (&op.kind, &op.result) {
        (OpKind::Get, Some(OpResult::Value(v))) => (v == value).then(|| value.clone()),
        (OpKind::Get, None) => Some(value.clone()),
        (OpKind::Set(v), Some(OpResult::Ok) | None) => Some(Some(v.clone())),
        (OpKind::Incr, result) => {
            let current = match value {
                None => 0,
                Some(v) => std::str::from_utf8(v).ok()?.parse::<i64>().ok()?,
            };
            let next = current.checked_add(1)?;
            match result {
                Some(OpResult::Integer(n)) if *n != next => None,
                Some(OpResult::Integer(_)) | None => Some(Some(next.to_string().into_bytes())),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, kind: OpKind, t: (u64, Option<u64>), result: Option<OpResult>) -> Op {
        Op {
            client,
            key: b"k".to_vec(),
            kind,
            invoke_ns: t.0,
            complete_ns: t.1,
            result,
        }
    }

    #[test]
    fn concurrent_writes_may_be_seen_in_either_order() {
        let h = vec![
            op(0, OpKind::Set(b"a".to_vec()), (0, Some(10)), Some(OpResult::Ok)),
            op(1, OpKind::Set(b"b".to_vec()), (1, Some(9)), Some(OpResult::Ok)),
            op(
                2,
                OpKind::Get,
                (11, Some(12)),
                Some(OpResult::Value(Some(b"a".to_vec()))),
            ),
        ];
        assert_eq!(check(&h), Ok(()));
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_a_violation() {
        let h = vec![
            op(0, OpKind::Set(b"a".to_vec()), (0, Some(1)), Some(OpResult::Ok)),
            op(0, OpKind::Set(b"b".to_vec()), (2, Some(3)), Some(OpResult::Ok)),
            op(1, OpKind::Get, (4, Some(5)), Some(OpResult::Value(Some(b"a".to_vec())))),
        ];
        assert!(matches!(check(&h), Err(LinearizabilityError::Violated { .. })));
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_have_happened() {
        let lost = op(0, OpKind::Incr, (0, None), None);
        let seen = vec![
            lost.clone(),
            op(1, OpKind::Get, (5, Some(6)), Some(OpResult::Value(Some(b"1".to_vec())))),
        ];
        assert_eq!(check(&seen), Ok(()));
        let unseen = vec![lost, op(1, OpKind::Get, (5, Some(6)), Some(OpResult::Value(None)))];
        assert_eq!(check(&unseen), Ok(()));
        let lost_ack = vec![
            op(0, OpKind::Incr, (0, Some(1)), Some(OpResult::Integer(1))),
            op(1, OpKind::Get, (5, Some(6)), Some(OpResult::Value(None))),
        ];
        assert!(
            check(&lost_ack).is_err(),
            "an acknowledged write that vanished is a violation"
        );
    }

    #[test]
    fn unanswered_ops_that_cannot_matter_are_left_out_and_the_rest_kept() {
        // Many unanswered GETs and never-read SETs: no search explosion.
        let mut many: Vec<Op> = (0..40)
            .map(|i| op(i, OpKind::Set(format!("lost-{i}").into_bytes()), (i as u64, None), None))
            .chain((0..40).map(|i| op(100 + i, OpKind::Get, (i as u64, None), None)))
            .collect();
        many.push(op(999, OpKind::Get, (50, Some(51)), Some(OpResult::Value(None))));
        assert_eq!(check(&many), Ok(()));
        // An unanswered SET whose value was read is kept: it explains the read.
        let kept = vec![
            op(0, OpKind::Set(b"x".to_vec()), (0, None), None),
            op(1, OpKind::Get, (5, Some(6)), Some(OpResult::Value(Some(b"x".to_vec())))),
        ];
        assert_eq!(check(&kept), Ok(()));
        // An unanswered SET observed by an INCR (it returned the value
        // plus one) is kept too.
        let seen_by_incr = vec![
            op(0, OpKind::Set(b"41".to_vec()), (0, None), None),
            op(1, OpKind::Incr, (5, Some(6)), Some(OpResult::Integer(42))),
        ];
        assert_eq!(check(&seen_by_incr), Ok(()));
        // An unanswered SET observed only through an unanswered INCR
        // after it (a failover cut both off, both took effect) is kept:
        // SET 120, INCR (121, no answer), INCR answered 122.
        let seen_through_lost_incr = vec![
            op(0, OpKind::Set(b"7".to_vec()), (0, Some(1)), Some(OpResult::Ok)),
            op(1, OpKind::Set(b"120".to_vec()), (2, None), None),
            op(2, OpKind::Incr, (3, None), None),
            op(3, OpKind::Incr, (10, Some(11)), Some(OpResult::Integer(122))),
        ];
        assert_eq!(check(&seen_through_lost_incr), Ok(()));
        // A read of a value nobody wrote is still a violation.
        let bogus = vec![
            op(0, OpKind::Set(b"x".to_vec()), (0, None), None),
            op(1, OpKind::Get, (5, Some(6)), Some(OpResult::Value(Some(b"y".to_vec())))),
        ];
        assert!(check(&bogus).is_err());
    }
}
