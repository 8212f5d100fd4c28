//! Every bad input and failure has a clear error: a join to an occupied
//! or out-of-range slot, a leave of a slot not joined, a multicast from a
//! non-member, and a member that goes away without leaving (the origin's
//! bounded wait names it).

use std::sync::Arc;
use std::time::Duration;

use spindle_fanout::{Domain, FanoutError, Layout, Shape, Tree, WaitConfig};

fn domain(slots: usize, layout: Layout) -> Arc<Domain> {
    let wait = WaitConfig {
        spins: 100,
        yields: 64,
        park_max: Duration::from_millis(1),
    };
    Domain::new(Tree::build(Shape::Kary(2), slots).unwrap(), layout, wait).unwrap()
}

#[test]
fn join_to_an_occupied_slot_is_refused() {
    let d = domain(4, Layout::TreeHelpSkip);
    d.state().join(2).unwrap();
    let e = d.state().join(2).unwrap_err();
    assert_eq!(e, FanoutError::SlotOccupied { slot: 2 });
    assert!(e.to_string().contains("slot 2 is already joined"), "{e}");
    assert_eq!(d.state().members(), 0b100, "the refused join changed nothing");
}

#[test]
fn join_and_attach_out_of_range_are_refused() {
    let d = domain(4, Layout::TreeHelpSkip);
    let e = d.state().join(4).unwrap_err();
    assert_eq!(e, FanoutError::SlotOutOfRange { slot: 4, slots: 4 });
    assert!(e.to_string().contains("slot 4 is out of range"), "{e}");
    assert!(matches!(
        d.attach(9, |_| {}),
        Err(FanoutError::SlotOutOfRange { slot: 9, .. })
    ));
    let _port = d.attach(1, |_| {}).unwrap();
    assert!(matches!(
        d.attach(1, |_| {}),
        Err(FanoutError::SlotAttached { slot: 1 })
    ));
}

#[test]
fn leave_of_a_slot_not_joined_is_refused() {
    let d = domain(4, Layout::TreeHelpSkip);
    let mut port = d.attach(3, |_| {}).unwrap();
    let e = port.leave(Duration::from_millis(10)).unwrap_err();
    assert_eq!(e, FanoutError::NotJoined { slot: 3 });
    assert!(e.to_string().contains("slot 3 is not joined"), "{e}");
    port.join().unwrap();
    port.leave(Duration::from_millis(10)).unwrap();
    assert_eq!(d.state().members(), 0);
}

#[test]
fn multicast_from_a_non_member_is_refused_and_frees_the_domain() {
    for layout in Layout::ALL {
        let d = domain(4, layout);
        let mut port = d.attach(0, |_| {}).unwrap();
        let e = port.multicast(1, Duration::from_millis(100)).unwrap_err();
        assert_eq!(e, FanoutError::NotMember { slot: 0 }, "{layout:?}");
        assert!(e.to_string().contains("only a member can multicast"), "{e}");
        port.join().unwrap();
        // Nobody else: completes at once (tree: every slot must serve, so
        // a 1-slot domain).
        if layout != Layout::Tree {
            let done = port.multicast(2, Duration::from_secs(5)).unwrap();
            assert_eq!(done.targets, 0);
        }
    }
}

#[test]
fn a_member_gone_without_leaving_is_named_by_the_bounded_wait() {
    for layout in [Layout::Flat, Layout::TreeHelp, Layout::TreeHelpSkip] {
        let d = domain(4, layout);
        // Slot 2 joins and its thread goes away without leaving.
        std::thread::scope(|s| {
            s.spawn(|| {
                let port = d.attach(2, |_| {}).unwrap();
                port.join().unwrap();
            });
        });
        let mut origin = d.attach(0, |_| {}).unwrap();
        origin.join().unwrap();
        let e = origin.multicast(7, Duration::from_millis(50)).unwrap_err();
        match &e {
            FanoutError::AckTimeout { missing, origin: 0, .. } => assert_eq!(missing, &vec![2], "{layout:?}"),
            other => panic!("{layout:?}: expected AckTimeout, got {other}"),
        }
        assert!(e.to_string().contains("slot(s) [2]"), "{e}");
        assert_eq!(d.state().members(), 0b1, "{layout:?}: the silent member was evicted");
        let again = origin.multicast(8, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(again, FanoutError::Failed { .. }), "{layout:?}: {again}");
    }
}

#[test]
fn bad_shapes_layouts_and_sizes_are_refused() {
    assert!(Shape::parse("ternary").unwrap_err().to_string().contains("'ternary'"));
    assert!(Layout::parse("star").unwrap_err().to_string().contains("'star'"));
    let e = Domain::new(
        Tree::build(Shape::Flat, 64).unwrap(),
        Layout::Flat,
        WaitConfig::default(),
    )
    .err()
    .unwrap();
    assert_eq!(e, FanoutError::TooManyLiveSlots { slots: 64, max: 63 });
}
