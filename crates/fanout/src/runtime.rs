//! The runtime of a live domain: the ports that serve slots, their
//! waiting (spin, yield, then sleep on the slot's futex word) and the
//! time bounds. The protocol steps are [`State`]'s; this part only waits
//! for them.
//!
//! A domain of threads ([`Domain::new`]) keeps its [`State`] on the heap;
//! a domain of processes ([`Domain::create_shm`], [`Domain::open_shm`])
//! maps it from `/dev/shm/spindle-fanout@NAME`. A [`Port`] is one
//! attachment to one slot (one port per slot, machine-wide: the slot
//! records its process). Every wake goes to the slot's futex word, so a
//! port may move between threads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::plan::Layout;
use crate::state::{Claim, Flight, State};

use crate::sync::{spin_pass, yield_pass, AtomicBool, Ordering};
use crate::topology::Tree;
use crate::FanoutError;

/// How a waiting port spends its time.
#[derive(Clone, Copy, Debug)]
pub struct WaitConfig {
    /// Passes that spin before the port yields.
    pub spins: u32,
    /// Passes that yield the CPU (after spinning) before the port sleeps.
    pub yields: u32,
    /// The longest single sleep (a bound: a missed wake costs at most this).
    pub park_max: Duration,
}

impl Default for WaitConfig {
    fn default() -> WaitConfig {
        WaitConfig {
            spins: 20_000,
            yields: 64,
            park_max: Duration::from_millis(10),
        }
    }
}

/// A wait's time bound, read from the clock only once the wait lasts:
/// the first check starts it, so a multicast that completes within its
/// first spin passes never reads the clock (two `Instant::now` calls
/// were a fixed cost of every multicast). A wait lasts at most its
/// timeout plus the passes before the first check (at most
/// [`CLOCK_CHECK_PASSES`] spin passes).
struct Deadline {
    timeout: Duration,
    at: Option<Instant>,
}

/// Spin passes between two looks at the clock.
const CLOCK_CHECK_PASSES: u32 = 1024;

impl Deadline {
    fn after(timeout: Duration) -> Deadline {
        Deadline { timeout, at: None }
    }

    /// The bound, starting it at `now` if this is the first check.
    fn at(&mut self, now: Instant) -> Instant {
        *self.at.get_or_insert(now + self.timeout)
    }

    /// Whether the bound passed (the first call starts it: false).
    fn passed(&mut self) -> bool {
        let now = Instant::now();
        now >= self.at(now)
    }
}

/// A message a port delivered to its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub slot: usize,
    pub seq: u64,
    pub payload: u64,
}

/// What a completed multicast reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub seq: u64,
    /// The snapshot of members (less the origin) that acknowledged.
    pub targets: u64,
}

/// A fanout domain: a static tree of slots, the layout multicasts use,
/// and the shared state, seen from this process.
pub struct Domain {
    state: State,
    wait: WaitConfig,
    shutdown: AtomicBool,
    /// This process (what a port records in its slot).
    pid: u32,
}

impl Domain {
    /// A domain of threads of this process.
    pub fn new(tree: Tree, layout: Layout, wait: WaitConfig) -> Result<Arc<Domain>, FanoutError> {
        Ok(Domain::over(State::new(tree, layout)?, wait))
    }

    fn over(state: State, wait: WaitConfig) -> Arc<Domain> {
        Arc::new(Domain {
            state,
            wait,
            shutdown: AtomicBool::new(false),
            pid: std::process::id(),
        })
    }

    /// A domain of processes: create `/dev/shm/spindle-fanout@NAME` and
    /// map it. Other processes attach with [`Domain::open_shm`]. The file
    /// is removed when this domain drops (or by [`Domain::remove_shm`]
    /// if this process dies first).
    #[cfg(not(loom))]
    pub fn create_shm(name: &str, tree: Tree, layout: Layout, wait: WaitConfig) -> Result<Arc<Domain>, FanoutError> {
        Ok(Domain::over(crate::shm::create(name, tree, layout)?, wait))
    }

    /// Map the domain of processes `name` made by [`Domain::create_shm`]:
    /// its tree and layout are the creator's (checked: magic, version,
    /// region layout tag, shape, slots, the tree rebuilt here).
    #[cfg(not(loom))]
    pub fn open_shm(name: &str, wait: WaitConfig) -> Result<Arc<Domain>, FanoutError> {
        Ok(Domain::over(crate::shm::open(name)?, wait))
    }

