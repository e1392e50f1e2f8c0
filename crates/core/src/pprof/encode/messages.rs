//! The pprof messages the encoder writes, each one struct (what it holds), its field numbers
//! (named as in profile.proto) and one [`Message::write_fields`]: the whole structure of the
//! output, stated once.
use super::{Message, Sink};
use crate::profile::{self as stored, Profile, StoredLabel, StoredValue};
use crate::sample::ValueType as InputValueType;
use crate::strings::StringId;
use crate::time::Timestamp;
use crate::END_TIMESTAMP_LABEL;

/// `Profile`, the top-level message, resolved from a [`Profile`]'s storage.
pub(super) struct ProfileMessage<'a> {
    profile: &'a Profile,
    /// `(type, unit)` string ids of each value type.
    value_types: Vec<(u64, u64)>,
    /// The endpoint of each label set, by label set id (empty when no sample has one).
    endpoints: Vec<Option<StringId>>,
    /// The `"trace endpoint"` key, interned only when some label set has an endpoint.
    endpoint_key: Option<StringId>,
    /// The [`END_TIMESTAMP_LABEL`] key, interned only when the profile has timed samples.
    end_timestamp_key: Option<StringId>,
    labels: EncodedLabels,
    finish: Timestamp,
    /// String ids of the comments, in order (empty: no `comment` field).
    comments: Vec<i64>,
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
    const COMMENT: u32 = 13;

    /// Interns the strings the output needs, then borrows the profile.
    pub(super) fn new(
        profile: &'a mut Profile,
        value_types: &[InputValueType],
        comments: &[String],
        finish: Timestamp,
    ) -> Self {
        let value_types = value_types
            .iter()
            .map(|vt| {
                (
                    u64::from(profile.strings.intern(&vt.r#type)),
                    u64::from(profile.strings.intern(&vt.unit)),
                )
            })
            .collect();
        let comments = comments.iter().map(|c| i64::from(profile.strings.intern(c))).collect();
        let (endpoints, endpoint_key) = profile.resolve_endpoints();
        let end_timestamp_key =
            (!profile.timed.is_empty()).then(|| profile.strings.intern(END_TIMESTAMP_LABEL));
        let profile = &*profile;
        let labels = EncodedLabels::new(&profile.labels);
        Self {
            profile,
            value_types,
            endpoints,
            endpoint_key,
            end_timestamp_key,
            labels,
            finish,
            comments,
        }
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
                end_timestamp: None,
            };
            sink.message(Self::SAMPLE, &sample);
            sink.between_entries();
        }
        // Timed samples after the aggregated ones, one each, in the order they were added.
        for (i, timed) in profile.timed.iter().enumerate() {
            let end_timestamp = self
                .end_timestamp_key
                .map(|key| Label::from(StoredLabel { key, value: StoredValue::Num(timed.end_ns) }));
            let sample = Sample {
                location_ids: profile.stack_bytes(timed.stack),
                values: profile.timed_values(i),
                labels: profile.label_set(timed.label_set),
                encoded_labels: &self.labels,
                endpoint: self.endpoint_label(timed.label_set),
                end_timestamp,
            };
            sink.message(Self::SAMPLE, &sample);
            sink.between_entries();
        }
        if !profile.samples.is_empty() || !profile.timed.is_empty() {
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
        sink.packed_int64s(Self::COMMENT, &self.comments);
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
    /// A timed sample's end time.
    end_timestamp: Option<Label>,
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
        for label in [&self.endpoint, &self.end_timestamp].into_iter().flatten() {
            sink.message(Self::LABEL, label);
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
