//! The sampling trigger: a plain native thread that ticks `hz` times a second (fewer while it
//! has nothing to do: "Quiet ticks") and, on each tick, asks Ruby to run the sampling job
//! ([`crate::sampling::job`]) on whichever thread holds the GVL. No signal is involved, and the
//! thread holds no Ruby object and never the GVL.
//!
//! # Why calling Ruby from this thread is sound (Ruby 3.1)
//!
//! The thread calls exactly one Ruby function, `rb_postponed_job_register_one`. Since Ruby 3.1
//! (ruby/ruby PR #5094, `vm_trace.c`) it may be called from a thread Ruby does not know: it
//! reads the VM from the global `ruby_current_vm_ptr`, and when the thread has no execution
//! context (`rb_current_execution_context(false)` is NULL) it falls back to the main ractor's
//! running one (`rb_vm_main_ractor_ec`). It then claims a slot of the VM's job buffer with a
//! compare-and-swap, or finds the job already queued, and sets the `POSTPONED_JOB` bit of that
//! context's interrupt flag with an atomic `or`. Nothing else: no lock, no allocation. This was
//! checked against Debian's `libruby-3.1.so.3.1.2` (its disassembly reads the VM pointer, the
//! TLS execution context, calls the main-ractor fallback when that is NULL, and ends in `lock
//! orl $0x4` on the context's interrupt flag). The job then runs at that thread's next
//! interrupt check, with the GVL held; a thread that sleeps or waits for I/O checks no
//! interrupts, so when no thread runs Ruby no job runs (the Ruby sampler thread covers that
//! case, see `lib/ddprof_recorder/profiler.rb`).
//!
//! (Ruby bug #19991, a job that may be called with another job's data: see `vm::decoy_data`.)
//!
//! # Late jobs
//!
//! On each tick the trigger also reads the CPU clock of the thread that ran the previous job
//! (most often still the GVL holder) and publishes it with the tick's time ([`TickInfo`]). A
//! job can then tell whether its thread used the CPU since the tick or was blocked, and so ran
//! late (see `job`).
//!
//! # Randomized ticks
//!
//! Tick intervals are drawn uniformly from 0.5 to 1.5 periods (the mean rate stays `hz`). With
//! fixed ticks, a program that loops with a steady cycle (5 ms of work, then a 1 ms sleep)
//! meets the ticks at a few fixed phases of its cycle, and the CPU carried past a blocked
//! thread (see `lib/ddprof_recorder/profiler/thread_sampler.rb`) then lands on whatever
//! code runs at the phase after the sleep: measured with `bench/run accuracy` (`sleepy`), the
//! split between its two methods came out 41/52% against a truth of 59/40%.
//!
//! # Waking the Ruby sampler thread
//!
//! When the jobs stop running (every thread is blocked, so none checks interrupts), the Ruby
//! sampler thread has to make the passes itself. It waits on a pipe; the trigger writes one
//! byte to it on each tick that finds no job ran for [`JOBLESS_TICKS`] ticks (`write(2)` on
//! a non-blocking descriptor: async-signal-safe, no Ruby involved). While jobs run, the Ruby
//! thread is never woken and costs nothing. Woken, the Ruby thread makes a pass only if still
//! no job came for `JOBLESS_TICKS` periods (it reads the constant as
//! `Profiler::JOBLESS_TICKS`): a job may have run between the byte and its wake-up. This is
//! the rule's one statement; `Profiler#run_sampler_thread` and docs/profiler.md point here.
//!
//! # Quiet ticks
//!
//! When the signal jobs make the wall passes (a busy thread sampled at its ticks), a tick has
//! nothing to do. After two such ticks in a row the next
//! intervals are stretched to two and then [`MAX_STRETCH`] periods (still drawn around that
//! mean), and the first tick with work brings them back to one. Each wake-up of the trigger
//! costs more than its own CPU: a busy thread on another CPU runs slower while it happens
//! (bench/RESULTS.md, "Overhead": a process that only slept 10 ms in a loop, pinned to the other
//! CPU, slowed examples/hot_spot's work by up to a third on this project's VM). A program that
//! stops running Ruby gets the full rate back at once: its ticks register the job (no signal pass
//! is recent).
//!
//! # Batches
//!
//! When the signal handler keeps a busy thread's samples in batches (`signal_sampler`,
//! "Batches"), that thread's job comes every few periods, and with it the wall pass. A pass
//! in between would cost the busy thread a job of its own, for nothing when no other thread
//! ran: an idle thread's passes are only counted, and a pass later counts the periods since
//! the last (`ThreadSampler#pass_periods`). So a tick asks for no job while the last pass is
//! less than [`BATCH_PASS_PERIODS`] periods old and its look at the threads
//! (`signal_sampler::watch_stops`) found none that ran and stopped since the previous look, no
//! thread began or ended since the trigger last asked for the job (`thread_end::events`), and
//! every thread the profiler samples takes its signals (`signal_sampler::all_armed`). Any of
//! those brings the pass back at once (a thread begun or ended, at the first tick not spared
//! by a signal pass of the last period), so a thread that stops running Ruby or ends is seen
//! at the next tick, and a program with no busy thread gets its passes from the trigger's
//! jobs as before.
//!
//! # Lifecycle
//!
//! The thread is a [`NativeThread`]: started and stopped by Ruby threads with the GVL held,
//! forgotten (not joined) in a forked child. Before the VM is torn down it must be gone: an
//! end proc registered at load time (it runs after every `at_exit` block) stops it, and
//! `exit!` ends the process without tearing the VM down.
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sampling::clocks::monotonic_ns;
use crate::sampling::clocks::thread_cpu::{cpu_time_ns, own_cpu_ns};
use crate::sampling::native_thread::{NativeThread, Stopped};
use crate::sampling::random::Jitter;

