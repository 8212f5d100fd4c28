//! The host record's file: where it lives, reading it, and merging what
//! a calibration or a run observed back into it
//! ([`spindle_rt::interference::HostRecord`] is the pure part).
//!
//! ```text
//!  launcher: read record ─▶ floors into the spec ─▶ members admit with max(calibration, record)
//!            ◀── members' reports (calibration lost time / jitter, the run's longest gap / latest release)
//!            merge ─▶ write (temp file + rename) if anything grew
//! ```
//!
//! Where: `--host-record PATH`, else `$SPINDLE_RT_HOST_RECORD`, else
//! `$XDG_STATE_HOME/spindle/interference-HOST.json`, else
//! `~/.local/state/spindle/interference-HOST.json`. `--no-host-record`
//! (or `SPINDLE_RT_HOST_RECORD=off`) neither reads nor writes one.

use std::path::{Path, PathBuf};

use spindle_rt::interference::{Figure, HostRecord};

use super::common::unix_time_s;
use super::CommonArgs;
use crate::rt::scenario::MemberReport;

/// The environment variable naming the record file (`off`: none).
pub const HOST_RECORD_ENV: &str = "SPINDLE_RT_HOST_RECORD";
/// Largest record file read (it holds two figures and two short texts).
const RECORD_BYTES_MAX: u64 = 64 * 1024;

/// This host's name (the kernel's), for the file name and the record.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Where the record is, from the flags and the environment (`env` looks
/// a variable up); `None`: no record.
pub fn record_path(
    flag: Option<&Path>,
    disabled: bool,
    host: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<PathBuf> {
    if disabled {
        return None;
    }
    if let Some(p) = flag {
        return Some(p.to_path_buf());
    }
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(v) = set(HOST_RECORD_ENV) {
        return (v != "off").then(|| PathBuf::from(v));
    }
    let file = format!("interference-{host}.json");
    if let Some(state) = set("XDG_STATE_HOME") {
        return Some(Path::new(&state).join("spindle").join(file));
    }
    set("HOME").map(|home| Path::new(&home).join(".local/state/spindle").join(file))
}

/// The record path for these arguments (real environment).
pub fn path_of(common: &CommonArgs) -> Option<PathBuf> {
    record_path(
        common.host_record.as_deref(),
        common.no_host_record,
        &hostname(),
        &|k| std::env::var(k).ok(),
    )
}

/// Read the record at `path`: a new one when there is no file; an error
/// naming the file (and how to get past it) when it cannot be used.
pub fn load(path: &Path, host: &str) -> Result<HostRecord, String> {
    let how = "delete it to start a new record, or pass --no-host-record";
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HostRecord::new(host)),
        Err(e) => return Err(format!("host record {}: {e}", path.display())),
    };
    if meta.len() > RECORD_BYTES_MAX {
        return Err(format!(
            "host record {}: {} bytes, more than {RECORD_BYTES_MAX}: not a record ({how})",
            path.display(),
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("host record {}: {e}", path.display()))?;
    let record: HostRecord = serde_json::from_str(&text)
        .map_err(|e| format!("host record {}: not a valid record: {e} ({how})", path.display()))?;
    record
        .validate()
        .map_err(|e| format!("host record {}: {e} ({how})", path.display()))?;
    if record.host != host {
        return Err(format!(
            "host record {} is host '{}''s, this is '{host}' ({how})",
            path.display(),
            record.host
        ));
    }
    Ok(record)
}

/// Write the record (its directory created; a temporary file renamed over
/// the old one, so a reader never sees half a record).
pub fn save(path: &Path, record: &HostRecord) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("host record: create {}: {e}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(record).map_err(|e| e.to_string())?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, json + "\n").map_err(|e| format!("host record: write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("host record: rename {} to {}: {e}", tmp.display(), path.display())
    })
}

/// Merge what the members observed (their calibrations, and their runs
/// of `run_ns` in all) into `record`; true when the record grew.
pub fn merge_reports(
    record: &mut HostRecord,
    command: &str,
    reports: &[MemberReport],
    run_ns: u64,
    now_s: u64,
) -> bool {
    // The members calibrate at the same time: the longest is the time watched.
    let calibration_ns = reports.iter().map(|r| r.interference.calibration_ns).max().unwrap_or(0);
    let mut grew = record.watched(calibration_ns.saturating_add(run_ns));
    for r in reports {
        let node = ["A", "B", "C", "D"].get(r.rank).copied().unwrap_or("?");
        let i = &r.interference;
        let what = |s: &str| format!("spindle rt {command}, node {node}: {s}");
        for (figure, value_ns, what_it_is) in [
            (Figure::Interference, i.lost_max_ns, "calibration, lost time"),
            (
                Figure::ReleaseJitter,
                r.calibration_jitter_ns.max,
                "calibration, wake-up lateness",
            ),
            (
                Figure::Interference,
                i.run_gap_max_ns,
                "in the run, longest gap of a dispatcher spin",
            ),
            (
                Figure::ReleaseJitter,
                i.run_release_late_max_ns,
                "in the run, latest release",
            ),
        ] {
            grew |= record.observe(figure, value_ns, now_s, &what(what_it_is));
        }
    }
    grew
}

