//! The group configuration file (one TOML file per group, the same file at
//! every member; every key is documented in docs/config.md, with a
//! commented example in examples/group.toml). `spindle run` reads it, and
//! so can any program: [`GroupFile::load`], then [`GroupFile::builder`].
//!
//! ```toml
//! [group]
//! name = "orders"
//! transport = "tcp"
//! key_file = "orders.key"
//!
//! [[members]]
//! id = 0
//! address = "10.0.0.1:7100"
//! ```
//!
//! Parsing and validation are pure ([`GroupFile::parse`] takes the text,
//! the directory relative paths start from, and the environment as a
//! list); [`GroupFile::load`] does the reading. Every error
//! ([`ConfigError`]) names the key (or environment variable) and the bad
//! value.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use spindle_group::config::defaults;
use spindle_group::{DeliveryMode, SenderSet};
use spindle_runtime::IdleStrategy;

use crate::builder::GroupBuilder;
use crate::transport::{TcpTransport, Transport};

/// Why a group file (or a value in it) was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A key, value or environment override is invalid; the message names
    /// it and the bad value (and the file, when there is one).
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    fn in_file(path: &Path, message: String) -> ConfigError {
        ConfigError::Invalid(format!("config {}: {message}", path.display()))
    }
}

impl From<String> for ConfigError {
    fn from(message: String) -> ConfigError {
        ConfigError::Invalid(message)
    }
}

/// Keys of the `[group]` table, with their defaults (as TOML text; `None`:
/// required or optional without a default).
pub const GROUP_KEYS: [(&str, Option<&str>); 22] = [
    ("name", None),
    ("transport", Some("\"tcp\"")),
    ("mode", Some("\"ordered\"")),
    ("senders", Some("\"all\"")),
    ("window_slots", Some("1024")),
    ("slot_payload_max", Some("10240")),
    ("large_message_max_bytes", Some("1073741824")),
    ("key_file", None),
    ("join_timeout_ms", Some("10000")),
    ("peer_timeout_ms", Some("3000")),
    ("idle", Some("\"auto\"")),
    ("batching", Some("true")),
    ("check_source_addr", Some("true")),
    ("handshake_timeout_ms", Some("5000")),
    ("handshakes_pending_max", Some("1024")),
    ("tls_cert", None),
    ("tls_key", None),
    ("tls_ca", None),
    ("membership", Some("true")),
    ("suspect_timeout_ms", Some("500")),
    ("persist_dir", None),
    ("compact_log_bytes", Some("0")),
];
const MEMBER_KEYS: [&str; 3] = ["id", "address", "listen"];
/// Key files shorter than this are refused (a guessable key protects nothing).
pub const KEY_BYTES_MIN: usize = 16;
const KEY_BYTES_MAX: usize = 4096;

const _: () = assert!(defaults::WINDOW_SLOTS == 1024 && defaults::SLOT_PAYLOAD_MAX == 10_240);
const _: () = assert!(defaults::LARGE_MESSAGE_MAX_BYTES == 1_073_741_824);
const _: () = assert!(defaults::JOIN_TIMEOUT_MS == 10_000);
const _: () = assert!(defaults::MEMBERSHIP && defaults::SUSPECT_TIMEOUT_MS == 500);

/// One member's entry.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberEntry {
    /// The member's id, which is its rank in the group (`0..members`).
    pub id: usize,
    /// `host:port` where it listens and the others dial it.
    pub address: String,
    /// Bind here instead (e.g. `0.0.0.0:7100`).
    pub listen: Option<String>,
}

/// The TLS files of a tcp group (paths resolved against the file's
/// directory).
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    /// This member's certificate chain (PEM).
    pub cert: PathBuf,
    /// This member's private key (PEM, mode 0600).
    pub key: PathBuf,
    /// The group's CA certificate (PEM): peers must present a certificate it signed.
    pub ca: PathBuf,
}

/// A validated group configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupFile {
    /// `group.name`: the group's name (1..=48 of `[A-Za-z0-9_.-]`).
    pub name: String,
    /// `group.transport`: `"tcp"`, `"shm"`, or `"ofi"` / `"ofi:<provider>"`
    /// (libfabric; `"ofi"` is its `tcp` provider; needs the `ofi` feature).
    pub transport: String,
    /// `group.mode`: ordered (atomic multicast), unordered, or persistent
    /// (ordered, delivered once on every member's disk).
    pub mode: DeliveryMode,
    /// `group.persist_dir`: where persistent mode keeps each member's log,
    /// resolved against the file's directory (required by, and only
    /// allowed with, `mode = "persistent"`).
    pub persist_dir: Option<PathBuf>,
    /// `group.compact_log_bytes`: persistent mode compacts a member's log
    /// to the application's snapshot every this many bytes (0: never).
    pub compact_log_bytes: u64,
    /// `group.senders`: which members send.
    pub senders: SenderSet,
    /// `group.window_slots`: slots in each sender's ring.
    pub window_slots: usize,
    /// `group.slot_payload_max`: the largest message a slot carries, bytes.
    pub slot_payload_max: usize,
    /// `group.large_message_max_bytes`: the largest message sent as
    /// fragments (`Sender::send_large`), bytes.
    pub large_message_max_bytes: u64,
    /// `group.key_file`: the group key (tcp), resolved against the file's directory.
    pub key_file: Option<PathBuf>,
    /// `group.join_timeout_ms`: how long a member waits for the others at start.
    pub join_timeout_ms: u64,
    /// `group.peer_timeout_ms`: a tcp peer silent this long is gone.
    pub peer_timeout_ms: u64,
    /// `group.idle`: the idle strategy (`park`, `backoff`, `spin`; `auto` resolved).
    pub idle: String,
    /// `group.batching`: the Spindle batching techniques (off only to measure them).
    pub batching: bool,
    /// tcp: refuse a connection whose source address is not the configured
    /// address of the member id it claims (off behind NAT).
    pub check_source_addr: bool,
    /// `group.handshake_timeout_ms`: tcp: how long one connection's
    /// handshake may take (a stranger's connection is closed after it).
    pub handshake_timeout_ms: u64,
    /// `group.handshakes_pending_max`: tcp: accepted connections in
    /// handshake at once, at most (over it the oldest is closed).
    pub handshakes_pending_max: usize,
    /// tcp: TLS with these PEM files (certificate chain, private key, group
    /// CA), all three or none.
    pub tls: Option<TlsFiles>,
    /// Membership changes (view changes) on, or a static group.
    pub membership: bool,
    /// A member whose heartbeat stalls this long is suspected.
    pub suspect_timeout_ms: u64,
    /// By id: `members[i].id == i`.
    pub members: Vec<MemberEntry>,
    /// `[[subgroups]]`: the subgroups the members are laid out into
    /// (`GroupBuilder::join_sharded`; docs/subgroups.md). Empty: none.
    pub subgroups: Vec<spindle_group::subgroup::SubgroupSpec>,
}