/// What the trigger saw at its latest tick, for the job to judge how late it runs. A seqlock:
/// `seq` is odd while the trigger writes.
pub struct TickInfo {
    seq: AtomicU64,
    at_ns: AtomicI64,
    tid: AtomicI32,
    cpu_ns: AtomicI64,
}

pub static TICK: TickInfo = TickInfo {
    seq: AtomicU64::new(0),
    at_ns: AtomicI64::new(0),
    tid: AtomicI32::new(0),
    cpu_ns: AtomicI64::new(-1),
};

/// The native thread id that ran the latest job: the thread whose CPU clock the next tick
/// reads. Written by the job, read by the trigger.
pub static LAST_JOB_TID: AtomicI32 = AtomicI32::new(0);

/// Ticks that registered the job (whether or not it ran since), for stats.
pub static TICKS: AtomicU64 = AtomicU64::new(0);

/// When a signal sample's job last made the wall pass (monotonic ns; 0: never, and always
/// without signals). A tick less than a period after it registers no job: the pass is done,
/// and the busy thread is spared a job of its own (a job costs 100 µs or so of CPU when the
/// program has evicted our code and data from the caches, whatever it does). A signal job
/// passes once half a period went by since the last pass of either kind
/// (`ThreadSampler#signal_samples`), so with signals most passes ride on signal jobs, and
/// the trigger's come in when the signals stop (every thread blocked, or none armed).
pub static SIGNAL_PASS_NS: AtomicI64 = AtomicI64::new(0);

/// When a job last made the wall pass, a signal job or the trigger's (monotonic ns; 0:
/// never): see "Batches".
pub static PASS_NS: AtomicI64 = AtomicI64::new(0);

/// Periods a pass may wait while the signal handler keeps its samples in batches and nothing
/// else needs one (see "Batches"): twice the batch, so that a busy thread's batch (about
/// `BATCH` periods of its CPU) nearly always fills, and its job makes the pass, first.
const BATCH_PASS_PERIODS: i64 = 2 * crate::sampling::signal_sampler::BATCH as i64;

/// The running trigger thread's Linux id (0: none), and the CPU the last one used in all.
static THREAD_TID: AtomicI32 = AtomicI32::new(0);
static LAST_THREAD_CPU_NS: AtomicI64 = AtomicI64::new(0);

