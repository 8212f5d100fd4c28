//! Transports: how the members of a group reach each other, and the one
//! fabric type ([`AnyFabric`]) a [`crate::Group`] runs on whichever was
//! chosen.
//!
//! - [`Transport::Shm`]: every member on this host maps one file under
//!   `/dev/shm` (mode 0600); a push is a memory fence, zero copies.
//! - [`Transport::Tcp`]: members on any hosts; each keeps a copy of every
//!   peer's row and a push sends the changed bytes as frames. Connections
//!   are authenticated with the group key (HMAC), optionally over TLS.
//! - [`Transport::Ofi`]: members on RDMA clusters (verbs, EFA, CXI, or
//!   libfabric's software providers): pushes are libfabric RMA writes into
//!   the peers' registered rows; addresses and keys travel over a tcp
//!   control plane (the same addresses and group key as tcp). Needs the
//!   Cargo feature `ofi` (docs/ofi.md); without it, joining fails with
//!   how to rebuild.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use spindle_fabric::doorbell::Doorbell;
use spindle_fabric::shm::{ShmFabric, ShmOptions};
use spindle_fabric::tcp::tls::TlsConfig;
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, FabricError, PeerSet, RowRef};
use spindle_group::layout::SmcLayout;
use spindle_group::GroupConfig;

use crate::config::TlsFiles;
use crate::Error;

/// How the members of a group reach each other.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Transport {
    /// Shared memory on this host (the default): the fastest path.
    #[default]
    Shm,
    /// TCP between any hosts.
    Tcp(TcpTransport),
    /// libfabric RMA writes (feature `ofi`), with a tcp control plane.
    Ofi(OfiTransport),
}

/// The settings of an ofi group: its control plane (addresses, key,
/// timeouts: every member's `host:port` must be reachable over IP) and
/// the libfabric provider.
#[derive(Clone, Debug, PartialEq)]
pub struct OfiTransport {
    /// The control plane, as a tcp group's settings (TLS is not used).
    pub tcp: TcpTransport,
    /// The libfabric provider: "verbs", "efa", "cxi", "tcp", "sockets", ...
    pub provider: String,
}

impl OfiTransport {
    /// Members at `members` sharing `key`, over `provider`.
    pub fn new(members: Vec<SocketAddr>, key: impl Into<Vec<u8>>, provider: &str) -> OfiTransport {
        OfiTransport {
            tcp: TcpTransport::new(members, key),
            provider: provider.to_string(),
        }
    }
}

/// The settings of a tcp group that are not the group layer's.
#[derive(Clone, Debug, PartialEq)]
pub struct TcpTransport {
    /// Every member's `host:port`, by rank (its length is the group's size).
    pub members: Vec<SocketAddr>,
    /// The group key every member shares (at least 16 bytes): a connection
    /// that cannot prove it knows the key is refused.
    pub key: Vec<u8>,
    /// TLS with these PEM files, or plain tcp (authenticated by the key).
    pub tls: Option<TlsFiles>,
    /// Bind here instead of `members[rank]` (e.g. `0.0.0.0:7100`).
    pub listen: Option<SocketAddr>,
    /// Refuse a connection whose source address is not the configured
    /// address of the member it claims to be (turn off behind NAT).
    pub check_source_addr: bool,
    /// A peer silent for this long is gone.
    pub peer_timeout: Duration,
    /// How long one connection's handshake may take.
    pub handshake_timeout: Duration,
    /// Accepted connections in handshake at once, at most.
    pub handshakes_pending_max: usize,
}

impl TcpTransport {
    /// Members at `members` sharing `key`, no TLS, the default timeouts.
    pub fn new(members: Vec<SocketAddr>, key: impl Into<Vec<u8>>) -> TcpTransport {
        TcpTransport {
            members,
            key: key.into(),
            tls: None,
            listen: None,
            check_source_addr: true,
            peer_timeout: Duration::from_millis(PEER_TIMEOUT_MS_DEFAULT),
            handshake_timeout: spindle_fabric::tcp::HANDSHAKE_TIMEOUT_DEFAULT,
            handshakes_pending_max: spindle_fabric::tcp::HANDSHAKES_PENDING_MAX_DEFAULT,
        }
    }
}

