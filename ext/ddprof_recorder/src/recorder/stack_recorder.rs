//! `DdprofRecorder::StackRecorder`: a TypedData object around the core's two-slot
//! [`Recorder`], and its `_native_*` entry points. The public Ruby methods, keywords and
//! docs are in `lib/ddprof_recorder/stack_recorder.rb`.
//!
//! Every entry point's body runs through [`StackRecorder::entry`]: the fork check, then the
//! body, with a panic in either caught and raised as `DdprofRecorder::Error`. Each Rust entry
//! point is named after its Ruby method, `native_` for `_native_` (a `?` dropped); the
//! `StackRecorder::Testing` hooks are in [`crate::recorder::testing`].
//!
//! # Reset after a fork, without a hook
//!
//! Each recorder remembers the fork generation ([`crate::recorder::fork`]) it last ran in;
//! the fork check compares it with the process's, and on a mismatch the recorder is reset
//! before anything else.
//!
//! A reset never touches the locks of the recorder it replaces: the object holds the core
//! recorder in a cell, and the reset swaps a new one in (the core's `Recorder::after_fork` in a
//! child, which leaves the parent's locks as the fork left them, or `Recorder::renewed` by
//! hand). The cell is only read and written with the GVL held, and no Ruby code runs between a
//! read and the end of its use, except through an `Arc` clone: a serialization keeps the
//! recorder it started with until it ends, even if a by-hand reset swaps another in meanwhile.
//! In a child there is one thread, the one that forked, and it holds the GVL. The Ruby-side
//! serializer `Mutex` is replaced too (`_native_serializer_mutex`), so that no lock of a thread
//! that did not survive the fork is ever waited for.
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use ddprof_recorder_core::pprof::{output_capacity, LARGE_OUTPUT};
use ddprof_recorder_core::{
    Compression, Config, Limits, Output, Recorder, SerializeError, Serialized, Timestamp,
};
use magnus::{
    function, method, prelude::*, rb_sys::AsRawValue, typed_data::Obj, value::ReprValue,
    DataTypeFunctions, Error, RArray, RClass, RHash, RModule, RString, Ruby, Symbol, Time,
    TypedData, Value,
};

use crate::recorder::convert;
use crate::recorder::errors::{arg_error, entry, IntoRubyError};
use crate::recorder::fork::{self, fork_generation};
use crate::recorder::nogvl::{nogvl, nogvl_or_here};
use crate::recorder::testing;

#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::StackRecorder", free_immediately, size)]
pub struct StackRecorder {
    /// The core recorder, swapped whole by a reset. Only read or written with the GVL held
    /// (see [`StackRecorder::recorder`]).
    recorder: UnsafeCell<Arc<Recorder>>,
    compression: Compression,
    /// The fork generation when this process last used the recorder.
    fork_generation: AtomicU64,
    /// The fork generation when the Ruby serializer `Mutex` (`@serialize_mutex`) was made, or
    /// [`NO_MUTEX`] when the next serializer must make a new one.
    mutex_generation: AtomicU64,
}

impl DataTypeFunctions for StackRecorder {
    /// `ObjectSpace.memsize_of`: this struct and the native memory both profiles hold. Called
    /// with the GVL (possibly while another thread serializes without it): reads the recorder's
    /// lock-free size caches, never a lock. Must not panic, and does not.
    fn size(&self) -> usize {
        // SAFETY: called with the GVL held, and no reset is under way (a reset runs no Ruby
        // code, so no GC, between its read and its write of the cell).
        let recorder = unsafe { &*self.recorder.get() };
        std::mem::size_of_val(self) + recorder.heap_bytes()
    }
}

/// `mutex_generation` of a recorder whose serializer `Mutex` must be (re)made.
const NO_MUTEX: u64 = u64::MAX;

impl StackRecorder {
    fn new(recorder: Recorder, compression: Compression) -> Self {
        Self {
            recorder: UnsafeCell::new(Arc::new(recorder)),
            compression,
            fork_generation: AtomicU64::new(fork_generation()),
            mutex_generation: AtomicU64::new(NO_MUTEX),
        }
    }

