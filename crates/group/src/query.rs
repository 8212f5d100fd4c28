//! Point-to-point queries: one member asks another and gets a reply,
//! beside the total order. This is Derecho's p2p send and reply, used to
//! read from one replica of a shard. It runs over a fabric of its own
//! (shared memory `{group}.p2p`, or tcp on addresses of its own), so a
//! member can ask a shard it is not in.
//!
//! Every member's row has two boxes for each member: a **request box**
//! for what this member asks that member, and a **reply box** for what
//! this member answers it. Only the row's owner writes a box. The other
//! side reads the box once it sees the box's `seq` change.
//!
//! ```text
//!  row of member i, n members, B = QUERY_BOX_BYTES (4096):
//!  ┌── request box to 0 ──┬─ … ─┬── request box to n-1 ──┬── reply box to 0 ──┬─ … ─┬── reply box to n-1 ──┐
//!  │ QueryHeader │ bytes   │     │                        │ QueryHeader │ bytes │     │                      │
//!  └──────────────────────┴─────┴────────────────────────┴────────────────────┴─────┴──────────────────────┘
//!   offset of request box p: p·B          offset of reply box p: (n + p)·B
//!
//!  QueryHeader (#[repr(C)], 32 B):
//!   +0  seq     u64  the query's number from the asker to this peer: 1, 2, …; written last (Release)
//!   +8  len     u32  payload bytes (at most QUERY_PAYLOAD_BYTES_MAX)
//!   +12 status  u32  replies: STATUS_OK, or STATUS_REFUSED (the payload says why)
//!   +16 target  u64  requests: what the query is for (subgroup << 32 | shard); replies: 0
//!   +24 zero    u64  reserved, 0
//! ```
//!
//! **The protocol** (asker `i`, answerer `p`, one query outstanding per
//! pair):
//! 1. `i` writes the request into its request box for `p`, then its `seq`
//!    `k` with a Release store. It pushes the box to `p` in two pushes,
//!    the `seq` word last: a fabric that copies rows may deliver the
//!    pieces of one push in any order.
//! 2. `p` sees `seq` differ from the last query of `i` it answered (an
//!    Acquire load). It copies the request out, and the application
//!    answers. `p` writes the reply into its reply box for `i`, then `seq`
//!    `k` with a Release store, and pushes the box to `i` the same way.
//! 3. `i` sees `p`'s reply box with `seq == k` (an Acquire load) and
//!    copies the reply out.
//!
//! Neither side rewrites a box the other may be reading. The asker's next
//! request waits for the reply to this one, and the answerer's next reply
//! to `i` waits for `i`'s next request. So every copy is whole. The
//! copies use word-sized atomic loads and stores anyway
//! ([`RowRef::copy_atomic`]), so a member that restarts under the same
//! rank cannot make a reader's copy undefined behaviour.
//!
//! **Restarts.** A member restarted under its rank starts with a zeroed
//! row, and its queries start again at 1. The answerer serves any `seq`
//! that differs from the last one it served, not only the next one. A
//! restarted answerer may answer the last query it was asked once more.
//! The asker ignores that reply, because it has already taken one for
//! that `seq`.
//!
//! [`QueryChannel`] is driven like the rest of the protocol (`ask`,
//! `serve`, `take_reply`). It owns no thread, sleeps and reads no clock.

use std::sync::Arc;

use spindle_fabric::{Fabric, FabricError, PeerSet, RowRef};

use crate::sync::Ordering;

/// Bytes of one box: header and payload.
pub const QUERY_BOX_BYTES: usize = 4096;
/// Bytes of a box's header ([`QueryHeader`]).
pub const QUERY_HEADER_BYTES: usize = 32;
/// The longest request or reply.
pub const QUERY_PAYLOAD_BYTES_MAX: usize = QUERY_BOX_BYTES - QUERY_HEADER_BYTES;
/// A reply's status: the application answered.
pub const STATUS_OK: u32 = 0;
/// A reply's status: the query was not answered; the payload says why.
pub const STATUS_REFUSED: u32 = 1;

/// The header of a request or reply box (see the module docs).
#[repr(C)]
pub struct QueryHeader {
    pub seq: u64,
    pub len: u32,
    pub status: u32,
    pub target: u64,
    pub zero: u64,
}

const _: () = assert!(std::mem::size_of::<QueryHeader>() == QUERY_HEADER_BYTES);
const _: () = assert!(std::mem::offset_of!(QueryHeader, seq) == 0);
const _: () = assert!(std::mem::offset_of!(QueryHeader, len) == 8);
const _: () = assert!(std::mem::offset_of!(QueryHeader, status) == 12);
const _: () = assert!(std::mem::offset_of!(QueryHeader, target) == 16);
const _: () = assert!(std::mem::offset_of!(QueryHeader, zero) == 24);
const _: () = assert!(QUERY_BOX_BYTES.is_multiple_of(spindle_fabric::CACHE_LINE_BYTES));

