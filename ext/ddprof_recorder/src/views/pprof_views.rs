//! `DdprofRecorder._native_folded`, `_native_flamegraph`, `_native_speedscope`,
//! `_native_speedscope_timeline`, `_native_top`, `_native_top_by_label`,
//! `_native_summary`, `_native_timeline`, `_native_merge` and `_native_filter`: views of pprof profiles (raw or
//! gzip) for people, computed by the core's [`views`](ddprof_recorder_core::views) module,
//! their merge ([`merge`](ddprof_recorder_core::views::merge)) and the samples of some label
//! values ([`filter`](ddprof_recorder_core::views::filter)). The Ruby methods with keywords and
//! docs are in `lib/ddprof_recorder/pprof_views.rb`.
//!
//! Every entry point takes `limits` last, `[max_decompressed_bytes, max_output_bytes]` (the
//! latter nil for the default): the [`ReadLimits`] each pprof is read, and each view written,
//! within. The views and the merge take `labels` before it: `[[key, value], ...]`
//! Strings, the samples to keep ([`LabelFilter::text`], the `label:` keyword), all of them
//! matching, before the view is made.
//!
//! Each view takes one pprof String or an Array of them, merged into one profile first.
//! Each entry point copies the pprofs out of their Ruby Strings, then decodes, merges and
//! renders without the GVL (a large profile takes milliseconds), and builds Ruby objects from
//! plain Rust data once the GVL is back.
use ddprof_recorder_core::views::merge::{self, MergeError};
use ddprof_recorder_core::views::speedscope::SpeedscopeOptions;
use ddprof_recorder_core::views::timeline::{ThreadTimes, TimelineFormat};
use ddprof_recorder_core::views::{
    filter, reader, FoldOptions, LabelFilter, ReadLimits, ResolvedLabelValue as LabelValue,
    StackProfile, TopSort, ViewError as CoreError,
};
use ddprof_recorder_core::Compression;
use magnus::{function, prelude::*, Error, RArray, RHash, RModule, RString, Ruby, Symbol, Value};

use crate::recorder::convert::class_name;
use crate::recorder::errors::{arg_error, entry, gem_error, IntoRubyError, MergeInputError};
use crate::recorder::nogvl::nogvl;

/// The first bytes of a gzip stream (the core's reader tells gzip from raw by them too).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Label keys the profiler sets on every sample; the summary counts their distinct values.
const THREAD_ID_LABEL: &str = "thread id";
const THREAD_NAME_LABEL: &str = "thread name";
const PROCESS_ID_LABEL: &str = "process id";

/// The Symbols that name a timeline's format, a top table's order and a compression, as
/// [`symbol_choice`] takes them.
const TIMELINE_FORMATS: &[(&str, TimelineFormat)] =
    &[("svg", TimelineFormat::Svg), ("html", TimelineFormat::Html)];
const TOP_SORTS: &[(&str, TopSort)] =
    &[("self", TopSort::SelfValue), ("total", TopSort::TotalValue)];
const COMPRESSIONS: &[(&str, Compression)] =
    &[("none", Compression::None), ("gzip", Compression::Gzip)];

pub fn init(_ruby: &Ruby, module: RModule) -> Result<(), Error> {
    module.const_set("DEFAULT_OUTPUT_PER_BYTE", reader::OUTPUT_PER_BYTE)?;
    module.const_set("MIN_DEFAULT_OUTPUT_BYTES", reader::MIN_OUTPUT_BYTES)?;
    module.const_set("MAX_DRAWN_NAME_CHARS", reader::MAX_DRAWN_NAME_CHARS)?;
    module.define_singleton_method("_native_folded", function!(native_folded, 6))?;
    module.define_singleton_method("_native_flamegraph", function!(native_flamegraph, 7))?;
    module.define_singleton_method("_native_top", function!(native_top, 5))?;
    module.define_singleton_method("_native_top_by_label", function!(native_top_by_label, 5))?;
    module.define_singleton_method("_native_summary", function!(native_summary, 3))?;
    module.define_singleton_method("_native_merge", function!(native_merge, 4))?;
    module.define_singleton_method("_native_speedscope", function!(native_speedscope, 7))?;
    module.define_singleton_method(
        "_native_speedscope_timeline",
        function!(native_speedscope_timeline, 5),
    )?;
    module.define_singleton_method("_native_timeline", function!(native_timeline, 5))?;
    module.define_singleton_method("_native_filter", function!(native_filter, 5))?;
    Ok(())
}

