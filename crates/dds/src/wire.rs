//! The messages the DDS layer multicasts in its group: samples and
//! endpoint announcements. Every group message starts with a one-byte
//! message kind; the layouts are `#[repr(C)]`, little-endian, fixed width.
//!
//! A sample (the header, then the serialized value):
//!
//! ```text
//!  0        1        2                4                8
//!  ┌────────┬────────┬────────────────┬────────────────┐
//!  │ msg=1  │ kind   │ flags (u16)    │ payload_bytes  │   kind: SampleKind
//!  ├────────┴────────┴────────────────┴────────────────┤   flags: bit 0 = replay
//!  │ writer (u64)                                      │ 8
//!  │ seq (u64)                                         │ 16
//!  │ source_timestamp_ns (u64)                         │ 24
//!  │ instance (u64)                                    │ 32
//!  │ target_reader (u64; 0 = every matched reader)     │ 40
//!  ├─────────────────────────┬─────────────────────────┤
//!  │ strength (i32)          │ reserved (u32, 0)       │ 48
//!  ├─────────────────────────┴─────────────────────────┤
//!  │ payload (payload_bytes)                           │ 56
//!  └───────────────────────────────────────────────────┘
//! ```
//!
//! An endpoint announcement (a writer or reader came or went):
//!
//! ```text
//!  0        1        2                4                8
//!  ┌────────┬────────┬────────────────┬────────────────┐
//!  │ msg    │ 0      │ topic_bytes    │ type_bytes     │   msg: 2 writer, 3 reader,
//!  │        │        │ (u16)          │ (u16) │ 0 (u16)│        4 endpoint retired
//!  ├────────┴────────┴────────────────┴────────────────┤
//!  │ endpoint (u64)                                    │ 8
//!  ├─────────────────────────┬─────────────────────────┤
//!  │ partition_bytes (u32)   │ qos_bytes (u32)         │ 16
//!  ├─────────────────────────┴─────────────────────────┤
//!  │ topic name │ type name │ partitions (NUL-separated)│ qos │ 24
//!  └───────────────────────────────────────────────────┘
//! ```

use thiserror::Error;

use crate::types::{InstanceHandle, ReaderId, SampleKind, SampleMeta, WriterId};

/// Message kind: a sample.
pub const MSG_SAMPLE: u8 = 1;
/// Message kind: a writer announced.
pub const MSG_WRITER: u8 = 2;
/// Message kind: a reader announced.
pub const MSG_READER: u8 = 3;
/// Message kind: an endpoint retired (deleted by its participant).
pub const MSG_RETIRE: u8 = 4;

/// Sample flag: a transient-local replay addressed to one late reader.
pub const FLAG_REPLAY: u16 = 1;

/// A sample's header (see the module diagram).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleHeader {
    /// [`MSG_SAMPLE`].
    pub msg: u8,
    /// [`SampleKind`] as a byte.
    pub kind: u8,
    /// [`FLAG_REPLAY`] or 0.
    pub flags: u16,
    /// Bytes of serialized value after the header.
    pub payload_bytes: u32,
    /// The writer.
    pub writer: u64,
    /// The writer's sequence number (from 1).
    pub seq: u64,
    /// The writer's `CLOCK_REALTIME` at `write`.
    pub source_timestamp_ns: u64,
    /// The instance handle.
    pub instance: u64,
    /// The one reader a replay is for (0: every matched reader).
    pub target_reader: u64,
    /// Ownership strength.
    pub strength: i32,
    /// Zero.
    pub reserved: u32,
}

/// Bytes of a [`SampleHeader`].
pub const SAMPLE_HEADER_BYTES: usize = 56;
const _: () = assert!(std::mem::size_of::<SampleHeader>() == SAMPLE_HEADER_BYTES);
const _: () = assert!(std::mem::align_of::<SampleHeader>() == 8);
const _: () = assert!(std::mem::offset_of!(SampleHeader, writer) == 8);
const _: () = assert!(std::mem::offset_of!(SampleHeader, target_reader) == 40);
const _: () = assert!(std::mem::offset_of!(SampleHeader, strength) == 48);

