//! The QoS policies of a writer and a reader, their DDS defaults, their
//! consistency rules ([`WriterQos::validate`], [`ReaderQos::validate`]),
//! the requested-vs-offered (RxO) compatibility rules
//! ([`check_compatible`]), partition matching ([`partitions_match`]) and
//! the fixed-width form that discovery carries ([`QosWire`]).
//!
//! Times are nanoseconds in the fields (`_ns`, `None` = infinite) and
//! [`Duration`]s in the fluent setters:
//!
//! ```
//! use std::time::Duration;
//! use spindle_dds::qos::{check_compatible, ReaderQos, WriterQos};
//!
//! let offered = WriterQos::default()
//!     .reliable(Duration::from_millis(50))
//!     .keep_last(8)
//!     .transient_local()
//!     .deadline(Duration::from_millis(10));
//! let requested = ReaderQos::default().reliable(Duration::from_millis(50)).transient_local();
//! assert!(offered.validate().is_ok() && requested.validate().is_ok());
//! assert!(check_compatible(&offered, &requested).is_ok());
//! ```

use std::fmt;
use std::time::Duration;

/// The largest serialized sample any writer may declare (16 MiB).
pub const SAMPLE_BYTES_LIMIT: u32 = 16 << 20;
/// The most partition names one endpoint may hold.
pub const PARTITION_NAMES_MAX: usize = 64;
/// The longest partition name, in bytes.
pub const PARTITION_NAME_BYTES_MAX: usize = 256;

/// A [`Duration`] in nanoseconds, saturating at `u64::MAX` (≈ 584 years).
fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether samples are repaired (reliable) or may be lost (best effort).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reliability {
    /// Samples may be lost; the writer never blocks. The reader's default.
    #[default]
    BestEffort,
    /// Every sample reaches every matched live reader; `write` blocks at
    /// most `max_blocking_time_ns` when the send window is full. The
    /// writer's default (100 ms: [`Reliability::WRITER_DEFAULT`]).
    Reliable {
        /// How long `write` may block on a full window.
        max_blocking_time_ns: u64,
    },
}

impl Reliability {
    /// The writer's default: reliable, blocking at most 100 ms.
    pub const WRITER_DEFAULT: Reliability = Reliability::Reliable {
        max_blocking_time_ns: 100_000_000,
    };

    /// Whether this is [`Reliability::Reliable`].
    pub fn is_reliable(&self) -> bool {
        matches!(self, Reliability::Reliable { .. })
    }
}

/// How many samples per instance a history keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum History {
    /// The last `n` samples of each instance (older ones are replaced).
    /// `KeepLast(0)` is invalid.
    KeepLast(u32),
    /// Every sample, up to the resource limits (then new samples are
    /// rejected: the reliable writer is held back).
    KeepAll,
}

impl Default for History {
    fn default() -> Self {
        History::KeepLast(1)
    }
}

/// Whether a late-joining reader receives samples written before it
/// matched. Ordered: `Volatile < TransientLocal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Durability {
    /// Only samples written after the match.
    #[default]
    Volatile,
    /// The writer keeps its history (see [`crate::history`]) and replays
    /// it to each late joiner.
    TransientLocal,
}

/// The longest time between two samples of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Deadline {
    /// The period; `None` = infinite (no deadline), the default.
    pub period_ns: Option<u64>,
}

/// Automatic liveliness: a writer is alive while its participant is heard
/// from within the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Liveliness {
    /// The lease; `None` = infinite, the default.
    pub lease_ns: Option<u64>,
}

/// How much a history may hold. Always bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceLimits {
    /// Samples over all instances (default 4096).
    pub max_samples: u32,
    /// Instances (default 1024).
    pub max_instances: u32,
    /// Samples of one instance (default 4096).
    pub max_samples_per_instance: u32,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            max_samples: 4096,
            max_instances: 1024,
            max_samples_per_instance: 4096,
        }
    }
}

/// How long a sample stays valid after its source timestamp (a writer
/// policy; readers drop expired samples).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Lifespan {
    /// The duration; `None` = infinite, the default.
    pub duration_ns: Option<u64>,
}

/// Whether several writers may update one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Ownership {
    /// Every writer's samples are accepted, the default.
    #[default]
    Shared,
    /// Per instance, only the strongest live writer's samples are accepted
    /// (ties: the lower [`crate::types::WriterId`]).
    Exclusive,
}

/// The partitions an endpoint belongs to. Empty = the default partition
/// `""`. Names may hold the glob wildcards `*` and `?` (see
/// [`partitions_match`]).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Partition {
    /// The names.
    pub names: Vec<String>,
}

/// A QoS policy, as errors and incompatibilities name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosPolicyId {
    /// [`Reliability`].
    Reliability,
    /// [`Durability`].
    Durability,
    /// [`Deadline`].
    Deadline,
    /// [`Liveliness`].
    Liveliness,
    /// [`Ownership`].
    Ownership,
    /// [`History`].
    History,
    /// [`ResourceLimits`] (and the writer's `max_sample_bytes`).
    ResourceLimits,
    /// [`Lifespan`].
    Lifespan,
    /// [`Partition`].
    Partition,
}

impl fmt::Display for QosPolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            QosPolicyId::Reliability => "reliability",
            QosPolicyId::Durability => "durability",
            QosPolicyId::Deadline => "deadline",
            QosPolicyId::Liveliness => "liveliness",
            QosPolicyId::Ownership => "ownership",
            QosPolicyId::History => "history",
            QosPolicyId::ResourceLimits => "resource_limits",
            QosPolicyId::Lifespan => "lifespan",
            QosPolicyId::Partition => "partition",
        };
        f.write_str(name)
    }
}

