//! The log: segments, positions and where each record goes (sans-IO).
//!
//! A master's log is one byte stream per epoch, addressed by monotonic
//! *log positions* (bytes since the epoch began). It is cut into segments
//! of `segment_bytes`; segment `k` covers positions `k·S .. (k+1)·S`. A
//! record never crosses a segment's end: when the next record does not fit
//! in what is left of the open segment, the master writes a pad record
//! (when at least a header fits) and continues at the next segment.
//!
//! In memory a backup's log is a ring of `segments_max` segments (its
//! *area*): segment `k` lives at ring slot `k % segments_max`. A segment is
//! *closed* once the head has moved to or past its end; the backup then
//! writes it to disk (fsync) and reports how many segments are durable.
//! The master writes into segment `k` only while
//! `k < flushed_segments + segments_max` for every backup (flow control):
//! memory stays bounded and nothing unflushed is overwritten.
//!
//! ```text
//!   log positions  0        S        2S       3S       4S       5S
//!                  ├─ seg 0 ─┼─ seg 1 ─┼─ seg 2 ─┼─ seg 3 ─┼─ seg 4 ─┤
//!   area (4 slots) [ slot 0 ][ slot 1 ][ slot 2 ][ slot 3 ]   seg 4 → slot 0
//!                   flushed ──────────┘          head ─┘      (only after seg 0 is on disk)
//! ```

use crate::record::{encoded_len, HEADER_BYTES, KEY_BYTES_MAX, RECORD_ALIGN, VALUE_BYTES_LIMIT};

/// The shape of a log and its in-memory ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogGeometry {
    /// Bytes per segment (a multiple of 64).
    pub segment_bytes: usize,
    /// Segments in a backup's in-memory ring (its area).
    pub segments_max: usize,
}

impl LogGeometry {
    /// Check the geometry against the largest value it must hold.
    pub fn validate(&self, value_bytes_max: usize) -> Result<(), String> {
        if self.segment_bytes == 0 || !self.segment_bytes.is_multiple_of(64) {
            return Err(format!(
                "segment_bytes {} must be a positive multiple of 64",
                self.segment_bytes
            ));
        }
        if self.segments_max < 2 {
            return Err(format!("segments {} must be at least 2", self.segments_max));
        }
        if value_bytes_max > VALUE_BYTES_LIMIT {
            return Err(format!(
                "value_bytes_max {value_bytes_max} is above the limit {VALUE_BYTES_LIMIT}"
            ));
        }
        let largest = encoded_len(KEY_BYTES_MAX, value_bytes_max);
        if largest > self.segment_bytes {
            return Err(format!(
                "segment_bytes {} cannot hold the largest record ({largest} bytes: a {KEY_BYTES_MAX}-byte key and a {value_bytes_max}-byte value)",
                self.segment_bytes
            ));
        }
        Ok(())
    }

    /// Bytes of one area (the ring).
    pub fn area_bytes(&self) -> usize {
        self.segment_bytes * self.segments_max
    }

    /// The segment holding `position`.
    pub fn segment_of(&self, position: u64) -> u64 {
        position / self.segment_bytes as u64
    }

    /// Byte offset of `position` inside an area.
    pub fn area_offset(&self, position: u64) -> usize {
        let slot = (self.segment_of(position) % self.segments_max as u64) as usize;
        slot * self.segment_bytes + (position % self.segment_bytes as u64) as usize
    }

    /// Bytes from `position` to the end of its segment.
    pub fn segment_remaining(&self, position: u64) -> usize {
        self.segment_bytes - (position % self.segment_bytes as u64) as usize
    }

    /// Segments closed once the head is at `head`.
    pub fn closed_segments(&self, head: u64) -> u64 {
        head / self.segment_bytes as u64
    }

    /// Where the next record of `record_len` bytes goes when the head is
    /// at `head`.
    pub fn place(&self, head: u64, record_len: usize) -> Placement {
        assert!(head.is_multiple_of(RECORD_ALIGN as u64), "head {head} not aligned");
        assert!(record_len <= self.segment_bytes, "record of {record_len} B > segment");
        let remaining = self.segment_remaining(head);
        if record_len <= remaining {
            return Placement {
                pad_at: None,
                record_at: head,
                new_head: head + record_len as u64,
            };
        }
        let next = head + remaining as u64;
        Placement {
            // Fewer than a header's bytes left: readers skip them by rule.
            pad_at: (remaining >= HEADER_BYTES).then_some(head),
            record_at: next,
            new_head: next + record_len as u64,
        }
    }

    /// Whether the master may write up to `end` (exclusive) given that a
    /// backup has `flushed_segments` segments durable (flow control).
    pub fn writable(&self, end: u64, flushed_segments: u64) -> bool {
        if end == 0 {
            return true;
        }
        let last_segment = self.segment_of(end - 1);
        last_segment < flushed_segments + self.segments_max as u64
    }
}

/// Where one append goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// A pad record first, at this position (end of the open segment).
    pub pad_at: Option<u64>,
    /// The record's position.
    pub record_at: u64,
    /// The head after the append.
    pub new_head: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: LogGeometry = LogGeometry {
        segment_bytes: 1024,
        segments_max: 4,
    };

    #[test]
    fn records_never_cross_a_segment() {
        let p = G.place(1000, 64);
        assert_eq!(
            p,
            Placement {
                pad_at: None,
                record_at: 1024,
                new_head: 1088
            }
        );
        let p = G.place(960, 128);
        assert_eq!(
            p,
            Placement {
                pad_at: Some(960),
                record_at: 1024,
                new_head: 1152
            }
        );
        let p = G.place(0, 1024);
        assert_eq!(p.new_head, 1024);
        assert_eq!(G.closed_segments(p.new_head), 1);
    }

    #[test]
    fn flow_control_bounds_the_ring() {
        assert!(G.writable(4 * 1024, 0));
        assert!(!G.writable(4 * 1024 + 8, 0));
        assert!(G.writable(4 * 1024 + 8, 1));
        assert_eq!(G.area_offset(4 * 1024 + 8), 8);
    }

    #[test]
    fn geometry_rejects_segments_too_small_for_the_largest_value() {
        assert!(G.validate(100).is_err());
        let g = LogGeometry {
            segment_bytes: 8192,
            segments_max: 4,
        };
        assert!(g.validate(100).is_ok());
        assert!(g.validate(8192).is_err());
    }
}
