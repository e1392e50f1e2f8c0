//! The live heap: the objects of the sampled allocations (see `allocations`) that the
//! GC has not freed yet, by allocating stack and class. Relies on Ruby 3.1's internal
//! `RUBY_INTERNAL_EVENT_FREEOBJ` event and on `rb_gc_location` for compaction.
//!
//! The tracked objects are weak references: this module never marks them, so tracking does
//! not keep anything alive. A native tracepoint on FREEOBJ drops an object when the GC frees
//! it: Ruby 3.1 `gc.c` fires the event at the top of `obj_free`, for every object swept (and
//! at exit, after our end proc has disabled the hook). The hook only removes a key from a
//! Rust map (no Ruby object, no Ruby call; the same rules as in the NEWOBJ hook). `GC.compact`
//! moves live objects without freeing them: the tracker's root object has a compaction
//! callback (`dcompact`, which Ruby 3.1's `gc_update_object_references` calls for every live
//! typed data) that rewrites each key with `rb_gc_location`. An object freed and then moved
//! into cannot be confused: its slot is free (the FREEOBJ came) before anything moves there.
//!
//! What it costs is bounded: at most [`MAX_TRACKED`] objects are tracked (later samples are
//! counted in `heap_skipped` instead), their stacks shared between objects; a report reads
//! `rb_obj_memsize_of` of each tracked object (which only reads the object) once per window.
//! The tracked objects are a GVL cell (`vm::gvl_cell`), so the FREEOBJ hook and the compaction
//! callback always find them.
use std::collections::HashSet;
use std::ffi::c_void;
use std::hash::BuildHasherDefault;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};

use magnus::{Error, RArray, RHash, RString, Ruby};
use rustc_hash::{FxHashMap, FxHasher};

use crate::vm::gvl_cell::{GcRoot, GvlCell};
use crate::vm::internal_hook::InternalHook;

/// Most objects tracked at once. A tracked object costs about 64 bytes here (plus its stack,
/// shared with the others of that stack), and one `rb_obj_memsize_of` per report.
pub const MAX_TRACKED: usize = 50_000;

#[derive(Hash, PartialEq, Eq)]
struct OwnedFrame {
    name: Box<str>,
    file: Box<str>,
    line: i64,
}

type Stack = Arc<[OwnedFrame]>;

struct Tracked {
    stack: Stack,
    class: Arc<str>,
    weight: u64,
}

#[derive(Default)]
struct Heap {
    /// By object address (VALUE).
    objects: FxHashMap<usize, Tracked>,
    stacks: HashSet<Stack, BuildHasherDefault<FxHasher>>,
    classes: HashSet<Arc<str>, BuildHasherDefault<FxHasher>>,
}

/// None whenever tracking is off ([`ENABLED`]): made before it goes on, dropped before it
/// goes off.
static HEAP: GvlCell<Option<Heap>> = GvlCell::new("the tracked heap", None);
static ENABLED: AtomicBool = AtomicBool::new(false);
static HOOK: InternalHook = InternalHook::new(rb_sys::RUBY_INTERNAL_EVENT_FREEOBJ, on_freeobj);
static TRACKED: AtomicU64 = AtomicU64::new(0);
static FREED: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Rewrites the tracked addresses after `GC.compact` moved objects: the compaction callback
/// of the heap's GC root.
fn compact() {
    // Tracking off: nothing is tracked, and the cell need not be touched (after a Ractor
    // started, docs/profiler.md "Ractors", a GC may run on a thread of another Ractor).
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    HEAP.with(|heap| {
        let Some(heap) = heap else { return };
        let objects = std::mem::take(&mut heap.objects);
        heap.objects = objects
            .into_iter()
            .map(|(address, tracked)| {
                // SAFETY: during compaction's reference update; `address` is a live object
                // (a freed one has left the map), moved or not: rb_gc_location reads its slot.
                (unsafe { rb_sys::rb_gc_location(address as rb_sys::VALUE) } as usize, tracked)
            })
            .collect();
    });
}

extern "C" {
    /// Ruby 3.1 `gc.c` (exported; what `ObjectSpace.memsize_of` reads): the bytes the object
    /// holds, without allocating.
    fn rb_obj_memsize_of(obj: rb_sys::VALUE) -> usize;
}

pub fn init(ruby: &Ruby) -> Result<(), Error> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| HOOK.register());
    GcRoot { mark: None, compact: Some(compact) }.register(ruby)?;
    Ok(())
}

/// Starts tracking afresh (GVL held).
pub fn start() {
    HEAP.with(|heap| *heap = Some(Heap::default()));
    for counter in [&TRACKED, &FREED, &SKIPPED] {
        counter.store(0, Ordering::Relaxed);
    }
    ENABLED.store(true, Ordering::Release);
    HOOK.enable();
}

/// Stops tracking and forgets the objects: without the free hook their addresses could go
/// stale (GVL held).
pub fn stop() {
    HEAP.with(|heap| *heap = None);
    ENABLED.store(false, Ordering::Release);
    HOOK.disable();
}

