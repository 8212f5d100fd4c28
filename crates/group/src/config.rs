//! Group configuration, validated up front with errors that name the bad
//! value. The defaults here are the defaults everywhere (docs, CLI).

use std::time::Duration;

use spindle_runtime::IdleStrategy;

use crate::GroupError;

/// Delivery mode of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Atomic multicast: delivered in one total order, once stable (every
    /// member has received it).
    Ordered,
    /// Delivered on receipt, FIFO per sender, no order across senders.
    Unordered,
    /// Atomic multicast made durable: a message is delivered, in the same
    /// total order, once every member of the view has it in its on-disk log
    /// (see [`crate::persist`]; needs [`GroupConfig::persist_dir`]).
    Persistent,
}

impl DeliveryMode {
    pub fn parse(s: &str) -> Result<DeliveryMode, String> {
        match s {
            "ordered" => Ok(DeliveryMode::Ordered),
            "unordered" => Ok(DeliveryMode::Unordered),
            "persistent" => Ok(DeliveryMode::Persistent),
            other => Err(format!(
                "unknown delivery mode '{other}': expected 'ordered', 'unordered' or 'persistent'"
            )),
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            DeliveryMode::Ordered => "ordered",
            DeliveryMode::Unordered => "unordered",
            DeliveryMode::Persistent => "persistent",
        }
    }
    /// Whether delivery follows the total order (ordered and persistent).
    #[inline(always)]
    pub fn is_total_order(&self) -> bool {
        !matches!(self, DeliveryMode::Unordered)
    }
}

/// Which members send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderSet {
    All,
    /// The first `ceil(members / 2)` members.
    Half,
    /// Member 0 only.
    One,
    /// These ranks, ascending.
    Ranks(Vec<usize>),
}

impl SenderSet {
    pub fn parse(s: &str) -> Result<SenderSet, String> {
        match s {
            "all" => Ok(SenderSet::All),
            "half" => Ok(SenderSet::Half),
            "one" => Ok(SenderSet::One),
            other => Err(format!("unknown sender set '{other}': expected all, half or one")),
        }
    }

    /// The sender ranks for a group of `members`.
    pub fn ranks(&self, members: usize) -> Vec<usize> {
        match self {
            SenderSet::All => (0..members).collect(),
            SenderSet::Half => (0..members.div_ceil(2)).collect(),
            SenderSet::One => vec![0],
            SenderSet::Ranks(r) => r.clone(),
        }
    }

    pub fn as_str(&self) -> String {
        match self {
            SenderSet::All => "all".into(),
            SenderSet::Half => "half".into(),
            SenderSet::One => "one".into(),
            SenderSet::Ranks(r) => format!("{r:?}"),
        }
    }
}

/// Everything a member needs to join a static group. All members of a
/// group must use equal values (the shm fabric checks the layout).
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Group name (the shm file is `/dev/shm/spindle-<name>`).
    pub name: String,
    pub members: usize,
    pub senders: SenderSet,
    pub mode: DeliveryMode,
    /// Slots in each sender's ring (the send window).
    pub window_slots: usize,
    /// Largest payload one slot carries.
    pub slot_payload_max: usize,
    /// The Spindle batching techniques (off only to measure what they buy).
    pub batching: bool,
    pub idle: IdleStrategy,
    /// How long to wait for every member to join.
    pub join_timeout: Duration,
    /// How often a member bumps its heartbeat and checks that its peers
    /// are alive.
    pub peer_check_interval: Duration,
    /// Membership changes (Derecho's view change): on, a failed member is
    /// removed and the others go on in a new view; off, a failed member
    /// stops the others with `MemberGone` (a static group).
    pub membership: bool,
    /// A member whose heartbeat has not moved for this long is suspected
    /// (a member whose process is gone is suspected at once).
    pub suspect_timeout: Duration,
    /// The ranks in the first view (default: every rank `0..members`).
    /// Ranks outside it may join later with [`crate::Group::join_running`].
    pub initial_members: Option<Vec<usize>>,
    /// Largest state snapshot a joiner can receive (bytes of the row).
    pub snapshot_bytes_max: usize,
    /// A receiver tells the senders which slots it released at least
    /// every `ack_every_slots` delivered slots (0: once half a window is
    /// owed, the default). Releases also ride along with every other
    /// push, so this is an upper bound on the acknowledgement interval:
    /// the DDS layer's "readers acknowledge every K samples".
    pub ack_every_slots: u32,
    /// A sender reads its members' release counters on every pass (not
    /// only once half its window is used), so [`crate::Sender::acknowledged_slots`]
    /// is exact: what a paced writer (NAPA) needs to see its window
    /// occupancy. Off by default (it reads every member's row each pass).
    pub track_acks: bool,
    /// Where persistent mode keeps each member's log
    /// (`<dir>/<name>-member-<rank>.log`); needed by, and only used in,
    /// [`DeliveryMode::Persistent`].
    pub persist_dir: Option<std::path::PathBuf>,
    /// Persistent mode: once this many bytes were appended to a member's
    /// log since its last compaction, the member replaces what its
    /// application already applied with the application's snapshot
    /// ([`crate::Upcalls::snapshot`], e.g. a [`crate::StateMachine`] in
    /// [`crate::Replicated`]); a restart restores it, then replays the
    /// rest (see [`crate::persist`]). 0 (the default): never; the log
    /// keeps the whole history. Needs upcalls that take snapshots
    /// ([`crate::Upcalls::takes_snapshots`]).
    pub compact_log_bytes: u64,
    /// Largest message [`crate::Sender::send_large`] accepts (bigger than
    /// a slot: it travels as fragments, see [`crate::large`]); a member
    /// passes over a message that claims more.
    pub large_message_max_bytes: u64,
}

