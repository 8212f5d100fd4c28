//! The `Fabric` conformance suite: the scenarios every fabric
//! implementation must pass (STYLE.md, principle 8: one trait, one suite).
//!
//! The suite is generic over a [`Harness`], which knows how to make a fresh
//! group and open one member of it. An implementation joins the suite with
//! a `Harness` impl and one line:
//!
//! ```text
//! conformance_suite!(shm, ShmHarness);
//! conformance_suite!(tcp, TcpHarness);
//! conformance_suite!(tcp_coalesced, CoalescedTcpHarness);
//! conformance_suite!(tcp_flushed, FlushedTcpHarness);
//! conformance_suite!(tcp_tls, TlsTcpHarness);
//! conformance_suite!(ofi_tcp, OfiHarness<TcpProvider>);     // feature `ofi`
//! ```
//!
//! Each member runs on its own thread with its own fabric instance (its own
//! mapping, or its own connections), as separate processes would. Every
//! wait is bounded by [`STALL_MAX`]: a wait that sees no progress for that
//! long fails the test. That is a liveness bound, never a speed assertion.
//!
//! Row layout used by the scenarios (within the contract of the crate docs:
//! the writer stores data, pushes it, then stores a guard with `Release` and
//! pushes the guard; a reader `Acquire`-loads the guard, then reads data):
//!
//! ```text
//!  +0    guard  u64   rounds published by the row's owner   (own line)
//!  +64   ack    u64   rounds the owner has finished reading  (own line)
//!  +128  data   4096 B pattern of (owner rank, round)
//! ```

use std::panic::resume_unwind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::Fabric;

/// A wait that sees no progress for this long fails (liveness, not speed).
const STALL_MAX: Duration = Duration::from_secs(10);

const GUARD: usize = 0;
const ACK: usize = 64;
const DATA: usize = 128;
const DATA_BYTES: usize = 4096;
const ROW_BYTES: usize = DATA + DATA_BYTES;

/// How a fabric implementation plugs into the suite.
pub trait Harness: Sync + Sized {
    type Fabric: Fabric;

    /// Whether [`Fabric::push`] refuses an out-of-range byte range with
    /// `FabricError::PushOutOfBounds` in every build. An implementation
    /// whose push is ordering only (shm) may check in debug builds alone.
    const PUSH_CHECKS_RANGE_IN_RELEASE: bool;

    /// A fresh group that no other test shares. `test` names the scenario
    /// (for group names, ports, temporary directories).
    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> Self;

    /// Open member `rank` of the group. Called once per rank, each on its
    /// own thread, all at about the same time (an implementation may wait
    /// here for its peers to connect).
    fn open(&self, rank: usize) -> Self::Fabric;
}

/// Instantiate every scenario of [`suite`] for one implementation.
macro_rules! conformance_suite {
    ($name:ident, $harness:ty) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn identity_and_fresh_rows_are_zero() {
                suite::identity_and_fresh_rows_are_zero::<$harness>();
            }

            #[test]
            fn guard_makes_data_visible() {
                suite::guard_makes_data_visible::<$harness>();
            }

            #[test]
            fn pushes_to_one_peer_arrive_in_order() {
                suite::pushes_to_one_peer_arrive_in_order::<$harness>();
            }

            #[test]
            fn vectored_push_arrives_in_order() {
                suite::vectored_push_arrives_in_order::<$harness>();
            }

            #[test]
            fn out_of_range_push_is_refused() {
                suite::out_of_range_push_is_refused::<$harness>();
            }

            #[test]
            fn concurrent_members_see_each_other() {
                suite::concurrent_members_see_each_other::<$harness>();
            }

            #[test]
            fn clean_leave_is_reported_as_peer_left() {
                suite::clean_leave_is_reported_as_peer_left::<$harness>();
            }
        }
    };
}

// ---- instantiations ------------------------------------------------------

/// A shm group in its own temporary directory (on tmpfs when there is one),
/// removed with everything in it when the harness drops.
pub struct ShmHarness {
    options: ShmOptions,
    _dir: tempfile::TempDir,
}

impl Harness for ShmHarness {
    type Fabric = ShmFabric;

