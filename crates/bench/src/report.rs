//! Result records of `spindle bench` and `spindle demo`, serialized as JSON.
//! Top-level keys of [`BenchReport`] are a stable interface for scripts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Latency percentiles in nanoseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub samples: u64,
}

impl Percentiles {
    pub fn from_histogram(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            samples: h.len(),
        }
    }
}

/// What one member measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemberResult {
    pub rank: usize,
    pub delivered_msgs: u64,
    pub delivered_bytes: u64,
    /// From the start barrier to the last delivery.
    pub elapsed_ns: u64,
    /// The start barrier and the last delivery, CLOCK_MONOTONIC ns (one
    /// clock for every process of the host: runs that overlap in time,
    /// such as the shards of a `--subgroups` run, are compared on it).
    #[serde(default)]
    pub t0_ns: u64,
    #[serde(default)]
    pub t_last_ns: u64,
    pub delivered_gbps: f64,
    pub delivered_msgs_per_s: f64,
    /// Sum of the payload words of each sender's messages as read on
    /// delivery, by sender rank (the member's own messages only with
    /// `--self-check`).
    pub checksum_by_sender: BTreeMap<usize, u64>,
    /// The checksum of everything this member sent, computed in closed
    /// form as it wrote: every reader of its messages must match it.
    pub sent_checksum: u64,
    /// A hash chain over the delivery sequence (sender, index, length):
    /// equal at every member when they delivered the same messages in one
    /// order (the delivery-log checkers are the rigorous check).
    pub sequence_digest: String,
    /// The member's counters at the end (see `spindle_group::counters`).
    pub counters: BTreeMap<String, u64>,
}

/// The machine a result was measured on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub memory_gib: u64,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| (kb + (1 << 19)) >> 20)
            .unwrap_or(0);
        Machine {
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cpu_model,
            kernel,
            memory_gib,
        }
    }
}

/// One `spindle bench multicast` run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BenchReport {
    pub transport: String,
    pub mode: String,
    pub members: usize,
    pub senders: String,
    pub sender_count: usize,
    /// Payload bytes per message.
    pub size: usize,
    /// Messages per sender.
    pub count: u64,
    pub window: usize,
    /// How a message larger than the slot was taken: "whole" or
    /// "in-place" (`--large-delivery`).
    #[serde(default)]
    pub large_delivery: String,
    pub batching: bool,
    /// Whether senders also read (checksum) their own delivered messages.
    pub self_check: bool,
    /// Whether member r ran pinned to CPU r mod CPUs.
    pub pinned: bool,
    pub idle: String,
    /// Offered rate per sender (messages/s); 0 = as fast as possible.
    pub rate: u64,
    /// Payload bytes delivered to the application per second at the slowest member.
    pub delivered_gbps_min: f64,
    pub delivered_msgs_per_s_min: f64,
    /// Send-commit → delivery at the slowest member (per message max over members).
    pub latency_ns: Percentiles,
    /// Send-commit → delivery at the sender's own member.
    pub latency_own_ns: Percentiles,
    /// Raw shm single-producer ring, same payloads and rules, same run.
    pub baseline_gbps: f64,
    pub baseline_msgs_per_s: f64,
    pub ratio_to_baseline: f64,
    pub member_results: Vec<MemberResult>,
    pub machine: Machine,
    pub unix_time_s: u64,
    pub command: String,
}