/// Load, merge `update`, save if anything grew (re-read first: another
/// run may have written since this one started). Errors are returned,
/// not fatal to the measurement: the caller prints them.
pub fn update(path: &Path, update: &mut dyn FnMut(&mut HostRecord, u64) -> bool) -> Result<Option<HostRecord>, String> {
    let mut record = load(path, &hostname())?;
    if update(&mut record, unix_time_s()) {
        save(path, &record)?;
        return Ok(Some(record));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_path_comes_from_the_flag_the_environment_or_the_state_directory() {
        let none = env_of(&[]);
        assert_eq!(record_path(None, false, "h", &none), None, "no HOME: no record");
        let home = env_of(&[("HOME", "/home/u")]);
        assert_eq!(
            record_path(None, false, "h", &home),
            Some(PathBuf::from("/home/u/.local/state/spindle/interference-h.json"))
        );
        let xdg = env_of(&[("HOME", "/home/u"), ("XDG_STATE_HOME", "/s")]);
        assert_eq!(
            record_path(None, false, "h", &xdg),
            Some(PathBuf::from("/s/spindle/interference-h.json"))
        );
        let env = env_of(&[("HOME", "/home/u"), (HOST_RECORD_ENV, "/tmp/r.json")]);
        assert_eq!(record_path(None, false, "h", &env), Some(PathBuf::from("/tmp/r.json")));
        let off = env_of(&[("HOME", "/home/u"), (HOST_RECORD_ENV, "off")]);
        assert_eq!(record_path(None, false, "h", &off), None);
        // The flag wins over the environment; --no-host-record over both.
        let flag = Path::new("/x/r.json");
        assert_eq!(record_path(Some(flag), false, "h", &off), Some(flag.to_path_buf()));
        assert_eq!(record_path(Some(flag), true, "h", &home), None);
    }

    #[test]
    fn the_file_round_trips_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/spindle/interference-h.json");
        assert_eq!(load(&path, "h").unwrap(), HostRecord::new("h"), "no file: a new record");
        let mut r = HostRecord::new("h");
        r.observe(
            Figure::Interference,
            11_301_000,
            1_764_000_000,
            "spindle rt ring, node A: in the run",
        );
        r.observe(
            Figure::ReleaseJitter,
            9_595_000,
            1_764_000_000,
            "spindle rt ring, node B: in the run",
        );
        save(&path, &r).unwrap();
        assert_eq!(load(&path, "h").unwrap(), r);
        let e = load(&path, "other").unwrap_err();
        assert!(e.contains("'h'") && e.contains("'other'"), "{e}");
        std::fs::write(&path, "{ not json").unwrap();
        let e = load(&path, "h").unwrap_err();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("--no-host-record"),
            "{e}"
        );
    }

    #[test]
    fn reports_merge_their_calibration_and_their_run() {
        let mut member = MemberReport {
            rank: 1,
            ..MemberReport::default()
        };
        member.interference.lost_max_ns = 300_000;
        member.interference.run_gap_max_ns = 4_284_000;
        member.interference.run_release_late_max_ns = 3_553_000;
        member.calibration_jitter_ns.max = 115_000;
        member.interference.calibration_ns = 5_000_000_000;
        let mut r = HostRecord::new("h");
        assert!(merge_reports(&mut r, "ring", &[member.clone()], 250_000_000_000, 7));
        assert_eq!(r.observed_ns, 255_000_000_000, "calibration + run");
        assert_eq!((r.interference_max_ns, r.release_jitter_max_ns), (4_284_000, 3_553_000));
        let seen = r.interference_seen.as_ref().unwrap();
        assert!(
            seen.source.contains("node B") && seen.source.contains("in the run"),
            "{seen:?}"
        );
        member.interference.calibration_ns = 0;
        assert!(!merge_reports(&mut r, "ring", &[member], 0, 8), "nothing new");
    }
}