/// An inconsistent QoS setting, or a QoS that does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    /// `History::KeepLast(0)`.
    #[error("history: KeepLast(0) keeps nothing (the depth must be at least 1)")]
    ZeroDepth,
    /// A keep-last depth above the per-instance limit.
    #[error(
        "history: KeepLast({depth}) exceeds resource_limits.max_samples_per_instance = {max_samples_per_instance}"
    )]
    DepthOverPerInstanceLimit {
        /// The depth.
        depth: u32,
        /// The limit.
        max_samples_per_instance: u32,
    },
    /// A resource limit of 0.
    #[error("resource_limits: {field} = 0 (every limit must be at least 1)")]
    ZeroLimit {
        /// Which limit.
        field: &'static str,
    },
    /// `max_samples < max_samples_per_instance`.
    #[error(
        "resource_limits: max_samples = {max_samples} is below max_samples_per_instance = {max_samples_per_instance}"
    )]
    SamplesBelowPerInstance {
        /// The total limit.
        max_samples: u32,
        /// The per-instance limit.
        max_samples_per_instance: u32,
    },
    /// A period, lease or duration of 0 (use `None` for infinite).
    #[error("{policy}: a duration of 0 ns (use None for infinite)")]
    ZeroDuration {
        /// The policy.
        policy: QosPolicyId,
    },
    /// A writer's `max_sample_bytes` of 0 or above [`SAMPLE_BYTES_LIMIT`].
    #[error("resource_limits: max_sample_bytes = {value} (must be 1..={SAMPLE_BYTES_LIMIT})")]
    SampleBytes {
        /// The value.
        value: u32,
    },
    /// Too many partition names, or one too long.
    #[error("partition: {count} names, the longest {longest_bytes} bytes (at most {PARTITION_NAMES_MAX} names of {PARTITION_NAME_BYTES_MAX} bytes)")]
    PartitionTooLarge {
        /// The number of names.
        count: usize,
        /// The longest name's length.
        longest_bytes: usize,
    },
    /// A wire byte that names no kind of its policy.
    #[error("QoS wire form: {field} = {value} is not a known kind")]
    BadKind {
        /// The field.
        field: &'static str,
        /// The byte.
        value: u8,
    },
    /// A wire form of the wrong length.
    #[error("QoS wire form: {len} bytes, expected {expected}")]
    WireLength {
        /// The length given.
        len: usize,
        /// [`QosWire::SIZE`].
        expected: usize,
    },
    /// A writer's wire form decoded as a reader's, or the reverse.
    #[error("QoS wire form: endpoint kind {found} where {expected} was expected (0 = writer, 1 = reader)")]
    WrongEndpoint {
        /// The kind found.
        found: u8,
        /// The kind expected.
        expected: u8,
    },
}

fn validate_common(
    history: History,
    limits: &ResourceLimits,
    deadline: &Deadline,
    liveliness: &Liveliness,
    partition: &Partition,
) -> Result<(), QosError> {
    for (field, value) in [
        ("max_samples", limits.max_samples),
        ("max_instances", limits.max_instances),
        ("max_samples_per_instance", limits.max_samples_per_instance),
    ] {
        if value == 0 {
            return Err(QosError::ZeroLimit { field });
        }
    }
    if limits.max_samples < limits.max_samples_per_instance {
        return Err(QosError::SamplesBelowPerInstance {
            max_samples: limits.max_samples,
            max_samples_per_instance: limits.max_samples_per_instance,
        });
    }
    match history {
        History::KeepLast(0) => return Err(QosError::ZeroDepth),
        History::KeepLast(depth) if depth > limits.max_samples_per_instance => {
            return Err(QosError::DepthOverPerInstanceLimit {
                depth,
                max_samples_per_instance: limits.max_samples_per_instance,
            })
        }
        _ => {}
    }
    if deadline.period_ns == Some(0) {
        return Err(QosError::ZeroDuration {
            policy: QosPolicyId::Deadline,
        });
    }
    if liveliness.lease_ns == Some(0) {
        return Err(QosError::ZeroDuration {
            policy: QosPolicyId::Liveliness,
        });
    }
    let longest_bytes = partition.names.iter().map(String::len).max().unwrap_or(0);
    if partition.names.len() > PARTITION_NAMES_MAX || longest_bytes > PARTITION_NAME_BYTES_MAX {
        return Err(QosError::PartitionTooLarge {
            count: partition.names.len(),
            longest_bytes,
        });
    }
    Ok(())
}

/// A writer's QoS. `Default` is DDS's: reliable (100 ms), keep-last 1,
/// volatile, no deadline, infinite lease, default limits, 64 KiB samples,
/// infinite lifespan, shared ownership (strength 0), default partition.
#[derive(Clone, Debug, PartialEq)]
pub struct WriterQos {
    /// Reliability.
    pub reliability: Reliability,
    /// History (of the transient-local replay and of the send window).
    pub history: History,
    /// Durability.
    pub durability: Durability,
    /// The deadline this writer offers.
    pub deadline: Deadline,
    /// The lease this writer offers.
    pub liveliness: Liveliness,
    /// Resource limits of the writer's history.
    pub resource_limits: ResourceLimits,
    /// The largest serialized sample, in bytes (default 64 KiB, at most
    /// [`SAMPLE_BYTES_LIMIT`]).
    pub max_sample_bytes: u32,
    /// Lifespan of this writer's samples.
    pub lifespan: Lifespan,
    /// Ownership kind.
    pub ownership: Ownership,
    /// Strength under exclusive ownership (higher wins).
    pub ownership_strength: i32,
    /// Partitions.
    pub partition: Partition,
}

impl Default for WriterQos {
    fn default() -> Self {
        WriterQos {
            reliability: Reliability::WRITER_DEFAULT,
            history: History::default(),
            durability: Durability::default(),
            deadline: Deadline::default(),
            liveliness: Liveliness::default(),
            resource_limits: ResourceLimits::default(),
            max_sample_bytes: 64 << 10,
            lifespan: Lifespan::default(),
            ownership: Ownership::default(),
            ownership_strength: 0,
            partition: Partition::default(),
        }
    }
}

