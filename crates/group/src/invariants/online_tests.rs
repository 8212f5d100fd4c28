//! The checker driven online, as the simulator drives it: what was sent
//! is known, members start in a first view, views and deliveries arrive
//! one at a time and the first violation stops the run.

use super::{Checker, Delivered, Violation};

fn d(member: usize, sender: usize, index: u64, len: u64) -> Delivered {
    Delivered {
        member,
        view: 0,
        sender,
        index,
        seq: index * 2 + sender as u64,
        len,
        xxh3: len * 31,
    }
}

fn checker() -> Checker {
    let mut c = Checker::new_static(0, 2, &[0, 1], true);
    for len in [1, 2, 3] {
        c.record_sent(0, len, len * 31);
        c.record_sent(1, len + 10, (len + 10) * 31);
    }
    c
}

#[test]
fn a_correct_run_passes() {
    let mut c = checker();
    for m in 0..2 {
        for (s, i, len) in [(0, 0, 1), (1, 0, 11), (0, 1, 2), (1, 2, 12)] {
            c.check(&d(m, s, i, len)).unwrap();
        }
    }
    assert_eq!(c.delivered_by(1), 4);
}

#[test]
fn each_broken_property_is_named() {
    let cases: Vec<(Vec<Delivered>, &str)> = vec![
        (vec![d(0, 0, 0, 1), d(0, 0, 0, 1)], "no duplication"),
        (vec![d(0, 0, 3, 1), d(0, 0, 1, 2)], "per-sender FIFO"),
        (vec![d(0, 0, 0, 2)], "no gaps"),
        (vec![d(0, 0, 0, 9)], "integrity"),
        (vec![d(0, 1, 0, 11), d(0, 0, 0, 1)], "total order"),
        (vec![d(0, 0, 0, 1), d(1, 1, 0, 11)], "total order"),
        (
            vec![Delivered {
                view: 3,
                ..d(0, 0, 0, 1)
            }],
            "delivery in the sending view",
        ),
        (
            vec![Delivered {
                seq: 5,
                ..d(0, 0, 0, 1)
            }],
            "total order",
        ),
    ];
    for (deliveries, property) in cases {
        let mut c = checker();
        let err = deliveries.iter().try_for_each(|x| c.check(x)).unwrap_err();
        assert_eq!(err.property, property, "{deliveries:?}: {err}");
    }
}

/// Sender `s`'s `k`-th message: its length and xxh3.
fn msg(s: usize, k: u64) -> (u64, u64) {
    let len = 100 * s as u64 + k + 1;
    (len, len * 31)
}

/// (sender, index, seq, which of the sender's messages).
type Agreed = [(usize, u64, u64, u64)];

fn dv(member: usize, view: u64, (sender, index, seq, k): (usize, u64, u64, u64)) -> Delivered {
    let (len, xxh3) = msg(sender, k);
    Delivered {
        member,
        view,
        sender,
        index,
        seq,
        len,
        xxh3,
    }
}

fn deliver(c: &mut Checker, member: usize, view: u64, order: &Agreed) -> Result<(), Violation> {
    order.iter().try_for_each(|x| c.check(&dv(member, view, *x)))
}

/// View 0 = {0, 1, 2, 3}, all senders: member 3 crashes after 2
/// deliveries; the ragged edge delivers (0, 1) to every survivor and
/// trims sender 1's message #1.
const V0: &Agreed = &[(0, 0, 0, 0), (1, 0, 1, 0), (2, 0, 2, 0), (3, 0, 3, 0), (0, 1, 4, 1)];
/// View 1 = {0, 1, 2} (senders not told): sender 1 goes on with #2.
const V1: &Agreed = &[(0, 0, 0, 2), (1, 0, 1, 2), (2, 0, 2, 1)];
/// View 2 = {0, 1} (member 2 left), senders [0, 1].
const V2: &Agreed = &[(0, 0, 0, 3), (1, 0, 1, 3)];
/// View 3 = {0, 1, 4} (member 4 joined).
const V3: &Agreed = &[(0, 0, 0, 4), (1, 0, 1, 4), (4, 0, 2, 0)];