/// The tcp peer timeout by default (`group.peer_timeout_ms`).
pub const PEER_TIMEOUT_MS_DEFAULT: u64 = 3_000;
/// Group keys shorter than this are refused (a guessable key protects nothing).
pub const KEY_BYTES_MIN: usize = crate::config::KEY_BYTES_MIN;

/// Whichever fabric the builder opened: every [`Fabric`] call goes to it.
pub enum AnyFabric {
    /// Shared memory on this host.
    Shm(ShmFabric),
    /// TCP.
    Tcp(TcpFabric),
    /// libfabric RMA writes.
    #[cfg(feature = "ofi")]
    Ofi(spindle_fabric::ofi::OfiFabric),
}

macro_rules! each {
    ($self:ident, $f:ident => $e:expr) => {
        match $self {
            AnyFabric::Shm($f) => $e,
            AnyFabric::Tcp($f) => $e,
            #[cfg(feature = "ofi")]
            AnyFabric::Ofi($f) => $e,
        }
    };
}

impl Fabric for AnyFabric {
    #[inline]
    fn member_rank(&self) -> usize {
        each!(self, f => f.member_rank())
    }
    #[inline]
    fn member_count(&self) -> usize {
        each!(self, f => f.member_count())
    }
    #[inline]
    fn row_len_bytes(&self) -> usize {
        each!(self, f => f.row_len_bytes())
    }
    #[inline]
    fn row(&self, rank: usize) -> RowRef<'_> {
        each!(self, f => f.row(rank))
    }
    #[inline]
    fn push(&self, range: Range<usize>, peers: PeerSet) -> Result<(), FabricError> {
        each!(self, f => f.push(range, peers))
    }
    #[inline]
    fn push_vectored(&self, ranges: &[Range<usize>], peers: PeerSet) -> Result<(), FabricError> {
        each!(self, f => f.push_vectored(ranges, peers))
    }
    fn check_peers(&self) -> Result<(), FabricError> {
        each!(self, f => f.check_peers())
    }
    fn lost_peers(&self) -> PeerSet {
        each!(self, f => f.lost_peers())
    }
    fn joined(&self) -> PeerSet {
        each!(self, f => f.joined())
    }
    fn doorbell(&self) -> &dyn Doorbell {
        each!(self, f => f.doorbell())
    }
    fn describe(&self) -> String {
        each!(self, f => f.describe())
    }
    #[inline]
    fn receive_now(&self) -> bool {
        each!(self, f => f.receive_now())
    }
    fn receive_makes_system_calls(&self) -> bool {
        each!(self, f => f.receive_makes_system_calls())
    }
    #[inline]
    fn flush(&self) {
        each!(self, f => f.flush())
    }
    fn declare_payload_region(&self, range: Range<usize>) {
        each!(self, f => f.declare_payload_region(range))
    }
}

/// Open `transport` for member `rank` of the group `config` describes.
/// `joining`: a member joining a running group waits for nobody at open.
pub(crate) fn open(
    transport: &Transport,
    config: &GroupConfig,
    rank: usize,
    joining: bool,
) -> Result<AnyFabric, Error> {
    let layout = SmcLayout::new(config);
    match transport {
        Transport::Shm => {
            let mut options = ShmOptions::new(
                &config.name,
                config.members,
                layout.row.row_len_bytes(),
                layout.row.tag(),
            );
            options.layout_description = layout.row.summary();
            Ok(AnyFabric::Shm(ShmFabric::open(&options, rank)?))
        }
        Transport::Tcp(tcp) => {
            let options = tcp_options(tcp, config, &layout, rank, joining)?;
            Ok(AnyFabric::Tcp(TcpFabric::open(&options, rank)?))
        }
        Transport::Ofi(ofi) => open_ofi(ofi, config, &layout, rank, joining),
    }
}