    // ShmFabric::push checks the range, then is a Release fence.
    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> ShmHarness {
        let dir = scratch_dir();
        let mut options = ShmOptions::new(test, member_count, row_len_bytes, 0xC0_4F_04_3A);
        options.dir = dir.path().to_path_buf();
        ShmHarness { options, _dir: dir }
    }

    fn open(&self, rank: usize) -> ShmFabric {
        ShmFabric::open(&self.options, rank)
            .unwrap_or_else(|e| panic!("open member {rank} of {:?}: {e}", self.options.path()))
    }
}

fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("spindle-conformance-").tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix("spindle-conformance-")
        .tempdir()
        .expect("create a temporary directory")
}

conformance_suite!(shm, ShmHarness);

/// A tcp group on loopback: one listener per member, bound to port 0
/// before any member opens (so the addresses are known and free), with a
/// shared key. Ports close when the fabrics drop.
pub struct TcpHarness {
    options: TcpOptions,
    listeners: std::sync::Mutex<Vec<Option<std::net::TcpListener>>>,
}

impl Harness for TcpHarness {
    type Fabric = TcpFabric;

    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> TcpHarness {
        let listeners: Vec<std::net::TcpListener> = (0..member_count)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
            .collect();
        let addresses = listeners
            .iter()
            .map(|l| l.local_addr().expect("local address"))
            .collect();
        // Unique per group (the three tcp suites run the same tests at
        // once, and each member's stat file is named by group and rank).
        let name = format!(
            "{}-{}",
            &test[..test.len().min(40)],
            listeners[0].local_addr().expect("local address").port()
        );
        let options = TcpOptions::new(
            &name,
            row_len_bytes,
            0xC0_4F_04_3A,
            addresses,
            b"conformance key".to_vec(),
        );
        TcpHarness {
            options,
            listeners: std::sync::Mutex::new(listeners.into_iter().map(Some).collect()),
        }
    }

    fn open(&self, rank: usize) -> TcpFabric {
        let listener = self.listeners.lock().expect("listeners")[rank]
            .take()
            .expect("open once per rank");
        TcpFabric::open_with_listener(&self.options, rank, listener)
            .unwrap_or_else(|e| panic!("open member {rank} of tcp group {}: {e}", self.options.group))
    }
}

conformance_suite!(tcp, TcpHarness);

/// The ofi fabric (feature `ofi`) over one of libfabric's software
/// providers, on loopback: the control plane's listeners are bound as for
/// [`TcpHarness`]; the data goes by `fi_write` through the provider.
#[cfg(feature = "ofi")]
pub struct OfiHarness<P> {
    options: spindle_fabric::ofi::OfiOptions,
    listeners: std::sync::Mutex<Vec<Option<std::net::TcpListener>>>,
    _provider: std::marker::PhantomData<P>,
}

/// Which libfabric provider an [`OfiHarness`] uses.
#[cfg(feature = "ofi")]
pub trait Provider: Sync {
    const NAME: &'static str;
}

/// The provider a harness runs on: `SPINDLE_OFI_PROVIDER` if set (to
/// check a cluster's `verbs` or `efa` against the contract), else `P`'s.
#[cfg(feature = "ofi")]
fn provider_for<P: Provider>() -> String {
    std::env::var("SPINDLE_OFI_PROVIDER").unwrap_or_else(|_| P::NAME.to_string())
}

/// libfabric's `tcp` provider (RDM endpoints through `ofi_rxm`).
#[cfg(feature = "ofi")]
pub struct TcpProvider;
#[cfg(feature = "ofi")]
impl Provider for TcpProvider {
    const NAME: &'static str = "tcp";
}

#[cfg(feature = "ofi")]
impl<P: Provider> Harness for OfiHarness<P> {
    type Fabric = spindle_fabric::ofi::OfiFabric;

    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> OfiHarness<P> {
        let tcp = TcpHarness::new_group(&format!("ofi-{}-{test}", P::NAME), member_count, row_len_bytes);
        let provider = provider_for::<P>();
        let mut options =
            spindle_fabric::ofi::OfiOptions::new("unused", row_len_bytes, 0, Vec::new(), Vec::new(), &provider);
        options.tcp = tcp.options;
        OfiHarness {
            options,
            listeners: tcp.listeners,
            _provider: std::marker::PhantomData,
        }
    }

