//! The one process-cluster harness: the member processes of a run
//! (`spindle bench`, `demo`, `rt`, `bench failover`) and of the process
//! tests (membership, the KV service) are started, watched, faulted and
//! stopped through a [`Cluster`].
//!
//! A cluster has numbered slots (a member's rank, usually), each running
//! at most one child process of one executable (this one by default: the
//! harnesses re-exec the `spindle` binary with its hidden member
//! subcommands). Standard output and error are inherited, discarded or
//! captured; captured streams are read by a thread per stream, so a
//! chatty child never blocks on a full pipe, and their lines can be
//! waited for ([`Cluster::wait_line`]) or read after an exit. Faults are
//! injected with [`Cluster::kill`] (SIGKILL, reaped) and
//! [`Cluster::signal`] (SIGSTOP, SIGCONT, …). Nothing is left behind:
//! dropping the cluster stops every child still running (the stop signal
//! first, when one is set, then SIGKILL) and removes the files that killed
//! members could not remove (the group's shm and tcp stat files).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spindle_runtime::monotonic_ns;

/// What the harness does with a child's standard output or error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The child writes to this process's stream.
    Inherit,
    /// Discarded.
    Null,
    /// Read by the harness: see [`Cluster::wait_line`], [`Cluster::output`].
    Capture,
}

/// A harness failure; the text names the member (the slot) and what
/// happened.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The running executable could not be found.
    #[error("find own executable: {0}")]
    Exe(std::io::Error),
    /// A child could not be started.
    #[error("spawn member {slot}: {source}")]
    Spawn { slot: usize, source: std::io::Error },
    /// The slot has no running child.
    #[error("member {0} is not running")]
    NotRunning(usize),
    /// The slot's child is already running.
    #[error("member {0} is already running")]
    Running(usize),
    /// A signal could not be sent, or a child not waited for.
    #[error("{what} member {slot}: {source}")]
    Os {
        what: &'static str,
        slot: usize,
        source: std::io::Error,
    },
    /// A child exited while it was expected to run (or failed a run).
    #[error("member {slot} failed: exited ({status}){}", if .output.is_empty() { String::new() } else { format!(": {}", .output.trim()) })]
    Exited {
        slot: usize,
        status: ExitStatus,
        output: String,
    },
    /// Something did not happen in time.
    #[error("{what} within {} ms{}", .timeout.as_millis(), if .output.is_empty() { String::new() } else { format!(": {}", .output.trim()) })]
    Timeout {
        what: String,
        timeout: Duration,
        output: String,
    },
    /// A captured stream ended before the awaited line.
    #[error("member {slot}'s output ended without a line containing '{needle}'")]
    NoLine { slot: usize, needle: String },
}

/// How many of the last captured lines a line-wait timeout shows.
const TIMEOUT_LINES_SHOWN: usize = 40;

/// The last `count` of `lines`, one per line, headed so a reader sees
/// what the member printed instead of the awaited line.
fn last_lines(lines: &[String], count: usize) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let from = lines.len().saturating_sub(count);
    let mut out = format!("its last {} lines:", lines.len() - from);
    for line in &lines[from..] {
        out.push_str("\n  ");
        out.push_str(line);
    }
    out
}

impl From<ClusterError> for String {
    fn from(e: ClusterError) -> String {
        e.to_string()
    }
}

/// How a child ended, with what it wrote to its captured streams.
#[derive(Debug)]
pub struct Exit {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its captured standard output and error (empty when not captured).
    pub output: String,
}

/// One running child and the threads reading its captured streams.
struct Process {
    child: Child,
    /// Captured text (both streams, each in order).
    output: Arc<Mutex<String>>,
    /// Captured lines as they arrive.
    lines: Receiver<String>,
    /// Every line received so far, and how far `wait_line` has consumed.
    received: Vec<String>,
    cursor: usize,
    readers: Vec<JoinHandle<()>>,
}

impl Process {
    /// Move the lines that arrived into `received`.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.received.push(line);
        }
    }

    /// The captured output, once the readers are done (bounded: a
    /// grandchild that inherited the pipe may keep it open).
    fn finish_output(&mut self) -> String {
        let deadline = Instant::now() + READER_DRAIN_MAX;
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }
}

