//! The sampling job: what the trigger ([`crate::sampling::trigger`]) asks Ruby to run, `hz` times a
//! second, on the thread that holds the GVL. It runs at that thread's next interrupt check,
//! inside `rb_postponed_job_flush` (Ruby 3.1 `vm_trace.c`), with the GVL held and the
//! `POSTPONED_JOB` interrupt masked for that thread, so it is never nested in itself on one
//! thread; [`IN_JOB`] also keeps it from running again on another thread while the Ruby code
//! it calls is switched out.
//!
//! It judges whether it runs on time (see [`on_time`]), reads the thread's own CPU clock, and
//! hands `(on_time, cpu_ns, now_ns)` to the Ruby handler the profiler registered
//! (`ThreadSampler#on_job` in `lib/ddprof_recorder/profiler/thread_sampler.rb`), which reads
//! the stack and records the sample. The handler is called through `rb_protect`, so no
//! exception escapes into the flush (which would drop the other queued jobs), and no panic
//! crosses into C (`catch_unwind`).
//!
//! The handler is kept in `ruby_handler::HANDLER`, a GC root that [`init`] registers
//! (`rb_gc_register_address`, which also pins it against compaction). It is only read and
//! written with the GVL held. The job the signal handler asks for calls it too
//! (`ruby_handler::call_handler`), from `signal_job`. This file is the top of the jobs' side:
//! it starts and stops the capture (`signal_sampler`), the schedule (`trigger`) and the other
//! job (`signal_job`), and nothing of them uses it (see `ruby_handler`).
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use magnus::{prelude::*, rb_sys::AsRawValue, value::LazyId, Error, Ruby, Symbol, Value};

use crate::recorder::errors::{arg_error, entry, gem_error};
use crate::sampling::clocks::thread_cpu::{own_cpu_ns, own_tid};
use crate::sampling::ruby_handler;
use crate::sampling::signal_job::signal_job;
use crate::sampling::signal_sampler;
use crate::sampling::trigger::{self, Tick};

/// A job that runs more than this after its tick may have waited for a blocked thread.
/// Interrupt checks come every few microseconds in Ruby code, so a running thread's job comes
/// within a few µs of its tick; a C method that checks none (a big `Array#sort`) can hold the
/// job back for milliseconds, but its thread is on the CPU meanwhile, which [`on_time`] sees.
/// Kept small because a job that comes within it after a blocked thread woke is taken for an
/// on-CPU sample of the code right after the wake-up, with all the CPU the thread carried:
/// with 1 ms, a `5 ms work + sleep 0.001` loop charged 2.7% of its CPU to `sleep`.
const LATE_AFTER_NS: i64 = 30_000;

/// The highest `hz`, the one home of the rate's range: Ruby reads it as `Profiler::MAX_HZ`,
/// builds `Profiler::HZ_RANGE` (`1..MAX_HZ`) from it and raises the user's `ArgumentError`;
/// [`native_sampling_start`] checks it again only so that no bad rate reaches the trigger.
pub const MAX_HZ: u32 = 1000;

/// A job is running (possibly switched out inside the handler's Ruby code).
static IN_JOB: AtomicBool = AtomicBool::new(false);
/// The profiler that started sampling (one per process), or Qnil. A GC root.
static OWNER: AtomicUsize = AtomicUsize::new(rb_sys::Qnil as usize);
pub(super) static LATE_JOBS: AtomicU64 = AtomicU64::new(0);

static CALL: LazyId = LazyId::new("call");

pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        crate::vm::postponed::prepare(job);
        // With the GVL, at load: where the GVL's owner is (the signal handler's check).
        crate::vm::check_gvl_owner();
        // SAFETY: `HANDLER` is a static, so the address stays valid for the process's life;
        // an AtomicUsize has the layout of a VALUE. Called once, with the GVL (at load).
        unsafe { rb_sys::rb_gc_register_address(ruby_handler::HANDLER.as_ptr().cast()) };
        // SAFETY: as above.
        unsafe { rb_sys::rb_gc_register_address(OWNER.as_ptr().cast()) };
        // SAFETY: registers a plain function with no data; Ruby calls it with the GVL after
        // every `at_exit` block, before the VM is torn down (Ruby 3.1 `eval_jump.c`,
        // `rb_ec_exec_end_proc`), which is when the trigger thread must be gone.
        unsafe { rb_sys::rb_set_end_proc(Some(stop_at_exit), rb_sys::Qnil as rb_sys::VALUE) };
    });
}

unsafe extern "C" fn stop_at_exit(_: rb_sys::VALUE) {
    let _ = catch_unwind(stop);
}

fn stop() {
    ruby_handler::ENABLED.store(false, Ordering::Release);
    trigger::stop();
    signal_sampler::stop();
    crate::sampling::signal_sampler::gc_ticks::stop();
    crate::sampling::thread_end::stop();
    ruby_handler::HANDLER.store(rb_sys::Qnil as usize, Ordering::Release);
    OWNER.store(rb_sys::Qnil as usize, Ordering::Release);
}

