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

use crate::clock::monotonic_coarse_ns;
use crate::idle::{IdleStrategy, Idler};

/// A driven unit of protocol work.
///
/// Driving contract: the runner calls [`Agent::do_work`] in a loop with
/// the current coarse monotonic time; each call is one bounded pass that
/// never blocks, sleeps or spawns. When a pass did nothing, the runner's
/// [`Idler`] decides whether to spin, yield or park on
/// [`Agent::doorbell`], re-checking [`Agent::has_work`] before it parks.
pub trait Agent: Send {
    /// The error that ends the agent's progress thread.
    type Error: std::fmt::Display + Send + 'static;
    /// One bounded pass. Returns how much work it did (0: nothing to do).
    fn do_work(&mut self, now_ns: u64) -> Result<u32, Self::Error>;
    /// Whether a pass would find work (cheap; used before parking).
    fn has_work(&self) -> bool;
    /// The doorbell this agent's peers ring.
    fn doorbell(&self) -> &dyn Doorbell;
    /// Called after every pass with the loop's parks and yields so far.
    fn record_idle(&mut self, _parks: u64, _yields: u64) {}
    /// The most idle passes the loop should spin before it yields (see
    /// [`crate::Idler::cap_spins`]): fewer where a pass makes system
    /// calls. A thread running several agents takes the smallest.
    fn spins_max(&self) -> u32 {
        u32::MAX
    }
    /// A name for logs and thread dumps.
    fn name(&self) -> String;
}

/// Which threading mode runs the agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadingMode {
    /// One progress thread per agent: lowest latency, a core per agent.
    Dedicated,
    /// One progress thread runs every agent in turn.
    Shared,
    /// No thread: the caller drives the agent by calling `do_work` itself.
    Invoker,
}

impl ThreadingMode {
    /// Parse `dedicated`, `shared` or `invoker`.
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
        // Release: pairs with the Acquire load in `run_agents`.
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
    if agents.is_empty() {
        return Ok(agents);
    }
    let mut idler = Idler::new(idle);
    idler.cap_spins(agents.iter().map(|a| a.spins_max()).min().unwrap_or(u32::MAX));
    // Acquire: pairs with the Release store in `AgentRunner::stop`.
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
        idler.idle(total, first[0].doorbell(), || {
            first[0].has_work() || rest.iter().any(|a| a.has_work())
        });
        first[0].record_idle(idler.parks, idler.yields);
    }
    Ok(agents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_fabric::doorbell::FutexDoorbell;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    /// Does one unit of work per pass until `fail_at` passes, then fails.
    struct Counter {
        passes: Arc<AtomicU64>,
        fail_at: u64,
        bell: FutexDoorbell,
    }

    impl Agent for Counter {
        type Error = String;
        fn do_work(&mut self, _now_ns: u64) -> Result<u32, String> {
            // Relaxed: a statistic read by the test after the agents ran.
            let done = self.passes.fetch_add(1, Ordering::Relaxed) + 1;
            if done >= self.fail_at {
                return Err(format!("failed after {done} passes"));
            }
            Ok(1)
        }
        fn has_work(&self) -> bool {
            true
        }
        fn doorbell(&self) -> &dyn Doorbell {
            &self.bell
        }
        fn name(&self) -> String {
            "counter".into()
        }
    }

    fn counters(n: usize, fail_at: u64) -> (Vec<Counter>, Vec<Arc<AtomicU64>>) {
        let passes: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::new(AtomicU64::new(0))).collect();
        let agents = passes
            .iter()
            .map(|p| Counter {
                passes: p.clone(),
                fail_at,
                bell: FutexDoorbell::new_local(),
            })
            .collect();
        (agents, passes)
    }

    /// Wait (bounded) until every agent has run `min` passes.
    fn wait_for_passes(passes: &[Arc<AtomicU64>], min: u64) {
        for _ in 0..100_000 {
            // Relaxed: a progress check; the join in `stop` orders the rest.
            if passes.iter().all(|p| p.load(Ordering::Relaxed) >= min) {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        panic!("agents did not run {min} passes");
    }

    #[test]
    fn dedicated_and_shared_run_every_agent_and_return_them() {
        for mode in [ThreadingMode::Dedicated, ThreadingMode::Shared] {
            let (agents, passes) = counters(3, u64::MAX);
            let runner = AgentRunner::start(mode, agents, IdleStrategy::BusySpin);
            wait_for_passes(&passes, 10);
            assert!(!runner.any_finished(), "{mode:?}: no thread ends before stop");
            let agents = runner.stop().expect("no agent fails");
            assert_eq!(agents.len(), 3, "{mode:?}: every agent comes back");
        }
    }

    #[test]
    fn a_failing_agent_ends_its_thread_and_stop_returns_the_error() {
        let (agents, passes) = counters(2, 5);
        let runner = AgentRunner::start(ThreadingMode::Dedicated, agents, IdleStrategy::DEFAULT_BACKOFF);
        wait_for_passes(&passes, 5);
        let err = runner.stop().err().expect("the agents fail");
        assert_eq!(err, "failed after 5 passes");
    }

    #[test]
    #[should_panic(expected = "invoker mode runs no threads")]
    fn invoker_mode_refuses_to_start_threads() {
        let (agents, _) = counters(1, u64::MAX);
        let _ = AgentRunner::start(ThreadingMode::Invoker, agents, IdleStrategy::BusySpin);
    }

    #[test]
    fn threading_modes_parse() {
        assert_eq!(ThreadingMode::parse("dedicated"), Ok(ThreadingMode::Dedicated));
        assert_eq!(ThreadingMode::parse("shared"), Ok(ThreadingMode::Shared));
        assert_eq!(ThreadingMode::parse("invoker"), Ok(ThreadingMode::Invoker));
        assert!(ThreadingMode::parse("pooled").unwrap_err().contains("pooled"));
    }
}
