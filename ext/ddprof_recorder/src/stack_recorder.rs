//! `DdprofRecorder::StackRecorder`: a TypedData object around the core's two-slot
//! [`Recorder`], and its `_native_*` entry points. The public Ruby methods, keywords and
//! docs are in `lib/ddprof_recorder/stack_recorder.rb`.
//!
//! # Fork safety without a hook
//!
//! A `pthread_atfork` child handler, installed once, bumps [`FORK_GENERATION`] in every
//! forked child. Each recorder remembers the generation it last ran in; every `_native_*`
//! entry point starts with [`StackRecorder::check_fork`], one relaxed atomic load and a
//! compare, and on a mismatch resets the recorder (the core's `reset_after_fork`) before doing
//! anything else. A generation rather than `getpid()`: the load costs nothing on the sampler's
//! path (glibc no longer caches the pid, so `getpid` is a system call), and a recycled pid
//! cannot fool it.
//!
//! The reset is sound there because every entry point holds the GVL and samplers hold it for
//! the whole time they hold a slot; and it copes with any state the parent's threads left,
//! a flip cut in the middle included (see the core's `recorder` module). The Ruby-side
//! serializer `Mutex` is replaced too (`_native_serializer_mutex`), so that no lock of a
//! thread that did not survive the fork is ever waited for.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Once;

use ddprof_recorder_core::pprof::{output_capacity, LARGE_OUTPUT};
use ddprof_recorder_core::{
    Compression, Config, Limits, Output, Recorder, SerializeError, Serialized, Timestamp,
};
use magnus::{
    function, method, prelude::*, rb_sys::AsRawValue, typed_data::Obj, value::ReprValue,
    DataTypeFunctions, Error, RArray, RClass, RHash, RModule, RString, Ruby, Symbol, Time,
    TypedData, Value,
};

use crate::convert;
use crate::errors::{arg_error, guard, record_error};
use crate::nogvl::nogvl;

#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::StackRecorder", free_immediately, size)]
pub struct StackRecorder {
    recorder: Recorder,
    compression: Compression,
    /// [`FORK_GENERATION`] when this process last used the recorder.
    fork_generation: AtomicU64,
    /// [`FORK_GENERATION`] when the Ruby serializer `Mutex` (`@serialize_mutex`) was made, or
    /// [`NO_MUTEX`] when the next serializer must make a new one.
    mutex_generation: AtomicU64,
}

impl DataTypeFunctions for StackRecorder {
    /// `ObjectSpace.memsize_of`: this struct and the native memory both profiles hold. Called
    /// by the GC (possibly while another thread records or serializes): reads the recorder's
    /// lock-free size caches, never a lock. Must not panic, and does not.
    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.recorder.heap_bytes()
    }
}

/// How many forks separate this process from the one that loaded the extension: bumped in
/// each child by [`after_fork_in_child`]. A process's threads all see its own count.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// `mutex_generation` of a recorder whose serializer `Mutex` must be (re)made.
const NO_MUTEX: u64 = u64::MAX;

/// The `pthread_atfork` child handler. Runs in the child's only thread before `fork` returns
/// there; it must be async-signal-safe, and one atomic add is.
extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Relaxed);
}

fn install_fork_handler(ruby: &Ruby) -> Result<(), Error> {
    static INSTALL: Once = Once::new();
    let mut status = 0;
    INSTALL.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured state; handlers
        // are inherited by children, so once per process tree is enough.
        status = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    if status != 0 {
        return Err(Error::new(
            ruby.exception_runtime_error(),
            format!("pthread_atfork failed (error {status}): fork detection unavailable"),
        ));
    }
    Ok(())
}

impl StackRecorder {
    fn new(recorder: Recorder, compression: Compression) -> Self {
        Self {
            recorder,
            compression,
            fork_generation: AtomicU64::new(FORK_GENERATION.load(Relaxed)),
            mutex_generation: AtomicU64::new(NO_MUTEX),
        }
    }

    /// Resets the recorder if this is the first use in a forked child. Every entry point calls
    /// it first, with the GVL held.
    #[inline]
    fn check_fork(&self) {
        let current = FORK_GENERATION.load(Relaxed);
        if self.fork_generation.load(Relaxed) != current {
            self.reset();
        }
    }

