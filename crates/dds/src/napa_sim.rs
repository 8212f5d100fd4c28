//! A deterministic, seeded discrete-event model of a reliable writer with
//! and without [`Napa`], after the seed's experiment (one publisher, one
//! or more subscribers, ACK every K samples).
//!
//! ```text
//!  application ──offer──▶ writer ──send──▶ link (C bytes/s, FIFO) ──t_prop──▶ reader r: FIFO, t_proc each
//!                         │ window: ≤ window_slots_max sent, unacked                 │
//!                         ◀──────────── cumulative ack (every K, or idle) ◀──t_ack + t_prop──┘
//! ```
//!
//! - **Link**: one FIFO server of `link_bytes_per_s`; a sample of `size`
//!   bytes occupies it `t_m = ⌈size / C⌉`; each sample is serialized once
//!   and fans out to every reader (multicast), then `prop_delay_ns`.
//! - **Readers**: each processes its samples in order, one at a time,
//!   `reader_base_ns + size / reader_bytes_per_s`, times a seeded jitter,
//!   times `slow_phase.factor` while a slow phase lasts (a reader that falls
//!   behind for a while). A reader acknowledges cumulatively once K samples
//!   are delivered since its last ack, or `ack_idle_ns` after its last
//!   delivery (so the tail is acknowledged); the ack takes
//!   `ack_bytes / C + prop_delay_ns` back.
//! - **Writer**: a hard window of `window_slots_max` samples sent and not
//!   acknowledged by every reader. Without NAPA it sends whenever the window
//!   has room; with NAPA it also waits for [`Napa::next_send_ns`]. The
//!   occupancy goes to [`Napa::step`] on every send, ack and control tick.
//! - **Application**: [`Load::Saturating`] is a writer thread in a loop
//!   whose `write` returns when its sample is sent (the next sample is
//!   offered at that moment); [`Load::FixedRate`] offers one sample every
//!   `interval_ns`, queueing without bound (the run has a fixed count).
//!
//! Latency is measured per (sample, reader) two ways: **send → deliver**
//! (the seed's one-way latency) and **offer → deliver** (including the time
//! the sample waited for the window or the gap). The model is lossless and
//! the link FIFO, so there are no retransmissions: the latency NAPA removes
//! here is the queueing the seed's §II describes, not the resends.
//!
//! Invariants, checked on every run (a violation panics with the
//! property's name): `reliable_in_order` (each reader delivers 1, 2, 3…:
//! nothing lost, duplicated or reordered), `window_bound` (occupancy ≤
//! `window_slots_max`), `send_within_window` (no send past the window),
//! `all_delivered` (every offered sample reaches every reader, within a
//! bounded number of events), `gap_bounds` (gap within `[0, gap_ns_max]`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use spindle_fabric::sim::SimRng;

use crate::napa::{Napa, NapaConfig, NapaTrace};

/// Points kept in a run's trace (downsampled by doubling the stride).
pub const TRACE_POINTS_MAX: usize = 512;

/// Liveness bound: events per (sample, reader) before `all_delivered` fails.
pub const EVENTS_PER_SAMPLE_MAX: u64 = 64;

const NS_PER_S: u128 = 1_000_000_000;

/// How the application offers samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// As fast as `write` returns (a blocking write: the next sample is
    /// offered when the previous one is sent).
    Saturating,
    /// One sample every `interval_ns`, whatever the writer does.
    FixedRate {
        /// The offer interval.
        interval_ns: u64,
    },
}

/// A time during which every reader is `factor` times slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowPhase {
    /// When it begins.
    pub start_ns: u64,
    /// How long it lasts.
    pub length_ns: u64,
    /// The processing time multiplier.
    pub factor: u32,
}

/// One simulated setting (see the module docs for the model).
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// The seed of the run's randomness (size and processing jitter).
    pub seed: u64,
    /// How many samples the application writes.
    pub samples: u32,
    /// The nominal sample size.
    pub sample_bytes: u32,
    /// Each sample's size varies uniformly by ± this many per mille.
    pub size_jitter_permille: u32,
    /// Link capacity C.
    pub link_bytes_per_s: u64,
    /// One-way propagation delay.
    pub prop_delay_ns: u64,
    /// Readers (each gets every sample; the writer's ack is their minimum).
    pub readers: u32,
    /// Fixed processing cost per sample at a reader.
    pub reader_base_ns: u64,
    /// Per-byte processing speed of a reader.
    pub reader_bytes_per_s: u64,
    /// Processing time varies uniformly by ± this many per mille.
    pub reader_jitter_permille: u32,
    /// An optional time when the readers slow down.
    pub slow_phase: Option<SlowPhase>,
    /// K: a reader acknowledges every K delivered samples.
    pub ack_every: u32,
    /// ...or this long after its last delivery, if something is unacked.
    pub ack_idle_ns: u64,
    /// The ack's size on the link back.
    pub ack_bytes: u32,
    /// The writer's hard window.
    pub window_slots_max: u32,
    /// The application's offered load.
    pub load: Load,
}

