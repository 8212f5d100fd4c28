//! Helpers shared by the end-to-end tests of the `spindle` binary.
#![allow(dead_code)] // each test file uses its own subset

use std::process::{Command, Output, Stdio};

pub mod kv;
pub mod netns;

/// Write a group key file: `line` and a newline, readable by its owner
/// only (`spindle` refuses a key file others may read).
pub fn write_key_file(path: &std::path::Path, line: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    writeln!(f, "{line}").unwrap();
}

/// The `spindle` binary built for these tests. `spindle rt` neither reads
/// nor writes this host's interference record unless a test names one
/// (`--host-record` in a temporary directory).
pub fn spindle() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.env("SPINDLE_RT_HOST_RECORD", "off");
    cmd
}

/// Run to completion with no standard input.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run spindle")
}

/// Standard output and standard error, as one text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `spindle stat --json` output shows each of `survivors` of tcp
/// group `group`, in its own stat file, past view 0.
pub fn survivors_in_new_view(stat: &str, group: &str, survivors: &[u64]) -> bool {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(stat) else {
        return false;
    };
    let moved_on = |me: u64| {
        doc["groups"].as_array().into_iter().flatten().any(|g| {
            g["group"] == group
                && g["view_of"].as_u64() == Some(me)
                && g["members"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["rank"].as_u64() == Some(me) && m["counters"]["view"].as_u64().unwrap_or(0) >= 1)
        })
    };
    survivors.iter().all(|m| moved_on(*m))
}