/// How long an exited child's captured output may still be arriving.
const READER_DRAIN_MAX: Duration = Duration::from_secs(1);
/// How often the waits look again.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// Child processes in numbered slots, never left behind.
pub struct Cluster {
    exe: PathBuf,
    slots: Vec<Option<Process>>,
    stdout: Output,
    stderr: Output,
    /// On drop: send this signal first and give the children this long.
    stop: Option<(i32, Duration)>,
    /// Files removed on drop (what killed members could not remove).
    cleanup: Vec<PathBuf>,
    /// Captured lines that report a Rust panic, from any child (or a
    /// grandchild writing to its stream), at most [`PANIC_LINES_KEPT`].
    panic_lines: Arc<Mutex<Vec<String>>>,
    /// Drop fails (panics) if any child reported a panic.
    fail_on_panics: bool,
}

/// The marker of Rust's panic message (`thread '…' panicked at file:line:`).
const PANIC_MARKER: &str = "panicked at";
/// Panic lines kept for the report (the first ones say the most).
const PANIC_LINES_KEPT: usize = 16;
/// Lines of a panic's message kept after its marker line.
const PANIC_MESSAGE_LINES_MAX: usize = 6;

impl Cluster {
    /// `slots` slots for children of this executable; streams inherited.
    pub fn new(slots: usize) -> Result<Cluster, ClusterError> {
        let exe = std::env::current_exe().map_err(ClusterError::Exe)?;
        Ok(Cluster::with_exe(exe, slots))
    }

    /// `slots` slots for children of `exe`; streams inherited.
    pub fn with_exe(exe: impl Into<PathBuf>, slots: usize) -> Cluster {
        Cluster {
            exe: exe.into(),
            slots: (0..slots).map(|_| None).collect(),
            stdout: Output::Inherit,
            stderr: Output::Inherit,
            stop: None,
            cleanup: Vec::new(),
            panic_lines: Arc::new(Mutex::new(Vec::new())),
            fail_on_panics: false,
        }
    }

    /// Fail on drop (a panic naming the lines) if a child, or a process
    /// it started that writes to the same captured stream, reported a
    /// Rust panic ("… panicked at …", kept with the message lines after
    /// it); when the thread is already panicking, the lines are printed
    /// instead. For tests whose members' panics would otherwise pass
    /// unseen (a member that panics and is replaced by a failover).
    /// Only captured streams are watched ([`Output::Capture`]).
    pub fn fail_on_panics(mut self) -> Cluster {
        self.fail_on_panics = true;
        self
    }