/// Ticks without a job after which the Ruby sampler thread is woken (see the module doc).
pub const JOBLESS_TICKS: u32 = 2;

/// The longest interval between two quiet ticks, in periods (a power of two; see "Quiet
/// ticks").
const MAX_STRETCH: u32 = 4;

/// Intervals stretched past a period, for stats.
pub static QUIET_STRETCHES: AtomicU64 = AtomicU64::new(0);

/// What one trigger thread works with.
pub struct Setup {
    pub hz: u32,
    pub job: unsafe extern "C" fn(*mut c_void),
    /// How many jobs have run: the trigger wakes the Ruby thread when it stops moving.
    pub jobs_run: &'static AtomicU64,
    /// The write end of the Ruby sampler thread's pipe (non-blocking), or -1.
    pub wake_fd: i32,
}

/// A tick as read by the job: when, and the CPU clock then of the thread `tid` (-1: unread).
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    pub at_ns: i64,
    pub tid: i32,
    pub cpu_ns: i64,
}

impl TickInfo {
    fn publish(&self, tick: Tick) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        self.at_ns.store(tick.at_ns, Ordering::Relaxed);
        self.tid.store(tick.tid, Ordering::Relaxed);
        self.cpu_ns.store(tick.cpu_ns, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::AcqRel);
    }

    /// The latest tick, or None if none yet (or the trigger kept writing while we read).
    pub fn read(&self) -> Option<Tick> {
        for _ in 0..4 {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let tick = Tick {
                at_ns: self.at_ns.load(Ordering::Relaxed),
                tid: self.tid.load(Ordering::Relaxed),
                cpu_ns: self.cpu_ns.load(Ordering::Relaxed),
            };
            if self.seq.load(Ordering::Acquire) == before {
                return (before > 0).then_some(tick);
            }
        }
        None
    }
}

static THREAD: NativeThread = NativeThread::new();

/// Starts ticking at `setup.hz` (stopping a trigger already running first).
pub fn start(setup: Setup) -> std::io::Result<()> {
    THREAD.start("ddprof-trigger", move |stop| run(&setup, stop))
}

/// Stops the trigger and waits for its thread to end (it wakes at once). A no-op if none runs.
pub fn stop() {
    if THREAD.stop() == Stopped::Forgotten {
        // The parent's thread (see `native_thread`): what it would have left at its end.
        THREAD_TID.store(0, Ordering::Release);
        LAST_THREAD_CPU_NS.store(0, Ordering::Release);
    }
}

/// Whether a trigger started in this process runs.
pub fn is_running() -> bool {
    THREAD.is_running()
}

/// CPU the trigger thread used: the running one's so far, or the last one's in all.
pub fn thread_cpu_ns() -> i64 {
    match THREAD_TID.load(Ordering::Acquire) {
        0 => LAST_THREAD_CPU_NS.load(Ordering::Acquire),
        tid => cpu_time_ns(tid).unwrap_or_else(|| LAST_THREAD_CPU_NS.load(Ordering::Acquire)),
    }
}

fn run(setup: &Setup, stop: &AtomicBool) {
    // SAFETY: gettid has no preconditions and cannot fail.
    THREAD_TID.store(unsafe { libc::gettid() }, Ordering::Release);
    run_ticks(setup, stop);
    LAST_THREAD_CPU_NS.store(own_cpu_ns(), Ordering::Release);
    THREAD_TID.store(0, Ordering::Release);
}

