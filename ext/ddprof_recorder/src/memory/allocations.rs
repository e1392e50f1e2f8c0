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
//! read, and the sample's thread, class and (for the heap profile) object, are kept alive and
//! pinned against `GC.compact` until the job has named them: see `pending`, which queues the
//! samples for the job.
//!
//! # Postponed-job data (Ruby bug #19991)
//!
//! The job is registered with the trigger's decoy data pointer (see `trigger`'s module doc):
//! a racing register may hand our data to the GC's finalizer job.
//!
//! # Reentrancy, fork and exit
//!
//! The job's own allocations, and those of the sampling job, are not sampled: each job marks
//! the thread it runs on ([`JOB_HERE`], `ruby_handler::in_job_here`), so that a job switched
//! out in its Ruby handler does not hide the other threads' allocations. Nor are those of
//! Profiler#start and #stop, on the thread that calls them ([`OWN_HERE`]). Any thread's job
//! records the pending samples of every thread (`pending`). A forked child inherits the
//! enabled tracepoint, but the hook and the job do nothing in a process other than the one
//! that started sampling (the fork generation of `stack_recorder`, [`live`]), until sampling
//! is started again there. An end proc (registered at load, run after every `at_exit` block)
//! disables the tracepoint before the VM is torn down.
//!
//! # The duty cycle
//!
//! `duty_cycle` turns the hook on and off through [`see`] (which sets what a sample weighs),
//! `hook_cost` calibrates it through [`count_only`]; both read [`SEEN`] and [`JOB_NS`].
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use magnus::{
    prelude::*, rb_sys::AsRawValue, rb_sys::FromRawValue, value::LazyId, Error, RHash, RString,
    Ruby, Value,
};

use crate::memory::{duty_cycle, pending, pending::Sample};
use crate::sampling::random::Jitter;
use crate::vm::gvl_cell::GvlCell;
use crate::vm::internal_hook::InternalHook;

/// The keys under which a sampled allocation's stack is kept in `stack_capture` while it is
/// recorded are this plus the recording thread's id: the sampler's keys, native thread ids
/// and their negations, are never that small.
pub const ALLOCATION_KEY: i64 = i64::MIN;
/// Largest `interval`.
pub const MAX_INTERVAL: u64 = 1 << 40;

// Ruby 3.1 `ruby/internal/value_type.h`.
const T_MASK: usize = 0x1f;
const T_SYMBOL: usize = 0x14;

/// The countdown to the next sample, and what that sample weighs.
struct Sampler {
    interval: u64,
    /// The current step: the allocations to see until the next sample.
    step: u64,
    /// What the step's allocations seen under an earlier `every` weigh (each its `every`), and
    /// how many they are: the sample at the step's end weighs that plus the rest times the
    /// `every` then.
    carried: u64,
    accounted: u64,
    rng: Jitter,
    heap: bool,
}

impl Sampler {
    fn draw(&mut self) -> u64 {
        let span = 2 * self.interval - 1;
        (1 + (self.rng.unit() * span as f64) as u64).min(span)
    }
}

static SAMPLER: GvlCell<Option<Sampler>> = GvlCell::new("the allocation sampler", None);
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The fork generation of the process that started sampling (see [`live`]).
static GENERATION: AtomicU64 = AtomicU64::new(0);
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
/// Allocations the hook saw (with the GVL), and that count at the latest start.
pub static SEEN: AtomicU64 = AtomicU64::new(0);
static SEEN_AT_START: AtomicU64 = AtomicU64::new(0);
/// CPU nanoseconds spent in the job (the samples' cost, paid only while the hook is on).
pub static JOB_NS: AtomicU64 = AtomicU64::new(0);
static SAMPLED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static RECORDED: AtomicU64 = AtomicU64::new(0);

static CALL: LazyId = LazyId::new("call");