    /// The captured lines that reported a panic so far (slot first).
    pub fn panics(&self) -> Vec<String> {
        self.panic_lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// What children started from now on do with their standard output
    /// and error.
    pub fn streams(mut self, stdout: Output, stderr: Output) -> Cluster {
        self.stdout = stdout;
        self.stderr = stderr;
        self
    }

    /// On drop, send `signal` to the children still running and give them
    /// `grace` to exit before they are killed (a clean stop).
    pub fn stop_with(mut self, signal: i32, grace: Duration) -> Cluster {
        self.stop = Some((signal, grace));
        self
    }

    /// Remove the files of group `group` with `ranks` members on drop:
    /// its shm file and its tcp members' stat files (a killed member
    /// never removes its own).
    pub fn owns_group(mut self, group: &str, ranks: usize) -> Cluster {
        self.cleanup
            .push(spindle_fabric::shm::group_file_path(Path::new("/dev/shm"), group));
        for rank in 0..ranks {
            self.cleanup.push(PathBuf::from(format!(
                "/dev/shm/{}{group}@{rank}",
                spindle_fabric::tcp::stat::STAT_FILE_PREFIX
            )));
        }
        self
    }

    /// How many slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the cluster has no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Start a child in `slot` with `args`; its pid.
    pub fn start<I, S>(&mut self, slot: usize, args: I) -> Result<u32, ClusterError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        if self.slots[slot].is_some() {
            return Err(ClusterError::Running(slot));
        }
        let stdio = |o: Output| match o {
            Output::Inherit => Stdio::inherit(),
            Output::Null => Stdio::null(),
            Output::Capture => Stdio::piped(),
        };
        let mut child = Command::new(&self.exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdio(self.stdout))
            .stderr(stdio(self.stderr))
            .spawn()
            .map_err(|source| ClusterError::Spawn { slot, source })?;
        let output = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = mpsc::channel();
        let mut readers = Vec::new();
        let streams: [Option<Box<dyn Read + Send>>; 2] = [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        ];
        for stream in streams.into_iter().flatten() {
            let (tx, output, panics) = (tx.clone(), output.clone(), self.panic_lines.clone());
            readers.push(std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut raw = Vec::new();
                // Lines still to add to the last panic report (its message).
                let mut message_lines_left = 0usize;
                loop {
                    raw.clear();
                    // Bytes, not `lines()`: an invalid UTF-8 byte must not
                    // end the reading (the child would then die of EPIPE).
                    match reader.read_until(b'\n', &mut raw) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let text = String::from_utf8_lossy(&raw);
                    let line = text.trim_end_matches(['\n', '\r']).to_string();
                    if let Ok(mut o) = output.lock() {
                        o.push_str(&line);
                        o.push('\n');
                    }
                    let marker = line.contains(PANIC_MARKER);
                    // The lock only for a panic's lines, not every line.
                    if let Some(mut p) = (marker || message_lines_left > 0).then(|| panics.lock().ok()).flatten() {
                        if marker && p.len() < PANIC_LINES_KEPT {
                            p.push(format!("slot {slot}: {line}"));
                            message_lines_left = PANIC_MESSAGE_LINES_MAX;
                        } else if message_lines_left > 0 {
                            // The message follows the marker line; the
                            // backtrace note ends it.
                            if line.starts_with("note: ") || line.starts_with("stack backtrace") {
                                message_lines_left = 0;
                            } else if let Some(last) = p.last_mut() {
                                last.push_str("\n    ");
                                last.push_str(&line);
                                message_lines_left -= 1;
                            }
                        }
                    }
                    // The receiver may be gone (the process was reaped).
                    let _ = tx.send(line);
                }
            }));
        }
        let pid = child.id();
        self.slots[slot] = Some(Process {
            child,
            output,
            lines,
            received: Vec::new(),
            cursor: 0,
            readers,
        });
        Ok(pid)
    }

    /// Start slots `0..count`, slot `r` with `args(r)`.
    pub fn start_each(&mut self, count: usize, args: impl Fn(usize) -> Vec<String>) -> Result<(), ClusterError> {
        for slot in 0..count {
            self.start(slot, args(slot))?;
        }
        Ok(())
    }

    /// The pid of the child in `slot`, if one runs (or ran, unreaped).
    pub fn pid(&self, slot: usize) -> Option<u32> {
        self.slots[slot].as_ref().map(|p| p.child.id())
    }

    /// Whether the child in `slot` is running (reaps it if it exited;
    /// its exit is then reported by [`Cluster::wait_exit`]).
    pub fn is_running(&mut self, slot: usize) -> bool {
        self.slots[slot]
            .as_mut()
            .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)))
    }

    /// SIGKILL the child in `slot` and reap it; the time of the kill
    /// (CLOCK_MONOTONIC ns).
    pub fn kill(&mut self, slot: usize) -> Result<u64, ClusterError> {
        let mut process = self.slots[slot].take().ok_or(ClusterError::NotRunning(slot))?;
        let t = monotonic_ns();
        process.child.kill().map_err(|source| ClusterError::Os {
            what: "kill",
            slot,
            source,
        })?;
        process.child.wait().map_err(|source| ClusterError::Os {
            what: "reap",
            slot,
            source,
        })?;
        Ok(t)
    }

    /// Send `signal` (SIGSTOP, SIGCONT, SIGTERM, …) to the child in
    /// `slot`; the time it was sent (CLOCK_MONOTONIC ns).
    pub fn signal(&mut self, slot: usize, signal: i32) -> Result<u64, ClusterError> {
        let process = self.slots[slot].as_mut().ok_or(ClusterError::NotRunning(slot))?;
        // An exited child may be reaped already by `try_wait`, and its pid
        // reused: signal only one still running.
        if !matches!(process.child.try_wait(), Ok(None)) {
            return Err(ClusterError::NotRunning(slot));
        }
        let t = monotonic_ns();
        signal_pid(process.child.id(), signal).map_err(|source| ClusterError::Os {
            what: "signal",
            slot,
            source,
        })?;
        Ok(t)
    }

    /// The next captured line of `slot` containing `needle` (lines before
    /// it are passed over), waiting up to `timeout` for it.
    pub fn wait_line(&mut self, slot: usize, needle: &str, timeout: Duration) -> Result<String, ClusterError> {
        let process = self.slots[slot].as_mut().ok_or(ClusterError::NotRunning(slot))?;
        let deadline = Instant::now() + timeout;
        loop {
            process.drain();
            if let Some(i) = process.received[process.cursor..]
                .iter()
                .position(|l| l.contains(needle))
            {
                let at = process.cursor + i;
                process.cursor = at + 1;
                return Ok(process.received[at].clone());
            }
            process.cursor = process.received.len();
            let left = deadline.saturating_duration_since(Instant::now());
            match process.lines.recv_timeout(left) {
                Ok(line) => process.received.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(ClusterError::Timeout {
                        what: format!("no line with '{needle}' from member {slot}"),
                        timeout,
                        output: last_lines(&process.received, TIMEOUT_LINES_SHOWN),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(ClusterError::NoLine {
                        slot,
                        needle: needle.to_string(),
                    })
                }
            }
        }
    }

    /// A line of `slot` containing `needle` captured at any time so far
    /// (also one [`Cluster::wait_line`] passed over or returned), else the
    /// next one, waiting up to `timeout`.
    pub fn find_line(&mut self, slot: usize, needle: &str, timeout: Duration) -> Result<String, ClusterError> {
        let process = self.slots[slot].as_mut().ok_or(ClusterError::NotRunning(slot))?;
        process.drain();
        if let Some(line) = process.received.iter().find(|l| l.contains(needle)) {
            return Ok(line.clone());
        }
        self.wait_line(slot, needle, timeout)
    }

    /// What the child in `slot` wrote to its captured streams so far.
    pub fn output(&self, slot: usize) -> String {
        self.slots[slot]
            .as_ref()
            .and_then(|p| p.output.lock().ok().map(|o| o.clone()))
            .unwrap_or_default()
    }

    /// An error if a child in `slots` has exited (it is reaped; the error
    /// carries its captured output).
    pub fn check_alive(&mut self, slots: &[usize]) -> Result<(), ClusterError> {
        for &slot in slots {
            let Some(process) = self.slots[slot].as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = process.child.try_wait() {
                let output = process.finish_output();
                self.slots[slot] = None;
                return Err(ClusterError::Exited { slot, status, output });
            }
        }
        Ok(())
    }

    /// Wait up to `timeout` for the child in `slot` to exit, and reap it.
    /// One that does not is killed, and the error carries its output.
    pub fn wait_exit(&mut self, slot: usize, timeout: Duration) -> Result<Exit, ClusterError> {
        let mut process = self.slots[slot].take().ok_or(ClusterError::NotRunning(slot))?;
        let started = Instant::now();
        loop {
            let waited = process.child.try_wait().map_err(|source| ClusterError::Os {
                what: "wait for",
                slot,
                source,
            })?;
            if let Some(status) = waited {
                return Ok(Exit {
                    status,
                    output: process.finish_output(),
                });
            }
            if started.elapsed() > timeout {
                let _ = process.child.kill();
                let _ = process.child.wait();
                return Err(ClusterError::Timeout {
                    what: format!("member {slot} did not exit"),
                    timeout,
                    output: process.finish_output(),
                });
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    /// Wait until every child has exited. A child that fails fails the
    /// run: the others get `grace` to stop by themselves (they see it
    /// gone), then are killed. `tick` runs every `tick_every` while
    /// waiting (a progress display, say).
    pub fn wait_all(
        &mut self,
        timeout: Duration,
        grace: Duration,
        tick_every: Duration,
        tick: &mut dyn FnMut(),
    ) -> Result<(), ClusterError> {
        let started = Instant::now();
        loop {
            if let Some(failure) = self.reap() {
                let stopping = Instant::now();
                while self.slots.iter().any(Option::is_some) && stopping.elapsed() < grace {
                    self.reap();
                    std::thread::sleep(Duration::from_millis(50));
                }
                self.kill_all();
                return Err(failure);
            }
            if self.slots.iter().all(Option::is_none) {
                return Ok(());
            }
            if started.elapsed() > timeout {
                self.kill_all();
                return Err(ClusterError::Timeout {
                    what: "the run did not finish".into(),
                    timeout,
                    output: String::new(),
                });
            }
            tick();
            std::thread::sleep(tick_every);
        }
    }

    /// Reap the children that exited; the first failure, if any.
    fn reap(&mut self) -> Option<ClusterError> {
        let mut failure = None;
        for (slot, entry) in self.slots.iter_mut().enumerate() {
            let Some(process) = entry else { continue };
            match process.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() && failure.is_none() {
                        failure = Some(ClusterError::Exited {
                            slot,
                            status,
                            output: process.finish_output(),
                        });
                    }
                    *entry = None;
                }
                Ok(None) => {}
                Err(source) => {
                    failure = failure.or(Some(ClusterError::Os {
                        what: "wait for",
                        slot,
                        source,
                    }))
                }
            }
        }
        failure
    }

    /// SIGKILL and reap every child still there.
    pub fn kill_all(&mut self) {
        for mut process in self.slots.iter_mut().filter_map(Option::take) {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The readers of every child still here: a panic printed while it
        // stops must be read before the check below.
        let readers: Vec<JoinHandle<()>> = self
            .slots
            .iter_mut()
            .flatten()
            .flat_map(|p| std::mem::take(&mut p.readers))
            .collect();
        if let Some((signal, grace)) = self.stop {
            let running: Vec<usize> = (0..self.slots.len()).filter(|s| self.is_running(*s)).collect();
            for &slot in &running {
                let _ = self.signal(slot, signal);
            }
            let started = Instant::now();
            while running.iter().any(|s| self.is_running(*s)) && started.elapsed() < grace {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill_all();
        for path in &self.cleanup {
            let _ = std::fs::remove_file(path);
        }
        if !self.fail_on_panics {
            return;
        }
        // Bounded: a grandchild that outlived its parent may hold a pipe.
        let deadline = Instant::now() + READER_DRAIN_MAX;
        while readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(POLL_EVERY);
        }
        let panics = self.panics();
        if panics.is_empty() {
            return;
        }
        let report = format!(
            "a child process panicked (the test may have passed through a failover):\n{}",
            panics.join("\n")
        );
        if std::thread::panicking() {
            // The test failed already: say it, do not abort.
            eprintln!("{report}");
        } else {
            panic!("{report}");
        }
    }
}

/// Send `signal` to process `pid` (a member's grandchild, say: the caller
/// knows the pid is still the one it means).
pub fn signal_pid(pid: u32, signal: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) has no memory effects; which process the pid names is
    // the caller's responsibility (documented above).
    if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Read the JSON result file that each of `count` members left at
/// `path(rank)`; an error names the member whose file is missing or bad.
pub fn read_results<T: serde::de::DeserializeOwned>(
    count: usize,
    path: impl Fn(usize) -> PathBuf,
) -> Result<Vec<T>, String> {
    (0..count)
        .map(|rank| {
            let path = path(rank);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("member {rank} left no result ({}): {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("member {rank} result: {e}"))
        })
        .collect()
}

/// The first of `n` consecutive free loopback ports, below the kernel's
/// ephemeral range.
///
/// Not `bind(0)`: a port it returns lies in the ephemeral range, where
/// every outgoing connection of the machine (the members dialling each
/// other, tests beside them) takes its source port, so it can be taken
/// between the check and the member's own bind; a member that cannot
/// bind fails its group. Ports below the range are never handed out by
/// the kernel. Calls in one process never return the same ports.
pub fn free_ports(n: u16) -> Result<u16, String> {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    assert!(n > 0, "free_ports needs at least one port");
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|w| w.parse::<u16>().ok()))
        .unwrap_or(32768);
    // Ports from 10000 up to the ephemeral range (rounded to runs of n).
    let floor = 10_000u16.min(low.saturating_sub(n * 2));
    let runs = (low - floor) / n;
    if runs == 0 {
        return Err(format!("no room for {n} ports below the ephemeral range ({low}..)"));
    }
    let start = (std::process::id() % runs as u32) as u16;
    for _ in 0..runs.min(2000) {
        let run = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % runs;
        let base = floor + run * n;
        let bound: Vec<_> = (0..n).map(|i| TcpListener::bind(("127.0.0.1", base + i))).collect();
        if bound.iter().all(|r| r.is_ok()) {
            return Ok(base);
        }
    }
    Err(format!("found no {n} consecutive free loopback ports below {low}"))
}

/// One free loopback port below the ephemeral range (see [`free_ports`]).
pub fn free_port() -> Result<u16, String> {
    free_ports(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster of `sh` processes (any executable works).
    fn sh(slots: usize) -> Cluster {
        Cluster::with_exe("/bin/sh", slots).streams(Output::Capture, Output::Capture)
    }

    #[test]
    fn lines_are_awaited_in_order_and_found_again() {
        let mut c = sh(1);
        c.start(0, ["-c", "echo one; echo two >&2; echo three"]).unwrap();
        let three = c.wait_line(0, "three", Duration::from_secs(30)).unwrap();
        assert_eq!(three, "three");
        // Passed over by the first wait, still found by `find_line`.
        assert_eq!(c.find_line(0, "one", Duration::from_secs(30)).unwrap(), "one");
        let exit = c.wait_exit(0, Duration::from_secs(30)).unwrap();
        assert!(exit.status.success());
        for word in ["one", "two", "three"] {
            assert!(exit.output.contains(word), "{}", exit.output);
        }
    }

    /// A child's panic line (here, one a grandchild writes to the shared
    /// stream after the child has exited) is seen; with
    /// `fail_on_panics` the drop fails naming it, without it the drop
    /// passes.
    #[test]
    fn a_child_that_panicked_fails_the_drop_only_when_asked() {
        let panic_line = "thread 'main' (7) panicked at src/master.rs:1:1:";
        let script = format!(
            "(sleep 0.05; echo \"{panic_line}\" >&2; echo 'appends are contiguous' >&2; \
             echo 'note: run with RUST_BACKTRACE=1' >&2; printf 'bad \\377 byte\\n' >&2; \
             echo after >&2) & echo started"
        );
        let mut quiet = sh(1);
        quiet.start(0, ["-c", &script]).unwrap();
        // An invalid UTF-8 byte does not end the reading; once "after" is
        // read, so are the lines before it on the same stream.
        quiet.wait_line(0, "after", Duration::from_secs(30)).unwrap();
        assert_eq!(
            quiet.panics(),
            vec![format!("slot 0: {panic_line}\n    appends are contiguous")],
            "the marker line and its message, not the note"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        drop(quiet);
        let mut strict = sh(1).fail_on_panics();
        strict.start(0, ["-c", &script]).unwrap();
        while strict.panics().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(strict)));
        let message = dropped.expect_err("the drop fails");
        let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            text.contains("a child process panicked") && text.contains(panic_line),
            "{text}"
        );
        // Nothing reported, nothing failed.
        let mut clean = sh(1).fail_on_panics();
        clean.start(0, ["-c", "echo fine"]).unwrap();
        clean.wait_line(0, "fine", Duration::from_secs(30)).unwrap();
        drop(clean);
    }

    #[test]
    fn a_failed_member_fails_the_run_with_its_output() {
        let mut c = sh(2);
        c.start(0, ["-c", "echo broken >&2; exit 3"]).unwrap();
        c.start(1, ["-c", "sleep 30"]).unwrap();
        let err = c
            .wait_all(
                Duration::from_secs(60),
                Duration::from_millis(100),
                Duration::from_millis(10),
                &mut || {},
            )
            .unwrap_err();
        assert!(matches!(err, ClusterError::Exited { slot: 0, .. }), "{err}");
        assert!(err.to_string().contains("broken"), "{err}");
        // The sleeper was killed after the grace period.
        assert!(c.pid(1).is_none());
    }

    #[test]
    fn kill_stop_and_drop_leave_nothing_running() {
        let mut c = sh(2);
        let a = c.start(0, ["-c", "sleep 30"]).unwrap();
        let b = c.start(1, ["-c", "sleep 30"]).unwrap();
        c.signal(1, libc::SIGSTOP).unwrap();
        assert!(c.is_running(1), "a stopped member is still there");
        c.kill(0).unwrap();
        assert!(matches!(c.kill(0), Err(ClusterError::NotRunning(0))));
        assert!(c.check_alive(&[0, 1]).is_ok());
        drop(c);
        for pid in [a, b] {
            // SAFETY: waitpid with WNOHANG and a null status pointer has no
            // memory effects; it only asks whether `pid` is an unreaped
            // child of this process.
            let rc = unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
            assert_eq!(rc, -1, "member {pid} was left unreaped");
        }
    }

    #[test]
    fn an_exited_member_is_reported_by_check_alive() {
        let mut c = sh(1);
        c.start(0, ["-c", "echo bye; exit 1"]).unwrap();
        // A hang guard, not a speed target: a bounded number of polls.
        let err = (0..30_000)
            .find_map(|_| {
                let alive = c.check_alive(&[0]);
                if alive.is_ok() {
                    std::thread::sleep(POLL_EVERY);
                }
                alive.err()
            })
            .expect("the member never exited");
        assert!(err.to_string().contains("bye"), "{err}");
    }

    #[test]
    fn a_missing_line_times_out_naming_it() {
        let mut c = sh(1);
        c.start(0, ["-c", "sleep 30"]).unwrap();
        let err = c.wait_line(0, "never", Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("'never'"), "{err}");
    }
}
