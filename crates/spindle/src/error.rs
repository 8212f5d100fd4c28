//! The one error type of the `spindle` crate: every message names the bad
//! value, the member at fault, or what a call was waiting for.

pub use spindle_fabric::FabricError;
pub use spindle_group::{GroupError, SendError};

use crate::config::ConfigError;

/// Why a `spindle` call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting of the builder is invalid (the message names it).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The group file is invalid or unreadable.
    #[error(transparent)]
    File(#[from] ConfigError),
    /// The transport failed (open, connect, a peer's bad frame, …).
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// A blocking call gave up after its timeout.
    #[error("timed out after {waited_ms} ms waiting for {waiting_for}")]
    Timeout {
        /// What the call was waiting for.
        waiting_for: String,
        /// How long it waited.
        waited_ms: u64,
    },
    /// The group layer stopped this member (removed, minority partition,
    /// a member gone from a static group, …).
    #[error(transparent)]
    Group(GroupError),
    /// A message could not be sent.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The key-value service failed.
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    /// A point-to-point query failed (refused, too long, its member gone).
    #[error(transparent)]
    Query(#[from] spindle_group::QueryError),
    /// The progress thread stopped with an error, or panicked.
    #[error("the progress thread stopped: {0}")]
    Thread(String),
    /// Joining a shard of an elastic subgroup failed for good (after its
    /// attempts, when the cause may pass: see `Sharded`'s join retry).
    #[error("subgroup {subgroup:?} shard {shard}: joining failed{}: {cause}", attempt_note(.attempts, .attempts_max))]
    ShardJoin {
        /// The subgroup's name.
        subgroup: String,
        /// The shard's index in the subgroup.
        shard: usize,
        /// The attempts made, this last one included.
        attempts: u32,
        /// The most attempts a join gets.
        attempts_max: u32,
        /// Why the last attempt failed (in the message, so not also the
        /// error's `source`).
        cause: Box<Error>,
    },
}

/// ", attempt n of max" when the join was tried again, else nothing.
fn attempt_note(attempts: &u32, attempts_max: &u32) -> String {
    match attempts {
        1 => String::new(),
        n => format!(" (attempt {n} of {attempts_max})"),
    }
}

impl From<GroupError> for Error {
    fn from(e: GroupError) -> Error {
        match e {
            GroupError::Timeout { waiting_for, waited_ms } => Error::Timeout { waiting_for, waited_ms },
            GroupError::Fabric(f) => Error::Fabric(f),
            GroupError::Config(c) => Error::Config(c),
            GroupError::Send(s) => Error::Send(s),
            other => Error::Group(other),
        }
    }
}