fn multi() -> Checker {
    let mut c = Checker::new_static(0, 4, &[0, 1, 2, 3], true);
    for s in 0..4 {
        for k in 0..5 {
            let (len, hash) = msg(s, k);
            c.record_sent(s, len, hash);
        }
    }
    c
}

/// Everything up to view 2 installed by members 0 and 1, with the
/// members moving at different times.
fn through_view_2() -> Checker {
    let mut c = multi();
    deliver(&mut c, 3, 0, &V0[..2]).unwrap(); // then crashes
    deliver(&mut c, 0, 0, V0).unwrap();
    c.on_view(0, 1, &[0, 1, 2]).unwrap();
    deliver(&mut c, 0, 1, &V1[..1]).unwrap();
    deliver(&mut c, 1, 0, V0).unwrap();
    deliver(&mut c, 2, 0, V0).unwrap();
    c.on_view(2, 1, &[0, 1, 2]).unwrap();
    c.on_view(1, 1, &[0, 1, 2]).unwrap();
    for m in [2, 1] {
        deliver(&mut c, m, 1, V1).unwrap();
    }
    deliver(&mut c, 0, 1, &V1[1..]).unwrap();
    for m in [1, 0] {
        c.on_view_with_senders(m, 2, &[0, 1], &[0, 1]).unwrap();
        deliver(&mut c, m, 2, V2).unwrap();
    }
    c
}

#[test]
fn a_crash_a_ragged_edge_a_leave_and_a_join_pass() {
    let mut c = through_view_2();
    assert_eq!(c.view_of(0), Some(2));
    assert_eq!(c.view_of(2), Some(1));
    assert_eq!(c.view_of(3), Some(0));
    assert_eq!(c.members_of(1), Some(&[0, 1, 2][..]));
    assert_eq!(c.delivered_by(0), 10);
    assert_eq!(c.delivered_by(3), 2);
    // Member 4 joins.
    let (len, hash) = msg(4, 0);
    c.record_sent(4, len, hash);
    assert_eq!(c.sent_by(4), 1);
    c.on_view(4, 3, &[0, 1, 4]).unwrap();
    c.on_view(0, 3, &[0, 1, 4]).unwrap();
    deliver(&mut c, 4, 3, V3).unwrap();
    deliver(&mut c, 0, 3, &V3[..2]).unwrap();
    c.on_view(1, 3, &[0, 1, 4]).unwrap();
    deliver(&mut c, 1, 3, V3).unwrap();
    assert_eq!(c.delivered_by(4), 3);
    deliver(&mut c, 0, 3, &V3[2..]).unwrap();
    assert_eq!(c.delivered_by(0), 13);
    // Confirming the first view (once) is allowed.
    let mut c = multi();
    c.on_view(0, 0, &[0, 1, 2, 3]).unwrap();
    deliver(&mut c, 0, 0, V0).unwrap();
    c.on_view(1, 0, &[0, 1, 2, 3]).unwrap();
}

fn property(r: Result<(), Violation>) -> &'static str {
    r.unwrap_err().property
}

#[test]
fn delivery_outside_the_current_view_is_caught() {
    // A broken property is not asked again: one checker per case.
    let mut c = through_view_2();
    // Member 0 is in view 2: a late view-1 message.
    assert_eq!(
        property(c.check(&dv(0, 1, (2, 1, 5, 2)))),
        "delivery in the sending view"
    );
    // A view-2 message from member 2, which left.
    let mut c = through_view_2();
    assert_eq!(
        property(c.check(&dv(1, 2, (2, 0, 2, 2)))),
        "delivery in the sending view"
    );
    // A joiner before it installed its first view.
    let mut c = through_view_2();
    assert_eq!(
        property(c.check(&dv(4, 3, (0, 0, 0, 4)))),
        "delivery in the sending view"
    );
    // Member 2 (still in view 1) delivers in view 2.
    let mut c = through_view_2();
    assert_eq!(
        property(c.check(&dv(2, 2, (0, 0, 0, 3)))),
        "delivery in the sending view"
    );
}

