//! The service's configuration: defaults, a small `key = value` file
//! format (a TOML subset: comments with `#`, strings in double quotes,
//! integers with optional `_`), and validation that names the bad value.
//!
//! ```text
//! # spindle kv serve --config kv.toml
//! group = "kv"              # group name (shm file / tcp handshake)
//! transport = "shm"         # or "tcp", or "ofi" / "ofi:<provider>" (libfabric, built
//!                           # with the `ofi` feature; "ofi" is its tcp provider)
//! peers = ""                # tcp, ofi: member addresses, comma-separated
//!                           # (empty: 127.0.0.1, ports port+1 …)
//! key = "spindle-kv"        # tcp, ofi: the group's shared secret: set your own
//! backups = 3               # R: 1..=3 (more allowed, up to 63)
//! spares = 0                # members that replace a dead backup
//! mode = "one-sided"        # or "rpc"
//! durability = "memory"     # acknowledged in every backup's memory; or "disk": after fdatasync
//! bind = "127.0.0.1"
//! port = 6380
//! data_dir = "/var/tmp/spindle-kv"
//! segment_bytes = 2_097_152
//! segments = 4              # per backup, in memory
//! clean_slack_segments = 16 # clean (roll) once an epoch's log is 2 × live + this many segments
//! value_bytes_max = 1_048_576
//! memory_bytes_max = 268_435_456
//! clients_max = 1024       # one more client is told "max number of clients reached"
//! idle_timeout_s = 300      # close a client with no request or reply for this long; 0: never
//! poll_spin_us = 50         # after a round with requests, poll this long before blocking; 0: block at once
//! lease_ms = 400            # the master answers only while a majority renewed its lease within
//!                           # this; tcp: a new master after lease × 5/3 without heartbeats
//! ```

use std::path::PathBuf;

use crate::layout::Durability;
use crate::log::LogGeometry;
use crate::master::Mode;

/// Everything a member of the service needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfig {
    pub group: String,
    pub transport: Transport,
    /// tcp: where member r listens (`peers[r]`); empty: loopback ports
    /// `port + 1 + r`.
    pub peers: Vec<String>,
    /// tcp: the group's shared secret.
    pub key: String,
    pub backups: usize,
    pub spares: usize,
    pub mode: Mode,
    /// When a write is acknowledged: in every backup's memory, or on its disk.
    pub durability: Durability,
    pub bind: String,
    pub port: u16,
    pub data_dir: PathBuf,
    pub geometry: LogGeometry,
    pub value_bytes_max: usize,
    pub memory_bytes_max: usize,
    /// Log cleaning: roll once the epoch's log is longer than twice the
    /// live data plus this many segments ([`crate::node::log_bytes_max`]).
    pub clean_slack_segments: u64,
    pub clients_max: usize,
    /// Close a client that sends no complete request for this long (idle
    /// or a request left half-sent); zero: never.
    pub idle_timeout: std::time::Duration,
    /// How long the server's loop polls without blocking after a round
    /// with events ([`crate::server::ServeOptions::poll_spin_after_work`]).
    pub poll_spin: std::time::Duration,
    /// The master's lease (see the replica crate's `failover` module).
    pub lease: std::time::Duration,
}

/// Which fabric the members use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Shm,
    Tcp,
    /// libfabric (`ofi`: its tcp provider; `ofi:<provider>`: `verbs`,
    /// `efa`, ...), as written; the control plane is tcp on the peers'
    /// addresses, as for `Tcp`.
    Ofi(String),
}

impl Transport {
    pub fn parse(s: &str) -> Result<Transport, String> {
        match s {
            "shm" => Ok(Transport::Shm),
            "tcp" => Ok(Transport::Tcp),
            "ofi" => Ok(Transport::Ofi(s.to_string())),
            ofi if ofi.strip_prefix("ofi:").is_some_and(|p| {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            }) =>
            {
                Ok(Transport::Ofi(s.to_string()))
            }
            other => Err(format!(
                "unknown transport '{other}': expected 'shm', 'tcp', 'ofi' or 'ofi:<provider>' (e.g. ofi:verbs)"
            )),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Ofi(text) => text,
        }
    }
    /// Whether members reach each other over the network (tcp, ofi): a
    /// key and addresses are needed.
    pub fn is_networked(&self) -> bool {
        !matches!(self, Transport::Shm)
    }
    /// The libfabric provider of an ofi transport (`ofi` is `tcp`).
    pub fn ofi_provider(&self) -> Option<&str> {
        match self {
            Transport::Ofi(text) => Some(text.strip_prefix("ofi:").unwrap_or("tcp")),
            _ => None,
        }
    }
}

