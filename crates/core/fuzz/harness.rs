//! The recorder fuzz harness: turns arbitrary bytes into a sequence of recorder operations
//! (add sample, record endpoint, serialize, clear, reset) and checks every profile it gets
//! back against a model kept here, independently of the core's storage.
//!
//! Shared by three drivers, so that all of them check the same properties:
//! - `fuzz_targets/recorder_ops.rs`, the libFuzzer target (`cargo fuzz run recorder_ops`);
//! - `crates/core/tests/fuzz_regressions.rs`, a plain `cargo test` that replays every input
//!   kept in `fuzz/regressions/` and runs a deterministic pseudo-random driver (the fallback
//!   where libFuzzer cannot run);
//! - nothing else: keep it that way, one harness.
//!
//! What is checked after each serialization, with the pprof decoded by prost's generated
//! decoder (not by the streaming encoder that wrote it):
//! - the decoded samples are exactly the model's: same stacks (truncation placeholder
//!   included), same label sets (the `"trace endpoint"` label included), same summed values;
//!   so the per-type totals equal what was added;
//! - the pprof is well formed: `string_table[0] == ""`, dense 1-based ids, one mapping iff
//!   there are samples, every reference in range;
//! - the window's start is the previous window's finish (or the reset time);
//! - stats: `samples_recorded` / `samples_rejected` match the model, `samples_lost` is 0;
//! - after every operation the slots are consistent: exactly the inactive slot is locked.
//!
//! Samples over the profile limits fold into the `"(dropped: profile limits reached)"`
//! sample; the model predicts which ones (it tracks the distinct stacks, strings and label sets
//! the profile holds) and checks `samples_dropped`.
use std::collections::{BTreeMap, HashSet};
use std::io::Read as _;

use ddprof_recorder_core::pprof::PprofProfile;
use ddprof_recorder_core::{
    Compression, Config, Frame, Label, LabelValue, Output, RecordError, Recorder, Sample, SpanId,
    Timestamp, ValueType,
};
use prost::Message as _;

/// Strings the generated frames and labels pick from: short ones collide (aggregation),
/// odd ones (empty, non-ASCII, the replacement character, a reserved key) probe edge cases.
const TEXTS: &[&str] = &[
    "",
    "a",
    "b",
    "main",
    "app.rb",
    "é",
    "\u{fffd}",
    "thread id",
    "local root span id",
    "trace endpoint",
    "12",
    "012",
    "-0",
    "-7",
    "18446744073709551615",
    "9223372036854775807",
    "GET /users",
    "(dropped: profile limits reached)",
];

const LINES: &[i64] = &[0, 1, 2, 42, -1, i64::MAX, i64::MIN];
const NUMS: &[i64] = &[0, 1, 12, -7, i64::MAX, i64::MIN, 9_223_372_036_854_775_807];

pub const DROPPED_FRAME: &str = ddprof_recorder_core::DROPPED_FRAME;

/// Bytes in, values out; zeros once the input is used up.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    fn u8(&mut self) -> u8 {
        self.byte().unwrap_or(0)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[usize::from(self.u8()) % from.len()]
    }

    /// A value small enough that thousands of them cannot overflow an i64 sum.
    fn value(&mut self) -> i64 {
        let raw = i32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()]);
        i64::from(raw)
    }
}

/// A frame as the model stores it.
type ModelFrame = (String, String, i64);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum ModelLabelValue {
    Str(String),
    Num(i64),
}

type ModelLabels = Vec<(String, ModelLabelValue)>;

/// Samples by (stack, sorted labels): summed values.
type ModelSamples = BTreeMap<(Vec<ModelFrame>, ModelLabels), Vec<i64>>;

/// The canonical span key of a `"local root span id"` value, computed here independently of
/// the core: an integer equals the string of its decimal digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum SpanKey {
    Num(i64),
    Str(String),
}

fn span_key_of_str(s: &str) -> SpanKey {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && s != "-0";
    match s.parse::<i64>() {
        Ok(n) if canonical => SpanKey::Num(n),
        _ => SpanKey::Str(s.to_string()),
    }
}

/// The profile limits under test, or `None` for the recorder's defaults.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_stacks: usize,
    pub max_strings: usize,
    pub max_label_sets: usize,
    pub max_samples: usize,
    /// Timed samples (an [`END`] label) kept apart.
    pub max_timed_samples: usize,
}

