//! The pprof reader: bytes (raw or gzip) to checked messages ([`decode`]), then to a resolved
//! [`StackProfile`] whose stacks are function indices and whose labels are strings.
//!
//! The input is untrusted, so reading is bounded by [`ReadLimits`]:
//! - the protobuf bytes, after gunzip or as given, are at most
//!   [`ReadLimits::max_decompressed_bytes`] (1 GiB by default). A gzip stream is decompressed
//!   into a buffer only up to [`IN_ONE_PASS`]; past that it is first counted without being kept,
//!   so a gzip bomb is refused having cost the decoder's window of memory, not the limit;
//! - what decoding and resolving allocate (estimated from the field counts before prost
//!   decodes anything, see [`super::scan`], then counted while resolving: frames, names, labels)
//!   are at most [`MEMORY_PER_BYTE`] bytes per byte of the limit, per pprof read: a small pprof
//!   whose samples repeat a location of thousands of inline lines, or whose labels repeat a
//!   huge string, is refused, not expanded;
//! - what a view writes, and holds to write it (folded stacks, a flamegraph, a timeline, a
//!   speedscope file), is at most [`ReadLimits::max_output_bytes`], by default
//!   [`OUTPUT_PER_BYTE`] times the protobuf bytes it read, and at least [`MIN_OUTPUT_BYTES`]:
//!   bounded by what was read, not by the limit (a 2,978-byte pprof, one 256 KiB function name
//!   400 frames deep, made `folded` write 1.05 GB while the bound was 16 GiB);
//! - a name a view draws (a flamegraph's frame, a timeline's hover) is cut at
//!   [`MAX_DRAWN_NAME_CHARS`];
//! - a sample's stack is at most [`MAX_STACK_DEPTH`] frames.
//!
//! References cannot loop: samples point to locations, locations to functions and mappings,
//! everything to strings, and resolving follows each reference once, so an id that points
//! nowhere is an error and none can send the reader round in circles. A recursive stack (the
//! same function twice) is an ordinary stack; `top` counts it once per sample.
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read as _};
use std::mem::size_of;

use prost::Message as _;

use super::filter::Filtered;
use super::{scan, ViewError};
use crate::pprof::PprofProfile;

/// Bytes of memory reading may take per byte of [`ReadLimits::max_decompressed_bytes`]:
/// decoding and resolving together, then each folded or flamegraph output. Measured with the
/// budget's own accounting on the profiler's pprofs (2026-12, four threads of Ruby recursion at
/// 999 Hz, and a 6 MB recorder profile of 50,000 samples 20 to 80 frames deep): decoding takes
/// 3.2 to 7.0 bytes per protobuf byte and resolving 3.5 to 7.1 more, 14.1 at most in all; 16
/// lets any real profile under the limit be read.
pub const MEMORY_PER_BYTE: u64 = 16;

/// What a view may write, by default, per protobuf byte read (all the inputs' together).
/// Measured on the profiler's pprofs (2026-12, four threads of Ruby recursion 20 to 110 deep
/// at 999 Hz, 12,571 protobuf bytes): folded stacks 5.3 bytes per byte, a flamegraph 4.5, a
/// timeline page 3.9; a stack's frames take a byte or two each in the pprof and a name each
/// in folded text, so long names in deep stacks need more: 64 leaves room for names of 60
/// characters down every stack.
pub const OUTPUT_PER_BYTE: u64 = 64;

/// The smallest default output bound: a tiny pprof's view has fixed costs (a flamegraph's
/// header and script are about 30 KB), and a small profile's views are cheap anyway.
pub const MIN_OUTPUT_BYTES: u64 = 64 << 20;

/// Characters of a function name that the views which draw names show (a flamegraph's
/// frames, a timeline's hover text); a longer one is cut there, with `…` in place of the rest.
/// Real names are far shorter (Ruby's longest in a Rails app's profile: about 120 with the
/// file); a 64 KiB method name made a 236 MB flamegraph from a 2.3 KB profile.
pub const MAX_DRAWN_NAME_CHARS: usize = 500;