    fn open(&self, rank: usize) -> spindle_fabric::ofi::OfiFabric {
        let listener = self.listeners.lock().expect("listeners")[rank]
            .take()
            .expect("open once per rank");
        spindle_fabric::ofi::OfiFabric::open_with_listener(&self.options, rank, listener).unwrap_or_else(|e| {
            panic!(
                "open member {rank} of ofi group {} ({} provider): {e}",
                self.options.tcp.group, self.options.provider
            )
        })
    }
}

#[cfg(feature = "ofi")]
conformance_suite!(ofi_tcp, OfiHarness<TcpProvider>);
// Not `sockets`: libfabric 1.17's grants FI_ORDER_WAW yet let a guard
// land before its data here (scenario b), so the fabric opens it
// unordered (`ofi::endpoint::PROVIDERS_BREAKING_ORDER`), where every push
// waits for the previous write's delivery: correct, but scenario (b)'s
// 200,000 pushes then take minutes.

/// The tcp fabric with coalescing on, used the way the group layer uses
/// it: pushes are buffered and go out when the doorbell rings, which this
/// wrapper does after every guard-sized push (the scenarios push data,
/// then an 8-byte guard or acknowledgement).
pub struct CoalescedTcp {
    fabric: TcpFabric,
    /// Flush explicitly (`TcpOptions::flush_on_ring` off) instead of ringing.
    explicit_flush: bool,
}

impl CoalescedTcp {
    /// After a small push (a guard or an ack): send what is pending, by an
    /// explicit flush or a doorbell ring.
    fn flush_after(&self, small: bool) {
        if small && self.explicit_flush {
            self.fabric.flush();
        } else if small {
            self.fabric.doorbell().ring();
        }
    }
}

impl Fabric for CoalescedTcp {
    fn member_rank(&self) -> usize {
        self.fabric.member_rank()
    }
    fn member_count(&self) -> usize {
        self.fabric.member_count()
    }
    fn row_len_bytes(&self) -> usize {
        self.fabric.row_len_bytes()
    }
    fn row(&self, rank: usize) -> spindle_fabric::RowRef<'_> {
        self.fabric.row(rank)
    }
    fn push(
        &self,
        range: std::ops::Range<usize>,
        peers: spindle_fabric::PeerSet,
    ) -> Result<(), spindle_fabric::FabricError> {
        let small = range.len() <= 8;
        self.fabric.push(range, peers)?;
        self.flush_after(small);
        Ok(())
    }
    fn push_vectored(
        &self,
        ranges: &[std::ops::Range<usize>],
        peers: spindle_fabric::PeerSet,
    ) -> Result<(), spindle_fabric::FabricError> {
        // The coalescing fabric's own vectored push (each range copied
        // into the pending buffer), flushed when it ends with a guard.
        self.fabric.push_vectored(ranges, peers)?;
        self.flush_after(ranges.last().is_some_and(|r| r.len() <= 8));
        Ok(())
    }
    fn check_peers(&self) -> Result<(), spindle_fabric::FabricError> {
        self.fabric.check_peers()
    }
    fn joined(&self) -> spindle_fabric::PeerSet {
        self.fabric.joined()
    }
    fn doorbell(&self) -> &dyn spindle_fabric::doorbell::Doorbell {
        self.fabric.doorbell()
    }
    fn describe(&self) -> String {
        self.fabric.describe()
    }
}

pub struct CoalescedTcpHarness(TcpHarness);

impl Harness for CoalescedTcpHarness {
    type Fabric = CoalescedTcp;

    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> CoalescedTcpHarness {
        let mut h = TcpHarness::new_group(test, member_count, row_len_bytes);
        h.options.coalesce = true;
        CoalescedTcpHarness(h)
    }

    fn open(&self, rank: usize) -> CoalescedTcp {
        CoalescedTcp {
            fabric: self.0.open(rank),
            explicit_flush: false,
        }
    }
}

conformance_suite!(tcp_coalesced, CoalescedTcpHarness);

/// Coalescing with `flush_on_ring` off: pushes go out at an explicit
/// `TcpFabric::flush` (after every guard-sized push here), as the bench
/// and `spindle run` flush once per progress pass.
pub struct FlushedTcpHarness(TcpHarness);