impl GroupFile {
    /// Read `path` and apply the process environment's `SPINDLE_*`
    /// overrides.
    pub fn load(path: impl AsRef<Path>) -> Result<GroupFile, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("SPINDLE_")).collect();
        GroupFile::parse(&text, &base, &env).map_err(|e| ConfigError::in_file(path, e.to_string()))
    }

    /// A [`GroupBuilder`] for member `id` of this group: every setting of
    /// the file applied (transport, addresses, key, TLS, timeouts), ready
    /// for `.join()` or more settings. Reads the key and TLS files.
    pub fn builder(&self, id: usize) -> Result<GroupBuilder, ConfigError> {
        let rank = self.rank_of(id)?;
        let config = self.group_config()?;
        let transport = match self.transport.as_str() {
            "shm" => Transport::Shm,
            t if is_ofi(t) => Transport::Ofi(crate::transport::OfiTransport {
                tcp: self.tcp_transport(rank)?,
                provider: t.strip_prefix("ofi:").unwrap_or("tcp").to_string(),
            }),
            _ => Transport::Tcp(self.tcp_transport(rank)?),
        };
        let mut builder = GroupBuilder::from_config(config).rank(rank).transport(transport);
        for spec in &self.subgroups {
            builder = builder.subgroup(spec.clone());
        }
        Ok(builder)
    }

    fn tcp_transport(&self, rank: usize) -> Result<TcpTransport, ConfigError> {
        let members = self
            .members
            .iter()
            .map(|m| resolve(&m.address).map_err(|e| format!("members[id = {}].address: {e}", m.id)))
            .collect::<Result<Vec<_>, _>>()?;
        let listen = match &self.members[rank].listen {
            Some(l) => Some(resolve(l).map_err(|e| format!("members[id = {rank}].listen: {e}"))?),
            None => None,
        };
        self.check_tls_files()?;
        Ok(TcpTransport {
            members,
            key: self.read_key()?,
            tls: self.tls.clone(),
            listen,
            check_source_addr: self.check_source_addr,
            peer_timeout: Duration::from_millis(self.peer_timeout_ms),
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
            handshakes_pending_max: self.handshakes_pending_max,
        })
    }

    /// Parse and validate. `env` overrides: `SPINDLE_GROUP_<KEY>` for a
    /// `[group]` key, `SPINDLE_MEMBER_<ID>_ADDRESS` / `_LISTEN` for a
    /// member.
    pub fn parse(text: &str, base_dir: &Path, env: &[(String, String)]) -> Result<GroupFile, ConfigError> {
        GroupFile::parse_text(text, base_dir, env).map_err(ConfigError::Invalid)
    }

    fn parse_text(text: &str, base_dir: &Path, env: &[(String, String)]) -> Result<GroupFile, String> {
        let mut root: toml::Table = text.parse().map_err(|e: toml::de::Error| format!("TOML syntax: {e}"))?;
        if let Some(k) = root
            .keys()
            .find(|k| *k != "group" && *k != "members" && *k != "subgroups")
        {
            return Err(format!(
                "unknown top-level key '{k}': expected [group], [[members]] and [[subgroups]]"
            ));
        }
        let mut group = match root.remove("group") {
            Some(toml::Value::Table(t)) => t,
            Some(other) => return Err(format!("'group' must be a table, found {}", other.type_str())),
            None => return Err("missing [group] table".into()),
        };
        if let Some(k) = group.keys().find(|k| !GROUP_KEYS.iter().any(|(g, _)| g == k)) {
            let known: Vec<&str> = GROUP_KEYS.iter().map(|(k, _)| *k).collect();
            return Err(format!("unknown key group.{k}: known keys are {}", known.join(", ")));
        }
        let mut members = parse_members(root.remove("members"))?;
        let subgroups = parse_subgroups(root.remove("subgroups"), members.len())?;
        apply_env(&mut group, &mut members, env)?;
        check_distinct_addresses(&members)?;
        let get = |k: &str| -> Option<toml::Value> {
            group.get(k).cloned().or_else(|| {
                GROUP_KEYS
                    .iter()
                    .find(|(g, _)| *g == k)
                    .and_then(|(_, d)| *d)
                    .map(|d| d.parse::<toml::Value>().expect("defaults are TOML"))
            })
        };
        let name = string(&get("name"), "group.name")?.ok_or("missing key group.name")?;
        spindle_fabric::shm::validate_group_name(&name).map_err(|e| format!("group.name = \"{name}\": {e}"))?;
        for (i, spec) in subgroups.iter().enumerate() {
            let last = spindle_group::subgroup::shard_group_name(&name, &spec.name, spec.shards - 1);
            spindle_fabric::shm::validate_group_name(&last).map_err(|e| {
                format!("subgroups[{i}]: its shards' group names ({last}) are not valid group names: {e}")
            })?;
        }
        let transport = string(&get("transport"), "group.transport")?.expect("default");
        if transport != "tcp" && transport != "shm" && !is_ofi(&transport) {
            return Err(format!(
                "group.transport = \"{transport}\": expected \"tcp\", \"shm\", \"ofi\" or \"ofi:<provider>\""
            ));
        }
        let mode_text = string(&get("mode"), "group.mode")?.expect("default");
        let mode = DeliveryMode::parse(&mode_text).map_err(|e| format!("group.mode = \"{mode_text}\": {e}"))?;
        let senders = parse_senders(&get("senders").expect("default"), members.len())?;
        let window_slots = integer(&get("window_slots"), "group.window_slots")?;
        let slot_payload_max = integer(&get("slot_payload_max"), "group.slot_payload_max")?;
        let large_message_max_bytes = integer(&get("large_message_max_bytes"), "group.large_message_max_bytes")? as u64;
        let compact_log_bytes = integer(&get("compact_log_bytes"), "group.compact_log_bytes")? as u64;
        let join_timeout_ms = integer(&get("join_timeout_ms"), "group.join_timeout_ms")? as u64;
        let peer_timeout_ms = integer(&get("peer_timeout_ms"), "group.peer_timeout_ms")? as u64;
        let idle = match string(&get("idle"), "group.idle")?.expect("default").as_str() {
            // Blocked threads wake at once on tcp; yielding ones wait for a slice.
            "auto" if transport == "tcp" || is_ofi(&transport) => "park".to_string(),
            "auto" => "backoff".to_string(),
            other => other.to_string(),
        };
        parse_idle(&idle).map_err(|e| format!("group.idle = \"{idle}\": {e}"))?;
        let batching = match get("batching") {
            Some(toml::Value::Boolean(b)) => b,
            other => return Err(format!("group.batching = {}: expected true or false", show(&other))),
        };
        let check_source_addr = match get("check_source_addr") {
            Some(toml::Value::Boolean(b)) => b,
            other => {
                return Err(format!(
                    "group.check_source_addr = {}: expected true or false",
                    show(&other)
                ))
            }
        };
        let handshake_timeout_ms = integer(&get("handshake_timeout_ms"), "group.handshake_timeout_ms")? as u64;
        if !(10..=3_600_000).contains(&handshake_timeout_ms) {
            return Err(format!(
                "group.handshake_timeout_ms = {handshake_timeout_ms}: must be in 10..=3600000"
            ));
        }
        let handshakes_pending_max = integer(&get("handshakes_pending_max"), "group.handshakes_pending_max")?;
        if !(1..=spindle_fabric::tcp::HANDSHAKES_PENDING_MAX).contains(&handshakes_pending_max) {
            return Err(format!(
                "group.handshakes_pending_max = {handshakes_pending_max}: must be in 1..={}",
                spindle_fabric::tcp::HANDSHAKES_PENDING_MAX
            ));
        }
        let membership = match get("membership") {
            Some(toml::Value::Boolean(b)) => b,
            other => return Err(format!("group.membership = {}: expected true or false", show(&other))),
        };
        let suspect_timeout_ms = integer(&get("suspect_timeout_ms"), "group.suspect_timeout_ms")? as u64;
        let tls_paths = [
            string(&get("tls_cert"), "group.tls_cert")?,
            string(&get("tls_key"), "group.tls_key")?,
            string(&get("tls_ca"), "group.tls_ca")?,
        ];
        let tls = match tls_paths {
            [Some(cert), Some(key), Some(ca)] => Some(TlsFiles {
                cert: base_dir.join(cert),
                key: base_dir.join(key),
                ca: base_dir.join(ca),
            }),
            [None, None, None] => None,
            [cert, key, ca] => {
                let missing: Vec<&str> = [("tls_cert", &cert), ("tls_key", &key), ("tls_ca", &ca)]
                    .iter()
                    .filter(|(_, v)| v.is_none())
                    .map(|(k, _)| *k)
                    .collect();
                return Err(format!(
                    "TLS needs group.tls_cert, group.tls_key and group.tls_ca together; missing: group.{}",
                    missing.join(", group.")
                ));
            }
        };
        let key_file = string(&get("key_file"), "group.key_file")?.map(|k| base_dir.join(k));
        let persist_dir = string(&get("persist_dir"), "group.persist_dir")?.map(|d| base_dir.join(d));
        match (mode, &persist_dir) {
            (DeliveryMode::Persistent, None) => {
                return Err(
                    "group.mode = \"persistent\" needs group.persist_dir (the directory for the members' logs)"
                        .to_string(),
                )
            }
            (DeliveryMode::Ordered | DeliveryMode::Unordered, Some(d)) => {
                return Err(format!(
                    "group.persist_dir = {}: only used with group.mode = \"persistent\" (mode is \"{mode_text}\")",
                    d.display()
                ))
            }
            _ => {}
        }
        if transport == "tcp" || is_ofi(&transport) {
            if key_file.is_none() {
                return Err(format!(
                    "missing key group.key_file: a {transport} group needs a shared key (see docs/config.md)"
                ));
            }
            for m in &members {
                if m.address.is_empty() {
                    return Err(format!(
                        "members[id = {}].address is missing (tcp and ofi need host:port)",
                        m.id
                    ));
                }
            }
        }
        if peer_timeout_ms < 100 {
            return Err(format!(
                "group.peer_timeout_ms = {peer_timeout_ms}: must be at least 100"
            ));
        }
        let file = GroupFile {
            name,
            transport,
            mode,
            persist_dir,
            compact_log_bytes,
            senders,
            window_slots,
            slot_payload_max,
            large_message_max_bytes,
            key_file,
            join_timeout_ms,
            peer_timeout_ms,
            idle,
            batching,
            check_source_addr,
            handshake_timeout_ms,
            handshakes_pending_max,
            tls,
            membership,
            suspect_timeout_ms,
            members,
            subgroups,
        };
        file.group_config_text()
            .map_err(|e| e.replace("invalid group configuration: ", ""))?;
        Ok(file)
    }

    /// The group layer's configuration (validated there too).
    pub fn group_config(&self) -> Result<spindle_group::GroupConfig, ConfigError> {
        self.group_config_text().map_err(ConfigError::Invalid)
    }

    fn group_config_text(&self) -> Result<spindle_group::GroupConfig, String> {
        let mut c = spindle_group::GroupConfig::new(&self.name, self.members.len());
        c.senders = self.senders.clone();
        c.mode = self.mode;
        c.persist_dir = self.persist_dir.clone();
        c.compact_log_bytes = self.compact_log_bytes;
        c.window_slots = self.window_slots;
        c.slot_payload_max = self.slot_payload_max;
        c.large_message_max_bytes = self.large_message_max_bytes;
        c.batching = self.batching;
        c.idle = parse_idle(&self.idle).map_err(|e| e.to_string())?;
        c.join_timeout = std::time::Duration::from_millis(self.join_timeout_ms);
        c.membership = self.membership;
        c.suspect_timeout = std::time::Duration::from_millis(self.suspect_timeout_ms);
        c.validate().map_err(|e| {
            let text = e.to_string();
            // Name the file's keys, not the API's fields.
            text.replace("window_slots =", "group.window_slots =")
                .replace("slot_payload_max =", "group.slot_payload_max =")
                .replace("large_message_max_bytes =", "group.large_message_max_bytes =")
                .replace("compact_log_bytes =", "group.compact_log_bytes =")
                .replace("senders:", "group.senders:")
                .replace("suspect_timeout =", "group.suspect_timeout_ms =")
        })?;
        Ok(c)
    }

    /// The group key from `key_file`: its bytes without surrounding
    /// whitespace; the file must be readable by its owner only.
    pub fn read_key(&self) -> Result<Vec<u8>, ConfigError> {
        self.read_key_text().map_err(ConfigError::Invalid)
    }

    fn read_key_text(&self) -> Result<Vec<u8>, String> {
        let path = self.key_file.as_ref().ok_or("group.key_file is not set")?;
        let meta = std::fs::metadata(path).map_err(|e| format!("group.key_file = {}: {e}", path.display()))?;
        use std::os::unix::fs::MetadataExt;
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "group.key_file = {}: mode {:o} lets others read the group key; chmod 600 it",
                path.display(),
                meta.mode() & 0o777
            ));
        }
        if meta.len() > KEY_BYTES_MAX as u64 {
            return Err(format!(
                "group.key_file = {}: {} bytes, at most {KEY_BYTES_MAX}",
                path.display(),
                meta.len()
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("group.key_file = {}: {e}", path.display()))?;
        let key = bytes.trim_ascii().to_vec();
        if key.len() < KEY_BYTES_MIN {
            return Err(format!(
                "group.key_file = {}: the key has {} bytes, at least {KEY_BYTES_MIN} are needed (e.g. `head -c 32 /dev/urandom | xxd -p -c 64 > FILE`)",
                path.display(),
                key.len()
            ));
        }
        Ok(key)
    }

    /// Make `key_file` if it does not exist yet: 32 random bytes (from
    /// `/dev/urandom`) as 64 hex digits, mode 0600. The file is written
    /// aside and linked into place, so members that start at once on one
    /// host all read the same whole key. Returns whether it made the file.
    pub fn create_key_if_missing(&self) -> Result<bool, ConfigError> {
        use std::io::{Read, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.key_file.as_ref().ok_or("group.key_file is not set".to_string())?;
        if path.exists() {
            return Ok(false);
        }
        let io = |what: &str, e: std::io::Error| {
            ConfigError::Invalid(format!("group.key_file = {}: {what}: {e}", path.display()))
        };
        let mut random = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .map_err(|e| io("read /dev/urandom", e))?;
        let aside = path.with_extension(format!("new-{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&aside)
            .and_then(|mut f| f.write_all(hex_encode(&random).as_bytes()));
        let linked = written.and_then(|()| std::fs::hard_link(&aside, path));
        let _ = std::fs::remove_file(&aside);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io("create", e)),
        }
    }

    /// Check the TLS key file's mode (like `key_file`: no access for group
    /// or others) and that the three files are readable.
    pub fn check_tls_files(&self) -> Result<(), ConfigError> {
        self.check_tls_files_text().map_err(ConfigError::Invalid)
    }

    fn check_tls_files_text(&self) -> Result<(), String> {
        let Some(tls) = &self.tls else { return Ok(()) };
        for (name, path) in [("tls_cert", &tls.cert), ("tls_key", &tls.key), ("tls_ca", &tls.ca)] {
            let meta = std::fs::metadata(path).map_err(|e| format!("group.{name} = {}: {e}", path.display()))?;
            use std::os::unix::fs::MetadataExt;
            if name == "tls_key" && meta.mode() & 0o077 != 0 {
                return Err(format!(
                    "group.tls_key = {}: mode {:o} lets others read the private key; chmod 600 it",
                    path.display(),
                    meta.mode() & 0o777
                ));
            }
        }
        Ok(())
    }

    /// The rank of member `id`, or an error listing the ids.
    pub fn rank_of(&self, id: usize) -> Result<usize, ConfigError> {
        if id < self.members.len() {
            Ok(id)
        } else {
            Err(ConfigError::Invalid(format!(
                "member {id} is not in the configuration (its members are ids 0..={})",
                self.members.len() - 1
            )))
        }
    }
}

fn parse_members(value: Option<toml::Value>) -> Result<Vec<MemberEntry>, String> {
    let list = match value {
        Some(toml::Value::Array(a)) => a,
        Some(other) => {
            return Err(format!(
                "'members' must be an array of tables ([[members]]), found {}",
                other.type_str()
            ))
        }
        None => return Err("missing [[members]]: list every member with its id and address".into()),
    };
    if list.is_empty() || list.len() > spindle_fabric::MEMBERS_MAX {
        return Err(format!(
            "{} members listed; a group has 1..={}",
            list.len(),
            spindle_fabric::MEMBERS_MAX
        ));
    }
    let mut members: Vec<Option<MemberEntry>> = vec![None; list.len()];
    for (i, entry) in list.into_iter().enumerate() {
        let toml::Value::Table(t) = entry else {
            return Err(format!("members[{i}] must be a table"));
        };
        if let Some(k) = t.keys().find(|k| !MEMBER_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown key members[{i}].{k}: known keys are {}",
                MEMBER_KEYS.join(", ")
            ));
        }
        let id = integer(&t.get("id").cloned(), &format!("members[{i}].id"))?;
        if id >= members.len() {
            return Err(format!(
                "members[{i}].id = {id}: ids must be 0..={} (one per member, no gaps)",
                members.len() - 1
            ));
        }
        if members[id].is_some() {
            return Err(format!("members[{i}].id = {id}: two members have this id"));
        }
        let address = string(&t.get("address").cloned(), &format!("members[{i}].address"))?.unwrap_or_default();
        let listen = string(&t.get("listen").cloned(), &format!("members[{i}].listen"))?;
        members[id] = Some(MemberEntry { id, address, listen });
    }
    Ok(members.into_iter().map(|m| m.expect("every id 0..n present")).collect())
}

