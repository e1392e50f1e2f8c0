//! Arming a thread: a slot, and a timer on the thread's CPU clock that signals it at every
//! scheduler tick it runs through (`signal_sampler`, "CPU ticks"); disarming it, and
//! forgetting a parent's timers in a forked child. With the GVL, under [`ARMING`].
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::Mutex;

use super::counters::COUNTERS;
use super::draw::period_ns;
use super::rt_signal::{blocks_signal, signal_value, SIGNO};
use super::samples::{drain_slot, KEPT};
use super::slots::{
    armed, used_slots, Frames, Slot, ARMED, DEPTH, EMPTY, FREE, FULL, SLOTS, SLOTS_USED, WRITING,
};
use crate::sampling::thread_cpu::{clock_ns, cpu_clock_id};

/// The CPU timers' period: far below any scheduler tick (1 to 10 ms), so that a timer has
/// expired at every tick its thread runs through (`signal_sampler`, "Which CPU ticks are
/// samples").
pub(super) const PROBE_PERIOD_NS: i64 = 10_000;

/// The fork generation the slots' timers were made in.
static SLOTS_GENERATION: AtomicU64 = AtomicU64::new(0);
/// Taken (with the GVL) around arming and disarming, so that two never race for a slot.
pub(super) static ARMING: Mutex<()> = Mutex::new(());

/// In a forked child, the slots describe the parent's timers, which the child does not have:
/// forget them (no `timer_delete`: the ids mean nothing here). Called with [`ARMING`].
pub(super) fn forget_if_forked() {
    let generation = crate::recorder::fork::fork_generation();
    if SLOTS_GENERATION.swap(generation, AcqRel) == generation {
        return;
    }
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
    for slot in &SLOTS {
        slot.generation.fetch_add(1, AcqRel);
        slot.timer.store(0, Release);
        slot.tid.store(0, Release);
        slot.state.store(FREE, Release);
        for buffer in &slot.buffers {
            buffer.state.store(EMPTY, Release);
        }
    }
}

/// Arms the thread `tid` (a thread of this process, with the GVL held): a CPU-time timer
/// that expires at every scheduler tick the thread runs through. Returns false when it
/// cannot be armed (all slots taken, or the kernel refused), which is counted; true if armed
/// (or already).
pub fn arm(tid: i32) -> bool {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    if used_slots().iter().any(|s| s.state.load(Acquire) != FREE && s.tid.load(Acquire) == tid) {
        return true;
    }
    let armed = arm_locked(tid);
    if armed {
        COUNTERS.armed_peak.fetch_max(self::armed() as u64, Relaxed);
        if blocks_signal(tid, SIGNO.load(Acquire)) {
            COUNTERS.blocked.fetch_add(1, Relaxed);
        }
    } else {
        COUNTERS.arm_failures.fetch_add(1, Relaxed);
    }
    armed
}

fn arm_locked(tid: i32) -> bool {
    let signo = SIGNO.load(Acquire);
    let Some((index, slot)) = SLOTS.iter().enumerate().find(|(_, s)| s.state.load(Acquire) == FREE)
    else {
        return false;
    };
    if signo == 0 || tid <= 0 {
        return false;
    }
    for buffer in &slot.buffers {
        if buffer.frames.load(Acquire).is_null() {
            let frames = Box::new(Frames { frames: [0; DEPTH], lines: [0; DEPTH] });
            buffer.frames.store(Box::into_raw(frames), Release);
        }
        buffer.state.store(EMPTY, Release);
    }
    slot.written.store(0, Release);
    slot.read.store(0, Release);
    SLOTS_USED.fetch_max(index + 1, AcqRel);
    let generation = slot.generation.fetch_add(1, AcqRel).wrapping_add(1);
    // SAFETY: a zeroed sigevent is valid; the fields the kernel reads for SIGEV_THREAD_ID
    // (notify, signo, value, tid) are set below.
    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
    event.sigev_notify = libc::SIGEV_THREAD_ID;
    event.sigev_signo = signo;
    event.sigev_value = libc::sigval { sival_ptr: signal_value(index, generation) as *mut c_void };
    event.sigev_notify_thread_id = tid;
    let mut timer: libc::timer_t = std::ptr::null_mut();
    // SAFETY: `event` and `timer` are valid for the call; the kernel checks that the clock
    // is a thread of this process's (EINVAL otherwise).
    if unsafe { libc::timer_create(cpu_clock_id(tid), &mut event, &mut timer) } != 0 {
        return false;
    }
    slot.tid.store(tid, Release);
    slot.timer.store(timer as usize, Release);
    slot.in_job.store(false, Release);
    slot.last_tick_cpu_ns.store(0, Release);
    let seed = (clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(1) as u64) ^ ((tid as u64) << 32);
    slot.random.store(seed | 1, Release);
    // The trigger's first look can then tell whether the thread runs (and, for
    // `WallTicks::WhenShort`, what its samples must pay for: its CPU from now, see `pay`).
    let cpu_now = clock_ns(cpu_clock_id(tid)).unwrap_or(0);
    slot.kick_cpu_ns.store(cpu_now, Release);
    slot.paid_cpu_ns.store(cpu_now.saturating_add(period_ns()), Release);
    slot.kick_pending.store(false, Release);
    slot.state.store(ARMED, Release);
    let spec = libc::itimerspec {
        it_interval: timespec(PROBE_PERIOD_NS),
        it_value: timespec(PROBE_PERIOD_NS),
    };
    // SAFETY: `timer` was just created; `spec` is a valid itimerspec.
    if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
        disarm_slot(slot);
        return false;
    }
    true
}

fn timespec(ns: i64) -> libc::timespec {
    libc::timespec { tv_sec: (ns / 1_000_000_000) as _, tv_nsec: (ns % 1_000_000_000) as _ }
}

/// Disarms the thread `tid` if armed. With the GVL held.
pub fn disarm(tid: i32) {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE && slot.tid.load(Acquire) == tid {
            disarm_slot(slot);
        }
    }
}

pub(super) fn disarm_all_locked() {
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE {
            disarm_slot(slot);
        }
    }
}

fn disarm_slot(slot: &Slot) {
    let timer = slot.timer.swap(0, AcqRel);
    if timer != 0 {
        // SAFETY: a timer this process created (the slots of a parent's are forgotten in a
        // forked child before we get here); deleting it also drops its pending signal.
        unsafe { libc::timer_delete(timer as libc::timer_t) };
    }
    // A signal of the old timer already being handled sees another generation from here on.
    slot.generation.fetch_add(1, AcqRel);
    // Its samples are the profiler's still: kept for its next drain (with the GVL, as the
    // callers are).
    if let Ok(mut kept) = KEPT.lock() {
        drain_slot(slot, crate::sampling::job::own_tid(), &mut |sample| kept.push(sample));
    }
    // A handler on another thread may still be writing (`signal_sampler`, "The handler"): let
    // it finish.
    for buffer in &slot.buffers {
        let mut spins = 0u32;
        while buffer.state.load(Acquire) == WRITING && spins < 1_000_000 {
            std::hint::spin_loop();
            spins += 1;
        }
        if matches!(buffer.state.load(Acquire), FULL) {
            COUNTERS.dropped.fetch_add(1, Relaxed);
        }
        buffer.state.store(EMPTY, Release);
    }
    slot.tid.store(0, Release);
    slot.state.store(FREE, Release);
}
