//! [`TcpOptions`]: what a member needs to open (or join) a group over
//! TCP, with its defaults and validation.

use std::net::SocketAddr;
use std::time::Duration;

use super::frame::FRAME_HEADER_BYTES;
use super::{tls, ROW_BYTES_MAX};
use crate::{FabricError, PeerSet, MEMBERS_MAX};

/// What a member needs to open (or join) a group over TCP.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    pub group: String,
    /// Bytes per row; rounded up to a cache line.
    pub row_len_bytes: usize,
    /// A fingerprint of the layer above's row layout (checked in the
    /// handshake, like shm's layout tag).
    pub layout_tag: u64,
    /// `addresses[r]`: where member `r` listens. The member count is its
    /// length.
    pub addresses: Vec<SocketAddr>,
    /// Listen here instead of `addresses[rank]` (e.g. `0.0.0.0:port`).
    pub listen: Option<SocketAddr>,
    /// The group's shared secret (every member must have the same).
    pub key: Vec<u8>,
    /// How long to wait for every peer to connect.
    pub join_timeout: Duration,
    /// A peer that acknowledges nothing for this long is gone.
    pub peer_timeout: Duration,
    /// The longest a push may wait for one peer's socket to take its bytes
    /// (the send buffer full: the peer is cut off, stopped or far behind).
    /// Past it the peer is declared gone, so that one stuck peer never
    /// stalls the pushes to the others (and their heartbeats) for long.
    /// Keep it well below the group's suspicion timeout.
    pub send_stall_max: Duration,
    /// Coalesce pushes: small pushes (up to [`COALESCE_PUSH_BYTES_MAX`])
    /// are copied into a per-peer buffer and sent together at the next
    /// [`Doorbell::ring`](crate::doorbell::Doorbell::ring) of this fabric's doorbell, the next large push,
    /// [`Fabric::flush`](crate::Fabric::flush), a park on the doorbell, or when the buffer
    /// fills. One `sendmsg` per progress pass instead of one per push. For
    /// users that ring (or flush) after their pushes, as the group layer
    /// does: nothing else sends them. Off by default (every push is sent
    /// at once).
    pub coalesce: bool,
    /// With `coalesce`: whether a doorbell ring flushes. Off, pushes go out
    /// only at [`Fabric::flush`](crate::Fabric::flush), before a park, when the buffer fills
    /// or with a large push: for a caller that flushes once per progress
    /// pass (the group layer does), one `sendmsg` per pass however many
    /// times the layer above rings. On by default.
    pub flush_on_ring: bool,
    /// The peers [`TcpFabric::open`](super::TcpFabric::open) waits for (`None`: every peer, the
    /// default). The others may connect later: a member that starts late,
    /// or a restarted process taking a lost member's rank. Until then
    /// their status is [`PeerStatus::Waiting`](super::PeerStatus::Waiting) and [`Fabric::joined`](crate::Fabric::joined)
    /// leaves them out.
    pub wait_for: Option<PeerSet>,
    /// Refuse a connection whose source address is not the configured
    /// address (`addresses[r]`) of the rank `r` it claims. On by default;
    /// turn it off behind NAT or when members dial from another interface
    /// than the one they listen on.
    pub check_source_addr: bool,
    /// Keep the rows in a stat file in this directory (`None`, the
    /// default: on the heap), so that `spindle stat` on this host sees
    /// this member's rows and connections ([`stat`](super::stat)); `spindle run` and
    /// the bench use `/dev/shm`. A member killed with SIGKILL leaves its
    /// file behind (`spindle stat` shows it as crashed).
    pub stat_dir: Option<std::path::PathBuf>,
    /// The layer above's description of its row layout (shown by `spindle
    /// stat`, which rebuilds the layout from it). The group layer's
    /// `SmcLayout` summary; by default just the sizes and tag.
    pub layout_description: String,
    /// Run every connection inside TLS (rustls), with mutual
    /// authentication against the group's CA ([`tls`]). `None` (the
    /// default): plain TCP, authenticated by the group key only.
    pub tls: Option<tls::TlsConfig>,
    /// How long one connection's handshake may take (each accepted
    /// connection has its own deadline; a dialer's handshake too). A
    /// connection that has not completed by then is closed and counted
    /// in `handshakes_failed`.
    pub handshake_timeout: Duration,
    /// Accepted connections in handshake at once, at most; a new one over
    /// the bound closes the oldest (see `accept`).
    pub handshakes_pending_max: usize,
    /// As `handshakes_pending_max`, per source IP address.
    pub handshakes_pending_per_source_max: usize,
}

