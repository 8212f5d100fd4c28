//! The identifiers every part of the DDS layer shares: which writer,
//! which reader, which instance, what kind of sample.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A writer, unique in its domain: the participant's rank (high 16 bits)
/// and the writer's index in that participant (low 48 bits). The
/// publication handle of DDS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WriterId(pub u64);

/// A reader, unique in its domain (the same packing as [`WriterId`]).
/// The subscription handle of DDS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ReaderId(pub u64);

/// An endpoint id from a participant rank and a local index.
#[inline]
pub const fn endpoint_id(participant_rank: usize, local_index: u64) -> u64 {
    ((participant_rank as u64) << 48) | (local_index & ((1 << 48) - 1))
}

/// The participant rank of an endpoint id.
#[inline]
pub const fn endpoint_participant(id: u64) -> usize {
    (id >> 48) as usize
}

impl WriterId {
    /// The rank of the participant that owns this writer.
    pub const fn participant(self) -> usize {
        endpoint_participant(self.0)
    }
}

impl ReaderId {
    /// The rank of the participant that owns this reader.
    pub const fn participant(self) -> usize {
        endpoint_participant(self.0)
    }
}

/// Hashes the `u64` ids of this layer (writer and reader ids, instance
/// handles) with one multiplication, for the maps looked up once per
/// delivered sample (routes, histories, a reader's instances and writers).
/// SipHash, the default, cost two of them per sample. No hash flooding
/// is opened by it: endpoint ids are made by members of the domain, and
/// an instance handle is already an unkeyed hash (xxh3) of its key, so
/// colliding keys could be chosen with SipHash too.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

/// Fibonacci hashing's multiplier: 2^64 divided by the golden ratio.
const FIBONACCI_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (u64 keys); any other key still hashes.
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, id: u64) {
        // A folded multiply: the 128-bit product's halves XORed. The low
        // half's low bits see only the id's low bits, the high half's see
        // all of them; the table picks the bucket with the low bits (and
        // a tag with the top 7), so ids that differ only in the
        // participant rank (bits 48..64) still spread over the buckets.
        let product = u128::from(self.0 ^ id) * u128::from(FIBONACCI_MULTIPLIER);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// A map keyed by a `u64` id (or a newtype of one), hashed by [`IdHasher`].
pub type IdHashMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// An instance of a keyed topic: the 64-bit hash of its key (xxh3 of the
/// key's serialization). A keyless topic has one instance, handle 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct InstanceHandle(pub u64);

/// What a sample carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SampleKind {
    /// A new value of the instance.
    Data = 0,
    /// The writer disposed of the instance (it no longer exists).
    Dispose = 1,
    /// The writer no longer writes the instance.
    Unregister = 2,
}

impl SampleKind {
    /// From the wire byte.
    pub fn from_u8(b: u8) -> Option<SampleKind> {
        match b {
            0 => Some(SampleKind::Data),
            1 => Some(SampleKind::Dispose),
            2 => Some(SampleKind::Unregister),
            _ => None,
        }
    }
}

/// Everything the reader side knows about a received sample besides its
/// bytes (what the writer stamped and the wire carried).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleMeta {
    /// The writer that wrote it.
    pub writer: WriterId,
    /// The writer's sequence number (1, 2, … per writer, no gaps under
    /// reliable QoS).
    pub seq: u64,
    /// The writer's clock when `write` was called (ns since the Unix
    /// epoch, `CLOCK_REALTIME`).
    pub source_timestamp_ns: u64,
    /// The instance.
    pub instance: InstanceHandle,
    /// Data, dispose or unregister.
    pub kind: SampleKind,
    /// The writer's ownership strength (exclusive ownership picks the
    /// strongest live writer per instance).
    pub strength: i32,
}

/// A topic's data type: a key, and a serialization. Implemented for every
/// `T: Serialize + DeserializeOwned + Keyed` (the serialization is
/// postcard's compact binary form, written in place into the send slot).
pub trait TopicType: Sized {
    /// The type name writers and readers compare (a mismatch is reported
    /// as such and never matched).
    fn type_name() -> &'static str;
    /// The instance this value belongs to.
    fn instance(&self) -> InstanceHandle;
    /// Serialize into `out`; the number of bytes written, or
    /// [`EncodeError::TooLarge`] when `out` is too small.
    fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError>;
    /// Deserialize a sample's bytes.
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError>;
}

/// A value's key: the fields that name its instance (`type Key = ()` for
/// a keyless topic: one instance).
pub trait Keyed {
    /// The key's type.
    type Key: Serialize + Hash;
    /// The key of this value.
    fn key(&self) -> Self::Key;
}

