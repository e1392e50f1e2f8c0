//! The signal sampler's side of the job (`signal_sampler`, "The job" and "Batches"): the
//! postponed job the signal handler asks for, which hands the samples waiting in the slots to
//! the profiler's handler as the trigger's job does its ticks (`job`), and the Ruby methods
//! that arm and disarm threads, take those samples and forget a thread's stacks.
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Once;

use magnus::{prelude::*, rb_sys::AsRawValue, value::LazyId, Error, RModule, Ruby};

use crate::recorder::errors::entry;
use crate::sampling::clocks::thread_cpu::{own_cpu_ns, own_tid};
use crate::sampling::ruby_handler::{call_handler, ENABLED, JOBS, JOB_HERE};
use crate::sampling::signal_sampler;
use crate::sampling::trigger;

static SIGNAL_SAMPLES: LazyId = LazyId::new("signal_samples");

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| crate::vm::postponed::prepare(signal_job));
    let class = module.define_class("Profiler", ruby.class_object())?;
    let root_class = class.define_class("SignalSlotsRoot", ruby.class_object())?;
    root_class.undef_default_alloc_func();
    // One object for the process's life: marks the frames waiting in the signal slots.
    ruby.gc_register_mark_object(ruby.obj_wrap(signal_sampler::SlotsRoot));
    Ok(())
}

/// `Profiler._native_prepare_exec`: before an `exec` on this thread, no signal of ours left
/// to reach the new image (`signal_sampler`, "Exec"). Returns how many pending ones it took.
pub(crate) fn native_prepare_exec(ruby: &Ruby) -> Result<u64, Error> {
    entry(ruby, || Ok(signal_sampler::prepare_exec()))
}

/// `Profiler._native_resume_after_exec`: the `exec` failed; the threads are armed again.
pub(crate) fn native_resume_after_exec(ruby: &Ruby) -> Result<(), Error> {
    entry(ruby, || {
        signal_sampler::resume_after_exec();
        Ok(())
    })
}

/// `Profiler._native_keep_signal(taken)`: the program is about to trap signal `taken` (0:
/// only check that our handler is still installed); moves our ticks to another signal if it
/// is ours (`signal_sampler`, "Our signal"). Returns `[what became of our signal in this run
/// (nil: nothing), whether signals still sample]`.
pub(crate) fn native_keep_signal(ruby: &Ruby, taken: i32) -> Result<(Option<String>, bool), Error> {
    entry(ruby, || {
        signal_sampler::keep_signal(taken);
        Ok((signal_sampler::signal_taken(), signal_sampler::sampling()))
    })
}

/// `Profiler::Testing.refuse_perf_events(refuse)` (tests only): the next starts find perf
/// events refused, as a kernel with `perf_event_paranoid` 3 refuses them.
pub(crate) fn native_refuse_perf_events(ruby: &Ruby, refuse: bool) -> Result<(), Error> {
    entry(ruby, || {
        signal_sampler::PERF_REFUSED_FOR_TESTS.store(refuse, Ordering::Relaxed);
        Ok(())
    })
}

/// `Profiler._native_signal_arm(tid)`: arms thread `tid` (a perf event on its CPU clock, or a
/// CPU-time timer that ticks with the kernel's scheduler while the thread runs). Returns true
/// if it is armed, false if not (no slot, or the kernel refused), nil if the thread blocks our
/// signal; each counted in stats.
pub(crate) fn native_signal_arm(ruby: &Ruby, tid: i32) -> Result<Option<bool>, Error> {
    entry(ruby, || Ok(signal_sampler::arm(tid)))
}

/// `Profiler._native_signal_disarm(tid)`: disarms thread `tid` (a no-op if it is not armed).
pub(crate) fn native_signal_disarm(ruby: &Ruby, tid: i32) -> Result<(), Error> {
    entry(ruby, || {
        signal_sampler::disarm(tid);
        Ok(())
    })
}

/// `Profiler._native_signal_masked`: the native ids of the armed threads found blocking our
/// signal since the last call (`signal_sampler`, "Threads that block our signal"), for the
/// profiler to disarm; nil if none.
pub(crate) fn native_signal_masked(ruby: &Ruby) -> Result<Option<Vec<i32>>, Error> {
    entry(ruby, || Ok(signal_sampler::take_masked()))
}

/// `Profiler._native_signal_read_at_jobs`: the handler reads no more stacks in this run
/// (`signal_sampler::read_at_jobs`; `GC.auto_compact` turned on before Ruby 3.2).
pub(crate) fn native_signal_read_at_jobs(ruby: &Ruby) -> Result<(), Error> {
    entry(ruby, || {
        signal_sampler::read_at_jobs();
        Ok(())
    })
}

/// `Profiler::Testing.holds_gvl?(thread)` (tests only): whether `thread`'s Ractor names it as
/// the GVL's owner (`vm::thread_holds_gvl`), nil where that is not known.
pub(crate) fn native_thread_holds_gvl(
    ruby: &Ruby,
    thread: magnus::Value,
) -> Result<Option<bool>, Error> {
    entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(Error::new(ruby.exception_type_error(), "not a Thread"));
        }
        // SAFETY: a live Thread (checked above, and held by the caller's frame); GVL held.
        Ok(unsafe { crate::vm::thread_holds_gvl(thread.as_raw()) })
    })
}

