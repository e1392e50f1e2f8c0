//! How every `_native_*` entry point runs ([`entry`]), and how core errors and panics become
//! Ruby exceptions ([`IntoRubyError`], [`panic_error`]).
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ddprof_recorder_core::views::merge::MergeError;
use ddprof_recorder_core::views::ViewError;
use ddprof_recorder_core::{ConfigError, RecordError};
use magnus::{prelude::*, Error, ExceptionClass, RModule, Ruby};

/// Runs the body of a `_native_*` entry point, turning a panic into a `DdprofRecorder::Error`.
/// magnus would turn it into `fatal`, which ends the process. Every entry point's body runs
/// through it: the module functions directly, a recorder's entry points through
/// `StackRecorder::entry`, which adds the fork check inside it.
pub fn entry<T>(ruby: &Ruby, body: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| Err(panic_error(ruby, panic)))
}

/// `ArgumentError` with `message`.
pub fn arg_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_arg_error(), message.into())
}

/// `TypeError` with `message`.
pub fn type_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_type_error(), message.into())
}

/// `DdprofRecorder::Error` with `message`: a failure of ours, not the caller's bad argument.
pub fn gem_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(gem_error_class(ruby), message.into())
}

/// `DdprofRecorder::Error`, looked up when needed (it is defined in Ruby, after this
/// extension loads); `RuntimeError` if it is missing.
fn gem_error_class(ruby: &Ruby) -> ExceptionClass {
    ruby.class_object()
        .const_get::<_, RModule>("DdprofRecorder")
        .and_then(|m| m.const_get::<_, ExceptionClass>("Error"))
        .unwrap_or_else(|_| ruby.exception_runtime_error())
}

/// A caught panic as a `DdprofRecorder::Error`, so that it never unwinds into Ruby's C frames
/// and never terminates the process as magnus's own `fatal` would.
pub fn panic_error(ruby: &Ruby, panic: Box<dyn Any + Send>) -> Error {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    gem_error(ruby, format!("internal error in ddprof_recorder: {detail}"))
}

/// The one mapping of the core's errors to Ruby exceptions: the caller's bad input is an
/// `ArgumentError`; a failure of ours is a `DdprofRecorder::Error` (not finding a slot stays a
/// `RuntimeError`, as in dd-trace-rb). (A failed serialization is not raised: `_native_serialize`
/// and `_native_clear` return `[:error, message]`.)
pub trait IntoRubyError {
    fn into_ruby_error(self, ruby: &Ruby) -> Error;
}

impl IntoRubyError for ConfigError {
    fn into_ruby_error(self, ruby: &Ruby) -> Error {
        arg_error(ruby, self.to_string())
    }
}

impl IntoRubyError for RecordError {
    fn into_ruby_error(self, ruby: &Ruby) -> Error {
        match self {
            RecordError::SlotsBusy => Error::new(ruby.exception_runtime_error(), self.to_string()),
            _ => arg_error(ruby, self.to_string()),
        }
    }
}

/// A view of a bad pprof or of a value name it does not have is a bad argument; a pprof over
/// the read limits, and the rest, a `DdprofRecorder::Error`.
impl IntoRubyError for ViewError {
    fn into_ruby_error(self, ruby: &Ruby) -> Error {
        match self {
            ViewError::NotPprof(_)
            | ViewError::Gzip(_)
            | ViewError::UnknownValue { .. }
            | ViewError::UnknownLabel { .. } => arg_error(ruby, self.to_string()),
            ViewError::NothingToDraw(_)
            | ViewError::NoMatch { .. }
            | ViewError::NoTimeline
            | ViewError::Render(_)
            | ViewError::TooLarge { .. }
            | ViewError::OverBudget { .. }
            | ViewError::OutputTooLarge { .. }
            | ViewError::StackTooDeep { .. } => gem_error(ruby, self.to_string()),
        }
    }
}

/// A [`MergeError`] of the pprofs given as one String (`array: false`, named `pprof`) or as an
/// Array (`array: true`, named `pprofs[i]`).
pub struct MergeInputError {
    pub error: MergeError,
    pub array: bool,
}

/// A profile that cannot be read is a bad argument; one over the read limits, and profiles
/// that cannot be merged (their value types differ), are a `DdprofRecorder::Error`.
impl IntoRubyError for MergeInputError {
    fn into_ruby_error(self, ruby: &Ruby) -> Error {
        let Self { error, array } = self;
        let message =
            error.describe(|i| if array { format!("pprofs[{i}]") } else { "pprof".to_string() });
        match error {
            MergeError::Input { error, .. } if !array => error.into_ruby_error(ruby),
            MergeError::NoInput => arg_error(ruby, "pprofs is empty: give at least one pprof"),
            MergeError::Input { error, .. } if error.is_limit() => gem_error(ruby, message),
            MergeError::Input { .. } => arg_error(ruby, message),
            MergeError::ValueTypes { .. } => gem_error(ruby, message),
        }
    }
}