/// `name`, cut to [`MAX_DRAWN_NAME_CHARS`] characters (the last one `…`) if it is longer.
pub(crate) fn drawn_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(MAX_DRAWN_NAME_CHARS) {
        None => std::borrow::Cow::Borrowed(name),
        Some(_) => {
            let cut =
                name.char_indices().nth(MAX_DRAWN_NAME_CHARS - 1).map_or(name.len(), |(i, _)| i);
            std::borrow::Cow::Owned(format!("{}…", &name[..cut]))
        }
    }
}

/// Most frames (locations and their inline lines) one sample's stack may have in a view: the
/// recorder writes at most 10,001 (`MAX_FRAMES_RANGE` and its placeholder), and inlining in
/// other tools' profiles multiplies that by a few at most.
pub const MAX_STACK_DEPTH: usize = 65_536;

/// Decompressed bytes kept on the first pass over a gzip stream. A profile up to this size is
/// decompressed once; a larger one is counted first (without keeping it) and decompressed
/// again, so that a bomb costs no more memory than this to refuse. 64 MiB: the profiler's
/// largest pprofs (a minute of a busy server) are a few MiB once decompressed.
pub const IN_ONE_PASS: u64 = 64 << 20;

/// What reading one pprof may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Most bytes of protobuf a pprof may have, once decompressed (or as given, raw).
    pub max_decompressed_bytes: u64,
    /// Most bytes a view may write (and hold to write it); `None`: [`OUTPUT_PER_BYTE`] times
    /// the protobuf bytes read, at least [`MIN_OUTPUT_BYTES`].
    pub max_output_bytes: Option<u64>,
}

impl ReadLimits {
    /// 1 GiB: far above any real profile, far below what would exhaust a machine.
    pub const DEFAULT_MAX_DECOMPRESSED_BYTES: u64 = 1 << 30;

    pub fn new(max_decompressed_bytes: u64) -> Self {
        Self { max_decompressed_bytes, max_output_bytes: None }
    }

    /// These limits, with views' outputs bounded at `max_output_bytes` (`None`: the default).
    pub fn with_max_output(self, max_output_bytes: Option<u64>) -> Self {
        Self { max_output_bytes, ..self }
    }
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self::new(Self::DEFAULT_MAX_DECOMPRESSED_BYTES)
    }
}

/// Smallest budget, whatever the limit: a tiny pprof's fixed costs (the decoded message
/// structs, a flamegraph's header) must fit when the limit is set to its size.
const MIN_BUDGET: u64 = 1 << 20;

/// Memory left to one read ([`MEMORY_PER_BYTE`] × the limit × the pprofs read, at least
/// [`MIN_BUDGET`]) or one view's output ([`ReadLimits::max_output_bytes`]), charged as things
/// are allocated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    left: u64,
    kind: BudgetKind,
}

/// What a [`Budget`] bounds, for its error.
#[derive(Debug, Clone, Copy)]
enum BudgetKind {
    /// Reading, under this `max_decompressed_bytes`.
    Read { limit: u64 },
    /// A view's output, of at most `limit` bytes; `asked`: given as `max_output_bytes`.
    Output { limit: u64, asked: bool },
}

impl Budget {
    /// The budget of reading `inputs` pprofs (at least one) under `limits`.
    pub(crate) fn new(limits: &ReadLimits, inputs: usize) -> Self {
        let left = limits
            .max_decompressed_bytes
            .saturating_mul(MEMORY_PER_BYTE)
            .saturating_mul(inputs.max(1) as u64)
            .max(MIN_BUDGET);
        Self { left, kind: BudgetKind::Read { limit: limits.max_decompressed_bytes } }
    }

    /// The budget of each view's output, after reading `read_bytes` of protobuf under
    /// `limits`.
    pub(crate) fn output(limits: &ReadLimits, read_bytes: u64) -> Self {
        let (limit, asked) = match limits.max_output_bytes {
            Some(limit) => (limit, true),
            None => (read_bytes.saturating_mul(OUTPUT_PER_BYTE).max(MIN_OUTPUT_BYTES), false),
        };
        Self { left: limit, kind: BudgetKind::Output { limit, asked } }
    }

