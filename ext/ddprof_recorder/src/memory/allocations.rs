//! Allocation sampling: a native internal tracepoint on `RUBY_INTERNAL_EVENT_NEWOBJ` that
//! takes one allocation in about every `interval`, reads its stack, and has the allocating
//! thread record it in a postponed job (`Profiler::AllocationRecorder#call` in
//! `lib/ddprof_recorder/profiler/allocation_recorder.rb`). Relies on Ruby 3.1's internal
//! events (`ruby/debug.h`, `vm_trace.c`).
//!
//! # What the hook may do
//!
//! Ruby calls a NEWOBJ hook from `newobj_of` (Ruby 3.1 `gc.c`, `gc_event_hook_prep`) right
//! after it took a slot for the object and wrote its flags and class, before the caller
//! initialized it. `rb_tracepoint_new`'s documentation (`ruby/debug.h`) says what an internal
//! hook must not do: use any Ruby API, "even object creations". An allocation there would
//! re-enter `newobj_of` and could start a GC in the middle of the caller's allocation. So the
//! hook only:
//!
//! - counts down to the next sample (a step drawn uniformly from 1 to `2 * interval - 1`, so
//!   the mean is `interval` and a loop that allocates with a fixed period does not alias with
//!   it; the sample stands for its step's allocations, each times the `every` of the duty
//!   cycle when it was seen: see `duty_cycle`, which keeps the hook on for part of the time
//!   only), and counts what it sees for the duty cycle;
//! - reads the object's type and class from its `RBasic` header (plain memory reads): objects
//!   whose class field is not a class (`T_IMEMO`, `T_NODE`: internal objects keep other data
//!   there) or is 0 (hidden objects) get no class;
//! - reads the stack into a preallocated buffer (`stack_capture::read_current`:
//!   `rb_profile_frames`, `vm_backtrace.c`, or `vm::frames`, which reads the same way): it walks
//!   the control frames and copies frame objects (iseqs, method entries) without allocating;
//! - registers the postponed job (`rb_postponed_job_register_one`, which only claims a slot
//!   of the VM's job buffer and sets an interrupt flag, `vm_trace.c`).
//!
//! No Ruby object is made and no Ruby method is called. Naming the frames does allocate (a
//! method name's String is made on first use), so it waits for the job.
//!
//! # Why the stack is read in the hook
//!
//! The job runs at the thread's next interrupt check; by then the allocating method may have
//! returned. Reading the stack in the hook is what makes it the allocating stack. The frames
//! read are kept alive, and pinned against `GC.compact`, until the job has named them: the
//! pending samples are marked by [`PendingRoot`], a GC root, with `rb_gc_mark` (which pins).
//! The sample's thread, class and (for the heap profile) object are marked the same way.
//! The lock on the pending samples is never held across anything that can allocate, so a GC
//! (which runs only at an allocation) never finds it held.
//!
//! # Postponed-job data (Ruby bug #19991)
//!
//! The job is registered with the trigger's decoy data pointer (see `trigger`'s module doc):
//! a racing register may hand our data to the GC's finalizer job.
//!
//! # Reentrancy, fork and exit
//!
//! The job's own allocations, and those of the sampling job, are not sampled: each job marks
//! the thread it runs on ([`JOB_HERE`], `job::in_job_here`), so that a job switched
//! out in its Ruby handler does not hide the other threads' allocations. Nor are those of
//! Profiler#start and #stop, on the thread that calls them ([`OWN_HERE`]). Any thread's job
//! records the pending samples of every thread, each taking the next one not taken; a taken
//! sample stays marked until its job has recorded it, and the buffer starts over as soon as
//! every sample in it is taken. A forked child inherits the enabled tracepoint, but the hook and
//! the job do nothing in a process other than the one that started sampling (the fork
//! generation of `stack_recorder`), until sampling is started again there. An end proc
//! (registered at load, run after every `at_exit` block) disables the tracepoint before the
//! VM is torn down.
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use magnus::{
    function, gc, prelude::*, rb_sys::AsRawValue, rb_sys::FromRawValue, value::LazyId,
    DataTypeFunctions, Error, RHash, RModule, RString, Ruby, TypedData, Value,
};

use crate::memory::internal_hook::InternalHook;
use crate::sampling::random::Jitter;

