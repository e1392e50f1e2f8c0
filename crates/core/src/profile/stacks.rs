//! Stacks, stored as the bytes pprof wants for `Sample.location_id`: the packed varints of
//! their location ids (+1, pprof ids are 1-based). Location ids of a medium profile take two
//! bytes rather than a `u32`'s four, so stacks, the bulk of a profile, take half the memory,
//! and encoding a sample copies its stack instead of encoding ~60 varints. Measured on the
//! medium workload (bench/RESULTS.md), together with label sets stored as label ids and the
//! sample index as a table of ids: serialize raw 74 -> 46 ms (min, same run, under load),
//! peak heap while adding 25.2 -> 13.0 MB.
use std::fmt::Write as _;

use super::Profile;
use crate::hash::hash_bytes;
use crate::sample::Frame;

/// Appends `v` as a protobuf varint.
#[inline]
pub(super) fn push_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Reads the varints of an encoded stack back (for callers that want location ids).
pub(super) fn decode_varints(mut bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    std::iter::from_fn(move || {
        let mut v = 0u64;
        for (i, &b) in bytes.iter().enumerate() {
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                bytes = &bytes[i + 1..];
                return Some(v);
            }
        }
        None
    })
}

impl Profile {
    /// The id of the stack of `kept` (leaf first) and, when the sample had `total` frames in
    /// all and `kept` is fewer, a `"N frames omitted"` placeholder frame at its root. Adds the
    /// stack and what it needs if they are new.
    #[inline]
    pub(super) fn intern_stack(&mut self, kept: &[Frame<'_>], total: usize) -> u32 {
        let mut stack = std::mem::take(&mut self.scratch_stack);
        stack.clear();
        for frame in kept {
            let location = self.intern_frame(frame.function_name, frame.filename, frame.line);
            push_varint(&mut stack, u64::from(location) + 1);
        }
        if kept.len() < total {
            let mut name = std::mem::take(&mut self.scratch_string);
            name.clear();
            // Writing to a String cannot fail.
            let _ = write!(name, "{} frames omitted", total - kept.len());
            let location = self.intern_frame("", &name, 0);
            push_varint(&mut stack, u64::from(location) + 1);
            self.scratch_string = name;
        }
        let stack_id = self.stacks.intern(&stack, hash_bytes);
        self.scratch_stack = stack;
        stack_id
    }

    /// Stack `id` as the packed varints of its location ids + 1: `Sample.location_id`'s bytes.
    pub(crate) fn stack_bytes(&self, id: u32) -> &[u8] {
        self.stacks.get(id)
    }
}
