//! Maps core errors and panics to Ruby exceptions.
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ddprof_recorder_core::RecordError;
use magnus::{prelude::*, Error, ExceptionClass, RModule, Ruby};

/// `ArgumentError` with `message`.
pub fn arg_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_arg_error(), message.into())
}

/// `TypeError` with `message`.
pub fn type_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_type_error(), message.into())
}

/// The exception a rejected sample raises: bad input is an `ArgumentError`; not finding a
/// slot (never expected) is a `RuntimeError`, as in the seed.
pub fn record_error(ruby: &Ruby, e: RecordError) -> Error {
    match e {
        RecordError::SlotsBusy => Error::new(ruby.exception_runtime_error(), e.to_string()),
        _ => arg_error(ruby, e.to_string()),
    }
}

/// `DdprofRecorder::Error`, looked up when needed (it is defined in Ruby, after this
/// extension loads); `RuntimeError` if it is missing.
pub fn gem_error_class(ruby: &Ruby) -> ExceptionClass {
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
    Error::new(gem_error_class(ruby), format!("internal error in ddprof_recorder: {detail}"))
}

/// Runs `f`, turning a panic into a Ruby exception.
pub fn guard<T>(ruby: &Ruby, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| Err(panic_error(ruby, panic)))
}