impl Scenario {
    /// `t_m` of a nominal sample on the link.
    pub fn sample_time_ns(&self) -> u64 {
        ns_for_bytes(self.sample_bytes as u64, self.link_bytes_per_s)
    }

    /// A reader's nominal processing time per sample (no jitter, no slow
    /// phase).
    pub fn reader_time_ns(&self) -> u64 {
        self.reader_base_ns + ns_for_bytes(self.sample_bytes as u64, self.reader_bytes_per_s)
    }

    /// The run's nominal length: every sample through the bottleneck.
    pub fn duration_estimate_ns(&self) -> u64 {
        let bottleneck_ns = self.sample_time_ns().max(self.reader_time_ns());
        let offered_ns = match self.load {
            Load::Saturating => 0,
            Load::FixedRate { interval_ns } => interval_ns,
        };
        self.samples as u64 * bottleneck_ns.max(offered_ns)
    }

    /// NAPA's settings for this scenario: the seed's gain (1.0 → 0.2) and
    /// low threshold (1), K and the window from the scenario, the link's C
    /// as the first estimate. Scaled to the model's short runs: the control
    /// period is `max(100 µs, 2·K·t_m)` (every decision sees about two
    /// acks, so the sawtooth's top), the gain decays over the first third
    /// of the run, and the RTT/capacity window is an eighth of the run
    /// (between 4 periods and 1 s).
    pub fn napa_config(&self) -> NapaConfig {
        let period_ns = (2 * self.ack_every as u64 * self.sample_time_ns()).max(100_000);
        let duration_ns = self.duration_estimate_ns();
        let rtt_window_ns = (duration_ns / 8).min(1_000_000_000).max(4 * period_ns);
        NapaConfig {
            ack_every: self.ack_every,
            low_threshold: 1,
            control_period_ns: period_ns,
            gain_start: 1.0,
            gain_end: 0.2,
            gain_decay_ns: (duration_ns / 3).max(period_ns),
            link_capacity_bytes_per_s: self.link_bytes_per_s,
            rtt_window_ns,
            // One control period: the model's link and readers serve at a
            // steady rate, so a short delivery-rate sample is not inflated
            // (and these runs' windows hold only ~20 periods). The running
            // system's 32 ms is for a host whose threads are descheduled
            // (`napa::tests::bursty_acks_do_not_inflate_the_capacity`,
            // `napa::tests::bursts_longer_than_a_short_sample_do_not_inflate_the_capacity`).
            rate_interval_ns_min: period_ns,
            window_slots_max: self.window_slots_max,
            gap_ns_max: 100_000_000,
        }
    }

    /// The seed's experiment in the model: a 1 Gb/s LAN (C = 125 MB/s,
    /// 50 µs each way), one reader that processes 10 µs + 2 GB/s, ACK every
    /// 10 samples, a 64-sample window, a saturating application, 3000
    /// samples of `sample_bytes`.
    pub fn lan(sample_bytes: u32) -> Scenario {
        Scenario {
            seed: 4,
            samples: 3000,
            sample_bytes,
            size_jitter_permille: 0,
            link_bytes_per_s: 125_000_000,
            prop_delay_ns: 50_000,
            readers: 1,
            reader_base_ns: 10_000,
            reader_bytes_per_s: 2_000_000_000,
            reader_jitter_permille: 100,
            slow_phase: None,
            ack_every: 10,
            ack_idle_ns: 0, // set below
            ack_bytes: 64,
            window_slots_max: 64,
            load: Load::Saturating,
        }
        .with_idle_ack()
    }

    /// Sets `ack_idle_ns` to 3 sample times plus 2 propagation delays
    /// (a heartbeat-driven ack for the tail, late enough not to replace the
    /// every-K acks while samples flow).
    fn with_idle_ack(mut self) -> Scenario {
        let per_sample_ns = self.sample_time_ns().max(self.reader_time_ns());
        self.ack_idle_ns = 3 * per_sample_ns + 2 * self.prop_delay_ns;
        self
    }
}