pub fn init(ruby: &Ruby) -> Result<(), Error> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a static, valid for the process; an AtomicUsize has a VALUE's layout. Once,
        // with the GVL (at load).
        unsafe { rb_sys::rb_gc_register_address(HANDLER.as_ptr().cast()) };
        HOOK.register();
        crate::vm::postponed::prepare(job);
        duty_cycle::init();
        // SAFETY: a plain function with no data, run with the GVL after every `at_exit` block
        // (Ruby 3.1 `eval_jump.c`, `rb_ec_exec_end_proc`).
        unsafe { rb_sys::rb_set_end_proc(Some(stop_at_exit), rb_sys::Qnil as rb_sys::VALUE) };
    });
    pending::init(ruby)?;
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
    duty_cycle::stop();
    HOOK.disable();
    pending::clear();
    HANDLER.store(rb_sys::Qnil as usize, Ordering::Release);
}

/// Whether sampling is on, in the process that started it (not in a forked child, until it
/// starts sampling itself: it inherits the enabled hook).
pub fn live() -> bool {
    ENABLED.load(Ordering::Acquire)
        && GENERATION.load(Ordering::Acquire) == crate::recorder::fork::fork_generation()
}

/// `Profiler._native_allocations_start(interval, handler, heap, overhead, calibration)`:
/// samples one allocation in about every `interval` the hook sees and calls
/// `handler.call(thread, class_name, weight, key)` for each, from a postponed job on the
/// allocating thread; with `heap`, also tracks the sampled objects until the GC frees them
/// (see `heap`). With `overhead` under 1 and `interval` over 1, the hook is on only part of
/// the time, to cost about `overhead` of the program's time (`duty_cycle`), and
/// `calibration.call` (Ruby code that allocates) first measures what the hook costs
/// (`hook_cost`); else it is always on.
pub(crate) fn native_start(
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
        let duty = if interval > 1 && overhead < 1.0 {
            let hook_cost_ns = crate::memory::hook_cost::calibrate(ruby, calibration)?;
            Some(duty_cycle::Setup { target: overhead, hook_cost_ns })
        } else {
            None
        };
        // The counters are this run's.
        for counter in [&SAMPLED, &DROPPED, &RECORDED] {
            counter.store(0, Ordering::Relaxed);
        }
        let mut sampler =
            Sampler { interval, step: 1, carried: 0, accounted: 0, rng: Jitter::new(), heap };
        sampler.step = sampler.draw();
        COUNTDOWN.store(sampler.step, Ordering::Relaxed);
        SAMPLER.with(|current| *current = Some(sampler));
        pending::start();
        GENERATION.store(crate::recorder::fork::fork_generation(), Ordering::Release);
        if heap {
            crate::memory::heap::start();
        }
        HANDLER.store(handler.as_raw() as usize, Ordering::Release);
        SEEN_EVERY.store(1, Ordering::Relaxed);
        SEEN_AT_START.store(SEEN.load(Ordering::Relaxed), Ordering::Relaxed);
        RUN.fetch_add(1, Ordering::AcqRel);
        ENABLED.store(true, Ordering::Release);
        HOOK.enable();
        if let Err(e) = duty_cycle::start(duty) {
            stop();
            return Err(crate::recorder::errors::gem_error(
                ruby,
                format!("could not start the allocation duty cycle's thread: {e}"),
            ));
        }
        Ok(())
    })
}

/// `Profiler._native_own_allocations(on)`: whether the allocations of this thread are the
/// profiler's own from now on (none is sampled: the sample waits for the next allocation
/// that is not); returns what it was, for nesting.
pub(crate) fn native_own(on: bool) -> bool {
    OWN_HERE.with(|here| here.replace(on))
}

pub(crate) fn native_stop(ruby: &Ruby) -> Result<(), Error> {
    crate::recorder::errors::entry(ruby, || {
        stop();
        Ok(())
    })
}

