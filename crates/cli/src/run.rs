//! `spindle run --config FILE --member ID` (being built: tcp transport).
use clap::Args;

#[derive(Args, Debug)]
pub struct RunArgs {}

pub fn run(_args: RunArgs) -> Result<(), String> {
    Err("spindle run (multi-host groups over tcp) is not built yet".into())
}
