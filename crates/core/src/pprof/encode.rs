//! The pprof encoder: streams a [`Profile`] straight into protobuf bytes, so that serializing
//! does not first build a second copy of the profile as message structs.
//!
//! Each message is written by one function, [`Message::write_fields`], generic over a
//! [`Sink`]: a [`Counter`] that only adds up the encoded length, or a buffer that writes the
//! bytes. The structure of a message is stated once, and the length prefix of a nested message
//! is the same function run on a [`Counter`]. This file holds the sinks; `encode/messages.rs`
//! the messages, with their field numbers named as in profile.proto (libdatadog's
//! `libdd-profiling-protobuf` is the model).
use std::io::Write;

use prost::encoding::{encoded_len_varint, WireType};

use super::buffer::output_capacity;
use crate::profile::Profile;
use crate::sample::ValueType as InputValueType;
use crate::time::Timestamp;

mod messages;

use messages::ProfileMessage;

/// Encodes `profile` as a pprof covering `profile.start()..finish`, with `comments` in its
/// `comment` field (none: the field is absent). Takes `&mut` only to intern the strings the
/// output needs besides the samples' own (value types, comments, the `"trace endpoint"` key).
pub fn encode(
    profile: &mut Profile,
    value_types: &[InputValueType],
    comments: &[String],
    finish: Timestamp,
) -> Vec<u8> {
    let message = ProfileMessage::new(profile, value_types, comments, finish);
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
    comments: &[String],
    finish: Timestamp,
    writer: &mut dyn Write,
) -> std::io::Result<()> {
    let message = ProfileMessage::new(profile, value_types, comments, finish);
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
        let d = decode(&encode(&mut p, &vts(), &[], Timestamp { secs: 12, nanos: 7 }));
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
        let d = decode(&encode(&mut p, &vts(), &[], Timestamp { secs: 1, nanos: 0 }));
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
    fn timed_samples_come_one_each_with_their_end_time_after_the_aggregated_ones() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [Frame { function_name: "work", filename: "a.rb", line: 3 }];
        let add = |p: &mut Profile, labels: &[Label<'_>], values: &[i64]| {
            p.add(&Sample { frames: &frames, omitted_frames: 0, values, labels }, 10).unwrap();
        };
        let span = Label { key: "local root span id", value: LabelValue::Num(9) };
        let at = |ns| Label { key: crate::END_TIMESTAMP_LABEL, value: LabelValue::Num(ns) };
        add(&mut p, &[span], &[1, 1]);
        add(&mut p, &[span, at(2_000)], &[5, 6]);
        add(&mut p, &[at(1_000), span], &[7, 8]);
        add(&mut p, &[span], &[1, 1]);
        p.record_endpoint(SpanId::Num(9), "GET /");
        assert_eq!((p.sample_count(), p.timed_sample_count()), (1, 2));
        let d = decode(&encode(&mut p, &vts(), &[], Timestamp { secs: 1, nanos: 0 }));
        let s = |i: i64| d.string_table[i as usize].as_str();
        let labels = |i: usize| -> Vec<String> {
            d.sample[i]
                .label
                .iter()
                .map(|l| {
                    if l.str != 0 {
                        format!("{}={}", s(l.key), s(l.str))
                    } else {
                        format!("{}={}", s(l.key), l.num)
                    }
                })
                .collect()
        };
        assert_eq!(d.sample.len(), 3);
        assert_eq!(
            d.sample.iter().map(|x| x.value.clone()).collect::<Vec<_>>(),
            [[2, 2], [5, 6], [7, 8]]
        );
        assert!(d.sample.iter().all(|x| x.location_id == [1]), "one stack, stored once");
        assert_eq!(labels(0), ["local root span id=9", "trace endpoint=GET /"]);
        assert_eq!(
            labels(1),
            ["local root span id=9", "trace endpoint=GET /", "end_timestamp_ns=2000"]
        );
        assert_eq!(
            labels(2),
            ["local root span id=9", "trace endpoint=GET /", "end_timestamp_ns=1000"]
        );
        assert_eq!(d.mapping.len(), 1);
    }

    #[test]
    fn timed_samples_alone_have_the_mapping_and_no_key_without_them() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [Frame { function_name: "work", filename: "a.rb", line: 3 }];
        let labels = [Label { key: crate::END_TIMESTAMP_LABEL, value: LabelValue::Num(5) }];
        p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[1, 2], labels: &labels }, 10)
            .unwrap();
        let d = decode(&encode(&mut p, &vts(), &[], Timestamp::default()));
        assert_eq!((d.sample.len(), d.mapping.len()), (1, 1));
        p.reset(Timestamp::default());
        let d = decode(&encode(&mut p, &vts(), &[], Timestamp::default()));
        assert!(!d.string_table.iter().any(|s| s == crate::END_TIMESTAMP_LABEL));
    }

    #[test]
    fn comments_are_strings_of_the_table_in_order_and_absent_when_none() {
        let frames = [Frame { function_name: "leaf", filename: "a.rb", line: 3 }];
        let fill = || {
            let mut p = Profile::new(2, Timestamp::default());
            let sample =
                Sample { frames: &frames, omitted_frames: 0, values: &[1, 2], labels: &[] };
            p.add(&sample, 10).unwrap();
            p
        };
        let finish = Timestamp { secs: 1, nanos: 0 };
        // A comment equal to a string the profile has ("leaf") reuses it; one given twice is
        // written twice, as given.
        let comments: Vec<String> =
            ["sampling: at each tick", "leaf", "sampling: at each tick"].map(String::from).into();
        let bytes = encode(&mut fill(), &vts(), &comments, finish);
        let d = decode(&bytes);
        let resolved: Vec<&str> =
            d.comment.iter().map(|&c| d.string_table[c as usize].as_str()).collect();
        assert_eq!(resolved, comments);
        let mut sorted = d.string_table.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), d.string_table.len(), "every string once");
        assert_eq!(d.comment[0], d.comment[2]);
        assert_eq!(d.sample[0].value, vec![1, 2]);
        assert_eq!(
            bytes.len(),
            Counter::len_of(&ProfileMessage::new(&mut fill(), &vts(), &comments, finish))
        );

        // Without comments, no field 13 at all: the bytes of a profile that never had any.
        let plain = encode(&mut fill(), &vts(), &[], finish);
        assert!(decode(&plain).comment.is_empty());
        let mut without = d.clone();
        without.comment.clear();
        without.string_table.retain(|s| s != "sampling: at each tick");
        assert_eq!(plain, without.encode_to_vec());
    }
}