/// The keys under which a sampled allocation's stack is kept in `stack_capture` while it is
/// recorded are this plus the recording thread's id: the sampler's keys, native thread ids
/// and their negations, are never that small.
pub const ALLOCATION_KEY: i64 = i64::MIN;
/// Deepest allocating stack read (the recorder's `max_frames` then cuts it further).
const DEPTH: usize = 512;
/// Samples that can wait for their job, and the frames they can hold in all (each takes its
/// depth; 3 MiB for both buffers, resident only as far as written). The job runs at the next
/// interrupt check; a C method that allocates many objects without one fills them at a small
/// `interval`, and the samples past them are counted in `dropped`. Measured: with 256 samples
/// of 512 frames each, `JSON.parse` of a 200-record document at interval 1 dropped most of
/// its objects (its share of `alloc-count` came out 56% where interval 4096 gave 83%).
const MAX_PENDING: usize = 16_384;
const POOL: usize = 1 << 18;
/// Largest `interval`.
pub const MAX_INTERVAL: u64 = 1 << 40;

// Ruby 3.1 `ruby/internal/value_type.h`.
const T_MASK: usize = 0x1f;
const T_SYMBOL: usize = 0x14;

/// A sampled allocation waiting for the job; its frames are at `start` in the buffers.
struct Pending {
    thread: rb_sys::VALUE,
    /// 0: none (a hidden or internal object).
    klass: rb_sys::VALUE,
    /// Kept (and marked) only for the heap profile; else 0.
    object: rb_sys::VALUE,
    weight: u64,
    start: usize,
    depth: usize,
}

struct State {
    frames: Vec<rb_sys::VALUE>,
    lines: Vec<i32>,
    pending: Vec<Pending>,
    /// Pending samples taken by a job (from the front). Once all are, the buffer starts over:
    /// what a job holds is marked through [`FLYING`] from the moment it takes it.
    taken: usize,
    interval: u64,
    /// The current step: the allocations to see until the next sample.
    step: u64,
    /// What the step's allocations seen under an earlier `every` weigh (each its `every`), and
    /// how many they are: the sample at the step's end weighs that plus the rest times the
    /// `every` then.
    carried: u64,
    accounted: u64,
    rng: Jitter,
    generation: u64,
    heap: bool,
}

impl State {
    fn draw(&mut self) -> u64 {
        let span = 2 * self.interval - 1;
        (1 + (self.rng.unit() * span as f64) as u64).min(span)
    }
}

/// Only used with the GVL held; a Mutex only to be `Sync`. Never held across an allocation.
static STATE: Mutex<Option<State>> = Mutex::new(None);
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Allocations left before the next sample (written only with the GVL).
static COUNTDOWN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The job runs on this thread: its own allocations are not sampled.
    static JOB_HERE: Cell<bool> = const { Cell::new(false) };
    /// The profiler's start or stop runs on this thread: its allocations are not the
    /// program's (`_native_own_allocations`).
    static OWN_HERE: Cell<bool> = const { Cell::new(false) };
}
/// The handler (`AllocationRecorder`) or Qnil: a GC root.
static HANDLER: AtomicUsize = AtomicUsize::new(rb_sys::Qnil as usize);
static HOOK: InternalHook = InternalHook::new(rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj);
/// Bumped at every start and stop: a job switched out meanwhile holds samples of an earlier
/// run, no longer marked.
static RUN: AtomicU64 = AtomicU64::new(0);
/// The hook sees one slot of time in this many (the `every` of the duty cycle's block that
/// put it on; 1 without a duty cycle): a sample of `step` seen allocations stands for `step *
/// every` (`duty_cycle`).
static SEEN_EVERY: AtomicU64 = AtomicU64::new(1);
/// Whether the latest start has a duty cycle, and what the hook costs an allocation then
/// (`f64` bits), as measured.
static DUTY: AtomicBool = AtomicBool::new(false);
/// The hook's count of allocations seen (`duty_cycle::SEEN`) when sampling last started.
static SEEN_AT_START: AtomicU64 = AtomicU64::new(0);
static HOOK_COST_NS: AtomicU64 = AtomicU64::new(0);
static SAMPLED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static RECORDED: AtomicU64 = AtomicU64::new(0);

static CALL: LazyId = LazyId::new("call");

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Marks what the pending samples hold, and the samples jobs have taken ([`FLYING`]): their GC
/// root.
#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::Profiler::AllocationRoot", mark, free_immediately)]
struct PendingRoot;

