//! Which CPU-timer ticks are samples (`signal_sampler`, "Which CPU ticks are samples"): the
//! handler's draw, and the tick it measures for it; beside a perf event (whose ticks are
//! samples at their own rate, never drawn), the CPU each sample pays for. Atomics and integer arithmetic only: the handler calls all of it.
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

/// A period of CPU: `1/hz`, in ns.
pub(super) fn period_ns() -> i64 {
    1_000_000_000 / i64::from(HZ.load(Acquire).max(1))
}

/// Periods a thread's samples may owe, or be ahead by ([`pay`]).
const CARRIED_PERIODS: i64 = 2;

/// A sample of the thread whose CPU clock reads `cpu` pays for one period of its CPU. What it
/// owes (its clock past what its samples paid for) or is ahead by is carried to its next
/// samples up to [`CARRIED_PERIODS`]. Only its own handler writes it; atomics only.
pub(super) fn pay(slot: &Slot, cpu: i64) {
    let period = period_ns();
    let carried = CARRIED_PERIODS * period;
    let paid = slot.paid_cpu_ns.load(Acquire).max(cpu - carried) + period;
    slot.paid_cpu_ns.store(paid.min(cpu + carried), Release);
}

/// With a perf event, whether the thread's CPU timer tick is a sample: its samples owe more
/// than a period of its CPU (the event missed it: CPU used in the kernel, where it never
/// overflows). In user code the event's ticks pay as they come, and the timer's are left out.
/// Which ticks it takes depends on the thread's clock only, not on what it runs.
pub(super) fn owes(slot: &Slot, cpu: i64) -> bool {
    cpu - slot.paid_cpu_ns.load(Acquire) > period_ns()
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
