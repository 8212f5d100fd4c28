//! A DataWriter's history for transient-local durability: the
//! [`WriterHistory`] keeps, per instance, the last `depth` samples the
//! writer wrote (keep-last N: N; keep-all: up to
//! `max_samples_per_instance`), bounded by the resource limits, and
//! replays them in the order written to each late-joining reader.
//!
//! Dispose samples are kept like data (they count toward the depth), so a
//! late joiner learns that an instance was disposed. Unregistering an
//! instance drops it and its samples: the writer no longer speaks for it,
//! and a late joiner never hears of it.
//!
//! A pure data structure: no threads, clocks or I/O. The same bounded
//! slab as the reader's cache ([`crate::cache`]): once warm, recording a
//! sample copies its bytes into a reused buffer.
//!
//! ```
//! use spindle_dds::history::WriterHistory;
//! use spindle_dds::qos::WriterQos;
//! use spindle_dds::types::{InstanceHandle, SampleKind, SampleMeta, WriterId};
//!
//! let mut history = WriterHistory::new(&WriterQos::default().transient_local().keep_last(2));
//! for seq in 1..=5u64 {
//!     let meta = SampleMeta {
//!         writer: WriterId(1),
//!         seq,
//!         source_timestamp_ns: seq,
//!         instance: InstanceHandle(seq % 2),
//!         kind: SampleKind::Data,
//!         strength: 0,
//!     };
//!     history.record(&meta, &[seq as u8]).unwrap();
//! }
//! let mut replayed = Vec::new();
//! history.replay(|meta, _| replayed.push(meta.seq));
//! assert_eq!(replayed, vec![2, 3, 4, 5]); // the last 2 of each instance, in seq order
//! ```

use crate::cache::{Chain, SampleStore, NIL};
use crate::qos::{History, WriterQos};
use crate::types::{IdHashMap, InstanceHandle, SampleKind, SampleMeta};

/// The limit a sample would have exceeded; nothing was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistoryFull {
    /// `max_samples` over all instances.
    #[error("writer history full: max_samples = {limit} samples held")]
    Samples {
        /// The limit.
        limit: u32,
    },
    /// `max_instances`.
    #[error("writer history full: max_instances = {limit} instances held")]
    Instances {
        /// The limit.
        limit: u32,
    },
    /// Keep-all at `max_samples_per_instance`.
    #[error("writer history full: instance {instance:?} holds max_samples_per_instance = {limit} samples (keep-all)")]
    SamplesPerInstance {
        /// The instance.
        instance: InstanceHandle,
        /// The limit.
        limit: u32,
    },
    /// A sample larger than the writer's `max_sample_bytes`.
    #[error("sample of {bytes} bytes exceeds the writer's max_sample_bytes = {limit}")]
    SampleBytes {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: u32,
    },
}

/// A writer's transient-local history (see the module docs).
#[derive(Debug)]
pub struct WriterHistory {
    /// Samples kept per instance.
    depth: u32,
    /// Keep-last: the oldest sample of a full instance is replaced;
    /// keep-all: a full instance refuses.
    keep_last: bool,
    max_instances: u32,
    max_samples: u32,
    max_sample_bytes: u32,
    store: SampleStore<SampleMeta>,
    instances: IdHashMap<InstanceHandle, Chain>,
    /// The last seq recorded (seqs must rise).
    last_seq: u64,
}