impl Harness for FlushedTcpHarness {
    type Fabric = CoalescedTcp;

    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> FlushedTcpHarness {
        let mut h = TcpHarness::new_group(test, member_count, row_len_bytes);
        h.options.coalesce = true;
        h.options.flush_on_ring = false;
        FlushedTcpHarness(h)
    }

    fn open(&self, rank: usize) -> CoalescedTcp {
        CoalescedTcp {
            fabric: self.0.open(rank),
            explicit_flush: true,
        }
    }
}

conformance_suite!(tcp_flushed, FlushedTcpHarness);

/// The tcp fabric inside TLS (rustls): every member presents a
/// certificate for 127.0.0.1 signed by a CA made for the group here, and
/// trusts that CA; frames travel in TLS records.
pub struct TlsTcpHarness(TcpHarness);

impl Harness for TlsTcpHarness {
    type Fabric = TcpFabric;

    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> TlsTcpHarness {
        let mut h = TcpHarness::new_group(test, member_count, row_len_bytes);
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).expect("CA");
        let key = rcgen::KeyPair::generate().expect("member key");
        let mut member = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("member params");
        member.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = member.signed_by(&key, &ca, &ca_key).expect("member certificate");
        h.options.tls = Some(spindle_fabric::tcp::tls::TlsConfig {
            cert_chain_pem: cert.pem().into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
            ca_pem: ca.pem().into_bytes(),
        });
        TlsTcpHarness(h)
    }

    fn open(&self, rank: usize) -> TcpFabric {
        self.0.open(rank)
    }
}

conformance_suite!(tcp_tls, TlsTcpHarness);

/// Scenario (a) on tcp with a payload region
/// (`Fabric::declare_payload_region`) over its data bytes: there the
/// reader reads them only behind the guard and the writer rewrites them
/// only after the reader's acknowledgement, which is the region's
/// contract (the other scenarios read data words without a guard, so only
/// (a) runs here). Frames into the region are applied with one memory
/// copy; the guard must still make every byte visible.
pub struct PayloadRegionTcpHarness(TcpHarness);

impl Harness for PayloadRegionTcpHarness {
    type Fabric = TcpFabric;

    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> PayloadRegionTcpHarness {
        PayloadRegionTcpHarness(TcpHarness::new_group(test, member_count, row_len_bytes))
    }

    fn open(&self, rank: usize) -> TcpFabric {
        let fabric = self.0.open(rank);
        fabric.declare_payload_region(DATA..DATA + DATA_BYTES);
        fabric
    }
}

#[test]
fn tcp_payload_region_guard_makes_data_visible() {
    suite::guard_makes_data_visible::<PayloadRegionTcpHarness>();
}

/// The simulated fabric in its threaded mode: one world per scenario and a
/// pump thread that delivers every push after a random delay (up to 5
/// rounds of 1 µs simulated), cut into up to 4 chunks that arrive in any
/// order. The deterministic single-thread mode has its own tests in
/// `sim_fabric.rs`.
pub struct SimHarness {
    world: spindle_fabric::sim::SimWorld,
    _pump: spindle_fabric::sim::SimPump,
}

impl Harness for SimHarness {
    type Fabric = spindle_fabric::sim::SimFabric;

    // SimFabric::push checks the range before it snapshots the bytes.
    const PUSH_CHECKS_RANGE_IN_RELEASE: bool = true;

    fn new_group(test: &str, member_count: usize, row_len_bytes: usize) -> SimHarness {
        let seed = test
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        let mut options = spindle_fabric::sim::SimOptions::new(member_count, row_len_bytes, seed);
        options.delay_ns_max = 5_000;
        options.split_chunks_max = 4;
        let world = spindle_fabric::sim::SimWorld::new(options).expect("a sim world");
        let pump = world.spawn_pump();
        SimHarness { world, _pump: pump }
    }

    fn open(&self, rank: usize) -> spindle_fabric::sim::SimFabric {
        self.world
            .open(rank)
            .unwrap_or_else(|e| panic!("open sim member {rank}: {e}"))
    }
}

conformance_suite!(sim, SimHarness);

// ---- the scenarios -------------------------------------------------------

mod suite {
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

    use spindle_fabric::{check_range, Fabric, FabricError, PeerSet, CACHE_LINE_BYTES};

    use super::*;

