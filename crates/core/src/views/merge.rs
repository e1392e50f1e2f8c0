//! Merging pprof profiles into one: the profiles of the processes of a forking server, or the
//! windows of one process, seen as a whole.
//!
//! Every input is decoded (raw or gzip, ours or another tool's) and copied into one new
//! profile with its own string table and ids: strings, mappings, functions and locations that
//! are equal in several inputs are stored once, and samples with the same locations and labels
//! are added up (saturating, like the recorder's sums), as `go tool pprof` does when it merges.
//! Every reference of every input is checked on the way, so the output holds together whatever
//! the inputs were.
//!
//! Only profiles of the same value types, in the same order and with the same units, merge:
//! adding a `cpu-time` in nanoseconds to an `alloc-samples` count would make a profile that
//! reads well and means nothing. The output's time span covers every input's (earliest start,
//! latest end); the fields that cannot be added up (`period`, `period_type`,
//! `default_sample_type`, `drop_frames`, `keep_frames`) come from the first input that sets
//! them, and comments from all inputs, once each.
use std::collections::{HashMap, HashSet};
use std::fmt;

use prost::Message as _;

use super::reader::{decode_within, Budget, ReadLimits, StackProfile};
use super::ViewError;
use crate::error::SerializeError;
use crate::pprof::{
    gzip, Compression, PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofMapping,
    PprofProfile, PprofSample, PprofValueType,
};

/// Why profiles cannot be merged.
#[derive(Debug)]
pub enum MergeError {
    /// No profile was given.
    NoInput,
    /// Input `index` (from 0) cannot be read.
    Input { index: usize, error: ViewError },
    /// Input `index` has other value types than input 0 (`type/unit` each).
    ValueTypes { index: usize, first: Vec<String>, got: Vec<String> },
}

impl MergeError {
    /// The message, with each input named by `name(index)` (e.g. its file name).
    pub fn describe(&self, name: impl Fn(usize) -> String) -> String {
        match self {
            Self::NoInput => "no profile to merge".to_string(),
            Self::Input { index, error } => format!("{}: {error}", name(*index)),
            Self::ValueTypes { index, first, got } => format!(
                "{} has the value types {} and {} has {}: only profiles of the same value \
                 types merge",
                name(0),
                first.join(", "),
                name(*index),
                got.join(", ")
            ),
        }
    }
}

impl fmt::Display for MergeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(|i| format!("profile {i}")))
    }
}

impl std::error::Error for MergeError {}

/// Decodes `inputs` (each a pprof, raw or gzip, within `limits`) and merges them into one
/// profile.
pub fn merge_bytes<B: AsRef<[u8]>>(
    inputs: &[B],
    limits: &ReadLimits,
) -> Result<PprofProfile, MergeError> {
    let profiles = inputs
        .iter()
        .enumerate()
        .map(|(index, bytes)| {
            decode_within(bytes.as_ref(), limits, &mut Budget::new(limits, 1))
                .map_err(|error| MergeError::Input { index, error })
        })
        .collect::<Result<Vec<_>, _>>()?;
    merge(&profiles)
}

/// Merges decoded profiles into one (see the module doc).
pub fn merge(profiles: &[PprofProfile]) -> Result<PprofProfile, MergeError> {
    let first = profiles.first().ok_or(MergeError::NoInput)?;
    let first_types =
        value_type_names(first).map_err(|error| MergeError::Input { index: 0, error })?;
    let mut merger = Merger::default();
    for (index, profile) in profiles.iter().enumerate() {
        let types =
            value_type_names(profile).map_err(|error| MergeError::Input { index, error })?;
        if types != first_types {
            return Err(MergeError::ValueTypes { index, first: first_types, got: types });
        }
        merger.add(profile, index == 0).map_err(|error| MergeError::Input { index, error })?;
    }
    Ok(merger.finish())
}