    /// Runs the body of an entry point on this recorder: the fork check (a reset if this is the
    /// first use in a forked child), then `body` with the core recorder, a panic in either
    /// becoming a `DdprofRecorder::Error`. Called with the GVL held, as entry points are.
    pub(super) fn entry<T>(
        &self,
        ruby: &Ruby,
        body: impl FnOnce(Arc<Recorder>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        entry(ruby, || {
            if self.fork_generation.load(Relaxed) != fork_generation() {
                self.reset(Reset::AfterFork);
            }
            body(self.recorder())
        })
    }

    /// The core recorder, as an `Arc` that stays valid whatever a reset swaps in meanwhile.
    pub(super) fn recorder(&self) -> Arc<Recorder> {
        // SAFETY: only called with the GVL held (from entry points), and every write of the
        // cell (`reset`) holds it too, so no write runs during this read.
        Arc::clone(unsafe { &*self.recorder.get() })
    }

    /// Swaps in a recorder in the initial state, as used in this process (the current fork
    /// generation), with a fresh serializer `Mutex` at the next serialization. Called by entry
    /// points only, so with the GVL held.
    #[cold]
    fn reset(&self, why: Reset) {
        let now = Timestamp::now();
        #[cfg(feature = "test-panics")]
        testing::panics::maybe_panic_in_reset();
        let renewed = match why {
            Reset::AfterFork => None,
            Reset::ByHand => Some(Arc::new(self.recorder().renewed(now))),
        };
        // SAFETY: with the GVL held (see above), and no other reference into the cell is live:
        // readers clone the `Arc` out, and nothing from here to the end of the borrow can run
        // Ruby code or a GC (`size`). A serialization in progress keeps its own clone.
        let cell = unsafe { &mut *self.recorder.get() };
        match renewed {
            // The recorder as the fork left it: the core swaps in a new one without touching
            // its locks, and decides whether it can be freed.
            None => Recorder::after_fork(cell, now),
            Some(renewed) => drop(std::mem::replace(cell, renewed)),
        }
        self.mutex_generation.store(NO_MUTEX, Relaxed);
        self.fork_generation.store(fork_generation(), Relaxed);
    }
}

/// Why a recorder is reset.
#[derive(Clone, Copy)]
enum Reset {
    AfterFork,
    ByHand,
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    convert::init(ruby)?;
    // Process-wide, for every folder's state; here because this init runs first (lib.rs).
    fork::install_handler(ruby)?;
    let class = module.define_class("StackRecorder", ruby.class_object())?;
    // Instances only come from `_native_new`: a bare `allocate` would have no recorder.
    class.undef_default_alloc_func();
    class.define_singleton_method("_native_new", method!(native_new, 8))?;
    // The core's limits, so that the Ruby keywords' defaults cannot drift from them.
    class.const_set("MAX_LIMIT", Limits::MAX)?;
    class.const_set("DEFAULT_MAX_STACKS", Limits::DEFAULT.max_stacks)?;
    class.const_set("DEFAULT_MAX_STRINGS", Limits::DEFAULT.max_strings)?;
    class.const_set("DEFAULT_MAX_LABEL_SETS", Limits::DEFAULT.max_label_sets)?;
    class.const_set("DEFAULT_MAX_SAMPLES", Limits::DEFAULT.max_samples)?;
    class.const_set("DEFAULT_MAX_TIMED_SAMPLES", Limits::DEFAULT.max_timed_samples)?;
    let end_timestamp_label = ruby.str_new(ddprof_recorder_core::END_TIMESTAMP_LABEL);
    end_timestamp_label.freeze();
    class.const_set("END_TIMESTAMP_LABEL", end_timestamp_label)?;
    class.const_set("MAX_COMMENTS", ddprof_recorder_core::MAX_COMMENTS)?;
    class.const_set("MAX_COMMENT_BYTES", ddprof_recorder_core::MAX_COMMENT_BYTES)?;
    class.define_singleton_method("_native_serialize", function!(native_serialize, 1))?;
    class.define_singleton_method("_native_clear", function!(native_clear, 1))?;
    class.define_singleton_method(
        "_native_reset_after_fork",
        function!(native_reset_after_fork, 1),
    )?;
    class.define_singleton_method(
        "_native_serializer_mutex",
        function!(native_serializer_mutex, 1),
    )?;
    class.define_method("_native_record_sample", method!(native_record_sample, 3))?;
    class.define_method("_native_record_captured", method!(native_record_captured, 3))?;
    class.define_method("_native_record_endpoint", method!(native_record_endpoint, 2))?;
    class.define_method("_native_stats", method!(native_stats, 0))?;
    class.define_method("_native_set_comments", method!(native_set_comments, 1))?;
    class.define_method("_native_comments", method!(native_comments, 0))?;
    testing::init(class)
}

/// A size option (`max_frames`, the limits) as an Integer: a bignum is a RangeError, as for
/// any Ruby size argument; the caller checks the range.
fn size_option(ruby: &Ruby, v: Value, name: &str) -> Result<i64, Error> {
    convert::int64(ruby, v, || name.to_string()).map_err(|e| {
        if e.is_kind_of(ruby.exception_arg_error()) {
            Error::new(ruby.exception_range_error(), format!("{name} is out of range"))
        } else {
            e
        }
    })
}

/// `StackRecorder._native_new(value_types, max_frames, compression, max_stacks, max_strings,
/// max_label_sets, max_samples, max_timed_samples)`, on the class or a subclass.
#[allow(clippy::too_many_arguments)] // one per Ruby keyword
fn native_new(
    ruby: &Ruby,
    class: RClass,
    value_types: Value,
    max_frames: Value,
    compression: Value,
    max_stacks: Value,
    max_strings: Value,
    max_label_sets: Value,
    max_samples: Value,
    max_timed_samples: Value,
) -> Result<Obj<StackRecorder>, Error> {
    entry(ruby, || {
        let value_types = convert::value_types(ruby, value_types)?;
        let max_frames = size_option(ruby, max_frames, "max_frames")?;
        // Negative values become 0, which every range check rejects with the given name.
        let limit = |v: Value, name: &str| -> Result<usize, Error> {
            Ok(usize::try_from(size_option(ruby, v, name)?).unwrap_or(0))
        };
        let limits = Limits {
            max_stacks: limit(max_stacks, "max_stacks")?,
            max_strings: limit(max_strings, "max_strings")?,
            max_label_sets: limit(max_label_sets, "max_label_sets")?,
            max_samples: limit(max_samples, "max_samples")?,
            max_timed_samples: limit(max_timed_samples, "max_timed_samples")?,
        };
        let compression = match Symbol::from_value(compression).map(|s| s.name()) {
            Some(Ok(name)) if name == "none" => Compression::None,
            Some(Ok(name)) if name == "gzip" => Compression::Gzip,
            _ => {
                return Err(arg_error(
                    ruby,
                    format!("compression must be :none or :gzip, got {}", inspect(compression)),
                ))
            }
        };
        let max_frames = usize::try_from(max_frames).unwrap_or(0);
        let config = Config::new(value_types, max_frames)
            .and_then(|config| config.with_limits(limits))
            .map_err(|e| e.into_ruby_error(ruby))?;
        let recorder = Recorder::new(config, Timestamp::now());
        Ok(ruby.obj_wrap_as(StackRecorder::new(recorder, compression), class))
    })
}

fn inspect(v: Value) -> String {
    v.inspect()
}

fn native_record_sample(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    locations: Value,
    values: Value,
    labels: Value,
) -> Result<(), Error> {
    rb_self.entry(ruby, |recorder| {
        let config = recorder.config();
        let recorded = convert::with_sample(
            ruby,
            (locations, values, labels),
            config.value_types(),
            config.max_frames(),
            |sample| recorder.record_sample(sample),
        );
        match recorded {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into_ruby_error(ruby)),
            Err(e) => {
                recorder.note_rejected();
                Err(e)
            }
        }
    })
}