/// A scenario drawn from `seed`: size 5–200 kB (sometimes jittered), C from
/// 100 MB/s to 1.25 GB/s, 5–200 µs each way, K in 1..=20, 1–3 readers at
/// 0.5–4× the link's speed with jitter, sometimes a slow phase (2–8×),
/// a 8–256-sample window, saturating or fixed-rate load, 1000–2500 samples.
pub fn scenario_for_seed(seed: u64) -> Scenario {
    let mut rng = SimRng::new(seed ^ 0x4E41_5041); // "NAPA"
    let sample_bytes = rng.range(5_000, 200_000) as u32;
    let link_bytes_per_s = rng.range(100_000_000, 1_250_000_000);
    let readers = if rng.chance(700) { 1 } else { rng.range(2, 3) as u32 };
    let reader_speed_permille = rng.range(500, 4000);
    let mut scenario = Scenario {
        seed,
        samples: rng.range(1000, 2500) as u32,
        sample_bytes,
        size_jitter_permille: if rng.chance(300) { rng.range(1, 200) as u32 } else { 0 },
        link_bytes_per_s,
        prop_delay_ns: rng.range(5_000, 200_000),
        readers,
        reader_base_ns: rng.range(1_000, 20_000),
        reader_bytes_per_s: link_bytes_per_s * reader_speed_permille / 1000,
        reader_jitter_permille: rng.range(0, 300) as u32,
        slow_phase: None,
        ack_every: rng.range(1, 20) as u32,
        ack_idle_ns: 0,
        ack_bytes: 64,
        window_slots_max: rng.range(8, 256) as u32,
        load: Load::Saturating,
    };
    if rng.chance(200) {
        let interval_ns = scenario.sample_time_ns() * rng.range(500, 3000) / 1000;
        scenario.load = Load::FixedRate {
            interval_ns: interval_ns.max(1),
        };
    }
    let duration_ns = scenario.duration_estimate_ns();
    if rng.chance(300) {
        scenario.slow_phase = Some(SlowPhase {
            start_ns: duration_ns * rng.range(200, 600) / 1000,
            length_ns: duration_ns * rng.range(50, 200) / 1000,
            factor: rng.range(2, 8) as u32,
        });
    }
    scenario.with_idle_ack()
}

/// Latency percentiles over every (sample, reader).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Maximum.
    pub max_ns: u64,
}

impl Percentiles {
    fn of(values: &mut [u64]) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_unstable();
        let at = |q: usize| values[((values.len() - 1) * q).div_ceil(100)];
        Percentiles {
            p50_ns: at(50),
            p90_ns: at(90),
            p99_ns: at(99),
            max_ns: values[values.len() - 1],
        }
    }
}

/// One control tick of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracePoint {
    /// Simulated time.
    pub now_ns: u64,
    /// Samples sent and not acknowledged by every reader.
    pub occupancy: u32,
    /// NAPA's gap (0 without NAPA).
    pub gap_ns: u64,
    /// NAPA's W (the hard window without NAPA).
    pub high_threshold: u32,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// The scenario's seed.
    pub seed: u64,
    /// Whether NAPA paced the writer.
    pub napa: bool,
    /// The nominal sample size.
    pub sample_bytes: u32,
    /// Samples written (each delivered to every reader).
    pub samples: u64,
    /// Send → deliver.
    pub latency_send_ns: Percentiles,
    /// Offer → deliver (includes waiting for the window or the gap).
    pub latency_offer_ns: Percentiles,
    /// Samples per second each reader received, over the whole run.
    pub throughput_samples_per_s: f64,
    /// Bytes per second each reader received, over the whole run.
    pub throughput_bytes_per_s: f64,
    /// From the first offer to the last delivery.
    pub duration_ns: u64,
    /// The highest occupancy seen.
    pub occupancy_max: u32,
    /// Control ticks after the gain decayed (NAPA only).
    pub periods_after_decay: u64,
    /// ...of which the occupancy was within `[low, W]`.
    pub periods_in_range: u64,
    /// Occupancy and gap per control tick, downsampled.
    pub trace: Vec<TracePoint>,
    /// NAPA's state at the end.
    pub napa_final: Option<NapaTrace>,
}