    /// Takes `bytes` from the budget, or fails saying `what` needed them.
    pub(crate) fn charge(&mut self, bytes: u64, what: &'static str) -> Result<(), ViewError> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(match self.kind {
                BudgetKind::Read { limit } => ViewError::OverBudget { what, limit },
                BudgetKind::Output { limit, asked } => {
                    ViewError::OutputTooLarge { what, limit, asked }
                }
            }),
        }
    }

    pub(crate) fn charge_usize(
        &mut self,
        bytes: usize,
        what: &'static str,
    ) -> Result<(), ViewError> {
        self.charge(u64::try_from(bytes).unwrap_or(u64::MAX), what)
    }

    /// Fails as [`Self::charge_usize`] would, without taking anything.
    pub(crate) fn check_usize(&self, bytes: usize, what: &'static str) -> Result<(), ViewError> {
        self.clone().charge_usize(bytes, what)
    }
}

/// A function as pprof names it: name and file. Empty names stay empty here; views decide
/// how to show them ([`StackProfile::frame_name`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResolvedFunction {
    pub name: String,
    pub filename: String,
}

/// A label value read from a pprof: a string or a number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResolvedLabelValue {
    Str(String),
    Num(i64),
}

impl fmt::Display for ResolvedLabelValue {
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
    pub labels: Vec<(String, ResolvedLabelValue)>,
}

/// A decoded, checked pprof.
#[derive(Debug, Clone)]
pub struct StackProfile {
    /// `(type, unit)` per value, in value order.
    pub value_types: Vec<(String, String)>,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// The profile's comments (pprof's `comment` field), in order.
    pub comments: Vec<String>,
    pub functions: Vec<ResolvedFunction>,
    pub samples: Vec<StackSample>,
    /// Set by [`StackProfile::keep_labels`]: which samples it kept, and the totals before.
    pub filtered: Option<Filtered>,
    /// What each view's output may take (a fresh copy for each view: [`Budget::output`]).
    pub(crate) output_budget: Budget,
}

/// A frame name safe for the folded format: `;` separates frames and a line ends at `\n`, so
/// neither may appear inside a name (`:` and a space take their places).
pub(crate) fn sanitize(name: &str) -> String {
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

/// The protobuf of a gzip stream, at most `limit` bytes of it, decompressed once if it is at
/// most `one_pass` bytes ([`IN_ONE_PASS`]), else counted first.
fn gunzip(bytes: &[u8], limit: u64, one_pass: u64) -> Result<Vec<u8>, ViewError> {
    let too_large = || ViewError::TooLarge { limit, gzip: true };
    let first = limit.min(one_pass);
    let guess = u64::try_from(bytes.len()).unwrap_or(u64::MAX).saturating_mul(4);
    let mut raw = Vec::with_capacity(usize::try_from(guess.min(first)).unwrap_or(0));
    flate2::read::MultiGzDecoder::new(bytes)
        .take(first.saturating_add(1))
        .read_to_end(&mut raw)
        .map_err(ViewError::Gzip)?;
    if raw.len() as u64 <= first {
        return Ok(raw);
    }
    if first == limit {
        return Err(too_large());
    }
    // Longer than a first pass keeps: count it all without keeping it, then keep it.
    drop(raw);
    let mut counted = flate2::read::MultiGzDecoder::new(bytes).take(limit.saturating_add(1));
    let len = io::copy(&mut counted, &mut io::sink()).map_err(ViewError::Gzip)?;
    if len > limit {
        return Err(too_large());
    }
    let mut raw = Vec::with_capacity(usize::try_from(len).map_err(|_| too_large())?);
    flate2::read::MultiGzDecoder::new(bytes)
        .take(len)
        .read_to_end(&mut raw)
        .map_err(ViewError::Gzip)?;
    Ok(raw)
}

/// The protobuf messages of a pprof, raw or gzip-compressed (told apart by the gzip magic
/// number), within `limits` and `budget`; references not checked yet.
pub(crate) fn decode_within(
    bytes: &[u8],
    limits: &ReadLimits,
    budget: &mut Budget,
) -> Result<PprofProfile, ViewError> {
    let limit = limits.max_decompressed_bytes;
    let gunzipped;
    let raw = if bytes.starts_with(&GZIP_MAGIC) {
        gunzipped = gunzip(bytes, limit, IN_ONE_PASS)?;
        &gunzipped[..]
    } else if bytes.len() as u64 > limit {
        return Err(ViewError::TooLarge { limit, gzip: false });
    } else {
        bytes
    };
    if raw.is_empty() {
        return Err(ViewError::NotPprof("the input is empty".to_string()));
    }
    budget.charge(scan::decoded_size(raw), "decoding the pprof")?;
    PprofProfile::decode(raw)
        .map_err(|e| ViewError::NotPprof(format!("protobuf decoding failed: {e}")))
}

/// The protobuf messages of a pprof, raw or gzip-compressed (told apart by the gzip magic
/// number), within `limits`; references not checked yet.
pub fn decode(bytes: &[u8], limits: &ReadLimits) -> Result<PprofProfile, ViewError> {
    decode_within(bytes, limits, &mut Budget::new(limits, 1))
}

fn not_pprof(what: String) -> ViewError {
    ViewError::NotPprof(what)
}

/// The strings of a profile, with the index checks every reference needs.
struct Strings<'a>(&'a [String]);

