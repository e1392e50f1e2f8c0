//! `DdprofRecorder._native_folded`, `_native_flamegraph`, `_native_top` and
//! `_native_summary`: views of a pprof (raw or gzip) for people, computed by the core's
//! [`folded`](ddprof_recorder_core::folded) module. The Ruby methods with keywords and docs
//! are in `lib/ddprof_recorder/pprof_views.rb`.
//!
//! Each entry point copies the pprof out of its Ruby String, then decodes and renders without
//! the GVL (a large profile takes milliseconds), and builds Ruby objects from plain Rust data
//! once the GVL is back.
use ddprof_recorder_core::folded::{FoldOptions, FoldedError, LabelValue, StackProfile};
use magnus::{function, prelude::*, Error, RArray, RHash, RModule, RString, Ruby, Value};

use crate::errors::{arg_error, gem_error_class, guard};
use crate::nogvl::nogvl;

/// Label keys the profiler sets on every sample; the summary counts their distinct values.
const THREAD_ID_LABEL: &str = "thread id";
const THREAD_NAME_LABEL: &str = "thread name";

pub fn init(_ruby: &Ruby, module: RModule) -> Result<(), Error> {
    module.define_singleton_method("_native_folded", function!(native_folded, 4))?;
    module.define_singleton_method("_native_flamegraph", function!(native_flamegraph, 5))?;
    module.define_singleton_method("_native_top", function!(native_top, 2))?;
    module.define_singleton_method("_native_summary", function!(native_summary, 1))?;
    Ok(())
}

/// A bad pprof or value name is the caller's bad argument; the rest is our failure.
fn view_error(ruby: &Ruby, e: FoldedError) -> Error {
    match e {
        FoldedError::NotPprof(_) | FoldedError::Gzip(_) | FoldedError::UnknownValue { .. } => {
            arg_error(ruby, e.to_string())
        }
        FoldedError::NothingToDraw(_) | FoldedError::Render(_) => {
            Error::new(gem_error_class(ruby), e.to_string())
        }
    }
}

/// The pprof bytes, copied: the String may change or move once the GVL is released.
fn pprof_bytes(ruby: &Ruby, pprof: Value) -> Result<Vec<u8>, Error> {
    let s = RString::from_value(pprof).ok_or_else(|| {
        Error::new(
            ruby.exception_type_error(),
            format!("pprof must be a String, got {}", class_name(pprof)),
        )
    })?;
    // SAFETY: the slice is copied at once, before any Ruby code or allocation can run.
    Ok(unsafe { s.as_slice() }.to_vec())
}

fn class_name(v: Value) -> String {
    // Naming the class calls no user code.
    v.class().inspect()
}

fn options(filenames: bool, root_label: Option<String>) -> FoldOptions {
    FoldOptions { filenames, root_label }
}

/// Decodes `bytes` and runs `view` on value `value`, all without the GVL.
fn with_profile<R: Send>(
    ruby: &Ruby,
    bytes: Vec<u8>,
    value: String,
    view: impl Send + FnOnce(&StackProfile, usize) -> Result<R, FoldedError>,
) -> Result<R, Error> {
    nogvl(ruby, move || {
        let profile = StackProfile::from_bytes(&bytes)?;
        let index = profile.value_index(&value)?;
        view(&profile, index)
    })?
    .map_err(|e| view_error(ruby, e))
}

/// `_native_folded(pprof, value, filenames, root_label)` → String of folded stack lines.
fn native_folded(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    filenames: bool,
    root_label: Option<String>,
) -> Result<RString, Error> {
    guard(ruby, || {
        let bytes = pprof_bytes(ruby, pprof)?;
        let opts = options(filenames, root_label);
        let folded = with_profile(ruby, bytes, value, move |p, i| Ok(p.folded(i, &opts)))?;
        Ok(ruby.str_new(&folded))
    })
}

/// `_native_flamegraph(pprof, value, title, filenames, root_label)` → SVG String.
fn native_flamegraph(
    ruby: &Ruby,
    pprof: Value,
    value: String,
    title: Option<String>,
    filenames: bool,
    root_label: Option<String>,
) -> Result<RString, Error> {
    guard(ruby, || {
        let bytes = pprof_bytes(ruby, pprof)?;
        let opts = options(filenames, root_label);
        let svg =
            with_profile(ruby, bytes, value, move |p, i| p.flamegraph(i, title.as_deref(), &opts))?;
        Ok(ruby.str_new(&svg))
    })
}

/// One row of `_native_top`: `[name, filename, self, total]`.
type TopRow = (String, String, i64, i64);

/// `_native_top(pprof, value)` → `[unit, total, [[name, filename, self, total], ...]]`,
/// every function with some of the value, highest self first.
fn native_top(
    ruby: &Ruby,
    pprof: Value,
    value: String,
) -> Result<(String, i64, Vec<TopRow>), Error> {
    guard(ruby, || {
        let bytes = pprof_bytes(ruby, pprof)?;
        with_profile(ruby, bytes, value, |p, i| {
            let rows = p
                .top(i)
                .into_iter()
                .map(|r| (r.function.name, r.function.filename, r.self_value, r.total_value))
                .collect();
            Ok((p.value_types[i].1.clone(), p.total(i), rows))
        })
    })
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
}

/// `_native_summary(pprof)` → Hash with Symbol keys: `:value_types` (`[[type, unit], ...]`),
/// `:totals` (one per value type), `:time_nanos`, `:duration_nanos`, `:samples` (distinct
/// pprof samples), `:functions`, `:thread_ids` and `:thread_names` (distinct label values).
fn native_summary(ruby: &Ruby, pprof: Value) -> Result<RHash, Error> {
    guard(ruby, || {
        let bytes = pprof_bytes(ruby, pprof)?;
        let summary = nogvl(ruby, move || {
            let p = StackProfile::from_bytes(&bytes)?;
            Ok(Summary {
                totals: (0..p.value_types.len()).map(|i| p.total(i)).collect(),
                value_types: p.value_types.clone(),
                time_nanos: p.time_nanos,
                duration_nanos: p.duration_nanos,
                samples: p.samples.len(),
                functions: p.functions.len(),
                thread_ids: p.label_values(THREAD_ID_LABEL),
                thread_names: p.label_values(THREAD_NAME_LABEL),
            })
        })?
        .map_err(|e| view_error(ruby, e))?;

        let labels = |values: Vec<LabelValue>| -> RArray {
            ruby.ary_from_iter(values.into_iter().map(|v| match v {
                LabelValue::Str(s) => ruby.str_new(&s).as_value(),
                LabelValue::Num(n) => ruby.integer_from_i64(n).as_value(),
            }))
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
        Ok(hash)
    })
}