/// The most `clean_slack_segments` a configuration may ask for.
pub const CLEAN_SLACK_SEGMENTS_MAX: u64 = 4096;
/// The most log bytes the slack may add to an epoch: a backup keeps up to
/// about three epochs on disk, and a new master reads its epoch's
/// segments into memory and replays every record (~220 ns each), so a
/// failover after 1 GiB of slack takes seconds.
pub const CLEAN_SLACK_BYTES_MAX: u64 = 1 << 30;

/// Defaults (the same in code, in the docs above and in `--help`).
pub mod defaults {
    pub const BACKUPS: usize = 3;
    pub const SPARES: usize = 0;
    pub const KEY: &str = "spindle-kv";
    pub const PORT: u16 = 6380;
    pub const SEGMENT_BYTES: usize = 2 << 20;
    pub const SEGMENTS: usize = 4;
    /// See [`crate::node::CLEAN_SLACK_SEGMENTS_DEFAULT`].
    pub const CLEAN_SLACK_SEGMENTS: u64 = crate::node::CLEAN_SLACK_SEGMENTS_DEFAULT;
    pub const VALUE_BYTES_MAX: usize = 1 << 20;
    pub const MEMORY_BYTES_MAX: usize = 256 << 20;
    pub const CLIENTS_MAX: usize = 1024;
    /// Long enough for any client that is alive (pools ping or reconnect),
    /// short enough that stuck clients free their slots.
    pub const IDLE_TIMEOUT_S: u64 = 300;
    /// See [`crate::server::POLL_SPIN_AFTER_WORK_DEFAULT`].
    pub const POLL_SPIN_US: u64 = 50;
}

impl ServiceConfig {
    /// The no-configuration local default: 3 backups on shm.
    pub fn local_default() -> ServiceConfig {
        ServiceConfig {
            group: "kv".into(),
            transport: Transport::Shm,
            peers: Vec::new(),
            key: defaults::KEY.into(),
            backups: defaults::BACKUPS,
            spares: defaults::SPARES,
            mode: Mode::OneSided,
            durability: Durability::Memory,
            bind: "127.0.0.1".into(),
            port: defaults::PORT,
            data_dir: std::env::temp_dir().join("spindle-kv"),
            geometry: LogGeometry {
                segment_bytes: defaults::SEGMENT_BYTES,
                segments_max: defaults::SEGMENTS,
            },
            value_bytes_max: defaults::VALUE_BYTES_MAX,
            memory_bytes_max: defaults::MEMORY_BYTES_MAX,
            clean_slack_segments: defaults::CLEAN_SLACK_SEGMENTS,
            clients_max: defaults::CLIENTS_MAX,
            idle_timeout: std::time::Duration::from_secs(defaults::IDLE_TIMEOUT_S),
            poll_spin: std::time::Duration::from_micros(defaults::POLL_SPIN_US),
            lease: crate::node::LEASE_DEFAULT,
        }
    }

