//! Reading the calling thread's stack without making Ruby objects: the sampling job's fast
//! path (`ThreadSampler#call` in `lib/ddprof_recorder/profiler/thread_sampler.rb`), and the
//! naming of every stack the profiler records (other threads' too, [`native_thread_frames`]).
//!
//! Frames are read as `rb_profile_frames` (Ruby 3.1 `vm_backtrace.c`) reads them: a method
//! entry for each Ruby method (and the blocks inside it) and each C method, an instruction
//! sequence for other Ruby frames (`<main>`, a class body, a required file's top level and
//! the blocks in them), and the line numbers, without allocating; `vm::frames` reads them the
//! same way for any thread, and gives a method made with `define_method` its method entry.
//! Each frame object is turned into names once and kept in [`CACHE`], so that a sample costs
//! a hash lookup per frame. A C method takes the path (and line) of the Ruby frame that
//! called it, as `Thread::Backtrace::Location#path` gives.
//!
//! # Names
//!
//! Frames are named as stackprof names them, from the frame object alone, whichever thread
//! it was read on. Frames are read by `vm::frames` once its self-check passed (checked once by
//! `Profiler::FrameNames` before anything is named, on 3.1, 3.3 and 3.4); if it failed, on 3.3
//! and later by the public API (`rb_profile_frames`, and `rb_profile_thread_frames` for other
//! threads), still named as below; on 3.1, the weaker way (below):
//!
//! - a method entry: its owner and name, `Klass#meth`, `Klass.meth` for a singleton method
//!   (`rb_profile_frame_qualified_method_name`: `rb_profile_frame_classpath`, which takes a
//!   module's name for an included method, `#` or `.` by
//!   `rb_profile_frame_singleton_method_p`, and `rb_profile_frame_method_name`, the name the
//!   method was defined with). That holds for a C method too (`Kernel#is_a?`,
//!   `Integer#times`). A block inside a method runs with the method's entry
//!   (`rb_vm_frame_method_entry` walks the block's ep chain up to the method's), so it is
//!   named as its method, as in stackprof.
//! - a method made with `define_method` (a bmethod): `vm::frames` gives its method entry,
//!   named by the entry's `original_id` (`rb_profile_frame_method_name` gives nil for a
//!   bmethod); `rb_profile_frames` gives the block it runs, an iseq, named as Ruby's own
//!   backtraces name it (`block in class Node`): so on 3.3+ when the check failed.
//! - an instruction sequence: its `label` (`block in <main>`, `<class:Node>`), spelled by
//!   [`names::spell`].
//! - code eval'd from a string (`ERB#result` runs a template so), and the blocks in it:
//!   `vm::frames` gives the frame's iseq where `rb_profile_frames` gives the method entry of
//!   the method whose binding the eval ran in, and it is named for its file, as
//!   `rb_profile_frame_path` gives it: `(erb)`, the file set with `ERB#filename=`, `(eval)`
//!   (on 3.3+, `(eval at /app/x.rb:12)`). stackprof names it by the label Ruby gives an
//!   eval's iseq, its caller's (`block in <class:App>`), or, when it reads the method entry,
//!   as the method that rendered it, with that method's file. Such a frame is cached by its
//!   names, not by its object ([`names::Keep`]): `ERB#result` compiles anew at each render.
//!   Only once `vm::frames`' self-check passed (it reads the frame magics of the ep chain,
//!   and the iseq's type and parents).
//! - a compiled template's method, whose name holds per-process numbers (ActionView's
//!   `_app_views_pages_index_html_erb___2930487_60120`, Tilt's `__tilt_47000`): named for the
//!   template, `app/views/pages/index.html.erb` or its file ([`names::template_name`]), so
//!   that the profiles of two processes merge into one name. From the method's name and file
//!   alone: on every path, the weaker names too.
//!
//! [`names::spell`] rewrites Ruby's `<...>` labels, which `go tool pprof` empties: its symbolizer
//! (pprof `internal/symbolizer`, `demangleSingleFunction`) takes a name that contains any of
//! `<>[]` or `::` for an already demangled C++ name and removes every balanced `(...)` and
//! `<...>` from it, so `<main>` became `` (shown as `<unknown>`) and
//! `block (2 levels) in <main>` became `block  in `.
//!
//! On Ruby 3.1 when the check failed, frames are named the weaker way, from what a
//! `Thread::Backtrace::Location` also gives: the `base_label` (for a C method, its name),
//! spelled; other threads are then read with `Thread#backtrace_locations` and named the same
//! way (`Profiler::FrameNames.location_frames`).
//!
//! The cache's keys are Ruby objects, which the GC could free (an iseq of `eval`ed code) and
//! another object could then take the address of, or which compaction could move. A cached
//! frame object is therefore marked by this module's GC root ([`mark_cache`]): `rb_gc_mark`
//! keeps it alive and pins it. The cache is bounded ([`MAX_CACHED_FRAMES`]; past it, it starts
//! over).
//!
//! Captured stacks are kept per key (the sampler uses the native thread id, and for the stacks
//! its passes read of other threads a key per thread), as cache slots, until that key's next
//! capture: the sampler records them at once, and again when it charges CPU carried to the
//! thread's last on-CPU stack or adds up a thread's idle passes. Everything here runs with the
//! GVL held.
mod names;
mod read;

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use ddprof_recorder_core::Frame;
use magnus::{prelude::*, rb_sys::AsRawValue, Error, RArray, RString, Ruby, Value};
use rustc_hash::FxHasher;

