//! How much memory a pprof takes once prost has decoded it, estimated before decoding by a walk
//! over its protobuf fields that allocates nothing.
//!
//! Decoding multiplies sizes: a 2-byte empty `Sample` field becomes a 72-byte struct, a
//! 1-byte packed location id an 8-byte `u64`, a 3-byte string a 24-byte `String` and its heap
//! block. So a pprof under [`ReadLimits::max_decompressed_bytes`](super::ReadLimits) can still
//! decode to many times its size (a gzip bomb of empty samples: 36 times); the reader charges
//! this estimate to its memory budget first and refuses the pprof before prost allocates
//! anything.
//!
//! The walk knows the fields of `profile.proto` that prost turns into heap data (repeated
//! messages and varints, strings) and nothing else. Where it cannot go on (a malformed field,
//! or a group, which prost skips but the walk does not parse), it counts the rest of the
//! message at the worst rate any field decodes at ([`WORST_PER_BYTE`]): the estimate is never
//! below what prost allocates, whatever follows.
use std::mem::size_of;

use crate::pprof::{
    PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofMapping, PprofProfile, PprofSample,
    PprofValueType,
};

/// Field numbers of `profile.proto` (the pprof format) that decode to heap data.
mod field {
    pub const SAMPLE_TYPE: u32 = 1;
    pub const SAMPLE: u32 = 2;
    pub const MAPPING: u32 = 3;
    pub const LOCATION: u32 = 4;
    pub const FUNCTION: u32 = 5;
    pub const STRING_TABLE: u32 = 6;
    pub const PERIOD_TYPE: u32 = 11;
    pub const COMMENT: u32 = 13;
    pub const SAMPLE_LOCATION_ID: u32 = 1;
    pub const SAMPLE_VALUE: u32 = 2;
    pub const SAMPLE_LABEL: u32 = 3;
    pub const LOCATION_LINE: u32 = 4;
}

/// A field's payload, as far as the estimate cares.
enum Payload<'a> {
    /// One varint (wire type 0).
    Varint,
    /// A length-delimited payload (wire type 2): a message, a string or packed varints.
    Bytes(&'a [u8]),
    /// Fixed 32 or 64 bits: nothing decodes to heap data from them here.
    Fixed,
}

/// The fields of one protobuf message, until its end or its first field the walk cannot
/// parse; `buf` is then what is left.
struct Fields<'a> {
    buf: &'a [u8],
}

/// The most bytes of memory one byte of protobuf can decode to here: an empty message field
/// is 2 bytes (key, length 0), and the largest message struct is the bound.
const WORST_PER_BYTE: u64 = {
    let sizes = [
        size_of::<PprofSample>(),
        size_of::<PprofLocation>(),
        size_of::<PprofFunction>(),
        size_of::<PprofMapping>(),
        size_of::<PprofLabel>(),
        size_of::<PprofLine>(),
        size_of::<PprofValueType>(),
        size_of::<String>(),
    ];
    let mut max = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > max {
            max = sizes[i];
        }
        i += 1;
    }
    // Rounded up: a 1-byte remainder still counts.
    max.div_ceil(2) as u64
};

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u32, Payload<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        // On a copy: `self.buf` moves only past a field parsed whole.
        let mut buf = self.buf;
        let key = varint(&mut buf)?;
        let number = u32::try_from(key >> 3).ok()?;
        let payload = match key & 7 {
            0 => {
                varint(&mut buf)?;
                Payload::Varint
            }
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                buf = buf.get(width..)?;
                Payload::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let bytes = buf.get(..len)?;
                buf = &buf[len..];
                Payload::Bytes(bytes)
            }
            // Groups (3, 4) and the undefined wire types.
            _ => return None,
        };
        self.buf = buf;
        Some((number, payload))
    }
}

