//! Reading a thread's stack at the moment its CPU tick comes, in a signal handler, rather than
//! at the VM's next interrupt check (which charges the CPU of Ruby code to the cheap C methods
//! around it: safepoint bias).
//!
//! # Ticks only on the way back to user mode
//!
//! Each Ruby thread that the profiler samples is *armed*: it gets a [`Slot`], and a source of
//! ticks on its own CPU clock whose signal goes to that thread only. Every source here signals
//! a thread only as it returns to user mode, having run: a thread that waits (`read(2)`,
//! `sleep`, `IO.select`, `Queue#pop`, a futex, a libc call through Fiddle) uses no CPU and is
//! never signalled, and a signal never lands inside a system call, so no blocking call is cut
//! short (a nonblocking pipe's `IO#sysread` waits in Ruby's internal `poll(2)`, which
//! `SA_RESTART` does not restart: a signal there raised `Errno::EAGAIN` into the program; a C
//! extension's `poll` would return `EINTR`). Until this version the trigger thread also sent
//! *wall ticks* (`rt_tgsigqueueinfo` to each thread whose CPU clock it saw moving), which had
//! that race: a C `poll(2)` in a loop at 999 Hz returned `EINTR` 44 times in 5 s
//! (spec/profiler/ticks_spec.rb has the repros). They are gone; the trigger only looks at the
//! threads' clocks ([`watch_stops`]) to time the wall passes ("Batches").
//!
//! # Perf-event ticks (`ticks: :auto`, where the kernel allows them)
//!
//! A `perf_event_open` software event per thread, `PERF_COUNT_SW_CPU_CLOCK` with
//! `exclude_kernel`, whose overflow every `1/hz` of the thread's CPU signals it (`perf_ticks`
//! has the kernel's side: why an overflow always interrupts user mode, and why each event is
//! limited to one overflow at a time). It is what async-profiler's `cpu` mode uses, and reaches
//! any rate, past the kernel's scheduler tick. Each overflow is a sample: the handler draws
//! none out ([`drawn`] is for CPU timers alone). An expiry that comes while the thread is in
//! the kernel is no overflow, so the event gives a thread's kernel time no samples: a thread
//! that burns its CPU in system calls (`Process.clock_gettime` of a thread CPU clock in a loop)
//! got 8 samples for 0.3 s of CPU at 99 Hz. So each such thread keeps its CPU timer too (below),
//! whose tick is a sample only when the thread's samples owe more than a period of its CPU
//! ([`owes`]; each sample pays one period, [`pay`]): in user code the event keeps them paid
//! and the timer's ticks are left out (`signals_passed_over`); in the kernel the timer's ticks,
//! which come on the way back to user mode too, make up for the event's, up to the kernel's
//! tick rate (27 samples for that 0.3 s). Which tick is taken depends on the thread's clock
//! only, not on what it runs. Every sample is charged about the thread's average CPU per
//! sample and what is left goes to its last stack (`ThreadSampler#signal_charge`), so totals
//! stay exact. [`start`]
//! opens one event for the calling thread to know whether the kernel allows them
//! (`perf_event_paranoid` 3 refuses them to a user without `CAP_PERFMON`; a seccomp filter or
//! a container's policy may too); if not, the run has CPU ticks only, capped by the kernel's
//! tick, and `stats` ([`perf_refused`]) and the profile's `sampling` comment say so. A thread
//! whose event alone is refused (a descriptor limit) gets a CPU timer.
//!
//! # CPU ticks (`ticks: :cpu`, `:auto` where perf events are refused, and beside each event)
//!
//! Each armed thread gets a POSIX timer on its own
//! CPU clock (`timer_create` on the clock id `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, see
//! `clocks::thread_cpu`), whose signal goes to that thread only (`SIGEV_THREAD_ID`). A CPU-clock timer
//! expires at a scheduler tick while its thread is on a CPU, and Linux sends the signal from
//! the tick's task work, on the thread's return to user mode. The handler is installed with
//! `SA_RESTART` all the same.
//!
//! ## Which CPU ticks are samples
//!
//! The kernel checks CPU timers at its scheduler tick only (`CONFIG_HZ`, 250 on Debian's
//! kernels), so the moments a timer can fire are the ticks its thread runs through. The timers'
//! period is 10 µs ([`PROBE_PERIOD_NS`]): at every such tick the timer has expired, and the
//! thread gets a signal. Each tick is then a sample, independently, with the same probability
//! `hz * tick` (all of them when `hz` is at or above the tick rate: a thread gets at most about
//! 250 samples a second of its CPU on such a kernel), drawn in the handler ([`drawn`]); the
//! tick is measured as the average CPU a thread uses from one tick to the next ([`TICK_NS`]).
//! Ticks come at fixed times of the wall clock, which a program does not follow, so they fall
//! on a thread's stacks in proportion to the CPU each uses, and so do the samples. A timer
//! with a period of `1/hz` would not do: it fires at the first tick after each `1/hz` of CPU,
//! so a tick is chosen in proportion to the CPU used since the previous tick, and the first
//! tick after a sleep, which follows less CPU, is chosen less often (on bench/accuracy's
//! `sleepy`, the method run after each sleep got 35% of the CPU against a truth of 59%). For
//! the same reason the profiler charges each sample about the thread's average CPU per sample,
//! not the CPU since its previous sample (`ThreadSampler#signal_charge`).
//!
//! # Our signal
//!
//! The signal is a real-time one that nothing else in the process handles when the profiler
//! first starts (see [`install`]). A program can take it: Ruby's `trap` takes a real-time
//! signal by number (`trap(42)`), and a C extension can call `sigaction`. Its handler would
//! then run for our ticks (a program that trapped `SIGRTMIN+8` had its handler run 365 times
//! in 1.5 s at 999 Hz, and a profile with no sample). So [`keep_signal`] moves the ticks to the
//! next free real-time signal (a perf event's `F_SETSIG`, a CPU timer made anew) or, with none
//! free, stops signal sampling (the threads are then sampled at the passes): before a Ruby
//! `trap` of it installs the program's handler (`DdprofRecorder::SignalGuard`), so that
//! handler never runs for a tick of ours; and when the sampler thread finds, at one of its
//! wake-ups (every 0.1 s at most), that the handler on it is no longer ours. A tick already
//! queued on the old signal when it moves goes to whatever handles that signal then: a
//! window of microseconds. Each perf event is enabled again as it moves (its last tick may
//! have gone to that other handler, which would not enable it). What happened is kept for
//! `stats`, the log and the profile's `signal:` comment ([`signal_taken`]).
//!
//! # Exec
//!
//! A real-time signal still pending at `execve` survives it, and the new image, which has
//! the default action for it, dies of it (9 of 150 children that started the profiler at
//! 999 Hz and exec'd a shell, before). So before a Ruby `exec` ([`prepare_exec`], called by
//! `DdprofRecorder::SignalGuard`), the exec'ing thread blocks the signal, every thread is
//! disarmed (no timer or event of ours is left to send one; the other threads end at the exec
//! anyway), the signals of ours pending on this thread or the process are taken
//! (`sigtimedwait` with no wait), and the thread's mask is given back (`execve` keeps the
//! mask). The handler stays: `execve` resets it to the default itself, and until then a
//! stray signal finds it rather than the default action. If the exec fails,
//! [`resume_after_exec`] arms the threads again. `spawn` and `system` fork a child, which has
//! no pending signal (a fork's child starts with none), no POSIX timer (not inherited) and no
//! event of ours (the events are bound to the parent's threads, and their descriptors are
//! close-on-exec and `remove_on_exec`), and exec there: nothing to do.
//!
//! # Threads that block our signal
//!
//! A thread can block our signal (`pthread_sigmask`, through Fiddle or a C extension) before
//! or after it is armed. Its ticks then wait, pending, and its handler never runs: before this
//! version a thread that did so and burned 2 s of CPU had all of it charged to the stack of its
//! last sample before. [`arm`] reads the thread's mask (`SigBlk` in `/proc/self/task/<tid>/status`)
//! and does not arm a thread that blocks it; and a few times a second the trigger reads the
//! mask of an armed thread whose CPU clock ran 30 ms past the last tick its handler took
//! ([`watch_masks`]), which no thread that takes its ticks does (they come every period, and
//! at each of the kernel's ticks). Either way the thread is left to the wall passes, which
//! sample it as a thread with no slot (`ThreadSampler#unarm_masked`: its stack where a pass or
//! its own job finds it running), it is tried again about every second, and it is counted once
//! in `stats[:signals][:signal_blocked_threads]` and said once in the log. A tick pending when
//! it is disarmed is of an old generation or of a closed event, and is ignored if the thread
//! ever unblocks the signal. A thread that *ignores* the signal (`SIG_IGN`) has replaced our
//! handler for the whole process: see "Our signal".
//!
//! # The handler
//!
//! Each armed thread has a [`Slot`]: a state, the tick's CPU clock and time, and a buffer for
//! the frames, allocated when the thread is armed and reused (never freed). A timer's signal
//! carries the slot's index and generation (`SI_TIMER`), a perf event's the event's descriptor
//! (`si_fd` of a `POLL_*` band), which the handler looks up among the slots together with its
//! own thread id; so it finds its slot without thread-local storage (whose first use in a
//! `dlopen`ed library can allocate), and a signal of neither kind (a `kill`) is not a tick.
//! A timer's slot must be armed for the thread the signal landed on too (`gettid`), or the
//! tick is stale.
//! The handler does only async-signal-safe work: atomics, `clock_gettime`, `ioctl` (a perf
//! event's refresh), `gettid`,
//! `ruby_thread_has_gvl_p` and `rb_during_gc` (plain reads of the thread's and the VM's
//! state, Ruby 3.1 `thread.c` and `gc.c`), a read of the Ractor's GVL owner,
//! `rb_profile_frames` and `rb_postponed_job_register_one`. It reads the frames only when
//!
//! - the thread holds the GVL: it is not inside a blocking region (`ruby_thread_has_gvl_p`)
//!   and its Ractor names it as the GVL's owner (`vm::current_thread_holds_gvl`; the first
//!   alone also says yes for a thread that a time slice took the GVL from and that waits to
//!   get it back, while the real owner may start a GC or a compaction): then no other thread
//!   runs Ruby, so nothing moves or frees the objects it reads;
//! - no GC runs (`rb_during_gc`): the GC itself may be moving objects (compaction). From 3.3
//!   such a tick is kept, and its stack read when the GC step ends (`gc_ticks`);
//! - its slot is empty: a sample still waiting for its job is not overwritten.
//!
//! Otherwise it counts why and returns: that thread's CPU is charged at its next sample
//! (`lib/ddprof_recorder/profiler/thread_sampler.rb`), so nothing is lost.
//!
//! `rb_profile_frames` reads the running thread's control frames (`ec->cfp` down to the end
//! frame, Ruby 3.1 `vm_backtrace.c`), and for each its iseq or method entry and line, with no
//! allocation and no lock; the handler reads them that way too, through
//! `stack_capture::read_current` (`vm::frames` on 3.1, 3.3 and 3.4 once its self-check passed,
//! which reads the same fields and gives a `define_method` method its method entry; else
//! `rb_profile_frames` itself). Reading them in a handler is sound since Ruby 3.0: `vm_push_frame`
//! fills a frame before it moves `ec->cfp` to it (ruby/ruby PR #3296, commit 0e276dc), so an
//! interrupted push shows either the old top or a whole new frame; ruby/ruby PR #11036 (3.2.5,
//! 3.3.4, 3.4) adds a compiler fence that keeps the compiler from reordering those stores, which
//! the compilers checked in that PR did not do anyway (Debian's 3.1.2 has no fence). This is
//! what stackprof does on Ruby 3.0+ (its PRs #150 and #172), and dd-trace-rb on 3.2.5+/3.3.4+
//! (its PRs #4785, #4786). Where it is not sound, the handler only asks for the job, which
//! then reads the stack at the thread's next interrupt check, as the trigger's job does (the
//! safepoint mode, [`Mode::Safepoint`]):
//!
//! - with YJIT on, on Ruby 3.1: JIT code does not keep `cfp->pc` current, and
//!   `rb_profile_frames` turns the pc into a line (stackprof #179/#180: crashes). From 3.3 on
//!   YJIT fills a frame before it publishes it and the top frame's unwritten pc is told by its
//!   `jit_return` (line 0), so the handler reads stacks under YJIT there
//!   (`vm::HANDLER_READS_UNDER_YJIT` has the sources), as stackprof does from 3.3;
//! - with `GC.auto_compact` on, before Ruby 3.2: compaction then protects heap pages with a
//!   read barrier (`mprotect`, whose fault handler is not async-signal-safe) between GC steps.
//!   On at the start, or turned on later: the profiler sees `GC.auto_compact=` before Ruby
//!   does, and [`read_at_jobs`] makes every later tick's stack read at its job.
//!
//! Known limits: rb_profile_frames walks environment pointers
//! (`rb_vm_frame_method_entry`), which `vm_make_env_each` leaves inconsistent for a few
//! instructions while it moves an environment to the heap (ruby/ruby PR #16615, open): a
//! risk that stackprof and dd-trace-rb share.
//!
//! # The job
//!
//! The handler then registers the job given to [`start`] (`job`'s signal job), a postponed job
//! that runs at the thread's next interrupt check with the GVL: [`drain`] names the frames
//! (`stack_capture::store_read_frames`) and hands each sample to the profiler. Between the
//! handler and the job the frame objects are marked by [`SlotsRoot`], a GC root (marking
//! also pins them against compaction); the GC runs with the GVL, and the handler writes a
//! slot only with the GVL, so the root never reads a slot being written.
//!
//! # Batches
//!
//! A job costs the program about 100 µs of CPU whatever it does, because the program ran for
//! a period since the last one and took our code and data out of the caches
//! (bench/RESULTS.md, "What makes a job cold"). So in [`Mode::Handler`] a slot keeps up to
//! [`BATCH`] samples, each with its own frames, and the handler asks for the job only when
//! the batch is full: a busy thread runs one job for every `BATCH` samples (measured:
//! bench/RESULTS.md, "Signal samples in batches"). Every wall pass and every window's end
//! takes what the slots hold first (`ThreadSampler#take_signal_samples`), before any thread's
//! end or idle time is accounted, and a thread disarmed with samples waiting (it ended, or
//! `stop`) leaves them in [`KEPT`] for the next of those, so no sample waits past a pass. The
//! wall passes then need not come every period either: while nothing but the batched threads
//! ran, the trigger lets them wait (`trigger`, "Batches"), and a pass counts the periods since
//! the last one. In [`Mode::Safepoint`] each sample has its job at once, as the job reads its
//! stack.
//!
//! # Lifecycle
//!
//! Threads are armed and disarmed with the GVL held (`ThreadSampler`), the handler is
//! installed once and stays (a signal after `stop` finds [`ENABLED`] false and returns; with
//! no handler the default action of a real-time signal would end the process). A forked
//! child has the handler but no timers (POSIX timers are not inherited), and copies of the
//! parent's perf events' descriptors (their signals go to the parent's threads): its slots are
//! forgotten, and those copies closed, at its first start or stop (the fork hook stops). For
//! `exec`, see "Exec".
//!
//! # Where the code is
//!
//! In `signal_sampler/`: [`slots`] holds the slots and their GC root; [`timers`] arms and
//! disarms threads, moves their ticks to another signal and takes them away for an exec;
//! [`perf_ticks`] opens and refreshes the perf events; [`rt_signal`] installs, checks, blocks
//! and drains the signal; [`handler`] is the handler, with the end of a GC step that reads the
//! stacks of its ticks in the GC; [`tick_choice`] says which CPU ticks are samples; [`samples`]
//! takes them out of the slots with the GVL; [`armed_watch`] is the trigger's look at the
//! threads' clocks; [`gc_ticks`] reads, at the end of a GC step, the ticks that came inside it
//! (Ruby 3.3+); [`counters`] counts for `stats`. This file holds the run's settings, [`start`]
//! and [`stop`], [`keep_signal`] and [`prepare_exec`], and re-exports what the rest of the
//! crate calls.
//!
//! The capture is the bottom of the sampler's jobs' side: nothing here uses the trigger or
//! the jobs (`trigger`, `job`, `signal_job`, `ruby_handler`), which use it; it reads only
//! `clocks`, `random`, `stack_capture`, `vm` and `recorder`. `memory::gc_events` tells
//! [`gc_ticks`] when it measures the GC rather than being asked.
//!
//! [`Slot`]: slots::Slot
//! [`watch_masks`]: armed_watch::watch_masks
//! [`drawn`]: tick_choice::drawn
//! [`owes`]: tick_choice::owes
//! [`pay`]: tick_choice::pay
//! [`TICK_NS`]: tick_choice::TICK_NS
//! [`PROBE_PERIOD_NS`]: timers::PROBE_PERIOD_NS

