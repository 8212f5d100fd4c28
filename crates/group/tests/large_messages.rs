//! Large messages (bigger than a slot) over shm, members as threads:
//!
//! - ordered: a member sends 1 KB, 100 KB and 1 MB messages through
//!   256-byte slots while two others keep sending small ones; every member
//!   delivers the same sequence, each large message whole and intact as
//!   one payload, and small messages go on being delivered while the
//!   1 MB one is on its way (it does not starve them);
//! - unordered: the same, each large message intact;
//! - a view change in the middle of one: every member that stays drops it
//!   (`large_message_cut`), nobody delivers it in that view, the sender
//!   sends it again and both survivors deliver it in the new view;
//! - bad input: too large, a second one at once, slots too small;
//! - the same with members that take large messages in place, fragment
//!   by fragment (`Upcalls::takes_fragments`), beside members that take
//!   them whole: the same sequence, the same bytes, the same cuts.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use spindle_fabric::shm::ShmFabric;
use spindle_group::{Delivery, DeliveryMode, FragmentDelivery, Group, GroupConfig, SendError, Upcalls, View};

/// Liveness bound of every loop (a hang fails the test; not a speed bound).
const WAIT_MAX: Duration = Duration::from_secs(120);

fn config(test: &str, members: usize) -> GroupConfig {
    let mut c = GroupConfig::new(&format!("large-{}-{test}", std::process::id()), members);
    c.window_slots = 32;
    c.slot_payload_max = 256;
    c.large_message_max_bytes = 4 << 20;
    c
}

/// The message of `len` bytes number `n`: every byte depends on both.
fn pattern(n: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(n * 131) as u8 ^ (i >> 12) as u8)
        .collect()
}

/// What a member delivered: (view, sender rank, seq, length), and the
/// large messages' checks.
#[derive(Default)]
struct Recorder {
    rank: usize,
    deliveries: Vec<(u64, usize, u64, usize)>,
    large_seen: u64,
    /// (view, sender rank, length) of each message cut.
    cuts: Vec<(u64, usize, u64)>,
    nulls: u64,
    views: Vec<u64>,
    /// End markers of the small senders delivered.
    ends_seen: u64,
    /// Take large messages in place, fragment by fragment.
    in_place: bool,
    /// In place: per sender rank, the message put together so far (its
    /// id and bytes); and the fragments handed over.
    staged: Vec<Option<(u64, Vec<u8>)>>,
    fragments_in_place: u64,
}

/// A small sender's last message: it has seen every large one.
const END_MARKER: u64 = u64::MAX;

impl Upcalls for Recorder {
    fn takes_fragments(&self) -> bool {
        self.in_place
    }
    fn deliver_fragment(&mut self, f: &FragmentDelivery<'_>) {
        assert!(self.in_place, "fragments only to a member that takes them");
        self.fragments_in_place += 1;
        if self.staged.len() <= f.sender_rank {
            self.staged.resize(f.sender_rank + 1, None);
        }
        let staged = &mut self.staged[f.sender_rank];
        if f.offset == 0 {
            assert!(staged.is_none(), "a new message before the last was delivered or cut");
            *staged = Some((f.message_id, Vec::new()));
        }
        let (id, bytes) = staged.as_mut().expect("no gaps: a message's fragments from its first");
        assert_eq!(
            (*id, bytes.len() as u64),
            (f.message_id, f.offset),
            "no gaps: fragments in order"
        );
        bytes.extend_from_slice(f.data);
        if f.is_last() {
            let (_, whole) = staged.take().expect("staged");
            assert_eq!(whole.len() as u64, f.total_len);
            self.deliver(&f.whole(&whole));
        }
    }
    fn deliver(&mut self, d: &Delivery<'_>) {
        if d.payload.len() > 256 {
            let n = u64::from_le_bytes(d.payload[..8].try_into().unwrap());
            let mut want = pattern(n, d.payload.len());
            want[..8].copy_from_slice(&n.to_le_bytes());
            assert!(
                d.payload == want.as_slice(),
                "integrity: member {} got large message {n} ({} B) damaged",
                self.rank,
                d.payload.len()
            );
            self.large_seen += 1;
        } else if d.payload == END_MARKER.to_le_bytes() {
            self.ends_seen += 1;
        }
        self.deliveries.push((d.view, d.sender_rank, d.seq, d.payload.len()));
    }
    fn null_passed(&mut self, _view: u64, _sender_rank: usize, _index: u64) {
        self.nulls += 1;
    }
    fn large_message_cut(&mut self, view: u64, sender_rank: usize, message_id: u64, len_bytes: u64) {
        assert_eq!(message_id, 0, "the first large message of its sender");
        if let Some(staged) = self.staged.get_mut(sender_rank) {
            // Staged fragments of a cut message are dropped.
            *staged = None;
        }
        self.cuts.push((view, sender_rank, len_bytes));
    }
    fn view_installed(&mut self, view: &View) {
        self.views.push(view.id);
    }
}

