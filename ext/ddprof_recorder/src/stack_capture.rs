//! Reading the calling thread's stack without making Ruby objects: the sampling job's fast
//! path (`ThreadSampler#call` in `lib/ddprof_recorder/profiler/thread_sampler.rb`).
//!
//! `rb_profile_frames` (Ruby 3.1 `vm_backtrace.c`) fills a buffer with the frames of the
//! current thread, leaf first: an instruction sequence for each Ruby frame, a method entry
//! for each C method, and the line numbers, without allocating. Each frame object is turned
//! into names once and kept in [`FRAMES`], so that a sample costs a hash lookup per frame.
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
//! Captured stacks are kept per key (the sampler uses the native thread id), as owned strings,
//! until that key's next capture: the sampler records them at once, and again when it charges
//! CPU carried to the thread's last on-CPU stack. Everything here runs with the GVL held.
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

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

/// A frame's names: `path` is None for a C method (it takes its caller's).
struct Names {
    base_label: Arc<str>,
    path: Option<Arc<str>>,
}

/// One frame of a captured stack.
#[derive(Clone)]
pub struct OwnedFrame {
    pub name: Arc<str>,
    pub file: Arc<str>,
    pub line: i64,
}

/// Frame object (VALUE) to names. Only used with the GVL held; a Mutex only to be `Sync`.
static FRAMES: Mutex<Option<FxMap<usize, Names>>> = Mutex::new(None);
/// Captured stacks by key.
static CAPTURED: Mutex<Option<FxMap<i64, Vec<OwnedFrame>>>> = Mutex::new(None);

thread_local! {
    static BUFFER: RefCell<(Vec<rb_sys::VALUE>, Vec<i32>)> =
        RefCell::new((vec![0; MAX_DEPTH], vec![0; MAX_DEPTH]));
}

/// Marks every cached frame object: the cache's GC root.
#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::Profiler::FrameCacheRoot", mark, free_immediately)]
struct FrameCacheRoot;

impl DataTypeFunctions for FrameCacheRoot {
    fn mark(&self, marker: &gc::Marker) {
        // Never contended: the lock is only taken with the GVL, and never across a call that
        // could start a GC (see `names`).
        if let Ok(frames) = FRAMES.try_lock() {
            for &frame in frames.iter().flat_map(|map| map.keys()) {
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
    class.define_singleton_method("_native_capture_stack", function!(capture_stack, 1))?;
    class.define_singleton_method("_native_forget_stack", function!(forget_stack, 1))?;
    Ok(())
}

/// `Profiler._native_capture_stack(key)`: reads the stack of the Ruby method that called it
/// (its caller's frame and this C method's own are left out) and keeps it under `key`.
/// Returns its depth (0: nothing to record).
fn capture_stack(ruby: &Ruby, key: i64) -> Result<usize, Error> {
    crate::errors::guard(ruby, || {
        let frames = capture();
        let depth = frames.len();
        let mut captured = CAPTURED.lock().unwrap_or_else(|p| p.into_inner());
        captured.get_or_insert_with(FxMap::default).insert(key, frames);
        Ok(depth)
    })
}

/// `Profiler._native_forget_stack(key)`: drops what is kept under `key`.
fn forget_stack(ruby: &Ruby, key: i64) -> Result<(), Error> {
    crate::errors::guard(ruby, || {
        let mut captured = CAPTURED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(map) = captured.as_mut() {
            map.remove(&key);
        }
        Ok(())
    })
}

/// Runs `f` with the stack kept under `key`, if any.
pub fn with_captured<R>(key: i64, f: impl FnOnce(&[OwnedFrame]) -> R) -> Option<R> {
    // Cloned out (reference counts only), so that `f` may run Ruby code freely.
    let frames = CAPTURED.lock().unwrap_or_else(|p| p.into_inner()).as_ref()?.get(&key)?.clone();
    Some(f(&frames))
}

/// The caller's caller's stack, leaf first.
fn capture() -> Vec<OwnedFrame> {
    BUFFER.with(|buffer| {
        let Ok(mut buffer) = buffer.try_borrow_mut() else { return Vec::new() };
        let (frames, lines) = &mut *buffer;
        // SAFETY: both buffers hold MAX_DEPTH entries; we hold the GVL (a method of ours).
        let n = unsafe {
            rb_sys::rb_profile_frames(0, MAX_DEPTH as i32, frames.as_mut_ptr(), lines.as_mut_ptr())
        };
        let n = usize::try_from(n).unwrap_or(0).min(MAX_DEPTH);
        let mut names: Vec<(Arc<str>, Option<Arc<str>>, i64)> = Vec::with_capacity(n);
        for i in 0..n {
            let (base_label, path) = frame_names(frames[i]);
            names.push((base_label, path, i64::from(lines[i])));
        }
        resolve(names)
    })
}

/// Drops this method's own frames, then gives each C method its caller's path and line.
fn resolve(names: Vec<(Arc<str>, Option<Arc<str>>, i64)>) -> Vec<OwnedFrame> {
    // Leading C frames are `_native_capture_stack` itself; the first Ruby frame is its caller.
    let skip = names.iter().position(|(_, path, _)| path.is_some()).map_or(names.len(), |i| i + 1);
    let mut names = &names[skip..];
    // The main thread's root: `rb_profile_frames` sees the program's `<main>` twice (the
    // top-level frame and the one that evaluates the script), where Locations show it once.
    if let [.., (child, Some(child_path), _), (root, Some(root_path), _)] = names {
        if &**root == "<main>" && root == child && root_path == child_path {
            names = &names[..names.len() - 1];
        }
    }
    let mut out = Vec::with_capacity(names.len());
    // Walk root first, so that each C frame knows the nearest Ruby frame below it.
    let mut caller: (Arc<str>, i64) = (Arc::from(""), 0);
    for (base_label, path, line) in names.iter().rev() {
        let (file, line) = match path {
            Some(path) => {
                caller = (Arc::clone(path), *line);
                (Arc::clone(path), *line)
            }
            None => (Arc::clone(&caller.0), caller.1),
        };
        out.push(OwnedFrame { name: Arc::clone(base_label), file, line });
    }
    out.reverse();
    out
}

fn frame_names(frame: rb_sys::VALUE) -> (Arc<str>, Option<Arc<str>>) {
    let key = frame as usize;
    {
        let frames = FRAMES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(names) = frames.as_ref().and_then(|map| map.get(&key)) {
            return (Arc::clone(&names.base_label), names.path.clone());
        }
    }
    // Outside the lock: these may allocate (a method name's String is made on first use), so
    // a GC may run, and mark the cache.
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
    let base_label = text(label).unwrap_or_else(|| Arc::from(""));
    let path = text(path);
    let mut frames = FRAMES.lock().unwrap_or_else(|p| p.into_inner());
    let map = frames.get_or_insert_with(FxMap::default);
    if map.len() >= MAX_CACHED_FRAMES {
        map.clear();
    }
    map.insert(key, Names { base_label: Arc::clone(&base_label), path: path.clone() });
    (base_label, path)
}

/// A Ruby String's text (non-UTF-8 bytes become U+FFFD), or None for nil and non-Strings.
fn text(v: rb_sys::VALUE) -> Option<Arc<str>> {
    // SAFETY: `v` is a live VALUE just returned by Ruby; GVL held.
    let s = RString::from_value(unsafe { Value::from_raw(v) })?;
    // SAFETY: copied at once, before any Ruby code runs.
    let bytes = unsafe { s.as_slice() };
    Some(Arc::from(String::from_utf8_lossy(bytes).as_ref()))
}
