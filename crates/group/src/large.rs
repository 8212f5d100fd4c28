//! Large messages: a payload bigger than a slot travels as a run of
//! *fragments*, one per slot, in its sender's ordinary stream. They share
//! the group's sequence space and total order; flow control is the
//! ring's own (a fragment takes a slot like any message, so a large
//! message never holds back another sender's small ones for more than one
//! window of the large sender's slots).
//!
//! ```text
//!  slot header   index u64 | null_count u32 = 0 | len u32 = bytes | LEN_FRAGMENT
//!  payload       FragmentHeader (24 B) | the message's bytes offset..offset+n
//!
//!  FragmentHeader (#[repr(C)], little-endian)
//!  +0  message_id u64   the sender's count of large messages it started (0, 1, 2, …)
//!  +8  total_len  u64   the whole message's length
//!  +16 offset     u64   where this fragment's bytes go in it
//! ```
//!
//! The receiver copies each fragment's bytes into the sender's
//! reassembly buffer as it *delivers* the fragment (in total order), and
//! hands the application the whole message as one `&[u8]` at the last
//! fragment's position in the order: the message's `index` and `seq` are
//! its last fragment's. The fragments before it pass as nulls in the
//! upcalls' accounting (`Upcalls::null_passed`), so a delivery log still
//! accounts for every index.
//!
//! **In place, without the copy.** An application whose
//! `Upcalls::takes_fragments` says so is handed each fragment where it
//! lies (in the sender's ring on shm, in this member's replica of it on
//! tcp, in the log during a restart's replay) with
//! `Upcalls::deliver_fragment`, in total order, and no reassembly buffer
//! is written: the message is delivered at its last fragment
//! ([`FragmentDelivery::is_last`]). Until then its fragments are staged,
//! not delivered: a cut (below) is said with `Upcalls::large_message_cut`
//! after them, and the application drops what it staged. Every member of
//! a view is handed the same fragments and the same cuts, so the message
//! is still delivered everywhere in that view or nowhere.
//!
//! ```text
//!  sender's ring   | hdr | frag 0 | hdr | frag 1 | … | hdr | frag k |
//!                          │              │                  │
//!  whole (default)         └──copy──┬─────┴──copy──  …  ─────┴─copy─→ reassembly buffer → deliver(&[u8])
//!  in place                 deliver_fragment(0), deliver_fragment(1), …, deliver_fragment(k, last)
//! ```
//!
//! Virtual synchrony: a view change delivers every survivor the same
//! prefix of a sender's fragments (the ragged edge), so their partial
//! messages are identical; they are all dropped at the install (counted
//! in `large_msgs_cut`, said with `Upcalls::large_message_cut`), and a
//! fragment that does not continue a message begun in the same view is
//! passed over. A large message is therefore delivered in one view at
//! every member of it, or nowhere: a joiner never sees half of one. The
//! sender learns of the cut from its own upcall and sends again.

/// Bit of a slot's `len` that marks a fragment of a large message.
pub const LEN_FRAGMENT: u32 = 1 << 31;
/// The payload length bits of a slot's `len`.
pub const LEN_MASK: u32 = LEN_FRAGMENT - 1;

/// The first bytes of every fragment's payload (see the module diagram).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentHeader {
    pub message_id: u64,
    pub total_len: u64,
    pub offset: u64,
}

pub const FRAGMENT_HEADER_BYTES: usize = 24;
const _: () = assert!(std::mem::size_of::<FragmentHeader>() == FRAGMENT_HEADER_BYTES);
const _: () = assert!(std::mem::align_of::<FragmentHeader>() == 8);
// The payload starts 16-aligned in its slot (the slot header is 16 B), so
// the fragment header and its data are 8-aligned there.
const _: () = assert!(crate::layout::SLOT_HEADER_BYTES.is_multiple_of(8) && FRAGMENT_HEADER_BYTES.is_multiple_of(8));

impl FragmentHeader {
    pub fn write(self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.message_id.to_le_bytes());
        out[8..16].copy_from_slice(&self.total_len.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
    }