/// An announcement's fixed part.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnnounceHeader {
    /// [`MSG_WRITER`], [`MSG_READER`] or [`MSG_RETIRE`].
    pub msg: u8,
    /// Zero.
    pub reserved0: u8,
    /// Bytes of the topic name (UTF-8).
    pub topic_bytes: u16,
    /// Bytes of the type name (UTF-8).
    pub type_bytes: u16,
    /// Zero.
    pub reserved1: u16,
    /// The endpoint ([`WriterId`] or [`ReaderId`]).
    pub endpoint: u64,
    /// Bytes of the partition names (UTF-8, NUL-separated).
    pub partition_bytes: u32,
    /// Bytes of the QoS (the qos module's wire form).
    pub qos_bytes: u32,
}

/// Bytes of an [`AnnounceHeader`].
pub const ANNOUNCE_HEADER_BYTES: usize = 24;
const _: () = assert!(std::mem::size_of::<AnnounceHeader>() == ANNOUNCE_HEADER_BYTES);
const _: () = assert!(std::mem::offset_of!(AnnounceHeader, endpoint) == 8);
const _: () = assert!(std::mem::offset_of!(AnnounceHeader, qos_bytes) == 20);

/// Longest topic or type name.
pub const NAME_BYTES_MAX: usize = 256;
/// Most partition-name bytes.
pub const PARTITION_BYTES_MAX: usize = 4096;
/// Most QoS bytes an announcement carries.
pub const QOS_BYTES_MAX: usize = 256;
/// The longest announcement (a participant's slots are at least this
/// large, whatever its samples' size).
pub const ANNOUNCE_BYTES_MAX: usize = ANNOUNCE_HEADER_BYTES + 2 * NAME_BYTES_MAX + PARTITION_BYTES_MAX + QOS_BYTES_MAX;

/// A group message that is not a well-formed DDS message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than its header or than the lengths it declares.
    #[error("truncated {what}: {len} bytes, needs {needed}")]
    Truncated {
        /// The message kind.
        what: &'static str,
        /// Bytes there were.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// An unknown message or sample kind.
    #[error("unknown {what} byte {value}")]
    UnknownKind {
        /// Which kind.
        what: &'static str,
        /// The byte.
        value: u8,
    },
    /// A name that is not UTF-8 or too long.
    #[error("bad {what}: {why}")]
    BadName {
        /// Which name.
        what: &'static str,
        /// Why.
        why: String,
    },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl SampleHeader {
    /// The header of a sample with these metadata.
    pub fn new(meta: &SampleMeta, payload_bytes: u32, target_reader: Option<ReaderId>) -> SampleHeader {
        SampleHeader {
            msg: MSG_SAMPLE,
            kind: meta.kind as u8,
            flags: if target_reader.is_some() { FLAG_REPLAY } else { 0 },
            payload_bytes,
            writer: meta.writer.0,
            seq: meta.seq,
            source_timestamp_ns: meta.source_timestamp_ns,
            instance: meta.instance.0,
            target_reader: target_reader.map_or(0, |r| r.0),
            strength: meta.strength,
            reserved: 0,
        }
    }

    /// Write the header into the first [`SAMPLE_HEADER_BYTES`] of `out`.
    pub fn write_to(&self, out: &mut [u8]) {
        let out = &mut out[..SAMPLE_HEADER_BYTES];
        out[0] = self.msg;
        out[1] = self.kind;
        out[2..4].copy_from_slice(&self.flags.to_le_bytes());
        out[4..8].copy_from_slice(&self.payload_bytes.to_le_bytes());
        out[8..16].copy_from_slice(&self.writer.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.source_timestamp_ns.to_le_bytes());
        out[32..40].copy_from_slice(&self.instance.to_le_bytes());
        out[40..48].copy_from_slice(&self.target_reader.to_le_bytes());
        out[48..52].copy_from_slice(&self.strength.to_le_bytes());
        out[52..56].copy_from_slice(&self.reserved.to_le_bytes());
    }

    /// Parse a sample message: its header and payload.
    pub fn parse(msg: &[u8]) -> Result<(SampleHeader, &[u8]), WireError> {
        if msg.len() < SAMPLE_HEADER_BYTES {
            return Err(WireError::Truncated {
                what: "sample",
                len: msg.len(),
                needed: SAMPLE_HEADER_BYTES,
            });
        }
        let h = SampleHeader {
            msg: msg[0],
            kind: msg[1],
            flags: u16_at(msg, 2),
            payload_bytes: u32_at(msg, 4),
            writer: u64_at(msg, 8),
            seq: u64_at(msg, 16),
            source_timestamp_ns: u64_at(msg, 24),
            instance: u64_at(msg, 32),
            target_reader: u64_at(msg, 40),
            strength: i32::from_le_bytes(msg[48..52].try_into().expect("4 bytes")),
            reserved: u32_at(msg, 52),
        };
        if h.msg != MSG_SAMPLE {
            return Err(WireError::UnknownKind {
                what: "message",
                value: h.msg,
            });
        }
        SampleKind::from_u8(h.kind).ok_or(WireError::UnknownKind {
            what: "sample kind",
            value: h.kind,
        })?;
        let needed = SAMPLE_HEADER_BYTES + h.payload_bytes as usize;
        if msg.len() < needed {
            return Err(WireError::Truncated {
                what: "sample",
                len: msg.len(),
                needed,
            });
        }
        Ok((h, &msg[SAMPLE_HEADER_BYTES..needed]))
    }

    /// The metadata the reader side keeps.
    pub fn meta(&self) -> SampleMeta {
        SampleMeta {
            writer: WriterId(self.writer),
            seq: self.seq,
            source_timestamp_ns: self.source_timestamp_ns,
            instance: InstanceHandle(self.instance),
            kind: SampleKind::from_u8(self.kind).unwrap_or(SampleKind::Data),
            strength: self.strength,
        }
    }
}

/// An endpoint announcement, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announce {
    /// [`MSG_WRITER`], [`MSG_READER`] or [`MSG_RETIRE`].
    pub msg: u8,
    /// The endpoint id.
    pub endpoint: u64,
    /// The topic name.
    pub topic: String,
    /// The type name.
    pub type_name: String,
    /// Partition names (empty: the default partition).
    pub partitions: Vec<String>,
    /// The QoS in its wire form (decoded by the qos module).
    pub qos: Vec<u8>,
}