/// The pprofs of a call: one String, or an Array of Strings (`array`: the caller gave an
/// Array, whose elements the messages then name `pprofs[i]`), the limits they are read
/// within, and the samples the view keeps.
struct Inputs {
    bytes: Vec<Vec<u8>>,
    array: bool,
    limits: ReadLimits,
    labels: Vec<LabelFilter>,
}

/// The `limits` argument: `[max_decompressed_bytes, max_output_bytes]`.
type Limits = (u64, Option<u64>);

/// The `labels` argument, `[[key, value], ...]`, as text filters.
type Labels = Vec<(String, String)>;

fn label_filters(labels: Labels) -> Vec<LabelFilter> {
    labels.into_iter().map(|(key, value)| LabelFilter::text(key, value)).collect()
}

/// Why a view of several inputs failed: reading or merging them, the view itself, or
/// encoding the merged profile.
enum ViewError {
    Merge(MergeError),
    View(CoreError),
    Encode(String),
}

impl From<CoreError> for ViewError {
    fn from(e: CoreError) -> Self {
        Self::View(e)
    }
}

fn to_ruby_error(ruby: &Ruby, e: ViewError, array: bool) -> Error {
    match e {
        ViewError::Merge(error) => MergeInputError { error, array }.into_ruby_error(ruby),
        ViewError::View(e) => e.into_ruby_error(ruby),
        ViewError::Encode(e) => gem_error(ruby, e),
    }
}

/// The pprof bytes of a String or of each String of an Array, copied: the Strings may change
/// or move once the GVL is released; each is read within `limits`, and the
/// samples that match every filter of `labels` are kept.
fn pprof_inputs(
    ruby: &Ruby,
    pprofs: Value,
    labels: Labels,
    limits: Limits,
) -> Result<Inputs, Error> {
    let labels = label_filters(labels);
    let limits = ReadLimits::new(limits.0).with_max_output(limits.1);
    let copy = |v: Value, name: &dyn Fn() -> String| -> Result<Vec<u8>, Error> {
        let s = RString::from_value(v).ok_or_else(|| {
            Error::new(
                ruby.exception_type_error(),
                format!("{} must be a String, got {}", name(), class_name(v)),
            )
        })?;
        // SAFETY: the slice is copied at once, before any Ruby code or allocation can run.
        let slice = unsafe { s.as_slice() };
        // A raw pprof over the limit is refused for its length: its first limit + 1 bytes say
        // so as well as all of it, without a copy of the rest (a 300 MB one, with a limit of
        // 1 MB, was copied whole).
        let keep = if slice.starts_with(&GZIP_MAGIC) {
            slice.len()
        } else {
            let most = limits.max_decompressed_bytes.saturating_add(1);
            slice.len().min(usize::try_from(most).unwrap_or(usize::MAX))
        };
        Ok(slice[..keep].to_vec())
    };
    match RArray::from_value(pprofs) {
        None => {
            let bytes = vec![copy(pprofs, &|| "pprof".to_string())?];
            Ok(Inputs { bytes, array: false, limits, labels })
        }
        Some(array) => {
            let mut bytes = Vec::with_capacity(array.len());
            // Indexing (not an iterator over the Array's memory): a conversion error raises
            // while nothing borrows the Array.
            for i in 0..array.len() {
                let v: Value = array.entry(i as isize)?;
                bytes.push(copy(v, &|| format!("pprofs[{i}]"))?);
            }
            Ok(Inputs { bytes, array: true, limits, labels })
        }
    }
}