/// `inputs` as one resolved profile, for the views: the input itself when there is one (its
/// errors are then those of [`StackProfile::from_bytes`], as input 0), else their merge. Each
/// input is read within `limits`; the merge, and each view of it, within the budget of all.
pub fn stack_profile<B: AsRef<[u8]>>(
    inputs: &[B],
    limits: &ReadLimits,
) -> Result<StackProfile, MergeError> {
    if let [only] = inputs {
        return StackProfile::from_bytes(only.as_ref(), limits)
            .map_err(|error| MergeError::Input { index: 0, error });
    }
    // The merge checked every reference: resolving fails only on a limit, named as input 0's.
    let budget = Budget::new(limits, inputs.len());
    let merged = merge_bytes(inputs, limits)?;
    let output = Budget::output(limits, merged.encoded_len() as u64);
    StackProfile::resolve(merged, budget, output)
        .map_err(|error| MergeError::Input { index: 0, error })
}

/// Encodes a profile as a pprof file, raw or gzip.
pub fn encode(profile: &PprofProfile, compression: Compression) -> Result<Vec<u8>, SerializeError> {
    let raw = profile.encode_to_vec();
    match compression {
        Compression::None => Ok(raw),
        Compression::Gzip => gzip(&raw),
    }
}

fn not_pprof(detail: String) -> ViewError {
    ViewError::NotPprof(detail)
}

/// The value types of `p` as `type/unit` strings, checking their references.
fn value_type_names(p: &PprofProfile) -> Result<Vec<String>, ViewError> {
    if p.sample_type.is_empty() {
        return Err(not_pprof("it has no sample types".into()));
    }
    p.sample_type
        .iter()
        .map(|vt| {
            Ok(format!(
                "{}/{}",
                input_string(p, vt.r#type, "a sample type")?,
                input_string(p, vt.unit, "a unit")?
            ))
        })
        .collect()
}

fn input_string<'a>(p: &'a PprofProfile, index: i64, what: &str) -> Result<&'a str, ViewError> {
    usize::try_from(index)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .map(String::as_str)
        .ok_or_else(|| not_pprof(format!("{what} refers to string {index}, past the table")))
}

/// A mapping as its fields, strings and all already in the output's numbering.
type MappingKey = (u64, u64, u64, i64, i64, [bool; 4]);
/// A function: name, system name, filename, start line.
type FunctionKey = (i64, i64, i64, i64);
/// A location: mapping id, address, lines `(function id, line)`, is_folded.
type LocationKey = (u64, u64, Vec<(u64, i64)>, bool);
/// A sample: location ids, then labels `(key, str, num, num_unit)`.
type SampleKey = (Vec<u64>, Vec<(i64, i64, i64, i64)>);

/// The output profile being built, with the indexes that store each thing once.
#[derive(Default)]
struct Merger {
    out: PprofProfile,
    strings: HashMap<String, i64>,
    mappings: HashMap<MappingKey, u64>,
    functions: HashMap<FunctionKey, u64>,
    locations: HashMap<LocationKey, u64>,
    samples: HashMap<SampleKey, usize>,
    comments: HashSet<i64>,
    /// Earliest start and latest end over the inputs that have a start time.
    span: Option<(i64, i64)>,
}

/// One input's string indices in the output's table, interned when first used.
struct StringMap<'p> {
    input: &'p [String],
    mapped: Vec<Option<i64>>,
}

impl<'p> StringMap<'p> {
    fn new(p: &'p PprofProfile) -> Self {
        Self { input: &p.string_table, mapped: vec![None; p.string_table.len()] }
    }

    /// The output's index of the input's string `index`; `what` names the field for the error.
    fn get(&mut self, merger: &mut Merger, index: i64, what: &str) -> Result<i64, ViewError> {
        let i = usize::try_from(index)
            .ok()
            .filter(|&i| i < self.input.len())
            .ok_or_else(|| not_pprof(format!("{what} refers to string {index}, past the table")))?;
        if let Some(mapped) = self.mapped[i] {
            return Ok(mapped);
        }
        let mapped = merger.intern(&self.input[i]);
        self.mapped[i] = Some(mapped);
        Ok(mapped)
    }
}