fn run_ticks(setup: &Setup, stop: &AtomicBool) {
    let period = Duration::from_nanos(1_000_000_000 / u64::from(setup.hz.max(1)));
    let mut jitter = Jitter::new();
    let mut deadline = Instant::now() + jitter.around(period);
    let mut jobs_before = setup.jobs_run.load(Ordering::Relaxed);
    let mut jobless_ticks = 0u32;
    let mut quiet = 0u32;
    let mut asked = false;
    let mut events = crate::sampling::thread_end::events();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < deadline {
            // Absolute deadlines: a late wake-up shortens the next sleep instead of drifting.
            // `park_timeout` may return early (spuriously or from `stop`): loop and re-check.
            std::thread::park_timeout(deadline - now);
            continue;
        }
        // Ticks that asked for the job, none of which ran since the last job that did.
        let jobs = setup.jobs_run.load(Ordering::Relaxed);
        jobless_ticks = match (jobs == jobs_before, asked) {
            (false, _) => 0,
            (true, true) => jobless_ticks.saturating_add(1),
            (true, false) => jobless_ticks,
        };
        jobs_before = jobs;
        if jobless_ticks >= JOBLESS_TICKS && setup.wake_fd >= 0 {
            // SAFETY: writes one byte from a live buffer; a closed or full pipe only makes it
            // fail (EBADF, EAGAIN), which is fine: the Ruby thread is stopping or already woken.
            unsafe { libc::write(setup.wake_fd, b"!".as_ptr().cast(), 1) };
        }
        // Ticks with nothing to do (the signal jobs make the passes) stretch the next interval, up to [`MAX_STRETCH`] periods: see "Quiet
        // ticks".
        let done = tick(setup.job, period, &mut events);
        asked = done.asked;
        quiet = if done.work { 0 } else { quiet.saturating_add(1) };
        let stretch = if quiet >= 2 { 1 << (quiet - 1).min(MAX_STRETCH.ilog2()) } else { 1 };
        QUIET_STRETCHES.fetch_add(u64::from(stretch > 1), Ordering::Relaxed);
        deadline += jitter.around(period * stretch);
        let now = Instant::now();
        if deadline < now {
            // Far behind (the machine was busy): start again from now rather than burst.
            deadline = now + period;
        }
    }
}

/// What a tick did.
struct Done {
    /// It asked for the job.
    asked: bool,
    /// It had work: the job to ask for, or a thread that stopped running since the last look.
    work: bool,
}

/// One tick. `events` is what `thread_end::events` read when the trigger last asked for the
/// job.
fn tick(
    job: unsafe extern "C" fn(*mut c_void),
    period: Duration,
    events: &mut Option<u64>,
) -> Done {
    let stops = crate::sampling::signal_sampler::watch_stops();
    let tid = LAST_JOB_TID.load(Ordering::Relaxed);
    let cpu_ns = if tid > 0 { cpu_time_ns(tid).unwrap_or(-1) } else { -1 };
    let at_ns = monotonic_ns();
    crate::sampling::signal_sampler::watch_masks(at_ns);
    TICK.publish(Tick { at_ns, tid, cpu_ns });
    let period_ns = i64::try_from(period.as_nanos()).unwrap_or(i64::MAX);
    let events_now = crate::sampling::thread_end::events();
    let skip = at_ns.saturating_sub(SIGNAL_PASS_NS.load(Ordering::Relaxed)) < period_ns
        || (crate::sampling::signal_sampler::batching()
            && !stops.stopped
            && crate::sampling::signal_sampler::all_armed()
            && events_now.is_some()
            && events_now == *events
            && at_ns.saturating_sub(PASS_NS.load(Ordering::Relaxed))
                < BATCH_PASS_PERIODS.saturating_mul(period_ns));
    if skip {
        return Done { asked: false, work: false };
    }
    *events = events_now;
    // Callable from a thread Ruby does not know (module doc, and `postponed`).
    crate::vm::postponed::trigger(job);
    TICKS.fetch_add(1, Ordering::Relaxed);
    Done { asked: true, work: true }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_info_reads_what_was_published() {
        let info = TickInfo {
            seq: AtomicU64::new(0),
            at_ns: AtomicI64::new(0),
            tid: AtomicI32::new(0),
            cpu_ns: AtomicI64::new(-1),
        };
        assert!(info.read().is_none(), "nothing published yet");
        info.publish(Tick { at_ns: 5, tid: 7, cpu_ns: 9 });
        let tick = info.read().unwrap();
        assert_eq!((tick.at_ns, tick.tid, tick.cpu_ns), (5, 7, 9));
    }
}