/// Decodes (and merges) `inputs` and runs `view` on value `value`, all without the GVL.
fn with_profile<R: Send>(
    ruby: &Ruby,
    inputs: Inputs,
    value: String,
    view: impl Send + FnOnce(&StackProfile, usize) -> Result<R, CoreError>,
) -> Result<R, Error> {
    with_whole_profile(ruby, inputs, move |p| view(p, p.value_index(&value)?))
}

/// Decodes (and merges) `inputs`, keeps the samples of its labels and runs `view` on the
/// profile, all without the GVL.
fn with_whole_profile<R: Send>(
    ruby: &Ruby,
    inputs: Inputs,
    view: impl Send + FnOnce(&StackProfile) -> Result<R, CoreError>,
) -> Result<R, Error> {
    let Inputs { bytes, array, limits, labels } = inputs;
    nogvl(ruby, move || -> Result<R, ViewError> {
        let mut profile = merge::stack_profile(&bytes, &limits).map_err(ViewError::Merge)?;
        profile.keep_labels(&labels)?;
        Ok(view(&profile)?)
    })?
    .map_err(|e| to_ruby_error(ruby, e, array))
}

/// A view whose result is text: reads `pprof` (see [`pprof_inputs`]), runs `view` on the
/// profile without the GVL, and returns the text as a Ruby String.
fn text_view(
    ruby: &Ruby,
    pprof: Value,
    labels: Labels,
    limits: Limits,
    view: impl Send + FnOnce(&StackProfile) -> Result<String, CoreError>,
) -> Result<RString, Error> {
    let inputs = pprof_inputs(ruby, pprof, labels, limits)?;
    let text = with_whole_profile(ruby, inputs, view)?;
    Ok(ruby.str_new(&text))
}

/// A [`text_view`] of the value type named `value`, drawn as stacks with [`FoldOptions`]:
/// folded stacks, a flamegraph.
fn stacks_view(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    options: FoldOptions,
    labels: Labels,
    limits: Limits,
    view: impl Send + FnOnce(&StackProfile, usize, &FoldOptions) -> Result<String, CoreError>,
) -> Result<RString, Error> {
    text_view(ruby, pprof, labels, limits, move |p| view(p, p.value_index(&value)?, &options))
}

/// `_native_folded(pprof, value, filenames, root_label, labels, limits)` →
/// String of folded stack lines.
fn native_folded(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    filenames: bool,
    root_label: Option<String>,
    labels: Labels,
    limits: Limits,
) -> Result<RString, Error> {
    let options = FoldOptions { filenames, root_label, cut_names: false };
    entry(ruby, || {
        stacks_view(ruby, pprof, value, options, labels, limits, |p, i, o| p.folded(i, o))
    })
}

/// `_native_flamegraph(pprof, value, title, filenames, root_label, labels,
/// limits)` → SVG String.
#[allow(clippy::too_many_arguments)] // one per Ruby keyword
fn native_flamegraph(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    title: Option<String>,
    filenames: bool,
    root_label: Option<String>,
    labels: Labels,
    limits: Limits,
) -> Result<RString, Error> {
    let options = FoldOptions { filenames, root_label, cut_names: false };
    entry(ruby, || {
        stacks_view(ruby, pprof, value, options, labels, limits, move |p, i, o| {
            p.flamegraph(i, title.as_deref(), o)
        })
    })
}