pub(crate) fn native_stats(ruby: &Ruby) -> Result<RHash, Error> {
    crate::recorder::errors::entry(ruby, || {
        let hash = ruby.hash_new();
        hash.aset(ruby.to_symbol("sampled"), SAMPLED.load(Ordering::Relaxed))?;
        hash.aset(ruby.to_symbol("recorded"), RECORDED.load(Ordering::Relaxed))?;
        hash.aset(ruby.to_symbol("dropped"), DROPPED.load(Ordering::Relaxed))?;
        let seen = SEEN.load(Ordering::Relaxed).wrapping_sub(SEEN_AT_START.load(Ordering::Relaxed));
        hash.aset(ruby.to_symbol("seen"), seen)?;
        duty_cycle::add_stats(ruby, hash)?;
        crate::memory::heap::add_stats(ruby, hash)?;
        Ok(hash)
    })
}

/// The hook as the duty cycle left it: whether it is on, and the `every` it sees under.
pub fn seen() -> (bool, u64) {
    (HOOK.is_on(), SEEN_EVERY.load(Ordering::Relaxed))
}

/// Turns the hook off (`every` 0), or on, each allocation it sees then standing for `every`:
/// the duty cycle's job, with the GVL.
pub fn see(every: u64) {
    if every == 0 {
        HOOK.disable();
        return;
    }
    let before = SEEN_EVERY.swap(every, Ordering::Relaxed);
    if before != every {
        // What the current step saw so far was seen under `before`.
        SAMPLER.with(|sampler| {
            if let Some(sampler) = sampler {
                let seen = sampler.step.saturating_sub(COUNTDOWN.load(Ordering::Relaxed));
                let new = seen.saturating_sub(sampler.accounted);
                sampler.carried = sampler.carried.saturating_add(new.saturating_mul(before));
                sampler.accounted = seen;
            }
        });
    }
    HOOK.enable();
}

/// Turns the hook on or off for `hook_cost::calibrate`, which counts the allocations it sees
/// ([`SEEN`]): none is sampled (sampling is off, and the countdown is past any pass).
pub fn count_only(on: bool) {
    if on {
        COUNTDOWN.store(u64::MAX, Ordering::Relaxed);
        HOOK.enable();
    } else {
        HOOK.disable();
    }
}

/// The NEWOBJ hook. Never unwinds, never allocates a Ruby object (module doc).
unsafe extern "C" fn on_newobj(tracepoint: rb_sys::VALUE, _data: *mut c_void) {
    // The path of every allocation but the sampled ones: plain atomic loads and stores (the
    // GVL makes each load and store one step), no lock, no thread-local. What an allocation
    // still pays is Ruby's: with any NEWOBJ hook enabled, Ruby 3.1 takes `newobj_of`'s slow
    // path and builds a trace arg for every object (see the cost in docs/profiler.md).
    let seen = SEEN.load(Ordering::Relaxed);
    SEEN.store(seen.wrapping_add(1), Ordering::Relaxed);
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
    // A forked child that has not started sampling takes none.
    if !live()
        || JOB_HERE.with(Cell::get)
        || OWN_HERE.with(Cell::get)
        || crate::sampling::ruby_handler::in_job_here()
    {
        return;
    }
    let drawn = SAMPLER.with(|sampler| {
        let sampler = sampler.as_mut()?;
        // Each allocation seen stands for the `every` of the slot it was seen in
        // (`duty_cycle`).
        let rest = sampler.step.saturating_sub(sampler.accounted);
        let weight =
            sampler.carried.saturating_add(rest.saturating_mul(SEEN_EVERY.load(Ordering::Relaxed)));
        sampler.carried = 0;
        sampler.accounted = 0;
        sampler.step = sampler.draw();
        COUNTDOWN.store(sampler.step, Ordering::Relaxed);
        Some((weight, sampler.heap))
    });
    let Some((weight, heap)) = drawn else { return };
    SAMPLED.fetch_add(1, Ordering::Relaxed);
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
    // SAFETY: GVL held; returns the current thread's object, no allocation.
    let thread = unsafe { rb_sys::rb_thread_current() };
    let sample = Sample { thread, klass, object: if heap { object } else { 0 }, weight };
    let read = |frames: &mut [rb_sys::VALUE], lines: &mut [i32]| {
        // SAFETY: GVL held; does not allocate (reads as `rb_profile_frames` does).
        unsafe { crate::sampling::stack_capture::read_current(frames, lines) }
    };
    if !pending::push(sample, read) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // Registering only sets an interrupt flag.
    crate::vm::postponed::trigger(job);
}

