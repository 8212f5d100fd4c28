//! Helpers shared by the end-to-end tests of the `spindle` binary.
#![allow(dead_code)] // each test file uses its own subset

use std::process::{Command, Output, Stdio};

/// The `spindle` binary built for these tests.
pub fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
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