    /// Rank, count, row length and fresh rows, as every member sees them.
    pub fn identity_and_fresh_rows_are_zero<H: Harness>() {
        let harness = H::new_group("identity", 2, ROW_BYTES);
        let fabrics = open_all(&harness, 2);
        run_members(&fabrics, |fabric, _team| {
            assert_eq!(fabric.member_count(), 2);
            let len = fabric.row_len_bytes();
            assert!(
                len >= ROW_BYTES && len.next_multiple_of(CACHE_LINE_BYTES) == len,
                "row_len_bytes {len}: at least {ROW_BYTES}, a multiple of {CACHE_LINE_BYTES}"
            );
            assert!(!fabric.describe().is_empty());
            for rank in 0..2 {
                let row = fabric.row(rank);
                assert_eq!(row.len(), len, "every row has row_len_bytes");
                assert_eq!(row.as_ptr() as usize % CACHE_LINE_BYTES, 0);
                // Only counters are checked: they are what a layer above
                // relies on starting at zero (guards, frontiers).
                for offset in (0..len).step_by(8) {
                    assert_eq!(
                        row.u64_at(offset).load(Acquire),
                        0,
                        "row {rank} byte {offset} of a fresh group is not zero"
                    );
                }
            }
        });
        let ranks: Vec<usize> = fabrics.iter().map(|f| f.member_rank()).collect();
        assert_eq!(ranks, vec![0, 1]);
    }

    /// (a) Member 0 writes a 4 KiB pattern, pushes it, stores the guard with
    /// Release and pushes the guard; member 1 Acquire-loads the guard and
    /// must see the whole pattern. Member 1 acknowledges each round so that
    /// member 0 never rewrites bytes that are being read (flow control).
    pub fn guard_makes_data_visible<H: Harness>() {
        const ROUNDS: u64 = 10_000;
        let harness = H::new_group("guard", 2, ROW_BYTES);
        let fabrics = open_all(&harness, 2);
        run_members(&fabrics, |fabric, team| {
            let peer = 1 - fabric.member_rank();
            let to_peer = PeerSet(1 << peer);
            let mine = fabric.row(fabric.member_rank());
            for round in 1..=ROUNDS {
                if fabric.member_rank() == 0 {
                    wait_for_ack(fabric, team, round - 1);
                    write_pattern(fabric, round);
                    push(fabric, DATA..DATA + DATA_BYTES, to_peer);
                    // Partner: the Acquire load of GUARD by member 1 below.
                    mine.u64_at(GUARD).store(round, Release);
                    push(fabric, GUARD..GUARD + 8, to_peer);
                } else {
                    take_round_and_ack(fabric, team, round);
                }
            }
        });
    }

    /// (b) Pushes from one member to one peer become visible in the order
    /// they were issued: a word pushed before the guard is never behind it,
    /// and the guard never goes backwards.
    pub fn pushes_to_one_peer_arrive_in_order<H: Harness>() {
        const PUSHES: u64 = 100_000;
        let harness = H::new_group("order", 2, ROW_BYTES);
        let fabrics = open_all(&harness, 2);
        run_members(&fabrics, |fabric, team| {
            let mine = fabric.row(fabric.member_rank());
            let theirs = fabric.row(1 - fabric.member_rank());
            if fabric.member_rank() == 0 {
                for value in 1..=PUSHES {
                    // The data word needs no Release: its push comes first.
                    mine.u64_at(DATA).store(value, Relaxed);
                    push(fabric, DATA..DATA + 8, PeerSet(0b10));
                    // Partner: the Acquire load of GUARD by member 1.
                    mine.u64_at(GUARD).store(value, Release);
                    push(fabric, GUARD..GUARD + 8, PeerSet(0b10));
                }
                return;
            }
            let guard_seen = std::cell::Cell::new(0u64);
            let (mut data_seen, mut observations) = (0u64, 0u64);
            team.wait_until(
                || format!("member 0's guard to reach {PUSHES} (at {})", guard_seen.get()),
                || {
                    // Partner: the Release store of GUARD by member 0.
                    let guard = theirs.u64_at(GUARD).load(Acquire);
                    let data = theirs.u64_at(DATA).load(Relaxed);
                    assert!(
                        guard >= guard_seen.get(),
                        "guard went backwards: {} then {guard}",
                        guard_seen.get()
                    );
                    assert!(data >= data_seen, "data word went backwards: {data_seen} then {data}");
                    assert!(
                        data >= guard,
                        "guard {guard} visible before the data word pushed ahead of it ({data})"
                    );
                    guard_seen.set(guard);
                    data_seen = data;
                    observations += 1;
                    guard == PUSHES
                },
            );
            assert!(observations > 0);
        });
    }

