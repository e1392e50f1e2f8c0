//! pprof (`perftools.profiles.Profile`) encoding.
//!
//! The messages are declared below with prost's derive (no protoc needed). They document the
//! wire format and decode profiles in tests and benchmarks; the encoder itself streams a
//! [`Profile`](crate::Profile) straight into bytes with prost's wire helpers, so that
//! serializing does not first build a second copy of the profile as message structs.
use std::io::Write as _;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

use crate::error::SerializeError;
use crate::profile::{Profile, StoredLabel, StoredValue};
use crate::sample::ValueType as InputValueType;
use crate::time::Timestamp;

/// What `serialize` returns: the raw protobuf or a gzip stream of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

/// gzip level used for [`Compression::Gzip`]. See the README's performance section for the
/// measurement behind it.
pub const GZIP_LEVEL: u32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<PprofValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<PprofSample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<PprofMapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<PprofLocation>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<PprofFunction>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<PprofValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofSample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<PprofLabel>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofLabel {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofMapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofLocation {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<PprofLine>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofLine {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofFunction {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Profile field numbers.
mod tag {
    pub const SAMPLE_TYPE: u32 = 1;
    pub const SAMPLE: u32 = 2;
    pub const MAPPING: u32 = 3;
    pub const LOCATION: u32 = 4;
    pub const FUNCTION: u32 = 5;
    pub const STRING_TABLE: u32 = 6;
    pub const TIME_NANOS: u32 = 9;
    pub const DURATION_NANOS: u32 = 10;
}

/// Length of an int64/uint64 field with tag < 16 (one key byte), or 0 when proto3 omits it.
#[inline]
fn varint_field_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + encoded_len_varint(v)
    }
}

#[inline]
fn put_varint_field(buf: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }
}

#[inline]
fn put_len_prefix(buf: &mut Vec<u8>, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// A packed repeated varint field of `n` bytes of payload.
#[inline]
fn packed_field_len(payload: usize) -> usize {
    if payload == 0 {
        0
    } else {
        1 + encoded_len_varint(payload as u64) + payload
    }
}

fn put_label(buf: &mut Vec<u8>, key: u32, value: StoredValue) {
    let (str_id, num) = match value {
        StoredValue::Str(s) => (u64::from(s), 0),
        StoredValue::Num(n) => (0, n as u64),
    };
    let len = varint_field_len(u64::from(key)) + varint_field_len(str_id) + varint_field_len(num);
    put_len_prefix(buf, 3, len);
    put_varint_field(buf, 1, u64::from(key));
    put_varint_field(buf, 2, str_id);
    put_varint_field(buf, 3, num);
}

/// Encodes `profile` as a pprof covering `profile.start()..finish`. Takes `&mut` only to
/// intern the strings the output needs besides the samples' own (value types, the
/// `"trace endpoint"` key).
pub fn encode(profile: &mut Profile, value_types: &[InputValueType], finish: Timestamp) -> Vec<u8> {
    let value_type_ids: Vec<(u64, u64)> = value_types
        .iter()
        .map(|vt| {
            (
                u64::from(profile.strings.intern(&vt.r#type)),
                u64::from(profile.strings.intern(&vt.unit)),
            )
        })
        .collect();
    let (endpoints, endpoint_key) = profile.resolve_endpoints();
    let profile = &*profile;

    // Each label set's `Sample.label` fields, encoded once and copied into every sample using it.
    let mut label_bytes = Vec::new();
    let mut label_spans = Vec::with_capacity(profile.label_set_total());
    for set in 0..profile.label_set_total() as u32 {
        let start = label_bytes.len();
        for &StoredLabel { key, value } in profile.label_set(set) {
            put_label(&mut label_bytes, key, value);
        }
        if let (Some(key), Some(Some(endpoint))) = (endpoint_key, endpoints.get(set as usize)) {
            put_label(&mut label_bytes, key, StoredValue::Str(*endpoint));
        }
        label_spans.push((start, label_bytes.len()));
    }

    let n = profile.num_values();
    let mut out = Vec::with_capacity(
        profile.samples.len() * 96 + profile.locations.len() * 16 + profile.functions.len() * 12,
    );

    for &(t, u) in &value_type_ids {
        put_len_prefix(&mut out, tag::SAMPLE_TYPE, varint_field_len(t) + varint_field_len(u));
        put_varint_field(&mut out, 1, t);
        put_varint_field(&mut out, 2, u);
    }

    for (i, &(stack, set)) in profile.samples.iter().enumerate() {
        let locations = profile.stack(stack);
        let values = &profile.values[i * n..(i + 1) * n];
        let (label_start, label_end) = label_spans[set as usize];
        let locations_len: usize =
            locations.iter().map(|&l| encoded_len_varint(u64::from(l) + 1)).sum();
        let values_len: usize = values.iter().map(|&v| encoded_len_varint(v as u64)).sum();
        let len = packed_field_len(locations_len)
            + packed_field_len(values_len)
            + (label_end - label_start);
        put_len_prefix(&mut out, tag::SAMPLE, len);
        if locations_len > 0 {
            put_len_prefix(&mut out, 1, locations_len);
            for &l in locations {
                encode_varint(u64::from(l) + 1, &mut out);
            }
        }
        if values_len > 0 {
            put_len_prefix(&mut out, 2, values_len);
            for &v in values {
                encode_varint(v as u64, &mut out);
            }
        }
        out.extend_from_slice(&label_bytes[label_start..label_end]);
    }

    if !profile.samples.is_empty() {
        // The one mapping every location points at: id 1, every other field zero.
        put_len_prefix(&mut out, tag::MAPPING, 2);
        put_varint_field(&mut out, 1, 1);
    }

    for (i, location) in profile.locations.iter().enumerate() {
        let function_id = u64::from(location.function) + 1;
        let line_len = varint_field_len(function_id) + varint_field_len(location.line as u64);
        let id = i as u64 + 1;
        let len = varint_field_len(id)
            + varint_field_len(1)
            + 1
            + encoded_len_varint(line_len as u64)
            + line_len;
        put_len_prefix(&mut out, tag::LOCATION, len);
        put_varint_field(&mut out, 1, id);
        put_varint_field(&mut out, 2, 1);
        put_len_prefix(&mut out, 4, line_len);
        put_varint_field(&mut out, 1, function_id);
        put_varint_field(&mut out, 2, location.line as u64);
    }

    for (i, function) in profile.functions.iter().enumerate() {
        let id = i as u64 + 1;
        let (name, filename) = (u64::from(function.name), u64::from(function.filename));
        let len = varint_field_len(id) + 2 * varint_field_len(name) + varint_field_len(filename);
        put_len_prefix(&mut out, tag::FUNCTION, len);
        put_varint_field(&mut out, 1, id);
        put_varint_field(&mut out, 2, name);
        put_varint_field(&mut out, 3, name);
        put_varint_field(&mut out, 4, filename);
    }

    for s in profile.strings.iter() {
        put_len_prefix(&mut out, tag::STRING_TABLE, s.len());
        out.extend_from_slice(s.as_bytes());
    }

    let start = profile.start();
    put_varint_field(&mut out, tag::TIME_NANOS, start.unix_nanos() as u64);
    put_varint_field(&mut out, tag::DURATION_NANOS, finish.nanos_since(start) as u64);
    out
}

/// gzip-compresses an encoded profile.
pub fn gzip(raw: &[u8]) -> Result<Vec<u8>, SerializeError> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4),
        flate2::Compression::new(GZIP_LEVEL),
    );
    encoder.write_all(raw).map_err(|e| SerializeError::Compression(e.to_string()))?;
    encoder.finish().map_err(|e| SerializeError::Compression(e.to_string()))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::sample::{Frame, Label, LabelValue, Sample, SpanId};

    fn vts() -> Vec<InputValueType> {
        vec![
            InputValueType::new("cpu-time", "nanoseconds"),
            InputValueType::new("wall-time", "nanoseconds"),
        ]
    }

    fn decode(bytes: &[u8]) -> PprofProfile {
        PprofProfile::decode(bytes).unwrap()
    }

    #[test]
    fn empty_profile_has_types_times_and_no_mapping() {
        let mut p = Profile::new(2, Timestamp { secs: 10, nanos: 5 });
        let d = decode(&encode(&mut p, &vts(), Timestamp { secs: 12, nanos: 7 }));
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.sample_type.len(), 2);
        assert_eq!(d.string_table[d.sample_type[1].r#type as usize], "wall-time");
        assert_eq!(d.string_table[d.sample_type[1].unit as usize], "nanoseconds");
        assert_eq!(d.time_nanos, 10_000_000_005);
        assert_eq!(d.duration_nanos, 2_000_000_002);
        assert!(d.sample.is_empty() && d.mapping.is_empty() && d.location.is_empty());
        assert!(d.function.is_empty());
    }

    #[test]
    fn round_trips_samples_locations_functions_labels_and_endpoints() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [
            Frame { function_name: "leaf", filename: "a.rb", line: 3 },
            Frame { function_name: "root", filename: "b.rb", line: -1 },
        ];
        let labels = [
            Label { key: "local root span id", value: LabelValue::Num(77) },
            Label { key: "thread name", value: LabelValue::Str("main") },
        ];
        p.add(
            &Sample { frames: &frames, omitted_frames: 0, values: &[5, -6], labels: &labels },
            10,
        )
        .unwrap();
        p.add(
            &Sample { frames: &frames[1..], omitted_frames: 0, values: &[1, 1], labels: &[] },
            10,
        )
        .unwrap();
        p.record_endpoint(SpanId::Str("77"), "GET /users");
        let d = decode(&encode(&mut p, &vts(), Timestamp { secs: 1, nanos: 0 }));
        let s = |i: i64| d.string_table[i as usize].as_str();

        // Every string once.
        let mut sorted = d.string_table.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), d.string_table.len());

        assert_eq!(d.mapping, vec![PprofMapping { id: 1, ..Default::default() }]);
        assert_eq!(d.location.len(), 2);
        for (i, loc) in d.location.iter().enumerate() {
            assert_eq!(loc.id, i as u64 + 1);
            assert_eq!(loc.mapping_id, 1);
            assert_eq!(loc.line.len(), 1);
        }
        for (i, f) in d.function.iter().enumerate() {
            assert_eq!(f.id, i as u64 + 1);
            assert_eq!(f.name, f.system_name);
        }
        let frame_of = |id: u64| {
            let loc = &d.location[id as usize - 1];
            let f = &d.function[loc.line[0].function_id as usize - 1];
            format!("{}@{}:{}", s(f.name), s(f.filename), loc.line[0].line)
        };
        assert_eq!(d.sample.len(), 2);
        let first = &d.sample[0];
        assert_eq!(
            first.location_id.iter().map(|&l| frame_of(l)).collect::<Vec<_>>(),
            ["leaf@a.rb:3", "root@b.rb:-1"]
        );
        assert_eq!(first.value, vec![5, -6]);
        let mut labels: Vec<_> =
            first.label.iter().map(|l| format!("{}={}/{}", s(l.key), s(l.str), l.num)).collect();
        labels.sort();
        assert_eq!(
            labels,
            ["local root span id=/77", "thread name=main/0", "trace endpoint=GET /users/0"]
        );
        assert!(d.sample[1].label.is_empty());
        assert_eq!(d.sample[1].value, vec![1, 1]);
    }

    #[test]
    fn gzip_is_the_same_bytes() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [Frame { function_name: "f", filename: "x.rb", line: 1 }];
        p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[1, 2], labels: &[] }, 10)
            .unwrap();
        let raw = encode(&mut p, &vts(), Timestamp::default());
        let gz = gzip(&raw).unwrap();
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut back).unwrap();
        assert_eq!(back, raw);
    }
}