impl Strings<'_> {
    fn get(&self, index: i64, what: &str) -> Result<&str, ViewError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.0.get(i))
            .map(String::as_str)
            .ok_or_else(|| not_pprof(format!("{what} refers to string {index}, past the table")))
    }
}

/// The functions of a profile, deduplicated by (name, filename) (pprof allows several ids for
/// one), and its locations as their frames.
struct Frames {
    functions: Vec<ResolvedFunction>,
    index: HashMap<ResolvedFunction, usize>,
    by_function_id: HashMap<u64, usize>,
    /// Each location as its frames, innermost first.
    by_location_id: HashMap<u64, Vec<usize>>,
}

impl Frames {
    fn intern(
        &mut self,
        function: ResolvedFunction,
        budget: &mut Budget,
    ) -> Result<usize, ViewError> {
        if let Some(&i) = self.index.get(&function) {
            return Ok(i);
        }
        // Twice: the list and the index each hold the strings.
        let bytes =
            2 * (size_of::<ResolvedFunction>() + function.name.len() + function.filename.len());
        budget.charge_usize(bytes, "the functions' names")?;
        self.functions.push(function.clone());
        self.index.insert(function, self.functions.len() - 1);
        Ok(self.functions.len() - 1)
    }

    fn read(
        p: &PprofProfile,
        strings: &Strings<'_>,
        budget: &mut Budget,
    ) -> Result<Self, ViewError> {
        let mut frames = Frames {
            functions: Vec::with_capacity(p.function.len()),
            index: HashMap::new(),
            by_function_id: HashMap::with_capacity(p.function.len()),
            by_location_id: HashMap::with_capacity(p.location.len()),
        };
        for f in &p.function {
            let function = ResolvedFunction {
                name: strings.get(f.name, "a function name")?.to_string(),
                filename: strings.get(f.filename, "a function filename")?.to_string(),
            };
            let index = frames.intern(function, budget)?;
            frames.by_function_id.insert(f.id, index);
        }
        for l in &p.location {
            let mut location = Vec::with_capacity(l.line.len().max(1));
            for line in &l.line {
                let index =
                    frames.by_function_id.get(&line.function_id).copied().ok_or_else(|| {
                        not_pprof(format!(
                            "location {} refers to function {}, which does not exist",
                            l.id, line.function_id
                        ))
                    })?;
                location.push(index);
            }
            if location.is_empty() {
                // An unsymbolized location: show its address, as pprof does.
                let function = ResolvedFunction {
                    name: format!("0x{:x}", l.address),
                    filename: String::new(),
                };
                location.push(frames.intern(function, budget)?);
            }
            frames.by_location_id.insert(l.id, location);
        }
        Ok(frames)
    }

