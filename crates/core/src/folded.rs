//! Reading a pprof back: folded stacks, a flamegraph, a "top" table and a summary.
//!
//! These views are for people looking at a profile (the `ddprof-recorder` command, the
//! `DdprofRecorder.folded` / `.flamegraph` methods). They decode any pprof — ours, raw or
//! gzip, or another tool's — with the prost messages of [`crate::pprof`], check every
//! reference in it once, and then work on a resolved [`StackProfile`]: stacks as function
//! indices, so that folding, ranking and drawing never look an id up again.
//!
//! Folded stacks are the format of Brendan Gregg's `flamegraph.pl` and of
//! [inferno](https://github.com/jonhoo/inferno): one line per distinct stack, root first,
//! frames separated by `;`, then a space and the stack's value.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::Read as _;

use prost::Message as _;

use crate::pprof::PprofProfile;

/// Why a profile cannot be read or a view cannot be made from it.
#[derive(Debug)]
pub enum FoldedError {
    /// Not a pprof: not protobuf, or protobuf whose references do not hold together.
    NotPprof(String),
    /// The gzip stream around the profile is damaged.
    Gzip(std::io::Error),
    /// The asked value type is not one of the profile's sample types.
    UnknownValue { asked: String, available: Vec<String> },
    /// Nothing to draw: every sample has 0 for the asked value.
    NothingToDraw(String),
    /// inferno failed to write the SVG.
    Render(String),
}

impl fmt::Display for FoldedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPprof(detail) => write!(f, "not a pprof profile: {detail}"),
            Self::Gzip(e) => write!(f, "not a pprof profile: bad gzip stream: {e}"),
            Self::UnknownValue { asked, available } => write!(
                f,
                "unknown value type {asked:?}; this profile has: {}",
                available.join(", ")
            ),
            Self::NothingToDraw(value) => {
                write!(f, "nothing to draw: no sample has a non-zero {value}")
            }
            Self::Render(detail) => write!(f, "could not render the flamegraph: {detail}"),
        }
    }
}

impl std::error::Error for FoldedError {}

/// A function as pprof names it: name and file. Empty names stay empty here; views decide
/// how to show them ([`StackProfile::frame_name`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: String,
    pub filename: String,
}

/// A label value, as in pprof: a string or a number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelValue {
    Str(String),
    Num(i64),
}

impl fmt::Display for LabelValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Str(s) => f.write_str(s),
            Self::Num(n) => write!(f, "{n}"),
        }
    }
}

/// One pprof sample with every reference resolved.
#[derive(Debug, Clone)]
pub struct StackSample {
    /// Indices into [`StackProfile::functions`], leaf first. Inlined lines of a location come
    /// out as separate frames, innermost first, as pprof orders them.
    pub frames: Vec<usize>,
    /// One per value type.
    pub values: Vec<i64>,
    pub labels: Vec<(String, LabelValue)>,
}

/// A decoded, checked pprof.
#[derive(Debug, Clone)]
pub struct StackProfile {
    /// `(type, unit)` per value, in value order.
    pub value_types: Vec<(String, String)>,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub functions: Vec<Function>,
    pub samples: Vec<StackSample>,
}

/// One row of [`StackProfile::top`]: a function and the value it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopEntry {
    pub function: Function,
    /// Value of the samples whose leaf is this function.
    pub self_value: i64,
    /// Value of the samples with this function anywhere in their stack (once per sample, so
    /// recursion does not count twice).
    pub total_value: i64,
}

/// How [`StackProfile::folded`] writes frames.
#[derive(Debug, Clone, Default)]
pub struct FoldOptions {
    /// Add ` (file)` after each function name, to tell apart same-named functions.
    pub filenames: bool,
    /// Put the value of this label (e.g. `"thread name"`) as the root-most frame, so that the
    /// flamegraph has one tower per value. Samples without the label get `"-"`.
    pub root_label: Option<String>,
}

