//! Converting Ruby arguments into the core's borrowed sample types.
//!
//! Everything that can raise, call Ruby or allocate Ruby objects happens here, *before* the
//! recorder takes a slot (docs/design.md, section 5: otherwise a second Ruby thread could run while a slot is
//! held and lose its sample). String bytes are copied into a per-thread scratch buffer, so the
//! sample borrows nothing from the Ruby heap and the GC may run freely meanwhile. The copy is
//! also where non-UTF-8 bytes become U+FFFD: pprof strings must be valid UTF-8.
use std::cell::Cell;

use ddprof_recorder_core::{ConfigError, Frame, Label, LabelValue, Sample, SpanId, ValueType};
use magnus::{
    prelude::*, r_hash::ForEach, rb_sys::AsRawValue, rb_sys::FromRawValue, value::LazyId,
    value::Opaque, Error, Fixnum, RArray, RBignum, RClass, RHash, RString, Ruby, Symbol, Value,
};

use crate::recorder::errors::{arg_error, type_error};

/// `Thread::Backtrace::Location`, set once at init.
static LOCATION_CLASS: std::sync::OnceLock<Opaque<RClass>> = std::sync::OnceLock::new();

pub fn init(ruby: &Ruby) -> Result<(), Error> {
    let class: RClass = ruby.eval("Thread::Backtrace::Location")?;
    // A constant's class is never collected; registering also pins it against compaction.
    ruby.gc_register_mark_object(class);
    let _ = LOCATION_CLASS.set(class.into());
    Ok(())
}

// Method names interned once: `funcall` with a `&str` would look the name up on every call.
static BASE_LABEL: LazyId = LazyId::new("base_label");
static PATH: LazyId = LazyId::new("path");
static LINENO: LazyId = LazyId::new("lineno");

/// A `(start, end)` byte range of [`Scratch::text`].
type Span = (usize, usize);

#[derive(Default)]
struct Scratch {
    /// Copies of every string of the sample, each one valid UTF-8.
    text: String,
    frames: Vec<(Span, Span, i64)>,
    values: Vec<i64>,
    labels: Vec<(Span, Result<Span, i64>)>,
}