    pub fn read(payload: &[u8]) -> Option<FragmentHeader> {
        let head = payload.get(..FRAGMENT_HEADER_BYTES)?;
        let word = |i: usize| head[i * 8..i * 8 + 8].try_into().ok().map(u64::from_le_bytes);
        Some(FragmentHeader {
            message_id: word(0)?,
            total_len: word(1)?,
            offset: word(2)?,
        })
    }
}

/// One fragment of a large message handed over in place (see the module
/// doc and `Upcalls::deliver_fragment`): its bytes are valid during the
/// call only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentDelivery<'a> {
    /// The view the message was sent in.
    pub view: u64,
    /// Member rank of the sender.
    pub sender_rank: usize,
    /// Position of the sender in the view's sender list.
    pub sender_index: usize,
    /// This fragment's index in its sender's stream; the last fragment's
    /// is the message's.
    pub index: u64,
    /// This fragment's position in the total order.
    pub seq: u64,
    /// The sender's count of large messages it started (see
    /// `LargeSend::message_id`).
    pub message_id: u64,
    /// The whole message's length.
    pub total_len: u64,
    /// Where `data` lies in the message.
    pub offset: u64,
    /// This fragment's bytes of the message.
    pub data: &'a [u8],
}

impl FragmentDelivery<'_> {
    /// Whether this fragment ends its message: the message is delivered
    /// with it.
    #[inline]
    pub fn is_last(&self) -> bool {
        self.offset + self.data.len() as u64 == self.total_len
    }

    /// The delivery of the whole message this last fragment ends, with
    /// `payload` (the bytes an application put together from the
    /// fragments): what a member taking it whole is handed.
    pub fn whole<'w>(&self, payload: &'w [u8]) -> crate::Delivery<'w> {
        debug_assert!(self.is_last() && payload.len() as u64 == self.total_len);
        crate::Delivery {
            view: self.view,
            sender_rank: self.sender_rank,
            sender_index: self.sender_index,
            index: self.index,
            seq: self.seq,
            payload,
        }
    }
}

/// What one delivered fragment amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    /// It was the last: the whole message.
    Complete(&'a [u8]),
    /// Taken; more to come.
    Pending,
    /// Taken in place (the message's first fragment asked for it): hand
    /// these bytes, at `offset` of a message of `total_len`, to the
    /// application. It is the message's last when `offset + data.len()
    /// == total_len`.
    InPlace {
        message_id: u64,
        total_len: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// Passed over: it does not continue a message begun in this view (a
    /// view change cut the message), or it is malformed.
    PassedOver,
}

/// One sender's message being put together.
#[derive(Default)]
struct Partial {
    /// The bytes so far (empty for a message taken in place).
    bytes: Vec<u8>,
    /// How many of the message's bytes have been taken.
    taken_bytes: u64,
    message_id: u64,
    total_len: u64,
    active: bool,
    /// Its fragments go to the application in place, not into `bytes`
    /// (decided at its first fragment, kept to its end).
    in_place: bool,
}

/// A large message delivered nowhere: its sender's message id and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub message_id: u64,
    pub len_bytes: u64,
}

/// The reassembly buffers of a member, one per sender of the view. A
/// buffer keeps its capacity from one message to the next, so delivery
/// allocates only when a sender sends a message bigger than any before.
#[derive(Default)]
pub struct Reassembly {
    partials: Vec<Partial>,
    /// Largest message accepted (the group's `large_message_max_bytes`).
    max_bytes: u64,
}

impl Reassembly {
    pub fn new(senders: usize, max_bytes: u64) -> Reassembly {
        Reassembly {
            partials: (0..senders).map(|_| Partial::default()).collect(),
            max_bytes,
        }
    }