/// The label key that makes a sample a timed one.
const END: &str = ddprof_recorder_core::END_TIMESTAMP_LABEL;

/// A sample's time, if its labels give it one.
fn time_of(labels: &ModelLabels) -> Option<i64> {
    labels.iter().find(|(k, _)| k == END).and_then(|(_, v)| match v {
        ModelLabelValue::Num(n) => Some(*n),
        ModelLabelValue::Str(_) => None,
    })
}

/// What one window should hold.
#[derive(Default)]
struct Window {
    start: Option<Timestamp>,
    samples: ModelSamples,
    endpoints: BTreeMap<SpanKey, String>,
    /// What the profile has interned, to predict the limits.
    strings: HashSet<String>,
    stacks: HashSet<Vec<ModelFrame>>,
    label_sets: HashSet<ModelLabels>,
    /// Timed samples kept apart (each is one pprof sample; `samples` sums those with the same
    /// stack, labels and time, as `decode` does).
    timed: usize,
}

struct Model {
    num_values: usize,
    max_frames: usize,
    limits: Option<Limits>,
    window: Window,
    recorded: u64,
    rejected: u64,
    dropped: u64,
    endpoints_dropped: u64,
    timestamps_dropped: u64,
    /// Timed samples kept apart, over every window.
    timed_samples: u64,
    windows: u64,
}

impl Model {
    fn reset_window(&mut self, start: Timestamp) {
        self.window = Window { start: Some(start), ..Window::default() };
        self.window.strings.insert(String::new());
    }

    /// The stack the profile stores for `frames` (leaf first) and `omitted` cut frames.
    fn stored_stack(&self, frames: &[ModelFrame], omitted: usize) -> Vec<ModelFrame> {
        let total = frames.len() + omitted;
        // Frames the caller already cut (`omitted`) always show in the placeholder.
        let kept = if total <= self.max_frames {
            frames.len()
        } else {
            frames.len().min(self.max_frames - 1)
        };
        let mut stack = frames[..kept].to_vec();
        if kept < total {
            stack.push((String::new(), format!("{} frames omitted", total - kept), 0));
        }
        stack
    }

    /// Adds an accepted sample, folding it into the placeholder when it does not fit. A timed
    /// one is kept apart while the window has room for it, else aggregated without its time.
    fn add(&mut self, stack: Vec<ModelFrame>, labels: ModelLabels, values: &[i64]) {
        self.recorded += 1;
        let time = time_of(&labels);
        let max_timed =
            self.limits.map_or(ddprof_recorder_core::Limits::DEFAULT.max_timed_samples, |l| {
                l.max_timed_samples
            });
        let timed = time.is_some() && self.window.timed < max_timed;
        let mut labels: ModelLabels = labels.into_iter().filter(|(k, _)| k != END).collect();
        labels.sort();
        let (stack, labels) = if self.fits(&stack, &labels, timed) {
            for (name, file, _) in &stack {
                self.window.strings.insert(name.clone());
                self.window.strings.insert(file.clone());
            }
            for (key, value) in &labels {
                self.window.strings.insert(key.clone());
                if let ModelLabelValue::Str(s) = value {
                    self.window.strings.insert(s.clone());
                }
            }
            self.window.stacks.insert(stack.clone());
            self.window.label_sets.insert(labels.clone());
            match time {
                Some(time) if timed => {
                    self.window.timed += 1;
                    self.timed_samples += 1;
                    labels.push((END.to_string(), ModelLabelValue::Num(time)));
                    labels.sort();
                }
                Some(_) => self.timestamps_dropped += 1,
                None => {}
            }
            (stack, labels)
        } else {
            // The placeholder is stored whatever the limits: at most one more of each.
            self.dropped += 1;
            let stack = vec![(DROPPED_FRAME.to_string(), String::new(), 0)];
            self.window.strings.insert(DROPPED_FRAME.to_string());
            self.window.stacks.insert(stack.clone());
            self.window.label_sets.insert(Vec::new());
            (stack, Vec::new())
        };
        let sums =
            self.window.samples.entry((stack, labels)).or_insert_with(|| vec![0; self.num_values]);
        for (sum, v) in sums.iter_mut().zip(values) {
            *sum += v;
        }
    }