mod armed_watch;
mod counters;
pub mod gc_ticks;
mod handler;
mod perf_ticks;
mod rt_signal;
mod samples;
mod slots;
mod tick_choice;
mod timers;

use std::ffi::c_void;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Mutex;

pub use armed_watch::{take_masked, watch_masks, watch_stops};
pub use counters::COUNTERS;
pub use handler::read_gc_ticks;
pub use perf_ticks::REFUSED_FOR_TESTS as PERF_REFUSED_FOR_TESTS;
pub use rt_signal::{signal, signal_name, BlockedHere};
pub use samples::{drain, key, KEYS_PER_THREAD};
pub use slots::{armed, set_in_job, SlotsRoot, BATCH, MAX_SLOTS};
pub use tick_choice::tick_ns;
pub use timers::{arm, disarm};

use rt_signal::install;
use samples::KEPT;
use timers::{disarm_all_locked, forget_if_forked, ARMING};

/// How the handler samples.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Reads the stack in the handler.
    Handler,
    /// Asks for the job, which reads the stack at the thread's next interrupt check.
    Safepoint,
}

/// What sends each thread its ticks (see "Perf-event ticks" and "CPU ticks").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ticks {
    /// Perf events where the kernel allows them (checked at [`start`]), else CPU timers.
    Auto,
    /// CPU-clock timers only.
    Cpu,
}