/// The instance handle of a key (xxh3 of its postcard serialization; 0
/// for the unit key).
pub fn instance_of<K: Serialize>(key: &K) -> InstanceHandle {
    let mut buf = [0u8; 256];
    match postcard::to_slice(key, &mut buf) {
        Ok([]) => InstanceHandle(0),
        Ok(bytes) => InstanceHandle(xxhash_rust::xxh3::xxh3_64(bytes)),
        // A key longer than 256 B: hash its full serialization (a rare,
        // allocating path).
        Err(_) => InstanceHandle(xxhash_rust::xxh3::xxh3_64(
            &postcard::to_stdvec(key).expect("a key that serializes"),
        )),
    }
}

impl<T: Serialize + DeserializeOwned + Keyed> TopicType for T {
    fn type_name() -> &'static str {
        short_type_name(std::any::type_name::<T>())
    }

    fn instance(&self) -> InstanceHandle {
        instance_of(&self.key())
    }

    fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let capacity_bytes = out.len();
        match postcard::to_slice(self, out) {
            Ok(written) => Ok(written.len()),
            Err(postcard::Error::SerializeBufferFull) => Err(EncodeError::TooLarge { capacity_bytes }),
            Err(e) => Err(EncodeError::Serialize(e.to_string())),
        }
    }

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        postcard::from_bytes(bytes).map_err(|e| DecodeError(e.to_string()))
    }
}

/// A Rust type name without its module path (`app::sensor::Reading` →
/// `Reading`), so that two programs that define the same type in
/// different modules agree; a generic type keeps its full name.
pub fn short_type_name(full: &'static str) -> &'static str {
    if full.contains('<') {
        full
    } else {
        full.rsplit("::").next().unwrap_or(full)
    }
}

/// A value that does not serialize into the space given.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// The serialized sample is larger than the writer's sample size limit.
    #[error("the serialized sample does not fit in {capacity_bytes} bytes (the writer's max_sample_bytes)")]
    TooLarge {
        /// The space there was.
        capacity_bytes: usize,
    },
    /// The serializer failed.
    #[error("serialization failed: {0}")]
    Serialize(String),
}

/// A sample whose bytes are not a value of the reader's type.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("sample bytes do not decode as the topic's type: {0}")]
pub struct DecodeError(pub String);

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// Writers with the same local index in different participants
    /// differ only in bits 48..64: their hashes must still differ in the
    /// low bits the table picks buckets with.
    #[test]
    fn id_hasher_spreads_participant_ranks_over_buckets() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<IdHasher>::default();
        let buckets_mask = 63u64;
        let buckets: std::collections::HashSet<u64> = (0..64)
            .map(|rank| build.hash_one(WriterId(endpoint_id(rank, 1))) & buckets_mask)
            .collect();
        assert!(
            buckets.len() >= 32,
            "64 participants' writer 1 fell in {} of 64 buckets",
            buckets.len()
        );
        let mut map: IdHashMap<InstanceHandle, u32> = IdHashMap::default();
        for i in 0..1000u32 {
            map.insert(InstanceHandle(u64::from(i) << 40), i);
        }
        assert!((0..1000u32).all(|i| map[&InstanceHandle(u64::from(i) << 40)] == i));
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Reading {
        sensor: u32,
        celsius: f64,
    }

    impl Keyed for Reading {
        type Key = u32;
        fn key(&self) -> u32 {
            self.sensor
        }
    }

    #[test]
    fn a_value_round_trips_and_its_key_names_its_instance() {
        let r = Reading {
            sensor: 7,
            celsius: 21.5,
        };
        let mut buf = [0u8; 64];
        let n = r.encode(&mut buf).unwrap();
        assert_eq!(Reading::decode(&buf[..n]).unwrap(), r);
        assert_eq!(
            r.instance(),
            Reading {
                sensor: 7,
                celsius: -3.0
            }
            .instance()
        );
        assert_ne!(
            r.instance(),
            Reading {
                sensor: 8,
                celsius: 21.5
            }
            .instance()
        );
        assert_eq!(instance_of(&()), InstanceHandle(0));
        assert_eq!(Reading::type_name(), "Reading");
    }

    #[test]
    fn a_value_too_large_for_the_slot_is_a_clear_error() {
        let r = Reading {
            sensor: 7,
            celsius: 21.5,
        };
        let mut buf = [0u8; 4];
        assert_eq!(r.encode(&mut buf), Err(EncodeError::TooLarge { capacity_bytes: 4 }));
    }

    #[test]
    fn endpoint_ids_pack_the_participant() {
        let w = WriterId(endpoint_id(5, 3));
        assert_eq!(w.participant(), 5);
        assert_eq!(w.0 & 0xffff, 3);
    }
}
