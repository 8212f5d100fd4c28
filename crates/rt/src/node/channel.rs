//! Channel declarations: [`ChannelSpec`] (what every member declares,
//! identically) and the row layout for a set of channels.

use spindle_fabric::PeerSet;

use crate::buffers::IteratorPolicy;
use crate::layout::RtLayout;
use crate::qos::{TaskKind, TaskSpec, TimeQos};

/// Time-driven (admitted, zero-sided) or best-effort (no admission,
/// per-message `send`/`receive` by the application).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    TimeDriven,
    BestEffort,
}

/// A channel as every member declares it (identically: the commit checks
/// a fingerprint). One receiver: point-to-point; several: broadcast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSpec {
    pub name: String,
    pub kind: ChannelKind,
    pub sender: usize,
    pub receivers: PeerSet,
    pub message_bytes_max: usize,
    pub messages_per_period_max: usize,
    /// Registered buffers at each end.
    pub buffer_count: usize,
    pub policy: IteratorPolicy,
    pub send_qos: TimeQos,
    pub receive_qos: TimeQos,
    /// Compute time of the send and receive tasks (measured or declared).
    pub send_compute_ns: u64,
    pub receive_compute_ns: u64,
}

impl ChannelSpec {
    pub fn send_task(&self) -> TaskSpec {
        TaskSpec::new(
            &format!("{} send", self.name),
            TaskKind::ChannelSend,
            self.send_qos,
            self.send_compute_ns,
        )
    }
    pub fn receive_task(&self, rank: usize) -> TaskSpec {
        TaskSpec::new(
            &format!("{} recv@{rank}", self.name),
            TaskKind::ChannelReceive,
            self.receive_qos,
            self.receive_compute_ns,
        )
    }
    pub(super) fn validate(&self, members: usize) -> Result<(), String> {
        if self.sender >= members {
            return Err(format!(
                "channel '{}': sender {} ≥ members {members}",
                self.name, self.sender
            ));
        }
        if self.receivers.0 == 0 || self.receivers.iter().any(|r| r >= members || r == self.sender) {
            return Err(format!(
                "channel '{}': receivers {:?} must be non-empty, < {members} and exclude the sender",
                self.name,
                self.receivers.iter().collect::<Vec<_>>()
            ));
        }
        if !(1..=1 << 20).contains(&self.message_bytes_max) || !(1..=64).contains(&self.messages_per_period_max) {
            return Err(format!(
                "channel '{}': message_bytes_max {} must be in 1..=1048576 and messages_per_period_max {} in 1..=64",
                self.name, self.message_bytes_max, self.messages_per_period_max
            ));
        }
        self.send_task().validate().map_err(|e| e.to_string())?;
        self.receive_task(0).validate().map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The row layout for these channels.
pub fn layout_for(members: usize, channels: &[ChannelSpec]) -> RtLayout {
    let shapes: Vec<(usize, usize)> = channels
        .iter()
        .map(|c| (c.message_bytes_max, c.messages_per_period_max))
        .collect();
    RtLayout::new(members, &shapes)
}