impl DataTypeFunctions for PendingRoot {
    fn mark(&self, _marker: &gc::Marker) {
        // Never contended: the locks are never held across an allocation (module doc). A lock
        // poisoned by a panic still holds what must be marked: its data is marked all the same.
        let (Some(guard), Some(flying)) =
            (unpoisoned(STATE.try_lock()), unpoisoned(FLYING.try_lock()))
        else {
            return;
        };
        let pending = guard.iter().flat_map(|state| {
            state.pending.iter().flat_map(|pending| {
                let frames = &state.frames[pending.start..pending.start + pending.depth];
                frames.iter().chain([&pending.thread, &pending.klass, &pending.object])
            })
        });
        for &value in pending.chain(flying.iter().flat_map(|(_, held)| held)) {
            if value != 0 {
                // SAFETY: each is a heap object that was live when the hook read it, and has
                // been marked (so kept, pinned) at every GC since, pending or taken.
                unsafe { rb_sys::rb_gc_mark(value) };
            }
        }
    }
}

/// A `try_lock`'s guard, poisoned or not; None only if the lock is held.
fn unpoisoned<T>(locked: std::sync::TryLockResult<MutexGuard<'_, T>>) -> Option<MutexGuard<'_, T>> {
    match locked {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a static, valid for the process; an AtomicUsize has a VALUE's layout. Once,
        // with the GVL (at load).
        unsafe { rb_sys::rb_gc_register_address(HANDLER.as_ptr().cast()) };
        HOOK.register();
        crate::vm::postponed::prepare(job);
        crate::vm::postponed::prepare(window_job);
        // SAFETY: a plain function with no data, run with the GVL after every `at_exit` block
        // (Ruby 3.1 `eval_jump.c`, `rb_ec_exec_end_proc`).
        unsafe { rb_sys::rb_set_end_proc(Some(stop_at_exit), rb_sys::Qnil as rb_sys::VALUE) };
    });
    let class = module.define_class("Profiler", ruby.class_object())?;
    let root_class = class.define_class("AllocationRoot", ruby.class_object())?;
    root_class.undef_default_alloc_func();
    ruby.gc_register_mark_object(ruby.obj_wrap(PendingRoot));
    class.define_singleton_method("_native_allocations_start", function!(native_start, 5))?;
    class.define_singleton_method("_native_allocations_stop", function!(native_stop, 0))?;
    class.define_singleton_method("_native_own_allocations", function!(native_own, 1))?;
    class.define_singleton_method("_native_allocations_stats", function!(native_stats, 0))?;
    class.const_set("ALLOCATION_KEY", ALLOCATION_KEY)?;
    class.const_set("MAX_ALLOCATION_INTERVAL", MAX_INTERVAL)?;
    Ok(())
}

unsafe extern "C" fn stop_at_exit(_: rb_sys::VALUE) {
    let _ = catch_unwind(|| {
        stop();
        crate::memory::heap::stop();
    });
}

fn stop() {
    ENABLED.store(false, Ordering::Release);
    RUN.fetch_add(1, Ordering::AcqRel);
    crate::memory::duty_cycle::stop();
    HOOK.disable();
    if let Some(state) = state().as_mut() {
        state.pending.clear();
        state.taken = 0;
    }
    HANDLER.store(rb_sys::Qnil as usize, Ordering::Release);
}

