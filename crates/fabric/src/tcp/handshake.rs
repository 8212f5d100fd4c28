//! The tcp fabric's connection handshake, sans-IO: both ends prove that
//! they know the group's shared key (HMAC-SHA256 challenge–response) and
//! agree on the group, before a single byte of group data flows.
//!
//! Both ends run the same three steps, each "send mine, read theirs":
//!
//! ```text
//!  dialer (rank d)                               listener (rank l)
//!  HELLO(d, nonce_d) ─────────────┐┌──────────── HELLO(l, nonce_l)
//!  PROOF mac(key, hello_d‖hello_l)┘└ PROOF mac(key, hello_l‖hello_d)
//!  ACCEPT or REFUSE(reason) ◀──────▶ ACCEPT or REFUSE(reason)
//! ```
//!
//! A side that finds something wrong (group name, layout, rank, a proof
//! that does not verify) sends REFUSE with the reason in place of its next
//! message and stops; the other side reads the REFUSE where it expected a
//! PROOF or an ACCEPT and stops too, so both report the fault. Each proof
//! covers both nonces, so it cannot be replayed on another connection,
//! and its own hello first, so it cannot be reflected back.
//!
//! ```text
//!  HELLO, 128 bytes, little-endian          REPLY, 40 bytes
//!  +0   magic u64 = "SPNDLTCP"              +0  kind u8: 1 PROOF, 2 ACCEPT, 3 REFUSE
//!  +8   version u32 = 1                     +1  reason u8 (REFUSE; see Reason)
//!  +12  rank u32                            +2  zero [6]
//!  +16  member_count u32                    +8  mac [32] (PROOF), zero otherwise
//!  +20  group_len u32 (1..=48)
//!  +24  row_len_bytes u64
//!  +32  layout_tag u64
//!  +40  nonce [32]
//!  +72  group name [48], zero-padded
//!  +120 zero [8]
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const HELLO_BYTES: usize = 128;
pub const REPLY_BYTES: usize = 40;
pub const NONCE_BYTES: usize = 32;
pub const GROUP_NAME_BYTES_MAX: usize = 48;
const MAGIC: u64 = u64::from_le_bytes(*b"SPNDLTCP");
const VERSION: u32 = 1;
const MAC_BYTES: usize = 32;
const PROOF_CONTEXT: &[u8] = b"spindle-tcp-v1 proof";

const KIND_PROOF: u8 = 1;
const KIND_ACCEPT: u8 = 2;
const KIND_REFUSE: u8 = 3;

const _: () = assert!(72 + GROUP_NAME_BYTES_MAX + 8 == HELLO_BYTES);
const _: () = assert!(8 + MAC_BYTES == REPLY_BYTES);

/// Why a side refused the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The peer did not prove the group key.
    WrongKey = 1,
    GroupName = 2,
    /// Member count, row length or layout tag differ.
    Layout = 3,
    /// The peer's rank is not the one expected on this connection.
    Rank = 4,
    /// Not a Spindle tcp peer, or another protocol version.
    Version = 5,
    /// Malformed message.
    Malformed = 6,
    /// A member with this rank is still connected to the refusing side
    /// (its close not yet noticed, or a second process with the same
    /// rank). A dialer retries until its deadline.
    Busy = 7,
    /// The connection came from an address other than the configured
    /// address of the rank the peer claims.
    Source = 8,
}

impl Reason {
    fn from_u8(b: u8) -> Reason {
        match b {
            1 => Reason::WrongKey,
            2 => Reason::GroupName,
            3 => Reason::Layout,
            4 => Reason::Rank,
            5 => Reason::Version,
            7 => Reason::Busy,
            8 => Reason::Source,
            _ => Reason::Malformed,
        }
    }

    /// What a person should read.
    pub fn explain(self) -> &'static str {
        match self {
            Reason::WrongKey => "wrong group key (the members' key files differ)",
            Reason::GroupName => "different group name",
            Reason::Layout => "different group layout (members, window or slot size differ)",
            Reason::Rank => "unexpected member id on this connection",
            Reason::Version => "not a Spindle tcp peer of this version",
            Reason::Malformed => "malformed handshake message",
            Reason::Busy => "a member with this id is still connected there (the old connection's close not yet noticed, or two processes with the same member id)",
            Reason::Source => "the connection's source address is not the configured address of this member id (set check_source_addr = false behind NAT)",
        }
    }
}

