//! The signal handler (`signal_sampler`, "The handler"), and the end of a GC step, which reads
//! the stacks of the ticks the handler kept inside the GC (`gc_ticks`). Neither allocates,
//! locks or calls Ruby.
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicBool,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use super::counters::COUNTERS;
use super::perf_ticks::{refresh, set_period};
use super::rt_signal::{poll_fd, INDEX_MASK};
use super::slots::{
    used_slots, BATCH, DEPTH, EMPTY, FREE, FULL, READ_AFTER_GC, READ_AT_GC_EXIT, READ_AT_JOB,
    SLOTS, WRITING,
};
use super::tick_choice::{drawn, owes, pay, period_ns};
use super::{ENABLED, IN_HANDLER, JOB};
use crate::sampling::clocks::clock_ns;
use crate::sampling::clocks::thread_cpu::own_cpu_ns;

/// Some slot has a sample [`READ_AT_GC_EXIT`].
static GC_TICKS_WAITING: AtomicBool = AtomicBool::new(false);

/// The signal handler. Never unwinds: it only calls functions that do not panic.
pub(super) extern "C" fn on_signal(
    _signo: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut c_void,
) {
    // SAFETY: errno is thread-local; saved and restored so the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    handle(info);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn handle(info: *mut libc::siginfo_t) {
    COUNTERS.signals.fetch_add(1, Relaxed);
    if info.is_null() {
        return;
    }
    // SAFETY: the kernel passes a valid siginfo.
    let code = unsafe { (*info).si_code };
    let (slot, perf) = if code == libc::SI_TIMER {
        // SAFETY: a timer's signal: `si_value` is the sigev_value we set in `arm`.
        let value = unsafe { (*info).si_value().sival_ptr } as usize;
        let Some(slot) = SLOTS.get(value & INDEX_MASK) else { return };
        // Meant for this thread: the timer of this slot's generation, armed for this thread
        // (`SIGEV_THREAD_ID`; a slot freed and taken again since has another generation).
        // SAFETY: gettid has no preconditions.
        if (slot.generation.load(Acquire) as usize & 0xff_ffff) != value >> 16
            || slot.tid.load(Acquire) != unsafe { libc::gettid() }
        {
            COUNTERS.stale.fetch_add(1, Relaxed);
            return;
        }
        (slot, false)
    } else if code > 0 {
        // A `POLL_*` band: `F_SETSIG`'s signal, from a perf event (`perf_ticks`).
        // SAFETY: such a signal's siginfo is `_sigpoll`.
        let fd = unsafe { poll_fd(info) };
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let found = used_slots().iter().find(|s| {
            s.state.load(Acquire) != FREE
                && s.perf_fd.load(Acquire) == fd
                && s.tid.load(Acquire) == tid
        });
        let Some(slot) = found else {
            COUNTERS.stale.fetch_add(1, Relaxed);
            return;
        };
        // After its first overflow, its whole period (`timers::arm`); then enabled again for
        // one overflow (`perf_ticks`): first, whatever becomes of this one.
        if !slot.perf_phased.swap(true, AcqRel) {
            set_period(fd, period_ns() as u64);
        }
        refresh(fd);
        COUNTERS.perf_ticks.fetch_add(1, Relaxed);
        (slot, true)
    } else {
        // A `kill`, a `sigqueue`: not a tick of ours.
        COUNTERS.foreign.fetch_add(1, Relaxed);
        return;
    };
    if !ENABLED.load(Acquire) {
        return;
    }
    let now = clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0);
    let cpu = own_cpu_ns();
    slot.heard_cpu_ns.store(cpu, Release);
    // A perf-event tick is a sample at its own rate. Beside one, a CPU timer's tick is a
    // sample when the event's fell behind the thread's CPU (`tick_choice::owes`); alone, it is
    // drawn.
    let taken = if perf {
        true
    } else if slot.perf_fd.load(Acquire) >= 0 {
        owes(slot, cpu)
    } else {
        drawn(slot, cpu)
    };
    if !taken {
        COUNTERS.passed_over.fetch_add(1, Relaxed);
        return;
    }
    if slot.in_job.load(Acquire) {
        COUNTERS.in_job.fetch_add(1, Relaxed);
        return;
    }
    // SAFETY: both only read the calling thread's and the VM's state (`signal_sampler`, "The
    // handler"); the VM is running (ENABLED is cleared by an end proc before it is torn down).
    if !unsafe { crate::vm::current_thread_holds_gvl() } {
        COUNTERS.without_gvl.fetch_add(1, Relaxed);
        return;
    }
    let in_handler = IN_HANDLER.load(Acquire);
    // SAFETY: as above.
    let in_gc = unsafe { rb_sys::rb_during_gc() } != 0;
    // Read at the GC step's end if `gc_ticks` is on; else at the job after the GC, unless
    // `gc_events` measures the GC's time (`gc: true`), which then records it: dropped.
    let at_gc_exit = in_gc && in_handler && super::gc_ticks::on();
    if in_gc && !at_gc_exit && super::gc_ticks::gc_measured() {
        COUNTERS.in_gc.fetch_add(1, Relaxed);
        return;
    }
    let written = slot.written.load(Acquire);
    let waiting = written.wrapping_sub(slot.read.load(Acquire));
    let buffer = &slot.buffers[written as usize % BATCH];
    // At the job, one sample at a time: the job reads the stack it finds then, once.
    if (!in_handler && waiting > 0)
        || buffer.state.compare_exchange(EMPTY, WRITING, AcqRel, Acquire).is_err()
    {
        // The previous samples still wait: ask for the job again (one may have been put off).
        COUNTERS.slot_busy.fetch_add(1, Relaxed);
        trigger_job();
        return;
    }
    buffer.cpu_ns.store(cpu, Release);
    buffer.at_ns.store(now, Release);
    let depth = if at_gc_exit {
        GC_TICKS_WAITING.store(true, Release);
        READ_AT_GC_EXIT
    } else if in_gc {
        COUNTERS.read_after_gc.fetch_add(1, Relaxed);
        READ_AFTER_GC
    } else if in_handler {
        // SAFETY: a Ruby thread with the GVL (checked above).
        if !unsafe { crate::vm::current_stack_walkable() } {
            COUNTERS.unwalkable.fetch_add(1, Relaxed);
            buffer.state.store(EMPTY, Release);
            return;
        }
        let frames = buffer.frames.load(Acquire);
        // SAFETY: the buffer was allocated at arm and is never freed; it is WRITING, so
        // nobody else reads or writes it.
        let frames = unsafe { &mut *frames };
        // SAFETY: reads the thread's own frames as rb_profile_frames does, with no allocation,
        // lock or system call (vm::frames, or rb_profile_frames itself): sound here
        // (`signal_sampler`, "The handler").
        let n = unsafe {
            crate::sampling::stack_capture::read_current(&mut frames.frames, &mut frames.lines)
        };
        COUNTERS.read_in_handler.fetch_add(1, Relaxed);
        n.min(DEPTH) as u32
    } else {
        COUNTERS.read_at_job.fetch_add(1, Relaxed);
        READ_AT_JOB
    };
    buffer.depth.store(depth, Release);
    pay(slot, cpu);
    buffer.state.store(FULL, Release);
    slot.written.store(written.wrapping_add(1), Release);
    // A batch waits for one job (`signal_sampler`, "Batches"); at the job, each sample has its
    // own, and so has a tick in the GC, whose stack is read at the job that follows the GC.
    if !in_handler || depth == READ_AFTER_GC || waiting as usize + 1 >= BATCH {
        trigger_job();
    }
}