/// Name of the root frame added under [`FoldOptions::root_label`], e.g. `thread name=main`.
fn root_frame(key: &str, labels: &[(String, LabelValue)]) -> String {
    let value = labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.to_string())
        .unwrap_or_else(|| "-".to_string());
    sanitize(&format!("{key}={value}"))
}

/// A frame name safe for the folded format: `;` separates frames and a line ends at `\n`, so
/// neither may appear inside a name (`:` and a space take their places).
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

/// The one frame of a sample without a stack, in the views.
pub(crate) const NO_STACK: &str = "(no stack)";

/// The first bytes of a gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The protobuf messages of a pprof, raw or gzip-compressed (told apart by the gzip magic
/// number), references not checked yet.
pub(crate) fn decode(bytes: &[u8]) -> Result<PprofProfile, FoldedError> {
    let gunzipped;
    let raw = if bytes.starts_with(&GZIP_MAGIC) {
        let mut raw = Vec::with_capacity(bytes.len() * 4);
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(FoldedError::Gzip)?;
        gunzipped = raw;
        &gunzipped[..]
    } else {
        bytes
    };
    if raw.is_empty() {
        return Err(FoldedError::NotPprof("the input is empty".to_string()));
    }
    PprofProfile::decode(raw)
        .map_err(|e| FoldedError::NotPprof(format!("protobuf decoding failed: {e}")))
}

