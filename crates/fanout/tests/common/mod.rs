//! The check the stress tests share: every multicast reached exactly its
//! snapshot of members, once, and every delivery belongs to a multicast
//! that completed.

use std::collections::{BTreeMap, BTreeSet};

/// `deliveries` are `(seq, slot)`, `completions` `(seq, targets)`, of a
/// run over `slots` slots; at least `min_completions` multicasts. Returns
/// the deliveries counted.
pub fn check_exactly_the_snapshots(
    label: &str,
    slots: usize,
    deliveries: &[(u64, usize)],
    completions: &[(u64, u64)],
    min_completions: usize,
) -> usize {
    let mut by_seq: BTreeMap<u64, BTreeSet<usize>> = BTreeMap::new();
    for &(seq, slot) in deliveries {
        assert!(
            by_seq.entry(seq).or_default().insert(slot),
            "{label}: seq {seq} delivered twice at {slot}"
        );
    }
    assert!(
        completions.len() >= min_completions,
        "{label}: the run multicast ({} completions, wanted {min_completions})",
        completions.len()
    );
    let completed: BTreeSet<u64> = completions.iter().map(|c| c.0).collect();
    assert_eq!(completed.len(), completions.len(), "{label}: each seq completes once");
    for &(seq, targets) in completions {
        let want: BTreeSet<usize> = (0..slots).filter(|s| targets & (1 << s) != 0).collect();
        let got = by_seq.get(&seq).cloned().unwrap_or_default();
        assert_eq!(got, want, "{label}: multicast {seq} reached exactly its snapshot");
    }
    for seq in by_seq.keys() {
        assert!(
            completed.contains(seq),
            "{label}: delivery of {seq}, which never completed"
        );
    }
    by_seq.values().map(BTreeSet::len).sum()
}