/// `_native_speedscope(pprof, values, group_by, name, exporter, labels,
/// limits)` →
/// the speedscope JSON String: one profile per value type named in `values` (nil: every value
/// type of the pprof), or one per value type and value of the label `group_by`.
#[allow(clippy::too_many_arguments)] // one per Ruby keyword
fn native_speedscope(
    ruby: &Ruby,
    pprof: Value,
    values: Option<Vec<String>>,
    group_by: Option<String>,
    name: String,
    exporter: String,
    labels: Labels,
    limits: Limits,
) -> Result<RString, Error> {
    entry(ruby, || {
        let options = SpeedscopeOptions { name, exporter, group_by };
        text_view(ruby, pprof, labels, limits, move |p| {
            let indices = match values {
                None => (0..p.value_types.len()).collect(),
                Some(names) => {
                    names.iter().map(|v| p.value_index(v)).collect::<Result<Vec<_>, _>>()?
                }
            };
            p.speedscope(&indices, &options)
        })
    })
}

/// `_native_speedscope_timeline(pprof, name, exporter, labels, limits)` →
/// the speedscope JSON String of the dated samples: one time-ordered profile per thread.
fn native_speedscope_timeline(
    ruby: &Ruby,
    pprof: Value,
    name: String,
    exporter: String,
    labels: Labels,
    limits: Limits,
) -> Result<RString, Error> {
    entry(ruby, || {
        let options = SpeedscopeOptions { name, exporter, group_by: None };
        text_view(ruby, pprof, labels, limits, move |p| p.speedscope_timeline(&options))
    })
}

/// `_native_timeline(pprof, format, title, labels, limits)` → the timeline of
/// the dated samples, an SVG (`format` `:svg`) or HTML (`:html`) String.
fn native_timeline(
    ruby: &Ruby,
    pprof: Value,
    format: Symbol,
    title: String,
    labels: Labels,
    limits: Limits,
) -> Result<RString, Error> {
    entry(ruby, || {
        let format = symbol_choice(ruby, "format", format, TIMELINE_FORMATS)?;
        text_view(ruby, pprof, labels, limits, move |p| p.timeline(format, &title))
    })
}

/// `_native_filter(pprof, string_labels, number_labels, compression, limits)`
/// → one pprof String (`:gzip` or `:none`) with the samples that have every `[key, value]`
/// label of both Arrays.
fn native_filter(
    ruby: &Ruby,
    pprof: Value,
    string_labels: Vec<(String, String)>,
    number_labels: Vec<(String, i64)>,
    compression: Symbol,
    limits: Limits,
) -> Result<RString, Error> {
    entry(ruby, || {
        let compression = compression_of(ruby, compression)?;
        let labels: Vec<(String, LabelValue)> = string_labels
            .into_iter()
            .map(|(k, v)| (k, LabelValue::Str(v)))
            .chain(number_labels.into_iter().map(|(k, n)| (k, LabelValue::Num(n))))
            .collect();
        let Inputs { bytes, array, limits, .. } = pprof_inputs(ruby, pprof, Vec::new(), limits)?;
        let filtered = nogvl(ruby, move || {
            // One pprof is copied as the merge of itself: its errors are named as a view's.
            let mut profile = merge::merge_bytes(&bytes, &limits).map_err(ViewError::Merge)?;
            filter::filter(&mut profile, &labels)?;
            merge::encode(&profile, compression).map_err(|e| ViewError::Encode(e.to_string()))
        })?
        .map_err(|e| to_ruby_error(ruby, e, array))?;
        Ok(ruby.str_from_slice(&filtered))
    })
}

/// `:gzip` or `:none` as a [`Compression`].
fn compression_of(ruby: &Ruby, compression: Symbol) -> Result<Compression, Error> {
    symbol_choice(ruby, "compression", compression, COMPRESSIONS)
}

/// The value of the choice that `symbol` names among `choices` (`[(name, value), ...]`); any
/// other Symbol is an ArgumentError naming the choices in their order: `"{what} must be :a or
/// :b, got :{name}"`.
fn symbol_choice<T: Copy>(
    ruby: &Ruby,
    what: &str,
    symbol: Symbol,
    choices: &[(&str, T)],
) -> Result<T, Error> {
    let name = symbol.name()?;
    if let Some(&(_, value)) = choices.iter().find(|(choice, _)| *choice == name.as_ref()) {
        return Ok(value);
    }
    let names: Vec<String> = choices.iter().map(|(choice, _)| format!(":{choice}")).collect();
    Err(arg_error(ruby, format!("{what} must be {}, got :{name}", names.join(" or "))))
}

