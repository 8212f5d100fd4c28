//! # spindle-dds: data-centric publish/subscribe over the group layer
//!
//! The OMG DCPS concepts (participant, typed keyed topics, writers and
//! readers, QoS policies) as driven engines over Spindle's group layer, and
//! NAPA, the reliable writer's auto-tuned inter-sample gap. The `spindle`
//! crate's `dds` module runs them on a group (shm or tcp); this crate owns
//! no threads, sleeps or clocks, so the simulator runs it unchanged.
//!
//! - [`types`]: writer/reader/instance ids, [`types::TopicType`].
//! - [`qos`]: the policies, their defaults and the writer/reader
//!   compatibility rules (requested vs offered).
//! - [`cache`]: a reader's history: instances, sample and instance states,
//!   keep-last/keep-all, resource limits, lifespan, deadline, exclusive
//!   ownership.
//! - [`history`]: a writer's history of the last samples per instance
//!   (transient-local durability).
//! - [`napa`]: the NAPA controller; [`napa_sim`] its seeded simulator.
//! - [`wire`]: the sample and discovery layouts carried in group messages.
//! - [`discovery`]: endpoint announcements and matching.
#![warn(missing_docs)]

pub mod cache;
pub mod discovery;
pub mod history;
pub mod napa;
pub mod napa_sim;
pub mod qos;
pub mod types;
pub mod wire;
