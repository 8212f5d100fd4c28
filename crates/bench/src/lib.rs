//! # spindle-bench — the measurements and demos behind the `spindle` command
//!
//! The `spindle` binary parses its arguments and calls in here for
//! everything that measures or demonstrates:
//!
//! - [`multicast`] (`spindle bench multicast`): atomic multicast, one
//!   process per member ([`member`], the hidden `spindle member`), against
//!   the raw shm ring of [`baseline`] (the hidden `spindle baseline-member`)
//!   measured in the same run; [`payload`] is what the senders write and
//!   the receivers check, [`report`] the JSON records, [`plot`] the SVGs;
//! - [`replica`] (`spindle bench replica`): one-sided vs RPC replication;
//! - [`failover`] (`spindle bench failover`, and the failure act of
//!   [`demo`]): membership runs of [`view_member`] processes (the hidden
//!   `spindle view-member`);
//! - [`rt`] (`spindle rt …`): the time-driven channel scenarios
//!   ([`rt::scenario`], the hidden `spindle rt member`);
//! - [`sim`] (`spindle sim`): seeds of the deterministic simulator.
//!
//! Member processes are started, faulted and stopped through one harness,
//! [`cluster::Cluster`], which the process tests of the `spindle` binary
//! use as well. Process harnesses re-exec the running executable
//! (`std::env::current_exe`), so these entry points work from a binary
//! that exposes the hidden member subcommands.

pub mod baseline;
pub mod cluster;
pub mod dds_perf;
pub mod dds_rtps;
pub mod dds_sim;
pub mod demo;
pub mod failover;
pub mod fanout;
pub mod kv_sim;
pub mod member;
pub mod multicast;
pub mod payload;
pub mod persist_demo;
pub mod plot;
pub mod query;
pub mod replica;
#[cfg(feature = "ofi")]
pub mod replica_msg;
pub mod report;
pub mod rt;
pub mod sim;
pub mod view_member;

use std::path::PathBuf;

/// `spindle bench …`.
// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Atomic multicast: one process per member on shared memory.
    ///
    /// A member that dies or fails fails the run: the bench reports that
    /// member's error and output, gives the others 0.5 s to stop by
    /// themselves, then kills them (a measurement with a member missing
    /// is not the measurement asked for; the survivors of a group would go
    /// on in a new view, which `spindle bench failover` and `spindle run`
    /// show). Every file the members made is removed either way.
    #[command(verbatim_doc_comment)]
    Multicast(multicast::MulticastArgs),
    /// One-sided vs RPC object replication (RAMCloud): write latency.
    Replica(replica::ReplicaArgs),
    /// Membership: time from a member's failure to the new view at every
    /// survivor, and throughput right after.
    Failover(failover::FailoverArgs),
    /// Point-to-point queries: the round trip of a read sent to one
    /// replica of another shard (4 member threads on shared memory, 2
    /// shards of 2), next to a cache line's round trip in the same run.
    Query(query::QueryArgs),
}

/// Run a `spindle bench` command.
pub fn bench(command: BenchCommand) -> Result<(), String> {
    match command {
        BenchCommand::Multicast(args) => multicast::run(args),
        BenchCommand::Replica(args) => replica::run(args),
        BenchCommand::Failover(args) => failover::bench(args),
        BenchCommand::Query(args) => query::run(args),
    }
}

/// A fresh private directory for one run's result files.
pub fn tempdir(what: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "spindle-{what}-{}-{}",
        std::process::id(),
        spindle_runtime::monotonic_ns()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok(dir)
}
