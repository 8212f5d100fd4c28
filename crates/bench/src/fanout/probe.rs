//! Probes of this machine: a cache-line round trip between two CPUs, the
//! cost of join and leave, and the model's other costs (`calibrate`).
//! Each figure is the median of many batches (the machine is shared).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_fanout::model::Params;
use spindle_fanout::plan::{ack_count, child_action};
use spindle_fanout::{Domain, Layout, Shape, SlotSet, Tree, WaitConfig, WakeWord};

/// One cache line.
#[repr(C, align(64))]
struct Line(AtomicU64);

const BATCHES: usize = 200;
/// Round-trip probes whose median the calibration takes.
const ROUND_TRIP_REPEATS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "a median of something");
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-item nanoseconds of `batch` items done by `f`, median of batches.
fn per_item_ns(items: usize, mut f: impl FnMut()) -> f64 {
    let samples = (0..BATCHES)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_nanos() as f64 / items as f64
        })
        .collect();
    median(samples)
}

/// Pin the calling thread to exactly CPU `cpu` (not modulo the CPUs this
/// thread may use now: a pinned thread's children would all land on one).
pub fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("pin to CPU {cpu}: beyond CPU_SETSIZE"));
    }
    // SAFETY: cpu_set_t is plain data (all-zero is the empty set); CPU_SET
    // writes inside it (cpu < CPU_SETSIZE, checked above), and
    // sched_setaffinity reads it for the duration of the call.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!("pin to CPU {cpu}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The round trip of a cache line between CPUs `a` and `b`: one thread
/// writes an odd value, the other answers with the next even one (both
/// spawned and pinned; the caller's affinity is left alone).
pub fn cache_line_round_trip_ns(a: usize, b: usize) -> f64 {
    std::thread::spawn(move || round_trip_pinned(a, b))
        .join()
        .expect("the ping thread")
}

fn round_trip_pinned(a: usize, b: usize) -> f64 {
    // One line: an odd value there, the next even one back, plain stores.
    exchanges_pinned(
        a,
        b,
        |lines, i| {
            lines.0 .0.store(2 * i + 1, Ordering::Release);
            spin_until(&lines.0, 2 * i + 2);
        },
        |lines, i| {
            spin_until(&lines.0, 2 * i + 1);
            lines.0 .0.store(2 * i + 2, Ordering::Release);
        },
    )
}

/// Two lines, one per direction, for the probes.
type Lines = (Line, Line);

/// Spin until `line` holds `value` (Acquire: partner of the other
/// thread's store or swap in the probe).
fn spin_until(line: &Line, value: u64) {
    while line.0.load(Ordering::Acquire) != value {
        std::hint::spin_loop();
    }
}

/// Time exchanges between a thread pinned to `a` (`ask`, exchange `i`)
/// and one pinned to `b` (`answer`): the median over batches of the time
/// per exchange (the first 10 batches warm up).
fn exchanges_pinned(
    a: usize,
    b: usize,
    ask: impl Fn(&Lines, u64),
    answer: impl Fn(&Lines, u64) + Send + 'static,
) -> f64 {
    const EXCHANGES: u64 = 1_000;
    let lines = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let total = (BATCHES as u64 + 10) * EXCHANGES;
    let answering = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            let _ = pin_to_cpu(b);
            for i in 0..total {
                answer(&lines, i);
            }
        })
    };
    let _ = pin_to_cpu(a);
    let mut next = 0u64;
    let mut samples = Vec::with_capacity(BATCHES + 10);
    for _ in 0..BATCHES + 10 {
        let t0 = Instant::now();
        for _ in 0..EXCHANGES {
            ask(&lines, next);
            next += 1;
        }
        samples.push(t0.elapsed().as_nanos() as f64 / EXCHANGES as f64);
    }
    answering.join().expect("the answering thread");
    median(samples[10..].to_vec())
}

/// The hardware floor of a 2-member multicast between CPUs `a` and `b`:
/// its two hand-offs alone, each a locked swap on a line of its own (the
/// mailbox there, the completion back), as the multicast does them, and
/// nothing else (no claim, no scatter, no finish). Median of batches.
pub fn handoff_round_trip_ns(a: usize, b: usize) -> f64 {
    std::thread::spawn(move || handoff_pinned(a, b))
        .join()
        .expect("the hand-off thread")
}

fn handoff_pinned(a: usize, b: usize) -> f64 {
    // Exchange i writes i + 1 (0 is the lines' initial value).
    exchanges_pinned(
        a,
        b,
        |lines, i| {
            lines.0 .0.swap(i + 1, Ordering::AcqRel);
            spin_until(&lines.1, i + 1);
        },
        |lines, i| {
            spin_until(&lines.0, i + 1);
            lines.1 .0.swap(i + 1, Ordering::AcqRel);
        },
    )
}