    /// Whether the sample fits the limits (`labels` without its time; `timed`: it needs no
    /// aggregated sample).
    fn fits(&self, stack: &[ModelFrame], labels: &ModelLabels, timed: bool) -> bool {
        let Some(limits) = self.limits else { return true };
        let w = &self.window;
        let mut new_strings = HashSet::new();
        for (name, file, _) in stack {
            new_strings.insert(name.as_str());
            new_strings.insert(file.as_str());
        }
        for (key, value) in labels {
            new_strings.insert(key.as_str());
            if let ModelLabelValue::Str(s) = value {
                new_strings.insert(s.as_str());
            }
        }
        new_strings.retain(|s| !w.strings.contains(*s));
        let new_stack = usize::from(!w.stacks.contains(stack));
        let new_label_set = usize::from(!w.label_sets.contains(labels));
        let new_sample =
            usize::from(!timed && !w.samples.contains_key(&(stack.to_vec(), labels.clone())));
        let aggregated = w.samples.keys().filter(|(_, labels)| time_of(labels).is_none()).count();
        let room = |len: usize, new: usize, max: usize| new == 0 || len + new <= max;
        room(w.strings.len(), new_strings.len(), limits.max_strings)
            && room(w.stacks.len(), new_stack, limits.max_stacks)
            && room(w.label_sets.len(), new_label_set, limits.max_label_sets)
            && room(aggregated, new_sample, limits.max_samples)
    }

    /// Links `span` to `endpoint`, unless that needs more strings or endpoints than the limits
    /// allow (at most `max_label_sets` endpoints): then it is dropped and counted.
    fn record_endpoint(&mut self, span: SpanKey, endpoint: &str) {
        let w = &mut self.window;
        let mut new_strings: HashSet<&str> = HashSet::from([endpoint]);
        if let SpanKey::Str(s) = &span {
            new_strings.insert(s);
        }
        new_strings.retain(|s| !w.strings.contains(*s));
        if let Some(limits) = self.limits {
            let new_key = usize::from(!w.endpoints.contains_key(&span));
            let room = |len: usize, new: usize, max: usize| new == 0 || len + new <= max;
            if !room(w.strings.len(), new_strings.len(), limits.max_strings)
                || !room(w.endpoints.len(), new_key, limits.max_label_sets)
            {
                self.endpoints_dropped += 1;
                return;
            }
        }
        let new_strings: Vec<String> = new_strings.into_iter().map(str::to_string).collect();
        w.strings.extend(new_strings);
        w.endpoints.insert(span, endpoint.to_string());
    }

    /// The samples the pprof should hold, with `"trace endpoint"` labels resolved.
    fn expected(&self) -> ModelSamples {
        let mut out = BTreeMap::new();
        for ((stack, labels), values) in &self.window.samples {
            let mut labels = labels.clone();
            let span =
                labels.iter().find(|(k, _)| k == "local root span id").map(|(_, v)| match v {
                    ModelLabelValue::Num(n) => SpanKey::Num(*n),
                    ModelLabelValue::Str(s) => span_key_of_str(s),
                });
            if let Some(endpoint) = span.and_then(|span| self.window.endpoints.get(&span)) {
                labels.push(("trace endpoint".to_string(), ModelLabelValue::Str(endpoint.clone())));
                labels.sort();
            }
            out.insert((stack.clone(), labels), values.clone());
        }
        out
    }
}

