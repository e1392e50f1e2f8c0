//! Reading the calling thread's stack without making Ruby objects: the sampling job's fast
//! path (`ThreadSampler#call` in `lib/ddprof_recorder/profiler/thread_sampler.rb`).
//!
//! `rb_profile_frames` (Ruby 3.1 `vm_backtrace.c`) fills a buffer with the frames of the
//! current thread, leaf first: an instruction sequence for each Ruby frame, a method entry
//! for each C method, and the line numbers, without allocating. Each frame object is turned
//! into names once and kept in [`CACHE`], so that a sample costs a hash lookup per frame.
//! The names are the ones `Thread::Backtrace::Location` gives (what `StackRecorder#
//! record_sample` reads from Locations): `base_label`, and `path`, which for a C method is
//! the path (and line) of the Ruby frame that called it. So a stack reads the same whether it
//! came from here or from `Thread#backtrace_locations`, and both aggregate together.
//!
//! The cache's keys are Ruby objects, which the GC could free (an iseq of `eval`ed code) and
//! another object could then take the address of, or which compaction could move. A cached
//! frame object is therefore marked by [`FrameCacheRoot`], a GC root: `rb_gc_mark` keeps it
//! alive and pins it. The cache is bounded ([`MAX_CACHED_FRAMES`]; past it, it starts over).
//!
//! Captured stacks are kept per key (the sampler uses the native thread id), as cache slots,
//! until that key's next capture: the sampler records them at once, and again when it charges
//! CPU carried to the thread's last on-CPU stack. Everything here runs with the GVL held.
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Mutex;

use ddprof_recorder_core::Frame;
use magnus::{
    function, gc, prelude::*, rb_sys::FromRawValue, DataTypeFunctions, Error, RModule, RString,
    Ruby, TypedData, Value,
};
use rustc_hash::FxHasher;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Deepest stack read; deeper ones lose their root-side frames (the recorder's `max_frames`
/// then cuts it further).
const MAX_DEPTH: usize = 2048;
/// Distinct frame objects kept before the cache starts over.
const MAX_CACHED_FRAMES: usize = 1 << 16;

/// A cached frame's names: `path` is None for a C method (it takes its caller's).
struct Names {
    base_label: Box<str>,
    path: Option<Box<str>>,
}

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
    slots: Vec<Names>,
    /// Captured stacks by key, as slots (valid until the cache starts over, which drops them).
    captured: FxMap<i64, Vec<CapturedFrame>>,
}

/// Only used with the GVL held; a Mutex only to be `Sync`. Never held across a call into Ruby.
static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn cache() -> std::sync::MutexGuard<'static, Option<Cache>> {
    CACHE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

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

/// Marks every cached frame object: the cache's GC root.
#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::Profiler::FrameCacheRoot", mark, free_immediately)]
struct FrameCacheRoot;

impl DataTypeFunctions for FrameCacheRoot {
    fn mark(&self, marker: &gc::Marker) {
        // Never contended: the lock is only taken with the GVL, and never across a call that
        // could start a GC (see `capture`).
        if let Ok(cache) = CACHE.try_lock() {
            for &frame in cache.iter().flat_map(|c| c.slot_of.keys()) {
                // SAFETY: every key is a frame object that was live when cached, and marked
                // (so kept alive) by this very function at every GC since.
                marker.mark(unsafe { Value::from_raw(frame as rb_sys::VALUE) });
            }
        }
    }
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Profiler", ruby.class_object())?;
    let root_class = class.define_class("FrameCacheRoot", ruby.class_object())?;
    root_class.undef_default_alloc_func();
    let root = ruby.obj_wrap(FrameCacheRoot);
    // One object for the process's life: marked (so are the frames it marks) at every GC.
    ruby.gc_register_mark_object(root);
    class.define_singleton_method("_native_capture_stack", function!(native_capture_stack, 1))?;
    class.define_singleton_method("_native_forget_stack", function!(native_forget_stack, 1))?;
    Ok(())
}

/// `Profiler._native_capture_stack(key)`: reads the stack of the Ruby method that called it
/// (its caller's frame and this C method's own are left out) and keeps it under `key`.
/// Returns its depth (0: nothing to record).
fn native_capture_stack(ruby: &Ruby, key: i64) -> Result<usize, Error> {
    crate::errors::entry(ruby, || Ok(capture(key)))
}

/// `Profiler._native_forget_stack(key)`: drops what is kept under `key`.
fn native_forget_stack(ruby: &Ruby, key: i64) -> Result<(), Error> {
    crate::errors::entry(ruby, || {
        forget(key);
        Ok(())
    })
}

/// Drops what is kept under `key`.
pub fn forget(key: i64) {
    if let Some(cache) = cache().as_mut() {
        cache.captured.remove(&key);
    }
}