/// `Profiler._native_allocations_start(interval, handler, heap, overhead, calibration)`:
/// samples one allocation in about every `interval` the hook sees and calls
/// `handler.call(thread, class_name, weight, key)` for each, from a postponed job on the
/// allocating thread; with `heap`, also tracks the sampled objects until the GC frees them
/// (see `heap`).
/// With `overhead` under 1 and `interval` over 1, the hook is on only part of the time, to
/// cost about `overhead` of the program's time (`duty_cycle`), and `calibration.call` (Ruby
/// code that allocates) first measures what the hook costs; else it is always on.
fn native_start(
    ruby: &Ruby,
    interval: Value,
    handler: Value,
    heap: bool,
    overhead: f64,
    calibration: Value,
) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        // An Integer, not anything `to_int` or a Float would turn into one.
        let interval = magnus::Integer::from_value(interval)
            .and_then(|i| i.to_u64().ok())
            .filter(|i| (1..=MAX_INTERVAL).contains(i))
            .ok_or_else(|| {
                crate::recorder::errors::arg_error(
                    ruby,
                    format!(
                        "allocation interval must be an Integer in 1..{MAX_INTERVAL}, got {}",
                        interval.inspect()
                    ),
                )
            })?;
        if !(overhead > 0.0 && overhead <= 1.0) {
            return Err(crate::recorder::errors::arg_error(
                ruby,
                format!("allocation overhead must be a Float in (0, 1], got {overhead}"),
            ));
        }
        stop();
        crate::memory::heap::stop();
        let duty = interval > 1 && overhead < 1.0;
        let hook_cost_ns = if duty { calibrate(ruby, calibration)? } else { 0.0 };
        // The counters are this run's.
        for counter in [&SAMPLED, &DROPPED, &RECORDED] {
            counter.store(0, Ordering::Relaxed);
        }
        let mut fresh = State {
            frames: vec![0; POOL],
            lines: vec![0; POOL],
            pending: Vec::with_capacity(MAX_PENDING),
            taken: 0,
            interval,
            step: 1,
            carried: 0,
            accounted: 0,
            rng: Jitter::new(),
            generation: crate::recorder::fork::fork_generation(),
            heap,
        };
        fresh.step = fresh.draw();
        COUNTDOWN.store(fresh.step, Ordering::Relaxed);
        *state() = Some(fresh);
        if heap {
            crate::memory::heap::start();
        }
        HANDLER.store(handler.as_raw() as usize, Ordering::Release);
        SEEN_EVERY.store(1, Ordering::Relaxed);
        HOOK_COST_NS.store(hook_cost_ns.to_bits(), Ordering::Relaxed);
        DUTY.store(duty, Ordering::Release);
        // On, seeing everything, until the duty cycle's thread says otherwise (a job queued
        // by an earlier run then finds nothing to change).
        crate::memory::duty_cycle::DESIRED.store(1, Ordering::Release);
        SEEN_AT_START
            .store(crate::memory::duty_cycle::SEEN.load(Ordering::Relaxed), Ordering::Relaxed);
        RUN.fetch_add(1, Ordering::AcqRel);
        ENABLED.store(true, Ordering::Release);
        HOOK.enable();
        if duty {
            let setup = crate::memory::duty_cycle::Setup {
                target: overhead,
                hook_cost_ns,
                job: window_job,
            };
            if let Err(e) = crate::memory::duty_cycle::start(
                setup,
                crate::memory::duty_cycle::program_cpu_ns(),
                total_allocated(),
            ) {
                stop();
                return Err(crate::recorder::errors::gem_error(
                    ruby,
                    format!("could not start the allocation duty cycle's thread: {e}"),
                ));
            }
        }
        Ok(())
    })
}

/// `Profiler._native_own_allocations(on)`: whether the allocations of this thread are the
/// profiler's own from now on (none is sampled: the sample waits for the next allocation
/// that is not); returns what it was, for nesting.
fn native_own(on: bool) -> bool {
    OWN_HERE.with(|here| here.replace(on))
}

fn native_stop(ruby: &Ruby) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        stop();
        Ok(())
    })
}

fn native_stats(ruby: &Ruby) -> Result<RHash, Error> {
    crate::recorder::errors::entry(ruby, || {
        let hash = ruby.hash_new();
        hash.aset(ruby.to_symbol("sampled"), SAMPLED.load(Ordering::Relaxed))?;
        hash.aset(ruby.to_symbol("recorded"), RECORDED.load(Ordering::Relaxed))?;
        hash.aset(ruby.to_symbol("dropped"), DROPPED.load(Ordering::Relaxed))?;
        let calibrated = f64::from_bits(HOOK_COST_NS.load(Ordering::Relaxed));
        let duty =
            DUTY.load(Ordering::Relaxed).then(|| crate::memory::duty_cycle::stats(calibrated));
        hash.aset(ruby.to_symbol("hook_cost_calibrated_ns"), calibrated)?;
        hash.aset(ruby.to_symbol("hook_cost_ns"), duty.as_ref().map_or(0.0, |d| d.hook_cost_ns))?;
        hash.aset(ruby.to_symbol("hook_on_share"), duty.as_ref().map_or(1.0, |d| d.on_share))?;
        hash.aset(ruby.to_symbol("seen_every"), duty.as_ref().map_or(1, |d| d.every))?;
        let seen = crate::memory::duty_cycle::SEEN.load(Ordering::Relaxed);
        hash.aset(
            ruby.to_symbol("seen"),
            seen.wrapping_sub(SEEN_AT_START.load(Ordering::Relaxed)),
        )?;
        hash.aset(ruby.to_symbol("weighed_allocations"), duty.as_ref().map(|d| d.weighed))?;
        crate::memory::heap::add_stats(ruby, hash)?;
        Ok(hash)
    })
}