/// Defaults, shared by the API, the CLI and the docs.
pub mod defaults {
    pub const MEMBERS: usize = 3;
    pub const WINDOW_SLOTS: usize = 1024;
    pub const SLOT_PAYLOAD_MAX: usize = 10_240;
    pub const JOIN_TIMEOUT_MS: u64 = 10_000;
    pub const PEER_CHECK_INTERVAL_MS: u64 = 10;
    pub const MEMBERSHIP: bool = true;
    pub const SUSPECT_TIMEOUT_MS: u64 = 500;
    pub const SNAPSHOT_BYTES_MAX: usize = 64 << 10;
    pub const SNAPSHOT_BYTES_MAX_MAX: usize = 64 << 20;
    pub const WINDOW_SLOTS_MAX: usize = 1 << 20;
    pub const SLOT_PAYLOAD_MAX_MAX: usize = 1 << 20;
    /// Ring bytes per sender are capped so a group stays well inside /dev/shm.
    pub const RING_BYTES_MAX: usize = 256 << 20;
    pub const LARGE_MESSAGE_MAX_BYTES: u64 = 1 << 30;
    /// Smallest `compact_log_bytes` (a compaction rewrites the log's
    /// tail and syncs twice: not for every few messages).
    pub const COMPACT_LOG_BYTES_MIN: u64 = 4 << 10;
    /// Reassembly buffers live in memory: at most 16 GiB per message.
    pub const LARGE_MESSAGE_MAX_BYTES_MAX: u64 = 16 << 30;
}

impl GroupConfig {
    pub fn new(name: &str, members: usize) -> GroupConfig {
        GroupConfig {
            name: name.to_string(),
            members,
            senders: SenderSet::All,
            mode: DeliveryMode::Ordered,
            window_slots: defaults::WINDOW_SLOTS,
            slot_payload_max: defaults::SLOT_PAYLOAD_MAX,
            batching: true,
            idle: IdleStrategy::DEFAULT_BACKOFF,
            join_timeout: Duration::from_millis(defaults::JOIN_TIMEOUT_MS),
            peer_check_interval: Duration::from_millis(defaults::PEER_CHECK_INTERVAL_MS),
            membership: defaults::MEMBERSHIP,
            suspect_timeout: Duration::from_millis(defaults::SUSPECT_TIMEOUT_MS),
            initial_members: None,
            snapshot_bytes_max: defaults::SNAPSHOT_BYTES_MAX,
            ack_every_slots: 0,
            track_acks: false,
            persist_dir: None,
            compact_log_bytes: 0,
            large_message_max_bytes: defaults::LARGE_MESSAGE_MAX_BYTES,
        }
    }

    /// The first view's members (`initial_members`, or every rank).
    pub fn initial_ranks(&self) -> Vec<usize> {
        self.initial_members
            .clone()
            .unwrap_or_else(|| (0..self.members).collect())
    }

    /// Check every value; the error names the first bad one.
    pub fn validate(&self) -> Result<(), GroupError> {
        self.validate_for(false)
    }

