//! The pprof reader fuzz harness: the views' reader (`ddprof_recorder_core::views`) on
//! untrusted bytes. The first byte of an input picks how the rest is used:
//! - even: as a pprof, raw or gzip, read under small limits (64 KiB of protobuf, so a 1 MiB
//!   budget): reading and every view (folded, top both ways and by label, flamegraph,
//!   speedscope and its timeline, the timeline and the threads' shares, summary, merge,
//!   filter, keep_labels) must return `Ok` or a `ViewError`, never panic, and what they return
//!   must agree with the resolved samples (the frames of each sample within `MAX_STACK_DEPTH`,
//!   the folded values, top's self values and the label rows adding up to the totals, the
//!   samples kept by a label those that have it);
//! - odd: as the recipe of a structured profile (functions, locations with inline lines,
//!   samples with values and labels, some ids dangling), which the harness encodes with
//!   prost and, when the recipe says so, gzips. A model kept here predicts the outcome: a
//!   dangling reference is a "does not exist" error; otherwise each sample's frames are its
//!   locations' lines (one for a location without lines), the totals are the model's sums, the
//!   folded stacks and top agree with them, and merging the profile with itself doubles them.
//!
//! Shared by the libFuzzer target (`fuzz_targets/pprof_reader.rs`) and
//! `crates/core/tests/pprof_reader_fuzz.rs` (kept inputs and a pseudo-random driver on stable).
use std::io::Write as _;

use ddprof_recorder_core::pprof::{
    PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofProfile, PprofSample, PprofValueType,
};
use ddprof_recorder_core::views::merge::{merge_bytes, stack_profile};
use ddprof_recorder_core::views::speedscope::SpeedscopeOptions;
use ddprof_recorder_core::views::timeline::TimelineFormat;
use ddprof_recorder_core::views::{
    filter::filter_bytes, FoldOptions, LabelFilter, ReadLimits, ResolvedLabelValue, StackProfile,
    TopSort, ViewError, MAX_STACK_DEPTH,
};
use prost::Message as _;

/// The limits raw inputs are read under: small, so that amplification hits them.
const RAW_LIMITS: ReadLimits =
    ReadLimits { max_decompressed_bytes: 64 << 10, max_output_bytes: Some(1 << 20) };

/// Strings the recipes name things with; label keys include the profiler's (the timeline's
/// too: thread id, end_timestamp_ns, thread state). A pick takes one byte whatever the list's
/// length, so a longer list reads a kept input the same way but for the strings it names.
const TEXTS: &[&str] = &[
    "",
    "main",
    "a;b",
    "x\ny",
    "é",
    "thread name",
    "process id",
    "a.rb",
    "thread id",
    "end_timestamp_ns",
    "thread state",
    "running",
    "waiting for GVL",
    "gc kind",
];
/// The value types' names, in order: the profiler's, which the timeline and the threads'
/// shares look for.
const TYPES: &[&str] = &["cpu-time", "wall-time", "gvl-wait-time"];

/// Values a recipe picks from: small ones, and the extremes that saturate sums.
const VALUES: &[i64] = &[0, 1, 7, -3, 1_000_000, i64::MAX, i64::MIN, -1];

/// What one input did, for the drivers' summaries.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub read: u64,
    pub refused: u64,
    pub modelled: u64,
}

impl std::ops::AddAssign for Outcome {
    fn add_assign(&mut self, o: Self) {
        self.read += o.read;
        self.refused += o.refused;
        self.modelled += o.modelled;
    }
}

/// Runs one input. Panics (the fuzzer's crash) if any property fails.
pub fn run(data: &[u8]) -> Outcome {
    match data.split_first() {
        None => Outcome::default(),
        Some((mode, rest)) if mode % 2 == 0 => raw(rest),
        Some((_, rest)) => modelled(rest),
    }
}

/// Sum of `values` in i128: the exact sum, to compare with the views' saturating ones only
/// where nothing saturated.
fn exact(values: impl IntoIterator<Item = i64>) -> i128 {
    values.into_iter().map(i128::from).sum()
}

fn fits(sum: i128, parts: &[i64]) -> bool {
    // Every partial sum of a saturating fold stays in range when the absolute values do.
    let abs: i128 = parts.iter().map(|&v| i128::from(v).abs()).sum();
    abs <= i128::from(i64::MAX) && i64::try_from(sum).is_ok()
}

/// The value of each folded line, summed.
fn folded_sum(folded: &str) -> i128 {
    folded
        .lines()
        .map(|line| {
            let (_, value) = line.rsplit_once(' ').expect("a folded line ends with its value");
            i128::from(value.parse::<i64>().expect("a folded value is an i64"))
        })
        .sum()
}

