//! A CPU tick that comes while the thread runs the GC, read when that GC step ends: the GC's
//! CPU is charged to the code that allocated, under a `(garbage collection)` leaf frame.
//!
//! # Why
//!
//! The signal handler does not read a stack while the GC runs (`rb_during_gc`: a compaction
//! may be moving the very objects it would read, see `signal_sampler`). Such a tick used to
//! be dropped, its CPU left for the thread's next sample, so the GC's CPU was spread over the
//! whole profile as if every function had its share of it. But the GC runs on the thread
//! that allocated, inside the allocation (`newobj_of` and the `gc_start` it calls when the
//! heap is full): a sampler that reads the stack from outside (rbspy) or perf sees that CPU
//! under the allocating frame (`Class#new`, `Array#[]`, a string method); spreading it gave
//! those frames less than half their share in a GC-heavy program (bench/RESULTS.md,
//! "Accuracy on each Ruby").
//!
//! # How
//!
//! The handler keeps such a tick as a sample whose stack is still to be read
//! (`signal_sampler`, `READ_AT_GC_EXIT`), and this module's internal hook on
//! `RUBY_INTERNAL_EVENT_GC_EXIT` reads it ([`super::read_gc_ticks`]). The event
//! fires in `gc_exit` at the end of every GC step (a whole GC, or a slice of incremental
//! marking or lazy sweeping), on the thread that ran it, with the GVL and the VM lock held,
//! before `during_gc` is cleared (Ruby 3.3.8 `gc.c`, 3.4.5 `gc/default/default.c`): still
//! inside the allocation, so the thread's stack is the allocating code's. A compaction is
//! over by then: since Ruby 3.2 it moves objects and updates every reference within one step
//! (`gc_sweep` calls `gc_sweep_compact`, which ends with `gc_compact_finish` and
//! `gc_update_references`; 3.3.8 `gc.c`, 3.4.5 `gc/default/default.c`), so the frames read
//! are where they stay. Like every internal hook this one neither allocates nor calls Ruby:
//! it reads frames as the handler does (`stack_capture::read_current`, no allocation, no
//! lock).
//!
//! Only on Ruby 3.3 and later: on 3.1 a GC-event hook sends every allocation through
//! `newobj_of`'s slow path (`vm::GC_EXIT_HOOK_KEEPS_ALLOCATION_FAST`). There, and in the
//! safepoint mode, the handler asks for the job at once instead (`READ_AFTER_GC`), which reads
//! the stack at the thread's first interrupt check after the GC, under the same leaf: near
//! the allocating code, with the safepoint's bias. Dropped, as such ticks were, their CPU went
//! to the thread's later samples, most often another request's in a server: on the Sinatra
//! app of bench/sinatra_endpoints.rb (Ruby 3.1.2) the ERB route, whose requests allocate,
//! had 3.5 points less than its truth and the CPU loop as much more. Not with `gc: true`
//! either: `gc_events` then measures the GC's time and records it on its own frames, and the
//! handler drops such ticks so as not to count the GC twice; so the hook is not on then, where it would only be an idle call at every GC step
//! (`spec/profiler/gc_and_heap_spec.rb` counts the hooks). Only when the handler
//! reads stacks (`signals: :handler`): in the safepoint mode the job reads the stack, after the
//! GC. So the hook is on exactly while a run whose handler reads stacks wants it ([`start`] to
//! [`stop`]) and `gc_events` does not measure, which each of them re-checks when it changes
//! ([`update`]); a stopped profiler leaves it off.
//!
//! A tick that comes inside this hook waits for the next step's end; one whose step ended
//! after the profiler stopped is dropped at the drain, its CPU left for the next sample, as
//! before (both counted in `signals_in_gc`).
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use crate::vm::internal_hook::InternalHook;

static HOOK: InternalHook = InternalHook::new(rb_sys::RUBY_INTERNAL_EVENT_GC_EXIT, on_gc_exit);
/// Whether a sampling run whose handler reads stacks is on (changed with the GVL only).
static WANTED: AtomicBool = AtomicBool::new(false);
/// Whether `memory::gc_events` measures the GC's time (`gc: true`), and the fork generation
/// that turned it on (a forked child's inherited hook measures nothing). `gc_events` sets them
/// ([`set_gc_measured`]) and both read them ([`gc_measured`]): kept here, below `gc_events`,
/// so that the capture never asks `memory/`.
static GC_MEASURED: AtomicBool = AtomicBool::new(false);
static GC_MEASURED_GENERATION: AtomicU64 = AtomicU64::new(u64::MAX);

/// Whether `gc_events` measures the GC's time, in this process. Atomics only.
pub fn gc_measured() -> bool {
    GC_MEASURED.load(Ordering::Acquire)
        && GC_MEASURED_GENERATION.load(Ordering::Acquire)
            == crate::recorder::fork::fork_generation()
}

/// `gc_events` starts (in this fork generation) or stops measuring the GC's time. It calls
/// [`update`] after, except at exit. GVL held.
pub fn set_gc_measured(on: bool) {
    if on {
        GC_MEASURED_GENERATION.store(crate::recorder::fork::fork_generation(), Ordering::Release);
    }
    GC_MEASURED.store(on, Ordering::Release);
}

/// Makes the hook's TracePoint slot a GC root. Once, at load.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| HOOK.register());
}

/// For a run whose handler reads stacks: the hook is wanted from now on (GVL held).
pub fn start() {
    WANTED.store(true, Ordering::Release);
    update();
}

/// The run stops: the hook is off (GVL held).
pub fn stop() {
    WANTED.store(false, Ordering::Release);
    update();
}

/// Turns the hook on if a run wants it, it keeps allocation fast on this Ruby, and `gc_events`
/// does not measure the GC; else off. GVL held: [`start`], [`stop`], and `gc_events` when it
/// starts or stops measuring.
pub fn update() {
    if WANTED.load(Ordering::Acquire)
        && crate::vm::GC_EXIT_HOOK_KEEPS_ALLOCATION_FAST
        && !gc_measured()
    {
        HOOK.enable();
    } else {
        HOOK.disable();
    }
}

/// Whether a tick inside the GC is kept for the step's end: the hook is on, and `gc_events`
/// does not measure the GC. Atomics only (the signal handler asks).
pub fn on() -> bool {
    HOOK.is_on() && !gc_measured()
}

/// The hook: never unwinds, never allocates.
unsafe extern "C" fn on_gc_exit(_tracepoint: rb_sys::VALUE, _data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(super::read_gc_ticks));
}
