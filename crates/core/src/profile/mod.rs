//! One profile's storage. Strings, functions, locations, labels, stacks and label sets are each
//! stored once and named by dense ids; samples are aggregated by (stack, label set) with their
//! values summed, except timed samples (`timed.rs`), kept one by one. Every lookup is one hash probe in a table of ids, so the cost of adding a
//! sample depends on its size, not on how many samples the profile already holds.
//!
//! One file per entity: `frames.rs` (functions and locations), `stacks.rs`, `labels.rs` (labels
//! and label sets), `timed.rs`, `endpoints.rs` and `limits.rs`; `arena.rs` stores the interned slices of
//! stacks and label sets. This file holds the profile itself and its samples.
use hashbrown::{HashMap, HashTable};
use rustc_hash::FxBuildHasher;

use crate::error::RecordError;
use crate::hash::fx_hash;
use crate::sample::{Frame, Label, LabelValue, Sample};
use crate::strings::{StringId, StringTable};
use crate::time::Timestamp;
use crate::{END_TIMESTAMP_LABEL, TRACE_ENDPOINT_LABEL};

mod arena;
mod endpoints;
mod frames;
mod labels;
mod limits;
mod stacks;
mod timed;

use arena::Arena;
use endpoints::SpanKey;
use frames::FrameEntry;
pub(crate) use frames::{Function, Location};
pub(crate) use labels::{StoredLabel, StoredValue};
pub use limits::Limits;
use stacks::decode_varints;
pub(crate) use timed::TimedSample;

fn hash_sample(key: (u32, u32)) -> u64 {
    fx_hash(&key)
}

/// Checks a sample against a profile with `num_values` value types, before anything is
/// stored, so that a bad sample records nothing.
pub(crate) fn validate(sample: &Sample<'_>, num_values: usize) -> Result<(), RecordError> {
    if sample.values.len() != num_values {
        return Err(RecordError::ValuesLength { expected: num_values, got: sample.values.len() });
    }
    for (i, label) in sample.labels.iter().enumerate() {
        if label.key.is_empty() {
            return Err(RecordError::EmptyLabelKey);
        }
        if label.key == TRACE_ENDPOINT_LABEL {
            return Err(RecordError::ReservedLabelKey);
        }
        if label.key == END_TIMESTAMP_LABEL && !matches!(label.value, LabelValue::Num(n) if n >= 0)
        {
            return Err(RecordError::BadEndTimestamp);
        }
        // Label lists are short (a handful of keys); quadratic beats sorting a copy.
        if sample.labels[..i].iter().any(|other| other.key == label.key) {
            return Err(RecordError::DuplicateLabelKey(label.key.to_owned()));
        }
    }
    Ok(())
}

/// One time window's samples.
#[derive(Debug)]
pub struct Profile {
    num_values: usize,
    pub(crate) start: Timestamp,
    pub(crate) strings: StringTable,
    pub(crate) functions: Vec<Function>,
    function_index: HashTable<u32>,
    pub(crate) locations: Vec<Location>,
    /// Locations by (function name, filename, line): one probe per frame on the hot path.
    location_index: HashTable<FrameEntry>,
    /// Stacks as packed varints of their location ids + 1 (see `stacks.rs`).
    stacks: Arena<u8>,
    /// Distinct (key, value) labels, by label id.
    pub(crate) labels: Vec<StoredLabel>,
    label_index: HashTable<u32>,
    /// Label sets as label ids in increasing order (so that order does not matter).
    label_sets: Arena<u32>,
    /// `(stack id, label set id)` by sample index.
    pub(crate) samples: Vec<(u32, u32)>,
    /// `num_values` values per sample, by sample index.
    pub(crate) values: Vec<i64>,
    /// Sample ids by their `(stack, label set)`.
    sample_index: HashTable<u32>,
    /// Timed samples, in the order they were added, and their values (`num_values` each).
    pub(crate) timed: Vec<TimedSample>,
    timed_values: Vec<i64>,
    /// Timed samples aggregated without their time (over the limit) since the last reset.
    timestamps_dropped: u64,
    endpoints: HashMap<SpanKey, StringId, FxBuildHasher>,
    /// Samples added (before aggregation) since the last reset.
    samples_added: u64,
    /// Of those, samples folded into the placeholder (over the limits).
    samples_dropped: u64,
    limits: Limits,
    scratch_stack: Vec<u8>,
    scratch_labels: Vec<u32>,
    scratch_string: String,
}

impl Profile {
    pub fn new(num_values: usize, start: Timestamp) -> Self {
        Self::with_limits(num_values, start, Limits::DEFAULT)
    }