/// Runs `f` with the stack kept under `key` as the core's frames, if any. `f` must not call
/// Ruby: the cache is locked meanwhile.
pub fn with_captured<R>(key: i64, f: impl FnOnce(&[Frame<'_>]) -> R) -> Option<R> {
    let guard = cache();
    let cache = guard.as_ref()?;
    let captured = cache.captured.get(&key)?;
    let name = |slot: u32| cache.slots.get(slot as usize);
    let frames: Vec<Frame<'_>> = captured
        .iter()
        .map(|frame| Frame {
            function_name: name(frame.name).map_or("", |n| &n.base_label),
            filename: name(frame.file).and_then(|n| n.path.as_deref()).unwrap_or(""),
            line: frame.line,
        })
        .collect();
    Some(f(&frames))
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

fn read_stack(key: i64, skip: Skip) -> usize {
    BUFFER.with(|buffer| {
        let Ok(mut buffer) = buffer.try_borrow_mut() else { return 0 };
        let Buffer { frames, lines, slots } = &mut *buffer;
        // SAFETY: both buffers hold MAX_DEPTH entries; we hold the GVL (a method of ours, or
        // a postponed job).
        let n = unsafe {
            rb_sys::rb_profile_frames(0, MAX_DEPTH as i32, frames.as_mut_ptr(), lines.as_mut_ptr())
        };
        let n = usize::try_from(n).unwrap_or(0).min(MAX_DEPTH);
        store_frames(key, &frames[..n], &lines[..n], slots, skip)
    })
}

/// Keeps under `key` a stack that `rb_profile_frames` read earlier (leaf first), whole:
/// the allocation sampler's, read in the NEWOBJ hook where frames cannot be named (see
/// `allocation_sampler`). Returns its depth (0: nothing kept).
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
    let mut unknown = Vec::new();
    {
        let guard = cache();
        for &frame in frames {
            let slot = guard.as_ref().and_then(|c| c.slot_of.get(&(frame as usize)).copied());
            if slot.is_none() {
                unknown.push(frame);
            }
            slots.push(slot.unwrap_or(UNKNOWN));
        }
    }
    let mut guard = cache();
    if !unknown.is_empty() {
        // Named outside the lock: reading names may allocate (a method name's String is
        // made on first use), so a GC may run, and mark the cache.
        drop(guard);
        let named: Vec<(rb_sys::VALUE, Names)> =
            unknown.into_iter().map(|f| (f, names_of(f))).collect();
        guard = cache();
        let cache = guard.get_or_insert_with(Cache::default);
        if cache.slots.len() + named.len() > MAX_CACHED_FRAMES {
            *cache = Cache::default();
            // Everything must be named again: start this capture over next time.
            return 0;
        }
        for (frame, names) in named {
            let flag = if names.path.is_some() { RUBY_FRAME } else { 0 };
            let next = cache.slots.len() as u32;
            let slot = *cache.slot_of.entry(frame as usize).or_insert(next | flag);
            if slot & !RUBY_FRAME == next {
                cache.slots.push(names);
            }
        }
        for (slot, &frame) in slots.iter_mut().zip(frames) {
            if *slot == UNKNOWN {
                *slot = cache.slot_of.get(&(frame as usize)).copied().unwrap_or(UNKNOWN);
            }
        }
    }
    let cache = guard.get_or_insert_with(Cache::default);
    let mut stack = cache.captured.remove(&key).unwrap_or_default();
    resolve(cache, slots, lines, &mut stack, skip);
    let depth = stack.len();
    cache.captured.insert(key, stack);
    depth
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
        let names = |slot: u32| {
            cache.slots.get((slot & !RUBY_FRAME) as usize).map(|n| (&n.base_label, &n.path))
        };
        let root_names = names(slots[end - 1]);
        let is_main =
            root_names.is_some_and(|(label, path)| &**label == "<main>" && path.is_some());
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

fn names_of(frame: rb_sys::VALUE) -> Names {
    // SAFETY: `frame` comes from rb_profile_frames on the live stack; GVL held. In Ruby 3.1
    // `rb_profile_frame_base_label` is nil for a C method: its name is the method's.
    let (label, path) = unsafe {
        (rb_sys::rb_profile_frame_base_label(frame), rb_sys::rb_profile_frame_path(frame))
    };
    let label = if label == rb_sys::Qnil as rb_sys::VALUE {
        // SAFETY: as above.
        unsafe { rb_sys::rb_profile_frame_method_name(frame) }
    } else {
        label
    };
    Names { base_label: text(label).unwrap_or_default(), path: text(path) }
}

/// A Ruby String's text (non-UTF-8 bytes become U+FFFD), or None for nil and non-Strings.
fn text(v: rb_sys::VALUE) -> Option<Box<str>> {
    // SAFETY: `v` is a live VALUE just returned by Ruby; GVL held.
    let s = RString::from_value(unsafe { Value::from_raw(v) })?;
    // SAFETY: copied at once, before any Ruby code runs.
    let bytes = unsafe { s.as_slice() };
    Some(String::from_utf8_lossy(bytes).into())
}