impl SimReport {
    /// The fraction of post-decay control ticks with occupancy in range.
    pub fn in_range_fraction(&self) -> f64 {
        self.periods_in_range as f64 / self.periods_after_decay.max(1) as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Offer,
    WriterWake,
    Arrive { reader: u32, seq: u64 },
    Done { reader: u32, seq: u64 },
    AckTimer { reader: u32, generation: u64 },
    AckArrive { reader: u32, through: u64 },
    Tick,
}

#[derive(Clone, Debug, Default)]
struct Reader {
    arrive_next: u64,
    deliver_next: u64,
    busy_until_ns: u64,
    since_ack: u32,
    ack_generation: u64,
    /// The reader's cumulative ack as the writer knows it.
    acked_at_writer: u64,
}

struct Trace {
    points: Vec<TracePoint>,
    stride: u64,
    ticks: u64,
}

impl Trace {
    fn push(&mut self, point: TracePoint) {
        if self.ticks.is_multiple_of(self.stride) {
            if self.points.len() == TRACE_POINTS_MAX {
                let mut keep = false;
                self.points.retain(|_| {
                    keep = !keep;
                    keep
                });
                self.stride *= 2;
            }
            if self.ticks.is_multiple_of(self.stride) {
                self.points.push(point);
            }
        }
        self.ticks += 1;
    }
}

fn ns_for_bytes(bytes: u64, bytes_per_s: u64) -> u64 {
    (bytes as u128 * NS_PER_S).div_ceil(bytes_per_s.max(1) as u128) as u64
}

fn violated(property: &str, detail: String) -> ! {
    panic!("invariant {property} violated: {detail}")
}

struct Sim<'a> {
    sc: &'a Scenario,
    rng: SimRng,
    napa: Option<Napa>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    event_order: u64,
    events_handled: u64,
    now_ns: u64,
    samples: u64,
    /// Per seq (index seq − 1).
    sizes: Vec<u32>,
    offered_ns: Vec<u64>,
    sent_ns: Vec<u64>,
    seq_next: u64,
    offered: u64,
    acked_min: u64,
    send_last_ns: Option<u64>,
    wake_at_ns: Option<u64>,
    link_free_ns: u64,
    occupancy_max: u32,
    readers: Vec<Reader>,
    readers_done: u32,
    latency_send_ns: Vec<u64>,
    latency_offer_ns: Vec<u64>,
    delivered_last_ns: u64,
    control_period_ns: u64,
    decay_end_ns: u64,
    periods_after_decay: u64,
    periods_in_range: u64,
    trace: Trace,
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, napa: Option<NapaConfig>) -> Sim<'a> {
        assert!(sc.samples > 0 && sc.readers > 0 && sc.ack_every > 0, "scenario: empty");
        assert!(
            sc.window_slots_max > 0 && sc.link_bytes_per_s > 0,
            "scenario: no window or link"
        );
        let mut rng = SimRng::new(sc.seed);
        let samples = sc.samples as u64;
        let sizes = (0..samples)
            .map(|_| {
                let j = sc.size_jitter_permille as u64;
                let permille = rng.range(1000 - j.min(999), 1000 + j);
                (sc.sample_bytes as u64 * permille / 1000).max(1) as u32
            })
            .collect();
        let control_period_ns = napa
            .as_ref()
            .map_or(sc.napa_config().control_period_ns, |c| c.control_period_ns);
        let decay_end_ns = napa.as_ref().map_or(0, |c| c.gain_decay_ns);
        let napa = napa.map(|cfg| Napa::new(cfg, sc.sample_bytes).unwrap_or_else(|e| panic!("scenario's napa: {e}")));
        let reader = Reader {
            arrive_next: 1,
            deliver_next: 1,
            ..Reader::default()
        };
        Sim {
            sc,
            rng,
            napa,
            events: BinaryHeap::new(),
            event_order: 0,
            events_handled: 0,
            now_ns: 0,
            samples,
            sizes,
            offered_ns: vec![0; sc.samples as usize],
            sent_ns: vec![0; sc.samples as usize],
            seq_next: 1,
            offered: 0,
            acked_min: 0,
            send_last_ns: None,
            wake_at_ns: None,
            link_free_ns: 0,
            occupancy_max: 0,
            readers: vec![reader; sc.readers as usize],
            readers_done: 0,
            latency_send_ns: Vec::with_capacity((samples * sc.readers as u64) as usize),
            latency_offer_ns: Vec::with_capacity((samples * sc.readers as u64) as usize),
            delivered_last_ns: 0,
            control_period_ns,
            decay_end_ns,
            periods_after_decay: 0,
            periods_in_range: 0,
            trace: Trace {
                points: Vec::new(),
                stride: 1,
                ticks: 0,
            },
        }
    }

    fn schedule(&mut self, at_ns: u64, event: Event) {
        debug_assert!(at_ns >= self.now_ns, "an event in the past");
        self.event_order += 1;
        self.events.push(Reverse((at_ns, self.event_order, event)));
    }

    fn occupancy(&self) -> u32 {
        (self.seq_next - 1 - self.acked_min) as u32
    }

    fn run(&mut self) {
        match self.sc.load {
            Load::Saturating => self.offered = 1,
            Load::FixedRate { .. } => self.schedule(0, Event::Offer),
        }
        self.schedule(0, Event::Tick);
        self.try_send();
        let events_max = self.samples * self.sc.readers as u64 * EVENTS_PER_SAMPLE_MAX + 100_000;
        while self.readers_done < self.sc.readers {
            let Some(Reverse((at_ns, _, event))) = self.events.pop() else {
                violated(
                    "all_delivered",
                    format!("no event left, {} readers done", self.readers_done),
                );
            };
            self.events_handled += 1;
            if self.events_handled > events_max {
                violated("all_delivered", format!("more than {events_max} events (livelock)"));
            }
            self.now_ns = at_ns;
            self.handle(event);
        }
        for (r, reader) in self.readers.iter().enumerate() {
            if reader.deliver_next != self.samples + 1 {
                violated("all_delivered", format!("reader {r} at {}", reader.deliver_next));
            }
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Offer => self.on_offer(),
            Event::WriterWake => {
                if self.wake_at_ns == Some(self.now_ns) {
                    self.wake_at_ns = None;
                }
                self.try_send();
            }
            Event::Arrive { reader, seq } => self.on_arrive(reader, seq),
            Event::Done { reader, seq } => self.on_done(reader, seq),
            Event::AckTimer { reader, generation } => {
                let r = &self.readers[reader as usize];
                if r.ack_generation == generation && r.since_ack > 0 {
                    self.send_ack(reader);
                }
            }
            Event::AckArrive { reader, through } => self.on_ack(reader, through),
            Event::Tick => self.on_tick(),
        }
    }

    fn on_offer(&mut self) {
        let Load::FixedRate { interval_ns } = self.sc.load else {
            unreachable!("offers are scheduled only for a fixed rate");
        };
        self.offered += 1;
        self.offered_ns[self.offered as usize - 1] = self.now_ns;
        if self.offered < self.samples {
            self.schedule(self.now_ns + interval_ns, Event::Offer);
        }
        self.try_send();
    }

    /// Sends while a sample is offered, the window has room and NAPA's gap
    /// has passed.
    fn try_send(&mut self) {
        while self.seq_next <= self.samples && self.seq_next <= self.offered {
            let occupancy = self.occupancy();
            if occupancy >= self.sc.window_slots_max {
                return; // an ack will call again
            }
            if let Some(napa) = self.napa.as_mut() {
                napa.step(self.now_ns, occupancy);
                let next_ns = self.send_last_ns.map_or(0, |last| napa.next_send_ns(last));
                if next_ns > self.now_ns {
                    if self.wake_at_ns.is_none_or(|at| at > next_ns) {
                        self.wake_at_ns = Some(next_ns);
                        self.schedule(next_ns, Event::WriterWake);
                    }
                    return;
                }
            }
            self.send();
        }
    }

    fn send(&mut self) {
        let seq = self.seq_next;
        if seq > self.acked_min + self.sc.window_slots_max as u64 {
            violated("send_within_window", format!("seq {seq}, acked {}", self.acked_min));
        }
        let bytes = self.sizes[seq as usize - 1];
        let t_m_ns = ns_for_bytes(bytes as u64, self.sc.link_bytes_per_s);
        self.link_free_ns = self.link_free_ns.max(self.now_ns) + t_m_ns;
        for reader in 0..self.sc.readers {
            self.schedule(self.link_free_ns + self.sc.prop_delay_ns, Event::Arrive { reader, seq });
        }
        self.sent_ns[seq as usize - 1] = self.now_ns;
        if self.sc.load == Load::Saturating && seq < self.samples {
            self.offered = seq + 1;
            self.offered_ns[seq as usize] = self.now_ns;
        }
        self.seq_next += 1;
        self.send_last_ns = Some(self.now_ns);
        let occupancy = self.occupancy();
        if occupancy > self.sc.window_slots_max {
            violated("window_bound", format!("occupancy {occupancy}"));
        }
        self.occupancy_max = self.occupancy_max.max(occupancy);
        if let Some(napa) = self.napa.as_mut() {
            napa.set_sample_bytes(bytes);
            napa.on_sent(seq, self.now_ns);
            napa.step(self.now_ns, occupancy);
        }
    }

    fn processing_ns(&mut self, seq: u64) -> u64 {
        let bytes = self.sizes[seq as usize - 1] as u64;
        let nominal_ns = self.sc.reader_base_ns + ns_for_bytes(bytes, self.sc.reader_bytes_per_s);
        let j = self.sc.reader_jitter_permille as u64;
        let permille = self.rng.range(1000 - j.min(999), 1000 + j);
        let mut ns = (nominal_ns * permille / 1000).max(1);
        if let Some(slow) = self.sc.slow_phase {
            if (slow.start_ns..slow.start_ns + slow.length_ns).contains(&self.now_ns) {
                ns *= slow.factor as u64;
            }
        }
        ns
    }

    fn on_arrive(&mut self, reader: u32, seq: u64) {
        let r = reader as usize;
        if seq != self.readers[r].arrive_next {
            violated(
                "reliable_in_order",
                format!("reader {r} received {seq}, expected {}", self.readers[r].arrive_next),
            );
        }
        self.readers[r].arrive_next += 1;
        let processing_ns = self.processing_ns(seq);
        let start_ns = self.readers[r].busy_until_ns.max(self.now_ns);
        self.readers[r].busy_until_ns = start_ns + processing_ns;
        self.schedule(start_ns + processing_ns, Event::Done { reader, seq });
    }

    fn on_done(&mut self, reader: u32, seq: u64) {
        let r = reader as usize;
        if seq != self.readers[r].deliver_next {
            violated(
                "reliable_in_order",
                format!("reader {r} delivered {seq}, expected {}", self.readers[r].deliver_next),
            );
        }
        self.readers[r].deliver_next += 1;
        let i = seq as usize - 1;
        self.latency_send_ns.push(self.now_ns - self.sent_ns[i]);
        self.latency_offer_ns.push(self.now_ns - self.offered_ns[i]);
        self.delivered_last_ns = self.delivered_last_ns.max(self.now_ns);
        if seq == self.samples {
            self.readers_done += 1;
        }
        self.readers[r].since_ack += 1;
        if self.readers[r].since_ack >= self.sc.ack_every {
            self.send_ack(reader);
        } else {
            self.readers[r].ack_generation += 1;
            let generation = self.readers[r].ack_generation;
            self.schedule(
                self.now_ns + self.sc.ack_idle_ns,
                Event::AckTimer { reader, generation },
            );
        }
    }

    fn send_ack(&mut self, reader: u32) {
        let r = &mut self.readers[reader as usize];
        r.since_ack = 0;
        r.ack_generation += 1;
        let through = r.deliver_next - 1;
        let back_ns = ns_for_bytes(self.sc.ack_bytes as u64, self.sc.link_bytes_per_s) + self.sc.prop_delay_ns;
        self.schedule(self.now_ns + back_ns, Event::AckArrive { reader, through });
    }

    fn on_ack(&mut self, reader: u32, through: u64) {
        let r = &mut self.readers[reader as usize];
        r.acked_at_writer = r.acked_at_writer.max(through);
        let acked_min = self.readers.iter().map(|r| r.acked_at_writer).min().unwrap_or(0);
        if acked_min > self.acked_min {
            self.acked_min = acked_min;
            if let Some(napa) = self.napa.as_mut() {
                napa.on_acked(acked_min, self.now_ns);
            }
        }
        let occupancy = self.occupancy();
        if let Some(napa) = self.napa.as_mut() {
            napa.step(self.now_ns, occupancy);
        }
        self.try_send();
    }

    fn on_tick(&mut self) {
        let occupancy = self.occupancy();
        let (gap_ns, high_threshold) = match self.napa.as_mut() {
            Some(napa) => {
                napa.step(self.now_ns, occupancy);
                let gap_ns = napa.gap_ns();
                if gap_ns > napa.config().gap_ns_max {
                    violated("gap_bounds", format!("gap {gap_ns} ns"));
                }
                let high = napa.high_threshold();
                if self.now_ns >= self.decay_end_ns {
                    self.periods_after_decay += 1;
                    let low = napa.config().low_threshold;
                    if (low..=high).contains(&occupancy) {
                        self.periods_in_range += 1;
                    }
                }
                (gap_ns, high)
            }
            None => (0, self.sc.window_slots_max),
        };
        self.trace.push(TracePoint {
            now_ns: self.now_ns,
            occupancy,
            gap_ns,
            high_threshold,
        });
        self.try_send();
        if self.readers_done < self.sc.readers {
            self.schedule(self.now_ns + self.control_period_ns, Event::Tick);
        }
    }

    fn report(mut self) -> SimReport {
        let duration_ns = self.delivered_last_ns.max(1);
        let bytes: u64 = self.sizes.iter().map(|&b| b as u64).sum();
        let per_s = NS_PER_S as f64 / duration_ns as f64;
        SimReport {
            seed: self.sc.seed,
            napa: self.napa.is_some(),
            sample_bytes: self.sc.sample_bytes,
            samples: self.samples,
            latency_send_ns: Percentiles::of(&mut self.latency_send_ns),
            latency_offer_ns: Percentiles::of(&mut self.latency_offer_ns),
            throughput_samples_per_s: self.samples as f64 * per_s,
            throughput_bytes_per_s: bytes as f64 * per_s,
            duration_ns,
            occupancy_max: self.occupancy_max,
            periods_after_decay: self.periods_after_decay,
            periods_in_range: self.periods_in_range,
            trace: self.trace.points,
            napa_final: self.napa.as_ref().map(Napa::snapshot),
        }
    }
}