/// Two members cannot share an address: one of them could never listen.
fn check_distinct_addresses(members: &[MemberEntry]) -> Result<(), String> {
    for (i, a) in members.iter().enumerate() {
        if a.address.is_empty() {
            continue;
        }
        if let Some(b) = members[i + 1..].iter().find(|b| b.address == a.address) {
            return Err(format!(
                "members[id = {}].address and members[id = {}].address are both \"{}\": every member needs its own address",
                a.id, b.id, a.address
            ));
        }
    }
    Ok(())
}

/// Apply `SPINDLE_GROUP_<KEY>` and `SPINDLE_MEMBER_<ID>_<KEY>` overrides.
fn apply_env(group: &mut toml::Table, members: &mut [MemberEntry], env: &[(String, String)]) -> Result<(), String> {
    for (var, value) in env {
        if let Some(key) = var.strip_prefix("SPINDLE_GROUP_") {
            let key = key.to_ascii_lowercase();
            let Some((_, default)) = GROUP_KEYS.iter().find(|(k, _)| *k == key) else {
                continue; // other SPINDLE_* variables belong to other tools
            };
            // Typed like the key's default (strings when no default).
            let parsed = match default {
                Some(d) if !d.starts_with('"') => value
                    .parse::<toml::Value>()
                    .or_else(|_| {
                        format!("x = {value}")
                            .parse::<toml::Table>()
                            .map(|mut t| t.remove("x").expect("x"))
                    })
                    .map_err(|_| format!("{var}={value} (overrides group.{key}): not a valid value"))?,
                _ if key == "senders" && !value.chars().all(|c| c.is_ascii_alphabetic()) => {
                    let ranks: Result<Vec<toml::Value>, _> = value
                        .split(',')
                        .map(|r| r.trim().parse::<i64>().map(toml::Value::Integer))
                        .collect();
                    toml::Value::Array(ranks.map_err(|_| {
                        format!("{var}={value} (overrides group.senders): expected all, half, one or ids like 0,2")
                    })?)
                }
                _ => toml::Value::String(value.clone()),
            };
            group.insert(key, parsed);
        } else if let Some(rest) = var.strip_prefix("SPINDLE_MEMBER_") {
            let Some((id, key)) = rest.split_once('_') else {
                continue;
            };
            let Ok(id) = id.parse::<usize>() else { continue };
            let Some(m) = members.get_mut(id) else {
                return Err(format!("{var}: there is no member with id {id}"));
            };
            match key {
                "ADDRESS" => m.address = value.clone(),
                "LISTEN" => m.listen = Some(value.clone()),
                _ => return Err(format!("{var}: unknown member key '{key}' (ADDRESS or LISTEN)")),
            }
        }
    }
    Ok(())
}

