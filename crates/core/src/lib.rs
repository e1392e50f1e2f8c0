//! The pure-Rust core of `ddprof_recorder`: profile storage (string interning, functions,
//! locations, stacks and label sets stored once, samples aggregated by stack and label set),
//! pprof encoding, and the two-slot [`Recorder`] that lets one thread record samples while
//! another serializes, without the sampler ever waiting.
//!
//! Nothing here knows about Ruby: the binding in `ext/ddprof_recorder` converts Ruby values
//! into the borrowed [`Sample`] / [`Frame`] / [`Label`] types and calls [`Recorder`].
//!
//! No unsafe code (`forbid`): the locks and atomics the two-slot protocol needs are
//! parking_lot's and std's, fork recovery included.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod error;
mod hash;
pub mod pprof;
mod profile;
mod recorder;
mod sample;
mod strings;
mod time;
pub mod views;

pub use error::{ConfigError, RecordError, SerializeError};
pub use pprof::Compression;
pub use profile::{Limits, Profile};
pub use recorder::{Config, Output, PendingFlip, Recorder, Serialized, StatsSnapshot};
pub use sample::{Frame, Label, LabelValue, Sample, SpanId, ValueType};
pub use time::Timestamp;

/// Function name of the one frame of the placeholder sample that samples over the profile
/// [`Limits`] fold into.
pub const DROPPED_FRAME: &str = "(dropped: profile limits reached)";
/// Label key set on samples by [`Recorder::record_endpoint`]; callers may not use it.
pub const TRACE_ENDPOINT_LABEL: &str = "trace endpoint";
/// Numeric label key that makes a sample a timed one: kept apart, with its end time (Unix
/// nanoseconds), not aggregated (see [`Profile`]). The name dd-trace-rb's profiles use.
pub const END_TIMESTAMP_LABEL: &str = "end_timestamp_ns";
/// Label key whose value links a sample to an endpoint.
pub const LOCAL_ROOT_SPAN_ID_LABEL: &str = "local root span id";
/// Most value types a profile may have.
pub const MAX_VALUE_TYPES: usize = 16;
/// Smallest and largest accepted `max_frames`.
pub const MAX_FRAMES_RANGE: std::ops::RangeInclusive<usize> = 2..=10_000;
/// Most comments ([`Recorder::set_comments`]) a recorder's profiles may carry, and the longest
/// one, in bytes. Comments say how a profile was recorded, in a line or two each; every window
/// interns them again, beyond `max_strings`, so their size is bounded like the rest of a
/// window: 64 comments of 4 KiB are 256 KiB at most, a mistake (a comment per sample) an error.
pub const MAX_COMMENTS: usize = 64;
pub const MAX_COMMENT_BYTES: usize = 4096;