/// What a query is for: a shard of a subgroup (by their indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryTarget {
    pub subgroup: u32,
    pub shard: u32,
}

impl QueryTarget {
    fn pack(self) -> u64 {
        (self.subgroup as u64) << 32 | self.shard as u64
    }
    fn unpack(word: u64) -> QueryTarget {
        QueryTarget {
            subgroup: (word >> 32) as u32,
            shard: word as u32,
        }
    }
}

/// The application's answer to a query: `answer(asker, target, request,
/// reply)` fills `reply` or says why it does not answer.
pub type Answer<'a> = dyn FnMut(usize, QueryTarget, &[u8], &mut Vec<u8>) -> Result<(), String> + 'a;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("a query of {len} B is longer than the {max} B a query box holds")]
    TooLong { len: usize, max: usize },
    #[error("member {peer} is not a member of this {members}-member group")]
    NoSuchMember { peer: usize, members: usize },
    #[error("member {peer} is this member: answer the query locally")]
    ToSelf { peer: usize },
    #[error("a query to member {peer} is still waiting for its reply (one at a time per member)")]
    Outstanding { peer: usize },
    #[error("member {peer} did not answer the query: {reason}")]
    Refused { peer: usize, reason: String },
    #[error("member {peer} is gone (its process exited or crashed); the query has no answer")]
    PeerGone { peer: usize },
    #[error("the query channel's fabric has rows of {found} B; the layout needs {needed} B")]
    RowTooShort { found: usize, needed: usize },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Where the boxes are in a row of an `members`-member query fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLayout {
    pub members: usize,
}

impl QueryLayout {
    pub fn new(members: usize) -> QueryLayout {
        QueryLayout { members }
    }

    /// Length of every row.
    pub fn row_len_bytes(&self) -> usize {
        2 * self.members * QUERY_BOX_BYTES
    }

    /// Offset of the owner's request box for `peer`.
    pub fn request_box(&self, peer: usize) -> usize {
        peer * QUERY_BOX_BYTES
    }

    /// Offset of the owner's reply box for `peer`.
    pub fn reply_box(&self, peer: usize) -> usize {
        (self.members + peer) * QUERY_BOX_BYTES
    }

    /// A tag that differs between layouts (members who disagree refuse
    /// each other at open).
    pub fn tag(&self) -> u64 {
        u64::from_le_bytes(*b"QUERY\0\0\x01") ^ (self.members as u64) << 40 ^ QUERY_BOX_BYTES as u64
    }

    /// One line for a layout mismatch error.
    pub fn summary(&self) -> String {
        format!(
            "query boxes: {} members, {QUERY_BOX_BYTES} B per box, {} B rows",
            self.members,
            self.row_len_bytes()
        )
    }
}

/// `len` rounded up to whole words (boxes are copied a word at a time).
fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// One member's end of the query fabric (see the module docs).
pub struct QueryChannel<F: Fabric> {
    fabric: Arc<F>,
    layout: QueryLayout,
    me: usize,
    /// Per peer: the last query sent to it (0: none yet).
    asked: Vec<u64>,
    /// Per peer: the last query whose reply was taken.
    answered: Vec<u64>,
    /// Per peer: the last of its queries this member answered.
    served: Vec<u64>,
    /// A request copied out of a peer's row (one box, allocated once).
    request: Vec<u8>,
    /// The application's reply (kept between queries).
    reply: Vec<u8>,
    /// Queries answered, replies taken (counters for `spindle stat`).
    pub served_total: u64,
    pub replies_total: u64,
}

impl<F: Fabric> QueryChannel<F> {
    /// The channel over `fabric`, whose rows must follow [`QueryLayout`].
    pub fn new(fabric: Arc<F>) -> Result<QueryChannel<F>, QueryError> {
        let members = fabric.member_count();
        let layout = QueryLayout::new(members);
        if fabric.row_len_bytes() < layout.row_len_bytes() {
            return Err(QueryError::RowTooShort {
                found: fabric.row_len_bytes(),
                needed: layout.row_len_bytes(),
            });
        }
        Ok(QueryChannel {
            me: fabric.member_rank(),
            fabric,
            layout,
            asked: vec![0; members],
            answered: vec![0; members],
            served: vec![0; members],
            request: Vec::with_capacity(QUERY_PAYLOAD_BYTES_MAX),
            reply: Vec::with_capacity(QUERY_PAYLOAD_BYTES_MAX),
            served_total: 0,
            replies_total: 0,
        })
    }