/// How a handshake failed, from this side's point of view.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// This side refused the peer (and told it why).
    #[error("refused it: {detail}")]
    Refused { reason: Reason, detail: String },
    /// The peer refused this side.
    #[error("it refused this member: {}", .0.explain())]
    RefusedByPeer(Reason),
}

/// What this side announces.
#[derive(Clone, Debug)]
pub struct Hello {
    pub rank: u32,
    pub member_count: u32,
    pub row_len_bytes: u64,
    pub layout_tag: u64,
    pub group: String,
    pub nonce: [u8; NONCE_BYTES],
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        assert!(
            !self.group.is_empty() && self.group.len() <= GROUP_NAME_BYTES_MAX,
            "group name length checked by the caller"
        );
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..20].copy_from_slice(&self.member_count.to_le_bytes());
        b[20..24].copy_from_slice(&(self.group.len() as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.row_len_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.layout_tag.to_le_bytes());
        b[40..72].copy_from_slice(&self.nonce);
        b[72..72 + self.group.len()].copy_from_slice(self.group.as_bytes());
        b
    }

    /// Decode and check the fixed fields; `Err` carries the reason.
    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello, (Reason, String)> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        if u64_at(0) != MAGIC || u32_at(8) != VERSION {
            return Err((Reason::Version, format!("magic {:#x} version {}", u64_at(0), u32_at(8))));
        }
        let group_len = u32_at(20) as usize;
        if group_len == 0 || group_len > GROUP_NAME_BYTES_MAX {
            return Err((Reason::Malformed, format!("group name length {group_len}")));
        }
        let name = &b[72..72 + group_len];
        if b[72 + group_len..].iter().any(|x| *x != 0) {
            return Err((Reason::Malformed, "bytes after the group name".into()));
        }
        let group = std::str::from_utf8(name)
            .map_err(|_| (Reason::Malformed, "group name is not UTF-8".to_string()))?
            .to_string();
        Ok(Hello {
            rank: u32_at(12),
            member_count: u32_at(16),
            row_len_bytes: u64_at(24),
            layout_tag: u64_at(32),
            group,
            nonce: b[40..72].try_into().expect("32"),
        })
    }
}

/// Encode a reply message.
fn reply(kind: u8, reason: u8, mac: &[u8; MAC_BYTES]) -> [u8; REPLY_BYTES] {
    let mut b = [0u8; REPLY_BYTES];
    b[0] = kind;
    b[1] = reason;
    b[8..].copy_from_slice(mac);
    b
}

fn refuse(reason: Reason) -> [u8; REPLY_BYTES] {
    reply(KIND_REFUSE, reason as u8, &[0; MAC_BYTES])
}

/// Which rank the peer may have on this connection.
#[derive(Clone, Copy, Debug)]
pub enum ExpectRank {
    /// The dialer knows whom it dialed.
    Exactly(u32),
    /// The listener accepts any rank above its own (higher ranks dial).
    Above(u32),
    /// As `Above(rank)`, but a rank in the bit-mask `busy` (still
    /// connected) is refused with [`Reason::Busy`].
    AboveFree { rank: u32, busy: u64 },
}

/// One side of one handshake. Drive it: send [`Handshake::hello`], then
/// feed each message read from the peer to the matching `on_*` method and
/// send what it returns.
pub struct Handshake {
    key: Vec<u8>,
    mine: Hello,
    mine_bytes: [u8; HELLO_BYTES],
    expect: ExpectRank,
    theirs: Option<(Hello, [u8; HELLO_BYTES])>,
    /// Listener side: the connection's source address and the configured
    /// address of every rank (see [`Handshake::check_source`]).
    source: Option<(std::net::IpAddr, Vec<std::net::IpAddr>)>,
}

/// A message to send, and whether the handshake failed with it.
pub type Step = Result<[u8; REPLY_BYTES], ([u8; REPLY_BYTES], HandshakeError)>;

impl Handshake {
    pub fn new(key: &[u8], mine: Hello, expect: ExpectRank) -> Handshake {
        let mine_bytes = mine.encode();
        Handshake {
            key: key.to_vec(),
            mine,
            mine_bytes,
            expect,
            theirs: None,
            source: None,
        }
    }