/// The NEWOBJ hook. Never unwinds, never allocates a Ruby object (module doc).
unsafe extern "C" fn on_newobj(tracepoint: rb_sys::VALUE, _data: *mut c_void) {
    // The path of every allocation but the sampled ones: plain atomic loads and stores (the
    // GVL makes each load and store one step), no lock, no thread-local. What an allocation
    // still pays is Ruby's: with any NEWOBJ hook enabled, Ruby 3.1 takes `newobj_of`'s slow
    // path and builds a trace arg for every object (see the cost in docs/profiler.md).
    let seen = crate::memory::duty_cycle::SEEN.load(Ordering::Relaxed);
    crate::memory::duty_cycle::SEEN.store(seen.wrapping_add(1), Ordering::Relaxed);
    let countdown = COUNTDOWN.load(Ordering::Relaxed);
    if countdown > 1 {
        COUNTDOWN.store(countdown - 1, Ordering::Relaxed);
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| newobj(tracepoint)));
}

/// The allocation that is due for a sample.
fn newobj(tracepoint: rb_sys::VALUE) {
    // The jobs' own allocations are not the program's: the sample waits for the next one.
    // (Between samples, the fast path counts them: a few per sample, against `interval`.)
    if !ENABLED.load(Ordering::Relaxed)
        || JOB_HERE.with(Cell::get)
        || OWN_HERE.with(Cell::get)
        || crate::sampling::job::in_job_here()
    {
        return;
    }
    let Ok(mut guard) = STATE.try_lock() else { return };
    let Some(state) = guard.as_mut() else { return };
    if state.generation != crate::recorder::fork::fork_generation() {
        return; // a forked child that has not started sampling
    }
    // Each allocation seen stands for the `every` of the slot it was seen in (`duty_cycle`).
    let rest = state.step.saturating_sub(state.accounted);
    let weight =
        state.carried.saturating_add(rest.saturating_mul(SEEN_EVERY.load(Ordering::Relaxed)));
    state.carried = 0;
    state.accounted = 0;
    state.step = state.draw();
    COUNTDOWN.store(state.step, Ordering::Relaxed);
    SAMPLED.fetch_add(1, Ordering::Relaxed);
    let start = state.pending.last().map_or(0, |p| p.start + p.depth);
    if state.pending.len() == MAX_PENDING || start + DEPTH > POOL {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: in a NEWOBJ hook with the GVL; the trace arg is the current event's, and its
    // object is the new one (`rb_tracearg_object` only reads the trace arg, `vm_trace.c`).
    let object =
        unsafe { rb_sys::rb_tracearg_object(rb_sys::rb_tracearg_from_tracepoint(tracepoint)) };
    // SAFETY: a new heap object: its flags and class words are written (see the module doc).
    let (flags, klass) = unsafe {
        let basic = object as *const rb_sys::RBasic;
        ((*basic).flags as usize, (*basic).klass)
    };
    // Internal objects (imemo, node, iclass...) keep other data in the class word.
    let klass = if flags & T_MASK <= T_SYMBOL { klass } else { 0 };
    // SAFETY: GVL held; does not allocate (reads as `rb_profile_frames` does).
    let depth = unsafe {
        crate::sampling::stack_capture::read_current(
            &mut state.frames[start..start + DEPTH],
            &mut state.lines[start..start + DEPTH],
        )
    };
    // SAFETY: GVL held; returns the current thread's object, no allocation.
    let thread = unsafe { rb_sys::rb_thread_current() };
    let object = if state.heap { object } else { 0 };
    state.pending.push(Pending { thread, klass, object, weight, start, depth });
    drop(guard);
    // Registering only sets an interrupt flag.
    crate::vm::postponed::trigger(job);
}

/// The postponed job. Never unwinds.
unsafe extern "C" fn job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(run_job));
}