pub(crate) fn native_stop(ruby: &Ruby) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        stop();
        Ok(())
    })
}

/// Tracks `object`, just sampled, with the stack kept under `key` in `stack_capture`.
pub fn track(object: rb_sys::VALUE, key: i64, class: RString, weight: u64) {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: GVL held; copied at once, before any Ruby code runs.
    let class_text = String::from_utf8_lossy(unsafe { class.as_slice() }).into_owned();
    let frames = crate::sampling::stack_capture::with_captured(key, |frames| {
        frames
            .iter()
            .map(|f| OwnedFrame {
                name: f.function_name.into(),
                file: f.filename.into(),
                line: f.line,
            })
            .collect::<Vec<_>>()
    });
    let Some(frames) = frames else { return };
    HEAP.with(|heap| {
        let Some(heap) = heap else { return };
        if heap.objects.len() >= MAX_TRACKED {
            SKIPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let stack = match heap.stacks.get(frames.as_slice()) {
            Some(stack) => stack.clone(),
            None => {
                let stack: Stack = frames.into();
                heap.stacks.insert(stack.clone());
                stack
            }
        };
        let class = match heap.classes.get(class_text.as_str()) {
            Some(class) => class.clone(),
            None => {
                let class: Arc<str> = class_text.into();
                heap.classes.insert(class.clone());
                class
            }
        };
        heap.objects.insert(object as usize, Tracked { stack, class, weight });
        TRACKED.fetch_add(1, Ordering::Relaxed);
    });
}

/// The FREEOBJ hook. Never unwinds, never allocates a Ruby object.
unsafe extern "C" fn on_freeobj(tracepoint: rb_sys::VALUE, _data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: in a FREEOBJ hook with the GVL: the trace arg's object is the one freed.
        let object =
            unsafe { rb_sys::rb_tracearg_object(rb_sys::rb_tracearg_from_tracepoint(tracepoint)) };
        HEAP.with(|heap| {
            if let Some(heap) = heap {
                if heap.objects.remove(&(object as usize)).is_some() {
                    FREED.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }));
}

/// One line of the live heap: a stack and class, how many tracked objects, their weighted
/// size.
struct Live {
    stack: Stack,
    class: Arc<str>,
    samples: u64,
    size: u64,
}

/// `Profiler._native_heap_live`: the tracked objects still alive, as `[[frames, class,
/// samples, size], ...]` (`frames` as `[name, file, line]`, leaf first; `size`: each
/// object's `ObjectSpace.memsize_of` times its sample's weight, an estimate of the bytes
/// that stack's live objects hold).
pub(crate) fn native_live(ruby: &Ruby) -> Result<RArray, Error> {
    crate::recorder::errors::entry(ruby, || {
        let lines = HEAP.with(|heap| {
            let heap = heap.as_mut()?;
            let mut by_key: FxHashMap<(*const OwnedFrame, *const u8), Live> = FxHashMap::default();
            for (&address, tracked) in &heap.objects {
                // SAFETY: a live object (freed ones left the map); GVL held; only reads, and
                // allocates nothing (a typed object's `dsize` must not either).
                let size = unsafe { rb_obj_memsize_of(address as rb_sys::VALUE) } as u64;
                let key = (tracked.stack.as_ptr(), tracked.class.as_ptr());
                let live = by_key.entry(key).or_insert_with(|| Live {
                    stack: tracked.stack.clone(),
                    class: tracked.class.clone(),
                    samples: 0,
                    size: 0,
                });
                live.samples += 1;
                live.size = live.size.saturating_add(size.saturating_mul(tracked.weight));
            }
            // Stacks and classes no tracked object holds any more.
            heap.stacks.retain(|stack| Arc::strong_count(stack) > 1);
            heap.classes.retain(|class| Arc::strong_count(class) > 1);
            Some(by_key.into_values().collect::<Vec<_>>())
        });
        let Some(lines) = lines else { return Ok(ruby.ary_new()) };
        // Ruby objects only now, out of the cell.
        let result = ruby.ary_new_capa(lines.len());
        for live in lines {
            let frames = ruby.ary_new_capa(live.stack.len());
            for frame in live.stack.iter() {
                frames.push((&*frame.name, &*frame.file, frame.line))?;
            }
            result.push((frames, &*live.class, live.samples, live.size))?;
        }
        Ok(result)
    })
}

pub fn add_stats(ruby: &Ruby, hash: RHash) -> Result<(), Error> {
    let tracked_now = HEAP.with(|heap| heap.as_ref().map_or(0, |h| h.objects.len()));
    hash.aset(ruby.to_symbol("heap_tracked"), TRACKED.load(Ordering::Relaxed))?;
    hash.aset(ruby.to_symbol("heap_freed"), FREED.load(Ordering::Relaxed))?;
    hash.aset(ruby.to_symbol("heap_skipped"), SKIPPED.load(Ordering::Relaxed))?;
    hash.aset(ruby.to_symbol("heap_live_tracked"), tracked_now)?;
    Ok(())
}
