//! The master's objects: key → (version, value, expiry), with bounded
//! memory.
//!
//! An expiry is an absolute time (unix ms) that came from the master in
//! an expire record; the map never reads a clock. Callers pass `now_ms`
//! and the master turns due keys into delete records
//! ([`ObjectMap::due`]), so a backup that replays the log — and a backup
//! promoted to master — holds exactly the expiries the master decided.

use std::collections::{BTreeSet, HashMap};

use crate::record::{expire_time_ms, Record, RecordKind};

/// One stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub version: u64,
    pub value: Box<[u8]>,
    /// Unix time in ms at which the object expires; 0: never.
    pub expires_at_ms: u64,
}

impl Object {
    /// Whether the object has expired at `now_ms` (it is then as good as
    /// absent, until the master deletes it).
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }
}

/// Fixed bytes charged per object on top of its key and value (the hash
/// table entry and allocation headers, roughly).
pub const OBJECT_OVERHEAD_BYTES: usize = 64;

/// The objects of a store, with their memory charged against a bound.
#[derive(Debug)]
pub struct ObjectMap {
    /// Hashed with aHash, keyed at random per process as std's SipHash-1-3
    /// is (a client cannot choose colliding keys without the key), at a
    /// fraction of SipHash's cost: SipHash was 7.7% of the master's CPU
    /// under redis-benchmark SET -P 16 (Redis hashes with SipHash-1-2).
    objects: HashMap<Box<[u8]>, Object, ahash::RandomState>,
    /// (expires_at_ms, key) of every object with an expiry, soonest first.
    expiries: BTreeSet<(u64, Box<[u8]>)>,
    bytes: usize,
    bytes_max: usize,
    /// Highest version seen (every new write takes the next one).
    version_max: u64,
}

impl ObjectMap {
    pub fn new(bytes_max: usize) -> ObjectMap {
        ObjectMap {
            objects: HashMap::with_hasher(ahash::RandomState::new()),
            expiries: BTreeSet::new(),
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

    /// The object under `key` unless it has expired at `now_ms`.
    pub fn get_live(&self, key: &[u8], now_ms: u64) -> Option<&Object> {
        self.objects.get(key).filter(|o| !o.expired(now_ms))
    }

    /// Objects with an expiry.
    pub fn expiring(&self) -> usize {
        self.expiries.len()
    }

    /// Up to `max` keys whose expiry is due at `now_ms`, soonest first
    /// (the master deletes them with delete records).
    pub fn due(&self, now_ms: u64, max: usize) -> Vec<Box<[u8]>> {
        self.expiries
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .take(max)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// Set (`expires_at_ms` > 0) or clear (0) the expiry of `key`, as an
    /// expire record at `version` says; whether the key exists.
    pub fn set_expiry(&mut self, key: &[u8], expires_at_ms: u64, version: u64) -> bool {
        self.version_max = self.version_max.max(version);
        let Some(o) = self.objects.get_mut(key) else {
            return false;
        };
        if o.expires_at_ms != 0 {
            let removed = self.expiries.remove(&(o.expires_at_ms, Box::from(key)));
            assert!(removed, "expiry index: every expiring object is indexed");
        }
        o.expires_at_ms = expires_at_ms;
        if expires_at_ms != 0 {
            self.expiries.insert((expires_at_ms, key.into()));
        }
        true
    }

    /// Delete every object (a flush record at `version`).
    pub fn flush(&mut self, version: u64) {
        self.version_max = self.version_max.max(version);
        self.objects.clear();
        self.expiries.clear();
        self.bytes = 0;
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.objects.keys().map(|k| &k[..])
    }

    /// Store `value` under `key` at `version`; the key's expiry is cleared
    /// (a put record clears it; see the record module).
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
                if o.expires_at_ms != 0 {
                    let removed = self.expiries.remove(&(o.expires_at_ms, Box::from(key)));
                    assert!(removed, "expiry index: every expiring object is indexed");
                    o.expires_at_ms = 0;
                }
            }
            None => {
                self.bytes += new_cost;
                self.objects.insert(
                    key.into(),
                    Object {
                        version,
                        value: value.into(),
                        expires_at_ms: 0,
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
                if o.expires_at_ms != 0 {
                    let removed = self.expiries.remove(&(o.expires_at_ms, Box::from(key)));
                    assert!(removed, "expiry index: every expiring object is indexed");
                }
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
            RecordKind::Expire => {
                // The master writes an expire record only for a key it
                // holds (after its put in the same batch or snapshot).
                if !self.set_expiry(r.key, expire_time_ms(r.value), r.version) {
                    return Err(format!("expire record at position {} for a missing key", r.position));
                }
            }
            RecordKind::Flush => self.flush(r.version),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::expire_value;

    fn record<'a>(kind: RecordKind, version: u64, key: &'a [u8], value: &'a [u8]) -> Record<'a> {
        Record {
            kind,
            epoch: 1,
            position: 8 * version,
            version,
            key,
            value,
            batch_rest: 0,
        }
    }

    /// Replaying the master's records gives the master's expiries, and a
    /// put clears an expiry: what a promoted backup holds.
    #[test]
    fn expire_records_apply_and_a_put_clears_the_expiry() {
        let mut m = ObjectMap::new(1 << 20);
        let at = expire_value(5_000);
        for r in [
            record(RecordKind::Put, 1, b"a", b"1"),
            record(RecordKind::Expire, 2, b"a", &at),
            record(RecordKind::Put, 3, b"b", b"2"),
            record(RecordKind::Expire, 4, b"b", &at),
            record(RecordKind::Put, 5, b"b", b"3"),
        ] {
            m.apply_record(&r).unwrap();
        }
        assert_eq!(m.get(b"a").unwrap().expires_at_ms, 5_000);
        assert_eq!(m.get(b"b").unwrap().expires_at_ms, 0, "a put clears the expiry");
        assert_eq!(m.expiring(), 1);
        assert!(m.get_live(b"a", 4_999).is_some());
        assert!(m.get_live(b"a", 5_000).is_none(), "expired at its time");
        assert_eq!(m.due(4_999, 8), Vec::<Box<[u8]>>::new());
        assert_eq!(m.due(5_000, 8), vec![Box::from(&b"a"[..])]);
        m.apply_record(&record(RecordKind::Expire, 6, b"a", &expire_value(0)))
            .unwrap();
        assert_eq!((m.expiring(), m.get(b"a").unwrap().expires_at_ms), (0, 0), "PERSIST");
        assert!(m
            .apply_record(&record(RecordKind::Expire, 7, b"nope", &at))
            .unwrap_err()
            .contains("missing key"));
        m.apply_record(&record(RecordKind::Expire, 8, b"a", &at)).unwrap();
        m.apply_record(&record(RecordKind::Delete, 9, b"a", b"")).unwrap();
        assert_eq!(m.expiring(), 0, "a delete drops the expiry");
        m.apply_record(&record(RecordKind::Flush, 10, b"", b"")).unwrap();
        assert_eq!((m.len(), m.bytes(), m.version_max()), (0, 0, 10));
    }
}