/// The postponed job. Never unwinds.
unsafe extern "C" fn job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(run_job));
}

fn run_job() {
    if JOB_HERE.with(|here| here.replace(true)) {
        return;
    }
    // What the samples cost is the hook's too: the duty cycle lengthens the on-slots by it.
    // This thread's CPU, not the clock: time it is switched out is no cost of ours.
    let started = crate::sampling::clocks::thread_cpu::own_cpu_ns();
    // The handler is Ruby code: the program's Thread#raise, Thread#kill and Timeout wait
    // until the job is over, so that they reach the program, not the handler.
    // SAFETY: in a postponed job with the GVL; dropped at the end of this function.
    let deferred = unsafe { crate::sampling::interrupt_mask::defer_async_interrupts() };
    if let Ok(ruby) = Ruby::get() {
        // This thread's key for the stacks it names (another thread's job may run while
        // this one is switched out in its handler).
        let tid = crate::sampling::clocks::thread_cpu::own_tid();
        let key = ALLOCATION_KEY + i64::from(tid.max(0));
        // A CPU tick in here is no sample: its stack would be the handler's, in the gem
        // (seen at interval 1: AllocationRecorder#call frames with the program's CPU). Its
        // CPU stays to be charged at the thread's next sample, as the hook's own cost is.
        // Not when the sampling job runs here (its handler's end clears the mark).
        let mark = !crate::sampling::ruby_handler::in_job_here();
        if mark {
            crate::sampling::signal_sampler::set_in_job(tid, true);
        }
        while let Some(taken) = pending::take(live()) {
            // The run that took it (nothing runs between the take and this read).
            let run = RUN.load(Ordering::Acquire);
            record(&ruby, &taken, run, key);
            pending::done(taken);
        }
        if mark {
            crate::sampling::signal_sampler::set_in_job(tid, false);
        }
        crate::sampling::stack_capture::forget(key);
    }
    let spent =
        crate::sampling::clocks::thread_cpu::own_cpu_ns().saturating_sub(started).max(0) as u64;
    JOB_NS.fetch_add(spent, Ordering::Relaxed);
    JOB_HERE.with(|here| here.set(false));
    drop(deferred);
}

/// Names the stack (under `key`) and the class, and hands the sample, taken in `run`, to the
/// handler (and the heap tracker).
fn record(ruby: &Ruby, taken: &pending::Taken, run: u64, key: i64) {
    // SAFETY: GVL held; the frames are still marked (held by `pending` until `done`).
    let depth = unsafe {
        crate::sampling::stack_capture::store_read_frames(key, &taken.frames, &taken.lines)
    };
    if depth == 0 {
        return;
    }
    let sample = &taken.sample;
    let class_name = class_name(ruby, sample.klass);
    let raw = HANDLER.load(Ordering::Acquire);
    // SAFETY: HANDLER holds Qnil or a live object kept by its GC root; GVL held. The thread
    // is marked until `done`.
    let (handler, thread) =
        unsafe { (Value::from_raw(raw as rb_sys::VALUE), Value::from_raw(sample.thread)) };
    if handler.is_nil() {
        return;
    }
    // Called through `rb_protect` by magnus: an exception comes back as an `Err`.
    let recorded = handler
        .funcall::<_, _, bool>(
            LazyId::get_inner_with(&CALL, ruby),
            (thread, class_name, sample.weight, key),
        )
        .unwrap_or(false);
    if recorded {
        RECORDED.fetch_add(1, Ordering::Relaxed);
        // Only if this run is still the one whose buffer marks the object (the handler may
        // have been switched out while another thread stopped or restarted sampling).
        if sample.object != 0 && RUN.load(Ordering::Acquire) == run {
            crate::memory::heap::track(sample.object, key, class_name, sample.weight);
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
