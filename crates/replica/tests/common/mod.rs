//! Helpers shared by the replica's integration tests.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use spindle_replica::log::LogGeometry;
use spindle_replica::node::NodeConfig;
use spindle_replica::Mode;
use spindle_runtime::IdleStrategy;

/// A one-sided store of `members` with `backups` backups, 4 segments of
/// `segment_bytes`, values up to 2 KB, 64 MiB of objects, segments in
/// `dir`.
#[allow(dead_code)] // not every test binary that includes it calls it
pub fn node_config(group: &str, members: usize, backups: usize, segment_bytes: usize, dir: &Path) -> NodeConfig {
    NodeConfig {
        group: group.to_string(),
        members,
        backups,
        mode: Mode::OneSided,
        geometry: LogGeometry {
            segment_bytes,
            segments_max: 4,
        },
        value_bytes_max: 2048,
        memory_bytes_max: 64 << 20,
        clean_slack_segments: spindle_replica::node::CLEAN_SLACK_SEGMENTS_DEFAULT,
        data_dir: dir.to_path_buf(),
        idle: IdleStrategy::DEFAULT_BACKOFF,
        join_timeout: Duration::from_secs(30),
        lease: spindle_replica::node::LEASE_DEFAULT,
    }
}

/// `members` listeners on loopback ports the kernel picks, bound before
/// any member starts (so every address is known), with their addresses in
/// rank order; each member takes its own listener out of the list.
#[allow(dead_code)] // not every test binary that includes it calls it
pub fn loopback_listeners(members: usize) -> (Vec<Option<TcpListener>>, Vec<SocketAddr>) {
    (0..members)
        .map(|_| {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
            let addr = l.local_addr().expect("its address");
            (Some(l), addr)
        })
        .unzip()
}
