//! Every bad input and failure of the fanout crate, each naming its input.

/// What went wrong in a fanout call.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FanoutError {
    #[error("slot {slot} is out of range: this domain has {slots} slots (0..{slots})")]
    SlotOutOfRange { slot: usize, slots: usize },
    #[error("slot {slot} is already joined: a slot holds one member")]
    SlotOccupied { slot: usize },
    #[error("slot {slot} already has a port attached (one thread serves a slot)")]
    SlotAttached { slot: usize },
    #[error("slot {slot} is held by process {pid}, which is alive (a slot is taken over only once its process is gone and reaped)")]
    SlotTaken { slot: usize, pid: u32 },
    #[error("slot {slot} is not joined: only a member can leave")]
    NotJoined { slot: usize },
    #[error("slot {slot} is not a member: only a member can multicast")]
    NotMember { slot: usize },
    #[error("multicast {seq} from slot {origin}: no acknowledgement within {waited_ms} ms from slot(s) {missing:?} (evicted; the domain is failed)")]
    AckTimeout {
        seq: u64,
        origin: usize,
        waited_ms: u64,
        missing: Vec<usize>,
    },
    #[error("the domain failed at multicast {seq} (a member did not acknowledge); no further multicast is possible")]
    Failed { seq: u64 },
    #[error("slot {slot}: no multicast slot free within {waited_ms} ms (another multicast is in flight)")]
    Busy { slot: usize, waited_ms: u64 },
    #[error("tree of {slots} slots: a tree has 1..={max} slots")]
    BadSlotCount { slots: usize, max: usize },
    #[error("a live domain has at most {max} slots (one membership word), asked for {slots}")]
    TooManyLiveSlots { slots: usize, max: usize },
    #[error("unknown tree shape '{shape}': expected flat, binary, kary:K (K >= 2) or cpu")]
    BadShape { shape: String },
    #[error("unknown layout '{layout}': expected flat, tree, tree_help or tree_help_skip")]
    BadLayout { layout: String },
    #[error("{slots} slots asked of the cpu topology under {path}, which describes {cpus} cpus")]
    TopologyTooSmall { slots: usize, cpus: usize, path: String },
    #[error("bad shared-memory domain name '{name}': 1..=200 characters, none of them '/' or NUL")]
    BadShmName { name: String },
    #[error(
        "{path} already exists: another domain of that name (remove it with Domain::remove_shm if its creator is gone)"
    )]
    ShmExists { path: String },
    #[error("{path} does not exist: no domain of that name (create it first)")]
    ShmMissing { path: String },
    #[error("{path} is not a usable fanout domain: {what}")]
    ShmMismatch { path: String, what: String },
    #[error("{path}: {op} failed: {error}")]
    ShmIo { path: String, op: String, error: String },
}