/// How the profiler samples on-CPU stacks: `:off` (the trigger's job, at interrupt checks),
/// or on each thread's CPU tick, reading the stack in the signal handler (`:handler`) or at
/// the job the handler asks for (`:safepoint`). See `signal_sampler`.
fn signal_mode(ruby: &Ruby, mode: Symbol) -> Result<Option<signal_sampler::Mode>, Error> {
    match mode.name()?.as_ref() {
        "off" => Ok(None),
        "handler" => Ok(Some(signal_sampler::Mode::Handler)),
        "safepoint" => Ok(Some(signal_sampler::Mode::Safepoint)),
        other => Err(arg_error(
            ruby,
            format!("signal mode must be :off, :handler or :safepoint, got :{other}"),
        )),
    }
}

/// What sends the threads their ticks: `:auto` (perf events where the kernel allows them,
/// else CPU-clock timers) or `:cpu` (CPU-clock timers only). See `signal_sampler`.
fn ticks_kind(ruby: &Ruby, ticks: Symbol) -> Result<signal_sampler::Ticks, Error> {
    match ticks.name()?.as_ref() {
        "auto" => Ok(signal_sampler::Ticks::Auto),
        "cpu" => Ok(signal_sampler::Ticks::Cpu),
        other => Err(arg_error(ruby, format!("ticks must be :auto or :cpu, got :{other}"))),
    }
}

/// `Profiler._native_sampling_start(hz, handler, wake_fd, signals, ticks, owner, yjit)`: calls
/// `handler.call(on_time, cpu_ns, now_ns)` from the sampling job, about `hz` times a second
/// while any thread runs Ruby, and writes a byte to `wake_fd` (a non-blocking pipe) on ticks
/// when none does. With `signals` `:handler` or `:safepoint`, installs the signal handler
/// (threads are armed one by one, `_native_signal_arm`, with what `ticks` says: see
/// `ticks_kind`), whose samples go to
/// `handler.signal_samples(samples, job_cpu_ns, now_ns)` (true when it made the wall pass,
/// see `trigger::SIGNAL_PASS_NS`). Adds the thread-end hook (`thread_end`) unless `yjit` (on)
/// rules it out on this Ruby. Returns the signal number (0 with `:off`).
/// One profiler per process: raises if another `owner` is sampling.
// One parameter per argument of the Ruby call, which magnus converts: a struct would only move
// the list.
#[allow(clippy::too_many_arguments)]
pub(crate) fn native_sampling_start(
    ruby: &Ruby,
    hz: u32,
    handler: Value,
    wake_fd: i32,
    signals: Symbol,
    ticks: Symbol,
    owner: Value,
    yjit: bool,
) -> Result<i32, Error> {
    entry(ruby, || {
        if !(1..=MAX_HZ).contains(&hz) {
            return Err(arg_error(ruby, format!("hz must be in 1..{MAX_HZ}, got {hz}")));
        }
        let mode = signal_mode(ruby, signals)?;
        let ticks = ticks_kind(ruby, ticks)?;
        let current = OWNER.load(Ordering::Acquire);
        if ruby_handler::ENABLED.load(Ordering::Acquire)
            && trigger::is_running()
            && current != rb_sys::Qnil as usize
            && current != owner.as_raw() as usize
        {
            return Err(gem_error(
                ruby,
                "another DdprofRecorder::Profiler is already sampling in this process (one profiler per process: stop it first)",
            ));
        }
        stop();
        let signo = match mode {
            Some(mode) => {
                let signo = signal_sampler::start(mode, hz, ticks, signal_job)
                    .map_err(|e| gem_error(ruby, e))?;
                if mode == signal_sampler::Mode::Handler {
                    crate::sampling::signal_sampler::gc_ticks::start();
                }
                signo
            }
            None => 0,
        };
        ruby_handler::HANDLER.store(handler.as_raw() as usize, Ordering::Release);
        OWNER.store(owner.as_raw() as usize, Ordering::Release);
        // A fork taken while a job was switched out leaves the flag set in the child.
        IN_JOB.store(false, Ordering::Release);
        ruby_handler::ENABLED.store(true, Ordering::Release);
        if wake_fd >= 0 {
            // SAFETY: fcntl on a descriptor number only reads and sets its flags; a bad one
            // fails with EBADF. Non-blocking: the trigger must never wait on a full pipe.
            unsafe {
                let flags = libc::fcntl(wake_fd, libc::F_GETFL);
                if flags >= 0 {
                    libc::fcntl(wake_fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
                }
            }
        }
        crate::sampling::thread_end::start(yjit);
        let setup = trigger::Setup { hz, job, jobs_run: &ruby_handler::JOBS, wake_fd };
        trigger::start(setup).map_err(|e| {
            stop();
            gem_error(ruby, format!("could not start the sampling trigger thread: {e}"))
        })?;
        Ok(signo)
    })
}

/// `Profiler._native_sampling_stop(owner)`: stops sampling if `owner` started it (nil: in
/// any case). Returns whether it stopped.
pub(crate) fn native_sampling_stop(ruby: &Ruby, owner: Value) -> Result<bool, Error> {
    entry(ruby, || {
        let current = OWNER.load(Ordering::Acquire);
        if !owner.is_nil() && current != rb_sys::Qnil as usize && current != owner.as_raw() as usize
        {
            return Ok(false);
        }
        stop();
        Ok(true)
    })
}

/// `Profiler._native_interrupt_deferral_checked?`: whether the jobs can defer the program's
/// interrupts on this Ruby (`interrupt_mask`'s layout guards pass on the calling thread).
pub(crate) fn native_interrupt_deferral_checked(ruby: &Ruby) -> Result<bool, Error> {
    // SAFETY: a Ruby method, so on a Ruby thread with the GVL.
    entry(ruby, || Ok(unsafe { crate::sampling::interrupt_mask::layout_checks() }))
}

/// `Profiler._native_task_ids`: the Linux ids of this process's threads (`/proc/self/task`),
/// read without letting go of the GVL: `Dir.children` would, and then wait for a busy thread
/// to hand it back (up to 100 ms, measured in `Profiler#start`). Empty if unreadable.
pub(crate) fn native_task_ids(ruby: &Ruby) -> Result<Vec<i64>, Error> {
    entry(ruby, || {
        Ok(std::fs::read_dir("/proc/self/task")
            .map(|dir| dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default())
    })
}

/// Whether a job that runs at `now_ns` on thread `tid`, whose CPU clock reads `cpu_ns`, runs
/// on time for `tick`: soon after it, or late but with its thread on the CPU since (a long C
/// call). A job that ran late because its thread was blocked (it was flagged while the thread
/// slept and runs when it wakes) is not on time: the CPU the thread used before it blocked was
/// not spent where its stack is now (in `Kernel#sleep`, `IO#read`...), so the handler leaves
/// that CPU to the thread's next on-time sample. When the tick read the CPU clock of another
/// thread, a late job counts as late.
pub fn on_time(tick: Option<Tick>, tid: i32, now_ns: i64, cpu_ns: i64) -> bool {
    let Some(tick) = tick else { return true };
    let waited = now_ns - tick.at_ns;
    if waited <= LATE_AFTER_NS {
        return true;
    }
    tick.tid == tid && tick.cpu_ns >= 0 && (cpu_ns - tick.cpu_ns).saturating_mul(2) >= waited
}

/// The postponed job. Never unwinds.
unsafe extern "C" fn job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(run_job));
}