/// Every view of `p`, checked against its own samples.
fn check_views(p: &StackProfile) {
    for s in &p.samples {
        assert!(s.frames.len() <= MAX_STACK_DEPTH);
        assert_eq!(s.values.len(), p.value_types.len());
        assert!(s.frames.iter().all(|&f| f < p.functions.len()));
    }
    for v in 0..p.value_types.len() {
        let values: Vec<i64> = p.samples.iter().map(|s| s.values[v]).collect();
        let sum = exact(values.iter().copied());
        let total = p.total(v);
        let folded = p.folded(v, &FoldOptions::default());
        let top = p.top(v, TopSort::SelfValue);
        let by_total = p.top(v, TopSort::TotalValue);
        assert_eq!(top.len(), by_total.len());
        assert!(by_total.windows(2).all(|w| w[0].total_value >= w[1].total_value));
        assert!(top.windows(2).all(|w| w[0].self_value >= w[1].self_value));
        if fits(sum, &values) {
            assert_eq!(i128::from(total), sum, "total of value {v}");
            if let Ok(folded) = &folded {
                assert_eq!(folded_sum(folded), sum, "folded stacks of value {v}");
            }
            let leafs: Vec<i64> =
                p.samples.iter().filter(|s| !s.frames.is_empty()).map(|s| s.values[v]).collect();
            assert_eq!(exact(top.iter().map(|r| r.self_value)), exact(leafs), "top's self");
            if let Ok(rows) = p.top_by_label(v, "thread name") {
                assert_eq!(exact(rows.iter().map(|r| r.value)), sum, "top by label of value {v}");
            }
        }
        let options = FoldOptions {
            filenames: true,
            root_label: Some("thread name".into()),
            ..Default::default()
        };
        let _ = p.folded(v, &options);
        match p.flamegraph(v, None, &options) {
            Ok(svg) => assert!(svg.starts_with("<?xml")),
            Err(e) => assert!(!matches!(e, ViewError::NotPprof(_) | ViewError::Gzip(_)), "{e}"),
        }
    }
    let all: Vec<usize> = (0..p.value_types.len()).collect();
    let options = SpeedscopeOptions { group_by: Some("thread name".into()), ..Default::default() };
    if let Ok(json) = p.speedscope(&all, &options) {
        assert!(json.starts_with("{\"$schema\""));
    }
    if let Ok(json) = p.speedscope_timeline(&options) {
        assert!(json.starts_with("{\"$schema\""));
    }
    for t in p.thread_times() {
        assert!(t.blocked_ns >= 0 && t.blocked_ns <= t.wall_ns.max(0));
    }
    for format in [TimelineFormat::Svg, TimelineFormat::Html] {
        match p.timeline(format, "t") {
            Ok(out) => assert!(out.starts_with(if format == TimelineFormat::Svg {
                "<?xml"
            } else {
                "<!DOCTYPE"
            })),
            Err(e) => assert!(!matches!(e, ViewError::NotPprof(_) | ViewError::Gzip(_)), "{e}"),
        }
    }
    let _ = p.label_values("thread name");
    let main = LabelFilter::text("thread name", "main");
    let mut kept = p.clone();
    match kept.keep_labels(std::slice::from_ref(&main)) {
        Ok(()) => {
            let has = |s: &&ddprof_recorder_core::views::StackSample| {
                s.labels.iter().any(|(k, v)| k == "thread name" && main.matches(v))
            };
            assert_eq!(kept.samples.len(), p.samples.iter().filter(has).count());
        }
        Err(e) => assert!(matches!(e, ViewError::UnknownLabel { .. }), "{e}"),
    }
}

fn raw(bytes: &[u8]) -> Outcome {
    // The same bytes gzipped too, so that the fuzzer's raw inputs reach the gzip path.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("gzip into memory");
    let gz = gz.finish().expect("gzip into memory");
    let mut outcome = Outcome::default();
    for input in [bytes, &gz[..]] {
        match StackProfile::from_bytes(input, &RAW_LIMITS) {
            Ok(p) => {
                outcome.read += 1;
                check_views(&p);
            }
            Err(e) => {
                outcome.refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    let _ = merge_bytes(&[bytes, &gz[..]], &RAW_LIMITS).map(|merged| merged.encode_to_vec());
    let _ = stack_profile(&[bytes, &gz[..]], &RAW_LIMITS).map(|p| check_views(&p));
    let main = [("thread name".to_string(), ResolvedLabelValue::Str("main".into()))];
    let _ = filter_bytes(bytes, &main, &RAW_LIMITS);
    outcome
}

/// Bytes in, choices out; zeros once the input is used up.
struct Recipe<'a>(&'a [u8]);

impl Recipe<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }

    fn below(&mut self, n: u8) -> u8 {
        self.u8() % n
    }

    fn text(&mut self, strings: &mut Vec<String>) -> i64 {
        let text = TEXTS[usize::from(self.below(TEXTS.len() as u8))];
        match strings.iter().position(|s| s == text) {
            Some(i) => i as i64,
            None => {
                strings.push(text.to_string());
                strings.len() as i64 - 1
            }
        }
    }
}

/// The model of a recipe: what the reader must make of it.
struct Model {
    /// Per sample, its frame count and values; `None` if some reference dangles.
    samples: Option<Vec<(usize, Vec<i64>)>>,
    types: usize,
}