/// Default of [`TcpOptions::handshake_timeout`].
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default of [`TcpOptions::handshakes_pending_max`].
pub const HANDSHAKES_PENDING_MAX_DEFAULT: usize = 1024;
/// Default of [`TcpOptions::handshakes_pending_per_source_max`].
pub const HANDSHAKES_PENDING_PER_SOURCE_MAX_DEFAULT: usize = 64;
/// Largest [`TcpOptions::handshakes_pending_max`] (each pending handshake
/// holds a socket).
pub const HANDSHAKES_PENDING_MAX: usize = 65536;

/// Default of [`TcpOptions::send_stall_max`]: no bound beyond
/// `peer_timeout`. A group with membership sets it below its suspicion
/// timeout (`spindle run` uses a quarter of it).
pub const SEND_STALL_MAX_DEFAULT: Duration = Duration::MAX;

/// Largest push that coalescing copies (larger ones go straight from the
/// row, after the pending bytes, in the same `sendmsg`).
pub const COALESCE_PUSH_BYTES_MAX: usize = 4096;
/// Pending bytes per peer before a flush is forced.
pub(super) const PENDING_BYTES: usize = 64 << 10;
const _: () = assert!(COALESCE_PUSH_BYTES_MAX + FRAME_HEADER_BYTES <= PENDING_BYTES);

impl TcpOptions {
    pub fn new(
        group: &str,
        row_len_bytes: usize,
        layout_tag: u64,
        addresses: Vec<SocketAddr>,
        key: Vec<u8>,
    ) -> TcpOptions {
        let layout_description = format!(
            "members={} row_len_bytes={row_len_bytes} tag={layout_tag:#x}",
            addresses.len()
        );
        TcpOptions {
            group: group.to_string(),
            row_len_bytes,
            layout_tag,
            addresses,
            listen: None,
            key,
            join_timeout: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(3),
            send_stall_max: SEND_STALL_MAX_DEFAULT,
            coalesce: false,
            flush_on_ring: true,
            wait_for: None,
            check_source_addr: true,
            stat_dir: None,
            layout_description,
            tls: None,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            handshakes_pending_max: HANDSHAKES_PENDING_MAX_DEFAULT,
            handshakes_pending_per_source_max: HANDSHAKES_PENDING_PER_SOURCE_MAX_DEFAULT,
        }
    }

    /// The peers `open` must wait for, as a mask (never `rank` itself).
    pub(crate) fn required(&self, rank: usize) -> u64 {
        let all = PeerSet::all(self.addresses.len()).0;
        self.wait_for.map(|w| w.0).unwrap_or(all) & all & !(1u64 << rank)
    }

    pub(crate) fn validate(&self, rank: usize) -> Result<(), FabricError> {
        crate::shm::validate_group_name(&self.group)?;
        let member_count = self.addresses.len();
        if member_count == 0 || member_count > MEMBERS_MAX {
            return Err(FabricError::InvalidOption(format!(
                "{member_count} member addresses given; a group has 1..={MEMBERS_MAX} members"
            )));
        }
        if rank >= member_count {
            return Err(FabricError::RankOutOfRange { rank, member_count });
        }
        if self.row_len_bytes == 0 || self.row_len_bytes > ROW_BYTES_MAX {
            return Err(FabricError::InvalidOption(format!(
                "row_len_bytes {} must be in 1..={ROW_BYTES_MAX}",
                self.row_len_bytes
            )));
        }
        if let Some(w) = self.wait_for {
            let all = PeerSet::all(member_count).0;
            if w.0 & !all != 0 {
                return Err(FabricError::InvalidOption(format!(
                    "wait_for names ranks {:?}, but the group has {member_count} members",
                    PeerSet(w.0 & !all).iter().collect::<Vec<_>>()
                )));
            }
        }
        if self.peer_timeout < Duration::from_millis(100) {
            return Err(FabricError::InvalidOption(format!(
                "peer_timeout {} ms must be at least 100 ms",
                self.peer_timeout.as_millis()
            )));
        }
        if self.handshake_timeout < Duration::from_millis(10) || self.handshake_timeout > Duration::from_secs(3600) {
            return Err(FabricError::InvalidOption(format!(
                "handshake_timeout {} ms must be in 10..=3600000 ms",
                self.handshake_timeout.as_millis()
            )));
        }
        if !(1..=HANDSHAKES_PENDING_MAX).contains(&self.handshakes_pending_max) {
            return Err(FabricError::InvalidOption(format!(
                "handshakes_pending_max {} must be in 1..={HANDSHAKES_PENDING_MAX}",
                self.handshakes_pending_max
            )));
        }
        if !(1..=self.handshakes_pending_max).contains(&self.handshakes_pending_per_source_max) {
            return Err(FabricError::InvalidOption(format!(
                "handshakes_pending_per_source_max {} must be in 1..=handshakes_pending_max ({})",
                self.handshakes_pending_per_source_max, self.handshakes_pending_max
            )));
        }
        Ok(())
    }
}
