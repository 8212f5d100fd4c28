//! The service's configuration: defaults, a small `key = value` file
//! format (a TOML subset: comments with `#`, strings in double quotes,
//! integers with optional `_`), and validation that names the bad value.
//!
//! ```text
//! # spindle kv serve --config kv.toml
//! group = "kv"              # shm group name
//! backups = 3               # R: 1..=3 (more allowed, up to 63)
//! mode = "one-sided"        # or "rpc"
//! bind = "127.0.0.1"
//! port = 6380
//! data_dir = "/var/tmp/spindle-kv"
//! segment_bytes = 2_097_152
//! segments = 4              # per backup, in memory
//! value_bytes_max = 1_048_576
//! memory_bytes_max = 268_435_456
//! clients_max = 1024
//! ```

use std::path::PathBuf;

use crate::log::LogGeometry;
use crate::master::Mode;

/// Everything a member of the service needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfig {
    pub group: String,
    pub backups: usize,
    pub mode: Mode,
    pub bind: String,
    pub port: u16,
    pub data_dir: PathBuf,
    pub geometry: LogGeometry,
    pub value_bytes_max: usize,
    pub memory_bytes_max: usize,
    pub clients_max: usize,
}

/// Defaults (the same in code, in the docs above and in `--help`).
pub mod defaults {
    pub const BACKUPS: usize = 3;
    pub const PORT: u16 = 6380;
    pub const SEGMENT_BYTES: usize = 2 << 20;
    pub const SEGMENTS: usize = 4;
    pub const VALUE_BYTES_MAX: usize = 1 << 20;
    pub const MEMORY_BYTES_MAX: usize = 256 << 20;
    pub const CLIENTS_MAX: usize = 1024;
}

impl ServiceConfig {
    /// The no-configuration local default: 3 backups on shm.
    pub fn local_default() -> ServiceConfig {
        ServiceConfig {
            group: "kv".into(),
            backups: defaults::BACKUPS,
            mode: Mode::OneSided,
            bind: "127.0.0.1".into(),
            port: defaults::PORT,
            data_dir: std::env::temp_dir().join("spindle-kv"),
            geometry: LogGeometry {
                segment_bytes: defaults::SEGMENT_BYTES,
                segments_max: defaults::SEGMENTS,
            },
            value_bytes_max: defaults::VALUE_BYTES_MAX,
            memory_bytes_max: defaults::MEMORY_BYTES_MAX,
            clients_max: defaults::CLIENTS_MAX,
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
                "mode" => c.mode = Mode::parse(&string()?).map_err(at)?,
                "bind" => c.bind = string()?,
                "port" => {
                    c.port = u16::try_from(int()?).map_err(|_| at(format!("port = {value}: expected 0..=65535")))?
                }
                "data_dir" => c.data_dir = PathBuf::from(string()?),
                "segment_bytes" => c.geometry.segment_bytes = int()?,
                "segments" => c.geometry.segments_max = int()?,
                "value_bytes_max" => c.value_bytes_max = int()?,
                "memory_bytes_max" => c.memory_bytes_max = int()?,
                "clients_max" => c.clients_max = int()?,
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
        if self.value_bytes_max == 0 {
            return Err("value_bytes_max = 0: expected at least 1".into());
        }
        self.geometry.validate(self.value_bytes_max)?;
        if self.clients_max == 0 || self.clients_max > 65_536 {
            return Err(format!("clients_max = {}: expected 1..=65536", self.clients_max));
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

    /// The configuration as file text (parses back to itself).
    pub fn to_text(&self) -> String {
        format!(
            "group = \"{}\"\nbackups = {}\nmode = \"{}\"\nbind = \"{}\"\nport = {}\ndata_dir = \"{}\"\nsegment_bytes = {}\nsegments = {}\nvalue_bytes_max = {}\nmemory_bytes_max = {}\nclients_max = {}\n",
            self.group,
            self.backups,
            self.mode.as_str(),
            self.bind,
            self.port,
            self.data_dir.display(),
            self.geometry.segment_bytes,
            self.geometry.segments_max,
            self.value_bytes_max,
            self.memory_bytes_max,
            self.clients_max
        )
    }

    /// Members of the shm group: the master and its backups.
    pub fn members(&self) -> usize {
        self.backups + 1
    }
}

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
        assert_eq!(ServiceConfig::parse(&c.to_text()).unwrap(), c, "to_text round-trips");
    }
}
