//! Replicated state machines: a [`StateMachine`] applied in delivery
//! order is the same at every member, and a joiner starts from a snapshot.
//!
//! ```no_run
//! use spindle_group::{Delivery, Group, GroupConfig, Replicated, StateMachine};
//!
//! #[derive(Default)]
//! struct Counter(u64);
//!
//! impl StateMachine for Counter {
//!     fn apply(&mut self, d: &Delivery<'_>) {
//!         self.0 += u64::from_le_bytes(d.payload[..8].try_into().unwrap());
//!     }
//!     fn snapshot(&self, out: &mut Vec<u8>) {
//!         out.extend_from_slice(&self.0.to_le_bytes());
//!     }
//!     fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
//!         let bytes: [u8; 8] = snapshot.try_into().map_err(|_| "a counter snapshot is 8 bytes".to_string())?;
//!         self.0 = u64::from_le_bytes(bytes);
//!         Ok(())
//!     }
//! }
//!
//! let mut counter = Replicated::new(Counter::default());
//! let mut group = Group::join_shm(GroupConfig::new("counter", 3), 0).unwrap();
//! group.sender().unwrap().send(&5u64.to_le_bytes()).unwrap();
//! loop {
//!     group.poll(&mut counter).unwrap();
//! }
//! ```

use crate::core::Delivery;
use crate::membership::{Upcalls, View};

/// Application state replicated by ordered delivery.
pub trait StateMachine {
    /// Apply one delivered message (every member applies the same
    /// messages in the same order).
    fn apply(&mut self, d: &Delivery<'_>);
    /// The whole state, for a member that joins, or to compact a
    /// persistent log to (`GroupConfig::compact_log_bytes`).
    fn snapshot(&self, out: &mut Vec<u8>);
    /// Replace the state with a snapshot (a joiner, before its first
    /// delivery; a restart over a compacted log, before the messages
    /// after the snapshot). An error stops the join or restart with the
    /// reason.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
    /// A view was installed (after the old view's last delivery).
    fn view_installed(&mut self, _view: &View) {}
    /// Answer a read from another member (a point-to-point query, see
    /// [`crate::query`]) from the state as it is: it sees every message
    /// this member applied so far. The default answers none.
    fn query(&self, _request: &[u8], _reply: &mut Vec<u8>) -> Result<(), String> {
        Err("this state machine answers no queries (it does not implement StateMachine::query)".into())
    }
}

/// A [`StateMachine`] as the [`Upcalls`] of a group: pass it to
/// [`crate::Group::poll`].
pub struct Replicated<S> {
    pub state: S,
    /// The view the state is in.
    pub view: View,
    /// Messages applied (in every view).
    pub applied: u64,
}

impl<S> Replicated<S> {
    pub fn new(state: S) -> Replicated<S> {
        Replicated {
            state,
            view: View::default(),
            applied: 0,
        }
    }
}

impl<S: StateMachine> Upcalls for Replicated<S> {
    #[inline]
    fn deliver(&mut self, d: &Delivery<'_>) {
        self.state.apply(d);
        self.applied += 1;
    }
    fn view_installed(&mut self, view: &View) {
        self.view = view.clone();
        self.state.view_installed(view);
    }
    fn snapshot(&mut self, out: &mut Vec<u8>) {
        self.state.snapshot(out);
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.state.restore(snapshot)
    }
    fn takes_snapshots(&self) -> bool {
        true
    }
    fn query(&mut self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), String> {
        self.state.query(request, reply)
    }
}