/// Decodes a pprof, checks its structure and returns its samples resolved to strings.
fn decode(bytes: &[u8], gzip: bool, value_types: &[ValueType]) -> (PprofProfile, ModelSamples) {
    let raw = if gzip {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut raw).expect("gzip stream");
        raw
    } else {
        bytes.to_vec()
    };
    let p = PprofProfile::decode(raw.as_slice()).expect("pprof decodes");
    let strings = &p.string_table;
    assert_eq!(strings.first().map(String::as_str), Some(""), "string_table[0] is \"\"");
    assert_eq!(strings.iter().collect::<HashSet<_>>().len(), strings.len(), "every string once");
    let s = |i: i64| -> String {
        let i = usize::try_from(i).expect("string index >= 0");
        strings.get(i).expect("string index in range").clone()
    };
    let types: Vec<(String, String)> =
        p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
    let want: Vec<(String, String)> =
        value_types.iter().map(|v| (v.r#type.clone(), v.unit.clone())).collect();
    assert_eq!(types, want, "sample_type in value_types order");
    assert_eq!(p.mapping.len(), usize::from(!p.sample.is_empty()), "one mapping iff samples");
    for (i, f) in p.function.iter().enumerate() {
        assert_eq!(f.id, i as u64 + 1, "dense function ids");
        assert_eq!(f.name, f.system_name);
    }
    for (i, l) in p.location.iter().enumerate() {
        assert_eq!(l.id, i as u64 + 1, "dense location ids");
        assert_eq!(l.mapping_id, 1);
        assert_eq!(l.line.len(), 1);
        let fid = l.line[0].function_id;
        assert!(fid >= 1 && fid as usize <= p.function.len(), "function id in range");
    }
    let mut samples = BTreeMap::new();
    for sample in &p.sample {
        assert_eq!(sample.value.len(), value_types.len());
        let frames: Vec<ModelFrame> = sample
            .location_id
            .iter()
            .map(|&id| {
                assert!(id >= 1 && id as usize <= p.location.len(), "location id in range");
                let loc = &p.location[id as usize - 1];
                let f = &p.function[loc.line[0].function_id as usize - 1];
                (s(f.name), s(f.filename), loc.line[0].line)
            })
            .collect();
        let mut labels: ModelLabels = sample
            .label
            .iter()
            .map(|l| {
                let value = if l.str != 0 {
                    assert_eq!(l.num, 0);
                    ModelLabelValue::Str(s(l.str))
                } else {
                    ModelLabelValue::Num(l.num)
                };
                (s(l.key), value)
            })
            .collect();
        labels.sort();
        match samples.entry((frames, labels)) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(sample.value.clone());
            }
            std::collections::btree_map::Entry::Occupied(mut e) => {
                // Only a string label `""` (encoded `str: 0`) and a numeric label 0 read back
                // alike: the recorder rightly keeps them apart, pprof cannot tell them apart.
                // Timed samples are kept apart whatever their time. Any other repeat means the
                // recorder failed to aggregate.
                assert!(
                    e.key().1.iter().any(|(k, v)| *v == ModelLabelValue::Num(0) || k == END),
                    "samples with one stack and label set are aggregated"
                );
                for (sum, v) in e.get_mut().iter_mut().zip(&sample.value) {
                    *sum += v;
                }
            }
        }
    }
    (p, samples)
}

/// A string label with value `""` is encoded as `str: 0`, which reads back as the number 0:
/// pprof cannot tell them apart, so the model compares them the same way.
fn normalize(samples: ModelSamples) -> BTreeMap<(Vec<ModelFrame>, ModelLabels), Vec<i64>> {
    let mut out: BTreeMap<(Vec<ModelFrame>, ModelLabels), Vec<i64>> = BTreeMap::new();
    for ((frames, labels), values) in samples {
        let mut labels: ModelLabels = labels
            .into_iter()
            .map(|(k, v)| match v {
                ModelLabelValue::Str(s) if s.is_empty() => (k, ModelLabelValue::Num(0)),
                v => (k, v),
            })
            .collect();
        labels.sort();
        let sums = out.entry((frames, labels)).or_insert_with(|| vec![0; values.len()]);
        for (sum, v) in sums.iter_mut().zip(values) {
            *sum += v;
        }
    }
    out
}

fn check_slots(r: &Recorder) {
    let active = r.active_slot();
    assert!(active == 1 || active == 2);
    assert!(!r.slot_is_locked(active), "the active slot is free");
    assert!(r.slot_is_locked(3 - active), "the inactive slot is held");
}

fn check_stats(r: &Recorder, m: &Model) {
    let s = r.stats();
    assert_eq!(s.samples_recorded, m.recorded, "samples_recorded");
    assert_eq!(s.samples_rejected, m.rejected, "samples_rejected");
    assert_eq!(s.samples_dropped, m.dropped, "samples_dropped");
    assert_eq!(s.endpoints_dropped, m.endpoints_dropped, "endpoints_dropped");
    assert_eq!(s.timestamps_dropped, m.timestamps_dropped, "timestamps_dropped");
    assert_eq!(s.samples_lost, 0, "samples_lost");
}