use crate::vm::gvl_cell::{GcRoot, GvlCell};
use names::{label_name, names_of, qualified, Keep, MAIN};
pub use read::read_current;
use read::read_thread;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Deepest stack read; deeper ones lose their root-side frames (the recorder's `max_frames`
/// then cuts it further).
const MAX_DEPTH: usize = 2048;
/// Distinct frame objects kept before the cache starts over.
const MAX_CACHED_FRAMES: usize = 1 << 16;

/// A cached frame's names: `path` is None for a C method (it takes its caller's).
struct Names {
    name: Box<str>,
    path: Option<Box<str>>,
}

/// Where [`native_thread_frames`] and [`native_capture_thread_stack`] keep the stack they read
/// until they have made the frames or moved it to its key.
const OTHER_THREAD_KEY: i64 = i64::MIN / 2;

/// One frame of a captured stack: the slot of its name, the slot whose path is its file (its
/// own, or for a C method its caller's; `u32::MAX`: none), and its line.
#[derive(Clone, Copy, PartialEq, Eq)]
struct CapturedFrame {
    name: u32,
    file: u32,
    line: i64,
}

#[derive(Default)]
struct Cache {
    /// Frame object (VALUE) to its slot, flagged [`RUBY_FRAME`] for a Ruby frame.
    slot_of: FxMap<usize, u32>,
    /// The slots of the frames kept by name (`names::Keep::ByName`), flagged as in `slot_of`:
    /// such a frame object is not kept, and is named again at each capture.
    slot_by_name: FxMap<(Box<str>, Option<Box<str>>), u32>,
    slots: Vec<Names>,
    /// Captured stacks by key, as slots (valid until the cache starts over, which drops them).
    captured: FxMap<i64, Vec<CapturedFrame>>,
}

/// A GVL cell (`vm::gvl_cell`): never in use across a call into Ruby, so the GC root's mark
/// always reads it whole.
static CACHE: GvlCell<Option<Cache>> = GvlCell::new("the frame cache", None);

/// What `rb_profile_frames` fills, and the frames' slots: reused from one capture to the next.
struct Buffer {
    frames: Vec<rb_sys::VALUE>,
    lines: Vec<i32>,
    slots: Vec<u32>,
}

thread_local! {
    static BUFFER: RefCell<Buffer> = RefCell::new(Buffer {
        frames: vec![0; MAX_DEPTH],
        lines: vec![0; MAX_DEPTH],
        slots: Vec::with_capacity(MAX_DEPTH),
    });
}

/// Marks every cached frame object: the mark callback of the cache's GC root.
fn mark_cache() {
    CACHE.with(|cache| {
        for &frame in cache.iter().flat_map(|c| c.slot_of.keys()) {
            // SAFETY: in the GC's mark phase; every key is a frame object that was live when
            // cached, and marked (so kept alive, pinned) by this very function at every GC
            // since.
            unsafe { rb_sys::rb_gc_mark(frame as rb_sys::VALUE) };
        }
    });
}

pub fn init(ruby: &Ruby) -> Result<(), Error> {
    GcRoot { mark: Some(mark_cache), compact: None }.register(ruby)?;
    Ok(())
}

/// `Profiler._native_capture_stack(key)`: reads the stack of the Ruby method that called it
/// (its caller's frame and this C method's own are left out) and keeps it under `key`.
/// Returns its depth (0: nothing to record).
pub(crate) fn native_capture_stack(ruby: &Ruby, key: i64) -> Result<usize, Error> {
    crate::recorder::errors::entry(ruby, || Ok(capture(key)))
}

/// Drops what is kept under `key`.
pub fn forget(key: i64) {
    CACHE.with(|cache| {
        if let Some(cache) = cache {
            cache.captured.remove(&key);
        }
    });
}

/// Runs `f` with the stack kept under `key` as the core's frames, if any. `f` runs inside the
/// cache's cell: it must not call Ruby (`vm::gvl_cell`).
pub fn with_captured<R>(key: i64, f: impl FnOnce(&[Frame<'_>]) -> R + Send) -> Option<R> {
    CACHE.with(|cache| {
        let cache = cache.as_ref()?;
        let captured = cache.captured.get(&key)?;
        let name = |slot: u32| cache.slots.get(slot as usize);
        let frames: Vec<Frame<'_>> = captured
            .iter()
            .map(|frame| Frame {
                function_name: name(frame.name).map_or("", |n| &n.name),
                filename: name(frame.file).and_then(|n| n.path.as_deref()).unwrap_or(""),
                line: frame.line,
            })
            .collect();
        Some(f(&frames))
    })
}

/// Bit of a slot number (as [`Cache::slot_of`] gives it) set for a Ruby frame, whose path is
/// its own; clear for a C method, which takes its caller's.
const RUBY_FRAME: u32 = 1 << 31;
/// Not cached yet.
const UNKNOWN: u32 = u32::MAX;

/// Reads the caller's caller's stack, leaf first, into `key`'s slot; returns its depth.
fn capture(key: i64) -> usize {
    read_stack(key, Skip::OwnFrames)
}

/// Reads the calling thread's stack, whole, into `key`'s slot; returns its depth. For a
/// postponed job, which runs with no frame of its own on the Ruby stack.
pub fn capture_here(key: i64) -> usize {
    read_stack(key, Skip::Nothing)
}

/// [`capture_here`] under a [`GC_LEAF`]: for a tick that came inside the GC, read at the job
/// that follows it (`signal_sampler::gc_ticks`). Nothing kept if the stack is empty.
pub fn capture_here_under_gc(key: i64) -> usize {
    BUFFER.with(|buffer| {
        let Ok(mut buffer) = buffer.try_borrow_mut() else { return 0 };
        let Buffer { frames, lines, slots } = &mut *buffer;
        frames[0] = GC_LEAF;
        lines[0] = 0;
        // SAFETY: we hold the GVL (a postponed job).
        let n = unsafe { read_current(&mut frames[1..], &mut lines[1..]) };
        if n == 0 {
            return 0;
        }
        store_frames(key, &frames[..=n], &lines[..=n], slots, Skip::Nothing)
    })
}

fn read_stack(key: i64, skip: Skip) -> usize {
    BUFFER.with(|buffer| {
        let Ok(mut buffer) = buffer.try_borrow_mut() else { return 0 };
        let Buffer { frames, lines, slots } = &mut *buffer;
        // SAFETY: we hold the GVL (a method of ours, or a postponed job).
        let n = unsafe { read_current(frames, lines) };
        store_frames(key, &frames[..n], &lines[..n], slots, skip)
    })
}

/// Keeps under `key` a stack that [`read_current`] read earlier (leaf first), whole:
/// the allocation sampler's, read in the NEWOBJ hook where frames cannot be named (see
/// `allocations`). Returns its depth (0: nothing kept).
///
/// # Safety
///
/// GVL held, and every frame object is still alive (marked since it was read).
pub unsafe fn store_read_frames(key: i64, frames: &[rb_sys::VALUE], lines: &[i32]) -> usize {
    let mut slots = Vec::with_capacity(frames.len());
    store_frames(key, frames, lines, &mut slots, Skip::Nothing)
}

/// Which leaf-side frames a stored stack leaves out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// `_native_capture_stack` and the Ruby method that called it.
    OwnFrames,
    Nothing,
}

/// Names the frames (caching them) and keeps them under `key`; returns the depth.
fn store_frames(
    key: i64,
    frames: &[rb_sys::VALUE],
    lines: &[i32],
    slots: &mut Vec<u32>,
    skip: Skip,
) -> usize {
    slots.clear();
    let unknown = CACHE.with(|cache| {
        let mut unknown = Vec::new();
        for &frame in frames {
            let slot = cache.as_ref().and_then(|c| c.slot_of.get(&(frame as usize)).copied());
            if slot.is_none() {
                unknown.push(frame);
            }
            slots.push(slot.unwrap_or(UNKNOWN));
        }
        unknown
    });
    // Named out of the cell: reading names may allocate (a method name's String is made on
    // first use), so a GC may run, and mark the cache.
    let named: Vec<(rb_sys::VALUE, (Names, Keep))> =
        unknown.into_iter().map(|f| (f, names_of(f))).collect();
    CACHE.with(|cache| {
        let cache = cache.get_or_insert_with(Cache::default);
        if !named.is_empty() {
            if cache.slots.len() + named.len() > MAX_CACHED_FRAMES {
                *cache = Cache::default();
                // Everything must be named again: start this capture over next time.
                return 0;
            }
            // This capture's frames kept by name, and their slots.
            let mut by_name: Vec<(rb_sys::VALUE, u32)> = Vec::new();
            for (frame, (names, keep)) in named {
                let flag = if names.path.is_some() { RUBY_FRAME } else { 0 };
                let next = cache.slots.len() as u32;
                let slot = match keep {
                    Keep::ByObject => *cache.slot_of.entry(frame as usize).or_insert(next | flag),
                    Keep::ByName => {
                        let key = (names.name.clone(), names.path.clone());
                        let slot = *cache.slot_by_name.entry(key).or_insert(next | flag);
                        by_name.push((frame, slot));
                        slot
                    }
                };
                if slot & !RUBY_FRAME == next {
                    cache.slots.push(names);
                }
            }
            for (slot, &frame) in slots.iter_mut().zip(frames) {
                if *slot == UNKNOWN {
                    let kept = by_name.iter().find(|&&(f, _)| f == frame).map(|&(_, s)| s);
                    *slot =
                        cache.slot_of.get(&(frame as usize)).copied().or(kept).unwrap_or(UNKNOWN);
                }
            }
        }
        let mut stack = cache.captured.remove(&key).unwrap_or_default();
        resolve(cache, slots, lines, &mut stack, skip);
        let depth = stack.len();
        cache.captured.insert(key, stack);
        depth
    })
}

/// Fills `stack` from the frames read (as slots, flagged [`RUBY_FRAME`]): leaves out this
/// method's own frames (if asked), and gives each C method its caller's path and line.
fn resolve(
    cache: &Cache,
    slots: &[u32],
    lines: &[i32],
    stack: &mut Vec<CapturedFrame>,
    skip: Skip,
) {
    stack.clear();
    let is_ruby = |slot: u32| slot != UNKNOWN && slot & RUBY_FRAME != 0;
    // Leading C frames are `_native_capture_stack` itself; the first Ruby frame is its caller.
    let skip = match skip {
        Skip::OwnFrames => slots.iter().position(|&s| is_ruby(s)).map_or(slots.len(), |i| i + 1),
        Skip::Nothing => 0,
    };
    let mut end = slots.len();
    // The main thread's root: `rb_profile_frames` sees the program's `<main>` twice (the
    // top-level frame and the one that evaluates the script), where Locations show it once.
    if end >= skip + 2 {
        let names =
            |slot: u32| cache.slots.get((slot & !RUBY_FRAME) as usize).map(|n| (&n.name, &n.path));
        let root_names = names(slots[end - 1]);
        let is_main = root_names.is_some_and(|(label, path)| &**label == MAIN && path.is_some());
        if is_main && root_names == names(slots[end - 2]) {
            end -= 1;
        }
    }
    // Root first, so that each C frame knows the nearest Ruby frame below it.
    let mut caller = (UNKNOWN, 0i64);
    for (&slot, &line) in slots[skip..end].iter().zip(&lines[skip..end]).rev() {
        if slot == UNKNOWN {
            continue; // could not be named (the cache started over meanwhile)
        }
        let name = slot & !RUBY_FRAME;
        if is_ruby(slot) {
            caller = (name, i64::from(line));
            stack.push(CapturedFrame { name, file: name, line: i64::from(line) });
        } else {
            stack.push(CapturedFrame { name, file: caller.0, line: caller.1 });
        }
    }
    stack.reverse();
}

/// What stands, in a stack read by `signal_sampler`, for the GC that ran at the tick: the
/// leaf of a sample whose tick came inside the GC (`gc_ticks`), named `(garbage collection)`,
/// as the GC's frames of `gc: true` are. `false`, which is no frame object.
pub const GC_LEAF: rb_sys::VALUE = rb_sys::Qfalse as rb_sys::VALUE;

/// `Profiler._native_thread_frames(thread)`: `thread`'s stack (leaf first) as `[name, path,
/// line]` triples named as the sampling job names the current thread's, or nil when frames
/// are named the weaker way (then `Thread#backtrace_locations` reads it: module doc). Empty
/// for a thread that has no stack (not started, or finished). With the GVL, for a thread that
/// is alive (`thread.status` not false or nil): see `vm::frames`' module doc.
pub(crate) fn native_thread_frames(ruby: &Ruby, thread: Value) -> Result<Option<RArray>, Error> {
    crate::recorder::errors::entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(crate::recorder::errors::type_error(ruby, "thread must be a Thread"));
        }
        if !qualified() {
            return Ok(None);
        }
        Ok(Some(thread_frames(ruby, thread.as_raw())))
    })
}