    /// A profile whose distinct content is bounded by `limits` (see [`Limits`]).
    pub fn with_limits(num_values: usize, start: Timestamp, limits: Limits) -> Self {
        Self {
            num_values,
            start,
            strings: StringTable::default(),
            functions: Vec::new(),
            function_index: HashTable::new(),
            locations: Vec::new(),
            location_index: HashTable::new(),
            stacks: Arena::default(),
            labels: Vec::new(),
            label_index: HashTable::new(),
            label_sets: Arena::default(),
            samples: Vec::new(),
            values: Vec::new(),
            sample_index: HashTable::new(),
            timed: Vec::new(),
            timed_values: Vec::new(),
            timestamps_dropped: 0,
            endpoints: HashMap::default(),
            samples_added: 0,
            samples_dropped: 0,
            limits,
            scratch_stack: Vec::new(),
            scratch_labels: Vec::new(),
            scratch_string: String::new(),
        }
    }

    pub fn start(&self) -> Timestamp {
        self.start
    }

    pub fn num_values(&self) -> usize {
        self.num_values
    }

    /// Distinct (stack, label set) pairs.
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// Samples added since the last reset, before aggregation.
    pub fn samples_added(&self) -> u64 {
        self.samples_added
    }

    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    pub fn string_count(&self) -> usize {
        self.strings.len()
    }