    /// Take sender `s`'s fragment (its whole slot payload), delivered in
    /// total order. Returns the finished message at its last fragment,
    /// or, for a message whose first fragment came with `in_place`, the
    /// fragment's own bytes. Also returns the message this one ends
    /// unfinished, if any.
    pub fn take<'a>(&'a mut self, s: usize, payload: &'a [u8], in_place: bool) -> (Fragment<'a>, Option<Cut>) {
        let max_bytes = self.max_bytes;
        let p = &mut self.partials[s];
        let Some(head) = FragmentHeader::read(payload) else {
            return (Fragment::PassedOver, None);
        };
        let data = &payload[FRAGMENT_HEADER_BYTES..];
        let mut cut = None;
        let this_cut = |p: &Partial| Cut {
            message_id: p.message_id,
            len_bytes: p.total_len,
        };
        if head.offset == 0 {
            if p.active {
                // The sender abandoned its previous message (its LargeSend
                // was dropped half way): delivered nowhere.
                cut = Some(this_cut(p));
            }
            if head.total_len == 0 || head.total_len > max_bytes {
                p.active = false;
                return (Fragment::PassedOver, cut);
            }
            p.bytes.clear();
            if !in_place {
                // Allocates only for a message bigger than any before.
                p.bytes.reserve(head.total_len as usize);
            }
            p.total_len = head.total_len;
            p.message_id = head.message_id;
            p.taken_bytes = 0;
            p.in_place = in_place;
            p.active = true;
        } else if !p.active
            || head.message_id != p.message_id
            || head.offset != p.taken_bytes
            || head.total_len != p.total_len
        {
            return (Fragment::PassedOver, cut);
        }
        if p.taken_bytes + data.len() as u64 > p.total_len {
            p.active = false;
            return (Fragment::PassedOver, Some(this_cut(p)));
        }
        p.taken_bytes += data.len() as u64;
        let last = p.taken_bytes == p.total_len;
        if last {
            p.active = false;
        }
        if p.in_place {
            let taken = Fragment::InPlace {
                message_id: p.message_id,
                total_len: p.total_len,
                offset: head.offset,
                data,
            };
            return (taken, cut);
        }
        p.bytes.extend_from_slice(data);
        debug_assert_eq!(
            p.bytes.len() as u64,
            p.taken_bytes,
            "no gaps: a large message's bytes are its fragments'"
        );
        if last {
            return (Fragment::Complete(&p.bytes), cut);
        }
        (Fragment::Pending, cut)
    }

    /// Whether some sender's large message is half put together.
    pub fn has_partial(&self) -> bool {
        self.partials.iter().any(|p| p.active)
    }

    /// A view is being installed: drop every partial message (see the
    /// module doc). Returns the lengths of the messages dropped, by
    /// sender index in the old view.
    pub fn drop_partials(&mut self) -> Vec<(usize, Cut)> {
        let cut = self
            .partials
            .iter()
            .enumerate()
            .filter(|(_, p)| p.active)
            .map(|(s, p)| {
                let cut = Cut {
                    message_id: p.message_id,
                    len_bytes: p.total_len,
                };
                (s, cut)
            })
            .collect();
        for p in &mut self.partials {
            p.active = false;
        }
        cut
    }

    /// Size for a view's senders (after [`Reassembly::drop_partials`]).
    /// Room for `senders` senders at least, keeping every partial (a
    /// restart's replay: its history's views may have had more senders
    /// than the restarted group has).
    pub fn grow(&mut self, senders: usize) {
        if self.partials.len() < senders {
            self.partials.resize_with(senders, Partial::default);
        }
    }

    pub fn resize(&mut self, senders: usize) {
        debug_assert!(
            self.partials.iter().all(|p| !p.active),
            "virtual synchrony: a partial large message carried into a new view"
        );
        self.partials.resize_with(senders, Partial::default);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(total: u64, offset: u64, data: &[u8]) -> Vec<u8> {
        fragment_of(total, total, offset, data)
    }

    /// A fragment of message `id` (the tests give each length its own id).
    fn fragment_of(id: u64, total: u64, offset: u64, data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; FRAGMENT_HEADER_BYTES + data.len()];
        FragmentHeader {
            message_id: id,
            total_len: total,
            offset,
        }
        .write(&mut out);
        out[FRAGMENT_HEADER_BYTES..].copy_from_slice(data);
        out
    }

    #[test]
    fn fragments_in_order_make_the_message() {
        let mut r = Reassembly::new(2, 1 << 20);
        assert_eq!(r.take(0, &fragment(6, 0, b"abc"), false).0, Fragment::Pending);
        assert_eq!(r.take(1, &fragment(2, 0, b"xy"), false).0, Fragment::Complete(b"xy"));
        assert_eq!(
            r.take(0, &fragment(6, 3, b"def"), false).0,
            Fragment::Complete(b"abcdef")
        );
    }

    #[test]
    fn a_message_begun_in_place_is_handed_over_fragment_by_fragment_without_a_copy() {
        let mut r = Reassembly::new(2, 1 << 20);
        let first = fragment(6, 0, b"abc");
        let (taken, cut) = r.take(0, &first, true);
        assert_eq!(cut, None);
        let Fragment::InPlace {
            offset,
            total_len,
            data,
            ..
        } = taken
        else {
            panic!("taken in place: {taken:?}");
        };
        assert_eq!((offset, total_len, data), (0, 6, &b"abc"[..]));
        // The bytes handed over are the slot's own, not a copy.
        assert_eq!(data.as_ptr(), first[FRAGMENT_HEADER_BYTES..].as_ptr());
        assert!(r.has_partial());
        // A later fragment follows the mode its message began in.
        let second = fragment(6, 3, b"def");
        let Fragment::InPlace { offset, data, .. } = r.take(0, &second, false).0 else {
            panic!("in place to its end");
        };
        assert_eq!((offset, data), (3, &b"def"[..]));
        assert!(!r.has_partial(), "the last fragment ends the message");
        // A gap is passed over in place too, and a new start cuts it.
        r.take(1, &fragment(9, 0, b"abc"), true);
        assert_eq!(r.take(1, &fragment(9, 6, b"ghi"), true).0, Fragment::PassedOver);
        let other = fragment(2, 0, b"zz");
        let (taken, cut) = r.take(1, &other, false);
        assert_eq!(taken, Fragment::Complete(b"zz"));
        assert_eq!(
            cut,
            Some(Cut {
                message_id: 9,
                len_bytes: 9
            })
        );
    }

    #[test]
    fn a_fragment_that_does_not_continue_a_message_is_passed_over() {
        let mut r = Reassembly::new(1, 1 << 20);
        // Begun in an earlier view: no start seen here.
        assert_eq!(r.take(0, &fragment(6, 3, b"def"), false).0, Fragment::PassedOver);
        r.take(0, &fragment(9, 0, b"abc"), false);
        // A gap, a different length, an overrun: passed over.
        assert_eq!(r.take(0, &fragment(9, 6, b"ghi"), false).0, Fragment::PassedOver);
        assert_eq!(r.take(0, &fragment(8, 3, b"def"), false).0, Fragment::PassedOver);
        let cut = Cut {
            message_id: 9,
            len_bytes: 9,
        };
        assert_eq!(
            r.take(0, &fragment(9, 3, b"defghij"), false),
            (Fragment::PassedOver, Some(cut))
        );
        // Another message of the same length does not continue it.
        r.take(0, &fragment_of(1, 6, 0, b"abc"), false);
        assert_eq!(r.take(0, &fragment_of(2, 6, 3, b"def"), false).0, Fragment::PassedOver);
        // Too large, empty, or too short for a header.
        let mut small = Reassembly::new(1, 4);
        assert_eq!(small.take(0, &fragment(5, 0, b"ab"), false).0, Fragment::PassedOver);
        assert_eq!(small.take(0, &fragment(0, 0, b""), false).0, Fragment::PassedOver);
        assert_eq!(small.take(0, b"short", false).0, Fragment::PassedOver);
    }

    #[test]
    fn an_install_drops_partial_messages_and_a_new_start_replaces_an_abandoned_one() {
        let mut r = Reassembly::new(2, 1 << 20);
        r.take(0, &fragment(6, 0, b"abc"), false);
        let six = Cut {
            message_id: 6,
            len_bytes: 6,
        };
        assert_eq!(r.drop_partials(), vec![(0, six)]);
        r.resize(3);
        assert_eq!(r.take(0, &fragment(6, 3, b"def"), false).0, Fragment::PassedOver);
        r.take(2, &fragment(4, 0, b"ab"), false);
        let other = fragment(2, 0, b"zz");
        let (f, cut) = r.take(2, &other, false);
        let four = Cut {
            message_id: 4,
            len_bytes: 4,
        };
        assert_eq!((f, cut), (Fragment::Complete(b"zz"), Some(four)));
    }
}