/// `Profiler._native_capture_thread_stack(thread, key)`: reads `thread`'s stack as
/// [`native_thread_frames`] does and keeps it under `key` (no Ruby object is made: the pass
/// records it with `_native_record_captured`, and again for the thread's idle passes, until
/// the key's next capture or [`native_forget_stack`]). Returns its depth (0: no stack, and
/// what `key` kept stays), or nil when frames are named the weaker way. With the GVL, for a
/// thread that is alive.
pub(crate) fn native_capture_thread_stack(
    ruby: &Ruby,
    thread: Value,
    key: i64,
) -> Result<Option<usize>, Error> {
    crate::recorder::errors::entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(crate::recorder::errors::type_error(ruby, "thread must be a Thread"));
        }
        if !qualified() {
            return Ok(None);
        }
        // Read aside first: an empty read (a thread ending) keeps the stack `key` has.
        let depth = capture_thread(thread.as_raw(), OTHER_THREAD_KEY);
        CACHE.with(|cache| {
            if let Some(cache) = cache {
                if let Some(stack) = cache.captured.remove(&OTHER_THREAD_KEY) {
                    if depth > 0 {
                        cache.captured.insert(key, stack);
                    }
                }
            }
        });
        Ok(Some(depth))
    })
}

/// `Profiler._native_forget_stack(key)`: drops the stack kept under `key`.
pub(crate) fn native_forget_stack(ruby: &Ruby, key: i64) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        forget(key);
        Ok(())
    })
}