    /// Refuse (with [`Reason::Source`]) a peer whose connection comes from
    /// `from` when the rank it claims is configured at another address.
    /// `addresses[r]` is member `r`'s configured address.
    pub fn check_source(&mut self, from: std::net::IpAddr, addresses: &[std::net::SocketAddr]) {
        self.source = Some((
            canonical_ip(from),
            addresses.iter().map(|a| canonical_ip(a.ip())).collect(),
        ));
    }

    /// Change which rank the peer may have, before its HELLO arrives (the
    /// listener learns who is still connected only then).
    pub fn set_expect(&mut self, expect: ExpectRank) {
        assert!(self.theirs.is_none(), "the expectation is set before the peer's hello");
        self.expect = expect;
    }

    /// This side's HELLO, sent first.
    pub fn hello(&self) -> [u8; HELLO_BYTES] {
        self.mine_bytes
    }

    /// The peer's rank, once its HELLO was accepted.
    pub fn peer_rank(&self) -> Option<usize> {
        self.theirs.as_ref().map(|(h, _)| h.rank as usize)
    }

    /// The peer's HELLO arrived: check it; send the returned PROOF (or
    /// REFUSE, and stop).
    pub fn on_hello(&mut self, bytes: &[u8; HELLO_BYTES]) -> Step {
        let fail = |reason: Reason, detail: String| Err((refuse(reason), HandshakeError::Refused { reason, detail }));
        let theirs = match Hello::decode(bytes) {
            Ok(h) => h,
            Err((reason, detail)) => return fail(reason, detail),
        };
        if theirs.group != self.mine.group {
            return fail(
                Reason::GroupName,
                format!(
                    "it belongs to group '{}', this member to '{}'",
                    theirs.group, self.mine.group
                ),
            );
        }
        if (theirs.member_count, theirs.row_len_bytes, theirs.layout_tag)
            != (self.mine.member_count, self.mine.row_len_bytes, self.mine.layout_tag)
        {
            return fail(
                Reason::Layout,
                format!(
                    "it has members={} row_len_bytes={} layout_tag={:#x}, this member members={} row_len_bytes={} layout_tag={:#x}",
                    theirs.member_count,
                    theirs.row_len_bytes,
                    theirs.layout_tag,
                    self.mine.member_count,
                    self.mine.row_len_bytes,
                    self.mine.layout_tag
                ),
            );
        }
        let rank_ok = match self.expect {
            ExpectRank::Exactly(r) => theirs.rank == r,
            ExpectRank::Above(r) | ExpectRank::AboveFree { rank: r, .. } => {
                theirs.rank > r && theirs.rank < self.mine.member_count
            }
        };
        if !rank_ok {
            return fail(
                Reason::Rank,
                format!("it says it is member {}, expected {:?}", theirs.rank, self.expect),
            );
        }
        if let ExpectRank::AboveFree { busy, .. } = self.expect {
            if theirs.rank < 64 && busy & (1u64 << theirs.rank) != 0 {
                return fail(
                    Reason::Busy,
                    format!("member {} is still connected to this member", theirs.rank),
                );
            }
        }
        if let Some((from, addresses)) = &self.source {
            if let Some(want) = addresses.get(theirs.rank as usize) {
                if want != from {
                    return fail(
                        Reason::Source,
                        format!(
                            "it says it is member {} but connected from {from}; member {} is configured at {want} (set check_source_addr = false behind NAT)",
                            theirs.rank, theirs.rank
                        ),
                    );
                }
            }
        }
        if theirs.nonce == self.mine.nonce {
            return fail(Reason::Malformed, "it echoed this member's nonce".into());
        }
        let proof = self.mac(&self.mine_bytes, bytes);
        self.theirs = Some((theirs, *bytes));
        Ok(reply(KIND_PROOF, 0, &proof))
    }