#[test]
fn a_ragged_edge_that_reaches_some_survivors_only_is_caught() {
    // Member 1 moves on without the last message of view 0 that member 0 delivered.
    let mut c = multi();
    deliver(&mut c, 0, 0, V0).unwrap();
    c.on_view(0, 1, &[0, 1, 2]).unwrap();
    deliver(&mut c, 1, 0, &V0[..4]).unwrap();
    let e = c.on_view(1, 1, &[0, 1, 2]).unwrap_err();
    assert_eq!(e.property, "no loss");
    assert!(e.detail.contains("without delivering (sender 0, index 1)"), "{e}");
    // The other way round: the one that moved first lacks it.
    let mut c = multi();
    deliver(&mut c, 1, 0, &V0[..4]).unwrap();
    c.on_view(1, 1, &[0, 1, 2]).unwrap();
    deliver(&mut c, 0, 0, V0).unwrap();
    let e = c.on_view(0, 1, &[0, 1, 2]).unwrap_err();
    assert_eq!(e.property, "virtual synchrony");
    assert!(e.detail.contains("member 1 moved on from view 0 without it"), "{e}");
    // A member still in view 0 (or crashed there) may lag.
    let mut c = multi();
    deliver(&mut c, 0, 0, V0).unwrap();
    deliver(&mut c, 1, 0, V0).unwrap();
    deliver(&mut c, 2, 0, &V0[..1]).unwrap();
    c.on_view(0, 1, &[0, 1, 2]).unwrap();
    c.on_view(1, 1, &[0, 1, 2]).unwrap();
}

#[test]
fn a_member_that_skips_a_view_it_is_in_is_caught() {
    let mut c = multi();
    for m in [0, 1] {
        deliver(&mut c, m, 0, V0).unwrap();
    }
    c.on_view(0, 1, &[0, 1, 2]).unwrap();
    deliver(&mut c, 0, 1, &V1[..1]).unwrap();
    c.on_view(0, 2, &[0, 1]).unwrap();
    let e = c.on_view(1, 2, &[0, 1]).unwrap_err();
    assert_eq!(e.property, "no loss");
    assert!(e.detail.contains("without installing view 1"), "{e}");
    // Skipping first, then the reference moves on with messages of view 1.
    let mut c = multi();
    for m in [0, 1, 2] {
        deliver(&mut c, m, 0, V0).unwrap();
    }
    c.on_view(0, 1, &[0, 1, 2]).unwrap();
    c.on_view(2, 2, &[0, 1, 2]).unwrap(); // member 2 goes from view 0 to view 2
    deliver(&mut c, 0, 1, &V1[..1]).unwrap();
    let e = c.on_view(0, 2, &[0, 1, 2]).unwrap_err();
    assert_eq!(e.property, "no loss");
    assert!(
        e.detail
            .contains("member 2, a member of view 1, moved past it without installing it"),
        "{e}"
    );
    // Nothing delivered in the skipped view: nothing lost.
    let mut c = multi();
    for m in [0, 1, 2] {
        deliver(&mut c, m, 0, V0).unwrap();
    }
    c.on_view(0, 1, &[0, 1, 2]).unwrap();
    c.on_view(2, 2, &[0, 1, 2]).unwrap();
    c.on_view(0, 2, &[0, 1, 2]).unwrap();
}

