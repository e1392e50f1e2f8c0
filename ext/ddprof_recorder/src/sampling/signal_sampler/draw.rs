//! Which ticks are samples (`signal_sampler`, "Which CPU ticks are samples"): the handler's
//! draw, the tick it measures for it, and with [`WallTicks::WhenShort`] the CPU each sample
//! pays for. Atomics and integer arithmetic only: the handler calls all of it.
use std::sync::atomic::{
    AtomicI64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use super::slots::Slot;
use super::{WallTicks, HZ, WALL_TICKS};

/// CPU between two ticks of a thread past which the gap is not taken into the tick's
/// estimate (the thread's first tick after it was armed, say).
const MAX_TICK_NS: i64 = 50_000_000;
/// Ticks over which the estimate of the tick averages.
const TICK_AVERAGE: i64 = 64;

/// The kernel's scheduler tick as measured: the average CPU a thread uses from one of its
/// ticks to the next (each tick a thread runs through stands for one tick of its CPU on
/// average, whatever it does between them; 0: not measured yet). Process-wide, kept across
/// runs. Not the shortest wall time between two ticks: each CPU has its own tick, so a thread
/// that moves between CPUs sees shorter gaps.
pub(super) static TICK_NS: AtomicI64 = AtomicI64::new(0);

/// The kernel's tick as measured so far, in ns (0: not yet).
pub fn tick_ns() -> i64 {
    TICK_NS.load(Acquire)
}

/// [`WallTicks::WhenShort`]: whether the thread's samples pay for a period or more of CPU it
/// has not used yet (CPU ticks drawn close together). Such a tick is left out: the wall ticks
/// make up what the CPU ticks miss, so without this the CPU ticks' lucky runs would come on
/// top (a thread would get well over `hz` quiet). Which ticks it leaves out depends on
/// the thread's clock only, not on what it runs. Atomics only (async-signal-safe).
pub(super) fn ahead(slot: &Slot, cpu: i64) -> bool {
    WALL_TICKS.load(Acquire) == WallTicks::WhenShort as u8
        && slot.paid_cpu_ns.load(Acquire) - cpu > period_ns()
}

/// A period of CPU: `1/hz`, in ns.
pub(super) fn period_ns() -> i64 {
    1_000_000_000 / i64::from(HZ.load(Acquire).max(1))
}

/// Samples a thread may owe, or be ahead by, in periods ([`pay`]).
const CARRIED_PERIODS: i64 = 2;

/// A sample of the thread whose CPU clock reads `cpu` pays for one period of its CPU. What it
/// owes (its clock past what its samples paid for) or is ahead by is carried to its next
/// samples up to [`CARRIED_PERIODS`], so that a wall tick can make up for a tick the CPU
/// timer missed, while neither a long stretch without GVL nor a run of lucky CPU ticks
/// decides its rate for long. Only its own handler writes it; atomics only
/// (async-signal-safe).
pub(super) fn pay(slot: &Slot, cpu: i64) {
    let period = period_ns();
    let carried = CARRIED_PERIODS * period;
    let paid = slot.paid_cpu_ns.load(Acquire).max(cpu - carried) + period;
    slot.paid_cpu_ns.store(paid.min(cpu + carried), Release);
}

/// Whether this tick is a sample: each is, independently, with probability `hz * tick`
/// (1 when `hz` is at or above the kernel's tick rate). Also measures the tick. Only atomics
/// and integer arithmetic: async-signal-safe.
pub(super) fn drawn(slot: &Slot, cpu_ns: i64) -> bool {
    let last = slot.last_tick_cpu_ns.swap(cpu_ns, AcqRel);
    let used = cpu_ns - last;
    if last > 0 && used > 0 && used <= MAX_TICK_NS {
        // Racy across threads on other CPUs (a lost update only slows the average down).
        let tick = TICK_NS.load(Acquire);
        let next = if tick == 0 { used } else { tick + (used - tick) / TICK_AVERAGE };
        TICK_NS.store(next.max(1), Release);
    }
    let tick = TICK_NS.load(Acquire);
    if tick <= 0 {
        return true; // not measured yet: every tick (the rate is then at most the tick's)
    }
    // P = hz * tick / 1e9, as a fraction of 2^64.
    let threshold = (u128::from(HZ.load(Acquire)) * tick as u128 * (1u128 << 64)) / 1_000_000_000;
    if threshold >= 1 << 64 {
        return true;
    }
    let mut x = slot.random.load(Relaxed);
    let drawn = crate::sampling::random::step(&mut x);
    slot.random.store(x, Relaxed);
    u128::from(drawn) < threshold
}
