//! Buffers registered in advance, with MPI/RT buffer iterators.
//!
//! A [`BufferPool`] owns `capacity` buffers of `buffer_bytes_max` bytes,
//! all allocated when it is created (before commit): inserting copies into
//! a free buffer, taking hands out the buffer the iterator policy picks.
//! Nothing allocates afterwards.
//!
//! - `Fifo`: oldest inserted first;
//! - `Lifo`: newest inserted first (freshest data for control loops);
//! - `Sorted`: smallest key first (ties: oldest first).

/// Which filled buffer an iterator hands out next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IteratorPolicy {
    Fifo,
    Lifo,
    Sorted,
}

impl IteratorPolicy {
    pub fn parse(s: &str) -> Result<IteratorPolicy, String> {
        match s {
            "fifo" => Ok(IteratorPolicy::Fifo),
            "lifo" => Ok(IteratorPolicy::Lifo),
            "sorted" => Ok(IteratorPolicy::Sorted),
            other => Err(format!(
                "unknown iterator policy '{other}': expected fifo, lifo or sorted"
            )),
        }
    }
}

/// Why an insert failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    #[error("all {capacity} registered buffers are full")]
    Full { capacity: usize },
    #[error("message of {len} bytes exceeds the registered buffer size {buffer_bytes_max}")]
    TooLong { len: usize, buffer_bytes_max: usize },
}

#[derive(Debug, Clone, Copy, Default)]
struct Meta {
    filled: bool,
    len: u32,
    key: u64,
    /// Insertion number: orders FIFO/LIFO and breaks sort ties.
    seq: u64,
}

/// A fixed set of registered buffers.
#[derive(Debug)]
pub struct BufferPool {
    policy: IteratorPolicy,
    buffer_bytes_max: usize,
    data: Box<[u8]>,
    meta: Box<[Meta]>,
    filled_count: usize,
    inserted_count: u64,
}

