//! The runtime of a live domain: the threads that serve slots, their
//! waiting (spin, then park) and waking, and the time bounds. The
//! protocol steps are [`State`]'s; this part only waits for them.
//!
//! A [`Port`] is one thread's attachment to one slot. The thread that
//! attaches is the one woken for that slot, so a port is used by the
//! thread that created it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::plan::Layout;
use crate::state::{Claim, Flight, State, Wake};

use crate::sync::{current, park_bounded, spin_pass, AtomicBool, AtomicU64, Mutex, Ordering, Thread};
use crate::topology::Tree;
use crate::FanoutError;

/// How a waiting port spends its time.
#[derive(Clone, Copy, Debug)]
pub struct WaitConfig {
    /// Passes that spin before the port parks.
    pub spins: u32,
    /// The longest single park (a bound: a missed wake costs at most this).
    pub park_max: Duration,
}

impl Default for WaitConfig {
    fn default() -> WaitConfig {
        WaitConfig {
            spins: 20_000,
            park_max: Duration::from_millis(10),
        }
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
/// the shared state and the threads attached to slots.
pub struct Domain {
    state: State,
    wait: WaitConfig,
    attached: AtomicU64,
    shutdown: AtomicBool,
    threads: Box<[Mutex<Option<Thread>>]>,
}

impl Wake for Domain {
    fn wake(&self, slot: usize) {
        let thread = self.threads[slot].lock().unwrap();
        if let Some(thread) = thread.as_ref() {
            thread.unpark();
        }
    }
}

impl Domain {
    pub fn new(tree: Tree, layout: Layout, wait: WaitConfig) -> Result<Arc<Domain>, FanoutError> {
        let slots = tree.slots();
        let state = State::new(tree, layout)?;
        Ok(Arc::new(Domain {
            state,
            wait,
            attached: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            threads: (0..slots).map(|_| Mutex::new(None)).collect(),
        }))
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Attach the calling thread to `slot`; `handler` runs for every
    /// message delivered there (after forwarding, before acknowledging).
    pub fn attach(
        self: &Arc<Domain>,
        slot: usize,
        handler: impl FnMut(Delivery) + Send + 'static,
    ) -> Result<Port, FanoutError> {
        self.state.check_slot(slot)?;
        let bit = 1u64 << slot;
        if self.attached.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(FanoutError::SlotAttached { slot });
        }
        *self.threads[slot].lock().unwrap() = Some(current());
        // Everything after the last acknowledged message is still to do
        // (a member joined before its thread attached).
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

    /// Ask every port to stop waiting (their `serve` returns).
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        for slot in 0..self.state.slots() {
            self.wake(slot);
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }
}

/// One thread's attachment to one slot of a [`Domain`].
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
        *self.domain.threads[self.slot].lock().unwrap() = None;
        self.domain.attached.fetch_and(!(1 << self.slot), Ordering::AcqRel);
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
        let deadline = Instant::now() + timeout;
        loop {
            match self.domain.state.snapshot_holds(self.slot, seq) {
                Ok(false) => return Ok(()),
                Ok(true) => break,
                Err(()) if Instant::now() >= deadline => return Ok(()),
                Err(()) => spin_pass(),
            }
        }
        let domain = self.domain.clone();
        let state = &domain.state;
        self.idle_until(deadline, None, |port| {
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
            state.scatter(self.slot, message, &*self.domain)
        };
        if state.is_target(self.slot, &message) {
            (self.handler)(Delivery {
                slot: self.slot,
                seq: message.seq,
                payload: message.payload,
            });
            self.delivered += 1;
        }
        state.acknowledge(self.slot, message.seq, mine, &*self.domain);
        1
    }

    /// Wait up to `timeout` for a message and handle it. Returns the
    /// messages handled (0 on timeout or shutdown).
    pub fn serve(&mut self, timeout: Duration) -> u32 {
        let deadline = Instant::now() + timeout;
        let mut handled = 0;
        self.idle_until(deadline, None, |port| {
            handled += port.poll();
            handled > 0 || port.domain.is_shutdown()
        });
        handled
    }

    /// Multicast `payload` to every member present now (less this slot)
    /// and wait for all their acknowledgements, for at most `timeout`.
    /// While waiting this port keeps serving its own mailbox.
    pub fn multicast(&mut self, payload: u64, timeout: Duration) -> Result<Completion, FanoutError> {
        let deadline = Instant::now() + timeout;
        let flight = self.claim(deadline, timeout)?;
        let domain = self.domain.clone();
        domain.state.start(&flight, payload, &*domain);
        let mut cursor = 0usize;
        let done = self.idle_until(deadline, Some(&flight), |port| {
            port.poll();
            match domain.state.layout() {
                Layout::Flat => domain.state.flat_acked(&flight, &mut cursor),
                _ => domain.state.is_done(flight.seq),
            }
        });
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

    fn claim(&mut self, deadline: Instant, timeout: Duration) -> Result<Flight, FanoutError> {
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
                        if Instant::now() >= deadline {
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

    /// Spin, then park, until `done` (which may do work) says so or the
    /// deadline passes. Before parking the port arms the words it waits
    /// on (its mailbox, and for an origin the flight's word: see
    /// [`State::arm_flight`]); it parks only if all are still unchanged,
    /// for at most `park_max`.
    fn idle_until(
        &mut self,
        deadline: Instant,
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
                if passes.is_multiple_of(1024) && Instant::now() >= deadline {
                    return false;
                }
                spin_pass();
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let state = &self.domain.state;
            let armed = state.arm_mailbox(self.slot, self.last_seen) && flight.is_none_or(|f| state.arm_flight(f));
            if armed {
                park_bounded(wait.park_max.min(deadline - now));
            }
        }
    }
}