    /// The peer's PROOF (or REFUSE) arrived: verify it; send the returned
    /// ACCEPT (or REFUSE, and stop).
    pub fn on_proof(&mut self, bytes: &[u8; REPLY_BYTES]) -> Step {
        let (_, their_bytes) = self.theirs.as_ref().expect("on_hello succeeded before on_proof");
        match bytes[0] {
            KIND_PROOF => {}
            KIND_REFUSE => {
                return Err((
                    refuse(Reason::Malformed),
                    HandshakeError::RefusedByPeer(Reason::from_u8(bytes[1])),
                ))
            }
            other => {
                return Err((
                    refuse(Reason::Malformed),
                    HandshakeError::Refused {
                        reason: Reason::Malformed,
                        detail: format!("expected a proof, got message kind {other}"),
                    },
                ))
            }
        }
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(PROOF_CONTEXT);
        mac.update(their_bytes);
        mac.update(&self.mine_bytes);
        // Constant-time comparison.
        if mac.verify_slice(&bytes[8..]).is_err() {
            return Err((
                refuse(Reason::WrongKey),
                HandshakeError::Refused {
                    reason: Reason::WrongKey,
                    detail: "it did not prove the group key (its key file differs)".into(),
                },
            ));
        }
        Ok(reply(KIND_ACCEPT, 0, &[0; MAC_BYTES]))
    }

    /// The peer's verdict arrived: `Ok` means both sides accepted.
    pub fn on_verdict(&mut self, bytes: &[u8; REPLY_BYTES]) -> Result<(), HandshakeError> {
        match bytes[0] {
            KIND_ACCEPT if bytes[1..].iter().all(|b| *b == 0) => Ok(()),
            KIND_REFUSE => Err(HandshakeError::RefusedByPeer(Reason::from_u8(bytes[1]))),
            other => Err(HandshakeError::Refused {
                reason: Reason::Malformed,
                detail: format!("expected a verdict, got message kind {other}"),
            }),
        }
    }

    fn mac(&self, first: &[u8], second: &[u8]) -> [u8; MAC_BYTES] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(PROOF_CONTEXT);
        mac.update(first);
        mac.update(second);
        mac.finalize().into_bytes().into()
    }
}

