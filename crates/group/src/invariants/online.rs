//! The same properties as the log checkers, checked one delivery at a time
//! (O(1) each), so the simulator can check after every step of every member
//! without re-reading whole logs. Property names match the log checkers.
//!
//! It knows what was sent ([`OnlineChecker::record_sent`]: per sender, in
//! send order, each message's length and xxh3), so it checks more than the
//! logs alone can show:
//!
//! - **delivery in the sending view**: every delivery carries the view it was sent in (static: 0);
//! - **integrity**: only senders of the view, only messages that were sent, with their bytes;
//! - **no duplication** and **per-sender FIFO**: indices strictly increase per sender;
//! - **no gaps**: a member's `j`-th delivery from a sender is that sender's `j`-th message;
//! - **total order** (ordered mode): seq strictly increases, `seq = index × senders +
//!   sender index`, and every member's delivery sequence is a prefix of one agreed sequence.

use super::{LogEntry, Violation};

/// One delivery as the simulator saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub member: usize,
    pub view: u64,
    pub sender: usize,
    pub index: u64,
    pub seq: u64,
    pub len: u64,
    pub xxh3: u64,
}

impl Delivered {
    /// The delivery-log line for it.
    pub fn to_log_entry(&self) -> LogEntry {
        LogEntry {
            member: self.member,
            view: self.view,
            sender: self.sender,
            index: self.index,
            seq: self.seq,
            len: self.len,
            xxh3: format!("{:016x}", self.xxh3),
        }
    }
}

#[derive(Clone, Default)]
struct MemberState {
    /// Per sender index: how many data messages delivered, last index.
    count: Vec<u64>,
    last_index: Vec<Option<u64>>,
    last_seq: Option<u64>,
    delivered: u64,
}

/// How far the lookahead goes to tell a gap from corrupted bytes.
const GAP_LOOKAHEAD_MAX: usize = 64;

pub struct OnlineChecker {
    view: u64,
    ordered: bool,
    /// Member rank → sender index, for senders of the view.
    sender_index: Vec<Option<usize>>,
    senders: usize,
    /// Per sender index, in send order: (len, xxh3).
    sent: Vec<Vec<(u64, u64)>>,
    members: Vec<MemberState>,
    /// The agreed delivery sequence: (sender, index, seq) and who delivered it first.
    agreed: Vec<(usize, u64, u64, usize)>,
}

impl OnlineChecker {
    /// For a view of `member_count` members whose senders are `sender_ranks`.
    pub fn new(view: u64, member_count: usize, sender_ranks: &[usize], ordered: bool) -> OnlineChecker {
        let mut sender_index = vec![None; member_count];
        for (i, r) in sender_ranks.iter().enumerate() {
            sender_index[*r] = Some(i);
        }
        let senders = sender_ranks.len();
        OnlineChecker {
            view,
            ordered,
            sender_index,
            senders,
            sent: vec![Vec::new(); senders],
            members: vec![
                MemberState {
                    count: vec![0; senders],
                    last_index: vec![None; senders],
                    ..MemberState::default()
                };
                member_count
            ],
            agreed: Vec::new(),
        }
    }

    /// The application of `sender_rank` sent its next message.
    pub fn record_sent(&mut self, sender_rank: usize, len: u64, xxh3: u64) {
        let s = self.sender_index[sender_rank].expect("record_sent: not a sender");
        self.sent[s].push((len, xxh3));
    }

    /// Messages sent so far by `sender_rank`.
    pub fn sent_by(&self, sender_rank: usize) -> u64 {
        self.sender_index[sender_rank].map_or(0, |s| self.sent[s].len() as u64)
    }

    /// Data messages `member` has delivered.
    pub fn delivered_by(&self, member: usize) -> u64 {
        self.members[member].delivered
    }

    /// Whether `member` has delivered every message sent so far.
    pub fn has_everything(&self, member: usize) -> bool {
        (0..self.senders).all(|s| self.members[member].count[s] == self.sent[s].len() as u64)
    }

    /// Check one delivery, in the order `d.member` delivered it.
    pub fn check(&mut self, d: &Delivered) -> Result<(), Violation> {
        let m = d.member;
        if d.view != self.view {
            return Err(Violation::new(
                "delivery in the sending view",
                format!(
                    "member {m} delivered sender {} index {} in view {}, sent in view {}",
                    d.sender, d.index, d.view, self.view
                ),
            ));
        }
        let Some(s) = self.sender_index.get(d.sender).copied().flatten() else {
            return Err(Violation::new(
                "integrity",
                format!(
                    "member {m} delivered a message from {}, which is not a sender of the view",
                    d.sender
                ),
            ));
        };
        self.check_fifo(d, s)?;
        self.check_content(d, s)?;
        if self.ordered {
            self.check_order(d, s)?;
        }
        let state = &mut self.members[m];
        state.count[s] += 1;
        state.last_index[s] = Some(d.index);
        state.last_seq = Some(d.seq);
        state.delivered += 1;
        Ok(())
    }