/// `_native_record_captured(key, values, labels)`: records the stack that
/// `Profiler._native_capture_stack(key)` kept, with `values` and `labels` as for
/// `record_sample`. Returns false (records nothing) if none is kept under `key`.
fn native_record_captured(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    key: i64,
    values: Value,
    labels: Value,
) -> Result<bool, Error> {
    rb_self.entry(ruby, |recorder| {
        let config = recorder.config();
        let max_frames = config.max_frames();
        let recorded = convert::with_values_and_labels(
            ruby,
            (values, labels),
            config.value_types(),
            |values, labels| {
                crate::sampling::stack_capture::with_captured(key, |frames| {
                    // Frames past `max_frames - 1` become the placeholder, as for Locations.
                    let kept =
                        if frames.len() > max_frames { max_frames - 1 } else { frames.len() };
                    recorder.record_sample(&ddprof_recorder_core::Sample {
                        frames: &frames[..kept],
                        omitted_frames: frames.len() - kept,
                        values,
                        labels,
                    })
                })
            },
        );
        match recorded {
            Ok(None) => Ok(false),
            Ok(Some(Ok(()))) => Ok(true),
            Ok(Some(Err(e))) => Err(e.into_ruby_error(ruby)),
            Err(e) => {
                recorder.note_rejected();
                Err(e)
            }
        }
    })
}