/// The cost of one join and of one leave (uncontended), in ns.
pub fn join_leave_ns() -> (f64, f64) {
    let slots = spindle_fanout::SLOTS_MAX_LIVE;
    let domain = Domain::new(
        Tree::build(Shape::Flat, slots).unwrap(),
        Layout::TreeHelpSkip,
        WaitConfig::default(),
    )
    .expect("a domain of SLOTS_MAX_LIVE slots");
    let ports: Vec<_> = (0..slots)
        .map(|s| domain.attach(s, |_| {}).expect("a free slot"))
        .collect();
    let (mut joins, mut leaves) = (Vec::new(), Vec::new());
    for _ in 0..BATCHES * 5 {
        let t0 = Instant::now();
        for p in &ports {
            black_box(p.join()).expect("a free slot");
        }
        let t1 = Instant::now();
        for p in &ports {
            // Nothing in flight: the leave is its one atomic op.
            black_box(domain.state().leave(p.slot())).expect("a joined slot");
        }
        let t2 = Instant::now();
        joins.push((t1 - t0).as_nanos() as f64 / slots as f64);
        leaves.push((t2 - t1).as_nanos() as f64 / slots as f64);
    }
    (median(joins), median(leaves))
}

/// The model's costs measured on this machine.
pub fn calibrate() -> Params {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The round trip varies with where the host places the two vCPUs (and
    // what else runs): the median of repeated probes, each on fresh threads.
    let round_trip = median(
        (0..ROUND_TRIP_REPEATS)
            .map(|_| cache_line_round_trip_ns(0, 1 % cpus))
            .collect(),
    );
    let lines: Vec<Line> = (0..64).map(|_| Line(AtomicU64::new(0))).collect();
    // A send: three field stores and the swap of the seq word.
    let send_ns = per_item_ns(64 * 16, || {
        for _ in 0..16 {
            for (i, l) in lines.iter().enumerate() {
                l.0.store(i as u64, Ordering::Relaxed);
                l.0.store(i as u64, Ordering::Relaxed);
                l.0.store(i as u64, Ordering::Relaxed);
                black_box(l.0.swap(i as u64, Ordering::AcqRel));
            }
        }
    });
    let poll_ns = per_item_ns(4096, || {
        for _ in 0..4096 {
            black_box(lines[0].0.load(Ordering::Acquire));
            std::hint::spin_loop();
        }
    });
    let atomic_ns = per_item_ns(4096, || {
        for _ in 0..4096 {
            black_box(lines[1].0.fetch_sub(1, Ordering::AcqRel));
        }
    });
    let mut handler: Box<dyn FnMut(u64)> = Box::new(|x| {
        black_box(x);
    });
    let handler_ns = per_item_ns(4096, || {
        for i in 0..4096 {
            handler(black_box(i));
        }
    });
    let tree = Tree::build(Shape::Kary(2), 256).unwrap();
    let empty = SlotSet::default();
    let visit_ns = per_item_ns(256, || {
        for s in 0..256 {
            black_box(ack_count(&tree, Layout::TreeHelp, s, &empty));
            for &c in tree.children(s) {
                black_box(child_action(&tree, Layout::TreeHelp, c as usize, &empty));
            }
        }
    });
    Params {
        line_transfer_ns: round_trip / 4.0,
        send_ns,
        poll_ns,
        handler_ns,
        atomic_ns,
        wake_ns: wake_ns(),
        visit_ns,
    }
}

/// From a wake of a port's futex word ([`WakeWord`], what the runtime
/// does) to the sleeping thread running again, median.
pub fn wake_ns() -> f64 {
    let word = Arc::new(WakeWord::new());
    wake_latency_ns(
        {
            let word = word.clone();
            move || {
                let seen = word.prepare();
                word.wait(seen, Duration::from_secs(1));
            }
        },
        move |_| word.wake(),
    )
}

/// From std's thread unpark to the parked thread running again, median
/// (what the thread mode used before the futex word, for comparison).
pub fn unpark_wake_ns() -> f64 {
    wake_latency_ns(
        || std::thread::park_timeout(Duration::from_secs(1)),
        |sleeper: &std::thread::Thread| sleeper.unpark(),
    )
}

fn wake_latency_ns(sleep: impl Fn() + Clone + Send + 'static, wake: impl Fn(&std::thread::Thread)) -> f64 {
    let base = Instant::now();
    let parked = Arc::new(AtomicBool::new(false));
    let woken_at = Arc::new(AtomicU64::new(0));
    let mut samples = Vec::new();
    for _ in 0..100 {
        parked.store(false, Ordering::Release);
        let sleeper = {
            let (parked, woken_at, sleep) = (parked.clone(), woken_at.clone(), sleep.clone());
            std::thread::spawn(move || {
                parked.store(true, Ordering::Release);
                sleep();
                woken_at.store(base.elapsed().as_nanos() as u64, Ordering::Release);
            })
        };
        while !parked.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        // Let it reach the sleep.
        std::thread::sleep(Duration::from_micros(200));
        let t0 = base.elapsed().as_nanos() as u64;
        wake(sleeper.thread());
        sleeper.join().expect("the sleeper");
        samples.push(woken_at.load(Ordering::Acquire).saturating_sub(t0) as f64);
    }
    median(samples)
}
