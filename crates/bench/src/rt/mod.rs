//! `spindle rt …`: time-driven real-time channels (MPI/RT, the HARE
//! thesis's experiments), one process per member, over shared memory or
//! tcp (`--transport tcp`, optionally each member in its own network
//! namespace with `--netns`).
//!
//! - `ring`: the 3-node ring (thesis §5.3, Table 5.1): missed and late
//!   counts, hop latency and jitter, dispatcher release jitter;
//! - `latency`: latency and jitter by message size, 8 B–4 KB (Figs 5.4–5.7);
//! - `compare`: best-effort vs time-based for several periods (Table 5.3);
//! - `clock`: global clock error and its reported bound over time.
//!
//! Every command prints a table, writes JSON with `--json FILE` and an SVG
//! plot with `--plot FILE`. Members are spawned from this executable with
//! the hidden `spindle rt member` subcommand.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use scenario::{run_member, ScenarioSpec};

mod clock;
mod common;
mod compare;
pub mod host_record;
mod jitter;
mod latency;
mod plot;
mod ring;
pub mod scenario;

pub use clock::ClockArgs;
pub use compare::CompareArgs;
pub use jitter::JitterArgs;
pub use latency::LatencyArgs;
pub use ring::RingArgs;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

#[derive(Subcommand, Debug)]
pub enum RtCommand {
    /// The thesis's 3-node ring (Table 5.1): zero-sided channels A→B→C→A.
    Ring(RingArgs),
    /// Latency and jitter of a time-driven channel by message size (8 B–4 KB).
    Latency(LatencyArgs),
    /// Best-effort vs time-based channels for several periods (Table 5.3).
    Compare(CompareArgs),
    /// Global clock: error against the true (injected) time, and the bound.
    Clock(ClockArgs),
    /// The dispatcher's release jitter on this machine (hybrid sleep-then-spin).
    Jitter(JitterArgs),
    /// (internal) one member process of an rt run.
    #[command(hide = true)]
    Member {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        spec: String,
    },
}

/// Options every rt command shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Do not ask for SCHED_FIFO (to measure the dispatcher without it).
    #[arg(long)]
    pub no_fifo: bool,
    /// Spin this long before each release after sleeping (µs). Default:
    /// self-tuned per node from its measured sleep overshoot (a high
    /// quantile with margin, at most 1/16 of the shortest period per
    /// release), printed with the results.
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// Clock error budget every node must stay within (µs); deadlines are
    /// shortened by it.
    #[arg(long, default_value_t = 10)]
    pub clock_budget_us: u64,
    /// Release-jitter calibration wake-ups per member (1 ms apart).
    #[arg(long, default_value_t = 1_000)]
    pub jitter_samples: usize,
    /// Declare the release jitter (µs) instead of using the calibrated maximum.
    #[arg(long)]
    pub declared_jitter_us: Option<u64>,
    /// How admission uses each member's calibration: `worst-case` (the
    /// largest release jitter and interference seen: a set it accepts does
    /// not miss unless the host does worse than during the calibration,
    /// which the run reports) or `statistical` (their 1 − miss-budget
    /// quantiles, with --miss-budget; the run reports its miss rate against it).
    #[arg(long, default_value = "worst-case")]
    pub admission: String,
    /// With `--admission statistical`: the fraction of jobs that may miss (e.g. 1e-4).
    #[arg(long)]
    pub miss_budget: Option<f64>,
    /// How long each member calibrates its host before commit (ms; at least
    /// --jitter-samples wake-ups): wake-ups, each followed by a stall
    /// detector spin, to learn the host's interference.
    #[arg(long, default_value_t = 5_000)]
    pub calibration_ms: u64,
    /// Declare the interference (µs) instead of using the calibrated one.
    #[arg(long)]
    pub declared_interference_us: Option<u64>,
    /// Charge this percent of the interference (100..=1000): the worst a
    /// host has shown is a lower bound of its worst; a headroom is how much
    /// longer a stall may yet be. Default: 100 (as measured), except
    /// `spindle rt ring` with its default parameters: 300.
    #[arg(long)]
    pub interference_headroom_pct: Option<u32>,
    /// This host's record of the worst interference and release lateness
    /// ever observed here (calibrations and runs): worst-case admission
    /// takes at least those, and every run adds what it saw. Default:
    /// $SPINDLE_RT_HOST_RECORD, else $XDG_STATE_HOME/spindle/ (or
    /// ~/.local/state/spindle/) interference-HOSTNAME.json. Delete the file
    /// to forget.
    #[arg(long)]
    pub host_record: Option<PathBuf>,
    /// Neither read nor write the host record (admit on this run's
    /// calibration alone). Also: SPINDLE_RT_HOST_RECORD=off.
    #[arg(long, conflicts_with = "host_record")]
    pub no_host_record: bool,
    /// Injected clock offsets per node (µs, comma-separated; node 0 is the master).
    #[arg(long, default_value = "0,1500,-800")]
    pub offset_us: String,
    /// Injected clock drifts per node (ppm, comma-separated).
    #[arg(long, default_value = "0,40,-25")]
    pub drift_ppm: String,
    /// Run even if admission rejects (the verdict is still reported).
    #[arg(long)]
    pub force: bool,
    /// Run the dispatchers without their watchdog threads (to measure what
    /// the watchdog costs).
    #[arg(long)]
    pub no_watchdog: bool,
    /// How the members reach each other: shm (one host, shared memory) or
    /// tcp (a connection per pair; loopback unless --addresses is given).
    #[arg(long, default_value = "shm")]
    pub transport: String,
    /// tcp: where each member listens, `ip:port` by rank, comma-separated
    /// (default: free loopback ports).
    #[arg(long)]
    pub addresses: Option<String>,
    /// tcp: run member r inside network namespace r (`ip netns` names,
    /// comma-separated, by rank; needs root). See scripts/rt-netns.sh.
    #[arg(long)]
    pub netns: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

pub fn run(command: RtCommand) -> Result<(), String> {
    match command {
        RtCommand::Ring(args) => ring::ring(args),
        RtCommand::Latency(args) => latency::latency(args),
        RtCommand::Compare(args) => compare::compare(args),
        RtCommand::Clock(args) => clock::clock(args),
        RtCommand::Jitter(args) => jitter::jitter(args),
        RtCommand::Member { rank, spec } => {
            let spec: ScenarioSpec = serde_json::from_str(&spec).map_err(|e| format!("--spec: {e}"))?;
            run_member(&spec, rank).map(|_| ())
        }
    }
}