    /// The frames of a sample's locations, leaf first, at most [`MAX_STACK_DEPTH`].
    fn stack(&self, location_ids: &[u64], budget: &mut Budget) -> Result<Vec<usize>, ViewError> {
        let mut frames = Vec::with_capacity(location_ids.len().min(MAX_STACK_DEPTH));
        for id in location_ids {
            let location = self.by_location_id.get(id).ok_or_else(|| {
                not_pprof(format!("a sample refers to location {id}, which does not exist"))
            })?;
            if frames.len() + location.len() > MAX_STACK_DEPTH {
                let depth = location_ids
                    .iter()
                    .map(|id| self.by_location_id.get(id).map_or(0, Vec::len))
                    .fold(0usize, usize::saturating_add);
                return Err(ViewError::StackTooDeep { depth });
            }
            frames.extend_from_slice(location);
        }
        budget.charge_usize(frames.len() * size_of::<usize>(), "the samples' stacks")?;
        Ok(frames)
    }
}

fn labels(
    sample: &crate::pprof::PprofSample,
    strings: &Strings<'_>,
    budget: &mut Budget,
) -> Result<Vec<(String, ResolvedLabelValue)>, ViewError> {
    sample
        .label
        .iter()
        .map(|l| {
            let key = strings.get(l.key, "a label key")?;
            let value = if l.str != 0 {
                ResolvedLabelValue::Str(strings.get(l.str, "a label value")?.to_string())
            } else {
                ResolvedLabelValue::Num(l.num)
            };
            let text = match &value {
                ResolvedLabelValue::Str(s) => s.len(),
                ResolvedLabelValue::Num(_) => 0,
            };
            let bytes = size_of::<(String, ResolvedLabelValue)>() + key.len() + text;
            budget.charge_usize(bytes, "the samples' labels")?;
            Ok((key.to_string(), value))
        })
        .collect()
}

impl StackProfile {
    /// Decodes a pprof, raw or gzip-compressed (told apart by the gzip magic number), within
    /// `limits`.
    pub fn from_bytes(bytes: &[u8], limits: &ReadLimits) -> Result<Self, ViewError> {
        let mut budget = Budget::new(limits, 1);
        let p = decode_within(bytes, limits, &mut budget)?;
        let output = Budget::output(limits, p.encoded_len() as u64);
        Self::resolve(p, budget, output)
    }

