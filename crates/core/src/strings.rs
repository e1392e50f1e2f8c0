//! String interning: every distinct string is stored once, in one growing buffer, and named
//! by a dense id that is also its index in the pprof `string_table` (id 0 is `""`).
use hashbrown::HashTable;

use crate::hash::{bytes_eq, hash_str};

/// Index into a [`StringTable`]; also the pprof string table index.
pub type StringId = u32;

#[derive(Debug)]
pub struct StringTable {
    /// All strings back to back: one allocation for the whole table instead of one per string.
    bytes: String,
    /// `(start, end)` byte offsets into `bytes`, by id.
    spans: Vec<(usize, usize)>,
    index: HashTable<StringId>,
}

impl Default for StringTable {
    fn default() -> Self {
        let mut table = Self { bytes: String::new(), spans: Vec::new(), index: HashTable::new() };
        table.intern("");
        table
    }
}

impl StringTable {
    #[inline]
    pub fn get(&self, id: StringId) -> &str {
        let (start, end) = self.spans[id as usize];
        &self.bytes[start..end]
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// `(start, end)` of string `id` in [`StringTable::bytes`].
    #[inline]
    pub fn span(&self, id: StringId) -> (usize, usize) {
        self.spans[id as usize]
    }

    /// All strings back to back (see [`StringTable::span`]).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_bytes()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.spans.iter().map(|&(start, end)| &self.bytes[start..end])
    }

    /// The id of `s`, if it was interned.
    pub fn lookup(&self, s: &str) -> Option<StringId> {
        self.lookup_hashed(hash_str(s), s)
    }

    #[inline]
    fn lookup_hashed(&self, hash: u64, s: &str) -> Option<StringId> {
        let (bytes, spans) = (self.bytes.as_bytes(), &self.spans);
        self.index
            .find(hash, |&id| {
                let (start, end) = spans[id as usize];
                bytes_eq(&bytes[start..end], s.as_bytes())
            })
            .copied()
    }

    /// The id of `s`, adding it if it is new.
    #[inline]
    pub fn intern(&mut self, s: &str) -> StringId {
        let hash = hash_str(s);
        if let Some(id) = self.lookup_hashed(hash, s) {
            return id;
        }
        let id = self.spans.len() as StringId;
        let start = self.bytes.len();
        self.bytes.push_str(s);
        self.spans.push((start, self.bytes.len()));
        let (bytes, spans) = (&self.bytes, &self.spans);
        self.index.insert_unique(hash, id, |&id| {
            let (start, end) = spans[id as usize];
            hash_str(&bytes[start..end])
        });
        id
    }

    /// Back to only `""`, keeping the allocations for the next profile.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
        self.index.clear();
        self.intern("");
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.spans.capacity() * std::mem::size_of::<(usize, usize)>()
            + self.index.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_each_string_once_with_empty_string_first() {
        let mut t = StringTable::default();
        assert_eq!(t.get(0), "");
        let a = t.intern("alpha");
        let b = t.intern("beta");
        assert_eq!(t.intern("alpha"), a);
        assert_eq!(t.intern(""), 0);
        assert_ne!(a, b);
        assert_eq!(t.len(), 3);
        assert_eq!(t.iter().collect::<Vec<_>>(), vec!["", "alpha", "beta"]);
        assert_eq!(t.lookup("beta"), Some(b));
        assert_eq!(t.lookup("gamma"), None);
    }

    #[test]
    fn survives_growth_and_clear() {
        let mut t = StringTable::default();
        let ids: Vec<_> = (0..10_000).map(|i| t.intern(&format!("s{i}"))).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(t.get(*id), format!("s{i}"));
            assert_eq!(t.intern(&format!("s{i}")), *id);
        }
        t.clear();
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup("s1"), None);
        assert_eq!(t.intern("s1"), 1);
    }
}
