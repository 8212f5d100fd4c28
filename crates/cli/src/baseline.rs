//! The raw shm baseline: a plain single-producer/single-consumer ring
//! between two processes, carrying the same payloads under the same rule
//! (the producer writes every byte, the consumer reads every byte). It is
//! what one producer and one consumer cost with no protocol at all, so
//! `ratio_to_baseline` shows what Spindle's ordering and batching cost.
//!
//! ```text
//!  /dev/shm/spindlebase-<pid>
//!  +0    ready   u64  processes attached (the coordinator starts them at 2)
//!  +8    start   u64  1: go
//!  +16   elapsed_ns u64  written by the consumer at the end
//!  +24   checksum   u64  written by the consumer
//!  +64   head u64   messages published by the producer (own line)
//!  +128  tail u64   messages consumed by the consumer (own line)
//!  +192  ring: window × stride (payload rounded up to 16 bytes)
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use spindle_sst::monotonic_ns;

use crate::payload;

const READY: usize = 0;
const START: usize = 8;
const ELAPSED: usize = 16;
const CHECKSUM: usize = 24;
const HEAD: usize = 64;
const TAIL: usize = 128;
const RING: usize = 192;

#[derive(Args, Debug)]
pub struct BaselineArgs {
    #[arg(long)]
    path: PathBuf,
    #[arg(long)]
    role: String,
    #[arg(long)]
    size: usize,
    #[arg(long)]
    count: u64,
    #[arg(long)]
    window: usize,
    #[arg(long)]
    pin: bool,
}

struct Ring {
    map: memmap2::MmapRaw,
    stride: usize,
    window: usize,
}

impl Ring {
    fn open(path: &Path, size: usize, window: usize, create: bool) -> Result<Ring, String> {
        let stride = size.next_multiple_of(16);
        let len = RING + stride * window;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        if create {
            file.set_len(len as u64)
                .map_err(|e| format!("size {}: {e}", path.display()))?;
        }
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| format!("mmap {}: {e}", path.display()))?;
        Ok(Ring { map, stride, window })
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset + 8 <= RING && offset.is_multiple_of(8));
        // SAFETY: in bounds of the mapping (asserted), 8-aligned (page base +
        // multiple of 8), and accessed only atomically by both processes.
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn slot(&self, i: u64) -> *mut u8 {
        // SAFETY: the index is reduced modulo the window, so the slot lies in
        // the mapping.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(RING + (i as usize % self.window) * self.stride)
        }
    }
}

/// Measured baseline throughput.
pub struct BaselineResult {
    pub gbps: f64,
    pub msgs_per_s: f64,
}

/// Run the baseline with two processes; returns the consumer's figures.
pub fn measure(size: usize, count: u64, window: usize, pin: bool) -> Result<BaselineResult, String> {
    let path = PathBuf::from(format!("/dev/shm/spindlebase-{}", std::process::id()));
    let ring = Ring::open(&path, size, window, true)?;
    let exe = std::env::current_exe().map_err(|e| format!("find own executable: {e}"))?;
    let spawn = |role: &str| {
        Command::new(&exe)
            .args(["baseline-member", "--role", role, "--size", &size.to_string()])
            .args(["--count", &count.to_string(), "--window", &window.to_string()])
            .args(if pin { &["--pin"][..] } else { &[][..] })
            .arg("--path")
            .arg(&path)
            .spawn()
            .map_err(|e| format!("spawn baseline {role}: {e}"))
    };
    let result = (|| {
        let mut consumer = spawn("consumer")?;
        let mut producer = spawn("producer")?;
        let started = Instant::now();
        while ring.word(READY).load(Ordering::Acquire) < 2 {
            if started.elapsed() > Duration::from_secs(30) {
                let _ = consumer.kill();
                let _ = producer.kill();
                return Err("baseline processes did not start within 30 s".to_string());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Partner: the Acquire loads of START in `run_member`.
        ring.word(START).store(1, Ordering::Release);
        let p = producer.wait().map_err(|e| e.to_string())?;
        let c = consumer.wait().map_err(|e| e.to_string())?;
        if !p.success() || !c.success() {
            return Err(format!("baseline failed (producer {p}, consumer {c})"));
        }
        let elapsed_ns = ring.word(ELAPSED).load(Ordering::Acquire).max(1);
        Ok(BaselineResult {
            gbps: (size as u64 * count) as f64 / elapsed_ns as f64,
            msgs_per_s: count as f64 * 1e9 / elapsed_ns as f64,
        })
    })();
    let _ = std::fs::remove_file(&path);
    result
}

pub fn run_member(args: BaselineArgs) -> Result<(), String> {
    let ring = Ring::open(&args.path, args.size, args.window, false)?;
    if args.pin {
        crate::member::pin_to_cpu(if args.role == "producer" { 0 } else { 1 })?;
    }
    ring.word(READY).fetch_add(1, Ordering::AcqRel);
    // Partner: the Release store of START in `measure`.
    while ring.word(START).load(Ordering::Acquire) == 0 {
        std::hint::spin_loop();
    }
    let window = args.window as u64;
    match args.role.as_str() {
        "producer" => {
            let mut cached_tail = 0u64;
            for i in 0..args.count {
                while i - cached_tail >= window {
                    // Partner: the Release store of TAIL by the consumer.
                    cached_tail = ring.word(TAIL).load(Ordering::Acquire);
                }
                // SAFETY: slot i is free (the consumer's tail passed i - window)
                // and only the producer writes it until HEAD publishes it.
                let slot = unsafe { std::slice::from_raw_parts_mut(ring.slot(i), args.size) };
                payload::fill(slot, 0, i);
                // Partner: the Acquire load of HEAD by the consumer.
                ring.word(HEAD).store(i + 1, Ordering::Release);
            }
            Ok(())
        }
        "consumer" => {
            let t0 = monotonic_ns();
            let mut cached_head = 0u64;
            let mut sum = 0u64;
            for i in 0..args.count {
                while i >= cached_head {
                    // Partner: the Release store of HEAD by the producer.
                    cached_head = ring.word(HEAD).load(Ordering::Acquire);
                }
                // SAFETY: slot i was published (HEAD > i) and the producer does
                // not reuse it until TAIL passes it.
                let slot = unsafe { std::slice::from_raw_parts(ring.slot(i), args.size) };
                sum = sum.wrapping_add(payload::checksum(slot));
                // Partner: the Acquire load of TAIL by the producer.
                ring.word(TAIL).store(i + 1, Ordering::Release);
            }
            let elapsed = monotonic_ns() - t0;
            ring.word(CHECKSUM).store(sum, Ordering::Relaxed);
            ring.word(ELAPSED).store(elapsed, Ordering::Release);
            Ok(())
        }
        other => Err(format!("unknown baseline role '{other}'")),
    }
}
