//! `spindle sim` (being built: deterministic simulation).
use clap::Args;

#[derive(Args, Debug)]
pub struct SimArgs {}

pub fn run(_args: SimArgs) -> Result<(), String> {
    Err("spindle sim is not built yet".into())
}
