//! pprof (`perftools.profiles.Profile`) encoding.
//!
//! The messages are declared below with prost's derive (no protoc needed). They document the
//! wire format and decode profiles in tests and benchmarks; the encoder itself streams a
//! [`Profile`](crate::Profile) straight into bytes with prost's wire helpers, so that
//! serializing does not first build a second copy of the profile as message structs.
use std::io::Write;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

use crate::error::SerializeError;
use crate::profile::{Function, Location, Profile, StoredLabel, StoredValue};
use crate::sample::ValueType as InputValueType;
use crate::time::Timestamp;

/// What `serialize` returns: the raw protobuf or a gzip stream of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

/// gzip level used for [`Compression::Gzip`], with flate2's zlib-rs backend.
///
/// Measured 2026-11 on the medium workload's 18.9 MB raw pprof (`bench/run core medium --only
/// gzip-levels`, best of 3, fastest of 4 runs, 2-vCPU machine under load): level 1 takes 128 ms
/// for 52.0% of the size, level 2 298 ms for 46.2%, level 6 442 ms for 42.6%, level 9 571 ms
/// for 42.1%. Only level 1 keeps encode + compress within the 250 ms budget: pprof's location
/// ids are near-random varints and compress little better at higher levels. miniz_oxide (the
/// other pure-Rust backend) is as fast at level 1 (139 ms, 51.2%) but 1.5-3x slower at every
/// higher level. Details: bench/RESULTS.md.
pub const GZIP_LEVEL: u32 = 1;

/// From this size up, output buffers get an mmapped capacity, see [`output_capacity`].
pub const LARGE_OUTPUT: usize = 4 * 1024 * 1024;

/// Capacity to allocate for an output buffer of `len` bytes: `len` itself, or, from
/// [`LARGE_OUTPUT`] (4 MiB) up, at least 32 MiB and a page.
///
/// glibc malloc serves blocks from 128 KiB up with `mmap` and unmaps them when freed, but the
/// first time it frees such a block smaller than 32 MiB it raises its mmap threshold to that
/// block's size (and its trim threshold to twice that). From then on every pprof buffer and the
/// Ruby String holding it come from the heap, and up to twice their size of freed memory stays
/// resident after each window: measured on 1,000 windows of the medium workload (18 MB each),
/// RSS settled 36 MiB (+18%) above its level after window 10. A block of 32 MiB or more is
/// always mmapped and never moves the threshold, so it is returned to the kernel as soon as it
/// is freed. The capacity past `len` is address space only: pages never written are never
/// resident. Below 4 MiB the memory glibc may keep (twice the output at most) is not worth
/// it: Ruby counts a String's capacity, not its length, towards its next GC.
pub fn output_capacity(len: usize) -> usize {
    /// Above glibc's `DEFAULT_MMAP_THRESHOLD_MAX` (32 MiB on 64-bit), with room for its header.
    const ALWAYS_MMAPPED: usize = 32 * 1024 * 1024 + 4096;
    if len < LARGE_OUTPUT {
        len
    } else {
        len.max(ALWAYS_MMAPPED)
    }
}

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

/// Bytes of a `Label` message (without its key and length prefix).
#[inline]
fn label_len(key: u32, value: StoredValue) -> usize {
    let (str_id, num) = label_fields(value);
    varint_field_len(u64::from(key)) + varint_field_len(str_id) + varint_field_len(num)
}

#[inline]
fn label_fields(value: StoredValue) -> (u64, u64) {
    match value {
        StoredValue::Str(s) => (u64::from(s), 0),
        StoredValue::Num(n) => (0, n as u64),
    }
}

fn put_label(buf: &mut Vec<u8>, key: u32, value: StoredValue) {
    let (str_id, num) = label_fields(value);
    put_len_prefix(buf, 3, label_len(key, value));
    put_varint_field(buf, 1, u64::from(key));
    put_varint_field(buf, 2, str_id);
    put_varint_field(buf, 3, num);
}

