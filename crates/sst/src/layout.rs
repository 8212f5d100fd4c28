//! Row layouts: typed columns at fixed offsets, every scalar a `u64` (fixed
//! width, 8-aligned), every column group starting where the builder says,
//! the whole row a multiple of 64 bytes. The layout is data, so one binary
//! can run any group shape; it is fingerprinted (`tag`) so that members
//! with different shapes refuse to share a table, and it draws its own
//! diagram for the docs and for `spindle stat`.

use spindle_fabric::CACHE_LINE_BYTES;

/// A `u64` cell.
#[derive(Clone, Copy, Debug)]
pub struct U64Column {
    offset: usize,
}

impl U64Column {
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// `len` consecutive `u64` cells (one per sender, say).
#[derive(Clone, Copy, Debug)]
pub struct U64VectorColumn {
    offset: usize,
    len: usize,
}

impl U64VectorColumn {
    pub fn offset(&self, index: usize) -> usize {
        assert!(index < self.len, "vector index {index} >= {}", self.len);
        self.offset + index * 8
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Byte range of the whole vector (for one push).
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len * 8
    }
}

/// A byte area (a ring of slots, say), cache-line aligned.
#[derive(Clone, Copy, Debug)]
pub struct BytesColumn {
    offset: usize,
    len: usize,
}

impl BytesColumn {
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[derive(Clone, Debug)]
struct Field {
    name: String,
    offset: usize,
    len: usize,
    kind: &'static str,
}

/// Declares columns in order; see the module docs.
pub struct LayoutBuilder {
    name: String,
    cursor: usize,
    fields: Vec<Field>,
}

impl LayoutBuilder {
    pub fn new(name: &str) -> LayoutBuilder {
        LayoutBuilder {
            name: name.to_string(),
            cursor: 0,
            fields: Vec::new(),
        }
    }

    /// Start the next column on a fresh cache line (so that cells written
    /// at different rates, or read by different peers, do not share one).
    pub fn cache_line_break(&mut self) -> &mut Self {
        self.cursor = self.cursor.next_multiple_of(CACHE_LINE_BYTES);
        self
    }

    pub fn u64(&mut self, name: &str) -> U64Column {
        let offset = self.place(name, 8, 8, "u64");
        U64Column { offset }
    }

    pub fn u64_vector(&mut self, name: &str, len: usize) -> U64VectorColumn {
        assert!(len > 0, "vector column {name} needs at least one cell");
        let offset = self.place(name, len * 8, 8, "[u64]");
        U64VectorColumn { offset, len }
    }

    pub fn bytes(&mut self, name: &str, len: usize) -> BytesColumn {
        self.cache_line_break();
        let offset = self.place(name, len, CACHE_LINE_BYTES, "bytes");
        BytesColumn { offset, len }
    }

    fn place(&mut self, name: &str, len: usize, align: usize, kind: &'static str) -> usize {
        let offset = self.cursor.next_multiple_of(align);
        self.cursor = offset.checked_add(len).expect("row layout overflows usize");
        self.fields.push(Field {
            name: name.to_string(),
            offset,
            len,
            kind,
        });
        offset
    }

    pub fn build(&self) -> RowLayout {
        let row_len_bytes = self.cursor.next_multiple_of(CACHE_LINE_BYTES).max(CACHE_LINE_BYTES);
        // FNV-1a over names, offsets and lengths: equal layouts, equal tags.
        let mut tag: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |bytes: &[u8]| {
            for b in bytes {
                tag ^= *b as u64;
                tag = tag.wrapping_mul(0x0100_0000_01b3);
            }
        };
        mix(self.name.as_bytes());
        for f in &self.fields {
            mix(f.name.as_bytes());
            mix(&(f.offset as u64).to_le_bytes());
            mix(&(f.len as u64).to_le_bytes());
        }
        mix(&(row_len_bytes as u64).to_le_bytes());
        RowLayout {
            name: self.name.clone(),
            row_len_bytes,
            fields: self.fields.clone(),
            tag,
        }
    }
}

/// A finished layout.
#[derive(Clone, Debug)]
pub struct RowLayout {
    name: String,
    row_len_bytes: usize,
    fields: Vec<Field>,
    tag: u64,
}

impl RowLayout {
    pub fn row_len_bytes(&self) -> usize {
        self.row_len_bytes
    }
    /// Fingerprint of names, offsets and lengths.
    pub fn tag(&self) -> u64 {
        self.tag
    }
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An ASCII diagram: one line per column, with offset and size.
    pub fn diagram(&self) -> String {
        let mut out = format!(
            "row layout '{}' ({} bytes, tag {:#018x})\n",
            self.name, self.row_len_bytes, self.tag
        );
        for f in &self.fields {
            let line = f.offset / CACHE_LINE_BYTES;
            out.push_str(&format!(
                "  +{:<8} line {:<6} {:<24} {:<6} {} B\n",
                f.offset, line, f.name, f.kind, f.len
            ));
        }
        out
    }

    /// One-line summary (stored in the shm header).
    pub fn summary(&self) -> String {
        format!("{} row_len_bytes={} tag={:#x}", self.name, self.row_len_bytes, self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_aligned_and_disjoint() {
        let mut b = LayoutBuilder::new("t");
        let a = b.u64("a");
        b.cache_line_break();
        let v = b.u64_vector("v", 3);
        let bytes = b.bytes("ring", 100);
        let l = b.build();
        assert_eq!(a.offset(), 0);
        assert_eq!(v.offset(0), 64);
        assert_eq!(v.offset(2), 80);
        assert_eq!(bytes.offset(), 128);
        assert_eq!(l.row_len_bytes(), 256);
        assert!(l.diagram().contains("ring"));
    }

    #[test]
    fn tag_tracks_shape() {
        let build = |n| {
            let mut b = LayoutBuilder::new("t");
            b.u64_vector("v", n);
            b.build().tag()
        };
        assert_eq!(build(2), build(2));
        assert_ne!(build(2), build(3));
    }
}