/// A reader's QoS. `Default` is DDS's: best effort, keep-last 1,
/// volatile, no deadline, infinite lease, default limits, shared
/// ownership, default partition.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ReaderQos {
    /// Reliability requested.
    pub reliability: Reliability,
    /// History of the reader's cache.
    pub history: History,
    /// Durability requested.
    pub durability: Durability,
    /// The deadline requested (also the cache's missed-deadline period).
    pub deadline: Deadline,
    /// The lease requested.
    pub liveliness: Liveliness,
    /// Resource limits of the reader's cache.
    pub resource_limits: ResourceLimits,
    /// Ownership kind requested.
    pub ownership: Ownership,
    /// Partitions.
    pub partition: Partition,
}

/// The fluent setters both endpoints share.
macro_rules! common_setters {
    () => {
        /// Reliable, `write` blocking at most `max_blocking_time`.
        pub fn reliable(mut self, max_blocking_time: Duration) -> Self {
            self.reliability = Reliability::Reliable {
                max_blocking_time_ns: duration_ns(max_blocking_time),
            };
            self
        }

        /// Best effort.
        pub fn best_effort(mut self) -> Self {
            self.reliability = Reliability::BestEffort;
            self
        }

        /// Keep the last `depth` samples per instance.
        pub fn keep_last(mut self, depth: u32) -> Self {
            self.history = History::KeepLast(depth);
            self
        }

        /// Keep every sample, up to the resource limits.
        pub fn keep_all(mut self) -> Self {
            self.history = History::KeepAll;
            self
        }

        /// Transient-local durability.
        pub fn transient_local(mut self) -> Self {
            self.durability = Durability::TransientLocal;
            self
        }

        /// Volatile durability.
        pub fn volatile(mut self) -> Self {
            self.durability = Durability::Volatile;
            self
        }

        /// A deadline period.
        pub fn deadline(mut self, period: Duration) -> Self {
            self.deadline.period_ns = Some(duration_ns(period));
            self
        }

        /// An automatic-liveliness lease.
        pub fn liveliness_lease(mut self, lease: Duration) -> Self {
            self.liveliness.lease_ns = Some(duration_ns(lease));
            self
        }

        /// Resource limits.
        pub fn resource_limits(mut self, limits: ResourceLimits) -> Self {
            self.resource_limits = limits;
            self
        }

        /// Shared ownership.
        pub fn shared(mut self) -> Self {
            self.ownership = Ownership::Shared;
            self
        }

        /// The partitions (replacing any before).
        pub fn partition(mut self, names: &[&str]) -> Self {
            self.partition.names = names.iter().map(|n| (*n).to_owned()).collect();
            self
        }
    };
}

impl WriterQos {
    common_setters!();

    /// Samples live `lifespan` after their source timestamp.
    pub fn lifespan(mut self, lifespan: Duration) -> Self {
        self.lifespan.duration_ns = Some(duration_ns(lifespan));
        self
    }

    /// Exclusive ownership with this strength.
    pub fn exclusive(mut self, strength: i32) -> Self {
        self.ownership = Ownership::Exclusive;
        self.ownership_strength = strength;
        self
    }

    /// The largest serialized sample, in bytes.
    pub fn max_sample_bytes(mut self, bytes: u32) -> Self {
        self.max_sample_bytes = bytes;
        self
    }

    /// Every inconsistent setting, reported with its policy and value
    /// (the first found).
    pub fn validate(&self) -> Result<(), QosError> {
        validate_common(
            self.history,
            &self.resource_limits,
            &self.deadline,
            &self.liveliness,
            &self.partition,
        )?;
        if self.lifespan.duration_ns == Some(0) {
            return Err(QosError::ZeroDuration {
                policy: QosPolicyId::Lifespan,
            });
        }
        if self.max_sample_bytes == 0 || self.max_sample_bytes > SAMPLE_BYTES_LIMIT {
            return Err(QosError::SampleBytes {
                value: self.max_sample_bytes,
            });
        }
        Ok(())
    }

    /// The wire form (partition names excluded).
    pub fn to_wire(&self) -> QosWire {
        let mut w = QosWire::common(
            ENDPOINT_WRITER,
            self.reliability,
            self.history,
            self.durability,
            self.ownership,
            &self.resource_limits,
            &self.deadline,
            &self.liveliness,
        );
        w.max_sample_bytes = self.max_sample_bytes;
        w.lifespan_ns = self.lifespan.duration_ns.unwrap_or(INFINITE_NS);
        w.ownership_strength = self.ownership_strength;
        w
    }

    /// From the wire form, checked with [`WriterQos::validate`]; the
    /// partition is left empty (it travels separately).
    pub fn from_wire(w: &QosWire) -> Result<WriterQos, QosError> {
        w.expect_endpoint(ENDPOINT_WRITER)?;
        let qos = WriterQos {
            reliability: w.reliability()?,
            history: w.history()?,
            durability: w.durability()?,
            deadline: Deadline {
                period_ns: finite(w.deadline_period_ns),
            },
            liveliness: Liveliness {
                lease_ns: finite(w.liveliness_lease_ns),
            },
            resource_limits: w.limits(),
            max_sample_bytes: w.max_sample_bytes,
            lifespan: Lifespan {
                duration_ns: finite(w.lifespan_ns),
            },
            ownership: w.ownership()?,
            ownership_strength: w.ownership_strength,
            partition: Partition::default(),
        };
        qos.validate()?;
        Ok(qos)
    }
}

impl ReaderQos {
    common_setters!();