impl Announce {
    /// The announcement that endpoint `id` was retired (deleted).
    pub fn retire(id: u64) -> Announce {
        Announce {
            msg: MSG_RETIRE,
            endpoint: id,
            topic: "-".into(),
            type_name: "-".into(),
            partitions: Vec::new(),
            qos: Vec::new(),
        }
    }

    /// Encode into `out` (cleared first; discovery is not a hot path).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        check_name("topic name", &self.topic)?;
        check_name("type name", &self.type_name)?;
        let partitions = self.partitions.join("\0");
        if partitions.len() > PARTITION_BYTES_MAX {
            return Err(WireError::BadName {
                what: "partitions",
                why: format!("{} bytes, at most {PARTITION_BYTES_MAX}", partitions.len()),
            });
        }
        if self.qos.len() > QOS_BYTES_MAX {
            return Err(WireError::BadName {
                what: "qos",
                why: format!("{} bytes, at most {QOS_BYTES_MAX}", self.qos.len()),
            });
        }
        out.clear();
        out.push(self.msg);
        out.push(0);
        out.extend_from_slice(&(self.topic.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.type_name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.endpoint.to_le_bytes());
        out.extend_from_slice(&(partitions.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.qos.len() as u32).to_le_bytes());
        debug_assert_eq!(out.len(), ANNOUNCE_HEADER_BYTES);
        out.extend_from_slice(self.topic.as_bytes());
        out.extend_from_slice(self.type_name.as_bytes());
        out.extend_from_slice(partitions.as_bytes());
        out.extend_from_slice(&self.qos);
        Ok(())
    }