/// Asks for the job given to [`start`](super::start): async-signal-safe (see `postponed`); it
/// runs on this thread, which holds the GVL, at its next interrupt check.
fn trigger_job() {
    let job = JOB.load(Acquire);
    if job != 0 {
        // SAFETY: JOB only ever holds the `postponed::Job` given to `start`.
        let job: crate::vm::postponed::Job = unsafe { std::mem::transmute(job) };
        crate::vm::postponed::trigger(job);
    }
}

/// The GC_EXIT hook (`gc_ticks`), at the end of a GC step, on the thread that ran it, with the
/// GVL: reads this thread's stack for each of its samples whose tick came inside the GC
/// ([`READ_AT_GC_EXIT`]), leaf first under [`crate::sampling::stack_capture::GC_LEAF`]. Any other
/// thread's such sample (a thread that had the GVL taken by a time slice and waits for it
/// back reads as holding it, `signal_sampler`, "The handler") gets no stack. No allocation,
/// no lock, no Ruby call.
pub fn read_gc_ticks() {
    if !GC_TICKS_WAITING.swap(false, AcqRel) {
        return;
    }
    let own_tid = crate::sampling::clocks::thread_cpu::own_tid();
    for slot in used_slots() {
        if slot.state.load(Acquire) == FREE {
            continue;
        }
        let own = slot.tid.load(Acquire) == own_tid;
        for buffer in &slot.buffers {
            if buffer.depth.load(Acquire) != READ_AT_GC_EXIT
                || buffer.state.compare_exchange(FULL, WRITING, AcqRel, Acquire).is_err()
            {
                continue;
            }
            // SAFETY: a Ruby thread with the GVL (the GC's hook).
            let depth = if own && unsafe { crate::vm::current_stack_walkable() } {
                // SAFETY: allocated at arm, never freed; WRITING, so nobody else touches it.
                let frames = unsafe { &mut *buffer.frames.load(Acquire) };
                frames.frames[0] = crate::sampling::stack_capture::GC_LEAF;
                frames.lines[0] = 0;
                // SAFETY: the thread's own frames, with the GVL, after the GC step moved
                // everything it moves (`gc_ticks`); no allocation, lock or system call.
                let n = unsafe {
                    crate::sampling::stack_capture::read_current(
                        &mut frames.frames[1..],
                        &mut frames.lines[1..],
                    )
                };
                let counter = if n == 0 { &COUNTERS.in_gc } else { &COUNTERS.read_at_gc_exit };
                counter.fetch_add(1, Relaxed);
                if n == 0 {
                    0
                } else {
                    (n + 1).min(DEPTH) as u32
                }
            } else {
                COUNTERS.in_gc.fetch_add(1, Relaxed);
                0
            };
            buffer.depth.store(depth, Release);
            buffer.state.store(FULL, Release);
        }
    }
}