/// `Profiler._native_handler_can_read_stacks?`: whether the signal handler can check, on this
/// Ruby, that a thread's stack is walkable (`vm::current_stack_walkable`) and that the thread
/// really holds the GVL (`vm::current_thread_holds_gvl`); if not, stacks are read at the job
/// (`:safepoint`).
pub(crate) fn native_handler_can_read_stacks(ruby: &Ruby) -> Result<bool, Error> {
    entry(ruby, || Ok(crate::vm::THREAD_EC_OFFSET.is_some() && crate::vm::gvl_owner_checked()))
}

/// `Profiler._native_forget_thread_stacks(tid)`: forgets every stack kept for native thread
/// `tid`: its jobs' (`tid`, `-tid`) and its signal samples' (`signal_sampler::key`).
pub(crate) fn native_forget_thread_stacks(ruby: &Ruby, tid: i32) -> Result<(), Error> {
    entry(ruby, || {
        crate::sampling::stack_capture::forget(i64::from(tid));
        crate::sampling::stack_capture::forget(-i64::from(tid));
        for n in 0..signal_sampler::KEYS_PER_THREAD {
            crate::sampling::stack_capture::forget(signal_sampler::key(tid, n));
        }
        Ok(())
    })
}

/// The job the signal handler registers (see `signal_sampler`). Never unwinds.
pub(super) unsafe extern "C" fn signal_job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(run_signal_job));
}

/// Not `IN_JOB`-exclusive as the trigger's job is (`job`): a job switched out in its handler
/// (a time slice) must not keep the other threads' samples waiting in their slots, where their
/// next ticks would find no room. The handler takes the thread accounts' lock, or keeps the
/// samples for later (each is kept under a key of its own, `signal_sampler::key`).
fn run_signal_job() {
    if ENABLED.load(Ordering::Acquire) {
        // Naming frames allocates (a method name's String on first use): not the program's.
        let was_here = JOB_HERE.with(|here| here.replace(true));
        hand_over_signal_samples(own_cpu_ns());
        JOB_HERE.with(|here| here.set(was_here));
    }
}

/// The samples waiting in the signal slots, taken, flat: `[tid, cpu_ns, at_ns, depth, key]`
/// each (see `ThreadSampler#signal_samples`). With the GVL.
fn take_signal_samples(own: i32) -> Vec<i64> {
    let mut flat: Vec<i64> = Vec::new();
    signal_sampler::drain(own, |s| {
        flat.extend([i64::from(s.tid), s.cpu_ns, s.at_ns, s.depth as i64, s.key])
    });
    flat
}

/// `Profiler._native_take_signal_samples`: the samples waiting in the signal slots (the
/// batches a pass or a window's end records first, see `signal_sampler`, "Batches"), flat as
/// `ThreadSampler#signal_samples` takes them, or nil if none.
pub(crate) fn native_take_signal_samples(ruby: &Ruby) -> Result<Option<magnus::RArray>, Error> {
    entry(ruby, || {
        // Naming frames allocates (a method name's String on first use): not the program's.
        let was_here = JOB_HERE.with(|here| here.replace(true));
        let flat = take_signal_samples(own_tid());
        JOB_HERE.with(|here| here.set(was_here));
        Ok((!flat.is_empty()).then(|| ruby.ary_from_vec(flat)))
    })
}

/// Takes the samples waiting in the signal slots and gives them to the handler's
/// `signal_samples`. With the GVL, in a job; `job_cpu_ns` is the calling thread's CPU clock
/// when its job started.
fn hand_over_signal_samples(job_cpu_ns: i64) {
    let own = own_tid();
    let flat = take_signal_samples(own);
    if flat.is_empty() {
        return;
    }
    signal_sampler::COUNTERS.jobs.fetch_add(1, Ordering::Relaxed);
    let Ok(ruby) = Ruby::get() else { return };
    let now_ns = crate::sampling::clocks::monotonic_ns();
    let passed = call_handler(|handler| {
        let samples = ruby.ary_from_vec(flat);
        handler.funcall::<_, _, bool>(
            LazyId::get_inner_with(&SIGNAL_SAMPLES, &ruby),
            (samples, job_cpu_ns, now_ns),
        )
    });
    // The handler made the wall pass that was due: it counts as the trigger's job, which the
    // next tick then leaves out (`trigger::SIGNAL_PASS_NS`).
    if passed == Some(true) {
        trigger::SIGNAL_PASS_NS.store(now_ns, Ordering::Relaxed);
        trigger::PASS_NS.store(now_ns, Ordering::Relaxed);
        trigger::LAST_JOB_TID.store(own, Ordering::Relaxed);
        JOBS.fetch_add(1, Ordering::Relaxed);
    }
}