fn build(recipe: &mut Recipe<'_>) -> (PprofProfile, Model, bool) {
    let flags = recipe.u8();
    let (dangle, gzip) = (flags & 1 != 0 && flags & 6 == 6, flags & 8 != 0);
    let mut strings = vec![String::new()];
    let types = 1 + usize::from(recipe.below(3));
    let sample_type = (0..types)
        .map(|i| {
            strings.push(TYPES[i].to_string());
            let t = strings.len() as i64 - 1;
            PprofValueType { r#type: t, unit: recipe.text(&mut strings) }
        })
        .collect();
    let functions = u64::from(recipe.below(6));
    let function: Vec<PprofFunction> = (1..=functions)
        .map(|id| PprofFunction {
            id,
            name: recipe.text(&mut strings),
            filename: recipe.text(&mut strings),
            ..Default::default()
        })
        .collect();
    let mut valid = true;
    let locations = u64::from(recipe.below(6));
    let mut lines_of = Vec::new();
    let location: Vec<PprofLocation> = (1..=locations)
        .map(|id| {
            let lines = recipe.below(4);
            let line = (0..lines)
                .map(|_| {
                    let pick = u64::from(recipe.u8());
                    let function_id = if functions == 0 || (dangle && pick == 255) {
                        valid = false;
                        1_000 + pick
                    } else {
                        1 + pick % functions
                    };
                    PprofLine { function_id, line: 1 }
                })
                .collect::<Vec<_>>();
            lines_of.push(line.len().max(1));
            PprofLocation { id, address: u64::from(recipe.u8()), line, ..Default::default() }
        })
        .collect();
    let mut samples = Vec::new();
    let sample: Vec<PprofSample> = (0..recipe.below(8))
        .map(|_| {
            let ids: Vec<u64> = (0..recipe.below(5))
                .map(|_| {
                    let pick = u64::from(recipe.u8());
                    if locations == 0 || (dangle && pick == 254) {
                        valid = false;
                        2_000 + pick
                    } else {
                        1 + pick % locations
                    }
                })
                .collect();
            let value: Vec<i64> =
                (0..types).map(|_| VALUES[usize::from(recipe.below(VALUES.len() as u8))]).collect();
            let label = (0..recipe.below(3))
                .map(|_| {
                    let key = recipe.text(&mut strings);
                    if recipe.u8().is_multiple_of(2) {
                        PprofLabel { key, str: recipe.text(&mut strings), ..Default::default() }
                    } else {
                        PprofLabel { key, num: i64::from(recipe.u8()), ..Default::default() }
                    }
                })
                .collect();
            let frames = ids
                .iter()
                .map(|&id| usize::try_from(id - 1).ok().and_then(|i| lines_of.get(i)).copied())
                .sum::<Option<usize>>()
                .unwrap_or(0);
            samples.push((frames, value.clone()));
            PprofSample { location_id: ids, value, label }
        })
        .collect();
    let profile = PprofProfile {
        sample_type,
        function,
        location,
        sample,
        string_table: strings,
        time_nanos: 1,
        duration_nanos: 2,
        ..Default::default()
    };
    (profile, Model { samples: valid.then_some(samples), types }, gzip)
}

fn modelled(data: &[u8]) -> Outcome {
    let (profile, model, gzip) = build(&mut Recipe(data));
    let mut bytes = profile.encode_to_vec();
    if gzip {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).expect("gzip into memory");
        bytes = gz.finish().expect("gzip into memory");
    }
    let limits = ReadLimits::default();
    let read = StackProfile::from_bytes(&bytes, &limits);
    let Some(expected) = model.samples else {
        let e = read.expect_err("a dangling reference is an error");
        assert!(e.to_string().contains("which does not exist"), "{e}");
        return Outcome { refused: 1, modelled: 1, ..Default::default() };
    };
    let p = read.unwrap_or_else(|e| panic!("a valid profile is read: {e}"));
    assert_eq!(p.value_types.len(), model.types);
    assert_eq!(p.samples.len(), expected.len());
    for (s, (frames, values)) in p.samples.iter().zip(&expected) {
        assert_eq!(s.frames.len(), *frames);
        assert_eq!(&s.values, values);
    }
    for v in 0..model.types {
        let values: Vec<i64> = expected.iter().map(|(_, values)| values[v]).collect();
        let sum = exact(values.iter().copied());
        let saturating = values.iter().fold(0i64, |a, &b| a.saturating_add(b));
        assert_eq!(p.total(v), saturating, "total of value {v}");
        if fits(sum, &values) {
            assert_eq!(folded_sum(&p.folded(v, &FoldOptions::default()).expect("small")), sum);
        }
    }
    check_views(&p);
    let merged = stack_profile(&[&bytes, &bytes], &limits).expect("a profile merges with itself");
    for v in 0..model.types {
        let values: Vec<i64> = expected.iter().map(|(_, values)| values[v]).collect();
        let doubled: Vec<i64> = values.iter().chain(&values).copied().collect();
        if fits(exact(doubled.iter().copied()), &doubled) {
            assert_eq!(i128::from(merged.total(v)), 2 * exact(values), "merged total of {v}");
        }
    }
    Outcome { read: 1, modelled: 1, ..Default::default() }
}