    /// Back to the initial state, as used in this process (the current fork generation), with
    /// a fresh serializer `Mutex` at the next serialization. Called by entry points only, so
    /// with the GVL held.
    #[cold]
    fn reset(&self) {
        // SAFETY: every entry point holds the GVL, and samplers hold the GVL for the whole time
        // they hold a slot (`record_sample` never releases it), so no sampler is inside the
        // recorder (see `Recorder::reset_after_fork`).
        unsafe { self.recorder.reset_after_fork(Timestamp::now()) };
        self.mutex_generation.store(NO_MUTEX, Relaxed);
        self.fork_generation.store(FORK_GENERATION.load(Relaxed), Relaxed);
    }
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    convert::init(ruby)?;
    install_fork_handler(ruby)?;
    let class = module.define_class("StackRecorder", ruby.class_object())?;
    // Instances only come from `_native_new`: a bare `allocate` would have no recorder.
    class.undef_default_alloc_func();
    class.define_singleton_method("_native_new", method!(native_new, 7))?;
    // The core's limits, so that the Ruby keywords' defaults cannot drift from them.
    class.const_set("MAX_LIMIT", Limits::MAX)?;
    class.const_set("DEFAULT_MAX_STACKS", Limits::DEFAULT.max_stacks)?;
    class.const_set("DEFAULT_MAX_STRINGS", Limits::DEFAULT.max_strings)?;
    class.const_set("DEFAULT_MAX_LABEL_SETS", Limits::DEFAULT.max_label_sets)?;
    class.const_set("DEFAULT_MAX_SAMPLES", Limits::DEFAULT.max_samples)?;
    class.define_singleton_method("_native_serialize", function!(native_serialize, 1))?;
    class.define_singleton_method("_native_clear", function!(native_clear, 1))?;
    class.define_singleton_method("_native_reset_after_fork", function!(reset_after_fork, 1))?;
    class.define_singleton_method("_native_serializer_mutex", function!(serializer_mutex, 1))?;
    class.define_method("_native_record_sample", method!(record_sample, 3))?;
    class.define_method("_native_record_captured", method!(record_captured, 3))?;
    class.define_method("_native_record_endpoint", method!(record_endpoint, 2))?;
    class.define_method("_native_stats", method!(stats, 0))?;

    // Hooks for RSpec only; not part of the API a profiler should use.
    let testing = class.define_module("Testing")?;
    testing.define_singleton_method("_native_active_slot", function!(active_slot, 1))?;
    testing.define_singleton_method(
        "_native_slot_one_mutex_locked?",
        function!(|r: &StackRecorder| slot_is_locked(r, 1), 1),
    )?;
    testing.define_singleton_method(
        "_native_slot_two_mutex_locked?",
        function!(|r: &StackRecorder| slot_is_locked(r, 2), 1),
    )?;
    testing.define_singleton_method("_native_fork_generation", function!(fork_generation, 0))?;
    testing.define_singleton_method("_native_malloc_in_use", function!(malloc_in_use, 0))?;
    // Unlike every other entry point, does not reset a recorder first used in a forked child:
    // lets a child see the state the fork left (both slots held mid-flip, for instance).
    testing.define_singleton_method(
        "_native_slot_locks_before_fork_check",
        function!(
            |r: &StackRecorder| (r.recorder.slot_is_locked(1), r.recorder.slot_is_locked(2)),
            1
        ),
    )?;
    testing.define_singleton_method(
        "_native_record_endpoint",
        function!(testing_record_endpoint, 3),
    )?;
    Ok(())
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
/// max_label_sets, max_samples)`, on the class or a subclass.
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
) -> Result<Obj<StackRecorder>, Error> {
    guard(ruby, || {
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
            .map_err(|e| arg_error(ruby, e.to_string()))?;
        let recorder = Recorder::new(config, Timestamp::now());
        Ok(ruby.obj_wrap_as(StackRecorder::new(recorder, compression), class))
    })
}

fn inspect(v: Value) -> String {
    v.inspect()
}