/// The ofi fabric for a group: the tcp recipe's options (row layout, send
/// stall, addresses, key, timeouts) become its control plane's.
#[cfg(feature = "ofi")]
fn open_ofi(
    ofi: &OfiTransport,
    config: &GroupConfig,
    layout: &SmcLayout,
    rank: usize,
    joining: bool,
) -> Result<AnyFabric, Error> {
    if ofi.tcp.tls.is_some() {
        return Err(Error::Config(
            "the ofi transport's control plane does not use TLS (leave the TLS files out)".into(),
        ));
    }
    let options = ofi_options(tcp_options(&ofi.tcp, config, layout, rank, joining)?, &ofi.provider);
    Ok(AnyFabric::Ofi(spindle_fabric::ofi::OfiFabric::open(&options, rank)?))
}

/// The ofi fabric's options over `provider`, its control plane the tcp
/// fabric of `tcp` (row layout, send stall, addresses, key, timeouts).
#[cfg(feature = "ofi")]
pub fn ofi_options(tcp: TcpOptions, provider: &str) -> spindle_fabric::ofi::OfiOptions {
    let mut options = spindle_fabric::ofi::OfiOptions::new(
        &tcp.group,
        tcp.row_len_bytes,
        tcp.layout_tag,
        Vec::new(),
        Vec::new(),
        provider,
    );
    options.send_stall_max = tcp.send_stall_max;
    options.tcp = tcp;
    options
}

#[cfg(not(feature = "ofi"))]
fn open_ofi(
    ofi: &OfiTransport,
    _config: &GroupConfig,
    _layout: &SmcLayout,
    _rank: usize,
    _joining: bool,
) -> Result<AnyFabric, Error> {
    Err(Error::Config(format!(
        "transport ofi (provider '{}'): this build has no libfabric support; rebuild with the Cargo \
         feature `ofi` (e.g. `cargo build --release -p spindle-cli --features ofi`; needs libfabric-dev)",
        ofi.provider
    )))
}

/// The tcp fabric's options for a group: the layout's row length and tag,
/// the addresses and key, and the timeouts that must agree with the group
/// layer's (a push waits for one peer at most a quarter of the suspicion
/// timeout, so one cut-off peer cannot stall the heartbeats to the others
/// until they suspect this member too).
pub fn tcp_options(
    tcp: &TcpTransport,
    config: &GroupConfig,
    layout: &SmcLayout,
    rank: usize,
    joining: bool,
) -> Result<TcpOptions, Error> {
    if tcp.members.len() != config.members {
        return Err(Error::Config(format!(
            "the tcp transport lists {} member addresses but the group has {} members",
            tcp.members.len(),
            config.members
        )));
    }
    let mut options = tcp_common(
        tcp,
        &config.name,
        layout.row.row_len_bytes(),
        layout.row.tag(),
        layout.row.summary(),
        config.join_timeout,
    )?;
    // Rows in /dev/shm/spindle@tcp-<group>@<rank>, for the live-counter
    // reader (which rebuilds the layout from the description).
    options.stat_dir = Some(PathBuf::from("/dev/shm"));
    options.send_stall_max = send_stall_max(config);
    // Coalesce pushes; every progress pass flushes them (`Fabric::flush`).
    options.coalesce = true;
    options.flush_on_ring = false;
    // Wait at open only for the first view's other members; a joiner waits
    // for nobody (the group admits it once it hears it).
    options.wait_for = Some(if joining {
        PeerSet::default()
    } else {
        PeerSet(config.initial_ranks().iter().fold(0u64, |m, r| m | 1 << r) & !(1u64 << rank))
    });
    Ok(options)
}

