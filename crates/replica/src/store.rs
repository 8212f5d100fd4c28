//! The master's objects: key → (version, value), with bounded memory.

use std::collections::HashMap;

use crate::record::{Record, RecordKind};

/// One stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub version: u64,
    pub value: Box<[u8]>,
}

/// Fixed bytes charged per object on top of its key and value (the hash
/// table entry and allocation headers, roughly).
pub const OBJECT_OVERHEAD_BYTES: usize = 64;

/// The objects of a store, with their memory charged against a bound.
#[derive(Debug)]
pub struct ObjectMap {
    objects: HashMap<Box<[u8]>, Object>,
    bytes: usize,
    bytes_max: usize,
    /// Highest version seen (every new write takes the next one).
    version_max: u64,
}

impl ObjectMap {
    pub fn new(bytes_max: usize) -> ObjectMap {
        ObjectMap {
            objects: HashMap::new(),
            bytes: 0,
            bytes_max,
            version_max: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
    /// Bytes charged (keys, values, overhead).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    pub fn bytes_max(&self) -> usize {
        self.bytes_max
    }
    pub fn version_max(&self) -> u64 {
        self.version_max
    }
    /// The version the next write takes.
    pub fn next_version(&self) -> u64 {
        self.version_max + 1
    }

    pub fn get(&self, key: &[u8]) -> Option<&Object> {
        self.objects.get(key)
    }

    /// Whether storing `value` under `key` stays within the bound.
    pub fn fits(&self, key: &[u8], value_len: usize) -> bool {
        let old = self
            .objects
            .get(key)
            .map(|o| cost(key.len(), o.value.len()))
            .unwrap_or(0);
        self.bytes - old + cost(key.len(), value_len) <= self.bytes_max
    }

    /// Store `value` under `key` at `version`.
    pub fn put(&mut self, key: &[u8], value: &[u8], version: u64) {
        debug_assert!(version > 0, "versions start at 1");
        let new_cost = cost(key.len(), value.len());
        match self.objects.get_mut(key) {
            Some(o) => {
                assert!(
                    version > o.version,
                    "version order: {version} after {} for one key",
                    o.version
                );
                self.bytes = self.bytes - cost(key.len(), o.value.len()) + new_cost;
                o.version = version;
                o.value = value.into();
            }
            None => {
                self.bytes += new_cost;
                self.objects.insert(
                    key.into(),
                    Object {
                        version,
                        value: value.into(),
                    },
                );
            }
        }
        self.version_max = self.version_max.max(version);
    }

    /// Remove `key`; whether it existed.
    pub fn delete(&mut self, key: &[u8], version: u64) -> bool {
        self.version_max = self.version_max.max(version);
        match self.objects.remove(key) {
            Some(o) => {
                self.bytes -= cost(key.len(), o.value.len());
                true
            }
            None => false,
        }
    }

    /// Apply a replayed record (recovery).
    pub fn apply_record(&mut self, r: &Record<'_>) -> Result<(), String> {
        match r.kind {
            RecordKind::Put => {
                if !self.fits(r.key, r.value.len()) {
                    return Err(format!(
                        "the objects exceed memory_bytes_max {} at position {}",
                        self.bytes_max, r.position
                    ));
                }
                if let Some(o) = self.objects.get(r.key) {
                    if o.version >= r.version {
                        return Err(format!("version order: position {} lowers a key's version", r.position));
                    }
                }
                self.put(r.key, r.value, r.version);
            }
            RecordKind::Delete => {
                self.delete(r.key, r.version);
            }
            RecordKind::Pad | RecordKind::SnapshotDone => {}
        }
        Ok(())
    }

    /// Every object (for a snapshot), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Object)> {
        self.objects.iter().map(|(k, o)| (&k[..], o))
    }
}

fn cost(key_len: usize, value_len: usize) -> usize {
    key_len + value_len + OBJECT_OVERHEAD_BYTES
}