fn parse_senders(value: &toml::Value, members: usize) -> Result<SenderSet, String> {
    match value {
        toml::Value::String(s) => SenderSet::parse(s).map_err(|e| format!("group.senders = \"{s}\": {e}")),
        toml::Value::Array(a) => {
            let mut ranks = Vec::with_capacity(a.len());
            for v in a {
                match v.as_integer() {
                    Some(r) if r >= 0 && (r as usize) < members => ranks.push(r as usize),
                    _ => {
                        return Err(format!(
                            "group.senders = {value}: every entry must be a member id in 0..={}",
                            members - 1
                        ))
                    }
                }
            }
            ranks.sort_unstable();
            if ranks.is_empty() || ranks.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("group.senders = {value}: at least one id, no repeats"));
            }
            Ok(SenderSet::Ranks(ranks))
        }
        other => Err(format!(
            "group.senders = {other}: expected \"all\", \"half\", \"one\" or a list of ids"
        )),
    }
}

/// The keys of a `[[subgroups]]` entry.
const SUBGROUP_KEYS: [&str; 6] = ["name", "shards", "members_per_shard", "mode", "senders", "overlapping"];

/// `[[subgroups]]`: each with a name and members_per_shard (shards 1,
/// mode ordered, senders all, overlapping false by default), laid out
/// over the file's members once here so that a file whose subgroups do
/// not fit is refused when it is read.
fn parse_subgroups(
    value: Option<toml::Value>,
    members: usize,
) -> Result<Vec<spindle_group::subgroup::SubgroupSpec>, String> {
    use spindle_group::subgroup::{lay_out, StickyLayout, SubgroupSpec};
    let list = match value {
        None => return Ok(Vec::new()),
        Some(toml::Value::Array(a)) => a,
        Some(other) => {
            return Err(format!(
                "'subgroups' must be an array of tables ([[subgroups]]), found {}",
                other.type_str()
            ))
        }
    };
    let mut specs = Vec::with_capacity(list.len());
    for (i, entry) in list.into_iter().enumerate() {
        let toml::Value::Table(t) = entry else {
            return Err(format!("subgroups[{i}] must be a table"));
        };
        if let Some(k) = t.keys().find(|k| !SUBGROUP_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown key subgroups[{i}].{k}: known keys are {}",
                SUBGROUP_KEYS.join(", ")
            ));
        }
        let key = |k: &str| format!("subgroups[{i}].{k}");
        let name =
            string(&t.get("name").cloned(), &key("name"))?.ok_or_else(|| format!("missing key {}", key("name")))?;
        let shards = match t.get("shards") {
            None => 1,
            v => integer(&v.cloned(), &key("shards"))?,
        };
        let per_shard = integer(&t.get("members_per_shard").cloned(), &key("members_per_shard"))?;
        let mut spec = SubgroupSpec::new(&name, shards, per_shard);
        if let Some(m) = string(&t.get("mode").cloned(), &key("mode"))? {
            spec.mode = DeliveryMode::parse(&m).map_err(|e| format!("{} = \"{m}\": {e}", key("mode")))?;
        }
        if let Some(v) = t.get("senders") {
            spec.senders =
                parse_senders(v, per_shard.max(1)).map_err(|e| e.replace("group.senders", &key("senders")))?;
        }
        spec.overlapping = match t.get("overlapping") {
            None => false,
            Some(toml::Value::Boolean(b)) => *b,
            other => {
                return Err(format!(
                    "{} = {}: expected true or false",
                    key("overlapping"),
                    show(&other.cloned())
                ))
            }
        };
        specs.push(spec);
    }
    let all: Vec<usize> = (0..members).collect();
    lay_out(&StickyLayout, &specs, 0, &all, None)
        .map_err(|e| format!("[[subgroups]] over the {members} members: {e}"))?;
    Ok(specs)
}