    /// Checks every reference of `p` and builds the resolved form, charging it to `budget`;
    /// the views' outputs get `output_budget` each.
    pub(crate) fn resolve(
        p: PprofProfile,
        mut budget: Budget,
        output_budget: Budget,
    ) -> Result<Self, ViewError> {
        let strings = Strings(&p.string_table);
        if p.string_table.first().map(String::as_str) != Some("") {
            return Err(not_pprof("the string table does not start with an empty string".into()));
        }
        if p.sample_type.is_empty() {
            return Err(not_pprof("it has no sample types".into()));
        }
        let value_types = p
            .sample_type
            .iter()
            .map(|vt| {
                let name = strings.get(vt.r#type, "a sample type")?.to_string();
                Ok((name, strings.get(vt.unit, "a unit")?.to_string()))
            })
            .collect::<Result<Vec<_>, ViewError>>()?;
        let comments = p
            .comment
            .iter()
            .map(|&c| {
                let comment = strings.get(c, "a comment")?;
                budget.charge_usize(size_of::<String>() + comment.len(), "the comments")?;
                Ok(comment.to_string())
            })
            .collect::<Result<Vec<_>, ViewError>>()?;

        let frames = Frames::read(&p, &strings, &mut budget)?;
        let mut samples = Vec::with_capacity(p.sample.len());
        for s in &p.sample {
            if s.value.len() != value_types.len() {
                return Err(not_pprof(format!(
                    "a sample has {} values for {} sample types",
                    s.value.len(),
                    value_types.len()
                )));
            }
            samples.push(StackSample {
                frames: frames.stack(&s.location_id, &mut budget)?,
                values: s.value.clone(),
                labels: labels(s, &strings, &mut budget)?,
            });
        }

        Ok(Self {
            value_types,
            time_nanos: p.time_nanos,
            duration_nanos: p.duration_nanos,
            comments,
            functions: frames.functions,
            samples,
            filtered: None,
            output_budget,
        })
    }

    /// Position of the value type named `name` (e.g. `"cpu-time"`).
    pub fn value_index(&self, name: &str) -> Result<usize, ViewError> {
        self.value_types.iter().position(|(t, _)| t == name).ok_or_else(|| {
            ViewError::UnknownValue {
                asked: name.to_string(),
                available: self.value_types.iter().map(|(t, _)| t.clone()).collect(),
            }
        })
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
}

#[cfg(test)]
mod tests {
    use super::super::test_profiles::profile;
    use super::super::FoldOptions;
    use super::*;
    use crate::pprof::{PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofSample};
    use std::io::Write as _;

    fn gzip(raw: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(raw).unwrap();
        gz.finish().unwrap()
    }

    fn read(bytes: &[u8]) -> Result<StackProfile, ViewError> {
        StackProfile::from_bytes(bytes, &ReadLimits::default())
    }

    #[test]
    fn reads_gzip_like_raw() {
        let raw = profile(&[(&[3, 2, 1], [7, 8], "t")]).encode_to_vec();
        let a = read(&raw).unwrap();
        let b = read(&gzip(&raw)).unwrap();
        assert_eq!(a.folded(0, &FoldOptions::default()).unwrap(), "main;work;spin 7\n");
        assert_eq!(
            b.folded(0, &FoldOptions::default()).unwrap(),
            a.folded(0, &FoldOptions::default()).unwrap()
        );
        assert_eq!((b.time_nanos, b.duration_nanos), (1_000, 5_000));
    }

    #[test]
    fn rejects_what_is_not_a_pprof() {
        let err = |bytes: &[u8]| read(bytes).unwrap_err().to_string();
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
    fn reads_the_comments_in_order_and_checks_them() {
        let mut p = profile(&[(&[3], [1, 1], "t")]);
        assert!(read(&p.encode_to_vec()).unwrap().comments.is_empty());
        p.string_table.push("sampling: at each tick".into());
        let tick = p.string_table.len() as i64 - 1;
        p.comment = vec![tick, 4, tick];
        let comments = read(&p.encode_to_vec()).unwrap().comments;
        assert_eq!(comments, ["sampling: at each tick", "main", "sampling: at each tick"]);

        p.comment.push(99);
        let e = read(&p.encode_to_vec()).unwrap_err().to_string();
        assert!(e.contains("a comment refers to string 99"), "{e}");

        // A huge string named by many comments is refused, not copied each time.
        let mut p = profile(&[]);
        p.string_table.push("x".repeat(1 << 20));
        p.comment = vec![p.string_table.len() as i64 - 1; 64];
        let limits = ReadLimits::new(2 << 20);
        let e = StackProfile::from_bytes(&p.encode_to_vec(), &limits).unwrap_err();
        assert!(matches!(e, ViewError::OverBudget { what: "the comments", .. }), "{e}");
    }

    #[test]
    fn unknown_value_names_the_available_ones() {
        let raw = profile(&[]).encode_to_vec();
        let e = read(&raw).unwrap().value_index("alloc-samples").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown value type \"alloc-samples\"; this profile has: cpu-time, wall-time"
        );
    }

    #[test]
    fn refuses_more_protobuf_than_the_limit_raw_or_gzip() {
        let raw = profile(&[(&[3, 2, 1], [7, 8], "t")]).encode_to_vec();
        let len = raw.len() as u64;
        let at =
            |limit: u64, bytes: &[u8]| StackProfile::from_bytes(bytes, &ReadLimits::new(limit));
        assert!(at(len, &raw).is_ok());
        assert!(at(len, &gzip(&raw)).is_ok());
        let e = at(len - 1, &raw).unwrap_err();
        assert!(e.is_limit());
        assert_eq!(
            e.to_string(),
            format!(
                "the pprof is more than {} bytes (max_decompressed_bytes: {0}); raise \
                 max_decompressed_bytes to read it",
                len - 1
            )
        );
        let e = at(len - 1, &gzip(&raw)).unwrap_err();
        assert!(matches!(e, ViewError::TooLarge { gzip: true, .. }), "{e}");
        assert!(e.to_string().contains("once decompressed (max_decompressed_bytes:"), "{e}");
    }

    #[test]
    fn a_stream_longer_than_one_pass_is_counted_before_it_is_kept() {
        let raw = profile(&[(&[3, 2, 1], [7, 8], "t")]).encode_to_vec();
        let len = raw.len() as u64;
        let gz = gzip(&raw);
        // Past the first pass, under the limit: counted, then decompressed whole.
        assert_eq!(gunzip(&gz, len, 10).unwrap(), raw);
        assert_eq!(gunzip(&gz, 1 << 30, 10).unwrap(), raw);
        // Past the limit, on either path.
        assert!(matches!(gunzip(&gz, len - 1, 10), Err(ViewError::TooLarge { .. })));
        assert!(matches!(gunzip(&gz, len - 1, 1 << 20), Err(ViewError::TooLarge { .. })));
        // A bomb: 8 MiB of zeros is refused by a 1 MiB limit.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..8 {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20);
        assert!(matches!(gunzip(&bomb, 1 << 20, 1 << 16), Err(ViewError::TooLarge { .. })));
    }

    #[test]
    fn refuses_a_profile_that_decodes_to_many_times_its_size() {
        // 1 MiB of empty samples (2 bytes each): 36 MiB once decoded, over 16 x 2 MiB.
        let mut bomb = profile(&[]).encode_to_vec();
        bomb.extend([0x12, 0x00].repeat(512 * 1024));
        let limits = ReadLimits::new(2 << 20);
        let e = StackProfile::from_bytes(&bomb, &limits).unwrap_err();
        assert!(matches!(e, ViewError::OverBudget { what: "decoding the pprof", .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "decoding the pprof would take more memory than 16 x max_decompressed_bytes ({}) \
                 per pprof; raise max_decompressed_bytes to read it",
                2 << 20
            )
        );
        assert!(decode(&gzip(&bomb), &limits).unwrap_err().is_limit());
        // The same samples with a larger limit: read (and rejected for what they are).
        let e = StackProfile::from_bytes(&bomb, &ReadLimits::new(8 << 20)).unwrap_err();
        assert!(e.to_string().contains("0 values for 2 sample types"), "{e}");
    }

    #[test]
    fn refuses_a_stack_deeper_than_the_views_read() {
        // One location of 1,000 inline lines, 100 times in one sample: 100,000 frames.
        let mut p = profile(&[]);
        p.location[0].line = vec![PprofLine { function_id: 1, line: 1 }; 1_000];
        p.sample.push(PprofSample { location_id: vec![1; 100], value: vec![1, 1], label: vec![] });
        let e = read(&p.encode_to_vec()).unwrap_err();
        assert!(e.is_limit());
        assert_eq!(
            e.to_string(),
            "a sample's stack has 100000 frames, more than the 65536 a view reads (locations \
             and their inline lines)"
        );
        p.sample[0].location_id.truncate(65);
        assert_eq!(read(&p.encode_to_vec()).unwrap().samples[0].frames.len(), 65_000);
    }

    #[test]
    fn refuses_labels_and_functions_that_repeat_a_huge_string() {
        let limits = ReadLimits::new(2 << 20);
        let mut p = profile(&[]);
        p.string_table.push("k".repeat(1 << 20));
        let huge = p.string_table.len() as i64 - 1;
        let label = PprofLabel { key: huge, str: huge, num: 0, num_unit: 0 };
        p.sample.push(PprofSample {
            location_id: vec![1],
            value: vec![1, 1],
            label: vec![label; 24],
        });
        let e = StackProfile::from_bytes(&p.encode_to_vec(), &limits).map(drop).unwrap_err();
        assert!(matches!(e, ViewError::OverBudget { what: "the samples' labels", .. }), "{e}");

        let mut p = profile(&[]);
        p.string_table.push("f".repeat(1 << 20));
        let huge = p.string_table.len() as i64 - 1;
        // Twelve functions of that name in different files: 24 MiB of names (list and index).
        for i in 0..12 {
            p.string_table.push(format!("f{i}.rb"));
            let filename = p.string_table.len() as i64 - 1;
            p.function.push(PprofFunction {
                id: 100 + i,
                name: huge,
                filename,
                ..Default::default()
            });
        }
        let limits = ReadLimits::new((1 << 20) + 4096);
        let e = StackProfile::from_bytes(&p.encode_to_vec(), &limits).map(drop).unwrap_err();
        assert!(matches!(e, ViewError::OverBudget { what: "the functions' names", .. }), "{e}");
    }

    #[test]
    fn refuses_folded_stacks_over_the_output_bound_of_what_was_read() {
        // A 256 KiB name 400 times down one stack: 105 MB of folded text from a 262 KB pprof,
        // more than the default bound (64 x 262 KB = 16.8 MB, so the 64 MiB floor) whatever
        // the read limit.
        let mut p = profile(&[]);
        p.string_table[4] = "m".repeat(256 << 10);
        p.sample.push(PprofSample { location_id: vec![1; 400], value: vec![1, 1], label: vec![] });
        let bytes = p.encode_to_vec();
        let limits = ReadLimits::default();
        let read = StackProfile::from_bytes(&bytes, &limits).unwrap();
        let e = read.folded(0, &FoldOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                ViewError::OutputTooLarge {
                    what: "the folded stacks",
                    limit: MIN_OUTPUT_BYTES,
                    asked: false
                }
            ),
            "{e}"
        );
        assert!(e.is_limit());
        // The flamegraph cuts the name: it draws.
        assert!(read.flamegraph(0, None, &FoldOptions::default()).is_ok());
        let raised = StackProfile::from_bytes(&bytes, &limits.with_max_output(Some(256 << 20)));
        assert_eq!(
            raised.unwrap().folded(0, &FoldOptions::default()).unwrap().len(),
            400 * (256 << 10) + 399 + 3
        );
        let lowered = StackProfile::from_bytes(&bytes, &limits.with_max_output(Some(1000)));
        let e = lowered.unwrap().folded(0, &FoldOptions::default()).unwrap_err();
        assert!(matches!(e, ViewError::OutputTooLarge { limit: 1000, asked: true, .. }), "{e}");
    }

    #[test]
    fn the_default_output_bound_grows_with_what_was_read() {
        let limits = ReadLimits::default();
        assert_eq!(Budget::output(&limits, 0).left, MIN_OUTPUT_BYTES);
        assert_eq!(Budget::output(&limits, 10 << 20).left, OUTPUT_PER_BYTE * (10 << 20));
        assert_eq!(Budget::output(&limits.with_max_output(Some(5)), 10 << 20).left, 5);
    }

    #[test]
    fn drawn_names_are_cut_at_their_limit() {
        assert_eq!(drawn_name("short"), "short");
        let exact = "é".repeat(MAX_DRAWN_NAME_CHARS);
        assert_eq!(drawn_name(&exact), exact);
        let cut = drawn_name(&"é".repeat(MAX_DRAWN_NAME_CHARS + 1)).into_owned();
        assert_eq!(cut.chars().count(), MAX_DRAWN_NAME_CHARS);
        assert!(cut.ends_with("é…"), "{cut}");
    }

    #[test]
    fn ids_that_point_nowhere_are_errors_and_recursion_is_a_stack() {
        let mut p = profile(&[(&[1, 1, 1], [1, 1], "t")]);
        // A location pointing to itself is not a thing pprof can say: ids point down only.
        p.location.push(PprofLocation {
            id: 5,
            line: vec![PprofLine { function_id: 5, line: 1 }],
            ..Default::default()
        });
        let e = read(&p.encode_to_vec()).unwrap_err();
        assert!(e.to_string().contains("location 5 refers to function 5"), "{e}");
        p.location.pop();
        let p = read(&p.encode_to_vec()).unwrap();
        assert_eq!(p.folded(0, &FoldOptions::default()).unwrap(), "main;main;main 1\n");
    }
}