/// What the job copies out of a pending sample (the sample itself stays marked until all
/// are done).
struct Taken {
    /// Its entry in [`FLYING`].
    id: u64,
    run: u64,
    thread: rb_sys::VALUE,
    klass: rb_sys::VALUE,
    object: rb_sys::VALUE,
    weight: u64,
    frames: Vec<rb_sys::VALUE>,
    lines: Vec<i32>,
}

fn run_job() {
    if JOB_HERE.with(|here| here.replace(true)) {
        return;
    }
    // What the samples cost is the hook's too: the duty cycle lengthens the on-slots by it.
    // This thread's CPU, not the clock: time it is switched out is no cost of ours.
    let started = crate::sampling::thread_cpu::own_cpu_ns();
    // The handler is Ruby code: the program's Thread#raise, Thread#kill and Timeout wait
    // until the job is over, so that they reach the program, not the handler.
    // SAFETY: in a postponed job with the GVL; dropped at the end of this function.
    let deferred = unsafe { crate::sampling::interrupt_mask::defer_async_interrupts() };
    if let Ok(ruby) = Ruby::get() {
        // This thread's key for the stacks it names (another thread's job may run while
        // this one is switched out in its handler).
        let tid = crate::sampling::job::own_tid();
        let key = ALLOCATION_KEY + i64::from(tid.max(0));
        // A CPU tick in here is no sample: its stack would be the handler's, in the gem
        // (seen at interval 1: AllocationRecorder#call frames with the program's CPU). Its
        // CPU stays to be charged at the thread's next sample, as the hook's own cost is.
        // Not when the sampling job runs here (its handler's end clears the mark).
        let mark = !crate::sampling::job::in_job_here();
        if mark {
            crate::sampling::signal_sampler::set_in_job(tid, true);
        }
        while let Some(taken) = take() {
            record(&ruby, &taken, key);
            done(taken.id);
        }
        if mark {
            crate::sampling::signal_sampler::set_in_job(tid, false);
        }
        crate::sampling::stack_capture::forget(key);
    }
    let spent = crate::sampling::thread_cpu::own_cpu_ns().saturating_sub(started).max(0) as u64;
    crate::memory::duty_cycle::JOB_NS.fetch_add(spent, Ordering::Relaxed);
    JOB_HERE.with(|here| here.set(false));
    drop(deferred);
}

/// The duty cycle's job: turns the hook on or off as its thread wants, and takes the `every`
/// of the block that put it on (`duty_cycle::DESIRED`). Never unwinds.
unsafe extern "C" fn window_job(_data: *mut c_void) {
    let _ = catch_unwind(|| {
        // A job queued by a run that has stopped may run in the next one: it must not turn
        // off the hook of a run without a duty cycle.
        let live = ENABLED.load(Ordering::Acquire)
            && DUTY.load(Ordering::Acquire)
            && state()
                .as_ref()
                .is_some_and(|s| s.generation == crate::recorder::fork::fork_generation());
        if !live {
            return;
        }
        let at_ns = crate::memory::duty_cycle::program_cpu_ns();
        let seen_every = SEEN_EVERY.load(Ordering::Relaxed);
        crate::memory::duty_cycle::switched(HOOK.is_on(), seen_every, at_ns, total_allocated());
        match crate::memory::duty_cycle::DESIRED.load(Ordering::Acquire) {
            0 => HOOK.disable(),
            every => {
                let before = SEEN_EVERY.swap(every, Ordering::Relaxed);
                if before != every {
                    // What the current step saw so far was seen under `before`.
                    if let Some(state) = state().as_mut() {
                        let seen = state.step.saturating_sub(COUNTDOWN.load(Ordering::Relaxed));
                        let new = seen.saturating_sub(state.accounted);
                        state.carried = state.carried.saturating_add(new.saturating_mul(before));
                        state.accounted = seen;
                    }
                }
                HOOK.enable();
            }
        }
    });
}