    fn check_fifo(&self, d: &Delivered, s: usize) -> Result<(), Violation> {
        match self.members[d.member].last_index[s] {
            Some(last) if d.index == last => Err(Violation::new(
                "no duplication",
                format!(
                    "member {} delivered sender {} index {} twice",
                    d.member, d.sender, d.index
                ),
            )),
            Some(last) if d.index < last => Err(Violation::new(
                "per-sender FIFO",
                format!(
                    "member {} delivered sender {} index {} after index {last}",
                    d.member, d.sender, d.index
                ),
            )),
            _ => Ok(()),
        }
    }

    fn check_content(&self, d: &Delivered, s: usize) -> Result<(), Violation> {
        let j = self.members[d.member].count[s] as usize;
        let sent = &self.sent[s];
        if sent.get(j) == Some(&(d.len, d.xxh3)) {
            return Ok(());
        }
        let ahead = sent.iter().enumerate().skip(j + 1).take(GAP_LOOKAHEAD_MAX);
        if let Some((k, _)) = ahead.into_iter().find(|(_, x)| **x == (d.len, d.xxh3)) {
            return Err(Violation::new(
                "no gaps",
                format!(
                    "member {} delivered sender {}'s message #{k} (index {}) but never its message #{j}",
                    d.member, d.sender, d.index
                ),
            ));
        }
        let detail = match sent.get(j) {
            Some((len, hash)) => format!(
                "member {} delivered sender {} message #{j} (index {}) as {} B xxh3 {:016x}; it was sent as {len} B xxh3 {hash:016x}",
                d.member, d.sender, d.index, d.len, d.xxh3
            ),
            None => format!(
                "member {} delivered a message #{j} (index {}) from sender {}, which sent only {}",
                d.member, d.index, d.sender, sent.len()
            ),
        };
        Err(Violation::new("integrity", detail))
    }

    fn check_order(&mut self, d: &Delivered, s: usize) -> Result<(), Violation> {
        let m = d.member;
        if d.seq != d.index * self.senders as u64 + s as u64 {
            return Err(Violation::new(
                "total order",
                format!(
                    "member {m} delivered sender {} index {} with seq {}, not index × {} + {s}",
                    d.sender, d.index, d.seq, self.senders
                ),
            ));
        }
        if let Some(last) = self.members[m].last_seq {
            if d.seq <= last {
                return Err(Violation::new(
                    "total order",
                    format!("member {m} delivered seq {} after seq {last}", d.seq),
                ));
            }
        }
        let pos = self.members[m].delivered as usize;
        match self.agreed.get(pos) {
            None => {
                debug_assert_eq!(pos, self.agreed.len(), "members append to the agreed sequence in order");
                self.agreed.push((d.sender, d.index, d.seq, m));
                Ok(())
            }
            Some(&(sender, index, seq, first)) if (sender, index, seq) != (d.sender, d.index, d.seq) => Err(Violation::new(
                "total order",
                format!(
                    "delivery #{pos}: member {m} delivered (sender {}, index {}, seq {}) but member {first} delivered (sender {sender}, index {index}, seq {seq})",
                    d.sender, d.index, d.seq
                ),
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(member: usize, sender: usize, index: u64, len: u64) -> Delivered {
        Delivered {
            member,
            view: 0,
            sender,
            index,
            seq: index * 2 + sender as u64,
            len,
            xxh3: len * 31,
        }
    }

    fn checker() -> OnlineChecker {
        let mut c = OnlineChecker::new(0, 2, &[0, 1], true);
        for len in [1, 2, 3] {
            c.record_sent(0, len, len * 31);
            c.record_sent(1, len + 10, (len + 10) * 31);
        }
        c
    }

    #[test]
    fn a_correct_run_passes() {
        let mut c = checker();
        for m in 0..2 {
            for (s, i, len) in [(0, 0, 1), (1, 0, 11), (0, 1, 2), (1, 2, 12)] {
                c.check(&d(m, s, i, len)).unwrap();
            }
        }
        assert_eq!(c.delivered_by(1), 4);
        assert!(!c.has_everything(0));
    }

    #[test]
    fn each_broken_property_is_named() {
        let cases: Vec<(Vec<Delivered>, &str)> = vec![
            (vec![d(0, 0, 0, 1), d(0, 0, 0, 1)], "no duplication"),
            (vec![d(0, 0, 3, 1), d(0, 0, 1, 2)], "per-sender FIFO"),
            (vec![d(0, 0, 0, 2)], "no gaps"),
            (vec![d(0, 0, 0, 9)], "integrity"),
            (vec![d(0, 1, 0, 11), d(0, 0, 0, 1)], "total order"),
            (vec![d(0, 0, 0, 1), d(1, 1, 0, 11)], "total order"),
            (
                vec![Delivered {
                    view: 3,
                    ..d(0, 0, 0, 1)
                }],
                "delivery in the sending view",
            ),
            (
                vec![Delivered {
                    seq: 5,
                    ..d(0, 0, 0, 1)
                }],
                "total order",
            ),
        ];
        for (deliveries, property) in cases {
            let mut c = checker();
            let err = deliveries.iter().try_for_each(|x| c.check(x)).unwrap_err();
            assert_eq!(err.property, property, "{deliveries:?}: {err}");
        }
    }
}