    /// Remove domain `name`'s file (its creator is gone). Processes that
    /// mapped it keep their mapping. Returns whether there was a file.
    #[cfg(not(loom))]
    pub fn remove_shm(name: &str) -> Result<bool, FanoutError> {
        crate::shm::remove(name)
    }

    /// The file a domain of processes is mapped from.
    #[cfg(not(loom))]
    pub fn shm_path(&self) -> Option<&std::path::Path> {
        self.state.mapping().map(|m| m.path())
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Attach to `slot`; `handler` runs for every message delivered
    /// there (after forwarding, before acknowledging). Refused if a port
    /// of this process holds the slot, or one of another process that is
    /// alive; the slot of a process that is gone (and reaped) is taken
    /// over, membership included.
    pub fn attach(
        self: &Arc<Domain>,
        slot: usize,
        handler: impl FnMut(Delivery) + Send + 'static,
    ) -> Result<Port, FanoutError> {
        self.state.take_slot(slot, self.pid, process_alive)?;
        // Everything after the last acknowledged message is still to do
        // (a member joined before its port attached, or a taken-over slot).
        let last_seen = self.state.acked_seq(slot);
        Ok(Port {
            domain: self.clone(),
            slot,
            last_seen,
            handler: Box::new(handler),
            delivered: 0,
            wait: self.wait,
        })
    }

    /// Ask every port of this process to stop waiting (their `serve`
    /// returns).
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        for slot in 0..self.state.slots() {
            self.state.wake_word(slot).wake();
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }
}

#[cfg(not(loom))]
fn process_alive(pid: u32) -> bool {
    crate::shm::process_alive(pid)
}

#[cfg(loom)]
fn process_alive(_pid: u32) -> bool {
    true
}

/// One attachment to one slot of a [`Domain`].
pub struct Port {
    domain: Arc<Domain>,
    slot: usize,
    last_seen: u64,
    handler: Box<dyn FnMut(Delivery) + Send>,
    delivered: u64,
    wait: WaitConfig,
}

impl Drop for Port {
    /// Detach. Membership is left as it is: a member that goes away
    /// without leaving is found by the next multicast's bounded wait.
    fn drop(&mut self) {
        self.domain.state.release_slot(self.slot, self.domain.pid);
    }
}

impl Port {
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// How this port waits (default: the domain's): a thread busy with
    /// other work spins little and parks.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// Messages delivered to this port's handler so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    pub fn join(&self) -> Result<(), FanoutError> {
        self.domain.state.join(self.slot)
    }

    /// Leave (one atomic op), then serve the multicast in flight whose
    /// snapshot still holds this slot, for at most `timeout`.
    pub fn leave(&mut self, timeout: Duration) -> Result<(), FanoutError> {
        let Some(seq) = self.domain.state.leave(self.slot)? else {
            return Ok(());
        };
        let mut deadline = Deadline::after(timeout);
        loop {
            match self.domain.state.snapshot_holds(self.slot, seq) {
                Ok(false) => return Ok(()),
                Ok(true) => break,
                Err(()) if deadline.passed() => return Ok(()),
                Err(()) => spin_pass(),
            }
        }
        let domain = self.domain.clone();
        let state = &domain.state;
        self.idle_until(&mut deadline, None, |port| {
            port.poll();
            port.last_seen >= seq || state.in_flight() != Some(seq) || state.failed_seq() != 0
        });
        Ok(())
    }

    /// Handle the message in this slot's mailbox, if any: forward it
    /// (scatter), deliver it if this slot is a target, acknowledge.
    /// Returns the messages handled (0 or 1).
    pub fn poll(&mut self) -> u32 {
        let state = &self.domain.state;
        let Some(message) = state.receive(self.slot, self.last_seen) else {
            return 0;
        };
        self.last_seen = message.seq;
        let mine = if state.layout() == Layout::Flat {
            message.ack_to
        } else {
            state.scatter(self.slot, message)
        };
        if state.is_target(self.slot, &message) {
            (self.handler)(Delivery {
                slot: self.slot,
                seq: message.seq,
                payload: message.payload,
            });
            self.delivered += 1;
        }
        state.acknowledge(self.slot, message.seq, mine);
        1
    }

