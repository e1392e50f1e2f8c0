//! Which CPU-timer ticks are samples (`signal_sampler`, "Which CPU ticks are samples"): the
//! handler's draw, and the tick it measures for it. A perf-event tick is a sample at its own
//! rate and is not drawn. Atomics and integer arithmetic only: the handler calls all of it.
use std::sync::atomic::{
    AtomicI64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use super::slots::Slot;
use super::HZ;

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
