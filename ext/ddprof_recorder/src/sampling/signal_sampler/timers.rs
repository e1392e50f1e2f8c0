//! Arming a thread: a slot, and its ticks: a perf event on its CPU clock (`perf_ticks`,
//! `signal_sampler`, "Perf-event ticks") where the run has them, else a timer on its CPU clock
//! that signals it at every scheduler tick it runs through ("CPU ticks"); disarming it,
//! forgetting a parent's timers and events in a forked child, pointing every thread's ticks
//! at another signal ([`retarget_all`]), and taking them all away for an `exec`
//! ([`prepare_exec`]). With the GVL, under [`ARMING`].
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::Mutex;

use super::counters::COUNTERS;
use super::perf_ticks;
use super::rt_signal::{blocks_signal, drain_pending, signal_value, BlockedHere, SIGNO};
use super::samples::{drain_slot, KEPT};
use super::slots::{
    armed, used_slots, Frames, Slot, ARMED, DEPTH, EMPTY, FREE, FULL, NO_TIMER, SLOTS, SLOTS_USED,
    WRITING,
};
use super::tick_choice::period_ns;
use super::PERF;
use crate::sampling::clocks::clock_ns;
use crate::sampling::clocks::thread_cpu::cpu_clock_id;

/// The CPU timers' period: far below any scheduler tick (1 to 10 ms), so that a timer has
/// expired at every tick its thread runs through (`signal_sampler`, "Which CPU ticks are
/// samples").
pub(super) const PROBE_PERIOD_NS: i64 = 10_000;

/// The fork generation the slots' timers were made in.
static SLOTS_GENERATION: AtomicU64 = AtomicU64::new(0);
/// Taken (with the GVL) around arming and disarming, so that two never race for a slot.
pub(super) static ARMING: Mutex<()> = Mutex::new(());
/// Between [`prepare_exec`] and [`resume_after_exec`]: the threads that were armed, and those
/// asked for meanwhile, to arm again if the `exec` fails (None: no `exec` under way).
static PAUSED: Mutex<Option<Vec<i32>>> = Mutex::new(None);

/// The threads found blocking our signal (at [`arm`], or armed: `armed_watch::take_masked`), each
/// counted once in `signal_blocked_threads` however often it is tried again while it blocks
/// it. At most [`MAX_BLOCKED`] kept.
static BLOCKED: Mutex<Vec<i32>> = Mutex::new(Vec::new());
const MAX_BLOCKED: usize = 1024;

/// Counts `tid` in `signal_blocked_threads` unless it is counted already.
pub(super) fn count_blocked(tid: i32) {
    let mut blocked = BLOCKED.lock().unwrap_or_else(|p| p.into_inner());
    if blocked.contains(&tid) {
        return;
    }
    if blocked.len() >= MAX_BLOCKED {
        blocked.remove(0);
    }
    blocked.push(tid);
    COUNTERS.blocked.fetch_add(1, Relaxed);
}

/// `tid` no longer blocks our signal (or is another thread with its id): counted again if it
/// blocks it later.
fn forget_blocked(tid: i32) {
    BLOCKED.lock().unwrap_or_else(|p| p.into_inner()).retain(|&t| t != tid);
}

/// In a forked child, the slots describe the parent's timers, which the child does not have:
/// forget them (no `timer_delete`: the ids mean nothing here). Called with [`ARMING`].
pub(super) fn forget_if_forked() {
    let generation = crate::recorder::fork::fork_generation();
    if SLOTS_GENERATION.swap(generation, AcqRel) == generation {
        return;
    }
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
    BLOCKED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    *PAUSED.lock().unwrap_or_else(|p| p.into_inner()) = None;
    for slot in &SLOTS {
        slot.generation.fetch_add(1, AcqRel);
        slot.timer.store(NO_TIMER, Release);
        // The child's copies of the parent's events (their signals go to the parent's
        // threads): closed, once each is checked to be one still.
        let fd = slot.perf_fd.swap(-1, AcqRel);
        if fd >= 0 && perf_ticks::is_event(fd) {
            perf_ticks::close(fd);
        }
        slot.tid.store(0, Release);
        slot.state.store(FREE, Release);
        for buffer in &slot.buffers {
            buffer.state.store(EMPTY, Release);
        }
    }
}