fn record_sample(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    locations: Value,
    values: Value,
    labels: Value,
) -> Result<(), Error> {
    rb_self.check_fork();
    guard(ruby, || {
        let recorder = &rb_self.recorder;
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
            Ok(Err(e)) => Err(record_error(ruby, e)),
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
fn record_captured(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    key: i64,
    values: Value,
    labels: Value,
) -> Result<bool, Error> {
    rb_self.check_fork();
    guard(ruby, || {
        let recorder = &rb_self.recorder;
        let config = recorder.config();
        let max_frames = config.max_frames();
        let recorded = convert::with_values_and_labels(
            ruby,
            (values, labels),
            config.value_types(),
            |values, labels| {
                crate::stack_capture::with_captured(key, |frames| {
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
            Ok(Some(Err(e))) => Err(record_error(ruby, e)),
            Err(e) => {
                recorder.note_rejected();
                Err(e)
            }
        }
    })
}

fn record_endpoint(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    local_root_span_id: Value,
    endpoint: Value,
) -> Result<(), Error> {
    rb_self.check_fork();
    guard(ruby, || {
        let span = convert::span_id(ruby, local_root_span_id)?;
        let endpoint = convert::text(ruby, endpoint, "endpoint")?;
        rb_self
            .recorder
            .record_endpoint(span.as_span_id(), &endpoint)
            .map_err(|e| record_error(ruby, e))
    })
}

fn testing_record_endpoint(
    ruby: &Ruby,
    recorder: &StackRecorder,
    local_root_span_id: Value,
    endpoint: Value,
) -> Result<bool, Error> {
    record_endpoint(ruby, recorder, local_root_span_id, endpoint).map(|()| true)
}

fn time(ruby: &Ruby, t: Timestamp) -> Result<Time, Error> {
    ruby.time_timespec_new(
        magnus::time::Timespec { tv_sec: t.secs, tv_nsec: i64::from(t.nanos) },
        magnus::time::Offset::utc(),
    )
}

/// The serializer side, shared by `_native_serialize` and `_native_clear`: with the GVL,
/// take the finish time and reset the next profile; without it, flip, encode, and hand the
/// output to `then`. Returns the window's start and finish and what `then` returned.
fn finish_window<T: Send>(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    output: Output,
    then: impl Send + FnOnce(Vec<u8>) -> T,
) -> Result<Result<(Timestamp, Timestamp, T), SerializeError>, Error> {
    rb_self.check_fork();
    let recorder = &rb_self.recorder;
    let finish = Timestamp::now();
    if let Err(e) = recorder.start_next_profile(finish) {
        return Ok(Err(e));
    }
    nogvl(ruby, || {
        recorder.flip(finish, output).map(|s: Serialized| (s.start, s.finish, then(s.bytes)))
    })
}

fn error_pair(ruby: &Ruby, e: SerializeError) -> RArray {
    ruby.ary_new_from_values(&[
        ruby.to_symbol("error").as_value(),
        ruby.str_new(&e.to_string()).as_value(),
    ])
}

fn native_serialize(ruby: &Ruby, rb_self: &StackRecorder) -> Result<RArray, Error> {
    guard(ruby, || {
        // A large pprof is copied into its Ruby String in the no-GVL section that encodes it:
        // neither the copy nor the page faults of a fresh buffer (18 MB and about 14 ms on the
        // medium workload) stop the other Ruby threads, and the GVL is taken back once. The
        // String is made beforehand, as large as the last window's pprof needed (address space
        // only, until written); a pprof that does not fit goes through `pprof_string`.
        let last = rb_self.recorder.stats().last_serialization_bytes as usize;
        let capacity = if last >= LARGE_OUTPUT { output_capacity(last) } else { 0 };
        let (string, buffer) = StringBuffer::new(ruby, capacity);
        let output = Output::Pprof(rb_self.compression);
        // A small pprof gets a String of its own size instead, copied with the GVL.
        let fill = move |bytes: Vec<u8>| match bytes.len() {
            LARGE_OUTPUT.. => buffer.fill(bytes),
            _ => Err(bytes),
        };
        match finish_window(ruby, rb_self, output, fill)? {
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
    // An interrupt pending here (Thread#raise) loses the window, as it would a moment later.
    Ok(match nogvl(ruby, move || buffer.fill(bytes))? {
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
    guard(ruby, || match finish_window(ruby, rb_self, Output::Discard, drop)? {
        Ok((_, finish, ())) => Ok(ruby.ary_new_from_values(&[
            ruby.to_symbol("ok").as_value(),
            time(ruby, finish)?.as_value(),
        ])),
        Err(e) => Ok(error_pair(ruby, e)),
    })
}

fn reset_after_fork(ruby: &Ruby, rb_self: &StackRecorder) -> Result<bool, Error> {
    guard(ruby, || {
        rb_self.reset();
        Ok(true)
    })
}

/// `StackRecorder._native_serializer_mutex(recorder)`: the Ruby `Mutex` that `serialize`,
/// `serialize!` and `clear` hold (one serializer at a time), kept in `@serialize_mutex`. A new
/// one after a fork or a reset: the old one may be held by a thread that does not exist here.
/// Deciding and replacing in one native call means no other Ruby thread can run in between
/// and pick the old one.
fn serializer_mutex(ruby: &Ruby, rb_self: Obj<StackRecorder>) -> Result<Value, Error> {
    rb_self.check_fork();
    let generation = FORK_GENERATION.load(Relaxed);
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
}

fn active_slot(recorder: &StackRecorder) -> u8 {
    recorder.check_fork();
    recorder.recorder.active_slot()
}

fn slot_is_locked(recorder: &StackRecorder, slot: u8) -> bool {
    recorder.check_fork();
    recorder.recorder.slot_is_locked(slot)
}

/// How many forks separate this process from the one that loaded the extension.
pub fn fork_generation() -> u64 {
    FORK_GENERATION.load(Relaxed)
}

/// Bytes glibc malloc has handed out and not had back (heap chunks in use plus mmapped
/// chunks): lets the soak test compare `ObjectSpace.memsize_of` with what freeing a recorder
/// really returns. glibc only (2.33+): nil elsewhere.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn malloc_in_use() -> Option<u64> {
    // SAFETY: mallinfo2 has no preconditions; it only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    Some((info.uordblks + info.hblkhd) as u64)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn malloc_in_use() -> Option<u64> {
    None
}

fn stats(ruby: &Ruby, rb_self: &StackRecorder) -> Result<RHash, Error> {
    rb_self.check_fork();
    let s = rb_self.recorder.stats();
    let hash = ruby.hash_new();
    for (key, value) in [
        ("samples_recorded", s.samples_recorded),
        ("samples_rejected", s.samples_rejected),
        ("samples_dropped", s.samples_dropped),
        ("endpoints_dropped", s.endpoints_dropped),
        ("samples_lost", s.samples_lost),
        ("serializations", s.serializations),
        ("last_serialization_ns", s.last_serialization_ns),
        ("last_serialization_bytes", s.last_serialization_bytes),
    ] {
        hash.aset(ruby.to_symbol(key), value)?;
    }
    Ok(hash)
}