    /// Parse a configuration file's text over the defaults.
    pub fn parse(text: &str) -> Result<ServiceConfig, String> {
        let mut c = ServiceConfig::local_default();
        for (n, raw) in text.lines().enumerate() {
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            let at = |what: String| format!("line {}: {what}", n + 1);
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| at(format!("expected 'key = value', found '{line}'")))?;
            let (key, value) = (key.trim(), value.trim());
            let int = || -> Result<usize, String> {
                value
                    .replace('_', "")
                    .parse::<usize>()
                    .map_err(|_| at(format!("{key} = {value}: expected a non-negative integer")))
            };
            let string = || -> Result<String, String> {
                value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_string)
                    .ok_or_else(|| at(format!("{key} = {value}: expected a string in double quotes")))
            };
            match key {
                "group" => c.group = string()?,
                "backups" => c.backups = int()?,
                "spares" => c.spares = int()?,
                "transport" => c.transport = Transport::parse(&string()?).map_err(at)?,
                "peers" => {
                    c.peers = string()?
                        .split(',')
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "key" => c.key = string()?,
                "mode" => c.mode = Mode::parse(&string()?).map_err(at)?,
                "durability" => c.durability = Durability::parse(&string()?).map_err(at)?,
                "bind" => c.bind = string()?,
                "port" => {
                    c.port = u16::try_from(int()?).map_err(|_| at(format!("port = {value}: expected 0..=65535")))?
                }
                "data_dir" => c.data_dir = PathBuf::from(string()?),
                "segment_bytes" => c.geometry.segment_bytes = int()?,
                "segments" => c.geometry.segments_max = int()?,
                "value_bytes_max" => c.value_bytes_max = int()?,
                "memory_bytes_max" => c.memory_bytes_max = int()?,
                "clean_slack_segments" => c.clean_slack_segments = int()? as u64,
                "clients_max" => c.clients_max = int()?,
                "idle_timeout_s" => c.idle_timeout = std::time::Duration::from_secs(int()? as u64),
                "poll_spin_us" => c.poll_spin = std::time::Duration::from_micros(int()? as u64),
                "lease_ms" => c.lease = std::time::Duration::from_millis(int()? as u64),
                other => return Err(at(format!("unknown key '{other}'"))),
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Check every value; the error names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        spindle_fabric::shm::validate_group_name(&self.group).map_err(|e| format!("group: {e}"))?;
        if self.backups == 0 || self.backups >= spindle_fabric::MEMBERS_MAX {
            return Err(format!("backups = {}: expected 1..=63", self.backups));
        }
        if self.members() > spindle_fabric::MEMBERS_MAX {
            return Err(format!(
                "backups = {} and spares = {}: at most {} members in all",
                self.backups,
                self.spares,
                spindle_fabric::MEMBERS_MAX
            ));
        }
        if self.transport.is_networked() {
            if self.key.is_empty() {
                return Err(format!(
                    "key = \"\": a {} group needs a shared secret",
                    self.transport.as_str()
                ));
            }
            if !self.peers.is_empty() && self.peers.len() != self.members() {
                return Err(format!(
                    "peers: {} addresses for {} members (1 master + {} backups + {} spares)",
                    self.peers.len(),
                    self.members(),
                    self.backups,
                    self.spares
                ));
            }
            self.tcp_addresses()?;
        }
        if self.value_bytes_max == 0 {
            return Err("value_bytes_max = 0: expected at least 1".into());
        }
        self.geometry.validate(self.value_bytes_max)?;
        if self.clients_max == 0 || self.clients_max > 65_536 {
            return Err(format!("clients_max = {}: expected 1..=65536", self.clients_max));
        }
        if self.idle_timeout > std::time::Duration::from_secs(365 * 86_400) {
            return Err(format!(
                "idle_timeout_s = {}: expected 0 (never) ..= 31536000 (a year)",
                self.idle_timeout.as_secs()
            ));
        }
        if self.poll_spin > std::time::Duration::from_micros(POLL_SPIN_US_MAX) {
            return Err(format!(
                "poll_spin_us = {}: expected 0 (block at once) ..= {POLL_SPIN_US_MAX}",
                self.poll_spin.as_micros()
            ));
        }
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&(self.lease.as_millis() as u64)) {
            return Err(format!(
                "lease_ms = {}: expected {LEASE_MS_MIN}..={LEASE_MS_MAX}",
                self.lease.as_millis()
            ));
        }
        if !(1..=CLEAN_SLACK_SEGMENTS_MAX).contains(&self.clean_slack_segments) {
            return Err(format!(
                "clean_slack_segments = {}: expected 1..={CLEAN_SLACK_SEGMENTS_MAX} (segments of log \
                 beyond twice the live data before the log is cleaned)",
                self.clean_slack_segments
            ));
        }
        let slack_bytes = self
            .clean_slack_segments
            .saturating_mul(self.geometry.segment_bytes as u64);
        if slack_bytes > CLEAN_SLACK_BYTES_MAX {
            return Err(format!(
                "clean_slack_segments = {} with segment_bytes = {}: {slack_bytes} bytes of log beyond the \
                 live data, more than {CLEAN_SLACK_BYTES_MAX} (a failover replays all of it)",
                self.clean_slack_segments, self.geometry.segment_bytes
            ));
        }
        if self.memory_bytes_max < 1024 {
            return Err(format!(
                "memory_bytes_max = {}: expected at least 1024",
                self.memory_bytes_max
            ));
        }
        if self.bind.parse::<std::net::IpAddr>().is_err() {
            return Err(format!(
                "bind = \"{}\": expected an IP address such as 127.0.0.1",
                self.bind
            ));
        }
        Ok(())
    }

    /// tcp: every member's address.
    pub fn tcp_addresses(&self) -> Result<Vec<std::net::SocketAddr>, String> {
        if self.peers.is_empty() {
            let ip: std::net::IpAddr = self
                .bind
                .parse()
                .map_err(|_| format!("bind = \"{}\": expected an IP address", self.bind))?;
            return (0..self.members())
                .map(|r| {
                    let port = self.port as usize + 1 + r;
                    u16::try_from(port)
                        .map(|p| std::net::SocketAddr::new(ip, p))
                        .map_err(|_| format!("port = {}: member {r}'s tcp port {port} is above 65535", self.port))
                })
                .collect();
        }
        self.peers
            .iter()
            .map(|p| {
                p.parse()
                    .map_err(|_| format!("peers: '{p}' is not an address such as 10.0.0.1:7381"))
            })
            .collect()
    }