impl StackProfile {
    /// Decodes a pprof, raw or gzip-compressed (told apart by the gzip magic number).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, FoldedError> {
        Self::resolve(decode(bytes)?)
    }

    /// Checks every reference of `p` and builds the resolved form.
    pub(crate) fn resolve(p: PprofProfile) -> Result<Self, FoldedError> {
        let bad = |what: String| FoldedError::NotPprof(what);
        let strings = &p.string_table;
        if strings.first().map(String::as_str) != Some("") {
            return Err(bad("the string table does not start with an empty string".into()));
        }
        let string = |index: i64, what: &str| -> Result<String, FoldedError> {
            usize::try_from(index)
                .ok()
                .and_then(|i| strings.get(i))
                .cloned()
                .ok_or_else(|| bad(format!("{what} refers to string {index}, past the table")))
        };
        if p.sample_type.is_empty() {
            return Err(bad("it has no sample types".into()));
        }
        let value_types = p
            .sample_type
            .iter()
            .map(|vt| Ok((string(vt.r#type, "a sample type")?, string(vt.unit, "a unit")?)))
            .collect::<Result<Vec<_>, FoldedError>>()?;

        // Functions are deduplicated by (name, filename): pprof allows several ids for one.
        let mut functions = Vec::with_capacity(p.function.len());
        let mut function_index: HashMap<Function, usize> = HashMap::new();
        let mut by_function_id: HashMap<u64, usize> = HashMap::with_capacity(p.function.len());
        for f in &p.function {
            let function = Function {
                name: string(f.name, "a function name")?,
                filename: string(f.filename, "a function filename")?,
            };
            let index = *function_index.entry(function.clone()).or_insert_with(|| {
                functions.push(function);
                functions.len() - 1
            });
            by_function_id.insert(f.id, index);
        }

        // Each location as its frames, innermost first.
        let mut by_location_id: HashMap<u64, Vec<usize>> = HashMap::with_capacity(p.location.len());
        for l in &p.location {
            let mut frames = Vec::with_capacity(l.line.len());
            for line in &l.line {
                let index = by_function_id.get(&line.function_id).copied().ok_or_else(|| {
                    bad(format!(
                        "location {} refers to function {}, which does not exist",
                        l.id, line.function_id
                    ))
                })?;
                frames.push(index);
            }
            if frames.is_empty() {
                // An unsymbolized location: show its address, as pprof does.
                let function =
                    Function { name: format!("0x{:x}", l.address), filename: String::new() };
                let index = *function_index.entry(function.clone()).or_insert_with(|| {
                    functions.push(function);
                    functions.len() - 1
                });
                frames.push(index);
            }
            by_location_id.insert(l.id, frames);
        }

        let mut samples = Vec::with_capacity(p.sample.len());
        for s in &p.sample {
            if s.value.len() != value_types.len() {
                return Err(bad(format!(
                    "a sample has {} values for {} sample types",
                    s.value.len(),
                    value_types.len()
                )));
            }
            let mut frames = Vec::with_capacity(s.location_id.len());
            for id in &s.location_id {
                let location = by_location_id.get(id).ok_or_else(|| {
                    bad(format!("a sample refers to location {id}, which does not exist"))
                })?;
                frames.extend_from_slice(location);
            }
            let labels = s
                .label
                .iter()
                .map(|l| {
                    let key = string(l.key, "a label key")?;
                    let value = if l.str != 0 {
                        LabelValue::Str(string(l.str, "a label value")?)
                    } else {
                        LabelValue::Num(l.num)
                    };
                    Ok((key, value))
                })
                .collect::<Result<Vec<_>, FoldedError>>()?;
            samples.push(StackSample { frames, values: s.value.clone(), labels });
        }

        Ok(Self {
            value_types,
            time_nanos: p.time_nanos,
            duration_nanos: p.duration_nanos,
            functions,
            samples,
        })
    }

    /// Position of the value type named `name` (e.g. `"cpu-time"`).
    pub fn value_index(&self, name: &str) -> Result<usize, FoldedError> {
        self.value_types.iter().position(|(t, _)| t == name).ok_or_else(|| {
            FoldedError::UnknownValue {
                asked: name.to_string(),
                available: self.value_types.iter().map(|(t, _)| t.clone()).collect(),
            }
        })
    }

    /// Sum of value `value` over all samples (saturating, like the recorder's sums).
    pub fn total(&self, value: usize) -> i64 {
        self.samples.iter().fold(0i64, |acc, s| acc.saturating_add(s.values[value]))
    }

    /// What a function is called in a view: its name, or its file when the name is empty
    /// (the recorder's `"N frames omitted"` placeholder has only a file), or `"(unknown)"`.
    pub fn display_name(&self, function: usize) -> &str {
        let f = &self.functions[function];
        match (f.name.is_empty(), f.filename.is_empty()) {
            (false, _) => &f.name,
            (true, false) => &f.filename,
            (true, true) => "(unknown)",
        }
    }

    /// How a frame is shown in folded stacks: [`Self::display_name`], with ` (file)` after
    /// it when `filenames` is set and the function has a name and a file, made safe for the
    /// format.
    pub fn frame_name(&self, function: usize, filenames: bool) -> String {
        let f = &self.functions[function];
        let name = self.display_name(function);
        if filenames && !f.name.is_empty() && !f.filename.is_empty() {
            sanitize(&format!("{name} ({})", f.filename))
        } else {
            sanitize(name)
        }
    }

    /// Folded stacks for value `value`: `root;...;leaf value` lines, sorted, one per distinct
    /// stack (samples that differ only by labels are merged), without stacks whose value is 0.
    /// An empty stack is written as the single frame `(no stack)`.
    pub fn folded(&self, value: usize, options: &FoldOptions) -> String {
        let names: Vec<String> =
            (0..self.functions.len()).map(|f| self.frame_name(f, options.filenames)).collect();
        let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
        let mut line = String::new();
        for s in &self.samples {
            let v = s.values[value];
            if v == 0 {
                continue;
            }
            line.clear();
            if let Some(key) = &options.root_label {
                line.push_str(&root_frame(key, &s.labels));
            }
            if s.frames.is_empty() {
                if !line.is_empty() {
                    line.push(';');
                }
                line.push_str(NO_STACK);
            }
            for &f in s.frames.iter().rev() {
                if !line.is_empty() {
                    line.push(';');
                }
                line.push_str(&names[f]);
            }
            let sum = stacks.entry(line.clone()).or_insert(0);
            *sum = sum.saturating_add(v);
        }
        let mut out = String::with_capacity(stacks.len() * 64);
        for (stack, v) in stacks {
            if v != 0 {
                out.push_str(&stack);
                out.push(' ');
                out.push_str(&v.to_string());
                out.push('\n');
            }
        }
        out
    }

    /// Functions ranked by their self value of `value`, highest first (ties: higher total,
    /// then name). Functions with neither self nor total value are left out.
    pub fn top(&self, value: usize) -> Vec<TopEntry> {
        let mut self_values = vec![0i64; self.functions.len()];
        let mut total_values = vec![0i64; self.functions.len()];
        let mut seen = HashSet::new();
        for s in &self.samples {
            let v = s.values[value];
            if v == 0 {
                continue;
            }
            if let Some(&leaf) = s.frames.first() {
                self_values[leaf] = self_values[leaf].saturating_add(v);
            }
            seen.clear();
            for &f in &s.frames {
                if seen.insert(f) {
                    total_values[f] = total_values[f].saturating_add(v);
                }
            }
        }
        let mut rows: Vec<TopEntry> = self
            .functions
            .iter()
            .enumerate()
            .filter(|&(i, _)| self_values[i] != 0 || total_values[i] != 0)
            .map(|(i, f)| TopEntry {
                function: f.clone(),
                self_value: self_values[i],
                total_value: total_values[i],
            })
            .collect();
        rows.sort_by(|a, b| {
            b.self_value
                .cmp(&a.self_value)
                .then(b.total_value.cmp(&a.total_value))
                .then_with(|| a.function.name.cmp(&b.function.name))
                .then_with(|| a.function.filename.cmp(&b.function.filename))
        });
        rows
    }

    /// The distinct values of label `key` over all samples, sorted.
    pub fn label_values(&self, key: &str) -> Vec<LabelValue> {
        let mut values: Vec<LabelValue> = self
            .samples
            .iter()
            .flat_map(|s| s.labels.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        values.sort();
        values
    }

    /// An SVG flamegraph of value `value`, drawn by inferno from [`StackProfile::folded`].
    /// Nanosecond values are shown in milliseconds.
    pub fn flamegraph(
        &self,
        value: usize,
        title: Option<&str>,
        options: &FoldOptions,
    ) -> Result<String, FoldedError> {
        let (value_name, unit) = &self.value_types[value];
        let folded = self.folded(value, options);
        if folded.is_empty() {
            return Err(FoldedError::NothingToDraw(value_name.clone()));
        }
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = title.map_or_else(|| format!("{value_name} flamegraph"), str::to_string);
        (opts.count_name, opts.factor) = match unit.as_str() {
            // inferno rounds the shown value to an integer: milliseconds read best and lose
            // only frames too narrow to read anyway.
            "nanoseconds" => (format!("ms of {value_name}"), 1e-6),
            "count" => (value_name.clone(), 1.0),
            unit => (format!("{unit} of {value_name}"), 1.0),
        };
        // Same colour for the same function across runs and pictures.
        opts.hash = true;
        let mut svg = Vec::with_capacity(folded.len() * 4 + 32 * 1024);
        inferno::flamegraph::from_lines(&mut opts, folded.lines(), &mut svg)
            .map_err(|e| FoldedError::Render(e.to_string()))?;
        String::from_utf8(svg).map_err(|e| FoldedError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{
        PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofSample, PprofValueType,
    };
    use std::io::Write as _;

    /// A profile of value types cpu-time and wall-time with functions main (1), work (2),
    /// spin (3), sleep (4), each location i having function i, and the given samples
    /// `(location ids leaf first, [cpu, wall], thread name)`.
    fn profile(samples: &[(&[u64], [i64; 2], &str)]) -> PprofProfile {
        let mut strings: Vec<String> =
            ["", "cpu-time", "nanoseconds", "wall-time", "main", "work", "spin", "sleep", "a.rb"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        strings.push("thread name".to_string()); // 9
        let mut intern = |s: &str| -> i64 {
            if let Some(i) = strings.iter().position(|x| x == s) {
                return i as i64;
            }
            strings.push(s.to_string());
            strings.len() as i64 - 1
        };
        let sample = samples
            .iter()
            .map(|(locations, values, thread)| PprofSample {
                location_id: locations.to_vec(),
                value: values.to_vec(),
                label: vec![PprofLabel { key: 9, str: intern(thread), num: 0, num_unit: 0 }],
            })
            .collect();
        PprofProfile {
            sample_type: vec![
                PprofValueType { r#type: 1, unit: 2 },
                PprofValueType { r#type: 3, unit: 2 },
            ],
            sample,
            function: (1..=4)
                .map(|id| PprofFunction {
                    id,
                    name: 3 + id as i64,
                    system_name: 3 + id as i64,
                    filename: 8,
                    start_line: 0,
                })
                .collect(),
            location: (1..=4)
                .map(|id| PprofLocation {
                    id,
                    mapping_id: 0,
                    address: 0,
                    line: vec![PprofLine { function_id: id, line: 10 }],
                    is_folded: false,
                })
                .collect(),
            string_table: strings,
            time_nanos: 1_000,
            duration_nanos: 5_000,
            ..Default::default()
        }
    }

    fn example() -> StackProfile {
        StackProfile::resolve(profile(&[
            (&[3, 2, 1], [700, 800], "worker"),
            (&[2, 1], [100, 100], "worker"),
            (&[3, 2, 1], [50, 60], "other"),
            (&[4, 1], [0, 900], "sleeper"),
        ]))
        .unwrap()
    }

    #[test]
    fn folds_root_first_merging_label_sets_and_skipping_zero_values() {
        let p = example();
        let cpu = p.value_index("cpu-time").unwrap();
        assert_eq!(p.folded(cpu, &FoldOptions::default()), "main;work 100\nmain;work;spin 750\n");
        let wall = p.value_index("wall-time").unwrap();
        assert_eq!(
            p.folded(wall, &FoldOptions::default()),
            "main;sleep 900\nmain;work 100\nmain;work;spin 860\n"
        );
    }

    #[test]
    fn folds_with_a_label_as_root_and_filenames() {
        let p = example();
        let options = FoldOptions { filenames: true, root_label: Some("thread name".to_string()) };
        assert_eq!(
            p.folded(0, &options),
            "thread name=other;main (a.rb);work (a.rb);spin (a.rb) 50\n\
             thread name=worker;main (a.rb);work (a.rb) 100\n\
             thread name=worker;main (a.rb);work (a.rb);spin (a.rb) 700\n"
        );
    }

    #[test]
    fn reads_gzip_like_raw() {
        let raw = profile(&[(&[3, 2, 1], [7, 8], "t")]).encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let gz = gz.finish().unwrap();
        let a = StackProfile::from_bytes(&raw).unwrap();
        let b = StackProfile::from_bytes(&gz).unwrap();
        assert_eq!(a.folded(0, &FoldOptions::default()), "main;work;spin 7\n");
        assert_eq!(b.folded(0, &FoldOptions::default()), a.folded(0, &FoldOptions::default()));
        assert_eq!((b.time_nanos, b.duration_nanos), (1_000, 5_000));
    }

    #[test]
    fn top_ranks_by_self_then_total_and_counts_recursion_once() {
        let p = StackProfile::resolve(profile(&[
            (&[3, 2, 1], [700, 0], "t"),
            (&[2, 3, 2, 1], [100, 0], "t"), // work recursing through spin
            (&[1], [5, 0], "t"),
        ]))
        .unwrap();
        let top = p.top(0);
        let rows: Vec<(&str, i64, i64)> =
            top.iter().map(|r| (r.function.name.as_str(), r.self_value, r.total_value)).collect();
        assert_eq!(rows, [("spin", 700, 800), ("work", 100, 800), ("main", 5, 805)]);
        assert_eq!(p.total(0), 805);
    }

    #[test]
    fn label_values_are_distinct_and_sorted() {
        let p = example();
        let names: Vec<String> =
            p.label_values("thread name").iter().map(ToString::to_string).collect();
        assert_eq!(names, ["other", "sleeper", "worker"]);
        assert!(p.label_values("nope").is_empty());
    }

    #[test]
    fn inline_lines_become_frames_and_odd_names_are_made_safe() {
        let mut p = profile(&[(&[1], [3, 0], "t"), (&[], [4, 0], "t")]);
        p.string_table[4] = "a;b\nc".to_string();
        p.location[0].line.insert(0, PprofLine { function_id: 2, line: 3 });
        p.function[2].name = 0; // spin: empty name and empty file
        p.function[2].filename = 0;
        p.location.push(PprofLocation { id: 9, address: 0xab, ..Default::default() });
        p.sample.push(PprofSample { location_id: vec![9, 3], value: vec![2, 0], label: vec![] });
        let p = StackProfile::resolve(p).unwrap();
        assert_eq!(
            p.folded(0, &FoldOptions::default()),
            "(no stack) 4\n(unknown);0xab 2\na:b c;work 3\n"
        );
    }

    #[test]
    fn omitted_frames_placeholder_shows_its_file() {
        // The recorder's placeholder is the root-most frame, with only a filename.
        let mut p = profile(&[(&[1, 2], [1, 1], "t")]);
        p.string_table.push("3 frames omitted".to_string());
        p.function[1].name = 0;
        p.function[1].filename = p.string_table.len() as i64 - 1;
        let p = StackProfile::resolve(p).unwrap();
        assert_eq!(p.folded(0, &FoldOptions::default()), "3 frames omitted;main 1\n");
    }

    #[test]
    fn rejects_what_is_not_a_pprof() {
        let err = |bytes: &[u8]| StackProfile::from_bytes(bytes).unwrap_err().to_string();
        assert_eq!(err(b""), "not a pprof profile: the input is empty");
        assert!(err(b"hello, this is text\n").starts_with("not a pprof profile"));
        assert!(err(&[0x1f, 0x8b, 1, 2, 3]).contains("bad gzip stream"));

        let mut p = profile(&[(&[3], [1, 1], "t")]);
        p.string_table[0] = "x".into();
        assert!(err(&p.encode_to_vec()).contains("empty string"));

        let mut p = profile(&[(&[7], [1, 1], "t")]);
        assert!(err(&p.encode_to_vec()).contains("location 7"));
        p.sample[0].location_id = vec![1];
        p.sample[0].value = vec![1];
        assert!(err(&p.encode_to_vec()).contains("1 values for 2 sample types"));
        p.sample[0].value = vec![1, 1];
        p.function[0].name = 99;
        assert!(err(&p.encode_to_vec()).contains("string 99"));
        p.function[0].name = 4;
        p.location[0].line[0].function_id = 42;
        assert!(err(&p.encode_to_vec()).contains("function 42"));

        let mut p = profile(&[]);
        p.sample_type.clear();
        assert!(err(&p.encode_to_vec()).contains("no sample types"));
    }

    #[test]
    fn unknown_value_names_the_available_ones() {
        let e = example().value_index("alloc-samples").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown value type \"alloc-samples\"; this profile has: cpu-time, wall-time"
        );
    }

    #[test]
    fn flamegraph_is_an_svg_naming_the_functions() {
        let p = example();
        let svg = p.flamegraph(0, Some("cpu"), &FoldOptions::default()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..80]);
        assert!(svg.contains("<svg"));
        assert!(svg.contains("spin"));
        assert!(svg.contains("ms of cpu-time"));
        assert!(!svg.contains("sleep ("), "sleep has no cpu-time");
        let wall = p.flamegraph(1, None, &FoldOptions::default()).unwrap();
        assert!(wall.contains("sleep"));
        assert!(wall.contains("wall-time flamegraph"));
    }

    #[test]
    fn flamegraph_of_nothing_is_an_error() {
        let p = StackProfile::resolve(profile(&[(&[4, 1], [0, 900], "t")])).unwrap();
        let e = p.flamegraph(0, None, &FoldOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), "nothing to draw: no sample has a non-zero cpu-time");
    }
}
