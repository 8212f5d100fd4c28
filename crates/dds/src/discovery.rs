//! Discovery: which writers and readers exist in a domain, and which of
//! them match. A driven engine: the participant feeds it the
//! announcements it delivers (in the group's total order, so every
//! participant computes the same matches) and the participants that left
//! the view; it answers with events.
//!
//! A writer and a reader match when they name the same topic, their
//! partitions intersect, their type names are equal (otherwise:
//! [`Event::InconsistentTopic`]) and the writer offers what the reader
//! requests ([`crate::qos::check_compatible`]; otherwise:
//! [`Event::IncompatibleQos`], never a silent non-match).

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use crate::qos::{self, Partition, QosPolicyId, QosWire, ReaderQos, WriterQos};
use crate::types::{endpoint_participant, ReaderId, WriterId};
use crate::wire::{Announce, WireError, MSG_READER, MSG_RETIRE, MSG_WRITER};

/// The QoS of a discovered endpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum EndpointQos {
    /// A writer's offer.
    Writer(WriterQos),
    /// A reader's request.
    Reader(ReaderQos),
}

/// An endpoint somewhere in the domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// Its id ([`WriterId`] or [`ReaderId`] value).
    pub id: u64,
    /// The topic name.
    pub topic: String,
    /// The type name.
    pub type_name: String,
    /// Its QoS.
    pub qos: EndpointQos,
    /// The announcement it came from (kept for snapshots).
    announce: Announce,
}

impl Endpoint {
    /// Whether it is a writer.
    pub fn is_writer(&self) -> bool {
        matches!(self.qos, EndpointQos::Writer(_))
    }

    fn partition(&self) -> &Partition {
        match &self.qos {
            EndpointQos::Writer(q) => &q.partition,
            EndpointQos::Reader(q) => &q.partition,
        }
    }
}

/// Why a match ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmatch {
    /// One of the two was deleted.
    Retired,
    /// One of the two's participant left the view (crashed, stalled past
    /// the failure detector's timeout, or left): the writer's liveliness
    /// is lost.
    ParticipantGone,
}

/// What discovery tells the participant.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A writer and a reader match: the reader takes the writer's samples.
    Matched {
        /// The writer.
        writer: WriterId,
        /// The reader.
        reader: ReaderId,
    },
    /// A match ended.
    Unmatched {
        /// The writer.
        writer: WriterId,
        /// The reader.
        reader: ReaderId,
        /// Why.
        why: Unmatch,
    },
    /// Same topic, intersecting partitions, but the writer does not offer
    /// what the reader requests.
    IncompatibleQos {
        /// The writer.
        writer: WriterId,
        /// The reader.
        reader: ReaderId,
        /// Every policy that failed.
        policies: Vec<QosPolicyId>,
    },
    /// Same topic name, different types.
    InconsistentTopic {
        /// The writer.
        writer: WriterId,
        /// The reader.
        reader: ReaderId,
        /// The writer's type name.
        writer_type: String,
        /// The reader's type name.
        reader_type: String,
    },
}

/// An announcement discovery cannot take.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    /// Not a well-formed announcement.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// Its QoS bytes do not decode.
    #[error("endpoint {endpoint:#x}: bad QoS: {why}")]
    Qos {
        /// The endpoint.
        endpoint: u64,
        /// Why.
        why: String,
    },
    /// A second announcement of a live endpoint (no duplication).
    #[error("no duplication: endpoint {0:#x} announced twice")]
    Duplicate(u64),
}

/// Every endpoint of the domain and the matches among them.
#[derive(Default, Debug)]
pub struct Discovery {
    endpoints: BTreeMap<u64, Endpoint>,
    /// (writer, reader) pairs that match.
    matches: BTreeSet<(u64, u64)>,
}

/// Most endpoints a domain holds (bounded like everything else).
pub const ENDPOINTS_MAX: usize = 4096;

impl Discovery {
    /// An empty domain.
    pub fn new() -> Discovery {
        Discovery::default()
    }

    /// The endpoint with this id.
    pub fn endpoint(&self, id: u64) -> Option<&Endpoint> {
        self.endpoints.get(&id)
    }

