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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use spindle_runtime::monotonic_ns;

use crate::cluster::Cluster;
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
    /// shm ring file (shm roles).
    #[arg(long)]
    path: Option<PathBuf>,
    /// producer | consumer (shm ring); tcp-producer | tcp-consumer (raw TCP
    /// stream); tcp-ping | tcp-pong (raw TCP ping-pong, blocking reads);
    /// tcp-ping-spin | tcp-pong-spin (the same, busy-polling reads).
    #[arg(long)]
    role: String,
    #[arg(long, default_value_t = 32)]
    size: usize,
    #[arg(long, default_value_t = 0)]
    count: u64,
    #[arg(long, default_value_t = 1024)]
    window: usize,
    #[arg(long)]
    pin: bool,
    /// tcp roles: where the consumer / pong side listens.
    #[arg(long)]
    addr: Option<String>,
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
    // Slot 0 the consumer, slot 1 the producer; killed on drop.
    let mut procs = Cluster::new(2)?;
    let result = (|| {
        for (slot, role) in ["consumer", "producer"].into_iter().enumerate() {
            let mut args: Vec<String> = ["baseline-member", "--role", role, "--size", &size.to_string()]
                .into_iter()
                .map(String::from)
                .collect();
            args.extend([
                "--count".into(),
                count.to_string(),
                "--window".into(),
                window.to_string(),
            ]);
            if pin {
                args.push("--pin".into());
            }
            args.extend(["--path".into(), path.display().to_string()]);
            procs.start(slot, args)?;
        }
        let started = Instant::now();
        while ring.word(READY).load(Ordering::Acquire) < 2 {
            if started.elapsed() > Duration::from_secs(30) {
                return Err("baseline processes did not start within 30 s".to_string());
            }
            procs.check_alive(&[0, 1])?;
            std::thread::sleep(Duration::from_micros(200));
        }
        // Partner: the Acquire loads of START in `run_member`.
        ring.word(START).store(1, Ordering::Release);
        let timeout = Duration::from_secs(600);
        let p = procs.wait_exit(1, timeout)?.status;
        let c = procs.wait_exit(0, timeout)?.status;
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
    if args.role.starts_with("tcp-") {
        return tcp::run_role(&args.role, args.addr.as_deref(), args.size, args.count, args.pin);
    }
    let path = args.path.as_ref().ok_or("--path is needed for the shm baseline")?;
    let ring = Ring::open(path, args.size, args.window, false)?;
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

/// The raw TCP baselines of `spindle bench multicast --transport tcp`,
/// measured in the same run as the group:
///
/// - **stream**: one producer process writes `count` payloads of `size`
///   bytes (filled like the bench's, every byte written, in writes of up
///   to 64 KiB) to one consumer process, which reads every byte and
///   checksums each payload: what moving the bytes over TCP costs with no
///   protocol.
/// - **ping-pong**: 32-byte messages bounced between two processes with
///   blocking reads, TCP_NODELAY: the round trip a protocol can at best
///   match.
///
/// The measuring side prints one JSON line on stdout for the coordinator.
/// The disk's own limit for persistent mode: one `size`-byte write and
/// one `fdatasync` at a time, for `duration`, in `dir` (the directory the
/// members' logs were in).
#[derive(Clone, Debug, serde::Serialize)]
pub struct FsyncLoop {
    pub dir: String,
    pub size: usize,
    pub syncs: u64,
    pub syncs_per_s: f64,
    pub mb_per_s: f64,
    pub sync_ns: crate::report::Percentiles,
    /// The disk's streaming bandwidth: 1 MiB writes, one fdatasync per
    /// 64 MiB, for a second (what group commit can reach at best).
    pub streaming_mb_per_s: f64,
}

pub fn fsync_loop(dir: &std::path::Path, size: usize, duration: std::time::Duration) -> Result<FsyncLoop, String> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let path = dir.join("fsync-loop.bin");
    let mut file = std::fs::File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
    let buf = vec![0x5au8; size];
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let mut syncs = 0u64;
    while started.elapsed() < duration {
        let t = std::time::Instant::now();
        file.write_all(&buf)
            .map_err(|e| format!("write {}: {e}", path.display()))?;
        file.sync_data()
            .map_err(|e| format!("fdatasync {}: {e}", path.display()))?;
        let _ = hist.record(t.elapsed().as_nanos() as u64);
        syncs += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    let block = vec![0x5au8; 1 << 20];
    let stream_started = std::time::Instant::now();
    let mut streamed = 0u64;
    while stream_started.elapsed() < std::time::Duration::from_secs(1) {
        for _ in 0..64 {
            file.write_all(&block)
                .map_err(|e| format!("write {}: {e}", path.display()))?;
        }
        file.sync_data()
            .map_err(|e| format!("fdatasync {}: {e}", path.display()))?;
        streamed += 64 << 20;
    }
    let streaming_mb_per_s = streamed as f64 / stream_started.elapsed().as_secs_f64() / 1e6;
    let _ = std::fs::remove_file(&path);
    Ok(FsyncLoop {
        streaming_mb_per_s,
        dir: dir.display().to_string(),
        size,
        syncs,
        syncs_per_s: syncs as f64 / secs,
        mb_per_s: (syncs * size as u64) as f64 / secs / 1e6,
        sync_ns: crate::report::Percentiles::from_histogram(&hist),
    })
}

pub mod tcp {
    use crate::cluster::{Cluster, Output};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use hdrhistogram::Histogram;
    use serde::{Deserialize, Serialize};
    use spindle_runtime::monotonic_ns;

    use crate::payload;
    use crate::report::Percentiles;

    /// Bytes the producer hands to one `write`.
    const WRITE_BYTES_MAX: usize = 64 << 10;
    /// Bytes the consumer asks one `read` for.
    const READ_BYTES: usize = 256 << 10;
    const PING_BYTES: usize = 32;
    const PING_WARMUP: u64 = 2_000;
    /// How long a side waits for the other to listen.
    const CONNECT_WAIT: Duration = Duration::from_secs(10);

    #[derive(Debug, Serialize, Deserialize)]
    struct StreamLine {
        elapsed_ns: u64,
        bytes: u64,
        checksum: u64,
    }

    /// What the stream and ping-pong baselines measured.
    #[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
    pub struct TcpBaseline {
        pub gbps: f64,
        pub msgs_per_s: f64,
        /// The better (lower p50) of the two ping-pongs below: what raw
        /// TCP can do on this machine now.
        pub pingpong_rtt_ns: Percentiles,
        /// Blocking reads: each side sleeps in `read` until the message comes.
        pub pingpong_blocking_rtt_ns: Percentiles,
        /// Busy-polling reads (non-blocking `read` in a loop): no wake-up.
        pub pingpong_spin_rtt_ns: Percentiles,
    }

    /// A free loopback port (bound, then released for the child to bind).
    pub fn free_loopback_addr() -> Result<String, String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("find a free port: {e}"))?;
        Ok(l.local_addr().map_err(|e| e.to_string())?.to_string())
    }

    /// Run both baselines on loopback with child processes.
    pub fn measure(size: usize, count: u64, pingpong_rounds: u64, pin: bool) -> Result<TcpBaseline, String> {
        let line = pair("tcp-consumer", "tcp-producer", size, count, pin)?;
        let stream: StreamLine =
            serde_json::from_str(&line).map_err(|e| format!("stream baseline said {line:?}: {e}"))?;
        if stream.bytes != size as u64 * count {
            return Err(format!(
                "stream baseline moved {} bytes, expected {}",
                stream.bytes,
                size as u64 * count
            ));
        }
        let expected = (0..count).fold(0u64, |a, i| a.wrapping_add(payload::expected_checksum(size, 0, i)));
        if stream.checksum != expected {
            return Err("stream baseline: the consumer read different bytes than the producer wrote".into());
        }
        let pingpong = |pong: &str, ping: &str| -> Result<Percentiles, String> {
            let line = pair(pong, ping, PING_BYTES, pingpong_rounds, pin)?;
            serde_json::from_str(&line).map_err(|e| format!("ping-pong said {line:?}: {e}"))
        };
        let blocking = pingpong("tcp-pong", "tcp-ping")?;
        let spin = pingpong("tcp-pong-spin", "tcp-ping-spin")?;
        let elapsed_ns = stream.elapsed_ns.max(1);
        Ok(TcpBaseline {
            gbps: stream.bytes as f64 / elapsed_ns as f64,
            msgs_per_s: count as f64 * 1e9 / elapsed_ns as f64,
            pingpong_rtt_ns: if spin.p50 < blocking.p50 { spin } else { blocking },
            pingpong_blocking_rtt_ns: blocking,
            pingpong_spin_rtt_ns: spin,
        })
    }

    /// Start the listening role, then the dialing role; return the line
    /// the measuring role printed (the consumer, or the ping side).
    fn pair(listener_role: &str, dialer_role: &str, size: usize, count: u64, pin: bool) -> Result<String, String> {
        let addr = free_loopback_addr()?;
        // Slot 0 listens, slot 1 dials; killed on drop.
        let mut procs = Cluster::new(2)?.streams(Output::Capture, Output::Inherit);
        for (slot, role) in [listener_role, dialer_role].into_iter().enumerate() {
            let mut args: Vec<String> = ["baseline-member", "--role", role, "--size", &size.to_string()]
                .into_iter()
                .map(String::from)
                .collect();
            args.extend(["--count".into(), count.to_string(), "--addr".into(), addr.clone()]);
            if pin {
                args.push("--pin".into());
            }
            procs.start(slot, args)?;
        }
        let timeout = Duration::from_secs(600);
        let l = procs.wait_exit(0, timeout)?;
        let d = procs.wait_exit(1, timeout)?;
        if !l.status.success() || !d.status.success() {
            return Err(format!(
                "raw TCP baseline failed ({listener_role}: {}, {dialer_role}: {})",
                l.status, d.status
            ));
        }
        let out = if listener_role == "tcp-consumer" {
            l.output
        } else {
            d.output
        };
        Ok(out.trim().to_string())
    }

    /// One side of a baseline (`spindle baseline-member --role tcp-…`).
    pub fn run_role(role: &str, addr: Option<&str>, size: usize, count: u64, pin: bool) -> Result<(), String> {
        let addr = addr.ok_or("--addr is needed for the tcp baselines")?;
        if pin {
            let cpu = if matches!(role, "tcp-producer" | "tcp-ping" | "tcp-ping-spin") {
                0
            } else {
                1
            };
            crate::member::pin_to_cpu(cpu)?;
        }
        match role {
            "tcp-consumer" => consumer(&accept(addr)?, size, count),
            "tcp-producer" => producer(dial(addr)?, size, count),
            "tcp-pong" => pong(accept(addr)?, count, false),
            "tcp-ping" => ping(dial(addr)?, count, false),
            "tcp-pong-spin" => pong(accept(addr)?, count, true),
            "tcp-ping-spin" => ping(dial(addr)?, count, true),
            other => Err(format!("unknown baseline role '{other}'")),
        }
    }

    fn accept(addr: &str) -> Result<TcpStream, String> {
        let l = TcpListener::bind(addr).map_err(|e| format!("baseline: listen on {addr}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let started = Instant::now();
        loop {
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(|e| e.to_string())?;
                    s.set_nodelay(true).map_err(|e| e.to_string())?;
                    return Ok(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && started.elapsed() < CONNECT_WAIT => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => return Err(format!("baseline: accept on {addr}: {e}")),
            }
        }
    }

    fn dial(addr: &str) -> Result<TcpStream, String> {
        let started = Instant::now();
        loop {
            match TcpStream::connect(addr) {
                Ok(s) => {
                    s.set_nodelay(true).map_err(|e| e.to_string())?;
                    return Ok(s);
                }
                Err(e) if started.elapsed() < CONNECT_WAIT => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(format!("baseline: connect to {addr}: {e}")),
            }
        }
    }

    fn producer(mut s: TcpStream, size: usize, count: u64) -> Result<(), String> {
        let per_write = (WRITE_BYTES_MAX / size).max(1);
        let mut buf = vec![0u8; per_write * size];
        let mut i = 0u64;
        while i < count {
            let n = (count - i).min(per_write as u64) as usize;
            for k in 0..n {
                payload::fill(&mut buf[k * size..(k + 1) * size], 0, i + k as u64);
            }
            s.write_all(&buf[..n * size])
                .map_err(|e| format!("baseline producer: {e}"))?;
            i += n as u64;
        }
        // Wait for the consumer's close so no byte is lost to a reset.
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.read(&mut [0u8; 1]);
        Ok(())
    }

    fn consumer(s: &TcpStream, size: usize, count: u64) -> Result<(), String> {
        let mut s = s;
        let mut buf = vec![0u8; READ_BYTES.max(2 * size)];
        let (mut filled, mut done, mut checksum, mut bytes) = (0usize, 0u64, 0u64, 0u64);
        let mut t0 = None;
        while done < count {
            let n = s
                .read(&mut buf[filled..])
                .map_err(|e| format!("baseline consumer: {e}"))?;
            if n == 0 {
                return Err(format!(
                    "baseline consumer: the producer closed after {done} of {count} messages"
                ));
            }
            t0.get_or_insert_with(monotonic_ns);
            filled += n;
            let mut at = 0;
            while filled - at >= size && done < count {
                checksum = checksum.wrapping_add(payload::checksum(&buf[at..at + size]));
                at += size;
                done += 1;
                bytes += size as u64;
            }
            buf.copy_within(at..filled, 0);
            filled -= at;
        }
        let elapsed_ns = monotonic_ns() - t0.unwrap_or_else(monotonic_ns);
        let line = StreamLine {
            elapsed_ns,
            bytes,
            checksum,
        };
        println!("{}", serde_json::to_string(&line).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Read exactly `buf.len()` bytes: blocking, or busy-polling a
    /// non-blocking socket (`spin`).
    fn read_full(s: &mut TcpStream, buf: &mut [u8], spin: bool) -> std::io::Result<()> {
        if !spin {
            return s.read_exact(buf);
        }
        let mut at = 0;
        while at < buf.len() {
            match s.read(&mut buf[at..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Write all of `buf` (a non-blocking socket may take it in parts).
    fn write_full(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
        let mut at = 0;
        while at < buf.len() {
            match s.write(&buf[at..]) {
                Ok(n) => at += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    std::hint::spin_loop()
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn pong(mut s: TcpStream, count: u64, spin: bool) -> Result<(), String> {
        s.set_nonblocking(spin).map_err(|e| format!("baseline pong: {e}"))?;
        let mut msg = [0u8; PING_BYTES];
        for _ in 0..count + PING_WARMUP {
            read_full(&mut s, &mut msg, spin).map_err(|e| format!("baseline pong: {e}"))?;
            write_full(&mut s, &msg).map_err(|e| format!("baseline pong: {e}"))?;
        }
        Ok(())
    }

    fn ping(mut s: TcpStream, count: u64, spin: bool) -> Result<(), String> {
        s.set_nonblocking(spin).map_err(|e| format!("baseline ping: {e}"))?;
        let mut msg = [7u8; PING_BYTES];
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        for i in 0..count + PING_WARMUP {
            let t = monotonic_ns();
            write_full(&mut s, &msg).map_err(|e| format!("baseline ping: {e}"))?;
            read_full(&mut s, &mut msg, spin).map_err(|e| format!("baseline ping: {e}"))?;
            if i >= PING_WARMUP {
                h.record((monotonic_ns() - t).max(1)).map_err(|e| e.to_string())?;
            }
        }
        let p = Percentiles::from_histogram(&h);
        println!("{}", serde_json::to_string(&p).map_err(|e| e.to_string())?);
        Ok(())
    }
}