/// Total order: `a` and `b` delivered the same sequence (said briefly:
/// where they part and how long each is).
fn same_sequence(a: &Recorder, b: &Recorder) {
    let first_difference = a.deliveries.iter().zip(&b.deliveries).position(|(x, y)| x != y);
    assert!(
        first_difference.is_none() && a.deliveries.len() == b.deliveries.len(),
        "total order: members {} and {} delivered {} and {} messages, first different at {first_difference:?}: {:?} / {:?}",
        a.rank,
        b.rank,
        a.deliveries.len(),
        b.deliveries.len(),
        first_difference.map(|i| a.deliveries[i]),
        first_difference.map(|i| b.deliveries[i]),
    );
}

fn large_message(n: u64, len: usize) -> Vec<u8> {
    let mut m = pattern(n, len);
    m[..8].copy_from_slice(&n.to_le_bytes());
    m
}

const SIZES: [usize; 3] = [1000, 100_000, 1 << 20];

/// Three members of `c`, each a thread that joins, waits for the others
/// and runs `body` with its group and a fresh record.
fn spawn_three<B>(c: &GroupConfig, body: B) -> Vec<std::thread::JoinHandle<Recorder>>
where
    B: Fn(Group<ShmFabric>, Recorder) -> Recorder + Clone + Send + 'static,
{
    spawn_members(3, c, body)
}

/// [`spawn_three`] for two members.
fn spawn_two<B>(c: &GroupConfig, body: B) -> Vec<std::thread::JoinHandle<Recorder>>
where
    B: Fn(Group<ShmFabric>, Recorder) -> Recorder + Clone + Send + 'static,
{
    spawn_members(2, c, body)
}

fn spawn_members<B>(n: usize, c: &GroupConfig, body: B) -> Vec<std::thread::JoinHandle<Recorder>>
where
    B: Fn(Group<ShmFabric>, Recorder) -> Recorder + Clone + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    (0..n)
        .map(|rank| {
            let (c, barrier, body) = (c.clone(), barrier.clone(), body.clone());
            std::thread::spawn(move || {
                let group = Group::join_shm(c, rank).unwrap();
                let app = Recorder {
                    rank,
                    ..Recorder::default()
                };
                barrier.wait();
                body(group, app)
            })
        })
        .collect()
}