/// Whether signals sample: false before `start` and after `stop`.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// [`Mode::Handler`] if true.
static IN_HANDLER: AtomicBool = AtomicBool::new(true);
/// Whether this run arms threads with perf events (else CPU timers).
static PERF: AtomicBool = AtomicBool::new(false);
/// Why this run has no perf events though [`Ticks::Auto`] asked for them (the kernel's
/// refusal), for `stats` and the profile's comment.
static PERF_REFUSED: Mutex<Option<String>> = Mutex::new(None);
/// What became of our signal when the program took it in this run ([`keep_signal`]), for
/// `stats`, the log and the profile's comment.
static SIGNAL_TAKEN: Mutex<Option<String>> = Mutex::new(None);

/// The job the handler registers.
static JOB: AtomicUsize = AtomicUsize::new(0);
/// Samples asked for per second of a thread's CPU.
static HZ: AtomicU32 = AtomicU32::new(0);

/// Installs the handler on the first real-time signal that has none (once per process), and
/// starts sampling with `mode`; `job` is the postponed job the handler registers. With
/// [`Ticks::Auto`], checks whether the kernel allows perf events (see "Perf-event ticks").
///
/// # Errors
///
/// When no real-time signal is free, or `sigaction` fails: a message naming the signal.
pub fn start(
    mode: Mode,
    hz: u32,
    ticks: Ticks,
    job: unsafe extern "C" fn(*mut c_void),
) -> Result<i32, String> {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    disarm_all_locked();
    timers::forget_exec();
    // What the last run left is not this run's.
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
    COUNTERS.clear();
    *SIGNAL_TAKEN.lock().unwrap_or_else(|p| p.into_inner()) = None;
    HZ.store(hz, Release);
    JOB.store(job as *const () as usize, Release);
    IN_HANDLER.store(mode == Mode::Handler, Release);
    let perf = match ticks {
        Ticks::Cpu => Ok(false),
        Ticks::Auto => perf_ticks::probe(hz).map(|()| true),
    };
    PERF.store(perf == Ok(true), Release);
    *PERF_REFUSED.lock().unwrap_or_else(|p| p.into_inner()) = perf.err();
    let signo = install()?;
    ENABLED.store(true, Release);
    Ok(signo)
}