/// Arms the thread `tid` (a thread of this process, with the GVL held): a perf event, or a
/// CPU-time timer that expires at every scheduler tick the thread runs through. Returns
/// `Some(true)` if armed (or already, or to be armed once an `exec` under way has failed),
/// `Some(false)` when it cannot be (all slots taken, or the kernel refused), None when the
/// thread blocks our signal; each counted.
pub fn arm(tid: i32) -> Option<bool> {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    if let Some(paused) = PAUSED.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        paused.push(tid);
        return Some(true);
    }
    if used_slots().iter().any(|s| s.state.load(Acquire) != FREE && s.tid.load(Acquire) == tid) {
        return Some(true);
    }
    // A thread that blocks our signal would take none of its ticks: it is left to the passes
    // (`signal_sampler`, "Threads that block our signal").
    if blocks_signal(tid, SIGNO.load(Acquire)) {
        count_blocked(tid);
        return None;
    }
    forget_blocked(tid);
    let armed = arm_locked(tid);
    if armed {
        COUNTERS.armed_peak.fetch_max(self::armed() as u64, Relaxed);
    } else {
        COUNTERS.arm_failures.fetch_add(1, Relaxed);
    }
    Some(armed)
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
    slot.tid.store(tid, Release);
    slot.in_job.store(false, Release);
    slot.last_tick_cpu_ns.store(0, Release);
    let seed = (clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(1) as u64) ^ ((tid as u64) << 32);
    slot.random.store(seed | 1, Release);
    // The trigger's first look can then tell whether the thread runs.
    let cpu_now = clock_ns(cpu_clock_id(tid)).unwrap_or(0);
    slot.look_cpu_ns.store(cpu_now, Release);
    slot.heard_cpu_ns.store(cpu_now, Release);
    slot.mask_read_cpu_ns.store(cpu_now, Release);
    slot.masked.store(false, Release);
    // A perf event's first overflow comes after a random part of a period (its phase): a
    // thread that uses less than a period of CPU in all is then sampled with a chance in
    // proportion to it, where a first overflow after a whole period never sampled it (100
    // threads that each waited on a Queue, then burned 10 ms at 99 Hz: 78% of the profile's
    // CPU on Queue#pop, at their ends). Its CPU timer has the same phase: its samples are
    // paid as if the last one came a period before the event's first (`tick_choice::pay`), so a
    // thread that burns its CPU in the kernel is drawn the same way.
    let period = period_ns();
    let mut random = slot.random.load(Relaxed);
    let first = 1 + (crate::sampling::random::step(&mut random) % period as u64) as i64;
    slot.random.store(random, Relaxed);
    slot.paid_cpu_ns.store(cpu_now.saturating_add(first - period), Release);
    // With perf events, the CPU timer too: it makes up for the CPU the thread uses in the
    // kernel, where the event never overflows (`signal_sampler`, "Perf-event ticks").
    let Some(timer) = new_timer(tid, signo, index, generation) else {
        slot.tid.store(0, Release);
        return false;
    };
    slot.timer.store(timer as usize, Release);
    if PERF.load(Acquire) {
        match perf_ticks::open(tid, first as u64, signo) {
            Ok(fd) => {
                slot.perf_phased.store(false, Release);
                slot.perf_fd.store(fd, Release);
                COUNTERS.perf_threads.fetch_add(1, Relaxed);
            }
            // Refused for this thread (a descriptor limit, say): its CPU timer alone.
            Err(_) => {
                COUNTERS.perf_failures.fetch_add(1, Relaxed);
            }
        }
    }
    slot.state.store(ARMED, Release);
    let fd = slot.perf_fd.load(Acquire);
    if fd >= 0 {
        // Enabled once the handler can find the slot by its descriptor.
        perf_ticks::refresh(fd);
    }
    if !start_timer(timer) {
        disarm_slot(slot);
        return false;
    }
    true
}

/// A timer on thread `tid`'s CPU clock whose signal `signo` carries the slot's index and
/// generation, not started yet.
fn new_timer(tid: i32, signo: i32, index: usize, generation: u32) -> Option<libc::timer_t> {
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
    let created = unsafe { libc::timer_create(cpu_clock_id(tid), &mut event, &mut timer) } == 0;
    created.then_some(timer)
}

/// Starts `timer` with the probe period (`signal_sampler`, "Which CPU ticks are samples").
fn start_timer(timer: libc::timer_t) -> bool {
    let spec = libc::itimerspec {
        it_interval: timespec(PROBE_PERIOD_NS),
        it_value: timespec(PROBE_PERIOD_NS),
    };
    // SAFETY: `timer` was created by `new_timer`; `spec` is a valid itimerspec.
    unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) == 0 }
}

