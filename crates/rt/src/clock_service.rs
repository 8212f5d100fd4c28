//! The global clock service over a fabric: the thin runtime around
//! [`crate::clock::ClockEstimator`].
//!
//! Rank 0 is the master: its (injected) clock *is* global time. The master
//! runs a server thread that answers stamp requests; every other member
//! runs a client thread that does a burst of exchanges per round and
//! publishes the resulting [`ClockModel`] through a seqlock, so the
//! dispatcher reads `now()` without a lock. Row columns used (see
//! [`crate::layout`]): the client's `clock_request_seq`, the master's
//! `clock_reply_seq[c]` (the reply's guard, pushed alone right after
//! `t3`), `clock_reply_stamps[2c]`, `[2c + 1]` (`t2`, `t3`) and
//! `clock_stamps_seq[c]` (their guard, pushed after them): a two-step
//! reply (see `exchange`). While an exchange is in flight both sides
//! spin and receive on their own thread (`Fabric::receive_now`).
//!
//! Jumps: a node's clock steps are announced (the injected clock's
//! generation, as Linux announces `settimeofday` through
//! `TFD_TIMER_CANCEL_ON_SET`); `now()` refuses until the next round. The
//! master's clock defines global time and is not stepped.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use spindle_fabric::{Fabric, PeerSet};
use spindle_runtime::{monotonic_ns, IdleStrategy, Idler};

use crate::clock::{ClockConfig, ClockError, ClockEstimator, ClockModel, Exchange, InjectedClock, Interval};
use crate::layout::{RtLayout, CLOCK_ROUNDS};

/// The master's rank.
pub const MASTER_RANK: usize = 0;

/// How the service runs.
#[derive(Debug, Clone, Copy)]
pub struct ClockServiceConfig {
    /// Time between rounds once drift is known well (the longest).
    pub resync_interval_ns: u64,
    /// Time between the first rounds (the shortest); in between, rounds
    /// come as often as the drift uncertainty needs (see `sync_loop`).
    pub warmup_interval_ns: u64,
    pub exchanges_per_round: usize,
    /// A reply not seen within this is abandoned (the round goes on).
    pub exchange_timeout_ns: u64,
    pub estimator: ClockConfig,
    /// Run the service thread at this SCHED_FIFO priority (when permitted):
    /// on a loaded host an exchange otherwise waits for the master's
    /// thread to be scheduled, and the bound grows with that wait.
    pub fifo_priority: Option<i32>,
    /// Ring the fabric's doorbell after each request, to wake a master
    /// parked on it (shm: one futex for every process). Off on tcp: there a
    /// frame itself wakes a parked master (it polls the sockets), and a
    /// ring tells this process's receive thread that a progress loop
    /// receives for it, so it naps and delays everything else that arrives
    /// (the replies, the channels' slots) by up to its nap.
    pub ring_doorbell: bool,
}

impl Default for ClockServiceConfig {
    fn default() -> Self {
        ClockServiceConfig {
            resync_interval_ns: 100_000_000,
            warmup_interval_ns: 10_000_000,
            exchanges_per_round: 16,
            exchange_timeout_ns: 20_000_000,
            estimator: ClockConfig::default(),
            fifo_priority: None,
            ring_doorbell: true,
        }
    }
}

/// A `ClockModel` behind a seqlock (one writer: the service thread).
#[derive(Default)]
struct SeqModel {
    seq: AtomicU64,
    words: [AtomicU64; 8],
}

impl SeqModel {
    fn store(&self, m: &ClockModel, local_generation: u64) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        // Orders the odd `seq` before the field stores below. Partner: the
        // Acquire fence in `load`.
        fence(Ordering::Release);
        let words = [
            m.valid as u64,
            m.base_local_ns,
            m.offset_ns as u64,
            m.drift_ppb as u64,
            m.error_ns,
            m.uncertainty_ppb,
            m.stale_after_ns,
            local_generation,
        ];
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        // Partner: the Acquire load of `seq` at the start of `load`.
        self.seq.store(s + 2, Ordering::Release);
    }

    fn load(&self) -> Option<(ClockModel, u64)> {
        for _ in 0..10_000 {
            // Partner: the final Release store of `seq` in `store`.
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let w: [u64; 8] = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
            // Partner: the Release fence in `store`.
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            let model = ClockModel {
                valid: w[0] == 1,
                base_local_ns: w[1],
                offset_ns: w[2] as i64,
                drift_ppb: w[3] as i64,
                error_ns: w[4],
                uncertainty_ppb: w[5],
                stale_after_ns: w[6],
            };
            return Some((model, w[7]));
        }
        None
    }
}

