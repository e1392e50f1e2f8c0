//! The pprof encoder: streams a [`Profile`] straight into protobuf bytes, so that serializing
//! does not first build a second copy of the profile as message structs.
//!
//! Each message is written by one function, [`Message::write_fields`], generic over a
//! [`Sink`]: a [`Counter`] that only adds up the encoded length, or a buffer that writes the
//! bytes. The structure of a message is stated once, and the length prefix of a nested message
//! is the same function run on a [`Counter`]. Field numbers are named per message, as in
//! profile.proto (libdatadog's `libdd-profiling-protobuf` is the model).
use std::io::Write;

use prost::encoding::{encoded_len_varint, WireType};

use super::buffer::output_capacity;
use crate::profile::{self as stored, Profile, StoredLabel, StoredValue};
use crate::sample::ValueType as InputValueType;
use crate::strings::StringId;
use crate::time::Timestamp;

/// Encodes `profile` as a pprof covering `profile.start()..finish`. Takes `&mut` only to
/// intern the strings the output needs besides the samples' own (value types, the
/// `"trace endpoint"` key).
pub fn encode(profile: &mut Profile, value_types: &[InputValueType], finish: Timestamp) -> Vec<u8> {
    let message = ProfileMessage::new(profile, value_types, finish);
    // The raw output is returned whole: size it exactly, once, rather than grow it by doubling
    // (which held up to 1.5x its size more at the peak).
    let mut bytes = Vec::with_capacity(output_capacity(Counter::len_of(&message)));
    message.write_fields(&mut bytes);
    bytes
}

/// [`encode`] into `writer`, [`STREAM_CHUNK`] bytes at a time, so that the raw profile never
/// exists whole in memory (the gzip path).
pub(super) fn encode_streaming(
    profile: &mut Profile,
    value_types: &[InputValueType],
    finish: Timestamp,
    writer: &mut dyn Write,
) -> std::io::Result<()> {
    let message = ProfileMessage::new(profile, value_types, finish);
    let mut out = Chunks { buf: Vec::with_capacity(2 * STREAM_CHUNK), writer, error: None };
    message.write_fields(&mut out);
    out.flush();
    out.error.map_or(Ok(()), Err)
}

/// Measured on the medium workload: 64 KiB chunks compress as fast as one 19 MB buffer.
pub(super) const STREAM_CHUNK: usize = 64 * 1024;

/// Where a message's fields go. A sink takes varints and bytes; the field helpers build on
/// those two, so that a [`Counter`] and a writer run the same code.
pub(super) trait Sink: Sized {
    fn varint(&mut self, v: u64);

    fn bytes(&mut self, bytes: &[u8]);

    /// A point between two entries of the profile's large repeated fields, where a streaming
    /// sink may hand on what it holds.
    #[inline]
    fn between_entries(&mut self) {}

    /// A length-delimited field holding `message`, written even when the message is empty.
    #[inline]
    fn message<M: Message>(&mut self, tag: u32, message: &M) {
        self.len_prefix(tag, Counter::len_of(message));
        message.write_fields(self);
    }

    #[inline]
    fn len_prefix(&mut self, tag: u32, len: usize) {
        self.varint(u64::from(tag << 3 | WireType::LengthDelimited as u32));
        self.varint(len as u64);
    }

    /// An int64 / uint64 field, omitted when zero (proto3).
    #[inline]
    fn varint_field(&mut self, tag: u32, v: u64) {
        if v != 0 {
            self.varint(u64::from(tag << 3 | WireType::Varint as u32));
            self.varint(v);
        }
    }

    /// A string or bytes field, written even when empty (a string table entry).
    #[inline]
    fn bytes_field(&mut self, tag: u32, bytes: &[u8]) {
        self.len_prefix(tag, bytes.len());
        self.bytes(bytes);
    }

    /// A packed repeated varint field whose payload is already encoded, omitted when empty.
    #[inline]
    fn packed_field(&mut self, tag: u32, payload: &[u8]) {
        if !payload.is_empty() {
            self.bytes_field(tag, payload);
        }
    }

    /// A packed repeated int64 field, omitted when empty.
    #[inline]
    fn packed_int64s(&mut self, tag: u32, values: &[i64]) {
        if !values.is_empty() {
            self.message(tag, &PackedInt64s(values));
        }
    }
}

/// A protobuf message: its fields, without its own key and length prefix.
pub(super) trait Message {
    fn write_fields<S: Sink>(&self, sink: &mut S);
}

/// A sink that counts the bytes it would write.
#[derive(Default)]
pub(super) struct Counter(usize);

impl Counter {
    /// Encoded length of `message`'s fields.
    #[inline]
    pub(super) fn len_of<M: Message>(message: &M) -> usize {
        let mut counter = Counter(0);
        message.write_fields(&mut counter);
        counter.0
    }
}

impl Sink for Counter {
    #[inline]
    fn varint(&mut self, v: u64) {
        self.0 += encoded_len_varint(v);
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }

    /// Counts the nested message once (the default would count it for its prefix, then again).
    #[inline]
    fn message<M: Message>(&mut self, tag: u32, message: &M) {
        let len = Counter::len_of(message);
        self.len_prefix(tag, len);
        self.0 += len;
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn varint(&mut self, v: u64) {
        prost::encoding::encode_varint(v, self);
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A buffer handed to a writer (the gzip encoder) whenever it holds [`STREAM_CHUNK`] bytes. A
/// write error is kept, and the rest of the profile encoded into the void.
struct Chunks<'w> {
    buf: Vec<u8>,
    writer: &'w mut dyn Write,
    error: Option<std::io::Error>,
}

impl Chunks<'_> {
    fn flush(&mut self) {
        if self.error.is_none() {
            if let Err(e) = self.writer.write_all(&self.buf) {
                self.error = Some(e);
            }
        }
        self.buf.clear();
    }
}

impl Sink for Chunks<'_> {
    #[inline]
    fn varint(&mut self, v: u64) {
        self.buf.varint(v);
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    #[inline]
    fn between_entries(&mut self) {
        if self.buf.len() >= STREAM_CHUNK {
            self.flush();
        }
    }
}

/// The payload of a packed repeated int64 field.
struct PackedInt64s<'a>(&'a [i64]);

impl Message for PackedInt64s<'_> {
    #[inline]
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        for &v in self.0 {
            sink.varint(v as u64);
        }
    }
}

/// `Profile`, the top-level message, resolved from a [`Profile`]'s storage.
struct ProfileMessage<'a> {
    profile: &'a Profile,
    /// `(type, unit)` string ids of each value type.
    value_types: Vec<(u64, u64)>,
    /// The endpoint of each label set, by label set id (empty when no sample has one).
    endpoints: Vec<Option<StringId>>,
    /// The `"trace endpoint"` key, interned only when some label set has an endpoint.
    endpoint_key: Option<StringId>,
    labels: EncodedLabels,
    finish: Timestamp,
}

impl<'a> ProfileMessage<'a> {
    const SAMPLE_TYPE: u32 = 1;
    const SAMPLE: u32 = 2;
    const MAPPING: u32 = 3;
    const LOCATION: u32 = 4;
    const FUNCTION: u32 = 5;
    const STRING_TABLE: u32 = 6;
    const TIME_NANOS: u32 = 9;
    const DURATION_NANOS: u32 = 10;

    /// Interns the strings the output needs, then borrows the profile.
    fn new(profile: &'a mut Profile, value_types: &[InputValueType], finish: Timestamp) -> Self {
        let value_types = value_types
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
        let labels = EncodedLabels::new(&profile.labels);
        Self { profile, value_types, endpoints, endpoint_key, labels, finish }
    }

    /// The `"trace endpoint"` label of label set `set`, if it has an endpoint.
    #[inline]
    fn endpoint_label(&self, set: u32) -> Option<Label> {
        match (self.endpoint_key, self.endpoints.get(set as usize)) {
            (Some(key), Some(Some(endpoint))) => {
                Some(Label::from(StoredLabel { key, value: StoredValue::Str(*endpoint) }))
            }
            _ => None,
        }
    }
}

impl Message for ProfileMessage<'_> {
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        let profile = self.profile;
        for &(r#type, unit) in &self.value_types {
            sink.message(Self::SAMPLE_TYPE, &ValueType { r#type, unit });
        }
        let n = profile.num_values();
        for (i, &(stack, set)) in profile.samples.iter().enumerate() {
            let sample = Sample {
                location_ids: profile.stack_bytes(stack),
                values: &profile.values[i * n..(i + 1) * n],
                labels: profile.label_set(set),
                encoded_labels: &self.labels,
                endpoint: self.endpoint_label(set),
            };
            sink.message(Self::SAMPLE, &sample);
            sink.between_entries();
        }
        if !profile.samples.is_empty() {
            // The one mapping every location points at: id 1, every other field zero.
            sink.message(Self::MAPPING, &Mapping { id: MAPPING_ID });
        }
        for (i, location) in profile.locations.iter().enumerate() {
            sink.message(Self::LOCATION, &Location::new(i, location));
            sink.between_entries();
        }
        for (i, function) in profile.functions.iter().enumerate() {
            sink.message(Self::FUNCTION, &Function::new(i, function));
            sink.between_entries();
        }
        for s in profile.strings.iter() {
            sink.bytes_field(Self::STRING_TABLE, s.as_bytes());
            sink.between_entries();
        }
        let start = profile.start();
        sink.varint_field(Self::TIME_NANOS, start.unix_nanos() as u64);
        sink.varint_field(Self::DURATION_NANOS, self.finish.nanos_since(start) as u64);
    }
}

/// Id of the one mapping.
const MAPPING_ID: u64 = 1;

/// pprof ids are 1-based: entry `index` of a table has id `index + 1`.
#[inline]
fn id_of(index: usize) -> u64 {
    index as u64 + 1
}

/// `ValueType`: string ids of a sample type and its unit.
struct ValueType {
    r#type: u64,
    unit: u64,
}

impl ValueType {
    const TYPE: u32 = 1;
    const UNIT: u32 = 2;
}