impl BufferPool {
    pub fn new(policy: IteratorPolicy, capacity: usize, buffer_bytes_max: usize) -> BufferPool {
        assert!(
            capacity > 0 && capacity <= 4_096,
            "buffer capacity {capacity} not in 1..=4096"
        );
        assert!(buffer_bytes_max > 0, "buffer size must be > 0");
        BufferPool {
            policy,
            buffer_bytes_max,
            data: vec![0u8; capacity * buffer_bytes_max].into_boxed_slice(),
            meta: vec![Meta::default(); capacity].into_boxed_slice(),
            filled_count: 0,
            inserted_count: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.meta.len()
    }
    pub fn len(&self) -> usize {
        self.filled_count
    }
    pub fn is_empty(&self) -> bool {
        self.filled_count == 0
    }
    pub fn buffer_bytes_max(&self) -> usize {
        self.buffer_bytes_max
    }
    pub fn policy(&self) -> IteratorPolicy {
        self.policy
    }

    /// Copy `bytes` into a free registered buffer, with a sort `key`.
    pub fn insert(&mut self, bytes: &[u8], key: u64) -> Result<(), BufferError> {
        if bytes.len() > self.buffer_bytes_max {
            return Err(BufferError::TooLong {
                len: bytes.len(),
                buffer_bytes_max: self.buffer_bytes_max,
            });
        }
        let Some(slot) = self.meta.iter().position(|m| !m.filled) else {
            return Err(BufferError::Full {
                capacity: self.capacity(),
            });
        };
        let start = slot * self.buffer_bytes_max;
        self.data[start..start + bytes.len()].copy_from_slice(bytes);
        self.meta[slot] = Meta {
            filled: true,
            len: bytes.len() as u32,
            key,
            seq: self.inserted_count,
        };
        self.inserted_count += 1;
        self.filled_count += 1;
        debug_assert!(self.filled_count <= self.capacity(), "filled_count_bounded");
        Ok(())
    }

    /// Fill a free buffer in place (`fill` writes and returns the length).
    pub fn insert_with(&mut self, key: u64, fill: impl FnOnce(&mut [u8]) -> usize) -> Result<usize, BufferError> {
        let Some(slot) = self.meta.iter().position(|m| !m.filled) else {
            return Err(BufferError::Full {
                capacity: self.capacity(),
            });
        };
        let start = slot * self.buffer_bytes_max;
        let len = fill(&mut self.data[start..start + self.buffer_bytes_max]);
        assert!(
            len <= self.buffer_bytes_max,
            "fill wrote {len} > {} bytes",
            self.buffer_bytes_max
        );
        self.meta[slot] = Meta {
            filled: true,
            len: len as u32,
            key,
            seq: self.inserted_count,
        };
        self.inserted_count += 1;
        self.filled_count += 1;
        Ok(len)
    }

    fn pick(&self) -> Option<usize> {
        let filled = self.meta.iter().enumerate().filter(|(_, m)| m.filled);
        match self.policy {
            IteratorPolicy::Fifo => filled.min_by_key(|(_, m)| m.seq),
            IteratorPolicy::Lifo => filled.max_by_key(|(_, m)| m.seq),
            IteratorPolicy::Sorted => filled.min_by_key(|(_, m)| (m.key, m.seq)),
        }
        .map(|(i, _)| i)
    }

    /// Hand the next buffer (by policy) to `use_it`, then free it.
    pub fn take_with<R>(&mut self, use_it: impl FnOnce(&[u8], u64) -> R) -> Option<R> {
        let slot = self.pick()?;
        let m = self.meta[slot];
        debug_assert!(m.filled, "picked_buffer_is_filled");
        let start = slot * self.buffer_bytes_max;
        let r = use_it(&self.data[start..start + m.len as usize], m.key);
        self.meta[slot].filled = false;
        self.filled_count -= 1;
        Some(r)
    }

    /// Copy the next buffer into `out`; returns (length, key).
    pub fn take_into(&mut self, out: &mut [u8]) -> Option<(usize, u64)> {
        self.take_with(|bytes, key| {
            let n = bytes.len().min(out.len());
            out[..n].copy_from_slice(&bytes[..n]);
            (n, key)
        })
    }

    /// Free every buffer.
    pub fn clear(&mut self) {
        self.meta.iter_mut().for_each(|m| m.filled = false);
        self.filled_count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn drain(pool: &mut BufferPool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut b = [0u8; 4];
        while let Some((n, _)) = pool.take_into(&mut b) {
            out.push(b[..n][0]);
        }
        out
    }

    #[test]
    fn policies_pick_oldest_newest_and_smallest() {
        for (policy, expected) in [
            (IteratorPolicy::Fifo, vec![1, 2, 3]),
            (IteratorPolicy::Lifo, vec![3, 2, 1]),
            (IteratorPolicy::Sorted, vec![2, 3, 1]),
        ] {
            let mut pool = BufferPool::new(policy, 3, 4);
            pool.insert(&[1], 30).unwrap();
            pool.insert(&[2], 10).unwrap();
            pool.insert(&[3], 20).unwrap();
            assert_eq!(drain(&mut pool), expected, "{policy:?}");
        }
    }

    #[test]
    fn full_and_too_long_are_errors_naming_the_limit() {
        let mut pool = BufferPool::new(IteratorPolicy::Fifo, 1, 2);
        assert_eq!(
            pool.insert(&[1, 2, 3], 0),
            Err(BufferError::TooLong {
                len: 3,
                buffer_bytes_max: 2
            })
        );
        pool.insert(&[1], 0).unwrap();
        assert_eq!(pool.insert(&[1], 0), Err(BufferError::Full { capacity: 1 }));
        assert!(pool.take_with(|b, _| b.to_vec()).is_some());
        assert!(pool.is_empty());
    }

    proptest! {
        /// A pool behaves like a model multiset ordered by the policy.
        #[test]
        fn pool_matches_model(ops in proptest::collection::vec((any::<bool>(), 0u64..5), 1..200), p in 0usize..3) {
            let policy = [IteratorPolicy::Fifo, IteratorPolicy::Lifo, IteratorPolicy::Sorted][p];
            let mut pool = BufferPool::new(policy, 8, 8);
            let mut model: Vec<(u64, u64)> = Vec::new(); // (key, seq)
            let mut seq = 0u64;
            for (insert, key) in ops {
                if insert {
                    let r = pool.insert(&seq.to_le_bytes(), key);
                    if model.len() < 8 { prop_assert!(r.is_ok()); model.push((key, seq)); seq += 1; } else { prop_assert!(r.is_err()); }
                } else {
                    let got = pool.take_with(|b, _| u64::from_le_bytes(b.try_into().unwrap()));
                    let want = match policy {
                        IteratorPolicy::Fifo => model.iter().enumerate().min_by_key(|(_, m)| m.1),
                        IteratorPolicy::Lifo => model.iter().enumerate().max_by_key(|(_, m)| m.1),
                        IteratorPolicy::Sorted => model.iter().enumerate().min_by_key(|(_, m)| (m.0, m.1)),
                    }.map(|(i, m)| (i, m.1));
                    prop_assert_eq!(got, want.map(|w| w.1));
                    if let Some((i, _)) = want { model.remove(i); }
                }
                prop_assert_eq!(pool.len(), model.len());
            }
        }
    }
}