    /// The fabric (its doorbell, its peers).
    pub fn fabric(&self) -> &Arc<F> {
        &self.fabric
    }

    fn check_peer(&self, peer: usize) -> Result<(), QueryError> {
        if peer >= self.layout.members {
            return Err(QueryError::NoSuchMember {
                peer,
                members: self.layout.members,
            });
        }
        if peer == self.me {
            return Err(QueryError::ToSelf { peer });
        }
        Ok(())
    }

    /// Write `payload` and its header into the own row's box at `at`
    /// (its `seq` last, Release) and push the box to `peer`.
    fn publish(
        &self,
        at: usize,
        peer: usize,
        seq: u64,
        status: u32,
        target: u64,
        payload: &[u8],
    ) -> Result<(), QueryError> {
        debug_assert!(
            payload.len() <= QUERY_PAYLOAD_BYTES_MAX,
            "bounded: a payload fits its box"
        );
        let row = self.fabric.row(self.me);
        let body = at + QUERY_HEADER_BYTES;
        let whole = payload.len() / 8 * 8;
        row.store_atomic(body, &payload[..whole]);
        if whole < payload.len() {
            let mut last = [0u8; 8];
            last[..payload.len() - whole].copy_from_slice(&payload[whole..]);
            row.store_atomic(body + whole, &last);
        }
        row.u32_at(at + 8).store(payload.len() as u32, Ordering::Relaxed);
        row.u32_at(at + 12).store(status, Ordering::Relaxed);
        row.u64_at(at + 16).store(target, Ordering::Relaxed);
        // Release: pairs with the Acquire load of this box's seq in
        // `peer` (`serve` for a request, `take_reply` for a reply): the
        // payload and header words above are written first.
        row.u64_at(at).store(seq, Ordering::Release);
        // Two pushes: a fabric that copies rows may deliver one push in
        // pieces, in any order, but a push only after the ones before it.
        // So the box's words go first and its seq after them.
        let to = PeerSet(1u64 << peer);
        self.fabric.push(at + 8..body + padded(payload.len()), to)?;
        self.fabric.push(at..at + 8, to)?;
        self.fabric.flush();
        // Wake the peer if it parks on the channel (see `park`).
        self.fabric.doorbell().ring();
        Ok(())
    }

    /// Copy the payload of `row`'s box at `at` (its `len` read after the
    /// Acquire of its seq) into `out`.
    fn copy_out(row: &RowRef<'_>, at: usize, out: &mut Vec<u8>) -> Result<(), String> {
        let len = row.u32_at(at + 8).load(Ordering::Relaxed) as usize;
        if len > QUERY_PAYLOAD_BYTES_MAX {
            return Err(format!(
                "a box says it holds {len} B, more than the {QUERY_PAYLOAD_BYTES_MAX} B it can"
            ));
        }
        out.clear();
        out.resize(padded(len), 0);
        row.copy_atomic(at + QUERY_HEADER_BYTES, out);
        out.truncate(len);
        Ok(())
    }

    /// Send `request` to `peer`, for `target`. Returns the query's number.
    /// One query per peer waits for its reply at a time.
    pub fn ask(&mut self, peer: usize, target: QueryTarget, request: &[u8]) -> Result<u64, QueryError> {
        self.check_peer(peer)?;
        if request.len() > QUERY_PAYLOAD_BYTES_MAX {
            return Err(QueryError::TooLong {
                len: request.len(),
                max: QUERY_PAYLOAD_BYTES_MAX,
            });
        }
        if self.asked[peer] != self.answered[peer] {
            return Err(QueryError::Outstanding { peer });
        }
        let seq = self.asked[peer] + 1;
        self.publish(
            self.layout.request_box(peer),
            peer,
            seq,
            STATUS_OK,
            target.pack(),
            request,
        )?;
        self.asked[peer] = seq;
        Ok(seq)
    }

    /// Give up the query outstanding at `peer` (its reply, if it comes,
    /// is dropped: the next query has the next number).
    pub fn abandon(&mut self, peer: usize) {
        if peer < self.asked.len() {
            self.answered[peer] = self.asked[peer];
        }
    }

    /// Whether a query to `peer` waits for its reply.
    pub fn waiting_on(&self, peer: usize) -> bool {
        peer < self.asked.len() && self.asked[peer] != self.answered[peer]
    }