/// One row of `_native_top`: `[name, filename, self, total]`.
type TopRow = (String, String, i64, i64);

/// What both tops return before their rows: `[unit, total, profile_total, samples]`, the
/// value's unit and sum over the kept samples, its sum over the whole profile (before
/// `labels`), and how many (distinct pprof) samples were kept.
type TopHead = (String, i64, i64, usize);

fn top_head(p: &StackProfile, value: usize) -> TopHead {
    let profile_total = p.filtered.as_ref().map_or_else(|| p.total(value), |f| f.totals[value]);
    (p.value_types[value].1.clone(), p.total(value), profile_total, p.samples.len())
}

/// `_native_top(pprof, value, sort, labels, limits)` → `[unit, total,
/// profile_total, samples, [[name, filename, self, total], ...]]` ([`TopHead`]), every
/// function with some of the value, highest `sort` (`:self` or `:total`) first.
fn native_top(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    sort: Symbol,
    labels: Labels,
    limits: Limits,
) -> Result<(String, i64, i64, usize, Vec<TopRow>), Error> {
    entry(ruby, || {
        let sort = symbol_choice(ruby, "sort", sort, TOP_SORTS)?;
        let inputs = pprof_inputs(ruby, pprof, labels, limits)?;
        with_profile(ruby, inputs, value, move |p, i| {
            let rows = p
                .top(i, sort)
                .into_iter()
                .map(|r| (r.function.name, r.function.filename, r.self_value, r.total_value))
                .collect();
            let (unit, total, profile_total, samples) = top_head(p, i);
            Ok((unit, total, profile_total, samples, rows))
        })
    })
}

/// `_native_top_by_label(pprof, value, key, labels, limits)` → `[unit, total,
/// profile_total, samples, [[label value, sum], ...]]` ([`TopHead`]): the sum of the value
/// per value of label `key` (a String or an Integer; nil for the samples without it),
/// highest first.
fn native_top_by_label(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    key: String,
    labels: Labels,
    limits: Limits,
) -> Result<(String, i64, i64, usize, RArray), Error> {
    entry(ruby, || {
        let inputs = pprof_inputs(ruby, pprof, labels, limits)?;
        let (head, rows) = with_profile(ruby, inputs, value, move |p, i| {
            Ok((top_head(p, i), p.top_by_label(i, &key)?))
        })?;
        let rows = ruby.ary_from_iter(rows.into_iter().map(|r| {
            let label = r.label.map_or_else(|| ruby.qnil().as_value(), |l| label_value(ruby, l));
            ruby.ary_from_iter([label, ruby.integer_from_i64(r.value).as_value()])
        }));
        let (unit, total, profile_total, samples) = head;
        Ok((unit, total, profile_total, samples, rows))
    })
}

/// A label value as Ruby has it: a String or an Integer.
fn label_value(ruby: &Ruby, value: LabelValue) -> Value {
    match value {
        LabelValue::Str(s) => ruby.str_new(&s).as_value(),
        LabelValue::Num(n) => ruby.integer_from_i64(n).as_value(),
    }
}

/// What `_native_summary` computes without the GVL.
struct Summary {
    value_types: Vec<(String, String)>,
    totals: Vec<i64>,
    time_nanos: i64,
    duration_nanos: i64,
    samples: usize,
    functions: usize,
    thread_ids: Vec<LabelValue>,
    thread_names: Vec<LabelValue>,
    process_ids: Vec<LabelValue>,
    label_keys: Vec<String>,
    comments: Vec<String>,
    threads: Vec<ThreadTimes>,
}