/// Ruby's count of the objects allocated so far (`GC.stat(:total_allocated_objects)`), GVL
/// held.
fn total_allocated() -> u64 {
    static KEY: LazyId = LazyId::new("total_allocated_objects");
    let Ok(ruby) = Ruby::get() else { return 0 };
    let key =
        magnus::symbol::IntoSymbol::into_symbol_with(LazyId::get_inner_with(&KEY, &ruby), &ruby);
    // SAFETY: GVL held; with a Symbol key `rb_gc_stat` only reads the counter (Ruby 3.1
    // `gc.c`, `gc_stat_internal`): no allocation, no raise for a key it knows.
    unsafe { rb_sys::rb_gc_stat(key.as_raw()) as u64 }
}

/// The least the calibration may find: the hook does cost something (a slow path and a call).
const MIN_HOOK_COST_NS: f64 = 10.0;
/// What the hook costs an allocation of a loop of Strings on the development machine
/// (bench/RESULTS.md): the start under `GC.stress`, where nothing is calibrated.
const TYPICAL_HOOK_COST_NS: f64 = 39.0;

/// What the enabled hook costs an allocation, in nanoseconds: a run of
/// `calibration` (Ruby code that allocates) with the hook on (it counts the objects and
/// samples none), against a run with it off just before, per object the hook saw: the median
/// of five such pairs, after one run to warm up, and at least [`MIN_HOOK_COST_NS`]. Ruby
/// code, not a loop in C: the hook costs more in the interpreter's company (measured: 37 ns
/// an object for Strings made in a Ruby loop, 30 ns for `rb_ary_new` in a C loop), and an
/// on-slot lengthened too little would see allocation-heavy code too rarely (the duty cycle
/// then measures it on the program itself, see `duty_cycle::Ledger`). About 15 ms, with the
/// GVL, at start.
fn calibrate(ruby: &Ruby, calibration: Value) -> Result<f64, Error> {
    // Under `GC.stress` every object is a full GC: the passes would take minutes. The duty
    // cycle then starts from what the hook usually costs here, and measures the program's.
    let gc = ruby.class_object().const_get::<_, RModule>("GC")?;
    if gc.funcall::<_, _, Value>("stress", ())?.to_bool() {
        return Ok(TYPICAL_HOOK_COST_NS);
    }
    let pass = |hooked: bool| -> Result<(i64, u64), Error> {
        if hooked {
            HOOK.enable();
        }
        let seen = crate::memory::duty_cycle::SEEN.load(Ordering::Relaxed);
        let started = crate::sampling::thread_cpu::own_cpu_ns();
        let called = calibration.funcall::<_, _, Value>("call", ());
        let spent = crate::sampling::thread_cpu::own_cpu_ns() - started;
        HOOK.disable();
        called?;
        Ok((spent, crate::memory::duty_cycle::SEEN.load(Ordering::Relaxed).wrapping_sub(seen)))
    };
    // No sample is due during the passes (`native_start` sets the countdown after).
    COUNTDOWN.store(u64::MAX, Ordering::Relaxed);
    // Nor a signal sample: its job's CPU would be taken for the hook's (held until the end).
    let _blocked = crate::sampling::signal_sampler::BlockedHere::new();
    // A first pass warms what a fresh process has not run yet (measured: 100 ns an object
    // otherwise, against about 40).
    pass(false)?;
    // The median of five paired differences: a pass that had to sweep, or was preempted,
    // moves one difference only (after a `GC.start`, the fastest off-pass was measured slower
    // than the fastest on-pass).
    let mut differences = Vec::with_capacity(5);
    let mut objects = 0;
    for _ in 0..5 {
        let (off, _) = pass(false)?;
        let (on, seen) = pass(true)?;
        differences.push(on - off);
        objects = objects.max(seen);
    }
    differences.sort_unstable();
    let measured = differences[2] as f64 / objects.max(1) as f64;
    Ok(measured.max(MIN_HOOK_COST_NS))
}