impl Merger {
    /// The output's index of `s`.
    fn intern(&mut self, s: &str) -> i64 {
        if self.out.string_table.is_empty() {
            self.out.string_table.push(String::new());
            self.strings.insert(String::new(), 0);
        }
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    /// Copies `p` in. `first`: `p` is the first input, whose unsummable fields are kept.
    fn add(&mut self, p: &PprofProfile, first: bool) -> Result<(), ViewError> {
        if p.string_table.first().map(String::as_str) != Some("") {
            return Err(not_pprof("the string table does not start with an empty string".into()));
        }
        let mut strings = StringMap::new(p);
        self.add_header(p, first, &mut strings)?;
        let mappings = self.add_mappings(p, &mut strings)?;
        let functions = self.add_functions(p, &mut strings)?;
        let locations = self.add_locations(p, &mappings, &functions)?;
        self.add_samples(p, &locations, &mut strings)
    }

    /// The profile-wide fields: sample types (from the first input), the first period type,
    /// default sample type, drop and keep frames seen, every distinct comment, the time span.
    fn add_header(
        &mut self,
        p: &PprofProfile,
        first: bool,
        s: &mut StringMap<'_>,
    ) -> Result<(), ViewError> {
        if first {
            self.out.sample_type = p
                .sample_type
                .iter()
                .map(|vt| {
                    Ok(PprofValueType {
                        r#type: s.get(self, vt.r#type, "a sample type")?,
                        unit: s.get(self, vt.unit, "a unit")?,
                    })
                })
                .collect::<Result<_, ViewError>>()?;
        }
        if self.out.period_type.is_none() {
            if let Some(vt) = &p.period_type {
                self.out.period_type = Some(PprofValueType {
                    r#type: s.get(self, vt.r#type, "the period type")?,
                    unit: s.get(self, vt.unit, "the period unit")?,
                });
                self.out.period = p.period;
            }
        }
        if self.out.default_sample_type == 0 && p.default_sample_type != 0 {
            self.out.default_sample_type =
                s.get(self, p.default_sample_type, "default_sample_type")?;
        }
        if self.out.drop_frames == 0 && p.drop_frames != 0 {
            self.out.drop_frames = s.get(self, p.drop_frames, "drop_frames")?;
        }
        if self.out.keep_frames == 0 && p.keep_frames != 0 {
            self.out.keep_frames = s.get(self, p.keep_frames, "keep_frames")?;
        }
        for &c in &p.comment {
            let c = s.get(self, c, "a comment")?;
            if self.comments.insert(c) {
                self.out.comment.push(c);
            }
        }
        if p.time_nanos != 0 {
            let end = p.time_nanos.saturating_add(p.duration_nanos.max(0));
            self.span = Some(match self.span {
                None => (p.time_nanos, end),
                Some((start, finish)) => (start.min(p.time_nanos), finish.max(end)),
            });
        }
        Ok(())
    }

    /// Each mapping of `p` stored once; returns the input's mapping ids in the output's.
    fn add_mappings(
        &mut self,
        p: &PprofProfile,
        s: &mut StringMap<'_>,
    ) -> Result<HashMap<u64, u64>, ViewError> {
        let mut ids = HashMap::with_capacity(p.mapping.len());
        for m in &p.mapping {
            let key: MappingKey = (
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                s.get(self, m.filename, "a mapping filename")?,
                s.get(self, m.build_id, "a mapping build id")?,
                [m.has_functions, m.has_filenames, m.has_line_numbers, m.has_inline_frames],
            );
            let next = self.out.mapping.len() as u64 + 1;
            let id = *self.mappings.entry(key).or_insert(next);
            if id == next {
                self.out.mapping.push(PprofMapping { id, filename: key.3, build_id: key.4, ..*m });
            }
            ids.insert(m.id, id);
        }
        Ok(ids)
    }

    /// Each function of `p` stored once; returns the input's function ids in the output's.
    fn add_functions(
        &mut self,
        p: &PprofProfile,
        s: &mut StringMap<'_>,
    ) -> Result<HashMap<u64, u64>, ViewError> {
        let mut ids = HashMap::with_capacity(p.function.len());
        for f in &p.function {
            let key: FunctionKey = (
                s.get(self, f.name, "a function name")?,
                s.get(self, f.system_name, "a function system name")?,
                s.get(self, f.filename, "a function filename")?,
                f.start_line,
            );
            let next = self.out.function.len() as u64 + 1;
            let id = *self.functions.entry(key).or_insert(next);
            if id == next {
                self.out.function.push(PprofFunction {
                    id,
                    name: key.0,
                    system_name: key.1,
                    filename: key.2,
                    start_line: key.3,
                });
            }
            ids.insert(f.id, id);
        }
        Ok(ids)
    }

    /// Each location of `p` stored once; returns the input's location ids in the output's.
    fn add_locations(
        &mut self,
        p: &PprofProfile,
        mapping_ids: &HashMap<u64, u64>,
        function_ids: &HashMap<u64, u64>,
    ) -> Result<HashMap<u64, u64>, ViewError> {
        let mut ids = HashMap::with_capacity(p.location.len());
        for l in &p.location {
            let mapping_id = match l.mapping_id {
                0 => 0,
                old => *mapping_ids.get(&old).ok_or_else(|| {
                    not_pprof(format!(
                        "location {} refers to mapping {old}, which does not exist",
                        l.id
                    ))
                })?,
            };
            let lines = l
                .line
                .iter()
                .map(|line| {
                    let function = function_ids.get(&line.function_id).ok_or_else(|| {
                        not_pprof(format!(
                            "location {} refers to function {}, which does not exist",
                            l.id, line.function_id
                        ))
                    })?;
                    Ok((*function, line.line))
                })
                .collect::<Result<Vec<_>, ViewError>>()?;
            let key: LocationKey = (mapping_id, l.address, lines, l.is_folded);
            let next = self.out.location.len() as u64 + 1;
            let id = match self.locations.get(&key) {
                Some(&id) => id,
                None => {
                    self.out.location.push(PprofLocation {
                        id: next,
                        mapping_id,
                        address: l.address,
                        line: key
                            .2
                            .iter()
                            .map(|&(function_id, line)| PprofLine { function_id, line })
                            .collect(),
                        is_folded: l.is_folded,
                    });
                    self.locations.insert(key, next);
                    next
                }
            };
            ids.insert(l.id, id);
        }
        Ok(ids)
    }

    /// The samples of `p`, added to the output's sample of the same stack and labels.
    fn add_samples(
        &mut self,
        p: &PprofProfile,
        location_ids: &HashMap<u64, u64>,
        s: &mut StringMap<'_>,
    ) -> Result<(), ViewError> {
        let value_count = self.out.sample_type.len();
        for sample in &p.sample {
            if sample.value.len() != value_count {
                return Err(not_pprof(format!(
                    "a sample has {} values for {value_count} sample types",
                    sample.value.len()
                )));
            }
            let locations = sample
                .location_id
                .iter()
                .map(|old| {
                    location_ids.get(old).copied().ok_or_else(|| {
                        not_pprof(format!(
                            "a sample refers to location {old}, which does not exist"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, ViewError>>()?;
            let labels = sample
                .label
                .iter()
                .map(|l| {
                    let str = if l.str == 0 { 0 } else { s.get(self, l.str, "a label value")? };
                    let num_unit =
                        if l.num_unit == 0 { 0 } else { s.get(self, l.num_unit, "a label unit")? };
                    Ok((s.get(self, l.key, "a label key")?, str, l.num, num_unit))
                })
                .collect::<Result<Vec<_>, ViewError>>()?;
            let key: SampleKey = (locations, labels);
            match self.samples.get(&key) {
                Some(&i) => {
                    let sum = &mut self.out.sample[i].value;
                    for (total, v) in sum.iter_mut().zip(&sample.value) {
                        *total = total.saturating_add(*v);
                    }
                }
                None => {
                    self.out.sample.push(PprofSample {
                        location_id: key.0.clone(),
                        value: sample.value.clone(),
                        label: key
                            .1
                            .iter()
                            .map(|&(key, str, num, num_unit)| PprofLabel {
                                key,
                                str,
                                num,
                                num_unit,
                            })
                            .collect(),
                    });
                    self.samples.insert(key, self.out.sample.len() - 1);
                }
            }
        }
        Ok(())
    }

    fn finish(mut self) -> PprofProfile {
        if let Some((start, end)) = self.span {
            self.out.time_nanos = start;
            self.out.duration_nanos = end.saturating_sub(start);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{decode, FoldOptions};
    use crate::{Config, Frame, Label, LabelValue, Recorder, Sample, Timestamp, ValueType};

    const TYPES: [(&str, &str); 3] =
        [("cpu-time", "nanoseconds"), ("cpu-samples", "count"), ("wall-time", "nanoseconds")];

    /// A pprof made by the recorder: each sample `(stack leaf first, values, process id)`.
    fn recorded(samples: &[(&[&str], [i64; 3], i64)]) -> Vec<u8> {
        let types: Vec<ValueType> = TYPES.iter().map(|&(t, u)| ValueType::new(t, u)).collect();
        let recorder = Recorder::new(Config::new(types, 64).unwrap(), Timestamp::now());
        for (stack, values, pid) in samples {
            let frames: Vec<Frame> = stack
                .iter()
                .map(|name| Frame { function_name: name, filename: "a.rb", line: 1 })
                .collect();
            let labels = [Label { key: "process id", value: LabelValue::Num(*pid) }];
            let sample = Sample { frames: &frames, omitted_frames: 0, values, labels: &labels };
            recorder.record_sample(&sample).unwrap();
        }
        recorder.serialize(Compression::Gzip).unwrap().bytes
    }

    fn decoded(bytes: &[u8]) -> PprofProfile {
        decode(bytes, &ReadLimits::default()).unwrap()
    }

    fn totals(p: &StackProfile) -> Vec<i64> {
        (0..p.value_types.len()).map(|i| p.total(i)).collect()
    }

    #[test]
    fn sums_the_inputs_keeping_processes_apart_and_adding_equal_samples() {
        let a = recorded(&[
            (&["spin", "main"], [700, 1, 800], 10),
            (&["sleep", "main"], [0, 2, 900], 10),
        ]);
        let b =
            recorded(&[(&["spin", "main"], [300, 1, 350], 11), (&["work", "main"], [5, 1, 5], 11)]);
        let c = recorded(&[(&["spin", "main"], [1, 1, 1], 10)]);
        let merged = stack_profile(&[&a, &b, &c], &ReadLimits::default()).unwrap();
        assert_eq!(totals(&merged), [1006, 6, 2056]);
        assert_eq!(
            merged
                .folded(
                    0,
                    &FoldOptions { root_label: Some("process id".into()), ..Default::default() }
                )
                .unwrap(),
            "process id=10;main;spin 701\nprocess id=11;main;spin 300\nprocess id=11;main;work 5\n"
        );
        // a's and c's spin stacks are one sample; every function and location is stored once.
        let p = merge_bytes(&[&a, &b, &c], &ReadLimits::default()).unwrap();
        assert_eq!(p.sample.len(), 4);
        assert_eq!(p.function.len(), 4);
        assert_eq!(p.location.len(), 4);
        let mut strings = p.string_table.clone();
        strings.sort();
        strings.dedup();
        assert_eq!(strings.len(), p.string_table.len(), "each string once");
    }

    #[test]
    fn round_trips_through_encoding_and_covers_every_inputs_time() {
        let mut a = decoded(&recorded(&[(&["x"], [1, 1, 1], 1)]));
        let mut b = decoded(&recorded(&[(&["y"], [2, 1, 2], 2)]));
        (a.time_nanos, a.duration_nanos) = (1_000, 500);
        (b.time_nanos, b.duration_nanos) = (1_200, 800);
        let merged = merge(&[a, b]).unwrap();
        assert_eq!((merged.time_nanos, merged.duration_nanos), (1_000, 1_000));
        for compression in [Compression::None, Compression::Gzip] {
            let bytes = encode(&merged, compression).unwrap();
            assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), compression == Compression::Gzip);
            let back = StackProfile::from_bytes(&bytes, &ReadLimits::default()).unwrap();
            assert_eq!(totals(&back), [3, 2, 3]);
            assert_eq!(back.folded(0, &FoldOptions::default()).unwrap(), "x 1\ny 2\n");
        }
    }

    #[test]
    fn keeps_mappings_addresses_and_unsummable_fields_of_the_first() {
        let mut a = decoded(&recorded(&[(&["x"], [1, 1, 1], 1)]));
        let s = a.string_table.len() as i64;
        a.string_table.extend(["libfoo.so".to_string(), "a comment".to_string()]);
        a.mapping.push(PprofMapping {
            id: 7,
            filename: s,
            has_functions: true,
            ..Default::default()
        });
        a.location.push(PprofLocation {
            id: 99,
            mapping_id: 7,
            address: 0xabc,
            ..Default::default()
        });
        a.sample.push(PprofSample { location_id: vec![99], value: vec![4, 1, 4], label: vec![] });
        a.comment = vec![s + 1];
        a.period = 10;
        a.period_type = Some(PprofValueType { r#type: 1, unit: 2 });
        let b = a.clone();
        let merged = merge(&[a, b]).unwrap();
        // The recorder's one mapping (id 1, all zero) and libfoo.so, each once.
        assert_eq!(merged.mapping.len(), 2);
        assert_eq!(merged.string_table[merged.mapping[1].filename as usize], "libfoo.so");
        assert!(merged.mapping[1].has_functions);
        assert_eq!(merged.comment.len(), 1);
        assert_eq!(merged.period, 10);
        let budget = Budget::new(&ReadLimits::default(), 1);
        let output = Budget::output(&ReadLimits::default(), 0);
        let merged = StackProfile::resolve(merged, budget, output).unwrap();
        let folded = merged.folded(0, &FoldOptions::default()).unwrap();
        assert_eq!(folded, "0xabc 8\nx 2\n");
    }

    #[test]
    fn refuses_different_value_types_and_names_the_input_that_is_not_a_pprof() {
        let a = recorded(&[(&["x"], [1, 1, 1], 1)]);
        let mut other = decoded(&a);
        other.sample_type.swap(0, 2);
        let other = other.encode_to_vec();
        let e = merge_bytes(&[&a[..], &other[..]], &ReadLimits::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "profile 0 has the value types cpu-time/nanoseconds, cpu-samples/count, \
             wall-time/nanoseconds and profile 1 has wall-time/nanoseconds, cpu-samples/count, \
             cpu-time/nanoseconds: only profiles of the same value types merge"
        );
        let e =
            merge_bytes(&[&a[..], b"not a profile at all"], &ReadLimits::default()).unwrap_err();
        assert!(matches!(e, MergeError::Input { index: 1, .. }), "{e}");
        assert!(e.describe(|i| format!("f{i}.pb")).starts_with("f1.pb: not a pprof profile"));
        let e = stack_profile(&[b"".as_slice()], &ReadLimits::default()).unwrap_err();
        assert_eq!(e.describe(|_| "x".into()), "x: not a pprof profile: the input is empty");
        assert!(matches!(
            merge_bytes::<&[u8]>(&[], &ReadLimits::default()),
            Err(MergeError::NoInput)
        ));
    }

    #[test]
    fn rejects_dangling_references() {
        let a = decoded(&recorded(&[(&["x"], [1, 1, 1], 1)]));
        let err = |p: PprofProfile| merge(&[a.clone(), p]).unwrap_err().to_string();
        let mut p = a.clone();
        p.sample[0].location_id = vec![12345];
        assert!(err(p).contains("location 12345"));
        let mut p = a.clone();
        p.location[0].mapping_id = 3;
        assert!(err(p).contains("mapping 3"));
        let mut p = a.clone();
        p.location[0].line[0].function_id = 77;
        assert!(err(p).contains("function 77"));
        let mut p = a.clone();
        p.sample[0].label[0].key = 1_000;
        assert!(err(p).contains("string 1000"));
        let mut p = a.clone();
        p.sample[0].value.pop();
        assert!(err(p).contains("2 values for 3 sample types"));
        let mut p = a.clone();
        p.string_table[0] = "x".into();
        assert!(err(p).contains("empty string"));
    }
}