fn show(v: &Option<toml::Value>) -> String {
    v.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "(missing)".into())
}

fn string(v: &Option<toml::Value>, key: &str) -> Result<Option<String>, String> {
    match v {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{key} = {other}: expected a string")),
    }
}

fn integer(v: &Option<toml::Value>, key: &str) -> Result<usize, String> {
    match v {
        Some(toml::Value::Integer(i)) if *i >= 0 => Ok(*i as usize),
        other => Err(format!("{key} = {}: expected a non-negative integer", show(other))),
    }
}

/// Resolve `host:port` to one socket address (the first the resolver gives).
pub fn resolve(address: &str) -> Result<SocketAddr, ConfigError> {
    address
        .to_socket_addrs()
        .map_err(|e| ConfigError::Invalid(format!("'{address}' is not a host:port ({e})")))?
        .next()
        .ok_or_else(|| ConfigError::Invalid(format!("'{address}' resolves to no address")))
}

/// The idle strategies of a group file, the bench and `spindle run`:
/// `spin`, `backoff` (spin, then yield, then park), and `park`: a short
/// spin, no yields, then park on the doorbell for at most 1 ms. On tcp a
/// blocked thread is woken by the receive thread's ring (or the kernel) at
/// once, while a yielding one waits for a time slice on a busy machine:
/// `park` is what tcp members use by default.
pub fn parse_idle(s: &str) -> Result<IdleStrategy, ConfigError> {
    match s {
        "park" => Ok(IdleStrategy::Backoff {
            spins: 50,
            yields: 0,
            park: Duration::from_millis(1),
        }),
        other => IdleStrategy::parse(other).map_err(|e| ConfigError::Invalid(format!("{e} (or 'park')"))),
    }
}