#[test]
fn view_chain_violations_are_caught() {
    let chain = |f: &dyn Fn(&mut Checker) -> Result<(), Violation>| {
        let mut c = through_view_2();
        let e = f(&mut c).unwrap_err();
        assert_eq!(e.property, "view chain", "{e}");
        e.detail
    };
    // Split brain: member 2 installs its own view 2.
    assert!(chain(&|c| c.on_view(2, 2, &[2])).contains("split brain"));
    // Going back, or installing the same view twice.
    assert!(chain(&|c| c.on_view(0, 1, &[0, 1, 2])).contains("after view 2"));
    assert!(chain(&|c| c.on_view(0, 2, &[0, 1])).contains("after view 2"));
    // Not listed in the view.
    assert!(chain(&|c| c.on_view(2, 3, &[0, 1])).contains("do not include it"));
    // Not ascending.
    assert!(chain(&|c| c.on_view(0, 3, &[1, 0])).contains("not ascending"));
    // Not a majority of view 2 {0, 1}.
    assert!(chain(&|c| c.on_view(4, 3, &[1, 4, 5])).contains("not a majority"));
    // Senders that disagree, or that are not members.
    assert!(chain(&|c| c.on_view_with_senders(0, 3, &[0, 1], &[2])).contains("not one of its members"));
    let mut c = multi();
    c.on_view_with_senders(0, 1, &[0, 1, 2], &[0, 1]).unwrap();
    let e = c.on_view_with_senders(1, 1, &[0, 1, 2], &[0]).unwrap_err();
    assert!(e.detail.contains("with senders [0, 1]"), "{e}");
    // Confirming the first view twice.
    let mut c = multi();
    c.on_view(0, 0, &[0, 1, 2, 3]).unwrap();
    assert_eq!(property(c.on_view(0, 0, &[0, 1, 2, 3])), "view chain");
    let mut c = multi();
    assert_eq!(property(c.on_view(1, 0, &[0, 1, 2])), "view chain");
}

#[test]
fn per_view_properties_are_caught_after_a_view_change() {
    let cases: Vec<(&Agreed, &Agreed, &str)> = vec![
        // Member 1 disagrees with member 0 on position 0 of view 1.
        (&V1[..1], &[(1, 0, 1, 2)], "total order"),
        // Duplicate and reordering within view 1.
        (&[], &[(0, 0, 0, 2), (0, 0, 0, 2)], "no duplication"),
        (&[], &[(0, 2, 6, 2), (0, 1, 3, 3)], "per-sender FIFO"),
        // Seq going back within view 1.
        (&[], &[(1, 0, 1, 2), (0, 0, 0, 2)], "total order"),
        // Bytes never sent by sender 0 after what member 1 delivered.
        (&[], &[(0, 0, 0, 0)], "integrity"),
        // Same (view, sender, index), other bytes than member 0's (a later message of sender 0).
        (&V1[..1], &[(0, 0, 0, 3)], "integrity"),
    ];
    for (first, second, want) in cases {
        let mut c = multi();
        for m in [0, 1, 2] {
            deliver(&mut c, m, 0, V0).unwrap();
        }
        for m in [0, 1, 2] {
            c.on_view(m, 1, &[0, 1, 2]).unwrap();
        }
        deliver(&mut c, 0, 1, first).unwrap();
        assert_eq!(property(deliver(&mut c, 1, 1, second)), want, "{second:?}");
    }
    // The same index as in view 0 is a new message in view 1; a
    // trimmed message may be skipped after a view change.
    let mut c = through_view_2();
    // In view 2 the senders are known: seq = index × 2 + position.
    assert_eq!(property(c.check(&dv(0, 2, (0, 1, 3, 4)))), "total order");
    let mut c = through_view_2();
    c.check(&dv(0, 2, (0, 1, 2, 4))).unwrap();
}

#[test]
fn the_first_view_keeps_no_gaps_strict() {
    let mut c = multi();
    // Skipping sender 1's message #0 in view 0: a gap, not a trim.
    assert_eq!(property(c.check(&dv(0, 0, (1, 0, 1, 1)))), "no gaps");
    // After a view change the same skip is allowed.
    let mut c = multi();
    c.on_view(0, 1, &[0, 1, 2, 3]).unwrap();
    c.check(&dv(0, 1, (1, 0, 1, 1))).unwrap();
    // But not going back in the sender's send order.
    assert_eq!(property(c.check(&dv(0, 1, (1, 1, 5, 0)))), "integrity");
}