    /// Decode an announcement (every length checked).
    pub fn decode(msg: &[u8]) -> Result<Announce, WireError> {
        if msg.len() < ANNOUNCE_HEADER_BYTES {
            return Err(WireError::Truncated {
                what: "announcement",
                len: msg.len(),
                needed: ANNOUNCE_HEADER_BYTES,
            });
        }
        let kind = msg[0];
        if !matches!(kind, MSG_WRITER | MSG_READER | MSG_RETIRE) {
            return Err(WireError::UnknownKind {
                what: "message",
                value: kind,
            });
        }
        let topic_bytes = u16_at(msg, 2) as usize;
        let type_bytes = u16_at(msg, 4) as usize;
        let endpoint = u64_at(msg, 8);
        let partition_bytes = u32_at(msg, 16) as usize;
        let qos_bytes = u32_at(msg, 20) as usize;
        let needed = ANNOUNCE_HEADER_BYTES + topic_bytes + type_bytes + partition_bytes + qos_bytes;
        if msg.len() < needed {
            return Err(WireError::Truncated {
                what: "announcement",
                len: msg.len(),
                needed,
            });
        }
        let mut at = ANNOUNCE_HEADER_BYTES;
        let mut take = |n: usize| {
            let s = &msg[at..at + n];
            at += n;
            s
        };
        let topic = utf8("topic name", take(topic_bytes))?;
        let type_name = utf8("type name", take(type_bytes))?;
        let partitions = utf8("partitions", take(partition_bytes))?;
        let qos = take(qos_bytes).to_vec();
        Ok(Announce {
            msg: kind,
            endpoint,
            topic,
            type_name,
            partitions: if partitions.is_empty() {
                Vec::new()
            } else {
                partitions.split('\0').map(str::to_owned).collect()
            },
            qos,
        })
    }
}

fn check_name(what: &'static str, name: &str) -> Result<(), WireError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.contains('\0') {
        return Err(WireError::BadName {
            what,
            why: format!("{name:?} must be 1..={NAME_BYTES_MAX} bytes without NUL"),
        });
    }
    Ok(())
}

fn utf8(what: &'static str, b: &[u8]) -> Result<String, WireError> {
    String::from_utf8(b.to_vec()).map_err(|e| WireError::BadName {
        what,
        why: e.to_string(),
    })
}

/// The message kind of a group message (its first byte), if any.
pub fn message_kind(msg: &[u8]) -> Option<u8> {
    msg.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> SampleMeta {
        SampleMeta {
            writer: WriterId(0x0001_0000_0000_0002),
            seq: 42,
            source_timestamp_ns: 1_700_000_000_000_000_000,
            instance: InstanceHandle(0xdead_beef),
            kind: SampleKind::Dispose,
            strength: -3,
        }
    }

    #[test]
    fn a_sample_header_round_trips() {
        let mut msg = vec![0u8; SAMPLE_HEADER_BYTES + 5];
        let h = SampleHeader::new(&meta(), 5, Some(ReaderId(9)));
        h.write_to(&mut msg);
        msg[SAMPLE_HEADER_BYTES..].copy_from_slice(b"hello");
        let (back, payload) = SampleHeader::parse(&msg).unwrap();
        assert_eq!(back, h);
        assert_eq!(payload, b"hello");
        assert_eq!(back.meta(), meta());
        assert_eq!(back.flags, FLAG_REPLAY);
    }

    #[test]
    fn a_truncated_or_unknown_sample_is_refused() {
        let mut msg = vec![0u8; SAMPLE_HEADER_BYTES + 5];
        SampleHeader::new(&meta(), 5, None).write_to(&mut msg);
        assert!(matches!(
            SampleHeader::parse(&msg[..SAMPLE_HEADER_BYTES + 4]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            SampleHeader::parse(&msg[..10]),
            Err(WireError::Truncated { .. })
        ));
        msg[1] = 9;
        assert!(matches!(SampleHeader::parse(&msg), Err(WireError::UnknownKind { .. })));
    }

    #[test]
    fn an_announcement_round_trips_and_bad_ones_are_refused() {
        let a = Announce {
            msg: MSG_READER,
            endpoint: 77,
            topic: "sensors/temperature".into(),
            type_name: "Reading".into(),
            partitions: vec!["plant-a".into(), "line-*".into()],
            qos: vec![1, 2, 3],
        };
        let mut buf = Vec::new();
        a.encode(&mut buf).unwrap();
        assert_eq!(Announce::decode(&buf).unwrap(), a);
        assert!(matches!(
            Announce::decode(&buf[..buf.len() - 1]),
            Err(WireError::Truncated { .. })
        ));
        let mut bad = buf.clone();
        bad[ANNOUNCE_HEADER_BYTES] = 0xff;
        assert!(matches!(Announce::decode(&bad), Err(WireError::BadName { .. })));
        let empty = Announce {
            topic: String::new(),
            ..a
        };
        assert!(matches!(empty.encode(&mut buf), Err(WireError::BadName { .. })));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = SampleHeader::parse(&bytes);
            let _ = Announce::decode(&bytes);
        }
    }
}
