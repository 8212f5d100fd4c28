//! `spindle bench replica` (being built: one-sided vs RPC replication).
use clap::Args;

#[derive(Args, Debug)]
pub struct ReplicaArgs {}

pub fn run(_args: ReplicaArgs) -> Result<(), String> {
    Err("spindle bench replica is not built yet".into())
}