/// Builds the recorder an input asks for. Returns it with its model.
fn setup(input: &mut Input<'_>) -> (Recorder, Model, Vec<ValueType>) {
    let num_values = 1 + usize::from(input.u8() % 4);
    let value_types: Vec<ValueType> =
        (0..num_values).map(|i| ValueType::new(format!("type{i}"), "count")).collect();
    let max_frames = 2 + usize::from(input.u8() % 7);
    let limits = match input.u8() % 4 {
        0 => Some(Limits {
            max_stacks: 1 + usize::from(input.u8() % 8),
            max_strings: 1 + usize::from(input.u8() % 24),
            max_label_sets: 1 + usize::from(input.u8() % 8),
            max_samples: 1 + usize::from(input.u8() % 12),
            max_timed_samples: 0,
        })
        .map(|l| Limits { max_timed_samples: l.max_samples, ..l }),
        _ => None,
    };
    let config = Config::new(value_types.clone(), max_frames).expect("valid config");
    let config = with_limits(config, limits);
    let start = Timestamp::now();
    let recorder = Recorder::new(config, start);
    let mut model = Model {
        num_values,
        max_frames,
        limits,
        window: Window::default(),
        recorded: 0,
        rejected: 0,
        dropped: 0,
        endpoints_dropped: 0,
        timestamps_dropped: 0,
        timed_samples: 0,
        windows: 0,
    };
    model.reset_window(start);
    (recorder, model, value_types)
}

/// Applies `limits` to `config` (the default limits when `None`).
fn with_limits(config: Config, limits: Option<Limits>) -> Config {
    match limits {
        None => config,
        Some(l) => config
            .with_limits(ddprof_recorder_core::Limits {
                max_stacks: l.max_stacks,
                max_strings: l.max_strings,
                max_label_sets: l.max_label_sets,
                max_samples: l.max_samples,
                max_timed_samples: l.max_timed_samples,
            })
            .expect("valid limits"),
    }
}

fn add_sample(input: &mut Input<'_>, r: &Recorder, m: &mut Model) {
    let frame_count = usize::from(input.u8() % 12);
    let frames: Vec<ModelFrame> = (0..frame_count)
        .map(|_| (input.pick(TEXTS).to_string(), input.pick(TEXTS).to_string(), input.pick(LINES)))
        .collect();
    let omitted = usize::from(input.u8() % 4).saturating_sub(2);
    let label_count = usize::from(input.u8() % 5);
    let labels: ModelLabels = (0..label_count)
        .map(|_| {
            let key = input.pick(TEXTS).to_string();
            let choice = input.u8();
            let value = if choice.is_multiple_of(2) {
                ModelLabelValue::Str(input.pick(TEXTS).to_string())
            } else {
                ModelLabelValue::Num(input.pick(NUMS))
            };
            // One label in four is a time: a string or a negative one is rejected. From the
            // value's byte, so that the inputs kept in fuzz/regressions/ read as they did
            // otherwise.
            let key = if choice % 8 >= 6 { END.to_string() } else { key };
            (key, value)
        })
        .collect();
    // Mostly the right number of values; sometimes one too many or too few.
    let value_count = match input.u8() % 16 {
        0 => m.num_values + 1,
        1 => m.num_values - 1,
        _ => m.num_values,
    };
    let values: Vec<i64> = (0..value_count).map(|_| input.value()).collect();

    let sample_frames: Vec<Frame<'_>> = frames
        .iter()
        .map(|(name, file, line)| Frame { function_name: name, filename: file, line: *line })
        .collect();
    let sample_labels: Vec<Label<'_>> = labels
        .iter()
        .map(|(key, value)| Label {
            key,
            value: match value {
                ModelLabelValue::Str(s) => LabelValue::Str(s),
                ModelLabelValue::Num(n) => LabelValue::Num(*n),
            },
        })
        .collect();
    let sample = Sample {
        frames: &sample_frames,
        omitted_frames: omitted,
        values: &values,
        labels: &sample_labels,
    };
    let expected_error = if value_count != m.num_values {
        Some(RecordError::ValuesLength { expected: m.num_values, got: value_count })
    } else {
        labels.iter().enumerate().find_map(|(i, (key, _))| {
            if key.is_empty() {
                Some(RecordError::EmptyLabelKey)
            } else if key == "trace endpoint" {
                Some(RecordError::ReservedLabelKey)
            } else if key == END && !matches!(labels[i].1, ModelLabelValue::Num(n) if n >= 0) {
                Some(RecordError::BadEndTimestamp)
            } else if labels[..i].iter().any(|(other, _)| other == key) {
                Some(RecordError::DuplicateLabelKey(key.clone()))
            } else {
                None
            }
        })
    };
    let result = r.record_sample(&sample);
    match expected_error {
        Some(e) => {
            assert_eq!(result, Err(e));
            m.rejected += 1;
        }
        None => {
            assert_eq!(result, Ok(()));
            let stack = m.stored_stack(&frames, omitted);
            m.add(stack, labels, &values);
        }
    }
}

