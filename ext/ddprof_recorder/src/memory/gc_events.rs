//! GC time: a native internal tracepoint on Ruby 3.1's GC events (`ruby/debug.h`) measures
//! the CPU and wall time each thread spends in the GC, by phase (marking, sweeping) and kind
//! (minor, major). The thread sampler takes it (`Profiler._native_take_gc`) whenever it
//! charges that thread's CPU, and records it on a `(garbage collection)` frame, so that the
//! GC's CPU is not charged to the Ruby code that happened to trigger it
//! (`lib/ddprof_recorder/profiler/thread_sampler.rb`).
//!
//! # What the hook may do
//!
//! The GC calls these hooks from inside a collection (Ruby 3.1 `gc.c`: `gc_enter` and
//! `gc_exit` fire GC_ENTER and GC_EXIT around every step, a whole GC or a slice of
//! incremental marking or lazy sweeping; `gc_start` fires GC_START, `gc_marks_finish`
//! GC_END_MARK, `gc_sweep_finish` GC_END_SWEEP). Like every internal hook it may not use the
//! Ruby API; inside the GC an allocation would be fatal. So the hook reads two clocks
//! (`clock_gettime`, the thread's CPU clock and the monotonic one), and adds the time since
//! the previous event to a fixed table in a static: no allocation, no Ruby call. At GC_START
//! it also reads whether this GC is major, with `rb_gc_latest_gc_info(:major_by)`: `gc_start`
//! stores the GC's reason before it fires the event, and with a Symbol key `gc_info_decode`
//! only reads that word and returns Qnil or a static Symbol. Its first call interns its
//! Symbols (which allocates), so [`native_start`] calls it once first, outside the GC.
//!
//! Time between GC_ENTER and GC_START is the new GC's marking; after GC_END_SWEEP (or in a
//! step that neither starts nor ends a phase, such as finishing a lazy sweep) it goes to
//! the phase the GC is in.
//!
//! GC that runs inside the sampling job (the job allocates) is not counted: the job's own
//! CPU is already left out of the thread's account.
//!
//! # When it is on
//!
//! From `Profiler._native_gc_start` to `Profiler._native_gc_stop` (a run with `gc: true`, from
//! its start to its stop), and in that process only: a forked child inherits the enabled hook
//! (Ruby's hook list is process memory), where it measures nothing (the fork generation) until
//! the child starts measuring itself, and [`enabled`] says false; `ForkHook` removes it there
//! (`lib/ddprof_recorder/fork_hook.rb`). While it measures, the GC_EXIT hook that reads ticks
//! inside the GC (`sampling::signal_sampler::gc_ticks`) is off: the handler drops those ticks
//! then (their time is this module's), so that hook would only cost a call at every GC step;
//! each start and stop here sets `gc_ticks`' flag of it and tells `gc_ticks` to re-check (the
//! flag is kept there so that the capture never asks `memory/`).
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use magnus::{Error, RArray, Ruby};

use crate::sampling::clocks::thread_cpu::own_cpu_ns;
use crate::sampling::signal_sampler::gc_ticks;
use crate::vm::gvl_cell::GvlCell;
use crate::vm::internal_hook::InternalHook;

/// Threads whose GC time can wait to be taken at once; past it, GC time is counted in `lost`.
const MAX_THREADS: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    None,
    Marking,
    Sweeping,
}

/// CPU and wall ns per bucket: marking minor, marking major, sweeping minor, sweeping major.
#[derive(Clone, Copy)]
struct ThreadGc {
    tid: i32,
    times: [[i64; 2]; 4],
}

const EMPTY: ThreadGc = ThreadGc { tid: 0, times: [[0; 2]; 4] };

struct GcState {
    threads: [ThreadGc; MAX_THREADS],
    phase: Phase,
    major: bool,
    /// Inside a GC step (between GC_ENTER and GC_EXIT), on thread `tid`, counted or not.
    inside: bool,
    counted: bool,
    tid: i32,
    last_cpu: i64,
    last_wall: i64,
}

/// A GVL cell (`vm::gvl_cell`): the hook never finds it in use, so no event is missed.
static STATE: GvlCell<GcState> = GvlCell::new(
    "the GC time table",
    GcState {
        threads: [EMPTY; MAX_THREADS],
        phase: Phase::None,
        major: false,
        inside: false,
        counted: false,
        tid: 0,
        last_cpu: 0,
        last_wall: 0,
    },
);
static HOOK: InternalHook = InternalHook::new(
    rb_sys::RUBY_INTERNAL_EVENT_GC_ENTER
        | rb_sys::RUBY_INTERNAL_EVENT_GC_EXIT
        | rb_sys::RUBY_INTERNAL_EVENT_GC_START
        | rb_sys::RUBY_INTERNAL_EVENT_GC_END_MARK
        | rb_sys::RUBY_INTERNAL_EVENT_GC_END_SWEEP,
    on_gc_event,
);
/// The static Symbol `:major_by`.
static MAJOR_BY: AtomicUsize = AtomicUsize::new(rb_sys::Qnil as usize);
static LOST_NS: AtomicU64 = AtomicU64::new(0);

/// Whether the GC's time is being measured (`gc: true`), in this process. The flag lives in
/// `signal_sampler::gc_ticks`, whose hook must not run while this one measures.
pub fn enabled() -> bool {
    gc_ticks::gc_measured()
}

pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        HOOK.register();
        // SAFETY: a plain function with no data, run with the GVL after every `at_exit` block
        // (Ruby 3.1 `eval_jump.c`, `rb_ec_exec_end_proc`).
        unsafe { rb_sys::rb_set_end_proc(Some(stop_at_exit), rb_sys::Qnil as rb_sys::VALUE) };
    });
}

