//! A member that pauses receiving (a consumer that cannot take more)
//! holds the senders back without being suspected, and nothing is lost:
//! the sender's window fills (`WouldBlock`), its occupancy is exact with
//! `track_acks`, and every message is delivered after the resume.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_group::{Delivery, Group, GroupConfig, SendError, SenderSet};

const WINDOW_SLOTS: usize = 16;
const MESSAGES: u64 = 200;

fn config() -> GroupConfig {
    let mut c = GroupConfig::new(&format!("bp-{}", std::process::id()), 2);
    c.senders = SenderSet::One;
    c.window_slots = WINDOW_SLOTS;
    c.slot_payload_max = 64;
    c.suspect_timeout = Duration::from_millis(100);
    c.peer_check_interval = Duration::from_millis(10);
    c.ack_every_slots = 4;
    c.track_acks = true;
    c
}

#[test]
fn a_paused_receiver_fills_the_window_is_not_suspected_and_loses_nothing() {
    let paused = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(AtomicU64::new(0));
    let receiver = {
        let (paused, stop, delivered) = (paused.clone(), stop.clone(), delivered.clone());
        std::thread::spawn(move || {
            let mut group = Group::join_shm(config(), 1).unwrap();
            let mut next = 0u64;
            let mut app = |d: &Delivery<'_>| {
                let seq = u64::from_le_bytes(d.payload[..8].try_into().unwrap());
                assert_eq!(seq, next, "no loss, no duplication, FIFO");
                next += 1;
                delivered.fetch_add(1, Ordering::Release);
            };
            while !stop.load(Ordering::Acquire) {
                group.pause_receive(paused.load(Ordering::Acquire));
                group.poll(&mut app).unwrap();
                std::thread::yield_now();
            }
            group.view()
        })
    };
    let mut group = Group::join_shm(config(), 0).unwrap();
    let sender = group.sender().unwrap();
    let mut app = |_: &Delivery<'_>| {};
    let mut sent = 0u64;
    let mut blocked_since: Option<Instant> = None;
    // Send until the window is full and stays full for 5 suspect
    // timeouts (the paused receiver must not be removed meanwhile).
    let liveness_bound = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < liveness_bound, "the window never filled");
        group.poll(&mut app).unwrap();
        match sender.send(&sent.to_le_bytes()) {
            Ok(()) => {
                sent += 1;
                blocked_since = None;
            }
            Err(SendError::WouldBlock) => {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::yield_now();
            }
            Err(e) => panic!("send: {e}"),
        }
    }
    assert_eq!(sent, WINDOW_SLOTS as u64, "back-pressure: exactly one window in flight");
    assert_eq!(sender.window_occupancy(), WINDOW_SLOTS as u64);
    assert_eq!(
        delivered.load(Ordering::Acquire),
        0,
        "the paused member delivered nothing"
    );
    assert_eq!(group.view().members, vec![0, 1], "the paused member was not suspected");
    paused.store(false, Ordering::Release);
    while sent < MESSAGES {
        assert!(Instant::now() < liveness_bound, "stalled after the resume at {sent}");
        group.poll(&mut app).unwrap();
        match sender.send(&sent.to_le_bytes()) {
            Ok(()) => sent += 1,
            Err(SendError::WouldBlock) => std::thread::yield_now(),
            Err(e) => panic!("send: {e}"),
        }
    }
    while delivered.load(Ordering::Acquire) < MESSAGES || sender.acknowledged_slots() < MESSAGES {
        assert!(Instant::now() < liveness_bound, "not everything was acknowledged");
        group.poll(&mut app).unwrap();
        std::thread::yield_now();
    }
    assert_eq!(sender.window_occupancy(), 0, "every slot acknowledged");
    stop.store(true, Ordering::Release);
    let view = receiver.join().unwrap();
    assert_eq!(view.members, vec![0, 1]);
}