impl Message for ValueType {
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.varint_field(Self::TYPE, self.r#type);
        sink.varint_field(Self::UNIT, self.unit);
    }
}

/// `Sample`: a stack, its values and its labels.
struct Sample<'a> {
    /// Already the packed varints of the location ids (see the `profile` module docs).
    location_ids: &'a [u8],
    values: &'a [i64],
    /// Ids into `encoded_labels`.
    labels: &'a [u32],
    encoded_labels: &'a EncodedLabels,
    endpoint: Option<Label>,
}

impl Sample<'_> {
    const LOCATION_ID: u32 = 1;
    const VALUE: u32 = 2;
    const LABEL: u32 = 3;
}

impl Message for Sample<'_> {
    #[inline]
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.packed_field(Self::LOCATION_ID, self.location_ids);
        sink.packed_int64s(Self::VALUE, self.values);
        for &label in self.labels {
            sink.bytes(self.encoded_labels.field(label));
        }
        if let Some(endpoint) = &self.endpoint {
            sink.message(Self::LABEL, endpoint);
        }
    }
}

/// Each stored label's whole `Sample.label` field (key, length, message), encoded once and
/// copied into every sample that has it. Per label rather than per label set: a large profile
/// has ~1M label sets but only ~50k labels, and the per-set copy held 40 MB more at the peak.
struct EncodedLabels {
    bytes: Vec<u8>,
    /// End of label `id`'s field in `bytes`; it starts where label `id - 1`'s ends.
    ends: Vec<usize>,
}

impl EncodedLabels {
    fn new(labels: &[StoredLabel]) -> Self {
        let mut encoded = Self { bytes: Vec::new(), ends: Vec::with_capacity(labels.len()) };
        for &label in labels {
            encoded.bytes.message(Sample::LABEL, &Label::from(label));
            encoded.ends.push(encoded.bytes.len());
        }
        encoded
    }

    #[inline]
    fn field(&self, id: u32) -> &[u8] {
        let id = id as usize;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.bytes[start..self.ends[id]]
    }
}

/// `Label`: a key and a string or a number (`num_unit` is never written).
struct Label {
    key: u64,
    str: u64,
    num: u64,
}

impl Label {
    const KEY: u32 = 1;
    const STR: u32 = 2;
    const NUM: u32 = 3;
}

impl From<StoredLabel> for Label {
    #[inline]
    fn from(StoredLabel { key, value }: StoredLabel) -> Self {
        let (str, num) = match value {
            StoredValue::Str(s) => (u64::from(s), 0),
            StoredValue::Num(n) => (0, n as u64),
        };
        Self { key: u64::from(key), str, num }
    }
}

impl Message for Label {
    #[inline]
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.varint_field(Self::KEY, self.key);
        sink.varint_field(Self::STR, self.str);
        sink.varint_field(Self::NUM, self.num);
    }
}

/// `Mapping`: only its id (no binaries to describe).
struct Mapping {
    id: u64,
}

impl Mapping {
    const ID: u32 = 1;
}

impl Message for Mapping {
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.varint_field(Self::ID, self.id);
    }
}

/// `Location`: in the one mapping, with one line.
struct Location {
    id: u64,
    line: Line,
}

impl Location {
    const ID: u32 = 1;
    const MAPPING_ID: u32 = 2;
    const LINE: u32 = 4;

    #[inline]
    fn new(index: usize, location: &stored::Location) -> Self {
        let function_id = id_of(location.function as usize);
        Self { id: id_of(index), line: Line { function_id, line: location.line } }
    }
}

impl Message for Location {
    #[inline]
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.varint_field(Self::ID, self.id);
        sink.varint_field(Self::MAPPING_ID, MAPPING_ID);
        sink.message(Self::LINE, &self.line);
    }
}

/// `Line`: a function and a line number in it.
struct Line {
    function_id: u64,
    line: i64,
}

impl Line {
    const FUNCTION_ID: u32 = 1;
    const LINE: u32 = 2;
}

impl Message for Line {
    #[inline]
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.varint_field(Self::FUNCTION_ID, self.function_id);
        sink.varint_field(Self::LINE, self.line as u64);
    }
}

/// `Function`: its name doubles as its system name.
struct Function {
    id: u64,
    name: u64,
    filename: u64,
}

impl Function {
    const ID: u32 = 1;
    const NAME: u32 = 2;
    const SYSTEM_NAME: u32 = 3;
    const FILENAME: u32 = 4;

    #[inline]
    fn new(index: usize, function: &stored::Function) -> Self {
        let (name, filename) = (u64::from(function.name), u64::from(function.filename));
        Self { id: id_of(index), name, filename }
    }
}

impl Message for Function {
    #[inline]
    fn write_fields<S: Sink>(&self, sink: &mut S) {
        sink.varint_field(Self::ID, self.id);
        sink.varint_field(Self::NAME, self.name);
        sink.varint_field(Self::SYSTEM_NAME, self.name);
        sink.varint_field(Self::FILENAME, self.filename);
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::pprof::{PprofMapping, PprofProfile};
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
}