/// Runs `scenario`, with NAPA if `napa` is given; checks the invariants
/// (module docs) and panics with the property's name if one fails.
pub fn run(scenario: &Scenario, napa: Option<NapaConfig>) -> SimReport {
    let mut sim = Sim::new(scenario, napa);
    sim.run();
    sim.report()
}

/// The seed's experiment ([`Scenario::lan`]) per size: `(size, without
/// NAPA, with NAPA)`.
pub fn sweep(sizes: &[u32]) -> Vec<(u32, SimReport, SimReport)> {
    sizes
        .iter()
        .map(|&size| {
            let scenario = Scenario::lan(size);
            let off = run(&scenario, None);
            let on = run(&scenario, Some(scenario.napa_config()));
            (size, off, on)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(off: &SimReport, on: &SimReport) -> String {
        let us = |ns: u64| ns as f64 / 1000.0;
        format!(
            "| {} kB | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1}× | {:.3} |",
            off.sample_bytes / 1000,
            us(off.latency_send_ns.p50_ns),
            us(on.latency_send_ns.p50_ns),
            us(off.latency_send_ns.p99_ns),
            us(on.latency_send_ns.p99_ns),
            us(off.latency_offer_ns.p50_ns),
            us(on.latency_offer_ns.p50_ns),
            off.throughput_bytes_per_s / 1e6,
            on.throughput_bytes_per_s / 1e6,
            off.latency_send_ns.p50_ns as f64 / on.latency_send_ns.p50_ns.max(1) as f64,
            on.throughput_bytes_per_s / off.throughput_bytes_per_s,
        )
    }

    /// The scenarios of the latency claim: the seed's LAN at 100–200 kB,
    /// and at 100 and 200 kB: 10 Gb/s, a reader slower than the link, two
    /// readers.
    fn claim_scenarios() -> Vec<(&'static str, Scenario)> {
        let mut scenarios: Vec<(&str, Scenario)> = [100_000, 150_000, 200_000]
            .map(|size| ("1 Gb/s", Scenario::lan(size)))
            .to_vec();
        for size in [100_000, 200_000] {
            let mut fast = Scenario::lan(size);
            fast.link_bytes_per_s = 1_250_000_000;
            scenarios.push(("10 Gb/s", fast.with_idle_ack()));
            let mut slow_reader = Scenario::lan(size);
            slow_reader.reader_bytes_per_s = 100_000_000;
            scenarios.push(("reader 100 MB/s", slow_reader.with_idle_ack()));
            let mut two = Scenario::lan(size);
            two.readers = 2;
            scenarios.push(("2 readers", two));
        }
        scenarios
    }

    #[test]
    fn invariants_hold_for_500_seeds_with_and_without_napa() {
        for seed in 0..500 {
            let scenario = scenario_for_seed(seed);
            let off = run(&scenario, None);
            let on = run(&scenario, Some(scenario.napa_config()));
            for report in [&off, &on] {
                assert_eq!(report.samples, scenario.samples as u64, "seed {seed}");
                assert!(report.occupancy_max <= scenario.window_slots_max, "seed {seed}");
                assert!(report.trace.len() <= TRACE_POINTS_MAX, "seed {seed}");
                assert!(report.latency_send_ns.p50_ns > 0, "seed {seed}");
                assert!(
                    report.latency_offer_ns.p50_ns >= report.latency_send_ns.p50_ns,
                    "seed {seed}"
                );
            }
            assert!(off.trace.iter().all(|p| p.gap_ns == 0), "seed {seed}");
        }
    }

    #[test]
    fn seeds_reproduce_their_runs() {
        let scenario = scenario_for_seed(17);
        assert_eq!(scenario, scenario_for_seed(17));
        let a = run(&scenario, Some(scenario.napa_config()));
        let b = run(&scenario, Some(scenario.napa_config()));
        assert_eq!(a, b);
        assert_ne!(scenario_for_seed(17), scenario_for_seed(18));
    }

    /// The seed's claim, in the model: for samples ≥ 100 kB under a
    /// saturating load, NAPA's p50 send → deliver latency is ≥ 5× lower at
    /// ≥ 0.95× the throughput.
    #[test]
    fn napa_cuts_latency_5x_at_095_throughput_for_large_samples() {
        for (_, scenario) in claim_scenarios() {
            let scenario = &scenario;
            let off = run(scenario, None);
            let on = run(scenario, Some(scenario.napa_config()));
            let line = row(&off, &on);
            assert!(
                off.latency_send_ns.p50_ns >= 5 * on.latency_send_ns.p50_ns,
                "p50 not 5× lower: {line}"
            );
            assert!(
                on.throughput_bytes_per_s >= 0.95 * off.throughput_bytes_per_s,
                "throughput below 0.95×: {line}"
            );
        }
    }

    /// After the gain decays, the occupancy is within [low, W] in most
    /// control periods.
    #[test]
    fn occupancy_converges_into_the_acceptance_range() {
        let mut scenarios: Vec<Scenario> = [5_000, 50_000, 100_000, 200_000].map(Scenario::lan).to_vec();
        scenarios.extend((0..40).map(scenario_for_seed).filter(|s| s.slow_phase.is_none()));
        for scenario in &scenarios {
            let on = run(scenario, Some(scenario.napa_config()));
            assert!(
                on.periods_after_decay >= 20,
                "seed {}: {} periods",
                scenario.seed,
                on.periods_after_decay
            );
            assert!(
                on.in_range_fraction() >= 0.8,
                "seed {} size {}: {:.2} of periods in range",
                scenario.seed,
                scenario.sample_bytes,
                on.in_range_fraction()
            );
        }
    }

    #[test]
    #[should_panic(expected = "all_delivered")]
    fn a_stalled_reader_trips_all_delivered() {
        let mut scenario = Scenario::lan(10_000);
        scenario.reader_bytes_per_s = 1; // processing never ends within the event budget
        scenario.samples = 200;
        let _ = run(&scenario, None);
    }

    /// Prints docs/napa.md's table: `cargo test -p spindle-dds
    /// napa_sim::tests::print_sweep_table -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints the docs/napa.md table"]
    fn print_sweep_table() {
        println!("| size | p50 send→deliver µs (off / on) | p99 (off / on) | p50 offer→deliver µs (off / on) | MB/s (off / on) | p50 ratio | throughput on/off |");
        println!("|---|---|---|---|---|---|---|");
        for (_, off, on) in sweep(&[5_000, 10_000, 20_000, 50_000, 64_000, 100_000, 150_000, 200_000]) {
            println!("{}", row(&off, &on));
        }
        println!();
        for (name, scenario) in claim_scenarios() {
            let off = run(&scenario, None);
            let on = run(&scenario, Some(scenario.napa_config()));
            println!("| {name} {}", row(&off, &on));
        }
    }

    /// Prints docs/napa.md's figures over the 500 seeded scenarios:
    /// `cargo test -p spindle-dds napa_sim::tests::print_seed_summary
    /// -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints the docs/napa.md seed summary"]
    fn print_seed_summary() {
        let runs: Vec<(Scenario, SimReport, SimReport)> = (0..500)
            .map(|seed| {
                let scenario = scenario_for_seed(seed);
                let off = run(&scenario, None);
                let on = run(&scenario, Some(scenario.napa_config()));
                (scenario, off, on)
            })
            .collect();
        type Class = fn(&Scenario) -> bool;
        let classes: [(&str, Class); 4] = [
            ("all", |_| true),
            ("saturating, no slow phase", |s| {
                s.load == Load::Saturating && s.slow_phase.is_none()
            }),
            ("fixed rate, no slow phase", |s| {
                s.load != Load::Saturating && s.slow_phase.is_none()
            }),
            ("with a slow phase", |s| s.slow_phase.is_some()),
        ];
        type Metric = fn(&SimReport, &SimReport) -> f64;
        let metrics: [(&str, Metric); 3] = [
            ("p50 send→deliver off/on", |off, on| {
                off.latency_send_ns.p50_ns as f64 / on.latency_send_ns.p50_ns as f64
            }),
            ("throughput on/off", |off, on| {
                on.throughput_bytes_per_s / off.throughput_bytes_per_s
            }),
            ("post-decay ticks with N in [low, W]", |_, on| on.in_range_fraction()),
        ];
        for (class, member) in classes {
            let chosen: Vec<_> = runs.iter().filter(|(s, _, _)| member(s)).collect();
            for (name, metric) in metrics {
                let mut values: Vec<f64> = chosen.iter().map(|(_, off, on)| metric(off, on)).collect();
                values.sort_by(f64::total_cmp);
                let q = |p: usize| values[(values.len() - 1) * p / 100];
                println!(
                    "| {class} ({}) | {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                    values.len(),
                    q(0),
                    q(5),
                    q(50),
                    q(95),
                    q(100)
                );
            }
        }
    }
}