/// The shared half: what the dispatcher and the application read.
pub struct GlobalClock {
    injected: InjectedClock,
    is_master: bool,
    model: SeqModel,
    /// Rounds completed (clients) or requests served (master).
    pub rounds: AtomicU64,
    pub jumps_detected: AtomicU64,
    /// Whether the service thread runs under SCHED_FIFO.
    pub fifo_granted: AtomicBool,
    last_sample_error_ns: AtomicU64,
}

impl GlobalClock {
    /// A clock whose model is exact (the master, or a single node).
    pub fn master(injected: InjectedClock) -> GlobalClock {
        let c = GlobalClock::new(injected, true);
        c.model.store(&ClockModel::exact(), 0);
        c
    }

    fn new(injected: InjectedClock, is_master: bool) -> GlobalClock {
        GlobalClock {
            injected,
            is_master,
            model: SeqModel::default(),
            rounds: AtomicU64::new(0),
            jumps_detected: AtomicU64::new(0),
            fifo_granted: AtomicBool::new(false),
            last_sample_error_ns: AtomicU64::new(0),
        }
    }

    pub fn injected(&self) -> &InjectedClock {
        &self.injected
    }
    pub fn is_master(&self) -> bool {
        self.is_master
    }

    /// This node's local clock now.
    pub fn local_ns(&self) -> u64 {
        self.injected.local(monotonic_ns())
    }

    pub fn model(&self) -> ClockModel {
        self.model.load().map(|(m, _)| m).unwrap_or_default()
    }

    /// Global time now, as an interval that holds the true time.
    pub fn now(&self) -> Result<Interval, ClockError> {
        self.at_mono(monotonic_ns())
    }

    /// Global time at host time `mono_ns` (for measurements).
    pub fn at_mono(&self, mono_ns: u64) -> Result<Interval, ClockError> {
        let (model, generation) = self.model.load().ok_or(ClockError::Unsynced)?;
        if self.injected.generation(mono_ns) != generation {
            return Err(ClockError::Unsynced);
        }
        model.interval(self.injected.local(mono_ns))
    }

    /// The model's midpoint now even when `now()` refuses (unsynced after
    /// a step, or stale): the dispatcher keeps its schedule on the last
    /// model and counts those jobs as over the clock budget.
    pub fn now_mid_unchecked_ns(&self) -> u64 {
        let m = self.model();
        let local = self.local_ns();
        let age = local as i128 - m.base_local_ns as i128;
        (local as i128 + m.offset_ns as i128 + m.drift_ppb as i128 * age / 1_000_000_000).max(0) as u64
    }

    /// The host monotonic time at which global time reaches `global_ns`.
    pub fn mono_for_global(&self, global_ns: u64) -> u64 {
        let model = self.model();
        self.injected.mono_for_local(model.local_for_global(global_ns))
    }

    /// The bound `now()` would report `horizon_ns` after the last round.
    pub fn bound_at_horizon_ns(&self, horizon_ns: u64) -> Result<u64, ClockError> {
        let m = self.model();
        m.interval(m.base_local_ns.saturating_add(horizon_ns))
            .map(|i| i.bound_ns())
    }

    /// Error bound of the last round's best exchange.
    pub fn last_sample_error_ns(&self) -> u64 {
        self.last_sample_error_ns.load(Ordering::Relaxed)
    }
}

/// The running service: a thread plus the shared [`GlobalClock`].
pub struct ClockService {
    clock: Arc<GlobalClock>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    config: ClockServiceConfig,
}

