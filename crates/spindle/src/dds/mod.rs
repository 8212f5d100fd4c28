//! Data-centric publish/subscribe: the OMG DCPS concepts over the group
//! layer, with NAPA auto-tuned reliable writers.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use spindle::dds::{DomainParticipant, Keyed, ReaderQos, WriterQos};
//!
//! #[derive(Serialize, Deserialize, Debug)]
//! struct Reading { sensor: u32, celsius: f64 }
//! impl Keyed for Reading {
//!     type Key = u32;
//!     fn key(&self) -> u32 { self.sensor }
//! }
//!
//! // Two participants of domain 7 on this host (rank 0 here, rank 1 elsewhere).
//! let participant = DomainParticipant::builder(7).participants(2).rank(0).join()?;
//! let topic = participant.create_topic::<Reading>("sensors/temperature")?;
//! let writer = participant.create_writer(&topic, WriterQos::default().keep_last(4).transient_local())?;
//! let reader = participant.create_reader(&topic, ReaderQos::default().reliable(std::time::Duration::from_millis(100)))?;
//! writer.write(&Reading { sensor: 1, celsius: 21.5 })?;
//! reader.wait_for_data(std::time::Duration::from_secs(1));
//! for sample in reader.take(16)? {
//!     println!("{:?} {:?}", sample.info.instance_state, sample.data);
//! }
//! # Ok::<(), spindle::dds::DdsError>(())
//! ```
//!
//! ## How it maps onto the group layer
//!
//! - A **domain** is a group (`dds-<domain id>`); a **participant** is a
//!   member (a rank). Participants join and leave as members do; one that
//!   dies is removed by a view change, and its writers' liveliness is
//!   lost at every reader.
//! - Every participant sends: samples and endpoint announcements are group
//!   messages, delivered in one total order, so every participant computes
//!   the same matches and every reader of a topic sees the same order.
//! - A **writer** writes a sample in place into its participant's send
//!   ring (no copy, no allocation); the ring is the send window that NAPA
//!   keeps between 1 and W. Readers acknowledge by releasing slots.
//! - A **reader**'s history is a [`spindle_dds::cache::ReaderCache`];
//!   a full reliable keep-all reader pauses its participant's receiving,
//!   so writers block (and time out) rather than lose a sample.
//! - **Transient-local**: every participant keeps the last N samples per
//!   instance of every transient-local writer (it delivers them all
//!   anyway); a late reader starts from that history, in order, before
//!   any live sample. A participant that joins later gets it in the
//!   group's state snapshot.

mod participant;
mod reader;
#[cfg(feature = "rtps")]
pub mod rtps;
#[cfg(feature = "rtps")]
mod rtps_log;
mod writer;

pub use participant::{
    DomainParticipant, ParticipantBuilder, Publisher, Subscriber, Topic, WINDOW_BYTES_DEFAULT, WINDOW_SLOTS_MAX,
    WINDOW_SLOTS_MIN,
};
pub use reader::{DataReader, ReaderStatus, Sample};
pub use writer::{DataWriter, WriterStatus};

pub use spindle_dds::cache::{InstanceState, SampleInfo, SampleState, StateMask, ViewState};
pub use spindle_dds::napa::{NapaConfig, NapaTrace};
pub use spindle_dds::qos::{
    Durability, History, Liveliness, Ownership, Partition, QosError, QosPolicyId, ReaderQos, Reliability,
    ResourceLimits, WriterQos,
};
pub use spindle_dds::types::{InstanceHandle, Keyed, ReaderId, SampleKind, TopicType, WriterId};

/// Why a DDS call failed.
#[derive(Debug, thiserror::Error)]
pub enum DdsError {
    /// A setting or a QoS is invalid (the message names it).
    #[error("invalid setting: {0}")]
    Config(String),
    /// An invalid QoS.
    #[error(transparent)]
    Qos(#[from] QosError),
    /// The value does not serialize into the writer's sample size limit.
    #[error(transparent)]
    Encode(#[from] spindle_dds::types::EncodeError),
    /// A sample's bytes are not a value of the reader's type.
    #[error(transparent)]
    Decode(#[from] spindle_dds::types::DecodeError),
    /// A reliable write found the send window full for its whole
    /// `max_blocking_time` (the readers do not keep up, or one stopped
    /// reading): the sample was not written.
    #[error("timed out after {waited_ms} ms: {waiting_for}")]
    Timeout {
        /// What the call waited for.
        waiting_for: String,
        /// How long it waited.
        waited_ms: u64,
    },
    /// The participant stopped (left, or its group failed: the reason).
    #[error("the participant stopped: {0}")]
    Stopped(String),
    /// The group layer failed (joining, the transport).
    #[error(transparent)]
    Group(#[from] crate::Error),
}