fn native_record_endpoint(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    local_root_span_id: Value,
    endpoint: Value,
) -> Result<(), Error> {
    rb_self.entry(ruby, |recorder| record_endpoint(ruby, &recorder, local_root_span_id, endpoint))
}

/// `record_endpoint`'s body, shared with its Testing hook.
pub(super) fn record_endpoint(
    ruby: &Ruby,
    recorder: &Recorder,
    local_root_span_id: Value,
    endpoint: Value,
) -> Result<(), Error> {
    let span = convert::span_id(ruby, local_root_span_id)?;
    let endpoint = convert::text(ruby, endpoint, "endpoint")?;
    recorder.record_endpoint(span.as_span_id(), &endpoint).map_err(|e| e.into_ruby_error(ruby))
}

fn time(ruby: &Ruby, t: Timestamp) -> Result<Time, Error> {
    ruby.time_timespec_new(
        magnus::time::Timespec { tv_sec: t.secs, tv_nsec: i64::from(t.nanos) },
        magnus::time::Offset::utc(),
    )
}

/// The serializer side, shared by `_native_serialize` and `_native_clear`: with the GVL,
/// take the finish time and start the next profile (never waiting: another serialization in
/// progress is [`SerializeError::Busy`]); without it, flip, encode, and hand the output to
/// `then`. Returns the window's start and finish and what `then` returned.
fn finish_window<T: Send>(
    ruby: &Ruby,
    recorder: &Recorder,
    output: Output,
    then: impl Send + FnOnce(Vec<u8>) -> T,
) -> Result<Result<(Timestamp, Timestamp, T), SerializeError>, Error> {
    let pending = match recorder.start_next_profile(Timestamp::now()) {
        Ok(pending) => pending,
        Err(e) => return Ok(Err(e)),
    };
    // An interrupt processed before the flip drops `pending`: the serializer lock is released
    // and nothing flips.
    nogvl(ruby, move || {
        pending.flip(output).map(|s: Serialized| (s.start, s.finish, then(s.bytes)))
    })
}

fn error_pair(ruby: &Ruby, e: SerializeError) -> RArray {
    ruby.ary_new_from_values(&[
        ruby.to_symbol("error").as_value(),
        ruby.str_new(&e.to_string()).as_value(),
    ])
}