impl WriterHistory {
    /// An empty history for a writer with this QoS (which must validate).
    pub fn new(qos: &WriterQos) -> Self {
        if let Err(e) = qos.validate() {
            panic!("WriterHistory::new with an invalid QoS: {e}");
        }
        let limits = qos.resource_limits;
        let (depth, keep_last) = match qos.history {
            History::KeepLast(n) => (n, true),
            History::KeepAll => (limits.max_samples_per_instance, false),
        };
        WriterHistory {
            depth,
            keep_last,
            max_instances: limits.max_instances,
            max_samples: limits.max_samples,
            max_sample_bytes: qos.max_sample_bytes,
            store: SampleStore::new(limits.max_samples),
            instances: IdHashMap::default(),
            last_seq: 0,
        }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    /// Instances held.
    pub fn instances(&self) -> usize {
        self.instances.len()
    }

    /// Records a sample the writer wrote (seqs rising). Data and dispose
    /// samples are kept (keep-last replaces the instance's oldest); an
    /// unregister drops the instance. On error nothing changed.
    pub fn record(&mut self, meta: &SampleMeta, payload: &[u8]) -> Result<(), HistoryFull> {
        assert!(
            meta.seq > self.last_seq,
            "seq {} recorded after {}",
            meta.seq,
            self.last_seq
        );
        if payload.len() > self.max_sample_bytes as usize {
            return Err(HistoryFull::SampleBytes {
                bytes: payload.len(),
                limit: self.max_sample_bytes,
            });
        }
        if meta.kind == SampleKind::Unregister {
            if let Some(mut chain) = self.instances.remove(&meta.instance) {
                while chain.len() > 0 {
                    let oldest = chain.first();
                    self.store.remove(&mut chain, oldest);
                }
            }
            self.last_seq = meta.seq;
            return Ok(());
        }
        let mut chain = match self.instances.get(&meta.instance) {
            Some(chain) => *chain,
            None if self.instances.len() as u32 >= self.max_instances => {
                return Err(HistoryFull::Instances {
                    limit: self.max_instances,
                })
            }
            None => Chain::EMPTY,
        };
        let replace = chain.len() >= self.depth;
        if replace && !self.keep_last {
            return Err(HistoryFull::SamplesPerInstance {
                instance: meta.instance,
                limit: self.depth,
            });
        }
        if !replace && self.store.is_full() {
            return Err(HistoryFull::Samples {
                limit: self.max_samples,
            });
        }
        if replace {
            let oldest = chain.first();
            self.store.remove(&mut chain, oldest);
        }
        let stored = self.store.push_back(&mut chain, *meta, payload);
        assert!(stored.is_some(), "room was checked");
        self.instances.insert(meta.instance, chain);
        self.last_seq = meta.seq;
        debug_assert!(chain.len() <= self.depth && self.store.len() <= self.max_samples as usize);
        Ok(())
    }

    /// Calls `f` for every sample held, in the order written (by seq).
    pub fn replay(&self, mut f: impl FnMut(&SampleMeta, &[u8])) {
        let mut idx = self.store.first();
        let mut last_seq = 0;
        while idx != NIL {
            let meta = self.store.meta(idx);
            debug_assert!(meta.seq > last_seq, "replay in seq order");
            last_seq = meta.seq;
            f(meta, self.store.payload(idx));
            idx = self.store.next(idx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::qos::ResourceLimits;
    use crate::types::WriterId;

    fn limits(max_samples: u32, max_instances: u32, max_samples_per_instance: u32) -> ResourceLimits {
        ResourceLimits {
            max_samples,
            max_instances,
            max_samples_per_instance,
        }
    }

    /// A writer recording into its history: seqs count up.
    struct Writer {
        history: WriterHistory,
        seq: u64,
    }

    impl Writer {
        fn new(qos: WriterQos) -> Writer {
            Writer {
                history: WriterHistory::new(&qos.transient_local()),
                seq: 0,
            }
        }

        fn send(&mut self, instance: u64, kind: SampleKind, byte: u8) -> Result<(), HistoryFull> {
            let meta = SampleMeta {
                writer: WriterId(1),
                seq: self.seq + 1,
                source_timestamp_ns: self.seq + 1,
                instance: InstanceHandle(instance),
                kind,
                strength: 0,
            };
            let result = self.history.record(&meta, &[byte]);
            if result.is_ok() {
                self.seq += 1;
            }
            result
        }

        fn write(&mut self, instance: u64, byte: u8) -> Result<(), HistoryFull> {
            self.send(instance, SampleKind::Data, byte)
        }

        /// (instance, kind, byte or none) in replay order.
        fn replayed(&self) -> Vec<(u64, SampleKind, Option<u8>)> {
            let mut out = Vec::new();
            self.history
                .replay(|m, b| out.push((m.instance.0, m.kind, b.first().copied())));
            out
        }
    }

    #[test]
    fn keep_last_replays_exactly_the_last_n_per_instance_in_write_order() {
        let mut w = Writer::new(WriterQos::default().keep_last(3));
        for i in 0..10u8 {
            w.write(u64::from(i % 2), i).unwrap();
        }
        w.write(7, 100).unwrap();
        use SampleKind::Data;
        assert_eq!(
            w.replayed(),
            vec![
                (0, Data, Some(4)),
                (1, Data, Some(5)),
                (0, Data, Some(6)),
                (1, Data, Some(7)),
                (0, Data, Some(8)),
                (1, Data, Some(9)),
                (7, Data, Some(100))
            ]
        );
        assert_eq!((w.history.len(), w.history.instances()), (7, 3));
    }

    #[test]
    fn a_dispose_is_kept_and_an_unregister_drops_the_instance() {
        let mut w = Writer::new(WriterQos::default().keep_last(2));
        w.write(1, 1).unwrap();
        w.write(1, 2).unwrap();
        w.write(2, 3).unwrap();
        w.send(1, SampleKind::Dispose, 0).unwrap();
        assert_eq!(
            w.replayed(),
            vec![
                (1, SampleKind::Data, Some(2)),
                (2, SampleKind::Data, Some(3)),
                (1, SampleKind::Dispose, Some(0))
            ]
        );
        w.send(2, SampleKind::Unregister, 0).unwrap();
        assert_eq!(
            w.replayed(),
            vec![(1, SampleKind::Data, Some(2)), (1, SampleKind::Dispose, Some(0))]
        );
        assert_eq!(w.history.instances(), 1);
        // Unregistering an unknown instance is harmless.
        w.send(9, SampleKind::Unregister, 0).unwrap();
        assert_eq!(w.history.len(), 2);
    }

    #[test]
    fn the_limits_refuse_and_change_nothing() {
        // Keep-all: per-instance limit.
        let mut w = Writer::new(WriterQos::default().keep_all().resource_limits(limits(3, 2, 2)));
        w.write(1, 1).unwrap();
        w.write(1, 2).unwrap();
        assert_eq!(
            w.write(1, 3),
            Err(HistoryFull::SamplesPerInstance {
                instance: InstanceHandle(1),
                limit: 2
            })
        );
        // Total.
        w.write(2, 4).unwrap();
        assert_eq!(w.write(2, 5), Err(HistoryFull::Samples { limit: 3 }));
        // Instances.
        let mut w = Writer::new(WriterQos::default().keep_last(1).resource_limits(limits(8, 2, 1)));
        w.write(1, 1).unwrap();
        w.write(2, 2).unwrap();
        assert_eq!(w.write(3, 3), Err(HistoryFull::Instances { limit: 2 }));
        w.write(2, 4).unwrap();
        assert_eq!(
            w.replayed(),
            vec![(1, SampleKind::Data, Some(1)), (2, SampleKind::Data, Some(4))]
        );
        // Sample size.
        let mut w = Writer::new(WriterQos::default().max_sample_bytes(4));
        let meta = SampleMeta {
            writer: WriterId(1),
            seq: 1,
            source_timestamp_ns: 1,
            instance: InstanceHandle(0),
            kind: SampleKind::Data,
            strength: 0,
        };
        assert_eq!(
            w.history.record(&meta, &[0; 5]),
            Err(HistoryFull::SampleBytes { bytes: 5, limit: 4 })
        );
        assert!(w.history.is_empty());
    }

    proptest! {
        #[test]
        fn replay_is_the_last_n_per_instance_of_a_reference_model(
            depth in 1..5u32,
            ops in proptest::collection::vec((0..6u64, 0..10u8), 1..200),
        ) {
            let mut w = Writer::new(WriterQos::default().keep_last(depth).resource_limits(limits(64, 8, 8)));
            // Reference: per instance, every (seq, kind) in order.
            let mut model: HashMap<u64, Vec<(u64, SampleKind)>> = HashMap::new();
            for (instance, what) in ops {
                let kind = match what {
                    0 => SampleKind::Dispose,
                    1 => SampleKind::Unregister,
                    _ => SampleKind::Data,
                };
                if w.send(instance, kind, what).is_err() {
                    continue;
                }
                if kind == SampleKind::Unregister {
                    model.remove(&instance);
                } else {
                    model.entry(instance).or_default().push((w.seq, kind));
                }
            }
            let mut expected: Vec<(u64, SampleKind)> = model
                .values()
                .flat_map(|v| v[v.len().saturating_sub(depth as usize)..].iter().copied())
                .collect();
            expected.sort_by_key(|(seq, _)| *seq);
            let mut got = Vec::new();
            w.history.replay(|m, _| got.push((m.seq, m.kind)));
            prop_assert_eq!(got, expected);
            prop_assert!(w.history.len() <= 64);
        }
    }
}