    /// Exclusive ownership requested.
    pub fn exclusive(mut self) -> Self {
        self.ownership = Ownership::Exclusive;
        self
    }

    /// Every inconsistent setting, reported with its policy and value
    /// (the first found).
    pub fn validate(&self) -> Result<(), QosError> {
        validate_common(
            self.history,
            &self.resource_limits,
            &self.deadline,
            &self.liveliness,
            &self.partition,
        )
    }

    /// The wire form (partition names excluded).
    pub fn to_wire(&self) -> QosWire {
        QosWire::common(
            ENDPOINT_READER,
            self.reliability,
            self.history,
            self.durability,
            self.ownership,
            &self.resource_limits,
            &self.deadline,
            &self.liveliness,
        )
    }

    /// From the wire form, checked with [`ReaderQos::validate`]; the
    /// partition is left empty (it travels separately).
    pub fn from_wire(w: &QosWire) -> Result<ReaderQos, QosError> {
        w.expect_endpoint(ENDPOINT_READER)?;
        let qos = ReaderQos {
            reliability: w.reliability()?,
            history: w.history()?,
            durability: w.durability()?,
            deadline: Deadline {
                period_ns: finite(w.deadline_period_ns),
            },
            liveliness: Liveliness {
                lease_ns: finite(w.liveliness_lease_ns),
            },
            resource_limits: w.limits(),
            ownership: w.ownership()?,
            partition: Partition::default(),
        };
        qos.validate()?;
        Ok(qos)
    }
}

/// One failing RxO policy with the two values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The policy.
    pub policy: QosPolicyId,
    /// What the writer offered.
    pub offered: String,
    /// What the reader requested.
    pub requested: String,
}

/// A writer and a reader whose QoS do not match (requested vs offered).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Incompatible {
    /// Every failing policy, in [`QosPolicyId`] order.
    pub policies: Vec<QosPolicyId>,
    /// The same, with the offered and requested values.
    pub mismatches: Vec<Mismatch>,
}

impl fmt::Display for Incompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("incompatible QoS (requested vs offered): ")?;
        for (i, m) in self.mismatches.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: offered {}, requested {}", m.policy, m.offered, m.requested)?;
        }
        Ok(())
    }
}

fn ns_text(ns: Option<u64>) -> String {
    match ns {
        None => "infinite".to_owned(),
        Some(ns) => format!("{ns} ns"),
    }
}

/// `offered ≤ requested` where `None` is infinite.
fn at_most(offered: Option<u64>, requested: Option<u64>) -> bool {
    match (offered, requested) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(o), Some(r)) => o <= r,
    }
}

/// The DDS requested-vs-offered rules: a reliable reader needs a reliable
/// writer; the writer's durability is at least the reader's; the writer's
/// deadline period and lease are at most the reader's; the ownership kinds
/// are equal. Every failing policy is listed.
pub fn check_compatible(offered: &WriterQos, requested: &ReaderQos) -> Result<(), Incompatible> {
    let mut mismatches = Vec::new();
    let mut fail = |policy, offered: String, requested: String| {
        mismatches.push(Mismatch {
            policy,
            offered,
            requested,
        });
    };
    if requested.reliability.is_reliable() && !offered.reliability.is_reliable() {
        fail(
            QosPolicyId::Reliability,
            format!("{:?}", offered.reliability),
            format!("{:?}", requested.reliability),
        );
    }
    if offered.durability < requested.durability {
        fail(
            QosPolicyId::Durability,
            format!("{:?}", offered.durability),
            format!("{:?}", requested.durability),
        );
    }
    if !at_most(offered.deadline.period_ns, requested.deadline.period_ns) {
        fail(
            QosPolicyId::Deadline,
            format!("period {}", ns_text(offered.deadline.period_ns)),
            format!("period {}", ns_text(requested.deadline.period_ns)),
        );
    }
    if !at_most(offered.liveliness.lease_ns, requested.liveliness.lease_ns) {
        fail(
            QosPolicyId::Liveliness,
            format!("lease {}", ns_text(offered.liveliness.lease_ns)),
            format!("lease {}", ns_text(requested.liveliness.lease_ns)),
        );
    }
    if offered.ownership != requested.ownership {
        fail(
            QosPolicyId::Ownership,
            format!("{:?}", offered.ownership),
            format!("{:?}", requested.ownership),
        );
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        let policies = mismatches.iter().map(|m| m.policy).collect();
        Err(Incompatible { policies, mismatches })
    }
}

fn has_wildcard(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// Glob match: `*` any run of characters (also none), `?` one character.
/// Iterative with one backtrack point: O(len(pattern) · len(text)) at
/// worst, no allocation.
fn glob(pattern: &str, text: &str) -> bool {
    let p: &[u8] = pattern.as_bytes();
    let t: &[u8] = text.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    // Work on chars for `?` (a multi-byte char is one char): advance over
    // whole UTF-8 sequences.
    let char_len = |b: u8| -> usize {
        match b {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        }
    };
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
            continue;
        }
        if pi < p.len() && p[pi] == b'?' {
            pi += 1;
            ti += char_len(t[ti]);
            continue;
        }
        if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
            continue;
        }
        match star {
            Some((sp, st)) => {
                // Let the last `*` swallow one more char and retry.
                let next = st + char_len(t[st]);
                star = Some((sp, next));
                pi = sp + 1;
                ti = next;
            }
            None => return false,
        }
    }
    p[pi.min(p.len())..].iter().all(|&b| b == b'*')
}

fn name_matches(a: &str, b: &str) -> bool {
    match (has_wildcard(a), has_wildcard(b)) {
        (false, false) => a == b,
        (true, false) => glob(a, b),
        (false, true) => glob(b, a),
        // DDS: "no two names that both contain wildcards will ever be
        // considered to match".
        (true, true) => false,
    }
}