fn native_serialize(ruby: &Ruby, rb_self: &StackRecorder) -> Result<RArray, Error> {
    rb_self.entry(ruby, |recorder| {
        // A large pprof is copied into its Ruby String in the no-GVL section that encodes it:
        // neither the copy nor the page faults of a fresh buffer (18 MB and about 14 ms on the
        // medium workload) stop the other Ruby threads, and the GVL is taken back once. The
        // String is made beforehand, as large as the last window's pprof needed (address space
        // only, until written); a pprof that does not fit goes through `pprof_string`.
        let last = recorder.stats().last_serialization_bytes as usize;
        let capacity = if last >= LARGE_OUTPUT { output_capacity(last) } else { 0 };
        let (string, buffer) = StringBuffer::new(ruby, capacity);
        let output = Output::Pprof(rb_self.compression);
        // A small pprof gets a String of its own size instead, copied with the GVL.
        let fill = move |bytes: Vec<u8>| match bytes.len() {
            LARGE_OUTPUT.. => buffer.fill(bytes),
            _ => Err(bytes),
        };
        match finish_window(ruby, &recorder, output, fill)? {
            Ok((start, finish, filled)) => {
                let pprof = match filled {
                    // SAFETY: `fill` wrote `len` bytes into `string`'s buffer.
                    Ok(len) => unsafe { StringBuffer::set_len(string, len) },
                    Err(bytes) => pprof_string(ruby, bytes)?,
                };
                let triple = ruby.ary_new_from_values(&[
                    time(ruby, start)?.as_value(),
                    time(ruby, finish)?.as_value(),
                    pprof.as_value(),
                ]);
                Ok(ruby.ary_new_from_values(&[ruby.to_symbol("ok").as_value(), triple.as_value()]))
            }
            Err(e) => Ok(error_pair(ruby, e)),
        }
    })
}

/// The pprof as a binary Ruby String, when it was not copied into one while being encoded. A
/// small one is copied here with the GVL; a large one without it (see `native_serialize`).
fn pprof_string(ruby: &Ruby, bytes: Vec<u8>) -> Result<RString, Error> {
    if bytes.len() < LARGE_OUTPUT {
        return Ok(ruby.str_from_slice(&bytes));
    }
    let (string, buffer) = StringBuffer::new(ruby, output_capacity(bytes.len()));
    // The window is taken: an interrupt processed here would lose it, even for a caller that
    // deferred interrupts past the result (see `nogvl_or_here`). So none is.
    Ok(match nogvl_or_here(ruby, move || buffer.fill(bytes))? {
        // SAFETY: `fill` wrote `len` bytes into `string`'s buffer.
        Ok(len) => unsafe { StringBuffer::set_len(string, len) },
        Err(bytes) => ruby.str_from_slice(&bytes),
    })
}

/// The buffer of a binary Ruby String made with the GVL, for a pprof to be copied into
/// without it. Its capacity is at least `output_capacity` of the pprof's size, so that glibc
/// maps it and unmaps it as soon as the GC frees it (see `output_capacity`).
#[derive(Clone, Copy)]
struct StringBuffer {
    ptr: usize,
    capacity: usize,
}

impl StringBuffer {
    /// A new, empty binary String with room for `capacity` bytes, and its buffer.
    fn new(ruby: &Ruby, capacity: usize) -> (RString, StringBuffer) {
        let string = ruby.str_buf_new(capacity);
        // SAFETY: `string` is a live String; rb_str_buf_new gave it room for `capacity` bytes.
        let ptr = unsafe { rb_sys::RSTRING_PTR(string.as_raw()) } as usize;
        (string, StringBuffer { ptr, capacity })
    }

    /// Copies `bytes` into the buffer if they fit, and returns how many; else gives them back.
    /// Runs without the GVL, while the caller's frame holds the String.
    fn fill(self, bytes: Vec<u8>) -> Result<usize, Vec<u8>> {
        if bytes.len() > self.capacity {
            return Err(bytes);
        }
        // SAFETY: the buffer has room for `bytes` (checked above), and no other thread can reach
        // the String: it is referenced only from the caller's frame, which keeps it alive and
        // unmoved (the GC marks and pins what a thread's stack references) — as io.c does when
        // it reads into a String without the GVL.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr as *mut u8, bytes.len()) };
        Ok(bytes.len())
    }

