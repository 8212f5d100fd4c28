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
    #[error("member {rank} is in a minority partition of view {view}: it can reach only {reachable:?} of members {members:?}, not a majority, so it stops rather than split the group")]
    MinorityPartition {
        rank: usize,
        view: u64,
        reachable: Vec<usize>,
        members: Vec<usize>,
    },
    #[error("member {rank} was removed from the group in view {view}: member {by} suspected it (it was too slow, stopped, or cut off)")]
    Removed { rank: usize, view: u64, by: usize },
    #[error("member {rank} fell behind: it is in view {view} but the group has moved on to view {group_view}")]
    FellBehind { rank: usize, view: u64, group_view: u64 },
    #[error("state transfer to joiner {rank} failed: {reason}")]
    StateTransfer { rank: usize, reason: String },
    /// A blocking call (leave, finish, join) gave up after its timeout.
    #[error("timed out after {waited_ms} ms waiting for {waiting_for}")]
    Timeout {
        /// What the call was waiting for.
        waiting_for: String,
        /// How long it waited.
        waited_ms: u64,
    },
    /// Persistent delivery stopped: the log could not be written or
    /// synced (a full disk, an I/O error). Nothing past what was durable
    /// was delivered or acknowledged as persisted.
    #[error("member {rank} stopped persistent delivery: {reason}")]
    Persist { rank: usize, reason: String },
    #[error(transparent)]
    PersistLog(#[from] crate::persist::PersistError),
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("member {rank} could not join group '{group}': {reason}")]
    JoinFailed { rank: usize, group: String, reason: String },
}

/// Why a send could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Every slot is in flight: flow control is waiting for the slowest
    /// member. Retry after the progress loop has run (never waits here,
    /// so it is safe inside a delivery callback).
    #[error("send window full: every slot is still in use by some member (back-pressure); retry later")]
    WouldBlock,
    #[error("payload of {len} bytes is larger than the slot payload size of {slot_payload_max} bytes (send it with Sender::send_large)")]
    TooLarge { len: usize, slot_payload_max: usize },
    /// A large message longer than the group's `large_message_max_bytes`,
    /// or a group whose slots are too small to carry fragments.
    #[error("large message of {len} bytes refused: {reason}")]
    LargeRefused { len: u64, reason: String },
    /// Another [`crate::LargeSend`] of this member is in progress: a
    /// member sends one large message at a time (small ones go beside it).
    #[error("another large message of this member is still being sent: finish or drop its LargeSend first")]
    LargeInProgress,
    #[error("member {rank} is not a sender in this view")]
    NotASender { rank: usize },
    #[error("the group has stopped")]
    Stopped,
}