/// A length-delimited field with `len` bytes of payload (key byte for tags < 16).
#[inline]
fn message_field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// `Location` message length: id, mapping 1, one line (function id, line).
#[inline]
fn location_len(id: u64, location: &Location) -> (usize, usize) {
    let function_id = u64::from(location.function) + 1;
    let line_len = varint_field_len(function_id) + varint_field_len(location.line as u64);
    (varint_field_len(id) + varint_field_len(1) + message_field_len(line_len), line_len)
}

#[inline]
fn function_len(id: u64, function: &Function) -> usize {
    let (name, filename) = (u64::from(function.name), u64::from(function.filename));
    varint_field_len(id) + 2 * varint_field_len(name) + varint_field_len(filename)
}

/// Where encoded bytes go: kept whole (raw output, sized exactly up front), or handed to a
/// writer (the gzip encoder) every [`STREAM_CHUNK`] bytes so that the raw profile never exists
/// whole in memory.
struct Out<'w> {
    buf: Vec<u8>,
    sink: Option<&'w mut dyn Write>,
    error: Option<std::io::Error>,
}

/// Measured on the medium workload: 64 KiB chunks compress as fast as one 19 MB buffer.
const STREAM_CHUNK: usize = 64 * 1024;

impl Out<'_> {
    #[inline]
    fn maybe_flush(&mut self) {
        if self.buf.len() >= STREAM_CHUNK {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if let Some(sink) = self.sink.as_mut() {
            if self.error.is_none() {
                if let Err(e) = sink.write_all(&self.buf) {
                    self.error = Some(e);
                }
            }
            self.buf.clear();
        }
    }
}

/// Encodes `profile` as a pprof covering `profile.start()..finish`. Takes `&mut` only to
/// intern the strings the output needs besides the samples' own (value types, the
/// `"trace endpoint"` key).
pub fn encode(profile: &mut Profile, value_types: &[InputValueType], finish: Timestamp) -> Vec<u8> {
    let mut out = Out { buf: Vec::new(), sink: None, error: None };
    encode_into(profile, value_types, finish, &mut out);
    out.buf
}

/// [`encode`] then gzip, streaming: the encoder hands the gzip encoder 64 KiB at a time
/// instead of a whole raw copy of the profile (measured on the medium workload: peak heap
/// during a gzip serialization 76 -> ~30 MB).
pub fn encode_gzip(
    profile: &mut Profile,
    value_types: &[InputValueType],
    finish: Timestamp,
) -> Result<Vec<u8>, SerializeError> {
    let mut gz = GzOutput(Vec::new());
    let mut encoder = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::new(GZIP_LEVEL));
    let mut out =
        Out { buf: Vec::with_capacity(2 * STREAM_CHUNK), sink: Some(&mut encoder), error: None };
    encode_into(profile, value_types, finish, &mut out);
    out.flush();
    if let Some(e) = out.error {
        return Err(SerializeError::Compression(e.to_string()));
    }
    encoder.finish().map_err(|e| SerializeError::Compression(e.to_string()))?;
    let mut bytes = gz.0;
    // The growth steps can leave up to a fifth of the buffer unused: hand back only what is
    // used, or, for a large buffer, a capacity that keeps it mmapped (see `output_capacity`).
    let capacity = output_capacity(bytes.len());
    if capacity > bytes.capacity() {
        bytes.reserve_exact(capacity - bytes.len());
    } else {
        bytes.shrink_to(capacity);
    }
    Ok(bytes)
}

/// The gzip encoder's output buffer, grown by a quarter at a time rather than doubled, so that
/// at most a fifth of it is spare at the peak (large buffers are grown in place by `mremap`, so
/// the smaller steps cost no copying).
struct GzOutput(Vec<u8>);