    /// (b') `push_vectored`: the data split into more ranges than one
    /// `sendmsg` of the tcp fabric frames (64 of 64 B, one empty), then
    /// the guard, all in one call: a member that sees the guard sees every
    /// range before it. A vectored push with a range out of bounds is
    /// refused before anything is pushed.
    pub fn vectored_push_arrives_in_order<H: Harness>() {
        const ROUNDS: u64 = 2_000;
        const PIECES: usize = 64;
        const PIECE_BYTES: usize = DATA_BYTES / PIECES;
        let harness = H::new_group("vectored", 2, ROW_BYTES);
        let fabrics = open_all(&harness, 2);
        run_members(&fabrics, |fabric, team| {
            let peer = 1 - fabric.member_rank();
            let to_peer = PeerSet(1 << peer);
            let mine = fabric.row(fabric.member_rank());
            let len = fabric.row_len_bytes();
            if H::PUSH_CHECKS_RANGE_IN_RELEASE {
                match fabric.push_vectored(&[DATA..DATA + 8, len..len + 8], to_peer) {
                    Err(FabricError::PushOutOfBounds { start, .. }) => assert_eq!(start, len),
                    other => panic!("a vectored push past the row gave {other:?}"),
                }
            }
            for round in 1..=ROUNDS {
                if fabric.member_rank() == 0 {
                    wait_for_ack(fabric, team, round - 1);
                    write_pattern(fabric, round);
                    // Partner: the Acquire load of GUARD by member 1 below.
                    mine.u64_at(GUARD).store(round, Release);
                    let mut ranges: Vec<std::ops::Range<usize>> = (0..PIECES)
                        .map(|i| DATA + i * PIECE_BYTES..DATA + (i + 1) * PIECE_BYTES)
                        .collect();
                    ranges.insert(PIECES / 2, DATA..DATA);
                    ranges.push(GUARD..GUARD + 8);
                    fabric
                        .push_vectored(&ranges, to_peer)
                        .unwrap_or_else(|e| panic!("vectored push in round {round}: {e}"));
                } else {
                    take_round_and_ack(fabric, team, round);
                }
            }
        });
    }

    /// (c) An out-of-range push is refused with `PushOutOfBounds`; ranges at
    /// the edges of the row are accepted.
    pub fn out_of_range_push_is_refused<H: Harness>() {
        let harness = H::new_group("bounds", 1, ROW_BYTES);
        let fabrics = open_all(&harness, 1);
        let fabric = &fabrics[0];
        let len = fabric.row_len_bytes();
        let nobody = PeerSet::all_except(0, 1);
        for ok in [0..len, 0..0, len..len, len - 8..len] {
            check_range(&ok, len).unwrap_or_else(|e| panic!("{ok:?} is in bounds: {e}"));
            push(fabric, ok, nobody);
        }
        let reversed = std::ops::Range { start: 16, end: 8 };
        for bad in [0..len + 1, len..len + 8, reversed, usize::MAX - 8..usize::MAX] {
            let expected = (bad.start, bad.end, len);
            match check_range(&bad, len) {
                Err(FabricError::PushOutOfBounds {
                    start,
                    end,
                    row_len_bytes,
                }) => assert_eq!((start, end, row_len_bytes), expected),
                other => panic!("check_range({bad:?}, {len}) gave {other:?}"),
            }
            if H::PUSH_CHECKS_RANGE_IN_RELEASE {
                match fabric.push(bad.clone(), nobody) {
                    Err(FabricError::PushOutOfBounds {
                        start,
                        end,
                        row_len_bytes,
                    }) => assert_eq!((start, end, row_len_bytes), expected),
                    other => panic!("push({bad:?}) on a row of {len} B gave {other:?}"),
                }
            }
        }
    }

