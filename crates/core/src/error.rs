use std::fmt;

/// A recorder that cannot be built from the options it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    ValueTypesCount(usize),
    EmptyValueType {
        index: usize,
    },
    DuplicateValueType(String),
    MaxFrames(usize),
    /// A profile limit (`max_stacks`, ...) out of `1..=Limits::MAX`.
    Limit {
        name: &'static str,
        value: usize,
    },
    /// More than [`MAX_COMMENTS`](crate::MAX_COMMENTS) comments.
    CommentsCount(usize),
    /// Comment `index` is empty.
    EmptyComment {
        index: usize,
    },
    /// Comment `index` is longer than [`MAX_COMMENT_BYTES`](crate::MAX_COMMENT_BYTES).
    CommentTooLong {
        index: usize,
        bytes: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ValueTypesCount(n) => {
                write!(f, "value_types must have 1..={} entries, got {n}", crate::MAX_VALUE_TYPES)
            }
            Self::EmptyValueType { index } => {
                write!(f, "value_types[{index}] has an empty type or unit")
            }
            Self::DuplicateValueType(t) => write!(f, "value_types has {t:?} more than once"),
            Self::MaxFrames(n) => write!(
                f,
                "max_frames must be in {}..={}, got {n}",
                crate::MAX_FRAMES_RANGE.start(),
                crate::MAX_FRAMES_RANGE.end()
            ),
            Self::Limit { name, value } => {
                write!(f, "{name} must be in 1..={}, got {value}", crate::Limits::MAX)
            }
            Self::CommentsCount(n) => {
                write!(f, "comments must have at most {} entries, got {n}", crate::MAX_COMMENTS)
            }
            Self::EmptyComment { index } => write!(f, "comments[{index}] is empty"),
            Self::CommentTooLong { index, bytes } => write!(
                f,
                "comments[{index}] is {bytes} bytes long, more than {}",
                crate::MAX_COMMENT_BYTES
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a sample or endpoint was not recorded. Nothing is recorded when this is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// `values` has the wrong number of entries.
    ValuesLength {
        expected: usize,
        got: usize,
    },
    EmptyLabelKey,
    ReservedLabelKey,
    DuplicateLabelKey(String),
    /// The [`END_TIMESTAMP_LABEL`](crate::END_TIMESTAMP_LABEL) label is not a number of
    /// nanoseconds since the Unix epoch (a string, or negative).
    BadEndTimestamp,
    /// Both slots were taken twice in a row: never expected with one sampler at a time.
    SlotsBusy,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ValuesLength { expected, got } => {
                write!(f, "values must have {expected} entries (one per value type), got {got}")
            }
            Self::EmptyLabelKey => write!(f, "labels: a label key is empty"),
            Self::ReservedLabelKey => write!(
                f,
                "labels: {:?} is reserved (set by record_endpoint)",
                crate::TRACE_ENDPOINT_LABEL
            ),
            Self::DuplicateLabelKey(k) => write!(f, "labels: key {k:?} appears more than once"),
            Self::BadEndTimestamp => write!(
                f,
                "labels: {:?} must be an Integer, the sample's end time in nanoseconds since the \
                 Unix epoch (0 or more)",
                crate::END_TIMESTAMP_LABEL
            ),
            Self::SlotsBusy => write!(f, "failed to grab either slot: sample not recorded"),
        }
    }
}

impl std::error::Error for RecordError {}

/// A serialization that could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerializeError {
    /// Another serialization of this recorder is in progress (one serializer at a time; the
    /// serializer lock is never waited for).
    Busy,
    /// The serializer side does not hold the inactive slot (never expected).
    Inconsistent,
    /// Compression failed (out of memory in the compressor).
    Compression(String),
}

impl fmt::Display for SerializeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy => write!(
                f,
                "another serialization of this recorder is in progress (one serializer at a time)"
            ),
            Self::Inconsistent => {
                write!(f, "recorder slots are inconsistent (the inactive slot is not held)")
            }
            Self::Compression(e) => write!(f, "gzip compression failed: {e}"),
        }
    }
}

impl std::error::Error for SerializeError {}
