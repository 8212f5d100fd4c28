//! `spindle kv …` (being built: replicated KV over RESP).
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Serve the replicated key-value store (not built yet).
    Serve,
}

pub fn run(_command: KvCommand) -> Result<(), String> {
    Err("spindle kv is not built yet".into())
}