    /// (d) Three members write their own rows and guards at once, round
    /// after round; every member sees every other's pattern. A member
    /// rewrites its data only when every peer has acknowledged the round.
    pub fn concurrent_members_see_each_other<H: Harness>() {
        const MEMBERS: usize = 3;
        const ROUNDS: u64 = 2_000;
        let harness = H::new_group("concurrent", MEMBERS, ROW_BYTES);
        let fabrics = open_all(&harness, MEMBERS);
        run_members(&fabrics, |fabric, team| {
            let me = fabric.member_rank();
            let peers = PeerSet::all_except(me, MEMBERS);
            let mine = fabric.row(me);
            for round in 1..=ROUNDS {
                for p in peers.iter() {
                    team.wait_until(
                        || format!("member {p} to acknowledge round {} of member {me}", round - 1),
                        || fabric.row(p).u64_at(ACK).load(Acquire) >= round - 1,
                    );
                }
                write_pattern(fabric, round);
                push(fabric, DATA..DATA + DATA_BYTES, peers);
                // Partner: the Acquire loads of GUARD by the peers below.
                mine.u64_at(GUARD).store(round, Release);
                push(fabric, GUARD..GUARD + 8, peers);
                for p in peers.iter() {
                    let theirs = fabric.row(p);
                    team.wait_until(
                        || format!("member {p}'s guard to reach round {round} (at member {me})"),
                        || theirs.u64_at(GUARD).load(Acquire) >= round,
                    );
                    let guard = theirs.u64_at(GUARD).load(Acquire);
                    assert_eq!(guard, round, "member {p} ran ahead of member {me}'s ack");
                    check_pattern(fabric, p, round);
                }
                // Partner: the Acquire loads of ACK by the peers above.
                mine.u64_at(ACK).store(round, Release);
                push(fabric, ACK..ACK + 8, peers);
            }
        });
    }

    /// (e) Both members appear in `joined()`; when member 1's fabric is
    /// dropped, member 0's `check_peers()` reports `PeerLeft { rank: 1 }`.
    pub fn clean_leave_is_reported_as_peer_left<H: Harness>() {
        let harness = H::new_group("leave", 2, ROW_BYTES);
        let mut fabrics = open_all(&harness, 2);
        let team = Team::default();
        for fabric in &fabrics {
            team.wait_until(
                || format!("member {} to see both members joined", fabric.member_rank()),
                || fabric.joined() == PeerSet(0b11),
            );
            fabric
                .check_peers()
                .unwrap_or_else(|e| panic!("both members are alive, yet: {e}"));
        }
        drop(fabrics.pop().expect("member 1"));
        let member0 = &fabrics[0];
        let mut result = Ok(());
        team.wait_until(
            || "member 0 to notice that member 1 left".to_string(),
            || {
                result = member0.check_peers();
                result.is_err()
            },
        );
        match result {
            Err(FabricError::PeerLeft { rank: 1 }) => {}
            other => panic!("expected PeerLeft {{ rank: 1 }}, got {other:?}"),
        }
        assert!(member0.joined().contains(0), "a member stays in its own joined set");
    }

    // ---- helpers ----------------------------------------------------------

    /// Member 0 of a two-member round: wait until member 1 acknowledged
    /// `round` (flow control: the data is not rewritten while read).
    fn wait_for_ack<F: Fabric>(fabric: &F, team: &Team, round: u64) {
        let theirs = fabric.row(1);
        team.wait_until(
            || format!("member 1 to acknowledge round {round}"),
            // Partner: the Release store of ACK in take_round_and_ack.
            || theirs.u64_at(ACK).load(Acquire) >= round,
        );
    }

    /// Member 1 of a two-member round: wait for member 0's guard to reach
    /// `round`, check the whole pattern of that round, acknowledge it.
    fn take_round_and_ack<F: Fabric>(fabric: &F, team: &Team, round: u64) {
        let theirs = fabric.row(0);
        team.wait_until(
            || format!("member 0's guard to reach round {round}"),
            // Partner: the Release store of GUARD by member 0.
            || theirs.u64_at(GUARD).load(Acquire) >= round,
        );
        let guard = theirs.u64_at(GUARD).load(Acquire);
        assert_eq!(guard, round, "member 0 ran ahead of the acknowledgements");
        check_pattern(fabric, 0, round);
        // Partner: the Acquire load of ACK in wait_for_ack.
        fabric.row(1).u64_at(ACK).store(round, Release);
        push(fabric, ACK..ACK + 8, PeerSet(0b01));
    }

