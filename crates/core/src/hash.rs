//! Hashing and comparison helpers for the interning tables, tuned for the add path.
//!
//! The tables are `hashbrown::HashTable`s of dense ids: the keys live once, in the profile's
//! own vectors, and the hash is recomputed from them when a table grows.
//!
//! Byte strings are hashed a word at a time with FxHash's multiply step (the last word
//! overlapping the previous one rather than a byte-by-byte tail), with the function name and
//! the filename of a frame in two independent chains so that their multiplications overlap.
//! Measured with callgrind on the medium workload (61 frames per sample), rustc-hash's
//! `write` of the two strings cost 78 instructions per frame and the byte-wise tails of a
//! chunked comparison ~150; these helpers take a fraction of that.
use std::hash::Hasher;

use rustc_hash::FxHasher;

/// rustc-hash 2's multiplier.
const K: u64 = 0xf135_7aea_2e62_a9c5;

#[inline(always)]
fn mix(h: u64, word: u64) -> u64 {
    h.wrapping_add(word).wrapping_mul(K)
}

/// The final step: the multiply leaves its best bits at the top, hashbrown takes its bucket
/// index from the bottom (as rustc-hash's `finish`).
#[inline(always)]
fn finish(h: u64) -> u64 {
    h.rotate_left(26)
}

/// The last 8 bytes of `b` (which has at least 8) as a word.
#[inline(always)]
fn last8(b: &[u8]) -> u64 {
    b.last_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w))
}

/// For 4..=8 bytes: the first 4 and the last 4 (overlapping) as one word.
#[inline(always)]
fn first_last4(b: &[u8]) -> u64 {
    let first = b.first_chunk::<4>().map_or(0, |w| u32::from_le_bytes(*w));
    let last = b.last_chunk::<4>().map_or(0, |w| u32::from_le_bytes(*w));
    u64::from(first) | (u64::from(last) << 32)
}

/// Mixes `bytes` (and their length, so that ("ab", "c") and ("a", "bc") differ) into `h`.
#[inline(always)]
fn mix_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let n = bytes.len();
    h = mix(h, n as u64);
    if n >= 8 {
        let (words, tail) = bytes.as_chunks::<8>();
        for w in words {
            h = mix(h, u64::from_le_bytes(*w));
        }
        if !tail.is_empty() {
            h = mix(h, last8(bytes));
        }
        h
    } else if n >= 4 {
        mix(h, first_last4(bytes))
    } else if n > 0 {
        let word =
            u64::from(bytes[0]) | (u64::from(bytes[n / 2]) << 8) | (u64::from(bytes[n - 1]) << 16);
        mix(h, word)
    } else {
        h
    }
}

#[inline]
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    finish(mix_bytes(0, bytes))
}

#[inline]
pub(crate) fn hash_str(s: &str) -> u64 {
    hash_bytes(s.as_bytes())
}

/// The hash of a frame: name and filename in two independent chains, then the line.
#[inline]
pub(crate) fn hash_frame(name: &[u8], filename: &[u8], line: i64) -> u64 {
    let a = mix_bytes(0, name);
    let b = mix_bytes(0x9e37_79b9_7f4a_7c15, filename);
    finish(mix(mix(a, b), line as u64))
}

/// Hash of a slice of ids, two ids per word in two independent chains: a stack is ~60 ids and
/// this runs once per sample.
#[inline]
pub(crate) fn hash_u32s(ids: &[u32]) -> u64 {
    let (mut a, mut b) = (ids.len() as u64, 0x9e37_79b9_7f4a_7c15);
    let mut quads = ids.chunks_exact(4);
    for q in &mut quads {
        a = mix(a, u64::from(q[0]) | (u64::from(q[1]) << 32));
        b = mix(b, u64::from(q[2]) | (u64::from(q[3]) << 32));
    }
    for &id in quads.remainder() {
        a = mix(a, u64::from(id));
    }
    finish(mix(a, b))
}

/// FxHash of anything `Hash` (label sets, function keys): not on the per-frame path.
#[inline]
pub(crate) fn fx_hash<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    let mut h = FxHasher::default();
    value.hash(&mut h);
    h.finish()
}

/// `a == b` without a call to `memcmp`: frame strings are short (tens of bytes) and compared
/// twice per frame on the hot path, where the call's fixed cost dominated (measured with perf:
/// memcmp was 16% of the medium workload's add time). Words at a time, the last one
/// overlapping the previous.
#[inline(always)]
pub(crate) fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let (wa, _) = a.as_chunks::<8>();
        let (wb, _) = b.as_chunks::<8>();
        for i in 0..wa.len().min(wb.len()) {
            if u64::from_ne_bytes(wa[i]) != u64::from_ne_bytes(wb[i]) {
                return false;
            }
        }
        last8(a) == last8(b)
    } else if n >= 4 {
        first_last4(a) == first_last4(b)
    } else {
        a == b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: [&[u8]; 14] = [
        b"",
        b"a",
        b"ab",
        b"abc",
        b"abcd",
        b"abce",
        b"abcdefg",
        b"abcdefh",
        b"abcdefgh",
        b"abcdefgi",
        b"abcdefghij",
        b"abcdefghik",
        b"bbcdefghij",
        b"abcdefghijklmnopqrstuvwxyz0123456789",
    ];

    #[test]
    fn bytes_eq_agrees_with_slice_eq() {
        for a in WORDS {
            for b in WORDS {
                assert_eq!(bytes_eq(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn distinct_short_strings_hash_differently() {
        let mut hashes: Vec<u64> = WORDS.iter().map(|w| hash_bytes(w)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), WORDS.len());
        // The split between name and filename matters.
        assert_ne!(hash_frame(b"ab", b"c", 1), hash_frame(b"a", b"bc", 1));
        assert_ne!(hash_frame(b"a", b"b", 1), hash_frame(b"a", b"b", 2));
        assert_ne!(hash_u32s(&[1, 2, 3, 4, 5]), hash_u32s(&[1, 2, 3, 5, 4]));
        assert_ne!(hash_u32s(&[1, 2]), hash_u32s(&[1, 2, 0]));
    }
}