/// `_native_summary(pprof, labels, limits)` → Hash with Symbol keys:
/// `:value_types` (`[[type, unit], ...]`), `:totals` (one per value type), `:time_nanos`,
/// `:duration_nanos`, `:samples` (distinct pprof samples), `:functions`, `:thread_ids`,
/// `:thread_names` and `:process_ids` (distinct label values), `:label_keys` (the distinct
/// label keys, sorted), `:comments` (each distinct comment once, in order), `:threads` (per thread
/// `[process id or nil, thread id, name, wall, running, waiting or nil, gc, blocked]`, ns:
/// `ThreadTimes`).
fn native_summary(
    ruby: &Ruby,
    pprof: Value,
    labels: Labels,
    limits: Limits,
) -> Result<RHash, Error> {
    entry(ruby, || {
        let inputs = pprof_inputs(ruby, pprof, labels, limits)?;
        let summary = with_whole_profile(ruby, inputs, |p| {
            Ok(Summary {
                totals: (0..p.value_types.len()).map(|i| p.total(i)).collect(),
                value_types: p.value_types.clone(),
                time_nanos: p.time_nanos,
                duration_nanos: p.duration_nanos,
                samples: p.samples.len(),
                functions: p.functions.len(),
                thread_ids: p.label_values(THREAD_ID_LABEL),
                thread_names: p.label_values(THREAD_NAME_LABEL),
                process_ids: p.label_values(PROCESS_ID_LABEL),
                label_keys: p.label_keys(),
                comments: p.distinct_comments(),
                threads: p.thread_times(),
            })
        })?;

        let labels = |values: Vec<LabelValue>| -> RArray {
            ruby.ary_from_iter(values.into_iter().map(|v| label_value(ruby, v)))
        };
        let hash = ruby.hash_new();
        hash.aset(ruby.to_symbol("value_types"), summary.value_types)?;
        hash.aset(ruby.to_symbol("totals"), summary.totals)?;
        hash.aset(ruby.to_symbol("time_nanos"), summary.time_nanos)?;
        hash.aset(ruby.to_symbol("duration_nanos"), summary.duration_nanos)?;
        hash.aset(ruby.to_symbol("samples"), summary.samples)?;
        hash.aset(ruby.to_symbol("functions"), summary.functions)?;
        hash.aset(ruby.to_symbol("thread_ids"), labels(summary.thread_ids))?;
        hash.aset(ruby.to_symbol("thread_names"), labels(summary.thread_names))?;
        hash.aset(ruby.to_symbol("process_ids"), labels(summary.process_ids))?;
        hash.aset(ruby.to_symbol("label_keys"), summary.label_keys)?;
        hash.aset(ruby.to_symbol("comments"), summary.comments)?;
        let threads = ruby.ary_from_iter(summary.threads.into_iter().map(|t| {
            (
                t.process,
                t.thread_id,
                t.name,
                t.wall_ns,
                t.running_ns,
                t.waiting_ns,
                t.gc_ns,
                t.blocked_ns,
            )
        }));
        hash.aset(ruby.to_symbol("threads"), threads)?;
        Ok(hash)
    })
}

/// `_native_merge(pprofs, compression, labels, limits)` → one pprof String
/// (`:gzip` or `:none`) holding the samples of every pprof of the Array `pprofs` that match
/// every filter of `labels`.
fn native_merge(
    ruby: &Ruby,
    pprofs: RArray,
    compression: Symbol,
    labels: Labels,
    limits: Limits,
) -> Result<RString, Error> {
    entry(ruby, || {
        let compression = compression_of(ruby, compression)?;
        let Inputs { bytes, array, limits, labels } =
            pprof_inputs(ruby, pprofs.as_value(), labels, limits)?;
        let merged = nogvl(ruby, move || {
            let mut profile = merge::merge_bytes(&bytes, &limits).map_err(ViewError::Merge)?;
            filter::filter_matching(&mut profile, &labels)?;
            merge::encode(&profile, compression).map_err(|e| ViewError::Encode(e.to_string()))
        })?
        .map_err(|e| to_ruby_error(ruby, e, array))?;
        Ok(ruby.str_from_slice(&merged))
    })
}