impl Write for GzOutput {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let spare = self.0.capacity() - self.0.len();
        if spare < bytes.len() {
            let step = (self.0.capacity() / 4).max(STREAM_CHUNK).max(bytes.len());
            self.0.reserve_exact(step);
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn encode_into(
    profile: &mut Profile,
    value_types: &[InputValueType],
    finish: Timestamp,
    out: &mut Out<'_>,
) {
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

    // Each label's `Sample.label` field, encoded once and copied into every sample that has
    // it. (Per label rather than per label set: a large profile has ~1M label sets but only
    // ~50k labels, and the per-set copy held 40 MB more at the peak.)
    let mut label_bytes = Vec::new();
    let mut label_ends = Vec::with_capacity(profile.labels.len());
    for &StoredLabel { key, value } in &profile.labels {
        put_label(&mut label_bytes, key, value);
        label_ends.push(label_bytes.len());
    }
    let label_field = |label: u32| {
        let label = label as usize;
        &label_bytes[(if label == 0 { 0 } else { label_ends[label - 1] })..label_ends[label]]
    };
    let endpoint_of = |set: u32| match (endpoint_key, endpoints.get(set as usize)) {
        (Some(key), Some(Some(endpoint))) => Some((key, StoredValue::Str(*endpoint))),
        _ => None,
    };
    let labels_len = |set: u32| -> usize {
        profile.label_set(set).iter().map(|&l| label_field(l).len()).sum::<usize>()
            + endpoint_of(set).map_or(0, |(key, value)| message_field_len(label_len(key, value)))
    };

    let n = profile.num_values();
    let values_len = |i: usize| -> usize {
        profile.values[i * n..(i + 1) * n].iter().map(|&v| encoded_len_varint(v as u64)).sum()
    };
    let sample_len = |i: usize, stack: u32, set: u32| -> usize {
        packed_field_len(profile.stack_bytes(stack).len())
            + packed_field_len(values_len(i))
            + labels_len(set)
    };

    if out.sink.is_none() {
        // The raw output is returned whole: size it exactly, once, rather than grow it by
        // doubling (which held up to 1.5x its size more at the peak).
        let mut total = value_type_ids
            .iter()
            .map(|&(t, u)| message_field_len(varint_field_len(t) + varint_field_len(u)))
            .sum::<usize>();
        for (i, &(stack, set)) in profile.samples.iter().enumerate() {
            total += message_field_len(sample_len(i, stack, set));
        }
        if !profile.samples.is_empty() {
            total += message_field_len(2);
        }
        for (i, location) in profile.locations.iter().enumerate() {
            total += message_field_len(location_len(i as u64 + 1, location).0);
        }
        for (i, function) in profile.functions.iter().enumerate() {
            total += message_field_len(function_len(i as u64 + 1, function));
        }
        total += profile.strings.iter().map(|s| message_field_len(s.len())).sum::<usize>();
        let start = profile.start();
        total += varint_field_len(start.unix_nanos() as u64)
            + varint_field_len(finish.nanos_since(start) as u64);
        out.buf.reserve_exact(output_capacity(total));
    }

    for &(t, u) in &value_type_ids {
        let buf = &mut out.buf;
        put_len_prefix(buf, tag::SAMPLE_TYPE, varint_field_len(t) + varint_field_len(u));
        put_varint_field(buf, 1, t);
        put_varint_field(buf, 2, u);
    }

    for (i, &(stack, set)) in profile.samples.iter().enumerate() {
        let buf = &mut out.buf;
        let locations = profile.stack_bytes(stack);
        put_len_prefix(buf, tag::SAMPLE, sample_len(i, stack, set));
        if !locations.is_empty() {
            put_len_prefix(buf, 1, locations.len());
            buf.extend_from_slice(locations);
        }
        let values_len = values_len(i);
        if values_len > 0 {
            put_len_prefix(buf, 2, values_len);
            for &v in &profile.values[i * n..(i + 1) * n] {
                encode_varint(v as u64, buf);
            }
        }
        for &label in profile.label_set(set) {
            buf.extend_from_slice(label_field(label));
        }
        if let Some((key, value)) = endpoint_of(set) {
            put_label(buf, key, value);
        }
        out.maybe_flush();
    }

    if !profile.samples.is_empty() {
        // The one mapping every location points at: id 1, every other field zero.
        put_len_prefix(&mut out.buf, tag::MAPPING, 2);
        put_varint_field(&mut out.buf, 1, 1);
    }

    for (i, location) in profile.locations.iter().enumerate() {
        let buf = &mut out.buf;
        let id = i as u64 + 1;
        let (len, line_len) = location_len(id, location);
        put_len_prefix(buf, tag::LOCATION, len);
        put_varint_field(buf, 1, id);
        put_varint_field(buf, 2, 1);
        put_len_prefix(buf, 4, line_len);
        put_varint_field(buf, 1, u64::from(location.function) + 1);
        put_varint_field(buf, 2, location.line as u64);
        out.maybe_flush();
    }

    for (i, function) in profile.functions.iter().enumerate() {
        let buf = &mut out.buf;
        let id = i as u64 + 1;
        let (name, filename) = (u64::from(function.name), u64::from(function.filename));
        put_len_prefix(buf, tag::FUNCTION, function_len(id, function));
        put_varint_field(buf, 1, id);
        put_varint_field(buf, 2, name);
        put_varint_field(buf, 3, name);
        put_varint_field(buf, 4, filename);
        out.maybe_flush();
    }

    for s in profile.strings.iter() {
        put_len_prefix(&mut out.buf, tag::STRING_TABLE, s.len());
        out.buf.extend_from_slice(s.as_bytes());
        out.maybe_flush();
    }

    let start = profile.start();
    put_varint_field(&mut out.buf, tag::TIME_NANOS, start.unix_nanos() as u64);
    put_varint_field(&mut out.buf, tag::DURATION_NANOS, finish.nanos_since(start) as u64);
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

    /// The streaming gzip path hands the compressor many chunks: a profile several chunks
    /// long, with labels and endpoints, decompresses to exactly the raw encoding, and the raw
    /// encoding's up-front size was exact (no spare capacity).
    #[test]
    fn streamed_gzip_equals_raw_encoding_and_raw_is_sized_exactly() {
        let names: Vec<String> = (0..3000).map(|i| format!("function_{i}")).collect();
        let fill = || {
            let mut p = Profile::new(2, Timestamp { secs: 3, nanos: 4 });
            for i in 0..8_000usize {
                let frames: Vec<Frame<'_>> = (0..(i % 50))
                    .map(|d| Frame {
                        function_name: &names[(i * 7 + d * 13) % names.len()],
                        filename: "file.rb",
                        line: (d as i64) - 3,
                    })
                    .collect();
                let labels = [
                    Label { key: "local root span id", value: LabelValue::Num((i % 100) as i64) },
                    Label { key: "thread name", value: LabelValue::Str(&names[i % 16]) },
                ];
                let values = [i as i64, -(i as i64)];
                let sample = Sample {
                    frames: &frames,
                    omitted_frames: i % 3,
                    values: &values,
                    labels: &labels,
                };
                p.add(&sample, 40).unwrap();
            }
            p.record_endpoint(SpanId::Num(7), "GET /seven");
            p
        };
        let finish = Timestamp { secs: 9, nanos: 1 };
        let raw = encode(&mut fill(), &vts(), finish);
        assert!(raw.len() > 4 * STREAM_CHUNK);
        assert_eq!(raw.capacity(), output_capacity(raw.len()), "sized once, up front");
        let gz = encode_gzip(&mut fill(), &vts(), finish).unwrap();
        assert_eq!(gz.capacity(), output_capacity(gz.len()));
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut back).unwrap();
        assert!(back == raw, "gzip stream differs from the raw encoding");
        decode(&raw);
    }

    #[test]
    fn output_capacity_keeps_large_buffers_above_glibcs_dynamic_mmap_threshold() {
        assert_eq!(output_capacity(0), 0);
        assert_eq!(output_capacity(LARGE_OUTPUT - 1), LARGE_OUTPUT - 1);
        assert!(output_capacity(LARGE_OUTPUT) > 32 << 20);
        assert!(output_capacity(18 << 20) > 32 << 20);
        assert_eq!(output_capacity(200 << 20), 200 << 20);
    }
}
