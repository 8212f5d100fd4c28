//! Errors of the group layer. Messages are written for the person running
//! the program: they name the bad value or the member at fault.

use spindle_fabric::FabricError;

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("invalid group configuration: {0}")]
    Config(String),
    #[error("member {rank} is gone: it exited or crashed, or its connection broke, while the group was running")]
    MemberGone { rank: usize },
    #[error("the group was stopped")]
    Stopped,
}

/// Why a send could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Every slot is in flight: flow control is waiting for the slowest
    /// member. Retry after the progress loop has run (never waits here,
    /// so it is safe inside a delivery callback).
    #[error("send window full: every slot is still in use by some member (back-pressure); retry later")]
    WouldBlock,
    #[error("payload of {len} bytes is larger than the slot payload size of {slot_payload_max} bytes")]
    TooLarge { len: usize, slot_payload_max: usize },
    #[error("member {rank} is not a sender in this view")]
    NotASender { rank: usize },
    #[error("the group has stopped")]
    Stopped,
}