/// Points every armed thread's ticks at `signo` (the signal moved, `signal_sampler`, "Our
/// signal"): a perf event's `F_SETSIG`, a CPU timer made anew (a timer's signal cannot be
/// changed). Returns how many threads could not be (disarmed: sampled at their passes).
pub(super) fn retarget_all(signo: i32) -> usize {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    let mut failed = 0;
    for (index, slot) in used_slots().iter().enumerate() {
        if slot.state.load(Acquire) == FREE {
            continue;
        }
        let fd = slot.perf_fd.load(Acquire);
        if fd >= 0 {
            if perf_ticks::retarget(fd, signo) {
                // Its last overflow's signal may have gone to the program's handler (or been
                // ignored), and no handler of ours enabled it again: enabled now (if it was
                // still enabled, its limit is two overflows from here on: `perf_ticks`).
                perf_ticks::refresh(fd);
            } else {
                disarm_slot(slot);
                failed += 1;
                continue;
            }
        }
        let tid = slot.tid.load(Acquire);
        let generation = slot.generation.load(Acquire);
        match new_timer(tid, signo, index, generation) {
            Some(timer) if start_timer(timer) => {
                let old = slot.timer.swap(timer as usize, AcqRel);
                if old != NO_TIMER {
                    // SAFETY: a timer this process created for this slot.
                    unsafe { libc::timer_delete(old as libc::timer_t) };
                }
            }
            other => {
                if let Some(timer) = other {
                    // SAFETY: just created, never started.
                    unsafe { libc::timer_delete(timer) };
                }
                disarm_slot(slot);
                failed += 1;
            }
        }
    }
    failed
}

/// Before an `exec` on the calling thread (with the GVL): keeps the signal from this thread,
/// disarms every thread (no timer or event of ours is left to send one), takes the signals
/// of ours still pending here, and gives the thread its mask back. What was armed is kept
/// for [`resume_after_exec`]; threads asked to be armed meanwhile wait there too. Returns
/// how many signals it took. A no-op (0) when no signal is in use.
pub(super) fn prepare_exec() -> u64 {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    let signo = SIGNO.load(Acquire);
    if signo == 0 {
        return 0;
    }
    let _blocked = BlockedHere::signal(signo);
    let mut paused = PAUSED.lock().unwrap_or_else(|p| p.into_inner());
    let tids = paused.get_or_insert_with(Vec::new);
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE {
            tids.push(slot.tid.load(Acquire));
            disarm_slot(slot);
        }
    }
    let drained = drain_pending(signo);
    COUNTERS.drained_at_exec.fetch_add(drained, Relaxed);
    drained
}

/// After an `exec` that failed (it returned): arms again what [`prepare_exec`] disarmed, if
/// sampling still runs.
pub(super) fn resume_after_exec() {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    let Some(tids) = PAUSED.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
    if !super::ENABLED.load(Acquire) {
        return;
    }
    for tid in tids {
        if !used_slots().iter().any(|s| s.state.load(Acquire) != FREE && s.tid.load(Acquire) == tid)
            && !arm_locked(tid)
        {
            COUNTERS.arm_failures.fetch_add(1, Relaxed);
        }
    }
}

/// Forgets an `exec` under way (sampling stopped or started anew).
pub(super) fn forget_exec() {
    *PAUSED.lock().unwrap_or_else(|p| p.into_inner()) = None;
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
    let fd = slot.perf_fd.swap(-1, AcqRel);
    if fd >= 0 {
        // Closing the descriptor frees the event: no overflow after this. (A handler on
        // another thread that found the slot just before may refresh the closed number:
        // EBADF, or at worst lets another event overflow twice.)
        perf_ticks::close(fd);
    }
    let timer = slot.timer.swap(NO_TIMER, AcqRel);
    if timer != NO_TIMER {
        // SAFETY: a timer this process created (the slots of a parent's are forgotten in a
        // forked child before we get here); deleting it also drops its pending signal.
        unsafe { libc::timer_delete(timer as libc::timer_t) };
    }
    // A signal of the old timer already being handled sees another generation from here on.
    slot.generation.fetch_add(1, AcqRel);
    // Its samples are the profiler's still: kept for its next drain (with the GVL, as the
    // callers are).
    if let Ok(mut kept) = KEPT.lock() {
        drain_slot(slot, crate::sampling::clocks::thread_cpu::own_tid(), &mut |sample| {
            kept.push(sample)
        });
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
