//! Agents and threading modes (after Aeron): protocol state machines are
//! driven by `do_work(now_ns) -> work` and never own a thread or a clock.
//! The runtime owns both:
//!
//! - **dedicated**: one progress thread per agent;
//! - **shared**: one thread runs several agents in turn;
//! - **invoker**: no thread: the caller calls `do_work` (tests, the
//!   simulator, single-threaded applications, benchmarks on few cores).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use spindle_fabric::doorbell::Doorbell;

use crate::idle::{IdleStrategy, Idler};

/// Monotonic nanoseconds (CLOCK_MONOTONIC: one clock for every process of
/// a host, so timestamps compare across members on shm).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Coarse monotonic nanoseconds (CLOCK_MONOTONIC_COARSE: a few ns to read,
/// ticks of a few ms): for timeouts and intervals, never for latency.
#[inline]
pub fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A driven unit of protocol work.
pub trait Agent: Send {
    type Error: std::fmt::Display + Send + 'static;
    /// One bounded pass. Returns how much work it did (0: nothing to do).
    fn do_work(&mut self, now_ns: u64) -> Result<u32, Self::Error>;
    /// Whether a pass would find work (cheap; used before parking).
    fn has_work(&self) -> bool;
    /// The doorbell this agent's peers ring.
    fn doorbell(&self) -> &dyn Doorbell;
    /// Called once with the parks/yields counts as they change.
    fn record_idle(&mut self, _parks: u64, _yields: u64) {}
    fn name(&self) -> String;
}

/// Which threading mode runs the agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadingMode {
    Dedicated,
    Shared,
    Invoker,
}

impl ThreadingMode {
    pub fn parse(s: &str) -> Result<ThreadingMode, String> {
        match s {
            "dedicated" => Ok(ThreadingMode::Dedicated),
            "shared" => Ok(ThreadingMode::Shared),
            "invoker" => Ok(ThreadingMode::Invoker),
            other => Err(format!(
                "unknown threading mode '{other}': expected dedicated, shared or invoker"
            )),
        }
    }
}

/// Runs agents on threads until stopped or until an agent fails.
pub struct AgentRunner<A: Agent> {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<Vec<A>, A::Error>>>,
}

impl<A: Agent + 'static> AgentRunner<A> {
    /// Run `agents` in `mode` (Dedicated: a thread each; Shared: one
    /// thread for all). Invoker mode has no runner: drive the agent
    /// yourself.
    pub fn start(mode: ThreadingMode, agents: Vec<A>, idle: IdleStrategy) -> AgentRunner<A> {
        assert!(
            mode != ThreadingMode::Invoker,
            "invoker mode runs no threads: call do_work yourself"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let groups: Vec<Vec<A>> = match mode {
            ThreadingMode::Dedicated => agents.into_iter().map(|a| vec![a]).collect(),
            _ => vec![agents],
        };
        for (i, group) in groups.into_iter().enumerate() {
            let stop = stop.clone();
            let handle = std::thread::Builder::new()
                .name(format!("spindle-progress-{i}"))
                .spawn(move || run_agents(group, idle, &stop))
                .expect("spawn progress thread");
            threads.push(handle);
        }
        AgentRunner { stop, threads }
    }

    /// Whether any progress thread has ended (stopped or failed).
    pub fn any_finished(&self) -> bool {
        self.threads.iter().any(|t| t.is_finished())
    }

    /// Stop every thread; return the agents, or the first error any hit.
    pub fn stop(self) -> Result<Vec<A>, A::Error> {
        // Partner: the Acquire load in `run_agents`.
        self.stop.store(true, Ordering::Release);
        let mut agents = Vec::new();
        let mut first_error = None;
        for t in self.threads {
            match t.join().expect("progress thread panicked") {
                Ok(a) => agents.extend(a),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(agents),
        }
    }
}

fn run_agents<A: Agent>(mut agents: Vec<A>, idle: IdleStrategy, stop: &AtomicBool) -> Result<Vec<A>, A::Error> {
    let mut idlers: Vec<Idler> = agents.iter().map(|_| Idler::new(idle)).collect();
    // Partner: the Release store in AgentRunner::stop.
    while !stop.load(Ordering::Acquire) {
        let now_ns = monotonic_coarse_ns();
        let mut total = 0;
        for a in agents.iter_mut() {
            total += a.do_work(now_ns)?;
        }
        // One idler per thread decides; with several agents, park on the
        // first one's doorbell (shm groups share the host's doorbell pages,
        // and parks are bounded by the timeout anyway).
        let (first, rest) = agents.split_at_mut(1);
        let idler = &mut idlers[0];
        idler.idle(total, first[0].doorbell(), || {
            first[0].has_work() || rest.iter().any(|a| a.has_work())
        });
        first[0].record_idle(idler.parks, idler.yields);
    }
    Ok(agents)
}