/// An IPv4 address mapped into IPv6 compares as the IPv4 address.
fn canonical_ip(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Read `N` fresh random bytes from the kernel.
pub fn random_nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    use std::io::Read;
    let mut nonce = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: u32, group: &str, nonce: u8) -> Hello {
        Hello {
            rank,
            member_count: 3,
            row_len_bytes: 4096,
            layout_tag: 7,
            group: group.into(),
            nonce: [nonce; NONCE_BYTES],
        }
    }

    /// Run both sides to the end; the results of (dialer, listener).
    fn run(mut d: Handshake, mut l: Handshake) -> (Result<(), HandshakeError>, Result<(), HandshakeError>) {
        let (dh, lh) = (d.hello(), l.hello());
        let (dp, lp) = (d.on_hello(&lh), l.on_hello(&dh));
        let (dp, lp) = match (dp, lp) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                // The refusal is read where the proof was expected.
                let da = a.as_ref().map(|m| *m).unwrap_or_else(|(m, _)| *m);
                let lb = b.as_ref().map(|m| *m).unwrap_or_else(|(m, _)| *m);
                let dr = a
                    .map(|_| ())
                    .map_err(|(_, e)| e)
                    .and_then(|_| d.on_proof(&lb).map(|_| ()).map_err(|(_, e)| e));
                let lr = b
                    .map(|_| ())
                    .map_err(|(_, e)| e)
                    .and_then(|_| l.on_proof(&da).map(|_| ()).map_err(|(_, e)| e));
                return (dr, lr);
            }
        };
        let dv = d.on_proof(&lp);
        let lv = l.on_proof(&dp);
        let dm = dv.as_ref().map(|m| *m).unwrap_or_else(|(m, _)| *m);
        let lm = lv.as_ref().map(|m| *m).unwrap_or_else(|(m, _)| *m);
        let dr = dv.map_err(|(_, e)| e).and_then(|_| d.on_verdict(&lm));
        let lr = lv.map_err(|(_, e)| e).and_then(|_| l.on_verdict(&dm));
        (dr, lr)
    }

    #[test]
    fn members_with_the_same_key_accept_each_other() {
        let d = Handshake::new(b"secret", hello(2, "g", 1), ExpectRank::Exactly(0));
        let l = Handshake::new(b"secret", hello(0, "g", 2), ExpectRank::Above(0));
        assert_eq!(run(d, l), (Ok(()), Ok(())));
    }

    #[test]
    fn a_wrong_key_is_refused_on_both_sides() {
        let d = Handshake::new(b"guess", hello(1, "g", 1), ExpectRank::Exactly(0));
        let l = Handshake::new(b"secret", hello(0, "g", 2), ExpectRank::Above(0));
        let (dr, lr) = run(d, l);
        assert!(
            matches!(
                dr,
                Err(HandshakeError::Refused {
                    reason: Reason::WrongKey,
                    ..
                })
            ),
            "{dr:?}"
        );
        assert!(
            matches!(
                lr,
                Err(HandshakeError::Refused {
                    reason: Reason::WrongKey,
                    ..
                })
            ),
            "{lr:?}"
        );
    }

    #[test]
    fn a_wrong_group_name_is_refused_on_both_sides() {
        let d = Handshake::new(b"k", hello(1, "other", 1), ExpectRank::Exactly(0));
        let l = Handshake::new(b"k", hello(0, "g", 2), ExpectRank::Above(0));
        let (dr, lr) = run(d, l);
        assert!(
            matches!(
                dr,
                Err(HandshakeError::Refused {
                    reason: Reason::GroupName,
                    ..
                })
            ),
            "{dr:?}"
        );
        assert!(
            matches!(
                lr,
                Err(HandshakeError::Refused {
                    reason: Reason::GroupName,
                    ..
                })
            ),
            "{lr:?}"
        );
    }

    #[test]
    fn an_unexpected_rank_is_refused() {
        let d = Handshake::new(b"k", hello(0, "g", 1), ExpectRank::Exactly(0));
        let l = Handshake::new(b"k", hello(1, "g", 2), ExpectRank::Above(1));
        let (_, lr) = run(d, l);
        assert!(
            matches!(
                lr,
                Err(HandshakeError::Refused {
                    reason: Reason::Rank,
                    ..
                })
            ),
            "{lr:?}"
        );
    }

    #[test]
    fn a_rank_still_connected_is_refused_as_busy() {
        let d = Handshake::new(b"k", hello(2, "g", 1), ExpectRank::Exactly(0));
        let l = Handshake::new(b"k", hello(0, "g", 2), ExpectRank::AboveFree { rank: 0, busy: 0b100 });
        let (dr, lr) = run(d, l);
        assert_eq!(dr, Err(HandshakeError::RefusedByPeer(Reason::Busy)));
        assert!(
            matches!(
                lr,
                Err(HandshakeError::Refused {
                    reason: Reason::Busy,
                    ..
                })
            ),
            "{lr:?}"
        );
        let d = Handshake::new(b"k", hello(1, "g", 1), ExpectRank::Exactly(0));
        let l = Handshake::new(b"k", hello(0, "g", 2), ExpectRank::AboveFree { rank: 0, busy: 0b100 });
        assert_eq!(run(d, l), (Ok(()), Ok(())), "a free rank is accepted");
    }

    #[test]
    fn a_source_address_other_than_the_claimed_ranks_is_refused() {
        let addresses: Vec<std::net::SocketAddr> =
            vec!["10.0.0.1:7000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap()];
        let d = Handshake::new(b"k", hello(1, "g", 1), ExpectRank::Exactly(0));
        let mut l = Handshake::new(b"k", hello(0, "g", 2), ExpectRank::Above(0));
        l.check_source("10.0.0.9".parse().unwrap(), &addresses);
        let (dr, lr) = run(d, l);
        assert_eq!(dr, Err(HandshakeError::RefusedByPeer(Reason::Source)));
        match lr {
            Err(HandshakeError::Refused {
                reason: Reason::Source,
                detail,
            }) => {
                assert!(detail.contains("10.0.0.9") && detail.contains("10.0.0.2"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
        let d = Handshake::new(b"k", hello(1, "g", 1), ExpectRank::Exactly(0));
        let mut l = Handshake::new(b"k", hello(0, "g", 2), ExpectRank::Above(0));
        l.check_source("::ffff:10.0.0.2".parse().unwrap(), &addresses);
        assert_eq!(run(d, l), (Ok(()), Ok(())), "an IPv4-mapped source matches");
    }
}