unsafe extern "C" fn stop_at_exit(_: rb_sys::VALUE) {
    let _ = catch_unwind(stop);
}

/// Off. Also the end proc's: at exit the sampling's own end proc turns `gc_ticks`' hook off,
/// so this one does not ask it to re-check (which could turn it on while Ruby tears down).
fn stop() {
    gc_ticks::set_gc_measured(false);
    HOOK.disable();
}

pub(crate) fn native_start(ruby: &Ruby) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        stop();
        STATE.with(|state| {
            state.threads = [EMPTY; MAX_THREADS];
            state.inside = false;
        });
        LOST_NS.store(0, Ordering::Relaxed);
        // SAFETY: GVL held, outside the GC: interns a static Symbol (immediate, never freed),
        // and makes `rb_gc_latest_gc_info` set up its own Symbols (see the module doc).
        unsafe {
            let sym = rb_sys::rb_id2sym(rb_sys::rb_intern(c"major_by".as_ptr()));
            MAJOR_BY.store(sym as usize, Ordering::Release);
            rb_sys::rb_gc_latest_gc_info(sym);
        }
        gc_ticks::set_gc_measured(true);
        HOOK.enable();
        gc_ticks::update();
        Ok(())
    })
}

pub(crate) fn native_stop(ruby: &Ruby) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        stop();
        gc_ticks::update();
        Ok(())
    })
}

/// `Profiler._native_take_gc(tid)`: the GC time of thread `tid` since it was last taken, as
/// `[cpu, wall]` ns for marking minor, marking major, sweeping minor, sweeping major (eight
/// Integers), or nil if none; then forgets it.
pub(crate) fn native_take(ruby: &Ruby, tid: i32) -> Result<Option<RArray>, Error> {
    crate::recorder::errors::entry(ruby, || {
        let taken = STATE.with(|state| {
            let entry = state.threads.iter_mut().find(|t| t.tid == tid && tid != 0)?;
            Some(std::mem::replace(entry, EMPTY).times)
        });
        let Some(times) = taken else { return Ok(None) };
        // Made out of the cell: an allocation may run a GC, whose hook reads it.
        let flat = ruby.ary_new_capa(8);
        for [cpu, wall] in times {
            flat.push(cpu)?;
            flat.push(wall)?;
        }
        Ok(Some(flat))
    })
}

pub(crate) fn native_lost_ns(ruby: &Ruby) -> Result<u64, Error> {
    crate::recorder::errors::entry(ruby, || Ok(LOST_NS.load(Ordering::Relaxed)))
}

/// The GC hook. Never unwinds, never allocates.
unsafe extern "C" fn on_gc_event(tracepoint: rb_sys::VALUE, _data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !enabled() {
            return;
        }
        // SAFETY: in one of our hooks with the GVL; only reads the current trace arg.
        let event = unsafe {
            rb_sys::rb_tracearg_event_flag(rb_sys::rb_tracearg_from_tracepoint(tracepoint))
        };
        gc_event(event);
    }));
}

fn gc_event(event: rb_sys::rb_event_flag_t) {
    STATE.with(|state| on_event(state, event));
}

fn on_event(state: &mut GcState, event: rb_sys::rb_event_flag_t) {
    let (cpu, wall) = (own_cpu_ns(), crate::sampling::clocks::monotonic_ns());
    if event == rb_sys::RUBY_INTERNAL_EVENT_GC_ENTER {
        state.inside = true;
        state.counted = !crate::sampling::ruby_handler::in_job_here();
        state.tid = crate::sampling::clocks::thread_cpu::own_tid();
        state.last_cpu = cpu;
        state.last_wall = wall;
        return;
    }
    if event == rb_sys::RUBY_INTERNAL_EVENT_GC_START {
        let sym = MAJOR_BY.load(Ordering::Acquire) as rb_sys::VALUE;
        // SAFETY: see the module doc: with a Symbol key, set up in `start`, it only reads
        // the latest GC's reason word.
        state.major = unsafe { rb_sys::rb_gc_latest_gc_info(sym) } != rb_sys::Qnil as rb_sys::VALUE;
        state.phase = Phase::Marking;
    }
    // The phase the time since the previous event belongs to.
    let phase = if state.phase == Phase::Marking { Phase::Marking } else { Phase::Sweeping };
    if state.inside {
        charge(state, phase, cpu, wall);
    }
    if event == rb_sys::RUBY_INTERNAL_EVENT_GC_END_MARK {
        state.phase = Phase::Sweeping;
    } else if event == rb_sys::RUBY_INTERNAL_EVENT_GC_END_SWEEP {
        state.phase = Phase::None;
    } else if event == rb_sys::RUBY_INTERNAL_EVENT_GC_EXIT {
        state.inside = false;
    }
}

fn charge(state: &mut GcState, phase: Phase, cpu: i64, wall: i64) {
    let times = [(cpu - state.last_cpu).max(0), (wall - state.last_wall).max(0)];
    state.last_cpu = cpu;
    state.last_wall = wall;
    if !state.counted {
        return;
    }
    let bucket = usize::from(phase == Phase::Sweeping) * 2 + usize::from(state.major);
    let tid = state.tid;
    let slot = match state.threads.iter().position(|t| t.tid == tid) {
        Some(i) => Some(i),
        None => state.threads.iter().position(|t| t.tid == 0),
    };
    let Some(slot) = slot else {
        LOST_NS.fetch_add(times[0] as u64, Ordering::Relaxed);
        return;
    };
    let entry = &mut state.threads[slot];
    entry.tid = tid;
    entry.times[bucket][0] += times[0];
    entry.times[bucket][1] += times[1];
}