/// Whether two endpoints share a partition: some name of one equals, or
/// glob-matches, some name of the other (`*` any run, `?` one character;
/// either side may hold the wildcard; two wildcarded names never match,
/// as the DDS spec says). An empty list is the default partition `""`,
/// which `*` matches.
pub fn partitions_match(a: &Partition, b: &Partition) -> bool {
    let default_name = [String::new()];
    let names_a: &[String] = if a.names.is_empty() { &default_name } else { &a.names };
    let names_b: &[String] = if b.names.is_empty() { &default_name } else { &b.names };
    names_a.iter().any(|x| names_b.iter().any(|y| name_matches(x, y)))
}

/// `u64::MAX` in a wire time field: infinite.
pub const INFINITE_NS: u64 = u64::MAX;

const ENDPOINT_WRITER: u8 = 0;
const ENDPOINT_READER: u8 = 1;

fn finite(ns: u64) -> Option<u64> {
    if ns == INFINITE_NS {
        None
    } else {
        Some(ns)
    }
}

/// An endpoint's QoS as discovery carries it: fixed-width fields only,
/// little-endian on the wire ([`QosWire::as_bytes`]), 64 bytes. Times are
/// ns with `u64::MAX` = infinite. Partition names are not here.
///
/// ```text
///  byte 0        1         2         3         4                   8
///       +--------+---------+---------+---------+-------------------+
///       |endpoint|reliab.  |history  |durab.   |  history_depth    |
///       +--------+---------+---------+---------+-------------------+
///     8 |  max_samples     |  max_instances    |  max_s_per_inst.  | 20
///       +------------------+-------------------+-------------------+
///    20 | max_sample_bytes | 24  max_blocking_time_ns (u64)        | 32
///       +------------------+---------------------------------------+
///    32 |  deadline_period_ns (u64)  | 40  liveliness_lease_ns (u64)| 48
///       +---------------------------+------------------------------+
///    48 |  lifespan_ns (u64)        |56 own.|57 reserved|60 strength| 64
///       +---------------------------+-------+-----------+----------+
///
///  endpoint: 0 writer, 1 reader        reliab.: 0 best effort, 1 reliable
///  history: 0 keep last, 1 keep all    durab.: 0 volatile, 1 transient local
///  own.: 0 shared, 1 exclusive         strength: i32 (0 for a reader)
///  max_sample_bytes: 0 for a reader    reserved: 3 zero bytes
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QosWire {
    /// 0 = writer, 1 = reader.
    pub endpoint: u8,
    /// 0 = best effort, 1 = reliable.
    pub reliability: u8,
    /// 0 = keep last, 1 = keep all.
    pub history: u8,
    /// 0 = volatile, 1 = transient local.
    pub durability: u8,
    /// The keep-last depth (0 under keep all).
    pub history_depth: u32,
    /// Resource limit: samples.
    pub max_samples: u32,
    /// Resource limit: instances.
    pub max_instances: u32,
    /// Resource limit: samples per instance.
    pub max_samples_per_instance: u32,
    /// The writer's largest sample (0 for a reader).
    pub max_sample_bytes: u32,
    /// Reliable: how long `write` may block (0 under best effort).
    pub max_blocking_time_ns: u64,
    /// Deadline period (`u64::MAX` = infinite).
    pub deadline_period_ns: u64,
    /// Liveliness lease (`u64::MAX` = infinite).
    pub liveliness_lease_ns: u64,
    /// Lifespan (`u64::MAX` = infinite; always infinite for a reader).
    pub lifespan_ns: u64,
    /// 0 = shared, 1 = exclusive.
    pub ownership: u8,
    /// Zero.
    pub reserved: [u8; 3],
    /// Ownership strength (0 for a reader).
    pub ownership_strength: i32,
}

const _: () = assert!(std::mem::size_of::<QosWire>() == QosWire::SIZE);
const _: () = assert!(std::mem::align_of::<QosWire>() == 8);
const _: () = assert!(std::mem::offset_of!(QosWire, history_depth) == 4);
const _: () = assert!(std::mem::offset_of!(QosWire, max_blocking_time_ns) == 24);
const _: () = assert!(std::mem::offset_of!(QosWire, lifespan_ns) == 48);
const _: () = assert!(std::mem::offset_of!(QosWire, ownership) == 56);
const _: () = assert!(std::mem::offset_of!(QosWire, ownership_strength) == 60);

impl QosWire {
    /// The wire size in bytes.
    pub const SIZE: usize = 64;

    #[allow(clippy::too_many_arguments)]
    fn common(
        endpoint: u8,
        reliability: Reliability,
        history: History,
        durability: Durability,
        ownership: Ownership,
        limits: &ResourceLimits,
        deadline: &Deadline,
        liveliness: &Liveliness,
    ) -> QosWire {
        let (reliability, max_blocking_time_ns) = match reliability {
            Reliability::BestEffort => (0, 0),
            Reliability::Reliable { max_blocking_time_ns } => (1, max_blocking_time_ns),
        };
        let (history, history_depth) = match history {
            History::KeepLast(depth) => (0, depth),
            History::KeepAll => (1, 0),
        };
        QosWire {
            endpoint,
            reliability,
            history,
            durability: durability as u8,
            history_depth,
            max_samples: limits.max_samples,
            max_instances: limits.max_instances,
            max_samples_per_instance: limits.max_samples_per_instance,
            max_sample_bytes: 0,
            max_blocking_time_ns,
            deadline_period_ns: deadline.period_ns.unwrap_or(INFINITE_NS),
            liveliness_lease_ns: liveliness.lease_ns.unwrap_or(INFINITE_NS),
            lifespan_ns: INFINITE_NS,
            ownership: ownership as u8,
            reserved: [0; 3],
            ownership_strength: 0,
        }
    }