/// The tcp options every fabric of a group shares: the addresses, key,
/// TLS and listen address of `tcp`, and its timeouts, for rows of
/// `row_len_bytes` with layout `tag`.
fn tcp_common(
    tcp: &TcpTransport,
    name: &str,
    row_len_bytes: usize,
    tag: u64,
    description: String,
    join_timeout: Duration,
) -> Result<TcpOptions, Error> {
    if tcp.key.len() < KEY_BYTES_MIN {
        return Err(Error::Config(format!(
            "the group key has {} bytes; at least {KEY_BYTES_MIN} are needed",
            tcp.key.len()
        )));
    }
    let mut options = TcpOptions::new(name, row_len_bytes, tag, tcp.members.clone(), tcp.key.clone());
    options.layout_description = description;
    options.listen = tcp.listen;
    options.join_timeout = join_timeout;
    options.peer_timeout = tcp.peer_timeout;
    options.check_source_addr = tcp.check_source_addr;
    options.handshake_timeout = tcp.handshake_timeout;
    options.handshakes_pending_max = tcp.handshakes_pending_max;
    options.handshakes_pending_per_source_max = options
        .handshakes_pending_per_source_max
        .min(tcp.handshakes_pending_max);
    if let Some(files) = &tcp.tls {
        options.tls = Some(TlsConfig::from_files(&files.cert, &files.key, &files.ca)?);
    }
    Ok(options)
}

/// The fabric of a sharded group's point-to-point queries
/// ([`spindle_group::query`]): shared memory `{group}.p2p`, or on tcp (and
/// ofi, whose control plane is tcp) the members' `query_addresses`. It
/// waits, up to `join_timeout`, for every member to open it.
pub(crate) fn open_query_fabric(
    transport: &Transport,
    name: &str,
    members: usize,
    rank: usize,
    query_addresses: Option<&[SocketAddr]>,
    join_timeout: Duration,
) -> Result<AnyFabric, Error> {
    let layout = spindle_group::QueryLayout::new(members);
    let fabric = match transport {
        Transport::Shm => {
            let mut options = ShmOptions::new(name, members, layout.row_len_bytes(), layout.tag());
            options.layout_description = layout.summary();
            AnyFabric::Shm(ShmFabric::open(&options, rank)?)
        }
        Transport::Tcp(tcp) | Transport::Ofi(OfiTransport { tcp, .. }) => {
            let Some(addresses) = query_addresses else {
                return Err(Error::Config(
                    "queries on tcp need an address of their own for every member (each member's address \
                     carries its shard's group): set GroupBuilder::query_addresses"
                        .into(),
                ));
            };
            if addresses.len() != members {
                return Err(Error::Config(format!(
                    "query_addresses lists {} addresses but the group has {members} members",
                    addresses.len()
                )));
            }
            if let Some(a) = addresses.iter().find(|a| tcp.members.contains(a)) {
                return Err(Error::Config(format!(
                    "query address {a} is also a member's address: the query channel needs addresses of its own"
                )));
            }
            let mut q = tcp.clone();
            q.members = addresses.to_vec();
            q.listen = None;
            let mut options = tcp_common(
                &q,
                name,
                layout.row_len_bytes(),
                layout.tag(),
                layout.summary(),
                join_timeout,
            )?;
            options.wait_for = Some(PeerSet(PeerSet::all(members).0 & !(1u64 << rank)));
            AnyFabric::Tcp(TcpFabric::open(&options, rank)?)
        }
    };
    spindle_fabric::wait_all_joined(&fabric, name, join_timeout)?;
    Ok(fabric)
}

/// The longest a push waits for one peer: a quarter of the suspicion
/// timeout, always below it (invariant: a member never stalls its own
/// heartbeats past the point where the others would suspect it).
pub fn send_stall_max(config: &GroupConfig) -> Duration {
    let stall = config.suspect_timeout / 4;
    assert!(stall < config.suspect_timeout, "send stall below the suspicion timeout");
    stall
}
