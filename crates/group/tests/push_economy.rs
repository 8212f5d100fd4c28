//! What the group layer pushes: a short message in a long slot sends its
//! header and payload, not the whole slot (on tcp every pushed byte
//! crosses the network), and a pass that only delivered does not push its
//! releases at once (they go with the next push, the heartbeat, or when a
//! sender's window needs them), while flow control still never stalls.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_fabric::doorbell::Doorbell;
use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::{Fabric, FabricError, PeerSet, RowRef};
use spindle_group::layout::{SmcLayout, SLOT_HEADER_BYTES};
use spindle_group::{Group, GroupConfig, SendError};

/// A fabric that counts the bytes and the pushes that go through it.
struct Counting {
    inner: ShmFabric,
    pushed_bytes: AtomicU64,
    pushes: AtomicU64,
}

impl Fabric for Counting {
    fn member_rank(&self) -> usize {
        self.inner.member_rank()
    }
    fn member_count(&self) -> usize {
        self.inner.member_count()
    }
    fn row_len_bytes(&self) -> usize {
        self.inner.row_len_bytes()
    }
    fn row(&self, rank: usize) -> RowRef<'_> {
        self.inner.row(rank)
    }
    fn push(&self, range: Range<usize>, peers: PeerSet) -> Result<(), FabricError> {
        self.pushed_bytes.fetch_add(range.len() as u64, Ordering::Relaxed);
        self.pushes.fetch_add(1, Ordering::Relaxed);
        self.inner.push(range, peers)
    }
    fn check_peers(&self) -> Result<(), FabricError> {
        self.inner.check_peers()
    }
    fn lost_peers(&self) -> PeerSet {
        self.inner.lost_peers()
    }
    fn joined(&self) -> PeerSet {
        self.inner.joined()
    }
    fn doorbell(&self) -> &dyn Doorbell {
        self.inner.doorbell()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

fn open(config: &GroupConfig, rank: usize) -> Arc<Counting> {
    let layout = SmcLayout::new(config);
    let options = ShmOptions::new(
        &config.name,
        config.members,
        layout.row.row_len_bytes(),
        layout.row.tag(),
    );
    Arc::new(Counting {
        inner: ShmFabric::open(&options, rank).expect("open shm fabric"),
        pushed_bytes: AtomicU64::new(0),
        pushes: AtomicU64::new(0),
    })
}

/// Two members, member 0 sends `count` messages of `size` bytes; returns
/// the bytes member 0 pushed while sending them.
fn run(test: &str, window_slots: usize, slot_payload_max: usize, size: usize, count: u64) -> (u64, u64) {
    let mut config = GroupConfig::new(&format!("pe-{}-{test}", std::process::id()), 2);
    config.window_slots = window_slots;
    config.slot_payload_max = slot_payload_max;
    config.senders = spindle_group::SenderSet::Ranks(vec![0]);
    let receiver = {
        let config = config.clone();
        std::thread::spawn(move || {
            let mut group = Group::join(open(&config, 1), config).expect("join 1");
            let mut delivered = 0u64;
            // Liveness bound only (a hang fails the test), not a speed target.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while delivered < count {
                assert!(
                    std::time::Instant::now() < deadline,
                    "member 1 delivered {delivered} of {count}"
                );
                let work = group
                    .poll(&mut |d: &spindle_group::Delivery<'_>| {
                        assert_eq!(d.payload.len(), size, "no loss: the whole payload arrives");
                        assert!(
                            d.payload.iter().all(|b| *b == (d.index % 251) as u8),
                            "payload bytes intact"
                        );
                        delivered += 1;
                    })
                    .expect("poll 1");
                group.idle(work);
            }
            group
                .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
                .expect("finish 1");
        })
    };
    let fabric = open(&config, 0);
    let mut group = Group::join(Arc::clone(&fabric), config).expect("join 0");
    let sender = group.sender().expect("sender");
    let before = (
        fabric.pushed_bytes.load(Ordering::Relaxed),
        fabric.pushes.load(Ordering::Relaxed),
    );
    let (mut sent, mut delivered) = (0u64, 0u64);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while delivered < count {
        assert!(
            std::time::Instant::now() < deadline,
            "member 0 delivered {delivered} of {count}"
        );
        if sent < count {
            match sender.send(&vec![(sent % 251) as u8; size]) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock) => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        let work = group
            .poll(&mut |_: &spindle_group::Delivery<'_>| delivered += 1)
            .expect("poll 0");
        group.idle(work);
    }
    let after = (
        fabric.pushed_bytes.load(Ordering::Relaxed),
        fabric.pushes.load(Ordering::Relaxed),
    );
    group
        .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
        .expect("finish 0");
    receiver.join().expect("member 1");
    (after.0 - before.0, after.1 - before.1)
}

#[test]
fn a_short_message_in_a_long_slot_pushes_its_bytes_not_the_slot() {
    let (count, size, slot) = (200u64, 32usize, 10_240usize);
    let (bytes, pushes) = run("short", 64, slot, size, count);
    // Per message: its slot's header and payload, the guard, and at most a
    // few progress lines; never the 10 KiB slot.
    let per_message = bytes / count;
    assert!(
        per_message < (SLOT_HEADER_BYTES + size) as u64 + 1_024,
        "member 0 pushed {bytes} B in {pushes} pushes for {count} messages of {size} B ({per_message} B each)"
    );
}

#[test]
fn lazy_releases_never_stall_flow_control_in_a_small_window() {
    // 2,000 messages through a 4-slot window: the sender needs member 1's
    // releases every few messages; they must reach it although a pass that
    // only delivers does not push them at once.
    let (bytes, _) = run("window", 4, 64, 48, 2_000);
    assert!(bytes > 0, "member 0 pushed its messages");
}
