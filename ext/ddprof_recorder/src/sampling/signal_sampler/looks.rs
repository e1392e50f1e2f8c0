//! The trigger thread's look at the armed threads at each of its ticks (`signal_sampler`,
//! "Wall ticks"): the wall ticks it sends to the threads on a CPU, and its hop off a CPU it may
//! have taken from one. No GVL, no Ruby.
use std::sync::atomic::{
    AtomicU32,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use super::counters::COUNTERS;
use super::rt_signal::{send, signal_value, KICK_BIT, SIGNO};
use super::slots::{used_slots, FREE};
use super::{batching, WallTicks, ENABLED, WALL_TICKS};
use crate::sampling::thread_cpu::{clock_ns, cpu_clock_id};

/// What the trigger's look at the armed threads found ([`kick`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct Look {
    /// The trigger has work at this rate: it sent a wall tick, or found a thread that ran but
    /// is off its CPU now (a loaded machine, where the looks make up what the CPU ticks miss).
    pub work: bool,
    /// A thread ran since the previous look and is not on a CPU now: it went to wait (or was
    /// displaced), so a wall pass has something new to record of it (`signal_sampler`,
    /// "Batches").
    pub stopped: bool,
}

/// Whether the trigger's wall ticks signal the threads at each of its ticks
/// (`signal_sampler`, "Wall ticks"); not [`WallTicks::WhenShort`], whose ticks signal only the
/// threads the CPU ticks left short.
pub fn wall_ticks() -> bool {
    ENABLED.load(Acquire) && WALL_TICKS.load(Acquire) == WallTicks::On as u8
}

/// Called by the trigger thread at each of its ticks (no GVL, no Ruby): looks at each armed
/// thread's CPU clock, and with wall ticks sends the sampling signal to each that is on a CPU
/// now: its CPU clock moved since the trigger's previous look, and again between two reads a
/// moment apart. A thread that waits (for I/O, a lock, the GVL, the scheduler) uses no CPU
/// and is left alone. Without wall ticks it only looks, and only while [`batching`].
pub fn kick() -> Look {
    let wall = WALL_TICKS.load(Acquire);
    let ticks = wall != WallTicks::Off as u8;
    if !ENABLED.load(Acquire) || !(ticks || batching()) {
        return Look::default();
    }
    // WhenShort: only a thread whose samples have not paid for its CPU (`draw::pay`). Which
    // threads that picks depends on their clocks, not on what they run: no bias.
    let when_short = wall == WallTicks::WhenShort as u8;
    let signo = SIGNO.load(Acquire);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let (mut sent, mut displaced) = (0, 0);
    for (index, slot) in used_slots().iter().enumerate() {
        if slot.state.load(Acquire) == FREE || slot.kick_pending.load(Acquire) {
            continue;
        }
        let generation = slot.generation.load(Acquire);
        let tid = slot.tid.load(Acquire);
        if tid <= 0 {
            continue;
        }
        let clock = cpu_clock_id(tid);
        let Some(first) = clock_ns(clock) else { continue };
        let last = slot.kick_cpu_ns.swap(first, AcqRel);
        if first <= last {
            continue; // no CPU since the last look: waiting
        }
        let Some(second) = clock_ns(clock) else { continue };
        slot.kick_cpu_ns.store(second, Release);
        if second <= first {
            // Not on a CPU between the two reads: gone to wait, or ready to run while another
            // thread has its CPU (this trigger itself, maybe: `signal_sampler`, "Wall ticks").
            displaced += 1;
            continue;
        }
        if !ticks {
            continue;
        }
        if when_short && second < slot.paid_cpu_ns.load(Acquire) {
            continue; // its samples pay for its CPU: the CPU ticks keep up
        }
        if slot.generation.load(Acquire) != generation {
            continue; // disarmed (or armed anew) meanwhile
        }
        slot.kick_pending.store(true, Release);
        if send(pid, tid, signo, signal_value(index, generation) | KICK_BIT) {
            COUNTERS.kicks.fetch_add(1, Relaxed);
            sent += 1;
        } else {
            slot.kick_pending.store(false, Release);
            COUNTERS.kick_failures.fetch_add(1, Relaxed);
        }
    }
    // Twice in a row: a thread that has just gone to wait also reads as run-but-not-running,
    // once (at the next tick its clock has not moved); one the trigger displaces, tick after
    // tick. Hopping at the first made the trigger hop at nearly every tick for a thread that
    // works and waits in turn, which then lost samples (bench/RESULTS.md, "Sampling rate").
    let stopped = displaced > 0;
    if !ticks {
        return Look { work: false, stopped };
    }
    if sent > 0 || displaced == 0 {
        DISPLACED_STREAK.store(0, Relaxed);
    } else if DISPLACED_STREAK.fetch_add(1, Relaxed) + 1 >= 2 {
        DISPLACED_STREAK.store(0, Relaxed);
        hop();
    }
    Look { work: sent > 0 || stopped, stopped }
}

/// Wall ticks in a row that found a thread displaced and none running (only the trigger
/// thread calls [`kick`]).
static DISPLACED_STREAK: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The trigger thread's CPUs when it first hopped (what it may run on).
    static TRIGGER_CPUS: std::cell::Cell<Option<libc::cpu_set_t>> = const { std::cell::Cell::new(None) };
}

/// Wall ticks: a thread ran since the last look but not between the two reads, and none did:
/// the trigger may have taken its CPU (the scheduler wakes the trigger where it last ran:
/// `signal_sampler`, "Wall ticks"). So the trigger moves to its other CPUs for the next tick
/// (its affinity: every CPU it may run on but this one). Each tick that finds the thread
/// running keeps it where it is.
pub(super) fn hop() {
    // SAFETY: sched_getcpu has no preconditions.
    let here = unsafe { libc::sched_getcpu() };
    if here < 0 || here as usize >= libc::CPU_SETSIZE as usize {
        return;
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let allowed = TRIGGER_CPUS.with(|cpus| {
        cpus.get().or_else(|| {
            // SAFETY: a zeroed cpu_set_t is an empty set; the kernel writes at most `size`
            // bytes into it (pid 0: the calling thread).
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            let ok = unsafe { libc::sched_getaffinity(0, size, &mut set) } == 0;
            let set = ok.then_some(set);
            cpus.set(set);
            set
        })
    });
    let Some(mut set) = allowed else { return };
    // SAFETY: `here` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_CLR(here as usize, &mut set) };
    // SAFETY: reads the set only.
    if unsafe { libc::CPU_COUNT(&set) } == 0 {
        return; // one CPU: nowhere to go
    }
    // SAFETY: a valid set of `size` bytes; pid 0 is the calling thread (the trigger). A
    // failure (a CPU taken away meanwhile) leaves the affinity as it was.
    if unsafe { libc::sched_setaffinity(0, size, &set) } == 0 {
        COUNTERS.hops.fetch_add(1, Relaxed);
    }
}
