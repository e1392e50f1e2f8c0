//! Reading a pprof back, for people: folded stacks, a flamegraph, a "top" table, a summary and
//! a speedscope file; the merge of several pprofs and the samples of some label values.
//!
//! These views are what the `ddprof-recorder` command and the `DdprofRecorder.folded` /
//! `.flamegraph` / ... methods show. They decode any pprof (ours, raw or gzip, or another
//! tool's) with the prost messages of [`crate::pprof`]; [`reader`] checks every reference once
//! and builds a resolved [`StackProfile`]: stacks as function indices, so that folding,
//! ranking and drawing never look an id up again. One file per view: [`folded`], [`top`] (by
//! function or by a label's values), [`flamegraph`], [`summary`], [`speedscope`],
//! [`timeline`]; [`merge`] works on the decoded messages, and [`filter`] on either (the
//! views' `--label KEY=VALUE`).
//!
//! A pprof to read is untrusted input (a file from anywhere, a request body): [`ReadLimits`]
//! bounds the memory that reading it and drawing it may take, and every failure is a
//! [`ViewError`], never a panic.
use std::fmt;

pub mod filter;
pub mod flamegraph;
pub mod folded;
pub mod merge;
pub mod reader;
mod scan;
pub mod speedscope;
pub mod summary;
pub mod timeline;
pub mod top;

#[cfg(test)]
mod test_profiles;

pub use filter::{LabelFilter, LabelMatch};
pub use folded::FoldOptions;
pub use reader::{
    decode, ReadLimits, ResolvedFunction, ResolvedLabelValue, StackProfile, StackSample,
    MAX_DRAWN_NAME_CHARS, MAX_STACK_DEPTH,
};
pub use top::{LabelTotal, TopEntry, TopSort};

/// Why a profile cannot be read or a view cannot be made from it.
#[derive(Debug)]
pub enum ViewError {
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
    /// The pprof's protobuf bytes (after gunzip, or as given) are more than
    /// [`ReadLimits::max_decompressed_bytes`]. `gzip`: it came compressed.
    TooLarge { limit: u64, gzip: bool },
    /// Reading the pprofs or writing a view of them would take more memory than their
    /// budget ([`reader::MEMORY_PER_BYTE`] bytes per byte of `limit`, the
    /// [`ReadLimits::max_decompressed_bytes`], per pprof read); `what` says for what.
    OverBudget { what: &'static str, limit: u64 },
    /// A view would write (and hold) more than its output bound: `limit` bytes, given as
    /// [`ReadLimits::max_output_bytes`] (`asked`) or the default from what was read
    /// ([`reader::OUTPUT_PER_BYTE`] per protobuf byte, at least [`reader::MIN_OUTPUT_BYTES`]).
    OutputTooLarge { what: &'static str, limit: u64, asked: bool },
    /// A timeline was asked of a profile none of whose samples has a time.
    NoTimeline,
    /// A sample's stack has more than [`MAX_STACK_DEPTH`] frames (inline lines included).
    StackTooDeep { depth: usize },
    /// A label key that no sample of the profile has (to filter or group by); `available`:
    /// the keys its samples have, sorted.
    UnknownLabel { key: String, available: Vec<String> },
    /// Nothing to draw: no sample has the labels [`StackProfile::keep_labels`] kept
    /// (`labels`: them, as `key=value and ...`).
    NoMatch { labels: String },
}

impl ViewError {
    /// Whether the error is one of [`ReadLimits`]' bounds (the input may be a valid pprof,
    /// only too large to read with these limits) rather than a broken input.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            Self::TooLarge { .. }
                | Self::OverBudget { .. }
                | Self::OutputTooLarge { .. }
                | Self::StackTooDeep { .. }
        )
    }
}

impl fmt::Display for ViewError {
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
            Self::TooLarge { limit, gzip: true } => write!(
                f,
                "the pprof is more than {limit} bytes once decompressed \
                 (max_decompressed_bytes: {limit}); raise max_decompressed_bytes to read it"
            ),
            Self::TooLarge { limit, gzip: false } => write!(
                f,
                "the pprof is more than {limit} bytes (max_decompressed_bytes: {limit}); \
                 raise max_decompressed_bytes to read it"
            ),
            Self::OverBudget { what, limit } => write!(
                f,
                "{what} would take more memory than {} x max_decompressed_bytes ({limit}) per \
                 pprof; raise max_decompressed_bytes to read it",
                reader::MEMORY_PER_BYTE
            ),
            Self::OutputTooLarge { what, limit, asked: true } => write!(
                f,
                "{what} would be more than {limit} bytes (max_output_bytes: {limit}); raise \
                 max_output_bytes to write them"
            ),
            Self::OutputTooLarge { what, limit, asked: false } => write!(
                f,
                "{what} would be more than {limit} bytes (max_output_bytes: by default {} x the \
                 pprof's protobuf bytes, at least {} MiB); raise max_output_bytes to write them",
                reader::OUTPUT_PER_BYTE,
                reader::MIN_OUTPUT_BYTES >> 20
            ),
            Self::NoTimeline => f.write_str(
                "nothing to draw: no sample has a time (label end_timestamp_ns); record with \
                 --timeline (Profiler.new(timeline: true))",
            ),
            Self::UnknownLabel { key, available } if available.is_empty() => {
                write!(f, "no sample has a label {key:?}; this profile's samples have no labels")
            }
            Self::UnknownLabel { key, available } => write!(
                f,
                "no sample has a label {key:?}; this profile's labels: {}",
                available.join(", ")
            ),
            Self::NoMatch { labels } => write!(f, "nothing to draw: no sample has {labels}"),
            Self::StackTooDeep { depth } => write!(
                f,
                "a sample's stack has {depth} frames, more than the {MAX_STACK_DEPTH} a view \
                 reads (locations and their inline lines)"
            ),
        }
    }
}

impl std::error::Error for ViewError {}