/// Stops sampling: every thread is disarmed. The handler stays installed.
pub fn stop() {
    ENABLED.store(false, Release);
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    disarm_all_locked();
    timers::forget_exec();
}

/// `:perf_events` or `:cpu_timers`: what arms this run's threads (None before a start).
pub fn ticks_kind() -> Option<&'static str> {
    if HZ.load(Acquire) == 0 {
        return None;
    }
    Some(if PERF.load(Acquire) { "perf_events" } else { "cpu_timers" })
}

/// Why this run has CPU timers only though perf events were asked for.
pub fn perf_refused() -> Option<String> {
    PERF_REFUSED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// What became of our signal when the program took it in this run, if it did.
pub fn signal_taken() -> Option<String> {
    SIGNAL_TAKEN.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Whether signals sample (false once [`keep_signal`] found no free signal).
pub fn sampling() -> bool {
    ENABLED.load(Acquire)
}

/// From now on the handler reads no stack: each tick's is read at its job ([`Mode::Safepoint`]),
/// for the rest of the run. With the GVL: a handler that reads stacks runs on the GVL's holder
/// (see "The handler"), so none reads one after this returns. The samples already taken
/// keep the stacks read then.
pub fn read_at_jobs() {
    IN_HANDLER.store(false, Release);
}

/// Whether the handler keeps its samples in batches (see "Batches"): it reads the stacks.
pub fn batching() -> bool {
    ENABLED.load(Acquire) && IN_HANDLER.load(Acquire)
}

/// Whether every thread the profiler samples in this run has a timer whose signals it takes:
/// none failed to arm, none blocks the signal (see "Batches").
pub fn all_armed() -> bool {
    COUNTERS.arm_failures.load(Relaxed) == 0 && COUNTERS.blocked.load(Relaxed) == 0
}

/// Before an `exec` on the calling thread: no signal of ours is left to reach the new image
/// (see "Exec"). Returns how many pending ones it took.
pub fn prepare_exec() -> u64 {
    timers::prepare_exec()
}

/// After an `exec` that failed: the threads are armed again.
pub fn resume_after_exec() {
    timers::resume_after_exec();
}

/// Keeps our ticks from a handler that is not ours (see "Our signal"). `taken` is a signal the
/// program is about to take (its `trap`), or 0 to check whether something replaced our handler
/// on the signal in use (`sigaction`). If so, moves to another free real-time signal, or stops
/// signal sampling if none is free. Returns what it did (None: nothing to do), which
/// [`signal_taken`] keeps for the run.
pub fn keep_signal(taken: i32) -> Option<String> {
    let signo = rt_signal::signal();
    if !ENABLED.load(Acquire) || signo == 0 {
        return None;
    }
    let replaced = !rt_signal::still_ours();
    if taken != signo && !replaced {
        return None;
    }
    let how = if replaced { "replaced our handler" } else { "traps it" };
    let old = signal_name(signo);
    let what = match rt_signal::move_to_free(signo) {
        Ok(new) => {
            let failed = timers::retarget_all(new);
            COUNTERS.moves.fetch_add(1, Relaxed);
            let lost = if failed > 0 {
                format!(" ({failed} threads could not be moved: sampled at their passes)")
            } else {
                String::new()
            };
            format!("the program {how} ({old}): ticks moved to {}{lost}", signal_name(new))
        }
        Err(e) => {
            let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
            disarm_all_locked();
            ENABLED.store(false, Release);
            format!("the program {how} ({old}) and no other signal is free ({e}): signal sampling stopped")
        }
    };
    let mut kept = SIGNAL_TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    *kept = Some(match kept.take() {
        Some(before) => format!("{before}; then {what}"),
        None => what.clone(),
    });
    Some(what)
}