    pub fn label_set_count(&self) -> usize {
        self.label_sets.len()
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Samples folded into the placeholder since the last reset.
    pub fn samples_dropped(&self) -> u64 {
        self.samples_dropped
    }

    /// Empties the profile for a new window starting at `start`, keeping its allocations.
    pub fn reset(&mut self, start: Timestamp) {
        self.start = start;
        self.strings.clear();
        self.functions.clear();
        self.function_index.clear();
        self.locations.clear();
        self.location_index.clear();
        self.stacks.clear();
        self.labels.clear();
        self.label_index.clear();
        self.label_sets.clear();
        self.samples.clear();
        self.values.clear();
        self.sample_index.clear();
        self.timed.clear();
        self.timed_values.clear();
        self.timestamps_dropped = 0;
        self.endpoints.clear();
        self.samples_added = 0;
        self.samples_dropped = 0;
    }

    /// Adds a sample, truncating its stack to `max_frames` (the root-most kept frame becomes a
    /// `"N frames omitted"` placeholder). Returns an error, recording nothing, if the sample is
    /// invalid.
    /// A sample over the [`Limits`] is folded into the placeholder (see [`Profile::samples_dropped`]).
    pub fn add(&mut self, sample: &Sample<'_>, max_frames: usize) -> Result<(), RecordError> {
        validate(sample, self.num_values)?;
        self.add_validated(sample, max_frames);
        Ok(())
    }

    /// [`Profile::add`] for a sample that [`validate`] accepted. Returns false when the sample
    /// was over the [`Limits`] and folded into the [`crate::DROPPED_FRAME`] placeholder.
    pub(crate) fn add_validated(&mut self, sample: &Sample<'_>, max_frames: usize) -> bool {
        let total = sample.frames.len().saturating_add(sample.omitted_frames);
        let kept = if total > max_frames {
            sample.frames.len().min(max_frames.saturating_sub(1))
        } else {
            sample.frames.len()
        };
        // The limit check on the hot path: integer compares against an upper bound of what the
        // sample can add (each frame and label at most two new strings, one new stack, label
        // set and sample). Only a profile close to a limit pays for the exact check.
        // A timed sample kept apart needs no aggregated sample.
        let end_ns = timed::end_timestamp(sample.labels);
        let timed = self.keeps_timed(end_ns);
        let worst_strings = 2 * (kept + 1) + 2 * sample.labels.len();
        let limits = &self.limits;
        let surely_fits = self.strings.len() + worst_strings <= limits.max_strings
            && self.stacks.len() < limits.max_stacks
            && self.label_sets.len() < limits.max_label_sets
            && (timed || self.samples.len() < limits.max_samples);
        if !surely_fits && !self.fits(sample, kept, total, timed) {
            self.add_dropped(sample.values);
            return false;
        }
        let stack_id = self.intern_stack(&sample.frames[..kept], total);
        let label_set = self.intern_labels(sample.labels);
        match end_ns {
            Some(end_ns) if timed => self.push_timed(stack_id, label_set, end_ns, sample.values),
            _ => {
                self.timestamps_dropped += u64::from(end_ns.is_some());
                self.add_values(stack_id, label_set, sample.values);
            }
        }
        self.samples_added += 1;
        true
    }

    fn find_sample(&self, key: (u32, u32)) -> Option<u32> {
        let samples = &self.samples;
        self.sample_index.find(hash_sample(key), |&id| samples[id as usize] == key).copied()
    }

    fn add_values(&mut self, stack: u32, label_set: u32, values: &[i64]) {
        let key = (stack, label_set);
        let hash = hash_sample(key);
        let samples = &self.samples;
        if let Some(&id) = self.sample_index.find(hash, |&id| samples[id as usize] == key) {
            let start = id as usize * self.num_values;
            for (sum, v) in self.values[start..start + self.num_values].iter_mut().zip(values) {
                *sum = sum.saturating_add(*v);
            }
            return;
        }
        let id = self.samples.len() as u32;
        self.samples.push(key);
        self.values.extend_from_slice(values);
        let samples = &self.samples;
        self.sample_index.insert_unique(hash, id, |&id| hash_sample(samples[id as usize]));
    }

    /// Heap bytes held by this profile (capacities, not lengths: what the allocator holds).
    /// Hash tables count their whole allocation (buckets, control bytes), not the 7/8 of it
    /// that `capacity()` reports: `ObjectSpace.memsize_of` is checked against what freeing a
    /// recorder gives back to malloc (bench/soak.rb).
    pub fn heap_bytes(&self) -> usize {
        self.strings.heap_bytes()
            + self.functions.capacity() * std::mem::size_of::<Function>()
            + self.function_index.allocation_size()
            + self.locations.capacity() * std::mem::size_of::<Location>()
            + self.location_index.allocation_size()
            + self.stacks.heap_bytes()
            + self.labels.capacity() * std::mem::size_of::<StoredLabel>()
            + self.label_index.allocation_size()
            + self.label_sets.heap_bytes()
            + self.samples.capacity() * std::mem::size_of::<(u32, u32)>()
            + self.values.capacity() * std::mem::size_of::<i64>()
            + self.sample_index.allocation_size()
            + self.timed.capacity() * std::mem::size_of::<TimedSample>()
            + self.timed_values.capacity() * std::mem::size_of::<i64>()
            + self.endpoints.allocation_size()
            + self.scratch_stack.capacity()
            + self.scratch_labels.capacity() * 4
            + self.scratch_string.capacity()
    }

    /// Iterates samples as `(frames leaf first, values, labels)`, resolved to strings, the
    /// aggregated ones first, then the timed ones in the order they were added, each with its
    /// [`END_TIMESTAMP_LABEL`] last; for callers that want the data without pprof (tests,
    /// folded stacks).
    pub fn for_each_sample(&self, mut f: impl FnMut(&[Frame<'_>], &[i64], &[Label<'_>])) {
        let mut frames = Vec::new();
        let mut labels = Vec::new();
        let aggregated = self.samples.iter().enumerate().map(|(i, &(stack, set))| {
            (stack, set, &self.values[i * self.num_values..(i + 1) * self.num_values], None)
        });
        let timed = self
            .timed
            .iter()
            .enumerate()
            .map(|(i, t)| (t.stack, t.label_set, self.timed_values(i), Some(t.end_ns)));
        for (stack, set, values, end_ns) in aggregated.chain(timed) {
            frames.clear();
            frames.extend(decode_varints(self.stack_bytes(stack)).map(|id| {
                let location = self.locations[id as usize - 1];
                let function = self.functions[location.function as usize];
                Frame {
                    function_name: self.strings.get(function.name),
                    filename: self.strings.get(function.filename),
                    line: location.line,
                }
            }));
            labels.clear();
            labels.extend(self.label_set(set).iter().map(|&l| {
                let l = self.labels[l as usize];
                Label {
                    key: self.strings.get(l.key),
                    value: match l.value {
                        StoredValue::Str(s) => LabelValue::Str(self.strings.get(s)),
                        StoredValue::Num(n) => LabelValue::Num(n),
                    },
                }
            }));
            labels.extend(
                end_ns.map(|n| Label { key: END_TIMESTAMP_LABEL, value: LabelValue::Num(n) }),
            );
            f(&frames, values, &labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SpanId;

    fn frame(name: &'static str, line: i64) -> Frame<'static> {
        Frame { function_name: name, filename: "app.rb", line }
    }

    fn collect(p: &Profile) -> Vec<(Vec<String>, Vec<i64>, Vec<String>)> {
        let mut out = Vec::new();
        p.for_each_sample(|frames, values, labels| {
            out.push((
                frames
                    .iter()
                    .map(|f| format!("{}:{}:{}", f.function_name, f.filename, f.line))
                    .collect(),
                values.to_vec(),
                labels.iter().map(|l| format!("{}={:?}", l.key, l.value)).collect(),
            ))
        });
        out
    }

    #[test]
    fn aggregates_same_stack_and_labels_in_any_order() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [frame("a", 1), frame("b", 2)];
        let l1 = [
            Label { key: "thread id", value: LabelValue::Str("1") },
            Label { key: "n", value: LabelValue::Num(5) },
        ];
        let l2 = [l1[1], l1[0]];
        for (labels, values) in [(&l1, [1, 10]), (&l2, [2, 20])] {
            p.add(&Sample { frames: &frames, omitted_frames: 0, values: &values, labels }, 400)
                .unwrap();
        }
        assert_eq!(p.sample_count(), 1);
        assert_eq!(p.samples_added(), 2);
        assert_eq!(collect(&p)[0].1, vec![3, 30]);
    }

    #[test]
    fn stores_functions_locations_and_stacks_once() {
        let mut p = Profile::new(1, Timestamp::default());
        let s1 = [frame("a", 1), frame("b", 2)];
        let s2 = [frame("a", 3), frame("b", 2)];
        for frames in [&s1[..], &s2[..], &s1[..]] {
            p.add(&Sample { frames, omitted_frames: 0, values: &[1], labels: &[] }, 400).unwrap();
        }
        assert_eq!(p.functions.len(), 2, "a and b");
        assert_eq!(p.locations.len(), 3, "a:1, a:3, b:2");
        assert_eq!(p.stack_count(), 2);
        assert_eq!(p.sample_count(), 2);
        // Every string once: "", a, app.rb, b.
        assert_eq!(p.string_count(), 4);
    }

    #[test]
    fn different_labels_are_different_samples() {
        let mut p = Profile::new(1, Timestamp::default());
        let frames = [frame("a", 1)];
        for v in [LabelValue::Str("1"), LabelValue::Num(1), LabelValue::Str("2")] {
            let labels = [Label { key: "k", value: v }];
            p.add(
                &Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &labels },
                10,
            )
            .unwrap();
        }
        assert_eq!(p.sample_count(), 3);
    }

    #[test]
    fn truncates_with_placeholder_counting_omitted_frames() {
        let mut p = Profile::new(1, Timestamp::default());
        let frames: Vec<_> = (0..10).map(|i| frame("f", i)).collect();
        p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &[] }, 4)
            .unwrap();
        // Caller-side truncation counts too: 4 given + 6 already cut = 10 in all.
        p.add(&Sample { frames: &frames[..4], omitted_frames: 6, values: &[1], labels: &[] }, 4)
            .unwrap();
        // Exactly max_frames: kept whole.
        p.add(&Sample { frames: &frames[..4], omitted_frames: 0, values: &[1], labels: &[] }, 4)
            .unwrap();
        let samples = collect(&p);
        assert_eq!(samples.len(), 2, "the two truncated samples aggregate");
        assert_eq!(
            samples[0].0,
            vec!["f:app.rb:0", "f:app.rb:1", "f:app.rb:2", ":7 frames omitted:0"]
        );
        assert_eq!(samples[0].1, vec![2]);
        assert_eq!(samples[1].0.len(), 4);
    }

    #[test]
    fn rejects_invalid_samples_without_recording() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [frame("a", 1)];
        let bad: [(&[i64], &[Label<'_>], RecordError); 4] = [
            (&[1], &[], RecordError::ValuesLength { expected: 2, got: 1 }),
            (&[1, 2], &[Label { key: "", value: LabelValue::Num(1) }], RecordError::EmptyLabelKey),
            (
                &[1, 2],
                &[Label { key: TRACE_ENDPOINT_LABEL, value: LabelValue::Str("x") }],
                RecordError::ReservedLabelKey,
            ),
            (
                &[1, 2],
                &[
                    Label { key: "k", value: LabelValue::Num(1) },
                    Label { key: "k", value: LabelValue::Num(2) },
                ],
                RecordError::DuplicateLabelKey("k".into()),
            ),
        ];
        for (values, labels, err) in bad {
            let sample = Sample { frames: &frames, omitted_frames: 0, values, labels };
            assert_eq!(p.add(&sample, 10), Err(err));
        }
        assert_eq!(p.sample_count(), 0);
        assert_eq!(p.string_count(), 1, "nothing interned");
    }

    #[test]
    fn reset_empties_but_keeps_working() {
        let mut p = Profile::new(1, Timestamp::default());
        let frames = [frame("a", 1)];
        p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &[] }, 10)
            .unwrap();
        p.record_endpoint(SpanId::Num(1), "GET /");
        p.reset(Timestamp { secs: 5, nanos: 0 });
        assert_eq!((p.sample_count(), p.string_count(), p.stack_count()), (0, 1, 0));
        assert_eq!(p.start(), Timestamp { secs: 5, nanos: 0 });
        p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[4], labels: &[] }, 10)
            .unwrap();
        assert_eq!(collect(&p), vec![(vec!["a:app.rb:1".to_string()], vec![4], vec![])]);
    }
}