    /// The little-endian bytes.
    pub fn as_bytes(&self) -> [u8; QosWire::SIZE] {
        let mut b = [0u8; QosWire::SIZE];
        b[0] = self.endpoint;
        b[1] = self.reliability;
        b[2] = self.history;
        b[3] = self.durability;
        b[4..8].copy_from_slice(&self.history_depth.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_samples.to_le_bytes());
        b[12..16].copy_from_slice(&self.max_instances.to_le_bytes());
        b[16..20].copy_from_slice(&self.max_samples_per_instance.to_le_bytes());
        b[20..24].copy_from_slice(&self.max_sample_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.max_blocking_time_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.deadline_period_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.liveliness_lease_ns.to_le_bytes());
        b[48..56].copy_from_slice(&self.lifespan_ns.to_le_bytes());
        b[56] = self.ownership;
        b[57..60].copy_from_slice(&self.reserved);
        b[60..64].copy_from_slice(&self.ownership_strength.to_le_bytes());
        b
    }

    /// From little-endian bytes: exactly [`QosWire::SIZE`] of them. Kind
    /// bytes are checked by `from_wire`, the reserved bytes here.
    pub fn from_bytes(b: &[u8]) -> Result<QosWire, QosError> {
        let b: &[u8; QosWire::SIZE] = b.try_into().map_err(|_| QosError::WireLength {
            len: b.len(),
            expected: QosWire::SIZE,
        })?;
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(x)
        };
        let reserved = [b[57], b[58], b[59]];
        if let Some(&nonzero) = reserved.iter().find(|&&x| x != 0) {
            return Err(QosError::BadKind {
                field: "reserved",
                value: nonzero,
            });
        }
        Ok(QosWire {
            endpoint: b[0],
            reliability: b[1],
            history: b[2],
            durability: b[3],
            history_depth: u32_at(4),
            max_samples: u32_at(8),
            max_instances: u32_at(12),
            max_samples_per_instance: u32_at(16),
            max_sample_bytes: u32_at(20),
            max_blocking_time_ns: u64_at(24),
            deadline_period_ns: u64_at(32),
            liveliness_lease_ns: u64_at(40),
            lifespan_ns: u64_at(48),
            ownership: b[56],
            reserved,
            ownership_strength: i32::from_le_bytes([b[60], b[61], b[62], b[63]]),
        })
    }

    fn expect_endpoint(&self, expected: u8) -> Result<(), QosError> {
        match self.endpoint {
            ENDPOINT_WRITER | ENDPOINT_READER if self.endpoint == expected => Ok(()),
            ENDPOINT_WRITER | ENDPOINT_READER => Err(QosError::WrongEndpoint {
                found: self.endpoint,
                expected,
            }),
            value => Err(QosError::BadKind {
                field: "endpoint",
                value,
            }),
        }
    }

    fn reliability(&self) -> Result<Reliability, QosError> {
        match self.reliability {
            0 => Ok(Reliability::BestEffort),
            1 => Ok(Reliability::Reliable {
                max_blocking_time_ns: self.max_blocking_time_ns,
            }),
            value => Err(QosError::BadKind {
                field: "reliability",
                value,
            }),
        }
    }

    fn history(&self) -> Result<History, QosError> {
        match self.history {
            0 => Ok(History::KeepLast(self.history_depth)),
            1 => Ok(History::KeepAll),
            value => Err(QosError::BadKind {
                field: "history",
                value,
            }),
        }
    }

    fn durability(&self) -> Result<Durability, QosError> {
        match self.durability {
            0 => Ok(Durability::Volatile),
            1 => Ok(Durability::TransientLocal),
            value => Err(QosError::BadKind {
                field: "durability",
                value,
            }),
        }
    }

    fn ownership(&self) -> Result<Ownership, QosError> {
        match self.ownership {
            0 => Ok(Ownership::Shared),
            1 => Ok(Ownership::Exclusive),
            value => Err(QosError::BadKind {
                field: "ownership",
                value,
            }),
        }
    }

    fn limits(&self) -> ResourceLimits {
        ResourceLimits {
            max_samples: self.max_samples,
            max_instances: self.max_instances,
            max_samples_per_instance: self.max_samples_per_instance,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn defaults_are_the_dds_defaults() {
        let w = WriterQos::default();
        assert_eq!(
            w.reliability,
            Reliability::Reliable {
                max_blocking_time_ns: 100_000_000
            }
        );
        assert_eq!(w.history, History::KeepLast(1));
        assert_eq!(w.durability, Durability::Volatile);
        assert_eq!(w.deadline.period_ns, None);
        assert_eq!(w.liveliness.lease_ns, None);
        assert_eq!(w.max_sample_bytes, 65536);
        assert_eq!(w.ownership, Ownership::Shared);
        assert_eq!(
            w.resource_limits,
            ResourceLimits {
                max_samples: 4096,
                max_instances: 1024,
                max_samples_per_instance: 4096
            }
        );
        let r = ReaderQos::default();
        assert_eq!(r.reliability, Reliability::BestEffort);
        assert_eq!(r.history, History::KeepLast(1));
        assert!(w.validate().is_ok() && r.validate().is_ok());
        assert!(Durability::Volatile < Durability::TransientLocal);
    }

    #[test]
    fn setters_store_nanoseconds() {
        let w = WriterQos::default()
            .best_effort()
            .keep_all()
            .transient_local()
            .deadline(10 * MS)
            .liveliness_lease(Duration::from_secs(1))
            .lifespan(5 * MS)
            .exclusive(7)
            .partition(&["a", "b"])
            .max_sample_bytes(1000);
        assert_eq!(w.reliability, Reliability::BestEffort);
        assert_eq!(w.history, History::KeepAll);
        assert_eq!(w.deadline.period_ns, Some(10_000_000));
        assert_eq!(w.liveliness.lease_ns, Some(1_000_000_000));
        assert_eq!(w.lifespan.duration_ns, Some(5_000_000));
        assert_eq!((w.ownership, w.ownership_strength), (Ownership::Exclusive, 7));
        assert_eq!(w.partition.names, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(w.max_sample_bytes, 1000);
        let r = ReaderQos::default().reliable(2 * MS).exclusive().keep_last(3);
        assert_eq!(
            r.reliability,
            Reliability::Reliable {
                max_blocking_time_ns: 2_000_000
            }
        );
        assert_eq!(r.ownership, Ownership::Exclusive);
        assert_eq!(r.history, History::KeepLast(3));
    }

    #[test]
    fn validate_names_every_inconsistent_setting() {
        let limits = |s, i, p| ResourceLimits {
            max_samples: s,
            max_instances: i,
            max_samples_per_instance: p,
        };
        let cases: Vec<(WriterQos, QosError)> = vec![
            (WriterQos::default().keep_last(0), QosError::ZeroDepth),
            (
                WriterQos::default().keep_last(9).resource_limits(limits(100, 10, 8)),
                QosError::DepthOverPerInstanceLimit {
                    depth: 9,
                    max_samples_per_instance: 8,
                },
            ),
            (
                WriterQos::default().resource_limits(limits(4, 10, 8)),
                QosError::SamplesBelowPerInstance {
                    max_samples: 4,
                    max_samples_per_instance: 8,
                },
            ),
            (
                WriterQos::default().resource_limits(limits(0, 10, 8)),
                QosError::ZeroLimit { field: "max_samples" },
            ),
            (
                WriterQos::default().resource_limits(limits(10, 0, 8)),
                QosError::ZeroLimit { field: "max_instances" },
            ),
            (
                WriterQos::default().resource_limits(limits(10, 1, 0)),
                QosError::ZeroLimit {
                    field: "max_samples_per_instance",
                },
            ),
            (
                WriterQos::default().deadline(Duration::ZERO),
                QosError::ZeroDuration {
                    policy: QosPolicyId::Deadline,
                },
            ),
            (
                WriterQos::default().liveliness_lease(Duration::ZERO),
                QosError::ZeroDuration {
                    policy: QosPolicyId::Liveliness,
                },
            ),
            (
                WriterQos::default().lifespan(Duration::ZERO),
                QosError::ZeroDuration {
                    policy: QosPolicyId::Lifespan,
                },
            ),
            (
                WriterQos::default().max_sample_bytes(0),
                QosError::SampleBytes { value: 0 },
            ),
            (
                WriterQos::default().max_sample_bytes(SAMPLE_BYTES_LIMIT + 1),
                QosError::SampleBytes {
                    value: SAMPLE_BYTES_LIMIT + 1,
                },
            ),
        ];
        for (qos, expected) in cases {
            assert_eq!(qos.validate(), Err(expected.clone()), "{qos:?}");
            // The message names the policy.
            let text = expected.to_string();
            assert!(
                ["history", "resource_limits", "deadline", "liveliness", "lifespan"]
                    .iter()
                    .any(|p| text.starts_with(p)),
                "{text}"
            );
        }
        assert_eq!(ReaderQos::default().keep_last(0).validate(), Err(QosError::ZeroDepth));
        let many: Vec<String> = (0..=PARTITION_NAMES_MAX).map(|i| i.to_string()).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(matches!(
            ReaderQos::default().partition(&names).validate(),
            Err(QosError::PartitionTooLarge { .. })
        ));
        assert!(WriterQos::default().keep_all().validate().is_ok());
    }

    fn incompatible(w: &WriterQos, r: &ReaderQos) -> Vec<QosPolicyId> {
        check_compatible(w, r).err().map(|e| e.policies).unwrap_or_default()
    }

    #[test]
    fn every_rxo_incompatibility_is_reported_with_its_policy() {
        let w = WriterQos::default();
        let r = ReaderQos::default();
        assert_eq!(incompatible(&w, &r), vec![]);
        // Reliability: a reliable reader needs a reliable writer; the reverse is fine.
        assert_eq!(
            incompatible(&w.clone().best_effort(), &r.clone().reliable(MS)),
            vec![QosPolicyId::Reliability]
        );
        assert_eq!(incompatible(&w, &r.clone().best_effort()), vec![]);
        // Durability: offered ≥ requested.
        assert_eq!(
            incompatible(&w, &r.clone().transient_local()),
            vec![QosPolicyId::Durability]
        );
        assert_eq!(incompatible(&w.clone().transient_local(), &r), vec![]);
        // Deadline: offered period ≤ requested; infinite offered fails a finite request.
        assert_eq!(
            incompatible(&w.clone().deadline(20 * MS), &r.clone().deadline(10 * MS)),
            vec![QosPolicyId::Deadline]
        );
        assert_eq!(
            incompatible(&w, &r.clone().deadline(10 * MS)),
            vec![QosPolicyId::Deadline]
        );
        assert_eq!(
            incompatible(&w.clone().deadline(10 * MS), &r.clone().deadline(10 * MS)),
            vec![]
        );
        assert_eq!(incompatible(&w.clone().deadline(10 * MS), &r), vec![]);
        // Liveliness: offered lease ≤ requested.
        assert_eq!(
            incompatible(&w.clone().liveliness_lease(2 * MS), &r.clone().liveliness_lease(MS)),
            vec![QosPolicyId::Liveliness]
        );
        assert_eq!(
            incompatible(&w, &r.clone().liveliness_lease(MS)),
            vec![QosPolicyId::Liveliness]
        );
        assert_eq!(incompatible(&w.clone().liveliness_lease(MS), &r), vec![]);
        // Ownership: kinds equal, both ways.
        assert_eq!(incompatible(&w.clone().exclusive(1), &r), vec![QosPolicyId::Ownership]);
        assert_eq!(incompatible(&w, &r.clone().exclusive()), vec![QosPolicyId::Ownership]);
        assert_eq!(incompatible(&w.clone().exclusive(1), &r.clone().exclusive()), vec![]);
        // All at once: every one listed, and Display gives both values.
        let err = check_compatible(
            &w.clone()
                .best_effort()
                .deadline(20 * MS)
                .liveliness_lease(2 * MS)
                .exclusive(3),
            &r.clone()
                .reliable(MS)
                .transient_local()
                .deadline(10 * MS)
                .liveliness_lease(MS),
        )
        .unwrap_err();
        assert_eq!(
            err.policies,
            vec![
                QosPolicyId::Reliability,
                QosPolicyId::Durability,
                QosPolicyId::Deadline,
                QosPolicyId::Liveliness,
                QosPolicyId::Ownership
            ]
        );
        let text = err.to_string();
        assert!(
            text.contains("deadline: offered period 20000000 ns, requested period 10000000 ns"),
            "{text}"
        );
        assert!(
            text.contains("durability: offered Volatile, requested TransientLocal"),
            "{text}"
        );
    }

    fn p(names: &[&str]) -> Partition {
        Partition {
            names: names.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn partitions_intersect_with_glob_wildcards() {
        assert!(partitions_match(&p(&[]), &p(&[])));
        assert!(partitions_match(&p(&[]), &p(&[""])));
        assert!(!partitions_match(&p(&[]), &p(&["a"])));
        assert!(partitions_match(&p(&["a", "b"]), &p(&["c", "b"])));
        assert!(!partitions_match(&p(&["a", "b"]), &p(&["c", "d"])));
        assert!(partitions_match(&p(&["sensors/*"]), &p(&["sensors/temp"])));
        assert!(partitions_match(&p(&["sensors/temp"]), &p(&["sensors/*"])));
        assert!(!partitions_match(&p(&["sensors/*"]), &p(&["actuators/x"])));
        assert!(partitions_match(&p(&["room?"]), &p(&["room7"])));
        assert!(!partitions_match(&p(&["room?"]), &p(&["room17"])));
        assert!(partitions_match(&p(&["r*m*7"]), &p(&["room17"])));
        assert!(partitions_match(&p(&["*"]), &p(&[])));
        assert!(partitions_match(&p(&["é?"]), &p(&["éü"])));
        // Two wildcarded names never match (the DDS rule), even equal ones.
        assert!(!partitions_match(&p(&["a*"]), &p(&["a*"])));
        assert!(!partitions_match(&p(&["a*"]), &p(&["*b"])));
    }

    #[test]
    fn wire_form_round_trips_and_rejects_bad_kinds() {
        let w = WriterQos::default()
            .keep_last(4)
            .transient_local()
            .deadline(10 * MS)
            .lifespan(3 * MS)
            .exclusive(-5)
            .max_sample_bytes(1234);
        let bytes = w.to_wire().as_bytes();
        let back = WriterQos::from_wire(&QosWire::from_bytes(&bytes).unwrap()).unwrap();
        assert_eq!(back, w);
        let r = ReaderQos::default().reliable(MS).keep_all().liveliness_lease(MS);
        assert_eq!(
            ReaderQos::from_wire(&QosWire::from_bytes(&r.to_wire().as_bytes()).unwrap()).unwrap(),
            r
        );
        // Wrong endpoint, wrong length, bad kinds, reserved bytes, bad values.
        assert_eq!(
            ReaderQos::from_wire(&w.to_wire()),
            Err(QosError::WrongEndpoint {
                found: ENDPOINT_WRITER,
                expected: ENDPOINT_READER
            })
        );
        assert_eq!(
            QosWire::from_bytes(&bytes[..63]),
            Err(QosError::WireLength { len: 63, expected: 64 })
        );
        for (offset, field) in [
            (0, "endpoint"),
            (1, "reliability"),
            (2, "history"),
            (3, "durability"),
            (56, "ownership"),
        ] {
            let mut bad = bytes;
            bad[offset] = 9;
            let wire = QosWire::from_bytes(&bad).unwrap();
            assert_eq!(WriterQos::from_wire(&wire), Err(QosError::BadKind { field, value: 9 }));
        }
        let mut bad = bytes;
        bad[58] = 1;
        assert_eq!(
            QosWire::from_bytes(&bad),
            Err(QosError::BadKind {
                field: "reserved",
                value: 1
            })
        );
        let mut zero_depth = w.to_wire();
        zero_depth.history_depth = 0;
        assert_eq!(WriterQos::from_wire(&zero_depth), Err(QosError::ZeroDepth));
    }

    proptest! {
        #[test]
        fn from_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 63..=64)) {
            if let Ok(w) = QosWire::from_bytes(&bytes) {
                prop_assert_eq!(&w.as_bytes()[..], &bytes[..]);
                let _ = WriterQos::from_wire(&w);
                let _ = ReaderQos::from_wire(&w);
            }
        }

        #[test]
        fn glob_agrees_with_a_reference_matcher(pat in "[ab*?]{0,6}", text in "[ab]{0,6}") {
            fn reference(p: &[u8], t: &[u8]) -> bool {
                match (p.first(), t.first()) {
                    (None, _) => t.is_empty(),
                    (Some(b'*'), _) => reference(&p[1..], t) || (!t.is_empty() && reference(p, &t[1..])),
                    (Some(b'?'), Some(_)) => reference(&p[1..], &t[1..]),
                    (Some(c), Some(d)) if c == d => reference(&p[1..], &t[1..]),
                    _ => false,
                }
            }
            prop_assert_eq!(glob(&pat, &text), reference(pat.as_bytes(), text.as_bytes()));
        }
    }
}