    /// The configuration as file text (parses back to itself).
    pub fn to_text(&self) -> String {
        format!("durability = \"{}\"\n", self.durability.as_str()) + &self.to_text_but_durability()
    }

    fn to_text_but_durability(&self) -> String {
        format!(
            "group = \"{}\"\ntransport = \"{}\"\npeers = \"{}\"\nkey = \"{}\"\nspares = {}\nbackups = {}\nmode = \"{}\"\nbind = \"{}\"\nport = {}\ndata_dir = \"{}\"\nsegment_bytes = {}\nsegments = {}\nvalue_bytes_max = {}\nmemory_bytes_max = {}\nclean_slack_segments = {}\nclients_max = {}\nidle_timeout_s = {}\npoll_spin_us = {}\nlease_ms = {}\n",
            self.group,
            self.transport.as_str(),
            self.peers.join(","),
            self.key,
            self.spares,
            self.backups,
            self.mode.as_str(),
            self.bind,
            self.port,
            self.data_dir.display(),
            self.geometry.segment_bytes,
            self.geometry.segments_max,
            self.value_bytes_max,
            self.memory_bytes_max,
            self.clean_slack_segments,
            self.clients_max,
            self.idle_timeout.as_secs(),
            self.poll_spin.as_micros(),
            self.lease.as_millis()
        )
    }

    /// Members of the group: the master, its backups and the spares.
    /// The configuration of one member node of this service: its
    /// replication settings, the default idle strategy, and `join_timeout`
    /// to wait for the other members.
    pub fn node_config(&self, join_timeout: std::time::Duration) -> crate::node::NodeConfig {
        crate::node::NodeConfig {
            group: self.group.clone(),
            members: self.members(),
            backups: self.backups,
            mode: self.mode,
            geometry: self.geometry,
            value_bytes_max: self.value_bytes_max,
            memory_bytes_max: self.memory_bytes_max,
            clean_slack_segments: self.clean_slack_segments,
            data_dir: self.data_dir.clone(),
            idle: spindle_runtime::IdleStrategy::DEFAULT_BACKOFF,
            join_timeout,
            lease: self.lease,
        }
    }

    pub fn members(&self) -> usize {
        self.backups + 1 + self.spares
    }
}

/// Bounds of `lease_ms`: heartbeats every lease/16 need at least a few
/// ms; a lease over a minute makes a failover take minutes.
pub const LEASE_MS_MIN: u64 = 50;
pub const LEASE_MS_MAX: u64 = 60_000;
/// Longest `poll_spin_us`: 10 ms of polling after each round is already
/// a core kept busy by any client that sends more often than that.
pub const POLL_SPIN_US_MAX: u64 = 10_000;