fn record_endpoint(input: &mut Input<'_>, r: &Recorder, m: &mut Model) {
    let endpoint = input.pick(TEXTS);
    let (span, key) = if input.u8().is_multiple_of(2) {
        let n = input.pick(NUMS);
        (SpanId::Num(n), SpanKey::Num(n))
    } else {
        let s = input.pick(TEXTS);
        (SpanId::Str(s), span_key_of_str(s))
    };
    assert_eq!(r.record_endpoint(span, endpoint), Ok(()));
    m.record_endpoint(key, endpoint);
}

/// Serializes (or clears) and checks the window against the model.
fn finish_window(
    input: &mut Input<'_>,
    r: &Recorder,
    m: &mut Model,
    value_types: &[ValueType],
    clear: bool,
) {
    let gzip = input.u8() % 2 == 1;
    let finish = Timestamp::now();
    let pending = r.start_next_profile(finish).expect("one serializer");
    let output = match (clear, gzip) {
        (true, _) => Output::Discard,
        (false, true) => Output::Pprof(Compression::Gzip),
        (false, false) => Output::Pprof(Compression::None),
    };
    let serialized = pending.flip(output).expect("serializes");
    let start = m.window.start.expect("window started");
    assert_eq!(serialized.start, start, "each window starts where the previous ended");
    assert_eq!(serialized.finish, finish);
    if clear {
        assert!(serialized.bytes.is_empty());
    } else {
        let (p, samples) = decode(&serialized.bytes, gzip, value_types);
        let start_ns = i128::from(start.secs) * 1_000_000_000 + i128::from(start.nanos);
        let finish_ns = i128::from(finish.secs) * 1_000_000_000 + i128::from(finish.nanos);
        assert_eq!(i128::from(p.time_nanos), start_ns);
        assert_eq!(i128::from(p.duration_nanos), finish_ns - start_ns);
        assert_eq!(normalize(samples), normalize(m.expected()), "samples equal the model's");
    }
    m.windows += 1;
    m.reset_window(finish);
}

/// What one input did, for the drivers' summaries (the libFuzzer target reads none of it).
#[derive(Debug, Default, Clone, Copy)]
#[allow(dead_code)] // read by the tests' driver, not by the libFuzzer target
pub struct Summary {
    pub samples_recorded: u64,
    pub samples_rejected: u64,
    pub samples_dropped: u64,
    pub endpoints_dropped: u64,
    pub timestamps_dropped: u64,
    pub timed_samples: u64,
    pub windows_checked: u64,
}

/// Runs one input. Panics (the fuzzer's crash) if any property fails.
pub fn run(data: &[u8]) -> Summary {
    let mut input = Input { data };
    let (mut recorder, mut model, value_types) = setup(&mut input);
    while let Some(op) = input.byte() {
        match op % 16 {
            0..=8 => add_sample(&mut input, &recorder, &mut model),
            9 | 10 => record_endpoint(&mut input, &recorder, &mut model),
            11 | 12 => finish_window(&mut input, &recorder, &mut model, &value_types, false),
            13 => finish_window(&mut input, &recorder, &mut model, &value_types, true),
            14 => {
                // A serialization abandoned after its first step: nothing flips.
                drop(recorder.start_next_profile(Timestamp::now()).expect("one serializer"));
            }
            _ => {
                // The by-hand reset (a fork's is `Recorder::after_fork`, which keeps a recorder
                // it cannot drop: not for a fuzzer that runs millions of inputs in a process).
                let now = Timestamp::now();
                recorder = recorder.renewed(now);
                assert_eq!(recorder.active_slot(), 1);
                model.reset_window(now);
            }
        }
        check_slots(&recorder);
        check_stats(&recorder, &model);
    }
    finish_window(&mut input, &recorder, &mut model, &value_types, false);
    check_slots(&recorder);
    check_stats(&recorder, &model);
    Summary {
        samples_recorded: model.recorded,
        samples_rejected: model.rejected,
        samples_dropped: model.dropped,
        endpoints_dropped: model.endpoints_dropped,
        timestamps_dropped: model.timestamps_dropped,
        timed_samples: model.timed_samples,
        windows_checked: model.windows,
    }
}