    /// [`GroupConfig::validate`] for the first view of a group restarted
    /// after a total failure (`restarted`), whose members are those that
    /// could rebuild the state: a view without a sender is allowed there,
    /// as it is after a view change that removed the last sender (the
    /// replicated state is still read, a sender may join again).
    pub(crate) fn validate_for(&self, restarted: bool) -> Result<(), GroupError> {
        let bad = |m: String| Err(GroupError::Config(m));
        spindle_fabric::shm::validate_group_name(&self.name)?;
        if self.members == 0 || self.members > spindle_fabric::MEMBERS_MAX {
            return bad(format!(
                "members = {} must be in 1..={}",
                self.members,
                spindle_fabric::MEMBERS_MAX
            ));
        }
        let ranks = self.senders.ranks(self.members);
        if ranks.is_empty() {
            return bad("senders: at least one member must send".into());
        }
        if let Some(r) = ranks.iter().find(|r| **r >= self.members) {
            return bad(format!(
                "senders: rank {r} is not a member (members = {})",
                self.members
            ));
        }
        if ranks.windows(2).any(|w| w[0] >= w[1]) {
            return bad(format!("senders: ranks {ranks:?} must be ascending without repeats"));
        }
        if !self.window_slots.is_power_of_two()
            || self.window_slots < 2
            || self.window_slots > defaults::WINDOW_SLOTS_MAX
        {
            return bad(format!(
                "window_slots = {} must be a power of two in 2..={}",
                self.window_slots,
                defaults::WINDOW_SLOTS_MAX
            ));
        }
        if self.slot_payload_max == 0 || self.slot_payload_max > defaults::SLOT_PAYLOAD_MAX_MAX {
            return bad(format!(
                "slot_payload_max = {} must be in 1..={} (larger messages need the large-message path)",
                self.slot_payload_max,
                defaults::SLOT_PAYLOAD_MAX_MAX
            ));
        }
        if self.large_message_max_bytes == 0 || self.large_message_max_bytes > defaults::LARGE_MESSAGE_MAX_BYTES_MAX {
            return bad(format!(
                "large_message_max_bytes = {} must be in 1..={}",
                self.large_message_max_bytes,
                defaults::LARGE_MESSAGE_MAX_BYTES_MAX
            ));
        }
        if self.compact_log_bytes != 0 && self.mode != DeliveryMode::Persistent {
            return bad(format!(
                "compact_log_bytes = {}: only used with mode = \"persistent\" (mode is \"{}\")",
                self.compact_log_bytes,
                self.mode.as_str()
            ));
        }
        if self.compact_log_bytes != 0 && self.compact_log_bytes < defaults::COMPACT_LOG_BYTES_MIN {
            return bad(format!(
                "compact_log_bytes = {} is below {} (0 turns compaction off)",
                self.compact_log_bytes,
                defaults::COMPACT_LOG_BYTES_MIN
            ));
        }
        if self.snapshot_bytes_max > defaults::SNAPSHOT_BYTES_MAX_MAX {
            return bad(format!(
                "snapshot_bytes_max = {} exceeds {}",
                self.snapshot_bytes_max,
                defaults::SNAPSHOT_BYTES_MAX_MAX
            ));
        }
        if self.suspect_timeout < self.peer_check_interval * 2 {
            return bad(format!(
                "suspect_timeout = {} ms must be at least twice peer_check_interval = {} ms",
                self.suspect_timeout.as_millis(),
                self.peer_check_interval.as_millis()
            ));
        }
        if let Some(initial) = &self.initial_members {
            if initial.is_empty() {
                return bad("initial_members: the first view needs at least one member".into());
            }
            if let Some(r) = initial.iter().find(|r| **r >= self.members) {
                return bad(format!(
                    "initial_members: rank {r} is not a rank of the group (members = {})",
                    self.members
                ));
            }
            if initial.windows(2).any(|w| w[0] >= w[1]) {
                return bad(format!(
                    "initial_members: ranks {initial:?} must be ascending without repeats"
                ));
            }
            if !ranks.iter().any(|r| initial.contains(r)) && !restarted {
                return bad(format!(
                    "initial_members {initial:?}: none of them sends (senders = {ranks:?})"
                ));
            }
        }
        if self.ack_every_slots as usize > self.window_slots / 2 {
            return bad(format!(
                "ack_every_slots = {} must be at most half the window ({} of window_slots = {})",
                self.ack_every_slots,
                self.window_slots / 2,
                self.window_slots
            ));
        }
        let ring_bytes = crate::layout::slot_stride(self.slot_payload_max) * self.window_slots;
        if ring_bytes > defaults::RING_BYTES_MAX {
            return bad(format!(
                "window_slots × slot size = {} bytes per sender exceeds {} bytes; use fewer or smaller slots",
                ring_bytes,
                defaults::RING_BYTES_MAX
            ));
        }
        Ok(())
    }
}