/// Member 0 sends the large messages, members 1 and 2 small ones until
/// they have seen the last large one; returns every member's record. The
/// members in `in_place` take the large messages fragment by fragment.
fn run_three(test: &str, mode: DeliveryMode, in_place: &'static [usize]) -> Vec<Recorder> {
    let mut c = config(test, 3);
    c.mode = mode;
    let threads: Vec<_> = spawn_three(&c, move |mut group, mut app| {
        let rank = app.rank;
        app.in_place = in_place.contains(&rank);
        let start = Instant::now();
        let sender = group.sender().unwrap();
        if rank == 0 {
            for (n, len) in SIZES.iter().enumerate() {
                group.send_large(&large_message(n as u64, *len), &mut app).unwrap();
            }
        } else {
            let mut i = 0u64;
            let mut ended = false;
            while !ended {
                assert!(
                    start.elapsed() < WAIT_MAX,
                    "member {rank}: the large messages never arrived"
                );
                // Small messages until every large one was seen,
                // then the end marker.
                let last = app.large_seen == SIZES.len() as u64;
                let message = if last { END_MARKER } else { i };
                match sender.send(&message.to_le_bytes()) {
                    Ok(()) => {
                        i += 1;
                        ended = last;
                    }
                    Err(SendError::WouldBlock) => {}
                    Err(e) => panic!("send: {e}"),
                }
                let work = group.poll(&mut app).unwrap();
                group.idle(work);
            }
        }
        // Everything anyone sent: the large messages and both markers.
        while app.large_seen < SIZES.len() as u64 || app.ends_seen < 2 {
            assert!(
                start.elapsed() < WAIT_MAX,
                "member {rank}: the large messages never arrived"
            );
            let work = group.poll(&mut app).unwrap();
            group.idle(work);
        }
        group.finish_together(&mut app, WAIT_MAX).unwrap();
        app
    });
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn ordered_large_messages_arrive_whole_in_one_order_beside_small_ones() {
    let records = run_three("ordered", DeliveryMode::Ordered, &[]);
    for r in &records {
        assert_eq!(r.large_seen, SIZES.len() as u64);
        same_sequence(r, &records[0]);
        assert!(r.cuts.is_empty(), "nothing cut without a view change: {:?}", r.cuts);
        // The fragments before each message's last passed as nulls.
        let fragments: u64 = SIZES.iter().map(|s| s.div_ceil(232) as u64 - 1).sum();
        assert!(
            r.nulls >= fragments,
            "member {}: {} nulls < {fragments} fragments",
            r.rank,
            r.nulls
        );
    }
    // Their lengths, in the order sent.
    let large: Vec<usize> = records[0]
        .deliveries
        .iter()
        .filter(|d| d.3 > 256)
        .map(|d| d.3)
        .collect();
    assert_eq!(large, SIZES.to_vec());
    // No starvation: small messages of both other senders were delivered
    // between the 100 KB message and the 1 MB one (while it was sent).
    let at = |len: usize| records[0].deliveries.iter().position(|d| d.3 == len).unwrap();
    for small_sender in [1usize, 2] {
        let between = records[0].deliveries[at(SIZES[1])..at(SIZES[2])]
            .iter()
            .filter(|d| d.1 == small_sender)
            .count();
        assert!(
            between > 0,
            "member {small_sender}'s small messages starved while the 1 MB message was sent"
        );
    }
}

#[test]
fn members_that_take_large_messages_in_place_deliver_the_same_sequence_as_those_that_take_them_whole() {
    // The sender and one receiver in place, the other receiver whole.
    let records = run_three("in-place", DeliveryMode::Ordered, &[0, 2]);
    for r in &records {
        assert_eq!(
            r.large_seen,
            SIZES.len() as u64,
            "member {}: every message, intact",
            r.rank
        );
        same_sequence(r, &records[1]);
        assert!(r.cuts.is_empty());
    }
    let fragments: u64 = SIZES.iter().map(|s| s.div_ceil(232) as u64).sum();
    for r in [&records[0], &records[2]] {
        assert_eq!(
            r.fragments_in_place, fragments,
            "member {}: every fragment handed over in place, once",
            r.rank
        );
        // As with a whole delivery, the fragments before the last pass
        // as nulls: a delivery log accounts for every index alike.
        assert!(r.nulls >= fragments - SIZES.len() as u64);
    }
    assert_eq!(
        records[1].fragments_in_place, 0,
        "a member that takes them whole gets no fragments"
    );
}

#[test]
fn unordered_large_messages_arrive_whole() {
    let records = run_three("unordered", DeliveryMode::Unordered, &[1]);
    for r in &records {
        let large: Vec<usize> = r.deliveries.iter().filter(|d| d.3 > 256).map(|d| d.3).collect();
        assert_eq!(large, SIZES.to_vec(), "member {}: FIFO per sender, each whole", r.rank);
    }
}

#[test]
fn a_view_change_in_the_middle_cuts_the_message_everywhere_and_the_sender_sends_it_again() {
    cut_and_sent_again("cut", &[]);
}

#[test]
fn a_view_change_in_the_middle_cuts_a_message_taken_in_place_alike() {
    // The survivors differ: one stages fragments, one a reassembly buffer.
    cut_and_sent_again("cut-in-place", &[1]);
}

/// Member 0 sends a 4 MB message and member 2 leaves half way: both
/// survivors are told it was cut, and deliver it in the new view once it
/// is sent again. The members in `in_place` take it fragment by fragment.
fn cut_and_sent_again(test: &str, in_place: &'static [usize]) {
    let mut c = config(test, 3);
    c.window_slots = 16;
    c.suspect_timeout = Duration::from_secs(30);
    let len = 4 << 20;
    let threads: Vec<_> = spawn_three(&c, move |mut group, mut app| {
        let rank = app.rank;
        app.in_place = in_place.contains(&rank);
        let start = Instant::now();
        let live = |app: &Recorder| assert!(start.elapsed() < WAIT_MAX, "member {}: stuck", app.rank);
        match rank {
            0 => {
                let message = large_message(7, len);
                let sender = group.sender().unwrap();
                let mut tx = Some(sender.send_large(len).unwrap());
                let mut resent = false;
                while app.large_seen == 0 {
                    live(&app);
                    if !resent && !app.cuts.is_empty() {
                        // Told it was cut: send it again, whole.
                        drop(tx.take());
                        tx = Some(sender.send_large(len).unwrap());
                        resent = true;
                    }
                    if let Some(t) = tx.as_mut() {
                        t.push(&message).unwrap();
                    }
                    let work = group.poll(&mut app).unwrap();
                    group.idle(work);
                }
            }
            1 => {
                while app.large_seen == 0 {
                    live(&app);
                    let work = group.poll(&mut app).unwrap();
                    group.idle(work);
                }
            }
            _ => {
                // Leave once the transfer is well under way.
                while app.nulls < 200 {
                    live(&app);
                    let work = group.poll(&mut app).unwrap();
                    group.idle(work);
                }
                group.leave(&mut app, WAIT_MAX).unwrap();
                return app;
            }
        }
        group.finish_together(&mut app, WAIT_MAX).unwrap();
        app
    });
    let records: Vec<Recorder> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(records[2].large_seen, 0, "the member that left never had it whole");
    for r in &records[..2] {
        assert_eq!(
            r.cuts,
            vec![(0, 0, len as u64)],
            "member {}: cut once, in view 0",
            r.rank
        );
        let large: Vec<_> = r.deliveries.iter().filter(|d| d.3 > 256).collect();
        assert_eq!(large.len(), 1, "member {}: delivered once", r.rank);
        assert_eq!(
            large[0].0, 1,
            "virtual synchrony: delivered in the new view, not the old"
        );
        assert_eq!(r.views, vec![0, 1]);
    }
    same_sequence(&records[1], &records[0]);
}

#[test]
fn bad_large_sends_are_refused_with_the_reason() {
    let mut c = config("bad", 1);
    c.large_message_max_bytes = 10_000;
    let group = Group::join_shm(c, 0).unwrap();
    let sender = group.sender().unwrap();
    let e = sender.send_large(10_001).err().expect("too large");
    assert!(e.to_string().contains("large_message_max_bytes = 10000"), "{e}");
    assert!(matches!(sender.send_large(0), Err(SendError::LargeRefused { .. })));
    let first = sender.send_large(5000).unwrap();
    assert_eq!(sender.send_large(5000).err(), Some(SendError::LargeInProgress));
    drop(first);
    let _again = sender.send_large(5000).expect("free again once the first is dropped");
    let e = sender.send(&[0u8; 300]).unwrap_err();
    assert!(
        e.to_string().contains("send_large"),
        "the slot error points to the large path: {e}"
    );
    drop(_again);
    drop(group);

    let mut tiny = config("tiny", 1);
    tiny.slot_payload_max = 16;
    let group = Group::join_shm(tiny, 0).unwrap();
    let e = group.sender().unwrap().send_large(100).err().expect("no room");
    assert!(e.to_string().contains("no room for a fragment"), "{e}");
}

/// A persistent group whose large message was cut short (its sender gave
/// it up half way, as a crash would): after a restart the history replays
/// its fragments, the application is told it was cut (in the view it was
/// sent in), and a new large message goes through whole.
#[test]
fn a_large_message_cut_short_in_the_history_is_said_cut_after_a_restart() {
    let mut c = config("restart", 2);
    let dir = std::env::temp_dir().join(&c.name);
    let _ = std::fs::remove_dir_all(&dir);
    c.mode = DeliveryMode::Persistent;
    c.persist_dir = Some(dir.clone());
    let len = 50_000;
    for round in 0..2u8 {
        let records: Vec<Recorder> = spawn_two(&c, move |mut group, mut app| {
            let start = Instant::now();
            let rank = app.rank;
            if rank == 0 && round == 0 {
                let sender = group.sender().unwrap();
                let mut tx = sender.send_large(len).unwrap();
                assert!(
                    !tx.push(&large_message(0, len)).unwrap(),
                    "one window is not the whole message"
                );
                drop(tx); // given up half way
                while sender.send(END_MARKER.to_le_bytes().as_slice()).is_err() {
                    group.poll(&mut app).unwrap();
                }
            } else if rank == 0 {
                group.send_large(&large_message(1, len), &mut app).unwrap();
            }
            let done = |app: &Recorder| {
                if round == 0 {
                    app.ends_seen == 1
                } else {
                    app.large_seen == 1
                }
            };
            while !done(&app) {
                assert!(start.elapsed() < WAIT_MAX, "member {rank}: stuck in round {round}");
                let work = group.poll(&mut app).unwrap();
                group.idle(work);
            }
            group.finish_together(&mut app, WAIT_MAX).unwrap();
            app
        })
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
        for r in &records {
            if round == 0 {
                assert!(
                    r.cuts.is_empty() && r.large_seen == 0,
                    "member {}: {:?}",
                    r.rank,
                    r.cuts
                );
            } else {
                // Told once, for the history's message, in view 0.
                assert_eq!(r.cuts, vec![(0, 0, len as u64)], "member {}", r.rank);
                let large: Vec<_> = r.deliveries.iter().filter(|d| d.3 == len).collect();
                assert_eq!(large.len(), 1, "member {}: the new one, whole", r.rank);
                assert_eq!(large[0].0, 1, "in the view after the restart");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
