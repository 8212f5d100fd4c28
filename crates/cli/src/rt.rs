//! `spindle rt …` (being built: time-driven channels).
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum RtCommand {
    /// The 3-node ring of the HARE thesis (not built yet).
    Ring,
}

pub fn run(_command: RtCommand) -> Result<(), String> {
    Err("spindle rt is not built yet".into())
}