    /// The reply to the query outstanding at `peer`, into `out`, once it
    /// arrived (`None` until then, or when none is outstanding).
    pub fn take_reply(&mut self, peer: usize, out: &mut Vec<u8>) -> Option<Result<(), QueryError>> {
        if !self.waiting_on(peer) {
            return None;
        }
        self.fabric.receive_now();
        let row = self.fabric.row(peer);
        let at = self.layout.reply_box(self.me);
        // Acquire: pairs with the Release store of this seq in `publish`,
        // in `peer` (its reply's words were written first).
        let seq = row.u64_at(at).load(Ordering::Acquire);
        if seq != self.asked[peer] {
            return None;
        }
        self.answered[peer] = seq;
        self.replies_total += 1;
        let status = row.u32_at(at + 12).load(Ordering::Relaxed);
        Some(match Self::copy_out(&row, at, out) {
            Err(reason) => Err(QueryError::Refused { peer, reason }),
            Ok(()) if status == STATUS_OK => Ok(()),
            Ok(()) => Err(QueryError::Refused {
                peer,
                reason: String::from_utf8_lossy(out).into_owned(),
            }),
        })
    }

    /// Answer every query that arrived: `answer(asker, target, request,
    /// reply)` fills `reply` or says why it does not answer. Returns the
    /// queries answered.
    pub fn serve(&mut self, answer: &mut Answer<'_>) -> Result<u32, QueryError> {
        self.fabric.receive_now();
        let mut work = 0;
        let joined = self.fabric.joined();
        for peer in (0..self.layout.members).filter(|p| *p != self.me && joined.contains(*p)) {
            let row = self.fabric.row(peer);
            let at = self.layout.request_box(self.me);
            // Acquire: pairs with the Release store of this seq in
            // `publish`, in the asker (its request was written first).
            let seq = row.u64_at(at).load(Ordering::Acquire);
            if seq == 0 || seq == self.served[peer] {
                continue;
            }
            debug_assert!(
                seq == self.served[peer] + 1 || seq == 1 || self.served[peer] == 0,
                "no duplication, no loss: member {peer}'s queries go 1, 2, … (seq {seq} after {})",
                self.served[peer]
            );
            let target = QueryTarget::unpack(row.u64_at(at + 16).load(Ordering::Relaxed));
            let mut request = std::mem::take(&mut self.request);
            let mut reply = std::mem::take(&mut self.reply);
            reply.clear();
            let answered =
                Self::copy_out(&row, at, &mut request).and_then(|()| answer(peer, target, &request, &mut reply));
            let (status, payload): (u32, &[u8]) = match &answered {
                Ok(()) if reply.len() <= QUERY_PAYLOAD_BYTES_MAX => (STATUS_OK, &reply),
                Ok(()) => {
                    let why = format!(
                        "its reply of {} B is longer than the {QUERY_PAYLOAD_BYTES_MAX} B a query box holds",
                        reply.len()
                    );
                    reply.clear();
                    reply.extend_from_slice(why.as_bytes());
                    (STATUS_REFUSED, &reply)
                }
                Err(why) => {
                    let why = &why.as_bytes()[..why.len().min(QUERY_PAYLOAD_BYTES_MAX)];
                    reply.clear();
                    reply.extend_from_slice(why);
                    (STATUS_REFUSED, &reply)
                }
            };
            let published = self.publish(self.layout.reply_box(peer), peer, seq, status, 0, payload);
            self.request = request;
            self.reply = reply;
            published?;
            self.served[peer] = seq;
            self.served_total += 1;
            work += 1;
        }
        Ok(work)
    }

    /// Whether a query arrived that `serve` has not answered, or the
    /// reply to an outstanding query (a check, nothing taken).
    pub fn has_arrivals(&self) -> bool {
        self.fabric.receive_now();
        let joined = self.fabric.joined();
        (0..self.layout.members)
            .filter(|p| *p != self.me && joined.contains(*p))
            .any(|p| {
                let row = self.fabric.row(p);
                // Acquire: pairs with the Release stores of `publish` in
                // `p` (a check only: `serve` and `take_reply` read again).
                let asked = row.u64_at(self.layout.request_box(self.me)).load(Ordering::Acquire);
                let replied = row.u64_at(self.layout.reply_box(self.me)).load(Ordering::Acquire);
                (asked != 0 && asked != self.served[p]) || (self.waiting_on(p) && replied == self.asked[p])
            })
    }

    /// Sleep until a query or a reply arrives (the peers ring this
    /// fabric's doorbell after they publish), or `timeout` passes.
    pub fn park(&self, timeout: std::time::Duration) {
        let bell = self.fabric.doorbell();
        let ticket = bell.prepare_park();
        if self.has_arrivals() {
            bell.cancel_park();
        } else {
            bell.park(ticket, timeout);
        }
    }

    /// Whether `peer` is gone (slow path: call it while waiting, not per
    /// pass).
    pub fn peer_gone(&self, peer: usize) -> bool {
        self.fabric.lost_peers().contains(peer)
    }
}