/// Bytes as lowercase hex digits.
pub fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex digits as bytes (an even number of digits).
pub fn hex_decode(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|_| format!("'{}' is not hex", &text[i..i + 2])))
        .collect()
}

/// Whether a `group.transport` names the ofi fabric: `"ofi"` (libfabric's
/// `tcp` provider) or `"ofi:<provider>"`.
pub fn is_ofi(transport: &str) -> bool {
    transport == "ofi" || transport.starts_with("ofi:")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [group]
        name = "g1"
        key_file = "g1.key"
        window_slots = 256
        [[members]]
        id = 0
        address = "127.0.0.1:7100"
        [[members]]
        id = 1
        address = "127.0.0.1:7101"
    "#;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<GroupFile, String> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        GroupFile::parse(text, Path::new("/etc/spindle"), &env).map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_file_gets_the_documented_defaults() {
        let f = parse(GOOD, &[]).expect("valid");
        assert_eq!(f.name, "g1");
        assert_eq!(f.transport, "tcp");
        assert_eq!(f.mode, DeliveryMode::Ordered);
        assert_eq!(f.senders, SenderSet::All);
        assert_eq!((f.window_slots, f.slot_payload_max), (256, defaults::SLOT_PAYLOAD_MAX));
        assert_eq!(f.key_file, Some(PathBuf::from("/etc/spindle/g1.key")));
        assert_eq!(f.members.len(), 2);
        assert_eq!(f.rank_of(1).expect("member 1"), 1);
        assert!(f
            .rank_of(2)
            .unwrap_err()
            .to_string()
            .contains("member 2 is not in the configuration"));
    }

    #[test]
    fn subgroups_are_read_with_their_defaults_and_bad_ones_named() {
        let four = GOOD.to_string()
            + r#"
        [[members]]
        id = 2
        address = "127.0.0.1:7102"
        [[members]]
        id = 3
        address = "127.0.0.1:7103"
        [[subgroups]]
        name = "kv"
        shards = 2
        members_per_shard = 2
        mode = "unordered"
        senders = [0]
        "#;
        let f = parse(&four, &[]).expect("valid");
        assert!(parse(GOOD, &[]).expect("valid").subgroups.is_empty());
        assert_eq!(f.subgroups.len(), 1);
        let kv = &f.subgroups[0];
        assert_eq!((kv.name.as_str(), kv.shards, kv.members_per_shard), ("kv", 2, 2));
        assert_eq!(
            (kv.mode, &kv.senders, kv.overlapping),
            (DeliveryMode::Unordered, &SenderSet::Ranks(vec![0]), false)
        );
        let shm = parse(&four.replace("key_file = \"g1.key\"", "transport = \"shm\""), &[]).expect("valid");
        assert_eq!(shm.builder(3).expect("builder").subgroups.len(), 1);
        let log = four.clone() + "[[subgroups]]\nname = \"log\"\nmembers_per_shard = 1\n";
        assert!(
            parse(&log, &[]).unwrap_err().contains("inadequate"),
            "4 members are all in kv"
        );
        let overlapping = log.replace("members_per_shard = 1\n", "members_per_shard = 1\noverlapping = true\n");
        assert_eq!(parse(&overlapping, &[]).expect("valid").subgroups[1].shards, 1);
        for (bad, needle) in [
            ("shards = 2", "shards = 0"),
            ("name = \"kv\"", "name = \"k v\""),
            ("senders = [0]", "senders = [2]"),
            ("mode = \"unordered\"", "mode = \"loose\""),
            ("members_per_shard = 2", "members_per_shard = 2\nreplicas = 3"),
            (
                "name = \"g1\"",
                "name = \"a-group-name-of-forty-five-bytes-in-the-tests\"",
            ),
        ] {
            let text = four.replace(bad, needle);
            let e = parse(&text, &[]).expect_err(needle);
            let expect = match needle {
                "shards = 0" => "shards 0 must be in 1..=64",
                "name = \"k v\"" => "subgroup \"k v\"",
                "senders = [2]" => "subgroups[0].senders = [2]",
                "mode = \"loose\"" => "subgroups[0].mode = \"loose\"",
                "name = \"a-group-name-of-forty-five-bytes-in-the-tests\"" => "subgroups[0]: its shards' group names",
                _ => "unknown key subgroups[0].replicas",
            };
            assert!(e.contains(expect), "{needle}: {e}");
        }
    }

    #[test]
    fn environment_overrides_win() {
        let f = parse(
            GOOD,
            &[
                ("SPINDLE_GROUP_WINDOW_SLOTS", "64"),
                ("SPINDLE_GROUP_MODE", "unordered"),
                ("SPINDLE_GROUP_SENDERS", "1"),
                ("SPINDLE_MEMBER_1_ADDRESS", "10.0.0.2:7101"),
            ],
        )
        .expect("valid");
        assert_eq!(f.window_slots, 64);
        assert_eq!(f.mode, DeliveryMode::Unordered);
        assert_eq!(f.senders, SenderSet::Ranks(vec![1]));
        assert_eq!(f.members[1].address, "10.0.0.2:7101");
    }

    #[test]
    fn the_source_address_check_is_on_by_default_and_can_be_turned_off() {
        assert!(parse(GOOD, &[]).expect("valid").check_source_addr);
        let off = GOOD.replace("window_slots = 256", "check_source_addr = false");
        assert!(!parse(&off, &[]).expect("valid").check_source_addr);
        let env = parse(GOOD, &[("SPINDLE_GROUP_CHECK_SOURCE_ADDR", "false")]).expect("valid");
        assert!(!env.check_source_addr);
        let e = parse(&GOOD.replace("window_slots = 256", "check_source_addr = \"no\""), &[]).unwrap_err();
        assert!(e.contains("group.check_source_addr = \"no\""), "{e}");
    }

    #[test]
    fn tls_files_come_as_a_set_relative_to_the_file() {
        assert_eq!(parse(GOOD, &[]).expect("valid").tls, None);
        let all = GOOD.replace(
            "window_slots = 256",
            "tls_cert = \"m0.pem\"\ntls_key = \"m0.key\"\ntls_ca = \"/etc/ca.pem\"",
        );
        let f = parse(&all, &[]).expect("valid");
        assert_eq!(
            f.tls,
            Some(TlsFiles {
                cert: PathBuf::from("/etc/spindle/m0.pem"),
                key: PathBuf::from("/etc/spindle/m0.key"),
                ca: PathBuf::from("/etc/ca.pem"),
            })
        );
        let e = parse(&GOOD.replace("window_slots = 256", "tls_cert = \"m0.pem\""), &[]).unwrap_err();
        assert!(e.contains("missing: group.tls_key, group.tls_ca"), "{e}");
    }

    #[test]
    fn compact_log_bytes_needs_persistent_mode_and_a_sane_size() {
        let persistent = "mode = \"persistent\"\npersist_dir = \"logs\"";
        let f = parse(
            &GOOD.replace(
                "window_slots = 256",
                &format!("{persistent}\ncompact_log_bytes = 67108864"),
            ),
            &[],
        )
        .expect("valid");
        assert_eq!(f.compact_log_bytes, 64 << 20);
        assert_eq!(f.group_config().expect("valid").compact_log_bytes, 64 << 20);
        let off = parse(&GOOD.replace("window_slots = 256", persistent), &[]).expect("valid");
        assert_eq!(off.compact_log_bytes, 0, "off by default");
        let e = parse(&GOOD.replace("window_slots = 256", "compact_log_bytes = 67108864"), &[]).unwrap_err();
        assert!(
            e.contains("group.compact_log_bytes = 67108864: only used with mode = \"persistent\""),
            "{e}"
        );
        let e = parse(
            &GOOD.replace("window_slots = 256", &format!("{persistent}\ncompact_log_bytes = 100")),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("group.compact_log_bytes = 100 is below 4096"), "{e}");
    }

    #[test]
    fn persistent_mode_takes_a_log_directory_relative_to_the_file() {
        let f = parse(
            &GOOD.replace("window_slots = 256", "mode = \"persistent\"\npersist_dir = \"logs\""),
            &[],
        )
        .expect("valid");
        assert_eq!(f.mode, DeliveryMode::Persistent);
        assert_eq!(f.persist_dir, Some(PathBuf::from("/etc/spindle/logs")));
        assert_eq!(f.group_config().expect("valid").persist_dir, f.persist_dir);
        let e = parse(&GOOD.replace("window_slots = 256", "mode = \"persistent\""), &[]).unwrap_err();
        assert!(e.contains("needs group.persist_dir"), "{e}");
        let e = parse(&GOOD.replace("window_slots = 256", "persist_dir = \"logs\""), &[]).unwrap_err();
        assert!(e.contains("only used with group.mode = \"persistent\""), "{e}");
    }

    #[test]
    fn errors_name_the_key_and_the_value() {
        let cases = [
            (
                GOOD.replace("window_slots = 256", "window_slots = 100"),
                "group.window_slots = 100",
            ),
            (
                GOOD.replace("window_slots = 256", "window_slot = 256"),
                "unknown key group.window_slot",
            ),
            (GOOD.replace("name = \"g1\"", "name = \"a b\""), "group.name = \"a b\""),
            (GOOD.replace("key_file = \"g1.key\"", ""), "missing key group.key_file"),
            (GOOD.replace("id = 1", "id = 5"), "members[1].id = 5"),
            (GOOD.replace("id = 1", "id = 0"), "two members have this id"),
            (
                GOOD.replace("127.0.0.1:7101", "127.0.0.1:7100"),
                "members[id = 0].address and members[id = 1].address are both \"127.0.0.1:7100\"",
            ),
            (
                GOOD.replace("window_slots = 256", "mode = \"fast\""),
                "group.mode = \"fast\"",
            ),
            (
                GOOD.replace("window_slots = 256", "window_slots = \"x\""),
                "group.window_slots = \"x\"",
            ),
        ];
        for (text, expected) in cases {
            let e = parse(&text, &[]).expect_err(expected);
            assert!(e.contains(expected), "error {e:?} should contain {expected:?}");
        }
        let e = parse(GOOD, &[("SPINDLE_GROUP_WINDOW_SLOTS", "lots")]).unwrap_err();
        assert!(e.contains("SPINDLE_GROUP_WINDOW_SLOTS=lots"), "{e}");
    }

    #[test]
    fn the_commented_example_parses_with_the_documented_defaults() {
        let f = parse(include_str!("../../../examples/group.toml"), &[]).expect("examples/group.toml is valid");
        let d = parse(
            "[group]\nname = \"orders\"\nkey_file = \"orders.key\"\n[[members]]\nid = 0\naddress = \"10.0.0.1:7100\"\n[[members]]\nid = 1\naddress = \"10.0.0.2:7100\"\n[[members]]\nid = 2\naddress = \"10.0.0.3:7100\"\n",
            &[],
        )
        .expect("minimal file");
        assert_eq!(f, d, "the example spells out exactly the defaults");
    }

    #[test]
    fn a_missing_key_file_is_made_once_with_mode_600() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let f = GroupFile::parse(GOOD, dir.path(), &[]).expect("valid");
        assert!(f.create_key_if_missing().expect("made"));
        let key = f.read_key().expect("a readable key of 64 hex digits");
        assert_eq!(key.len(), 64);
        let mode = std::fs::metadata(f.key_file.as_ref().expect("set"))
            .expect("exists")
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            !f.create_key_if_missing().expect("kept"),
            "an existing key is never replaced"
        );
        assert_eq!(f.read_key().expect("same key"), key);
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("list").count(),
            1,
            "nothing left aside"
        );
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex_decode(&hex_encode(&[0, 1, 0xab, 0xff])), Ok(vec![0, 1, 0xab, 0xff]));
        assert!(hex_decode("abc").is_err());
    }
}