thread_local! {
    /// Reused between calls on one thread: no allocation once it has grown. Taken out while in
    /// use, so a re-entrant call (a `to_s` that records a sample...) just gets a fresh one.
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

impl Scratch {
    fn push_bytes(&mut self, bytes: &[u8]) -> Span {
        let start = self.text.len();
        match std::str::from_utf8(bytes) {
            Ok(s) => self.text.push_str(s),
            Err(_) => self.text.push_str(&String::from_utf8_lossy(bytes)),
        }
        (start, self.text.len())
    }

    fn push_rstring(&mut self, s: RString) -> Span {
        // SAFETY: the slice is copied before any Ruby code can run (and move or free it).
        self.push_bytes(unsafe { s.as_slice() })
    }

    fn get(&self, (start, end): Span) -> &str {
        &self.text[start..end]
    }
}

/// The name of `v`'s class, for error messages. Calls no Ruby method (so no user code).
pub fn class_name(v: Value) -> String {
    // SAFETY: the borrowed name is copied at once.
    unsafe { v.classname() }.into_owned()
}

/// `v` as an i64, or an error naming `what`.
pub fn int64(ruby: &Ruby, v: Value, what: impl Fn() -> String) -> Result<i64, Error> {
    if let Some(n) = Fixnum::from_value(v) {
        return Ok(n.to_i64());
    }
    if let Some(n) = RBignum::from_value(v) {
        return n
            .to_i64()
            .map_err(|_| arg_error(ruby, format!("{} is out of signed 64-bit range", what())));
    }
    Err(type_error(ruby, format!("{} must be an Integer, got {}", what(), class_name(v))))
}

fn string(ruby: &Ruby, v: Value, what: impl Fn() -> String) -> Result<RString, Error> {
    RString::from_value(v).ok_or_else(|| {
        type_error(ruby, format!("{} must be a String, got {}", what(), class_name(v)))
    })
}

/// A String, or a Symbol's name (without allocating: `rb_sym2str` returns the symbol's own
/// frozen string).
fn string_or_symbol(ruby: &Ruby, v: Value, what: impl Fn() -> String) -> Result<RString, Error> {
    if let Some(s) = RString::from_value(v) {
        return Ok(s);
    }
    if Symbol::from_value(v).is_some() {
        // SAFETY: `v` is a Symbol; rb_sym2str does not raise and returns a String.
        let s = unsafe { Value::from_raw(rb_sys::rb_sym2str(v.as_raw())) };
        if let Some(s) = RString::from_value(s) {
            return Ok(s);
        }
    }
    Err(type_error(ruby, format!("{} must be a String or Symbol, got {}", what(), class_name(v))))
}

fn array(ruby: &Ruby, v: Value, what: &str) -> Result<RArray, Error> {
    RArray::from_value(v)
        .ok_or_else(|| type_error(ruby, format!("{what} must be an Array, got {}", class_name(v))))
}

/// Converts `record_sample`'s arguments and calls `f` with the sample, or raises naming the
/// bad argument. `f` runs with no Ruby value borrowed.
pub fn with_sample<R>(
    ruby: &Ruby,
    (locations, values, labels): (Value, Value, Value),
    value_types: &[ValueType],
    max_frames: usize,
    f: impl FnOnce(&Sample<'_>) -> R,
) -> Result<R, Error> {
    let mut scratch = SCRATCH.take();
    scratch.text.clear();
    scratch.frames.clear();
    scratch.values.clear();
    scratch.labels.clear();
    let result = convert(ruby, &mut scratch, (locations, values, labels), value_types, max_frames)
        .map(|omitted_frames| {
            let frames: Vec<Frame<'_>> = scratch
                .frames
                .iter()
                .map(|&(name, file, line)| Frame {
                    function_name: scratch.get(name),
                    filename: scratch.get(file),
                    line,
                })
                .collect();
            let labels = labels_of(&scratch);
            f(&Sample { frames: &frames, omitted_frames, values: &scratch.values, labels: &labels })
        });
    SCRATCH.set(scratch);
    result
}

/// Converts `values` and `labels` as `record_sample` does, and calls `f` with them (for a
/// stack that does not come from Ruby arguments). `f` runs with no Ruby value borrowed.
pub fn with_values_and_labels<R>(
    ruby: &Ruby,
    (values, labels): (Value, Value),
    value_types: &[ValueType],
    f: impl FnOnce(&[i64], &[Label<'_>]) -> R,
) -> Result<R, Error> {
    let mut scratch = SCRATCH.take();
    scratch.text.clear();
    scratch.values.clear();
    scratch.labels.clear();
    let converted = convert_values(ruby, &mut scratch, values, value_types)
        .and_then(|()| convert_labels(ruby, &mut scratch, labels));
    let result = converted.map(|()| f(&scratch.values, &labels_of(&scratch)));
    SCRATCH.set(scratch);
    result
}

fn labels_of(scratch: &Scratch) -> Vec<Label<'_>> {
    scratch
        .labels
        .iter()
        .map(|&(key, value)| Label {
            key: scratch.get(key),
            value: match value {
                Ok(s) => LabelValue::Str(scratch.get(s)),
                Err(n) => LabelValue::Num(n),
            },
        })
        .collect()
}

/// Fills `scratch`; returns how many root-side frames were left out (not converted).
fn convert(
    ruby: &Ruby,
    scratch: &mut Scratch,
    (locations, values, labels): (Value, Value, Value),
    value_types: &[ValueType],
    max_frames: usize,
) -> Result<usize, Error> {
    let locations = array(ruby, locations, "locations")?;
    let len = locations.len();
    // Frames past `max_frames - 1` become the placeholder: checked, but never copied.
    let keep = if len > max_frames { max_frames - 1 } else { len };
    for i in 0..len {
        let location: Value = locations.entry(i as isize)?;
        convert_location(ruby, scratch, location, i, i < keep)?;
    }
    convert_values(ruby, scratch, values, value_types)?;
    convert_labels(ruby, scratch, labels)?;
    Ok(len - scratch.frames.len())
}

fn convert_location(
    ruby: &Ruby,
    scratch: &mut Scratch,
    location: Value,
    i: usize,
    keep: bool,
) -> Result<(), Error> {
    if let Some(frame) = RArray::from_value(location) {
        if frame.len() != 3 {
            return Err(arg_error(
                ruby,
                format!(
                    "locations[{i}] must be [function_name, filename, line], got {} elements",
                    frame.len()
                ),
            ));
        }
        let name = string(ruby, frame.entry(0)?, || format!("locations[{i}][0] (function name)"))?;
        let file = string(ruby, frame.entry(1)?, || format!("locations[{i}][1] (filename)"))?;
        let line = int64(ruby, frame.entry(2)?, || format!("locations[{i}][2] (line)"))?;
        if keep {
            let (name, file) = (scratch.push_rstring(name), scratch.push_rstring(file));
            scratch.frames.push((name, file, line));
        }
        return Ok(());
    }
    let is_location =
        LOCATION_CLASS.get().is_some_and(|class| location.is_kind_of(ruby.get_inner(*class)));
    if !is_location {
        return Err(type_error(
            ruby,
            format!(
                "locations[{i}] must be a Thread::Backtrace::Location or a \
                 [function_name, filename, line] Array, got {}",
                class_name(location)
            ),
        ));
    }
    if !keep {
        return Ok(());
    }
    let text = |scratch: &mut Scratch, method: &LazyId, what: &str| -> Result<Span, Error> {
        let v: Value = location.funcall(LazyId::get_inner_with(method, ruby), ())?;
        if v.is_nil() {
            return Ok((scratch.text.len(), scratch.text.len()));
        }
        Ok(scratch.push_rstring(string(ruby, v, || format!("locations[{i}].{what}"))?))
    };
    let name = text(scratch, &BASE_LABEL, "base_label")?;
    let file = text(scratch, &PATH, "path")?;
    let line: Value = location.funcall(LazyId::get_inner_with(&LINENO, ruby), ())?;
    let line = int64(ruby, line, || format!("locations[{i}].lineno"))?;
    scratch.frames.push((name, file, line));
    Ok(())
}

fn convert_values(
    ruby: &Ruby,
    scratch: &mut Scratch,
    values: Value,
    value_types: &[ValueType],
) -> Result<(), Error> {
    if let Some(array) = RArray::from_value(values) {
        if array.len() != value_types.len() {
            return Err(arg_error(
                ruby,
                format!(
                    "values must have {} entries (one per value type: {}), got {}",
                    value_types.len(),
                    type_names(value_types),
                    array.len()
                ),
            ));
        }
        for i in 0..array.len() {
            let v = int64(ruby, array.entry(i as isize)?, || format!("values[{i}]"))?;
            scratch.values.push(v);
        }
        return Ok(());
    }
    let Some(hash) = RHash::from_value(values) else {
        return Err(type_error(
            ruby,
            format!("values must be a Hash or an Array of Integers, got {}", class_name(values)),
        ));
    };
    scratch.values.resize(value_types.len(), 0);
    let mut seen = vec![false; value_types.len()];
    hash.foreach(|key: Value, value: Value| {
        let key = string_or_symbol(ruby, key, || "values: a key".to_string())?;
        // SAFETY: compared at once, no Ruby code runs while borrowed.
        let key_bytes = unsafe { key.as_slice() };
        let Some(index) = value_types.iter().position(|vt| vt.r#type.as_bytes() == key_bytes)
        else {
            return Err(arg_error(
                ruby,
                format!(
                    "values: unknown value type {:?} (value types: {})",
                    String::from_utf8_lossy(key_bytes),
                    type_names(value_types)
                ),
            ));
        };
        let name = &value_types[index].r#type;
        if std::mem::replace(&mut seen[index], true) {
            return Err(arg_error(ruby, format!("values: {name:?} is given twice")));
        }
        scratch.values[index] = int64(ruby, value, || format!("values[{name:?}]"))?;
        Ok(ForEach::Continue)
    })
}

fn type_names(value_types: &[ValueType]) -> String {
    value_types.iter().map(|vt| vt.r#type.as_str()).collect::<Vec<_>>().join(", ")
}

fn convert_labels(ruby: &Ruby, scratch: &mut Scratch, labels: Value) -> Result<(), Error> {
    if labels.is_nil() {
        return Ok(());
    }
    let push = |scratch: &mut Scratch, i: usize, key: Value, value: Value| {
        let key = string_or_symbol(ruby, key, || format!("labels[{i}] key"))?;
        let value = if let Some(s) = RString::from_value(value) {
            Ok(scratch.push_rstring(s))
        } else if Fixnum::from_value(value).is_some() || RBignum::from_value(value).is_some() {
            Err(int64(ruby, value, || format!("labels[{i}] value"))?)
        } else {
            return Err(type_error(
                ruby,
                format!("labels[{i}] value must be a String or Integer, got {}", class_name(value)),
            ));
        };
        let key = scratch.push_rstring(key);
        scratch.labels.push((key, value));
        Ok::<(), Error>(())
    };
    if let Some(hash) = RHash::from_value(labels) {
        let mut i = 0;
        return hash.foreach(|key: Value, value: Value| {
            push(scratch, i, key, value)?;
            i += 1;
            Ok(ForEach::Continue)
        });
    }
    let Some(pairs) = RArray::from_value(labels) else {
        return Err(type_error(
            ruby,
            format!(
                "labels must be a Hash, an Array of [key, value] pairs or nil, got {}",
                class_name(labels)
            ),
        ));
    };
    for i in 0..pairs.len() {
        let pair: Value = pairs.entry(i as isize)?;
        let pair = RArray::from_value(pair).filter(|p| p.len() == 2).ok_or_else(|| {
            arg_error(
                ruby,
                format!("labels[{i}] must be a [key, value] pair, got {}", class_name(pair)),
            )
        })?;
        push(scratch, i, pair.entry(0)?, pair.entry(1)?)?;
    }
    Ok(())
}

/// `value_types:`: an Array of `[type, unit]` String pairs.
pub fn value_types(ruby: &Ruby, v: Value) -> Result<Vec<ValueType>, Error> {
    let list = array(ruby, v, "value_types")?;
    let mut out = Vec::with_capacity(list.len());
    for i in 0..list.len() {
        let pair: Value = list.entry(i as isize)?;
        let pair = RArray::from_value(pair).filter(|p| p.len() == 2).ok_or_else(|| {
            arg_error(ruby, format!("value_types[{i}] must be a [type, unit] pair of Strings"))
        })?;
        let r#type = text(ruby, pair.entry(0)?, &format!("value_types[{i}] type"))?;
        let unit = text(ruby, pair.entry(1)?, &format!("value_types[{i}] unit"))?;
        out.push(ValueType::new(r#type, unit));
    }
    Ok(out)
}

/// `comments=`'s argument: an Array of Strings, copied. Its length is checked first, so that a
/// huge Array is refused without copying it; the core checks the rest (`Recorder::set_comments`).
pub fn comments(ruby: &Ruby, v: Value) -> Result<Vec<String>, Error> {
    let list = array(ruby, v, "comments")?;
    if list.len() > ddprof_recorder_core::MAX_COMMENTS {
        return Err(arg_error(ruby, ConfigError::CommentsCount(list.len()).to_string()));
    }
    (0..list.len())
        .map(|i| text(ruby, list.entry(i as isize)?, &format!("comments[{i}]")))
        .collect()
}

/// `record_endpoint`'s span id: an Integer (any size) or a String. Bignums beyond i64 go
/// through their decimal digits, which is what a String of them would be.
pub enum OwnedSpanId {
    Num(i64),
    Str(String),
}

impl OwnedSpanId {
    pub fn as_span_id(&self) -> SpanId<'_> {
        match self {
            Self::Num(n) => SpanId::Num(*n),
            Self::Str(s) => SpanId::Str(s),
        }
    }
}

pub fn span_id(ruby: &Ruby, v: Value) -> Result<OwnedSpanId, Error> {
    if let Some(n) = Fixnum::from_value(v) {
        return Ok(OwnedSpanId::Num(n.to_i64()));
    }
    if let Some(n) = RBignum::from_value(v) {
        if let Ok(n) = n.to_i64() {
            return Ok(OwnedSpanId::Num(n));
        }
        let digits: Value = v.funcall("to_s", ())?;
        return Ok(OwnedSpanId::Str(text(ruby, digits, "local_root_span_id")?));
    }
    Ok(OwnedSpanId::Str(text(ruby, v, "local_root_span_id (an Integer or String)")?))
}

/// A String argument's text (lossy UTF-8), naming `what` if it is not a String.
pub fn text(ruby: &Ruby, v: Value, what: &str) -> Result<String, Error> {
    let s = string(ruby, v, || what.to_string())?;
    // SAFETY: copied at once, before any Ruby code runs.
    Ok(String::from_utf8_lossy(unsafe { s.as_slice() }).into_owned())
}