impl ClockService {
    /// Start the master's server or a client's sync thread.
    pub fn start<F: Fabric>(
        fabric: Arc<F>,
        layout: Arc<RtLayout>,
        injected: InjectedClock,
        config: ClockServiceConfig,
    ) -> ClockService {
        let me = fabric.member_rank();
        let is_master = me == MASTER_RANK;
        let clock = Arc::new(if is_master {
            GlobalClock::master(injected)
        } else {
            GlobalClock::new(injected, false)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = if fabric.member_count() == 1 {
            None
        } else {
            let (c, s) = (clock.clone(), stop.clone());
            let name = if is_master {
                "rt-clock-server"
            } else {
                "rt-clock-client"
            };
            Some(
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || {
                        if let Some(priority) = config.fifo_priority {
                            let granted = crate::os::request_rt_privileges(true, priority, false);
                            c.fifo_granted.store(granted.sched_fifo.is_ok(), Ordering::Relaxed);
                        }
                        if is_master {
                            serve(&*fabric, &layout, &c, &s)
                        } else {
                            sync_loop(&*fabric, &layout, &c, &s, config)
                        }
                    })
                    .expect("spawn clock thread"),
            )
        };
        ClockService {
            clock,
            stop,
            thread,
            config,
        }
    }

    pub fn clock(&self) -> &Arc<GlobalClock> {
        &self.clock
    }

    /// Wait until the bound at the resync horizon is at most `budget_ns`.
    pub fn wait_synced(&self, budget_ns: u64, timeout: Duration) -> Result<u64, String> {
        let started = monotonic_ns();
        let horizon = self.config.resync_interval_ns + self.config.warmup_interval_ns;
        loop {
            let bound = self.clock.bound_at_horizon_ns(horizon);
            if let Ok(b) = bound {
                if b <= budget_ns {
                    return Ok(b);
                }
            }
            if monotonic_ns() - started > timeout.as_nanos() as u64 {
                return Err(match bound {
                    Ok(b) => format!(
                        "the clock bound is {b} ns after {} ms, over the budget of {budget_ns} ns",
                        timeout.as_millis()
                    ),
                    Err(e) => format!("clock not synchronized after {} ms: {e}", timeout.as_millis()),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn resync_interval_ns(&self) -> u64 {
        self.config.resync_interval_ns
    }
}

impl Drop for ClockService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Between rounds, the most the drift uncertainty may add to the bound
/// before the next round (it sets the interval while drift is learned).
const GROWTH_PER_ROUND_NS: u64 = 1_000;

/// How long the master keeps spinning (and receiving on its own thread)
/// after its last request before it parks: a round's next request comes
/// about one round trip after the previous reply.
const SERVE_SPIN_NS: u64 = 300_000;
/// The master's park between rounds (see `serve`).
const SERVE_PARK: Duration = Duration::from_millis(2);
/// How long a client sleeps at a time between rounds (it checks for an
/// announced clock step after each).
const BETWEEN_ROUNDS_NAP: Duration = Duration::from_millis(5);

/// How long a client spins for a reply before it starts napping between
/// looks (it keeps receiving on its own thread throughout).
const EXCHANGE_SPIN_NS: u64 = 300_000;

/// Bring in what the peers sent, on the calling thread, without blocking
/// (tcp: a non-blocking receive on each peer's socket; shm: nothing).
/// Returns whether anything arrived.
#[inline]
fn receive_now<F: Fabric>(fabric: &F) -> bool {
    fabric.receive_now()
}

/// Send the pushes the fabric coalesced (tcp only).
#[inline]
fn flush<F: Fabric>(fabric: &F) {
    fabric.flush();
}

/// The master: answer every client's newest request, in two steps (see
/// [`exchange`]): first the reply's guard alone, as soon as possible
/// after `t3`, then the stamps and their own guard. While requests come
/// (a round's burst) it spins and receives on its own thread; between
/// rounds it parks.
fn serve<F: Fabric>(fabric: &F, layout: &RtLayout, clock: &GlobalClock, stop: &AtomicBool) {
    let members = fabric.member_count();
    let me = fabric.row(MASTER_RANK);
    let mut served = [0u64; 64];
    let mut request = [0u64; 64];
    let mut t2 = [0u64; 64];
    // Once the spin window after the last request has passed, park at
    // once (no yields: useless under SCHED_FIFO): the thread may run at
    // real-time priority and must not hold a core between rounds. A
    // request wakes the park (shm: the client rings the doorbell; tcp: the
    // frame itself, the park polls the sockets), so the timeout only
    // bounds a lost wake-up; a short one woke this thread (a timer
    // interrupt on whichever CPU a dispatcher was spinning on) every
    // 200 µs between rounds.
    let mut idler = Idler::new(IdleStrategy::Backoff {
        spins: 0,
        yields: 0,
        park: SERVE_PARK,
    });
    let mut last_request_ns = monotonic_ns();
    while !stop.load(Ordering::Relaxed) {
        receive_now(fabric);
        // Step 1, the timed part: t2 as soon as a request is seen, t3
        // just before the reply's guard goes out.
        let mut answering = 0u64;
        for c in 1..members {
            // Partner: the client's Release store of its request in `exchange`.
            let r = fabric
                .row(c)
                .u64_at(layout.clock_request_seq.offset())
                .load(Ordering::Acquire);
            if r > served[c] {
                t2[c] = clock.local_ns();
                request[c] = r;
                answering |= 1 << c;
            }
        }
        for c in PeerSet(answering).iter() {
            let t3 = clock.local_ns();
            me.u64_at(layout.clock_reply_stamps.offset(2 * c))
                .store(t2[c], Ordering::Relaxed);
            me.u64_at(layout.clock_reply_stamps.offset(2 * c + 1))
                .store(t3, Ordering::Relaxed);
            // Partner: the client's Acquire load of its reply seq in `wait_for`.
            me.u64_at(layout.clock_reply_seq.offset(c))
                .store(request[c], Ordering::Release);
            let seq_at = layout.clock_reply_seq.offset(c);
            let _ = fabric.push(seq_at..seq_at + 8, PeerSet(1 << c));
            flush(fabric);
        }
        // Step 2: the stamps, then the guard that says they are there
        // (pushes to one peer are visible in order).
        for c in PeerSet(answering).iter() {
            let at = layout.clock_reply_stamps.offset(2 * c);
            let _ = fabric.push(at..at + 16, PeerSet(1 << c));
            // Partner: the client's Acquire load of its stamps seq in `wait_for`.
            me.u64_at(layout.clock_stamps_seq.offset(c))
                .store(request[c], Ordering::Release);
            let seq_at = layout.clock_stamps_seq.offset(c);
            let _ = fabric.push(seq_at..seq_at + 8, PeerSet(1 << c));
            served[c] = request[c];
        }
        let work = answering.count_ones();
        if work > 0 {
            flush(fabric);
            clock.rounds.fetch_add(work as u64, Ordering::Relaxed);
            last_request_ns = monotonic_ns();
            idler.reset();
            continue;
        }
        if monotonic_ns().saturating_sub(last_request_ns) < SERVE_SPIN_NS {
            std::hint::spin_loop();
            continue;
        }
        // The re-check after announcing a park: a request that arrived
        // since the scan must not wait for the park timeout.
        let pending = || {
            (1..members).any(|c| {
                // Partner: the client's Release store of its request in `exchange`.
                fabric
                    .row(c)
                    .u64_at(layout.clock_request_seq.offset())
                    .load(Ordering::Acquire)
                    > served[c]
            })
        };
        idler.idle(0, fabric.doorbell(), pending);
    }
}

/// A client: rounds of exchanges, model published after each.
fn sync_loop<F: Fabric>(
    fabric: &F,
    layout: &RtLayout,
    clock: &GlobalClock,
    stop: &AtomicBool,
    config: ClockServiceConfig,
) {
    let me = fabric.member_rank();
    let mut est = ClockEstimator::new(config.estimator);
    let mut seq = fabric
        .row(me)
        .u64_at(layout.clock_request_seq.offset())
        .load(Ordering::Relaxed);
    let mut generation = clock.injected.generation(monotonic_ns());
    let mut warm_rounds = 0u32;
    let mut best_error_ns = u64::MAX;
    std::thread::sleep(Duration::from_millis(me as u64 * 4));
    while !stop.load(Ordering::Relaxed) {
        let g = clock.injected.generation(monotonic_ns());
        if g != generation {
            est.handle_discontinuity();
            clock.model.store(&est.model(), g);
            generation = g;
            warm_rounds = 0;
        }
        for _ in 0..config.exchanges_per_round {
            seq += 1;
            if let Some(ex) = exchange(fabric, layout, clock, seq, &config, stop) {
                est.handle_exchange(ex);
            }
        }
        let jumps_before = est.jumps_detected;
        let finished = est.finish_round();
        let mut retry_soon = false;
        if let Some(sample) = finished {
            // A round whose every exchange was slow (the master was not
            // scheduled) is retried soon rather than a whole interval later.
            best_error_ns = best_error_ns.min(sample.error_ns);
            retry_soon = sample.error_ns > 4 * best_error_ns.max(500);
            clock.last_sample_error_ns.store(sample.error_ns, Ordering::Relaxed);
            // A round that straddled a step is discarded: the generation
            // check at the top of the next pass handles it.
            if clock.injected.generation(monotonic_ns()) == generation {
                clock.model.store(&est.model(), generation);
            }
            clock.rounds.fetch_add(1, Ordering::Relaxed);
            let row = fabric.row(me);
            row.u64_at(layout.counters.offset(CLOCK_ROUNDS))
                .fetch_add(1, Ordering::Relaxed);
        }
        if est.jumps_detected > jumps_before {
            clock.jumps_detected.fetch_add(1, Ordering::Relaxed);
            warm_rounds = 0;
        }
        warm_rounds = warm_rounds.saturating_add(1);
        // Members start rounds at rank-dependent phases so two clients
        // rarely compete for the master (and the cores) at once.
        let phase_ns = me as u64 * 3_000_000;
        // The next round comes before the drift uncertainty has grown the
        // bound by more than `GROWTH_PER_ROUND_NS` (often while drift is
        // still being learned, every resync interval once it is known).
        let model = est.model();
        let adaptive_ns = if model.valid {
            (GROWTH_PER_ROUND_NS as u128 * 1_000_000_000 / model.uncertainty_ppb.max(1) as u128) as u64
        } else {
            0
        };
        let wait_ns = if retry_soon {
            2_000_000 + phase_ns / 3
        } else if warm_rounds < 8 {
            config.warmup_interval_ns + phase_ns
        } else {
            adaptive_ns.clamp(config.warmup_interval_ns, config.resync_interval_ns) + phase_ns
        };
        let until = monotonic_ns() + wait_ns;
        while !stop.load(Ordering::Relaxed) && monotonic_ns() < until {
            if clock.injected.generation(monotonic_ns()) != generation {
                break;
            }
            let left = until.saturating_sub(monotonic_ns());
            std::thread::sleep(BETWEEN_ROUNDS_NAP.min(Duration::from_nanos(left.max(1))));
        }
    }
}

/// One request/reply with the master; `None` if the reply did not come.
///
/// Two-step reply: the client stamps `t4` when the master's reply *guard*
/// arrives (pushed alone, right after the master's `t3`), then waits for
/// the stamps `t2`, `t3` and their own guard, which the master pushes
/// afterwards. So only one small push lies between `t3` and `t4` on the
/// master's side, and the stamps' pushes are outside the round trip. Both
/// sides receive on their own thread while they wait ([`receive_now`]),
/// instead of waiting for a receive thread to be woken.
fn exchange<F: Fabric>(
    fabric: &F,
    layout: &RtLayout,
    clock: &GlobalClock,
    seq: u64,
    config: &ClockServiceConfig,
    stop: &AtomicBool,
) -> Option<Exchange> {
    let me = fabric.member_rank();
    let row = fabric.row(me);
    let master = fabric.row(MASTER_RANK);
    let reply = master.u64_at(layout.clock_reply_seq.offset(me));
    let stamps_seq = master.u64_at(layout.clock_stamps_seq.offset(me));
    let offset = layout.clock_request_seq.offset();
    let t1 = clock.local_ns();
    // Partner: the master's Acquire load of requests in `serve`.
    row.u64_at(offset).store(seq, Ordering::Release);
    fabric.push(offset..offset + 8, PeerSet(1 << MASTER_RANK)).ok()?;
    flush(fabric);
    if config.ring_doorbell {
        fabric.doorbell().ring();
    }
    let started = monotonic_ns();
    if !wait_for(fabric, reply, seq, started, config.exchange_timeout_ns, stop) {
        return None;
    }
    let t4 = clock.local_ns();
    // Partner: the master's Release store of the reply seq in `serve`.
    if reply.load(Ordering::Acquire) != seq {
        return None; // a newer reply: this one's stamps are gone
    }
    if !wait_for(fabric, stamps_seq, seq, started, config.exchange_timeout_ns, stop) {
        return None;
    }
    // Partner: the master's Release store of the stamps seq in `serve`.
    if stamps_seq.load(Ordering::Acquire) != seq {
        return None;
    }
    Some(Exchange {
        t1_local_ns: t1,
        t2_remote_ns: master
            .u64_at(layout.clock_reply_stamps.offset(2 * me))
            .load(Ordering::Relaxed),
        t3_remote_ns: master
            .u64_at(layout.clock_reply_stamps.offset(2 * me + 1))
            .load(Ordering::Relaxed),
        t4_local_ns: t4,
    })
}

/// Spin (receiving on this thread) until `guard` reaches `seq`; after
/// [`EXCHANGE_SPIN_NS`] nap between looks. `false` on timeout or stop.
fn wait_for<F: Fabric>(
    fabric: &F,
    guard: &AtomicU64,
    seq: u64,
    started_ns: u64,
    timeout_ns: u64,
    stop: &AtomicBool,
) -> bool {
    let mut spins = 0u32;
    // Partner: the master's Release stores of the reply seq and the
    // stamps seq in `serve`.
    while guard.load(Ordering::Acquire) < seq {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(16) {
            let waited = monotonic_ns().saturating_sub(started_ns);
            if waited > timeout_ns || stop.load(Ordering::Relaxed) {
                return false;
            }
            // Spin, then nap: this thread may be SCHED_FIFO and must not
            // starve the master's thread of the core it needs.
            if waited > EXCHANGE_SPIN_NS {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        if !receive_now(fabric) {
            std::hint::spin_loop();
        }
    }
    true
}
