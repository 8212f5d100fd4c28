//! `spindle`: run, measure and watch Spindle groups.
//!
//! - `spindle demo`: a 3-member group on shared memory, no configuration.
//! - `spindle bench multicast …`: bandwidth and latency, one process per
//!   member, against a raw shm ring measured in the same run.
//! - `spindle stat`: live counters of the groups on this host.
//!
//! The benchmark and demo machinery lives in the `spindle-bench` crate;
//! this binary parses arguments and dispatches (the hidden member
//! subcommands are what that crate's process harnesses re-exec).

mod kv;
mod run;
mod stat;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use spindle_bench::{baseline, demo, member, rt, sim, view_member, BenchCommand};

#[derive(Parser)]
#[command(
    name = "spindle",
    version,
    about = "Fast, safe replication of small objects: atomic multicast with the Spindle techniques"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start a local group on shared memory and show it working.
    Demo(demo::DemoArgs),
    /// Measure bandwidth and latency.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Show live counters of the groups running on this host.
    Stat(stat::StatArgs),
    /// Run one member of a multi-host group from a configuration file
    /// (with `[[subgroups]]`: a member of each shard it is in).
    Run(run::RunArgs),
    /// A replicated key-value service speaking RESP (the Redis protocol).
    #[command(subcommand)]
    Kv(kv::KvCommand),
    /// Time-driven real-time channels (MPI/RT).
    #[command(subcommand)]
    Rt(rt::RtCommand),
    /// Deterministic simulation with fault injection and invariant checking.
    Sim(sim::SimArgs),
    /// Data-centric publish/subscribe (DDS): perf (ddsperf-like), pub and sub (with --rtps: Cyclone interop), sim (NAPA).
    #[command(subcommand)]
    Dds(spindle_bench::dds_perf::DdsCommand),
    /// Acknowledged multicast over a static tree: bench, calibrate, sim.
    #[command(subcommand)]
    Fanout(spindle_bench::fanout::FanoutCommand),
    /// (internal) one member process of a demo or bench run.
    #[command(hide = true)]
    Member(member::MemberArgs),
    /// (internal) one side of the raw shm baseline ring.
    #[command(hide = true)]
    BaselineMember(baseline::BaselineArgs),
    /// (internal) one member process of a membership run (demo, failover).
    #[command(hide = true)]
    ViewMember(view_member::ViewMemberArgs),
    /// (internal) one member process of the persistence act of the demo.
    #[command(hide = true)]
    PersistMember(spindle_bench::persist_demo::PersistMemberArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(command) => spindle_bench::bench(command),
        Command::Stat(args) => stat::run(args),
        Command::Run(args) => run::run(args),
        Command::Kv(command) => kv::run(command),
        Command::Rt(command) => rt::run(command),
        Command::Dds(command) => spindle_bench::dds_perf::run(command),
        Command::Sim(args) => sim::run(args),
        Command::Fanout(command) => spindle_bench::fanout::run(command),
        Command::Member(args) => member::run(args),
        Command::BaselineMember(args) => baseline::run_member(args),
        Command::ViewMember(args) => view_member::run(args),
        Command::PersistMember(args) => spindle_bench::persist_demo::run_member(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