    /// `string`, made by [`StringBuffer::new`], now `len` bytes long.
    ///
    /// # Safety
    /// [`StringBuffer::fill`] wrote `len` bytes into its buffer.
    unsafe fn set_len(string: RString, len: usize) -> RString {
        // SAFETY: the first `len` bytes of the buffer are written (the caller's contract).
        unsafe { rb_sys::rb_str_set_len(string.as_raw(), len as std::ffi::c_long) };
        string
    }
}

fn native_clear(ruby: &Ruby, rb_self: &StackRecorder) -> Result<RArray, Error> {
    rb_self.entry(ruby, |recorder| match finish_window(ruby, &recorder, Output::Discard, drop)? {
        Ok((_, finish, ())) => Ok(ruby.ary_new_from_values(&[
            ruby.to_symbol("ok").as_value(),
            time(ruby, finish)?.as_value(),
        ])),
        Err(e) => Ok(error_pair(ruby, e)),
    })
}

/// `StackRecorder._native_reset_after_fork(recorder)`: the by-hand reset. Never waits: a
/// serialization in progress finishes with the recorder it started with.
fn native_reset_after_fork(ruby: &Ruby, rb_self: &StackRecorder) -> Result<bool, Error> {
    rb_self.entry(ruby, |_| {
        rb_self.reset(Reset::ByHand);
        Ok(true)
    })
}

/// `StackRecorder._native_serializer_mutex(recorder)`: the Ruby `Mutex` that `serialize`,
/// `serialize!` and `clear` hold (one serializer at a time), kept in `@serialize_mutex`. A new
/// one after a fork or a reset: the old one may be held by a thread that does not exist here.
/// Deciding and replacing in one native call means no other Ruby thread can run in between
/// and pick the old one.
fn native_serializer_mutex(ruby: &Ruby, rb_self: Obj<StackRecorder>) -> Result<Value, Error> {
    rb_self.entry(ruby, |_| {
        let generation = fork_generation();
        if rb_self.mutex_generation.load(Relaxed) == generation {
            let mutex: Value = rb_self.ivar_get("@serialize_mutex")?;
            if !mutex.is_nil() {
                return Ok(mutex);
            }
        }
        let mutex = ruby.mutex_new();
        rb_self.ivar_set("@serialize_mutex", mutex)?;
        rb_self.mutex_generation.store(generation, Relaxed);
        Ok(mutex.as_value())
    })
}

fn native_stats(ruby: &Ruby, rb_self: &StackRecorder) -> Result<RHash, Error> {
    rb_self.entry(ruby, |recorder| {
        let s = recorder.stats();
        let hash = ruby.hash_new();
        for (key, value) in [
            ("samples_recorded", s.samples_recorded),
            ("samples_rejected", s.samples_rejected),
            ("samples_dropped", s.samples_dropped),
            ("endpoints_dropped", s.endpoints_dropped),
            ("timestamps_dropped", s.timestamps_dropped),
            ("samples_lost", s.samples_lost),
            ("serializations", s.serializations),
            ("last_serialization_ns", s.last_serialization_ns),
            ("last_serialization_bytes", s.last_serialization_bytes),
        ] {
            hash.aset(ruby.to_symbol(key), value)?;
        }
        Ok(hash)
    })
}

/// `_native_set_comments(comments)`: the comments of every profile serialized from now on. All
/// or nothing: a bad Array raises (naming `comments` or `comments[i]`) and changes nothing.
fn native_set_comments(ruby: &Ruby, rb_self: &StackRecorder, comments: Value) -> Result<(), Error> {
    rb_self.entry(ruby, |recorder| {
        let comments = convert::comments(ruby, comments)?;
        recorder.set_comments(comments).map_err(|e| e.into_ruby_error(ruby))
    })
}

/// `_native_comments` → Array of the comments set (new Strings, UTF-8).
fn native_comments(ruby: &Ruby, rb_self: &StackRecorder) -> Result<RArray, Error> {
    rb_self.entry(ruby, |recorder| {
        let comments = recorder.comments();
        Ok(ruby.ary_from_iter(comments.iter().map(|c| ruby.str_new(c))))
    })
}
