//! `spindle rt jitter`: the dispatcher's release jitter on this machine,
//! alone (no members, no fabric): wake-ups `--period-us` apart with the
//! hybrid sleep-then-spin release, under each setting asked for, so the
//! effect of SCHED_FIFO, the spin window, mlockall and CPU pinning can be
//! measured one at a time.

use crate::rt::scenario::Summary;
use clap::Args;
use serde::Serialize;
use spindle_rt::node::calibrate_release_jitter;
use spindle_rt::os::{drop_rt_priority, pin_to_cpu, request_rt_privileges};

use super::common::{command_line, write_json};
use super::US;
use crate::report::Machine;

#[derive(Args, Debug, Clone)]
pub struct JitterArgs {
    /// Wake-ups per setting.
    #[arg(long, default_value_t = 5_000)]
    pub samples: usize,
    /// Time between wake-ups (µs).
    #[arg(long, default_value_t = 1_000)]
    pub period_us: u64,
    /// Spin windows to try (µs, comma-separated): sleep until this long
    /// before the release, then spin.
    #[arg(long, default_value = "100")]
    pub spin_us: String,
    /// Do not ask for SCHED_FIFO.
    #[arg(long)]
    pub no_fifo: bool,
    /// Also lock memory (mlockall).
    #[arg(long)]
    pub mlock: bool,
    /// Pin the measuring thread to this CPU.
    #[arg(long)]
    pub pin: Option<usize>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
struct JitterRow {
    spin_ns: u64,
    /// Wake-up lateness (ns).
    late_ns: Summary,
    /// The 99.9th percentile (ns).
    p999_ns: u64,
    /// Wake-ups later than 10 µs.
    over_10us: u64,
}

#[derive(Debug, Clone, Serialize)]
struct JitterReport {
    samples: usize,
    period_ns: u64,
    privileges: String,
    fifo_granted: bool,
    memory_locked: bool,
    pinned_cpu: Option<usize>,
    rows: Vec<JitterRow>,
    machine: Machine,
    command: String,
}

pub(super) fn jitter(args: JitterArgs) -> Result<(), String> {
    if !(10..=1_000_000).contains(&args.samples) {
        return Err(format!("--samples {} must be in 10..=1000000", args.samples));
    }
    if !(100..=1_000_000).contains(&args.period_us) {
        return Err(format!("--period-us {} must be in 100..=1000000", args.period_us));
    }
    let spins: Vec<u64> = super::common::parse_list("--spin-us", &args.spin_us)?;
    if let Some(s) = spins.iter().find(|s| **s * 2 > args.period_us) {
        return Err(format!(
            "--spin-us {s} must be at most half of --period-us {}",
            args.period_us
        ));
    }
    if spins.is_empty() {
        return Err("--spin-us: give at least one window".into());
    }
    let a = args.clone();
    let (privileges, fifo, locked, rows) = std::thread::spawn(move || {
        let pinned = a.pin.map(pin_to_cpu);
        let p = request_rt_privileges(!a.no_fifo, 80, a.mlock);
        let rows: Vec<JitterRow> = spins
            .iter()
            .map(|&spin_us| {
                let mut late = calibrate_release_jitter(a.samples, a.period_us * US, spin_us * US);
                late.sort_unstable();
                let p999 = late[((late.len() - 1) as f64 * 0.999).round() as usize];
                JitterRow {
                    spin_ns: spin_us * US,
                    late_ns: Summary::of(&late),
                    p999_ns: p999,
                    over_10us: late.iter().filter(|l| **l > 10 * US).count() as u64,
                }
            })
            .collect();
        drop_rt_priority();
        let mut text = p.describe();
        if let Some(ok) = pinned {
            text += if ok { "; pinned" } else { "; pinning refused" };
        }
        (text, p.sched_fifo.is_ok(), p.memory_locked, rows)
    })
    .join()
    .map_err(|_| "the measuring thread panicked".to_string())?;
    println!(
        "spindle rt jitter: {} wake-ups {} µs apart per setting ({privileges})",
        args.samples, args.period_us
    );
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "spin µs", "p50 ns", "p99 ns", "p99.9 ns", "max ns", "> 10 µs"
    );
    for r in &rows {
        println!(
            "{:>8} {:>9} {:>9} {:>9} {:>10} {:>9}",
            r.spin_ns / US,
            r.late_ns.p50,
            r.late_ns.p99,
            r.p999_ns,
            r.late_ns.max,
            r.over_10us
        );
    }
    let report = JitterReport {
        samples: args.samples,
        period_ns: args.period_us * US,
        privileges,
        fifo_granted: fifo,
        memory_locked: locked,
        pinned_cpu: args.pin,
        rows,
        machine: Machine::detect(),
        command: command_line(),
    };
    write_json(&args.json, &report)
}