fn run_job() {
    if !ruby_handler::ENABLED.load(Ordering::Acquire) || IN_JOB.swap(true, Ordering::AcqRel) {
        return;
    }
    let cpu_ns = own_cpu_ns();
    let now_ns = crate::sampling::clocks::monotonic_ns();
    let tid = own_tid();
    let timely = on_time(trigger::TICK.read(), tid, now_ns, cpu_ns);
    if let Ok(ruby) = Ruby::get() {
        let sampled = ruby_handler::call_handler(|handler| {
            handler.funcall::<_, _, bool>(
                LazyId::get_inner_with(&CALL, &ruby),
                (timely, cpu_ns, now_ns),
            )
        })
        .unwrap_or(false);
        // Only jobs that sampled count: one on the profiler's own thread (the GVL holder when
        // the tick came) must not keep the trigger from waking that thread.
        if sampled {
            trigger::PASS_NS.store(now_ns, Ordering::Relaxed);
            trigger::LAST_JOB_TID.store(tid, Ordering::Relaxed);
            ruby_handler::JOBS.fetch_add(1, Ordering::Relaxed);
            if !timely {
                LATE_JOBS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    IN_JOB.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(at_ns: i64, tid: i32, cpu_ns: i64) -> Option<Tick> {
        Some(Tick { at_ns, tid, cpu_ns })
    }

    #[test]
    fn a_job_soon_after_its_tick_is_on_time() {
        // 20 µs after the tick, on another thread: on time (LATE_AFTER_NS is 30 µs).
        assert!(on_time(tick(1_000_000, 5, 0), 9, 1_020_000, 0));
        assert!(on_time(None, 9, 1_500_000, 0));
    }

    #[test]
    fn a_late_job_is_on_time_only_if_its_thread_was_on_the_cpu() {
        // 10 ms late, 9 ms of CPU since the tick: a long C call.
        assert!(on_time(tick(0, 5, 1_000), 5, 10_000_000, 9_001_000));
        // 10 ms late, 0.1 ms of CPU: it slept and just woke up.
        assert!(!on_time(tick(0, 5, 1_000), 5, 10_000_000, 101_000));
        // Late, and the tick read another thread's clock: cannot tell, so late.
        assert!(!on_time(tick(0, 6, 1_000), 5, 10_000_000, 9_001_000));
    }
}
