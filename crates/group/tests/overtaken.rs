//! A member stopped in the middle of a delivery pass (SIGSTOP, a paused
//! VM) long enough to be removed, while the survivors go on in a new view
//! and reuse the ring slots it was delivering from. On shared memory it
//! reads the senders' rows in place, so when it resumes, the slots after
//! the one it was delivering hold the new view's messages. It must stop
//! delivering (total order: it never hands over a message of another
//! view as one of its own) and learn that it was removed.
//!
//! Deterministic: one thread drives the three members; member 2's first
//! delivery callback runs members 0 and 1 through the removal and a few
//! windows of new traffic before it returns, which is what a stop inside
//! the callback looks like to member 2. (It panicked with "total order:
//! sender index 0 slot … holds index …" before the fix, as the process
//! test `kill_join_and_stop` did once in CI.)

use std::time::{Duration, Instant};

use spindle_group::{Delivery, Group, GroupConfig, GroupError, SenderSet};

const WINDOW_SLOTS: usize = 8;
/// Messages member 2 has received but not delivered when it stops.
const BEFORE_STOP: u64 = 6;

fn payload(view: u64, k: u64) -> Vec<u8> {
    let mut p = vec![0u8; 64];
    p[..8].copy_from_slice(&view.to_le_bytes());
    p[8..16].copy_from_slice(&k.to_le_bytes());
    p
}

fn config(test: &str) -> GroupConfig {
    let mut config = GroupConfig::new(&format!("ovt-{}-{test}", std::process::id()), 3);
    config.senders = SenderSet::Ranks(vec![0]);
    config.window_slots = WINDOW_SLOTS;
    config.slot_payload_max = 64;
    config.membership = true;
    config.suspect_timeout = Duration::from_millis(100);
    config.peer_check_interval = Duration::from_millis(5);
    config
}

/// Every member of the first view, joined together (joining waits for all).
fn join_all(config: &GroupConfig) -> Vec<Group<spindle_fabric::shm::ShmFabric>> {
    let handles: Vec<_> = (0..config.members)
        .map(|rank| {
            let config = config.clone();
            std::thread::spawn(move || Group::join_shm(config, rank).expect("join"))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("join thread")).collect()
}

#[test]
fn a_member_removed_while_stopped_in_a_delivery_stops_delivering_and_learns_it() {
    let config = config("stop");
    let mut groups = join_all(&config);
    let mut g2 = groups.pop().unwrap();
    let mut g1 = groups.pop().unwrap();
    let mut g0 = groups.pop().unwrap();
    let sender = g0.sender().expect("member 0 sends");
    let deadline = Instant::now() + Duration::from_secs(30);

    // Member 0 sends; members 0 and 1 receive them (nobody can deliver
    // before member 2 has received them too).
    for k in 0..BEFORE_STOP {
        sender.send(&payload(0, k)).expect("send in view 0");
    }
    let (mut got0, mut got1) = (Vec::<(u64, Vec<u8>)>::new(), Vec::<(u64, Vec<u8>)>::new());
    for _ in 0..50 {
        g0.poll(&mut |d: &Delivery<'_>| got0.push((d.view, d.payload.to_vec())))
            .expect("poll 0");
        g1.poll(&mut |d: &Delivery<'_>| got1.push((d.view, d.payload.to_vec())))
            .expect("poll 1");
    }
    assert!(
        got0.is_empty(),
        "stability: nothing is delivered before member 2 received it"
    );

    // Member 2 receives all six and starts delivering them; in its first
    // callback it "stops": 0 and 1 remove it and send three windows more.
    let mut got2 = Vec::<(u64, Vec<u8>)>::new();
    let mut stopped = false;
    let mut new_view_sent = 0u64;
    let first = g2.poll(&mut |d: &Delivery<'_>| {
        got2.push((d.view, d.payload.to_vec()));
        if stopped {
            return;
        }
        stopped = true;
        // Members 0 and 1 while member 2 is stopped here.
        while g0.view().members != [0, 1] || g1.view().members != [0, 1] {
            assert!(Instant::now() < deadline, "0 and 1 did not remove member 2");
            g0.poll(&mut |d: &Delivery<'_>| got0.push((d.view, d.payload.to_vec())))
                .expect("poll 0 while 2 is stopped");
            g1.poll(&mut |d: &Delivery<'_>| got1.push((d.view, d.payload.to_vec())))
                .expect("poll 1 while 2 is stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
        let view = g0.view().id;
        let target = 3 * WINDOW_SLOTS as u64 + 3;
        while got0.iter().filter(|(v, _)| *v == view).count() < target as usize {
            assert!(Instant::now() < deadline, "0 and 1 did not go on in the new view");
            if new_view_sent < target && sender.send(&payload(view, new_view_sent)).is_ok() {
                new_view_sent += 1;
            }
            g0.poll(&mut |d: &Delivery<'_>| got0.push((d.view, d.payload.to_vec())))
                .expect("poll 0 in the new view");
            g1.poll(&mut |d: &Delivery<'_>| got1.push((d.view, d.payload.to_vec())))
                .expect("poll 1 in the new view");
        }
    });
    assert!(stopped, "member 2 started delivering");

    // Member 2 delivered only the message it was in when it stopped: the
    // slots after it were reused, and it handed none of them over.
    assert_eq!(got2.len(), 1, "member 2 delivered {:?}", got2.len());
    assert_eq!(
        got2[0],
        (0, payload(0, 0)),
        "the one delivery is view 0's first message"
    );
    // The survivors delivered all six of view 0 (the ragged edge: member
    // 2 had received them) and then the new view's messages.
    let view0: Vec<_> = got0.iter().filter(|(v, _)| *v == 0).cloned().collect();
    assert_eq!(view0, (0..BEFORE_STOP).map(|k| (0, payload(0, k))).collect::<Vec<_>>());
    assert_eq!(got0, got1, "virtual synchrony: the survivors delivered the same");

    // Resumed, member 2 learns that it was removed (in the pass that was
    // stopped, which runs the membership step once it is overtaken, or a
    // later one), and delivers nothing more.
    let mut first = Some(first);
    let err = loop {
        if let Some(Err(e)) = first.take() {
            break e;
        }
        assert!(Instant::now() < deadline, "member 2 did not learn that it was removed");
        match g2.poll(&mut |d: &Delivery<'_>| got2.push((d.view, d.payload.to_vec()))) {
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, GroupError::Removed { rank: 2, .. }), "{err}");
    assert_eq!(got2.len(), 1, "no delivery after the stop");
}