/// Sum of `size` over the fields of `message`, plus the worst case for what the walk could
/// not parse.
fn sum_fields(message: &[u8], mut size: impl FnMut(u32, Payload<'_>) -> u64) -> u64 {
    let mut fields = Fields { buf: message };
    let mut total = 0u64;
    for (number, payload) in fields.by_ref() {
        total = total.saturating_add(size(number, payload));
    }
    total.saturating_add(WORST_PER_BYTE.saturating_mul(fields.buf.len() as u64))
}

/// Varints in a packed payload: one ends at each byte below 0x80.
fn packed_count(payload: &[u8]) -> u64 {
    payload.iter().filter(|&&b| b < 0x80).count() as u64
}

/// Bytes a repeated varint field takes per element once decoded (`u64` / `i64`).
const VARINT: u64 = 8;

fn repeated_varints(payload: &Payload<'_>) -> u64 {
    match payload {
        Payload::Varint => VARINT,
        Payload::Bytes(packed) => VARINT.saturating_mul(packed_count(packed)),
        Payload::Fixed => 0,
    }
}

fn sample_size(message: &[u8]) -> u64 {
    sum_fields(message, |number, payload| match (number, &payload) {
        (field::SAMPLE_LOCATION_ID | field::SAMPLE_VALUE, _) => repeated_varints(&payload),
        (field::SAMPLE_LABEL, Payload::Bytes(_)) => size_of::<PprofLabel>() as u64,
        _ => 0,
    })
}

fn location_size(message: &[u8]) -> u64 {
    sum_fields(message, |number, payload| match (number, payload) {
        (field::LOCATION_LINE, Payload::Bytes(_)) => size_of::<PprofLine>() as u64,
        _ => 0,
    })
}

/// Bytes of memory `raw` (a pprof's protobuf) takes once decoded into a [`PprofProfile`], not
/// counting the spare capacity of its `Vec`s.
pub(crate) fn decoded_size(raw: &[u8]) -> u64 {
    let size = |n: usize| n as u64;
    let fields = sum_fields(raw, |number, payload| match (number, payload) {
        (field::SAMPLE_TYPE | field::PERIOD_TYPE, Payload::Bytes(_)) => {
            size(size_of::<PprofValueType>())
        }
        (field::SAMPLE, Payload::Bytes(m)) => {
            size(size_of::<PprofSample>()).saturating_add(sample_size(m))
        }
        (field::MAPPING, Payload::Bytes(_)) => size(size_of::<PprofMapping>()),
        (field::LOCATION, Payload::Bytes(m)) => {
            size(size_of::<PprofLocation>()).saturating_add(location_size(m))
        }
        (field::FUNCTION, Payload::Bytes(_)) => size(size_of::<PprofFunction>()),
        (field::STRING_TABLE, Payload::Bytes(s)) => size(size_of::<String>() + s.len()),
        (field::COMMENT, payload) => repeated_varints(&payload),
        _ => 0,
    });
    size(size_of::<PprofProfile>()).saturating_add(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::PprofLabel;
    use prost::Message as _;

    #[test]
    fn counts_what_prost_allocates() {
        let p = PprofProfile {
            sample: vec![
                PprofSample {
                    location_id: vec![1, 300, u64::MAX],
                    value: vec![-1, 5],
                    label: vec![PprofLabel::default(); 2],
                };
                3
            ],
            location: vec![
                PprofLocation {
                    line: vec![PprofLine::default(); 4],
                    ..Default::default()
                };
                2
            ],
            function: vec![PprofFunction::default(); 5],
            mapping: vec![PprofMapping::default()],
            string_table: vec![String::new(), "abc".to_string()],
            sample_type: vec![PprofValueType::default()],
            comment: vec![1, 2],
            ..Default::default()
        };
        let expected = size_of::<PprofProfile>()
            + 3 * (size_of::<PprofSample>() + 5 * 8 + 2 * size_of::<PprofLabel>())
            + 2 * (size_of::<PprofLocation>() + 4 * size_of::<PprofLine>())
            + 5 * size_of::<PprofFunction>()
            + size_of::<PprofMapping>()
            + 2 * size_of::<String>()
            + 3
            + size_of::<PprofValueType>()
            + 2 * 8;
        assert_eq!(decoded_size(&p.encode_to_vec()), expected as u64);
    }

    #[test]
    fn empty_samples_are_the_worst_case_and_truncation_stops_the_walk() {
        // 1 MiB of empty Sample fields (tag 2, length 0).
        let bomb: Vec<u8> = [0x12, 0x00].repeat(512 * 1024);
        let per_byte = decoded_size(&bomb) / bomb.len() as u64;
        assert_eq!(per_byte, size_of::<PprofSample>() as u64 / 2);
        // What the walk cannot parse counts at the worst rate: a length past the end, a
        // group (which prost skips, so a bomb after it would decode).
        let base = size_of::<PprofProfile>() as u64;
        assert_eq!(decoded_size(&[0x12, 0x05, 0x00]), base + 3 * WORST_PER_BYTE);
        assert_eq!(decoded_size(&[0xff; 12]), base + 12 * WORST_PER_BYTE);
        let mut grouped = vec![0x7b, 0x7c]; // field 15, start group; end group
        grouped.extend_from_slice(&bomb);
        assert!(decoded_size(&grouped) >= decoded_size(&bomb));
    }
}
