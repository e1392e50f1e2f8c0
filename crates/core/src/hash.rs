//! Hashing helpers shared by the interning tables.
//!
//! The tables are `hashbrown::HashTable`s of dense ids: the keys live once, in the profile's
//! own vectors, and the hash is recomputed from them when a table grows.
use std::hash::Hasher;

use rustc_hash::FxHasher;

/// FxHash of a byte string, length included so that ("ab", "c") and ("a", "bc") differ.
#[inline]
pub(crate) fn hash_bytes(h: &mut FxHasher, bytes: &[u8]) {
    h.write_usize(bytes.len());
    h.write(bytes);
}

#[inline]
pub(crate) fn hash_str(s: &str) -> u64 {
    let mut h = FxHasher::default();
    hash_bytes(&mut h, s.as_bytes());
    h.finish()
}

#[inline]
pub(crate) fn hash_u32s(ids: &[u32]) -> u64 {
    let mut h = FxHasher::default();
    h.write_usize(ids.len());
    for &id in ids {
        h.write_u32(id);
    }
    h.finish()
}