    fn push<F: Fabric>(fabric: &F, range: std::ops::Range<usize>, peers: PeerSet) {
        fabric
            .push(range.clone(), peers)
            .unwrap_or_else(|e| panic!("member {} push {range:?}: {e}", fabric.member_rank()));
    }

    /// Byte `i` of the data area of `rank`'s row in `round`. Successive
    /// rounds differ in every byte (37 is odd, so never 0 mod 256).
    fn pattern(rank: usize, round: u64, i: usize) -> u8 {
        (round as usize * 37 + rank * 101 + i * 7 + (i >> 8)) as u8
    }

    fn write_pattern<F: Fabric>(fabric: &F, round: u64) {
        let rank = fabric.member_rank();
        // SAFETY:
        // - this is the caller's own row;
        // - no peer reads the data area now: every peer acknowledged the
        //   previous round before this call (the scenarios wait for it);
        // - no other slice of these bytes is alive.
        let data = unsafe { fabric.row(rank).bytes_mut(DATA, DATA_BYTES) };
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = pattern(rank, round, i);
        }
    }

    fn check_pattern<F: Fabric>(fabric: &F, rank: usize, round: u64) {
        // SAFETY: the caller Acquire-loaded `rank`'s guard at `round`, and
        // `rank` does not rewrite its data before this member acknowledges
        // the round, which it does only after this check.
        let data = unsafe { fabric.row(rank).bytes(DATA, DATA_BYTES) };
        if let Some(i) = (0..DATA_BYTES).find(|i| data[*i] != pattern(rank, round, *i)) {
            panic!(
                "member {} sees member {rank}'s guard at round {round} but byte {i} of its data \
                 is {:#04x}, expected {:#04x} (the push before the guard is not visible)",
                fabric.member_rank(),
                data[i],
                pattern(rank, round, i)
            );
        }
    }
}

// ---- running members -----------------------------------------------------

/// Open every member of the group, each on its own thread (an
/// implementation may block in `open` until its peers connect).
fn open_all<H: Harness>(harness: &H, member_count: usize) -> Vec<H::Fabric> {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..member_count)
            .map(|rank| s.spawn(move || harness.open(rank)))
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|panic| resume_unwind(panic)))
            .collect()
    })
}

/// Run `body` for every member at once, each on its own thread, after
/// every member has seen every other join. The fabrics outlive all the
/// threads, so no member leaves while another still reads its row. The
/// first panic is re-raised once every thread has stopped.
fn run_members<F, B>(fabrics: &[F], body: B)
where
    F: Fabric,
    B: Fn(&F, &Team) + Sync,
{
    let team = Team::default();
    let all = spindle_fabric::PeerSet::all(fabrics.len());
    std::thread::scope(|s| {
        let threads: Vec<_> = fabrics
            .iter()
            .map(|fabric| {
                let (team, body) = (&team, &body);
                s.spawn(move || {
                    let _failed = FailOnPanic(&team.failed);
                    team.wait_until(
                        || format!("member {} to see every member join", fabric.member_rank()),
                        || fabric.joined().0 & all.0 == all.0,
                    );
                    body(fabric, team);
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        if let Some(panic) = results.into_iter().find_map(|r| r.err()) {
            resume_unwind(panic);
        }
    });
}

/// What the members of one scenario share: whether one of them failed, so
/// that the others stop waiting for it at once.
#[derive(Default)]
struct Team {
    failed: AtomicBool,
}

impl Team {
    /// Spin, then yield, until `done()`; fail after [`STALL_MAX`] or as
    /// soon as another member has failed.
    fn wait_until(&self, what: impl Fn() -> String, mut done: impl FnMut() -> bool) {
        let started = Instant::now();
        let mut polls = 0u32;
        while !done() {
            polls = polls.saturating_add(1);
            if polls < 64 {
                std::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            if self.failed.load(Ordering::Relaxed) {
                panic!("gave up waiting for {}: another member failed", what());
            }
            if started.elapsed() > STALL_MAX {
                panic!(
                    "no progress for {} s waiting for {} (liveness bound)",
                    STALL_MAX.as_secs(),
                    what()
                );
            }
        }
    }
}

/// Marks the team failed when the member thread holding it panics.
struct FailOnPanic<'a>(&'a AtomicBool);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}
