//! One profile's storage. Strings, functions, locations, labels, stacks and label sets are each
//! stored once and named by dense ids; samples are aggregated by (stack, label set) with their
//! values summed. Every lookup is one hash probe in a table of ids, so the cost of adding a
//! sample depends on its size, not on how many samples the profile already holds.
//!
//! Stacks are kept as the bytes pprof wants for `Sample.location_id`: the packed varints of
//! their location ids (+1, pprof ids are 1-based). Location ids of a medium profile take two
//! bytes rather than a `u32`'s four, so stacks, the bulk of a profile, take half the memory,
//! and encoding a sample copies its stack instead of encoding ~60 varints. Measured on the
//! medium workload (bench/RESULTS.md), together with label sets stored as label ids and the
//! sample index as a table of ids: serialize raw 74 -> 46 ms (min, same run, under load),
//! peak heap while adding 25.2 -> 13.0 MB.
use std::fmt::Write as _;

use hashbrown::{HashMap, HashTable};
use rustc_hash::FxBuildHasher;

use crate::error::RecordError;
use crate::hash::{bytes_eq, fx_hash, hash_bytes, hash_frame as hash_frame_bytes, hash_u32s};
use crate::sample::{Frame, Label, LabelValue, Sample, SpanId};
use crate::strings::{StringId, StringTable};
use crate::time::Timestamp;
use crate::{DROPPED_FRAME, LOCAL_ROOT_SPAN_ID_LABEL, TRACE_ENDPOINT_LABEL};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Function {
    pub name: StringId,
    pub filename: StringId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    /// Index into `Profile::functions`.
    pub function: u32,
    pub line: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum StoredValue {
    Str(StringId),
    Num(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StoredLabel {
    pub key: StringId,
    pub value: StoredValue,
}

/// A span id as an endpoint key: numbers by value, other strings by their interned id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SpanKey {
    Num(i64),
    Str(StringId),
}

/// Slices of a shared arena, interned: entry `id` is `items[ends[id - 1]..ends[id]]`.
#[derive(Debug)]
struct Arena<T> {
    items: Vec<T>,
    ends: Vec<usize>,
    index: HashTable<u32>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Self { items: Vec::new(), ends: Vec::new(), index: HashTable::new() }
    }
}

impl<T: Copy + Eq> Arena<T> {
    #[inline]
    fn range(ends: &[usize], id: u32) -> std::ops::Range<usize> {
        let id = id as usize;
        let start = if id == 0 { 0 } else { ends[id - 1] };
        start..ends[id]
    }

    fn get(&self, id: u32) -> &[T] {
        &self.items[Self::range(&self.ends, id)]
    }

    /// The id of `slice`, if it was interned.
    fn find(&self, slice: &[T], hash: impl Fn(&[T]) -> u64) -> Option<u32> {
        let (items, ends) = (&self.items, &self.ends);
        self.index.find(hash(slice), |&id| items[Self::range(ends, id)] == *slice).copied()
    }

    fn intern(&mut self, slice: &[T], hash: impl Fn(&[T]) -> u64) -> u32 {
        let h = hash(slice);
        let (items, ends) = (&self.items, &self.ends);
        if let Some(&id) = self.index.find(h, |&id| items[Self::range(ends, id)] == *slice) {
            return id;
        }
        let id = self.ends.len() as u32;
        self.items.extend_from_slice(slice);
        self.ends.push(self.items.len());
        let (items, ends) = (&self.items, &self.ends);
        self.index.insert_unique(h, id, |&id| hash(&items[Self::range(ends, id)]));
        id
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn clear(&mut self) {
        self.items.clear();
        self.ends.clear();
        self.index.clear();
    }

    fn heap_bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<T>()
            + self.ends.capacity() * std::mem::size_of::<usize>()
            + self.index.allocation_size()
    }
}

/// Appends `v` as a protobuf varint.
#[inline]
pub(crate) fn push_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Reads the varints of an encoded stack back (for callers that want location ids).
fn decode_varints(mut bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
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

fn hash_label(label: &StoredLabel) -> u64 {
    fx_hash(label)
}

fn hash_sample(key: (u32, u32)) -> u64 {
    fx_hash(&key)
}

#[inline]
fn hash_frame(function_name: &str, filename: &str, line: i64) -> u64 {
    hash_frame_bytes(function_name.as_bytes(), filename.as_bytes(), line)
}

/// A `location_index` entry: the frame a location was made from, as byte ranges of its
/// strings in the string table's buffer. A lookup compares the caller's strings with those
/// bytes directly; going through the location, its function and two string ids instead cost
/// three more dependent loads per frame.
#[derive(Debug, Clone, Copy)]
struct FrameEntry {
    name: (usize, usize),
    filename: (usize, usize),
    line: i64,
    location: u32,
}

/// Per-profile bounds on distinct content: what bounds a profile's memory. A sample that would
/// need more folds into the [`DROPPED_FRAME`] placeholder sample instead (its values are kept,
/// so totals stay exact); an endpoint that would need more is dropped. What a sample needs
/// that the profile already holds is always reused. The placeholder itself is stored whatever
/// the limits (it may add one string, stack, label set and sample past them), and once stored
/// counts toward them like any other entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Distinct stacks.
    pub max_stacks: usize,
    /// Distinct strings (function names, filenames, label keys and values, endpoints).
    pub max_strings: usize,
    /// Distinct label sets; also the most endpoints a profile keeps.
    pub max_label_sets: usize,
    /// Distinct (stack, label set) pairs: the samples of the pprof.
    pub max_samples: usize,
}

impl Limits {
    /// Largest accepted value of any limit: ids are `u32`s.
    pub const MAX: usize = u32::MAX as usize - 16;

    /// Generous enough that the large workload of bench/gen_workload.rb (2M samples: 124k
    /// stacks, 35k strings, 859k label sets) is never folded; at these bounds a profile of
    /// 60-frame stacks holds on the order of 500 MB.
    pub const DEFAULT: Limits = Limits {
        max_stacks: 1_000_000,
        max_strings: 1_000_000,
        max_label_sets: 1_000_000,
        max_samples: 4_000_000,
    };

    /// Checks every limit is in `1..=Limits::MAX`.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        for (name, value) in [
            ("max_stacks", self.max_stacks),
            ("max_strings", self.max_strings),
            ("max_label_sets", self.max_label_sets),
            ("max_samples", self.max_samples),
        ] {
            if !(1..=Self::MAX).contains(&value) {
                return Err(crate::ConfigError::Limit { name, value });
            }
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
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
    /// Stacks as packed varints of their location ids + 1 (see the module docs).
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
    /// was over the [`Limits`] and folded into the [`DROPPED_FRAME`] placeholder.
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
        let worst_strings = 2 * (kept + 1) + 2 * sample.labels.len();
        let limits = &self.limits;
        let surely_fits = self.strings.len() + worst_strings <= limits.max_strings
            && self.stacks.len() < limits.max_stacks
            && self.label_sets.len() < limits.max_label_sets
            && self.samples.len() < limits.max_samples;
        if !surely_fits && !self.fits(sample, kept, total) {
            self.add_dropped(sample.values);
            return false;
        }
        let mut stack = std::mem::take(&mut self.scratch_stack);
        stack.clear();
        for frame in &sample.frames[..kept] {
            let location = self.intern_frame(frame.function_name, frame.filename, frame.line);
            push_varint(&mut stack, u64::from(location) + 1);
        }
        if kept < total {
            let mut name = std::mem::take(&mut self.scratch_string);
            name.clear();
            // Writing to a String cannot fail.
            let _ = write!(name, "{} frames omitted", total - kept);
            let location = self.intern_frame("", &name, 0);
            push_varint(&mut stack, u64::from(location) + 1);
            self.scratch_string = name;
        }
        let stack_id = self.stacks.intern(&stack, hash_bytes);
        self.scratch_stack = stack;

        let label_set = self.intern_labels(sample.labels);
        self.add_values(stack_id, label_set, sample.values);
        self.samples_added += 1;
        true
    }

    /// Folds a sample's values into the placeholder sample: one [`DROPPED_FRAME`] frame, no
    /// labels. Stored whatever the limits (at most one more of each kind).
    #[cold]
    fn add_dropped(&mut self, values: &[i64]) {
        // Not through `intern_frame`: a second call site changed how the hot loop's copy is
        // optimized. Callgrind, `bench/run core small --only core-add`: 255.0M instructions
        // before limits, 280.7M with this call, 256.9M without it (2026-11-30).
        let location = match self.find_frame(DROPPED_FRAME, "", 0) {
            Some(location) => location,
            None => self.add_frame(hash_frame(DROPPED_FRAME, "", 0), DROPPED_FRAME, "", 0),
        };
        let mut stack = std::mem::take(&mut self.scratch_stack);
        stack.clear();
        push_varint(&mut stack, u64::from(location) + 1);
        let stack_id = self.stacks.intern(&stack, hash_bytes);
        self.scratch_stack = stack;
        let label_set = self.intern_labels(&[]);
        self.add_values(stack_id, label_set, values);
        self.samples_added += 1;
        self.samples_dropped += 1;
    }

    /// The exact limit check, for a profile near a limit: whether storing the sample (its `kept`
    /// frames of `total`) stays within every limit. Looks everything up, changes nothing.
    #[cold]
    #[inline(never)]
    fn fits(&self, sample: &Sample<'_>, kept: usize, total: usize) -> bool {
        // New strings, each once (a slow path: allocating is fine).
        let note = |s: &str, owned: &mut Vec<String>| {
            if self.strings.lookup(s).is_none() && !owned.iter().any(|n| n == s) {
                owned.push(s.to_owned());
            }
        };
        let mut owned: Vec<String> = Vec::new();
        let mut stack = Vec::new();
        let mut new_stack = false;
        let placeholder = (kept < total).then(|| format!("{} frames omitted", total - kept));
        let frames = sample.frames[..kept]
            .iter()
            .map(|f| (f.function_name, f.filename, f.line))
            .chain(placeholder.as_deref().map(|name| ("", name, 0)));
        for (name, filename, line) in frames {
            match self.find_frame(name, filename, line) {
                Some(location) => push_varint(&mut stack, u64::from(location) + 1),
                None => {
                    new_stack = true;
                    note(name, &mut owned);
                    note(filename, &mut owned);
                }
            }
        }
        let stack_id = if new_stack { None } else { self.stacks.find(&stack, hash_bytes) };
        let mut ids = Vec::with_capacity(sample.labels.len());
        let mut new_set = false;
        for label in sample.labels {
            let key = self.strings.lookup(label.key);
            if key.is_none() {
                note(label.key, &mut owned);
            }
            let value = match label.value {
                LabelValue::Num(n) => Some(StoredValue::Num(n)),
                LabelValue::Str(v) => {
                    let id = self.strings.lookup(v);
                    if id.is_none() {
                        note(v, &mut owned);
                    }
                    id.map(StoredValue::Str)
                }
            };
            match (key, value) {
                (Some(key), Some(value)) => match self.find_label(StoredLabel { key, value }) {
                    Some(id) => ids.push(id),
                    None => new_set = true,
                },
                _ => new_set = true,
            }
        }
        let set_id = if new_set {
            None
        } else {
            ids.sort_unstable();
            self.label_sets.find(&ids, hash_u32s)
        };
        let new_sample = match (stack_id, set_id) {
            (Some(stack), Some(set)) => self.find_sample((stack, set)).is_none(),
            _ => true,
        };
        let limits = &self.limits;
        // What the sample needs anew must fit; what exists is always reused (a profile at a
        // limit still aggregates samples it already holds).
        let room = |len: usize, new: usize, max: usize| new == 0 || len + new <= max;
        room(self.strings.len(), owned.len(), limits.max_strings)
            && room(self.stacks.len(), usize::from(stack_id.is_none()), limits.max_stacks)
            && room(self.label_sets.len(), usize::from(set_id.is_none()), limits.max_label_sets)
            && room(self.samples.len(), usize::from(new_sample), limits.max_samples)
    }

    /// Samples folded into the placeholder since the last reset.
    pub fn samples_dropped(&self) -> u64 {
        self.samples_dropped
    }

    fn find_sample(&self, key: (u32, u32)) -> Option<u32> {
        let samples = &self.samples;
        self.sample_index.find(hash_sample(key), |&id| samples[id as usize] == key).copied()
    }

    fn find_label(&self, label: StoredLabel) -> Option<u32> {
        let labels = &self.labels;
        self.label_index.find(hash_label(&label), |&id| labels[id as usize] == label).copied()
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

    /// The location of a frame: one probe that compares the caller's strings with the stored
    /// bytes. Small enough to inline into the per-frame loop; adding a new frame is out of line.
    #[inline]
    fn intern_frame(&mut self, function_name: &str, filename: &str, line: i64) -> u32 {
        let hash = hash_frame(function_name, filename, line);
        let bytes = self.strings.bytes();
        let found = self.location_index.find(hash, |e| {
            e.line == line
                && bytes_eq(&bytes[e.name.0..e.name.1], function_name.as_bytes())
                && bytes_eq(&bytes[e.filename.0..e.filename.1], filename.as_bytes())
        });
        match found {
            Some(e) => e.location,
            None => self.add_frame(hash, function_name, filename, line),
        }
    }

    /// [`Profile::intern_frame`]'s lookup alone, for the exact limit check and the placeholder.
    /// Written twice on purpose: with one `#[inline(always)]` lookup shared by both, the hot
    /// loop compiled worse (callgrind, `bench/run core small --only core-add`: 256.9M
    /// instructions as is, 281.3M shared; 2026-11-30).
    fn find_frame(&self, function_name: &str, filename: &str, line: i64) -> Option<u32> {
        let hash = hash_frame(function_name, filename, line);
        let bytes = self.strings.bytes();
        self.location_index
            .find(hash, |e| {
                e.line == line
                    && bytes_eq(&bytes[e.name.0..e.name.1], function_name.as_bytes())
                    && bytes_eq(&bytes[e.filename.0..e.filename.1], filename.as_bytes())
            })
            .map(|e| e.location)
    }

    #[cold]
    #[inline(never)]
    fn add_frame(&mut self, hash: u64, function_name: &str, filename: &str, line: i64) -> u32 {
        let function = self.intern_function(function_name, filename);
        let location = self.locations.len() as u32;
        self.locations.push(Location { function, line });
        let Function { name, filename } = self.functions[function as usize];
        let entry = FrameEntry {
            name: self.strings.span(name),
            filename: self.strings.span(filename),
            line,
            location,
        };
        let bytes = self.strings.bytes();
        self.location_index.insert_unique(hash, entry, |e| {
            hash_frame_bytes(&bytes[e.name.0..e.name.1], &bytes[e.filename.0..e.filename.1], e.line)
        });
        location
    }

    fn intern_function(&mut self, name: &str, filename: &str) -> u32 {
        let function =
            Function { name: self.strings.intern(name), filename: self.strings.intern(filename) };
        let hash = hash_function(function);
        let functions = &self.functions;
        if let Some(&id) = self.function_index.find(hash, |&id| functions[id as usize] == function)
        {
            return id;
        }
        let id = self.functions.len() as u32;
        self.functions.push(function);
        let functions = &self.functions;
        self.function_index.insert_unique(hash, id, |&id| hash_function(functions[id as usize]));
        id
    }

    fn intern_labels(&mut self, labels: &[Label<'_>]) -> u32 {
        let mut ids = std::mem::take(&mut self.scratch_labels);
        ids.clear();
        for label in labels {
            let value = match label.value {
                LabelValue::Str(s) => StoredValue::Str(self.strings.intern(s)),
                LabelValue::Num(n) => StoredValue::Num(n),
            };
            let label = StoredLabel { key: self.strings.intern(label.key), value };
            ids.push(self.intern_label(label));
        }
        // Keys are unique (validated), so a set of labels is a set of label ids: sorted, the
        // same pairs in any order are the same slice.
        ids.sort_unstable();
        let id = self.label_sets.intern(&ids, hash_u32s);
        self.scratch_labels = ids;
        id
    }

    fn intern_label(&mut self, label: StoredLabel) -> u32 {
        let hash = hash_label(&label);
        let labels = &self.labels;
        if let Some(&id) = self.label_index.find(hash, |&id| labels[id as usize] == label) {
            return id;
        }
        let id = self.labels.len() as u32;
        self.labels.push(label);
        let labels = &self.labels;
        self.label_index.insert_unique(hash, id, |&id| hash_label(&labels[id as usize]));
        id
    }

    /// Stack `id` as the packed varints of its location ids + 1: `Sample.location_id`'s bytes.
    pub(crate) fn stack_bytes(&self, id: u32) -> &[u8] {
        self.stacks.get(id)
    }

    /// Label set `id` as ids into [`Profile::labels`].
    pub(crate) fn label_set(&self, id: u32) -> &[u32] {
        self.label_sets.get(id)
    }

    /// Links samples whose `"local root span id"` label is `span` to `endpoint`; the latest
    /// call for a span wins. Returns false, storing nothing, when that needs more strings than
    /// `max_strings` or more endpoints than `max_label_sets` (see [`Limits`]).
    pub fn record_endpoint(&mut self, span: SpanId<'_>, endpoint: &str) -> bool {
        let limits = &self.limits;
        let surely_fits = self.strings.len() + 2 <= limits.max_strings
            && self.endpoints.len() < limits.max_label_sets;
        if !surely_fits && !self.endpoint_fits(span, endpoint) {
            return false;
        }
        let key = match span.canonical() {
            SpanId::Num(n) => SpanKey::Num(n),
            SpanId::Str(s) => SpanKey::Str(self.strings.intern(s)),
        };
        let endpoint = self.strings.intern(endpoint);
        self.endpoints.insert(key, endpoint);
        true
    }

    #[cold]
    fn endpoint_fits(&self, span: SpanId<'_>, endpoint: &str) -> bool {
        // A span string not interned yet cannot be a key yet.
        let (key, span_str) = match span.canonical() {
            SpanId::Num(n) => (Some(SpanKey::Num(n)), None),
            SpanId::Str(s) => (self.strings.lookup(s).map(SpanKey::Str), Some(s)),
        };
        let new_key = key.is_none_or(|key| !self.endpoints.contains_key(&key));
        let mut new_strings = usize::from(self.strings.lookup(endpoint).is_none());
        if let Some(s) = span_str {
            new_strings += usize::from(self.strings.lookup(s).is_none() && s != endpoint);
        }
        (new_strings == 0 || self.strings.len() + new_strings <= self.limits.max_strings)
            && (!new_key || self.endpoints.len() < self.limits.max_label_sets)
    }

    /// The endpoint of each label set, by label set id, and the string id of the
    /// `"trace endpoint"` key (None when no label set has an endpoint). Interns the key.
    pub(crate) fn resolve_endpoints(&mut self) -> (Vec<Option<StringId>>, Option<StringId>) {
        let span_key = match self.strings.lookup(LOCAL_ROOT_SPAN_ID_LABEL) {
            Some(id) if !self.endpoints.is_empty() => id,
            _ => return (Vec::new(), None),
        };
        let resolved: Vec<Option<StringId>> = (0..self.label_sets.len() as u32)
            .map(|set| {
                let label = self
                    .label_set(set)
                    .iter()
                    .map(|&l| self.labels[l as usize])
                    .find(|l| l.key == span_key)?;
                let key = match label.value {
                    StoredValue::Num(n) => SpanKey::Num(n),
                    StoredValue::Str(id) => match SpanId::from_str(self.strings.get(id)) {
                        SpanId::Num(n) => SpanKey::Num(n),
                        SpanId::Str(_) => SpanKey::Str(id),
                    },
                };
                self.endpoints.get(&key).copied()
            })
            .collect();
        if resolved.iter().all(Option::is_none) {
            return (Vec::new(), None);
        }
        (resolved, Some(self.strings.intern(TRACE_ENDPOINT_LABEL)))
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
            + self.endpoints.allocation_size()
            + self.scratch_stack.capacity()
            + self.scratch_labels.capacity() * 4
            + self.scratch_string.capacity()
    }

    /// Iterates samples as `(frames leaf first, values, labels)`, resolved to strings; for
    /// callers that want the data without pprof (tests, folded stacks).
    pub fn for_each_sample(&self, mut f: impl FnMut(&[Frame<'_>], &[i64], &[Label<'_>])) {
        let mut frames = Vec::new();
        let mut labels = Vec::new();
        for (i, &(stack, set)) in self.samples.iter().enumerate() {
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
            let values = &self.values[i * self.num_values..(i + 1) * self.num_values];
            f(&frames, values, &labels);
        }
    }
}

fn hash_function(function: Function) -> u64 {
    fx_hash(&(function.name, function.filename))
}

#[cfg(test)]
mod tests {
    use super::*;

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