    /// Wait up to `timeout` for a message and handle it. Returns the
    /// messages handled (0 on timeout or shutdown).
    pub fn serve(&mut self, timeout: Duration) -> u32 {
        let mut deadline = Deadline::after(timeout);
        let mut handled = 0;
        self.idle_until(&mut deadline, None, |port| {
            handled += port.poll();
            handled > 0 || port.domain.is_shutdown()
        });
        handled
    }

    /// Multicast `payload` to every member present now (less this slot)
    /// and wait for all their acknowledgements, for at most `timeout`
    /// (counted from the wait's first look at the clock, within its
    /// first 1,024 spin passes). While waiting this port keeps serving
    /// its own mailbox.
    pub fn multicast(&mut self, payload: u64, timeout: Duration) -> Result<Completion, FanoutError> {
        let mut deadline = Deadline::after(timeout);
        let flight = self.claim(&mut deadline, timeout)?;
        // No `Arc` clone here: its count shares a line with the domain's
        // fields every port polls, and a clone and drop per multicast took
        // that line from the members (two line transfers more on the
        // critical path).
        self.domain.state.start(&flight, payload);
        let mut cursor = 0usize;
        let done = self.idle_until(&mut deadline, Some(&flight), |port| {
            port.poll();
            port.domain.state.flight_done(&flight, &mut cursor)
        });
        let domain = &self.domain;
        if done {
            domain.state.finish(&flight);
            return Ok(Completion {
                seq: flight.seq,
                targets: flight.targets,
            });
        }
        let missing = domain.state.unacknowledged(&flight);
        domain.state.fail(&flight, &missing);
        Err(FanoutError::AckTimeout {
            seq: flight.seq,
            origin: self.slot,
            waited_ms: timeout.as_millis() as u64,
            missing,
        })
    }

    fn claim(&mut self, deadline: &mut Deadline, timeout: Duration) -> Result<Flight, FanoutError> {
        let mut passes = 0u32;
        loop {
            match self.domain.state.claim(self.slot) {
                Ok(flight) => return Ok(flight),
                Err(Claim::Refused(e)) => return Err(e),
                Err(Claim::Busy) => {
                    // Another origin's multicast may need this slot.
                    self.poll();
                    passes = passes.wrapping_add(1);
                    if passes.is_multiple_of(64) {
                        if deadline.passed() {
                            return Err(FanoutError::Busy {
                                slot: self.slot,
                                waited_ms: timeout.as_millis() as u64,
                            });
                        }
                        std::thread::yield_now();
                    } else {
                        spin_pass();
                    }
                }
            }
        }
    }

    /// Spin, yield, then sleep, until `done` (which may do work) says so
    /// or the deadline passes. Before sleeping the port reads its slot's
    /// wake word, then arms the words it waits on (its mailbox, and for an
    /// origin the flight's word: see [`State::arm_flight`]); it sleeps
    /// only if all are still unchanged, while the wake word is unchanged,
    /// for at most `park_max`.
    fn idle_until(
        &mut self,
        deadline: &mut Deadline,
        flight: Option<&Flight>,
        mut done: impl FnMut(&mut Port) -> bool,
    ) -> bool {
        let wait = self.wait;
        let mut passes = 0u32;
        loop {
            if done(self) {
                return true;
            }
            passes = passes.saturating_add(1);
            if passes <= wait.spins {
                if passes.is_multiple_of(CLOCK_CHECK_PASSES) && deadline.passed() {
                    return false;
                }
                spin_pass();
                continue;
            }
            let now = Instant::now();
            let deadline = deadline.at(now);
            if now >= deadline {
                return false;
            }
            if passes - wait.spins <= wait.yields {
                yield_pass();
                continue;
            }
            let state = &self.domain.state;
            let word = state.wake_word(self.slot);
            // Read before arming: a wake after this changes it (WakeWord).
            let seen = word.prepare();
            let armed = state.arm_mailbox(self.slot, self.last_seen) && flight.is_none_or(|f| state.arm_flight(f));
            if armed {
                word.wait(seen, wait.park_max.min(deadline - now));
            }
        }
    }
}