/// Reads live `thread`'s stack into `key`'s slot; returns its depth.
fn capture_thread(thread: rb_sys::VALUE, key: i64) -> usize {
    BUFFER.with(|buffer| {
        let Ok(mut buffer) = buffer.try_borrow_mut() else { return 0 };
        let Buffer { frames, lines, slots } = &mut *buffer;
        // SAFETY: `thread` is a live Thread (checked by the caller); GVL held.
        let n = unsafe { read_thread(thread, frames, lines) };
        store_frames(key, &frames[..n], &lines[..n], slots, Skip::Nothing)
    })
}

/// The triples of `thread`'s stack (see [`native_thread_frames`]).
fn thread_frames(ruby: &Ruby, thread: rb_sys::VALUE) -> RArray {
    let depth = capture_thread(thread, OTHER_THREAD_KEY);
    let mut triples: Vec<(String, String, i64)> = Vec::with_capacity(depth);
    with_captured(OTHER_THREAD_KEY, |frames| {
        triples.extend(
            frames.iter().map(|f| (f.function_name.to_owned(), f.filename.to_owned(), f.line)),
        );
    });
    forget(OTHER_THREAD_KEY);
    let array = ruby.ary_new_capa(triples.len());
    for (name, path, line) in triples {
        let triple = ruby.ary_new_capa(3);
        // Pushing onto new Arrays cannot fail (they are not frozen).
        let _ = triple.push(ruby.str_new(&name));
        let _ = triple.push(ruby.str_new(&path));
        let _ = triple.push(line);
        let _ = array.push(triple);
    }
    array
}