    /// Every endpoint, by id.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.values()
    }

    /// The readers a writer matches.
    pub fn readers_of(&self, writer: WriterId) -> impl Iterator<Item = ReaderId> + '_ {
        self.matches
            .range((writer.0, 0)..=(writer.0, u64::MAX))
            .map(|&(_, r)| ReaderId(r))
    }

    /// Whether `writer` and `reader` match.
    pub fn is_matched(&self, writer: WriterId, reader: ReaderId) -> bool {
        self.matches.contains(&(writer.0, reader.0))
    }

    /// Take a delivered announcement; push what changed onto `events`.
    pub fn handle_announce(&mut self, a: &Announce, events: &mut Vec<Event>) -> Result<(), DiscoveryError> {
        if a.msg == MSG_RETIRE {
            self.retire(a.endpoint, Unmatch::Retired, events);
            return Ok(());
        }
        if self.endpoints.contains_key(&a.endpoint) {
            return Err(DiscoveryError::Duplicate(a.endpoint));
        }
        if self.endpoints.len() >= ENDPOINTS_MAX {
            return Err(DiscoveryError::Qos {
                endpoint: a.endpoint,
                why: format!("the domain holds {ENDPOINTS_MAX} endpoints already"),
            });
        }
        let bad = |why: String| DiscoveryError::Qos {
            endpoint: a.endpoint,
            why,
        };
        let partition = Partition {
            names: a.partitions.clone(),
        };
        let qos = match a.msg {
            MSG_WRITER => {
                let mut q = QosWire::from_bytes(&a.qos)
                    .and_then(|w| WriterQos::from_wire(&w))
                    .map_err(|e| bad(e.to_string()))?;
                q.partition = partition;
                EndpointQos::Writer(q)
            }
            MSG_READER => {
                let mut q = QosWire::from_bytes(&a.qos)
                    .and_then(|w| ReaderQos::from_wire(&w))
                    .map_err(|e| bad(e.to_string()))?;
                q.partition = partition;
                EndpointQos::Reader(q)
            }
            other => {
                return Err(WireError::UnknownKind {
                    what: "announcement",
                    value: other,
                }
                .into())
            }
        };
        let ep = Endpoint {
            id: a.endpoint,
            topic: a.topic.clone(),
            type_name: a.type_name.clone(),
            qos,
            announce: a.clone(),
        };
        for other in self.endpoints.values() {
            if other.topic != ep.topic || other.is_writer() == ep.is_writer() {
                continue;
            }
            let (w, r) = if ep.is_writer() { (&ep, other) } else { (other, &ep) };
            if let Some(event) = Self::pair(w, r) {
                if let Event::Matched { writer, reader } = &event {
                    self.matches.insert((writer.0, reader.0));
                }
                events.push(event);
            }
        }
        self.endpoints.insert(ep.id, ep);
        Ok(())
    }

    /// What a writer and a reader of the same topic are to each other
    /// (`None`: their partitions do not meet, so they never see each
    /// other).
    fn pair(w: &Endpoint, r: &Endpoint) -> Option<Event> {
        let (EndpointQos::Writer(wq), EndpointQos::Reader(rq)) = (&w.qos, &r.qos) else {
            unreachable!("pair takes a writer and a reader");
        };
        if !qos::partitions_match(w.partition(), r.partition()) {
            return None;
        }
        let (writer, reader) = (WriterId(w.id), ReaderId(r.id));
        if w.type_name != r.type_name {
            return Some(Event::InconsistentTopic {
                writer,
                reader,
                writer_type: w.type_name.clone(),
                reader_type: r.type_name.clone(),
            });
        }
        Some(match qos::check_compatible(wq, rq) {
            Ok(()) => Event::Matched { writer, reader },
            Err(incompatible) => Event::IncompatibleQos {
                writer,
                reader,
                policies: incompatible.policies,
            },
        })
    }

    fn retire(&mut self, id: u64, why: Unmatch, events: &mut Vec<Event>) {
        let Some(ep) = self.endpoints.remove(&id) else {
            return;
        };
        let gone: Vec<(u64, u64)> = self
            .matches
            .iter()
            .copied()
            .filter(|&(w, r)| if ep.is_writer() { w == id } else { r == id })
            .collect();
        for (w, r) in gone {
            self.matches.remove(&(w, r));
            events.push(Event::Unmatched {
                writer: WriterId(w),
                reader: ReaderId(r),
                why,
            });
        }
    }

    /// A participant left the view: its endpoints are gone (its writers'
    /// liveliness is lost).
    pub fn handle_participant_gone(&mut self, rank: usize, events: &mut Vec<Event>) {
        let ids: Vec<u64> = self
            .endpoints
            .keys()
            .copied()
            .filter(|&id| endpoint_participant(id) == rank)
            .collect();
        for id in ids {
            self.retire(id, Unmatch::ParticipantGone, events);
        }
    }

    /// The announcements of every endpoint, for a joining participant
    /// (length-prefixed, in id order).
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        let mut buf = Vec::new();
        out.extend_from_slice(&(self.endpoints.len() as u32).to_le_bytes());
        for ep in self.endpoints.values() {
            ep.announce.encode(&mut buf).expect("a stored announcement encodes");
            out.extend_from_slice(&(buf.len() as u32).to_le_bytes());
            out.extend_from_slice(&buf);
        }
    }

    /// The domain as a snapshot describes it (matches recomputed), and the
    /// bytes of `snapshot` it took.
    pub fn restore(snapshot: &[u8]) -> Result<(Discovery, usize), DiscoveryError> {
        let truncated = || {
            DiscoveryError::Wire(WireError::Truncated {
                what: "discovery snapshot",
                len: snapshot.len(),
                needed: snapshot.len() + 1,
            })
        };
        let mut d = Discovery::new();
        let mut events = Vec::new();
        let mut at = 4;
        let n = u32::from_le_bytes(snapshot.get(..4).ok_or_else(truncated)?.try_into().expect("4 bytes"));
        for _ in 0..n.min(ENDPOINTS_MAX as u32) {
            let len = u32::from_le_bytes(
                snapshot
                    .get(at..at + 4)
                    .ok_or_else(truncated)?
                    .try_into()
                    .expect("4 bytes"),
            ) as usize;
            at += 4;
            let a = Announce::decode(snapshot.get(at..at + len).ok_or_else(truncated)?)?;
            at += len;
            d.handle_announce(&a, &mut events)?;
        }
        Ok((d, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::{QosPolicyId, ReaderQos, WriterQos};
    use crate::types::endpoint_id;
    use std::time::Duration;

    fn writer(id: u64, topic: &str, type_name: &str, qos: &WriterQos) -> Announce {
        Announce {
            msg: MSG_WRITER,
            endpoint: id,
            topic: topic.into(),
            type_name: type_name.into(),
            partitions: qos.partition.names.clone(),
            qos: qos.to_wire().as_bytes().to_vec(),
        }
    }

    fn reader(id: u64, topic: &str, type_name: &str, qos: &ReaderQos) -> Announce {
        Announce {
            msg: MSG_READER,
            endpoint: id,
            topic: topic.into(),
            type_name: type_name.into(),
            partitions: qos.partition.names.clone(),
            qos: qos.to_wire().as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_writer_and_a_reader_of_one_topic_match_in_either_order() {
        let (w, r) = (endpoint_id(0, 1), endpoint_id(1, 1));
        for writer_first in [true, false] {
            let mut d = Discovery::new();
            let mut events = Vec::new();
            let wa = writer(w, "t", "T", &WriterQos::default());
            let ra = reader(r, "t", "T", &ReaderQos::default().reliable(Duration::from_millis(5)));
            let (a, b) = if writer_first { (&wa, &ra) } else { (&ra, &wa) };
            d.handle_announce(a, &mut events).unwrap();
            assert!(events.is_empty());
            d.handle_announce(b, &mut events).unwrap();
            assert_eq!(
                events,
                vec![Event::Matched {
                    writer: WriterId(w),
                    reader: ReaderId(r)
                }]
            );
            assert!(d.is_matched(WriterId(w), ReaderId(r)));
            assert_eq!(d.readers_of(WriterId(w)).collect::<Vec<_>>(), vec![ReaderId(r)]);
        }
    }

    #[test]
    fn incompatible_qos_and_inconsistent_types_are_reported_not_matched() {
        let mut d = Discovery::new();
        let mut events = Vec::new();
        let w = endpoint_id(0, 1);
        d.handle_announce(&writer(w, "t", "T", &WriterQos::default().best_effort()), &mut events)
            .unwrap();
        let r = endpoint_id(1, 1);
        d.handle_announce(
            &reader(
                r,
                "t",
                "T",
                &ReaderQos::default()
                    .reliable(Duration::from_millis(5))
                    .transient_local(),
            ),
            &mut events,
        )
        .unwrap();
        match &events[..] {
            [Event::IncompatibleQos { policies, .. }] => {
                assert!(policies.contains(&QosPolicyId::Reliability), "{policies:?}");
                assert!(policies.contains(&QosPolicyId::Durability), "{policies:?}");
            }
            other => panic!("expected an incompatibility, got {other:?}"),
        }
        assert!(!d.is_matched(WriterId(w), ReaderId(r)));
        events.clear();
        let r2 = endpoint_id(1, 2);
        d.handle_announce(&reader(r2, "t", "Other", &ReaderQos::default()), &mut events)
            .unwrap();
        assert!(matches!(&events[..], [Event::InconsistentTopic { .. }]), "{events:?}");
    }

    #[test]
    fn partitions_that_do_not_meet_never_see_each_other() {
        let mut d = Discovery::new();
        let mut events = Vec::new();
        d.handle_announce(
            &writer(
                endpoint_id(0, 1),
                "t",
                "T",
                &WriterQos::default().partition(&["plant-a"]),
            ),
            &mut events,
        )
        .unwrap();
        d.handle_announce(
            &reader(
                endpoint_id(1, 1),
                "t",
                "T",
                &ReaderQos::default().partition(&["plant-b"]),
            ),
            &mut events,
        )
        .unwrap();
        assert!(events.is_empty(), "{events:?}");
        d.handle_announce(
            &reader(
                endpoint_id(1, 2),
                "t",
                "T",
                &ReaderQos::default().partition(&["plant-*"]),
            ),
            &mut events,
        )
        .unwrap();
        assert_eq!(events.len(), 1, "the wildcard partition matches: {events:?}");
    }

    #[test]
    fn retiring_or_losing_a_participant_unmatches_and_snapshots_restore_the_domain() {
        let mut d = Discovery::new();
        let mut events = Vec::new();
        let (w, r) = (endpoint_id(0, 1), endpoint_id(1, 1));
        d.handle_announce(&writer(w, "t", "T", &WriterQos::default()), &mut events)
            .unwrap();
        d.handle_announce(&reader(r, "t", "T", &ReaderQos::default()), &mut events)
            .unwrap();
        let mut snap = Vec::new();
        d.snapshot(&mut snap);
        let (restored, used) = Discovery::restore(&snap).unwrap();
        assert_eq!(used, snap.len());
        assert!(restored.is_matched(WriterId(w), ReaderId(r)));
        assert!(matches!(
            d.handle_announce(&writer(w, "t", "T", &WriterQos::default()), &mut events),
            Err(DiscoveryError::Duplicate(_))
        ));
        events.clear();
        d.handle_participant_gone(0, &mut events);
        assert_eq!(
            events,
            vec![Event::Unmatched {
                writer: WriterId(w),
                reader: ReaderId(r),
                why: Unmatch::ParticipantGone
            }]
        );
        events.clear();
        d.handle_announce(&Announce::retire(r), &mut events).unwrap();
        assert!(events.is_empty(), "the writer was already gone");
        assert_eq!(d.endpoints().count(), 0);
        assert!(Discovery::restore(&snap[..snap.len() - 1]).is_err());
    }

    #[test]
    fn an_announcement_with_bad_qos_bytes_is_refused() {
        let mut d = Discovery::new();
        let mut a = writer(endpoint_id(0, 1), "t", "T", &WriterQos::default());
        a.qos.truncate(3);
        assert!(matches!(
            d.handle_announce(&a, &mut Vec::new()),
            Err(DiscoveryError::Qos { .. })
        ));
        let mut r = reader(endpoint_id(0, 2), "t", "T", &ReaderQos::default());
        r.msg = MSG_WRITER;
        assert!(
            d.handle_announce(&r, &mut Vec::new()).is_err(),
            "a reader's QoS is not a writer's"
        );
    }
}