/// The next pending sample not taken yet, or None: none left (the buffer then starts over),
/// or sampling is off or was started in another process (then what is pending is dropped).
/// What the sample holds stays marked, through [`FLYING`], until [`done`].
fn take() -> Option<Taken> {
    let mut guard = state();
    let state = guard.as_mut()?;
    let live = ENABLED.load(Ordering::Acquire)
        && state.generation == crate::recorder::fork::fork_generation();
    let index = state.taken;
    let Some(pending) = state.pending.get(index).filter(|_| live) else {
        // Every sample in the buffer is taken (or none may be): it starts over at once,
        // whatever the jobs that took them are doing. A job switched out in its handler
        // used to keep it from starting over until it was back, and at interval 1 a
        // buffer filled in that time (MAX_PENDING, or POOL frames) dropped the rest: 73,688
        // of 110,026 samples in a loaded run of allocations_spec's interval-1 example.
        state.pending.clear();
        state.taken = 0;
        return None;
    };
    state.taken += 1;
    let range = pending.start..pending.start + pending.depth;
    let frames = state.frames[range.clone()].to_vec();
    let marks =
        frames.iter().copied().chain([pending.thread, pending.klass, pending.object]).collect();
    Some(Taken {
        id: hold(marks),
        run: RUN.load(Ordering::Acquire),
        thread: pending.thread,
        klass: pending.klass,
        object: pending.object,
        weight: pending.weight,
        frames,
        lines: state.lines[range].to_vec(),
    })
}

/// A taken sample is recorded (or given up): what it holds is no longer marked for it.
fn done(id: u64) {
    flying().retain(|(held, _)| *held != id);
}

/// Samples taken by a job and not recorded yet, by id, each with the objects it holds (frames,
/// thread, class, object; 0 for none): marked by [`PendingRoot`], so that a job switched out in
/// its handler (while another thread stops or restarts sampling, or fills the buffer again)
/// still holds live objects when it names them. One entry per job at work: a few.
static FLYING: Mutex<Vec<(u64, Vec<rb_sys::VALUE>)>> = Mutex::new(Vec::new());
static NEXT_FLYING: AtomicU64 = AtomicU64::new(0);

/// Only used with the GVL held (a Mutex only to be `Sync`); never held across an allocation.
fn flying() -> MutexGuard<'static, Vec<(u64, Vec<rb_sys::VALUE>)>> {
    FLYING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Marks `marks` as held by a job until [`done`]; returns the id to give back.
fn hold(marks: Vec<rb_sys::VALUE>) -> u64 {
    let id = NEXT_FLYING.fetch_add(1, Ordering::Relaxed);
    flying().push((id, marks));
    id
}

/// Names the stack (under `key`) and the class, and hands the sample to the handler (and the
/// heap tracker).
fn record(ruby: &Ruby, taken: &Taken, key: i64) {
    // SAFETY: GVL held; the frames are still marked (held in FLYING until `done`).
    let depth = unsafe {
        crate::sampling::stack_capture::store_read_frames(key, &taken.frames, &taken.lines)
    };
    if depth == 0 {
        return;
    }
    let class_name = class_name(ruby, taken.klass);
    let raw = HANDLER.load(Ordering::Acquire);
    // SAFETY: HANDLER holds Qnil or a live object kept by its GC root; GVL held. The thread
    // is marked until `done`.
    let (handler, thread) =
        unsafe { (Value::from_raw(raw as rb_sys::VALUE), Value::from_raw(taken.thread)) };
    if handler.is_nil() {
        return;
    }
    // Called through `rb_protect` by magnus: an exception comes back as an `Err`.
    let recorded = handler
        .funcall::<_, _, bool>(
            LazyId::get_inner_with(&CALL, ruby),
            (thread, class_name, taken.weight, key),
        )
        .unwrap_or(false);
    if recorded {
        RECORDED.fetch_add(1, Ordering::Relaxed);
        // Only if this run is still the one whose buffer marks the object (the handler may
        // have been switched out while another thread stopped or restarted sampling).
        if taken.object != 0 && RUN.load(Ordering::Acquire) == taken.run {
            crate::memory::heap::track(taken.object, key, class_name, taken.weight);
        }
    }
}

/// The name of the allocated object's class: `(hidden)` for an object without one.
fn class_name(ruby: &Ruby, klass: rb_sys::VALUE) -> RString {
    if klass != 0 {
        // SAFETY: GVL held; `klass` is a class, marked until its sample is `done`.
        // `rb_class_real` skips singleton classes and include classes.
        let real = unsafe { rb_sys::rb_class_real(klass) };
        if real != 0 && real != rb_sys::Qnil as rb_sys::VALUE {
            // SAFETY: as above; `rb_class_name` returns a String (for an anonymous class,
            // its inspect form) and does not raise.
            let name = unsafe { Value::from_raw(rb_sys::rb_class_name(real)) };
            if let Some(name) = RString::from_value(name) {
                return name;
            }
        }
    }
    ruby.str_new("(hidden)")
}