/// `Profiler._native_check_frames(thread)`: the self-check of `vm::frames` (its module doc),
/// called from a bmethod that a Ruby method calls. Returns nil if the current thread's part
/// failed (frames are then named the weaker way), else `thread`'s triples, for the caller to
/// compare with `thread.backtrace_locations` and end the check with
/// `_native_frame_names_checked`.
pub(crate) fn native_check_frames(ruby: &Ruby, thread: Value) -> Result<Option<RArray>, Error> {
    crate::recorder::errors::entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(crate::recorder::errors::type_error(ruby, "thread must be a Thread"));
        }
        // SAFETY: GVL held, called from this C method.
        if crate::vm::frames::decided() || !unsafe { crate::vm::frames::check() } {
            return Ok(None);
        }
        CACHE.with(|cache| *cache = None); // names made before the check are made again
        Ok(Some(thread_frames(ruby, thread.as_raw())))
    })
}

/// `Profiler._native_frame_names_checked(passed)`: ends the self-check. Names made meanwhile
/// are dropped, so that every name comes from one way of naming.
pub(crate) fn native_frame_names_checked(ruby: &Ruby, passed: bool) -> Result<bool, Error> {
    crate::recorder::errors::entry(ruby, || {
        crate::vm::frames::finish_check(passed);
        CACHE.with(|cache| *cache = None);
        Ok(qualified())
    })
}

/// `Profiler._native_qualified_names?`: whether frames get qualified names (module doc).
pub(crate) fn native_qualified(ruby: &Ruby) -> Result<bool, Error> {
    crate::recorder::errors::entry(ruby, || Ok(qualified()))
}

/// `Profiler._native_frame_reader?`: whether this build has the VM frame reader at all
/// (`vm::frames`: Ruby 3.1), so whether its self-check is worth running.
pub(crate) fn native_frame_reader(ruby: &Ruby) -> Result<bool, Error> {
    crate::recorder::errors::entry(ruby, || Ok(crate::vm::frames::BUILT))
}

/// `Profiler._native_frame_name(base_label, path)`: a Location's `base_label` as the profiler
/// names frames (`names::label_name`: spelled, or a compiled template's name).
pub(crate) fn native_frame_name(
    ruby: &Ruby,
    label: RString,
    path: RString,
) -> Result<String, Error> {
    crate::recorder::errors::entry(ruby, || {
        // SAFETY: copied at once, before any Ruby code runs.
        let (label, path) = unsafe {
            (String::from_utf8_lossy(label.as_slice()), String::from_utf8_lossy(path.as_slice()))
        };
        Ok(label_name(&label, &path))
    })
}