fn strip_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let c = ServiceConfig::parse(
            "group = \"t1\" # name\nbackups = 2\nmode = \"rpc\"\nport = 7000\nsegment_bytes = 4_194_304\n",
        )
        .unwrap();
        assert_eq!(
            (c.group.as_str(), c.backups, c.mode, c.port),
            ("t1", 2, Mode::Rpc, 7000)
        );
        assert_eq!(c.geometry.segment_bytes, 4 << 20);
        assert!(ServiceConfig::parse("backups = 0").unwrap_err().contains("backups = 0"));
        assert!(ServiceConfig::parse("mode = \"udp\"").unwrap_err().contains("udp"));
        assert!(ServiceConfig::parse("colour = 3")
            .unwrap_err()
            .contains("unknown key 'colour'"));
        assert!(ServiceConfig::parse("segment_bytes = 4096")
            .unwrap_err()
            .contains("segment_bytes 4096"));
        ServiceConfig::local_default().validate().unwrap();
        let idle = ServiceConfig::parse("idle_timeout_s = 0\nclients_max = 8\n").unwrap();
        assert_eq!((idle.idle_timeout, idle.clients_max), (std::time::Duration::ZERO, 8));
        assert_eq!(ServiceConfig::parse(&idle.to_text()).unwrap(), idle);
        assert!(ServiceConfig::parse("idle_timeout_s = 99999999999")
            .unwrap_err()
            .contains("idle_timeout_s = 99999999999"));
        let spin = ServiceConfig::parse("poll_spin_us = 0").unwrap();
        assert_eq!(spin.poll_spin, std::time::Duration::ZERO);
        assert_eq!(ServiceConfig::parse(&spin.to_text()).unwrap(), spin);
        assert!(ServiceConfig::parse("poll_spin_us = 10001")
            .unwrap_err()
            .contains("poll_spin_us = 10001: expected 0 (block at once) ..= 10000"));
        assert!(ServiceConfig::parse("clients_max = 0")
            .unwrap_err()
            .contains("clients_max = 0"));
        assert_eq!(ServiceConfig::parse(&c.to_text()).unwrap(), c, "to_text round-trips");
        let t = ServiceConfig::parse("transport = \"tcp\"\nspares = 1\nport = 7000\n").unwrap();
        assert_eq!(t.members(), 5);
        assert_eq!(t.tcp_addresses().unwrap()[4].port(), 7005);
        assert_eq!(
            ServiceConfig::parse(&t.to_text()).unwrap(),
            t,
            "tcp settings round-trip"
        );
        assert!(ServiceConfig::parse("transport = \"tcp\"\npeers = \"127.0.0.1:1\"")
            .unwrap_err()
            .contains("1 addresses for 4 members"));
        assert!(ServiceConfig::parse("transport = \"udp\"")
            .unwrap_err()
            .contains("'udp'"));
    }

    #[test]
    fn clean_slack_parses_round_trips_reaches_the_node_and_refuses_zero() {
        assert_eq!(
            ServiceConfig::local_default().clean_slack_segments,
            crate::node::CLEAN_SLACK_SEGMENTS_DEFAULT
        );
        let c = ServiceConfig::parse("clean_slack_segments = 4\n").unwrap();
        assert_eq!(c.clean_slack_segments, 4);
        assert_eq!(ServiceConfig::parse(&c.to_text()).unwrap(), c, "to_text keeps it");
        assert_eq!(c.node_config(std::time::Duration::from_secs(1)).clean_slack_segments, 4);
        for bad in ["0", "4097"] {
            let e = ServiceConfig::parse(&format!("clean_slack_segments = {bad}\n")).unwrap_err();
            assert!(
                e.contains(&format!("clean_slack_segments = {bad}")) && e.contains("1..=4096"),
                "{e}"
            );
        }
        let e = ServiceConfig::parse("clean_slack_segments = 1024\n").unwrap_err();
        assert!(
            e.contains("clean_slack_segments = 1024 with segment_bytes = 2097152"),
            "{e}"
        );
        ServiceConfig::parse("clean_slack_segments = 512\n").expect("512 × 2 MiB = 1 GiB is allowed");
    }

    #[test]
    fn ofi_transport_parses_round_trips_and_names_a_bad_provider() {
        let c = ServiceConfig::parse("transport = \"ofi\"\nspares = 1\n").unwrap();
        assert_eq!(c.transport, Transport::Ofi("ofi".into()));
        assert_eq!(c.transport.ofi_provider(), Some("tcp"));
        assert_eq!(
            c.tcp_addresses().unwrap().len(),
            c.members(),
            "loopback addresses, as for tcp"
        );
        let v = ServiceConfig::parse("transport = \"ofi:verbs\"\n").unwrap();
        assert_eq!(v.transport.ofi_provider(), Some("verbs"));
        assert_eq!(
            ServiceConfig::parse(&v.to_text()).unwrap(),
            v,
            "to_text keeps the provider"
        );
        for bad in ["ofi:", "ofi:ver bs", "ofi;verbs"] {
            let e = ServiceConfig::parse(&format!("transport = \"{bad}\"\n")).unwrap_err();
            assert!(e.contains(bad) && e.contains("ofi:<provider>"), "{e}");
        }
        let e = ServiceConfig::parse("transport = \"ofi\"\nkey = \"\"\n").unwrap_err();
        assert!(e.contains("ofi group needs a shared secret"), "{e}");
    }

    #[test]
    fn durability_parses_round_trips_and_names_a_bad_value() {
        assert_eq!(
            ServiceConfig::local_default().durability,
            Durability::Memory,
            "memory is the default"
        );
        let c = ServiceConfig::parse("durability = \"disk\"\n").unwrap();
        assert_eq!(c.durability, Durability::Disk);
        assert_eq!(
            ServiceConfig::parse(&c.to_text()).unwrap(),
            c,
            "to_text keeps durability"
        );
        let e = ServiceConfig::parse("durability = \"fsync\"").unwrap_err();
        assert!(
            e.contains("durability") && e.contains("\"memory\" or \"disk\"") && e.contains("fsync"),
            "{e}"
        );
    }
}
