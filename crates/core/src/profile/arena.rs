//! Interned slices in one shared buffer: stacks (bytes) and label sets (label ids).
use hashbrown::HashTable;

/// Slices of a shared arena, interned: entry `id` is `items[ends[id - 1]..ends[id]]`.
#[derive(Debug)]
pub(super) struct Arena<T> {
    items: Vec<T>,
    ends: Vec<usize>,
    index: HashTable<u32>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Self { items: Vec::new(), ends: Vec::new(), index: HashTable::new() }
    }
}

impl<T: Copy + Eq> Arena<T> {
    #[inline]
    fn range(ends: &[usize], id: u32) -> std::ops::Range<usize> {
        let id = id as usize;
        let start = if id == 0 { 0 } else { ends[id - 1] };
        start..ends[id]
    }

    pub(super) fn get(&self, id: u32) -> &[T] {
        &self.items[Self::range(&self.ends, id)]
    }

    /// The id of `slice`, if it was interned.
    pub(super) fn find(&self, slice: &[T], hash: impl Fn(&[T]) -> u64) -> Option<u32> {
        let (items, ends) = (&self.items, &self.ends);
        self.index.find(hash(slice), |&id| items[Self::range(ends, id)] == *slice).copied()
    }

    pub(super) fn intern(&mut self, slice: &[T], hash: impl Fn(&[T]) -> u64) -> u32 {
        let h = hash(slice);
        let (items, ends) = (&self.items, &self.ends);
        if let Some(&id) = self.index.find(h, |&id| items[Self::range(ends, id)] == *slice) {
            return id;
        }
        let id = self.ends.len() as u32;
        self.items.extend_from_slice(slice);
        self.ends.push(self.items.len());
        let (items, ends) = (&self.items, &self.ends);
        self.index.insert_unique(h, id, |&id| hash(&items[Self::range(ends, id)]));
        id
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.ends.clear();
        self.index.clear();
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<T>()
            + self.ends.capacity() * std::mem::size_of::<usize>()
            + self.index.allocation_size()
    }
}
