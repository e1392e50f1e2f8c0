//! The GVL hook's clock: the CPU's time-stamp counter where the kernel keeps time with it,
//! else `CLOCK_MONOTONIC`. The hook reads a clock twice a GVL hand-over (READY and RESUMED,
//! `gvl_events.rs`), and that read was most of its cost: `clock_gettime` through the vDSO is
//! a `rdtsc` plus the kernel's seqlock and scaling (16 ns here, in a loop), a bare `rdtsc` 7 ns.
//! So the hook stores ticks, and only the sampler's take turns a count of them into ns.
//!
//! # When the counter is used
//!
//! On x86-64 when the kernel's clocksource is `tsc` (`/sys/devices/system/clocksource/
//! clocksource0/current_clocksource`) and the CPU says its counter runs at one rate in every
//! power state (`constant_tsc` and `nonstop_tsc` in `/proc/cpuinfo`): the kernel then trusts it
//! to be in step across CPUs (it checks at boot and falls back to another clocksource if not),
//! so a wait that starts on one CPU and ends on the other is measured right. Anywhere else a
//! tick is a ns of `CLOCK_MONOTONIC`. The choice is made once, at [`init`].
//!
//! # From ticks to ns
//!
//! [`to_ns`] scales by the counter's rate measured since [`init`]: ticks and monotonic ns
//! elapsed since then, both read at each conversion. Each such pair is read as a counter read
//! between two clock reads at most [`PAIR_NS`] apart (a few tries, so that a thread switched
//! out between them does not skew it), so the rate is good to 1 in 10,000 once 0.1 ms have
//! passed since `init` (the sampler's first take comes a sampling period later), and better
//! after.
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Once;

use crate::sampling::clocks::monotonic_ns;

/// Whether ticks are the time-stamp counter's (set once, by [`init`]).
static TSC: AtomicBool = AtomicBool::new(false);
/// The counter and the monotonic clock read together at [`init`].
static ORIGIN_TICKS: AtomicU64 = AtomicU64::new(0);
static ORIGIN_NS: AtomicI64 = AtomicI64::new(0);

/// How far apart the two clock reads around a counter read may be for [`pair`] to take it.
const PAIR_NS: i64 = 10_000;

/// Picks the clock (once a process; a forked child keeps its parent's: the counter goes on).
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let tsc = cfg!(target_arch = "x86_64") && kernel_uses_tsc();
        if tsc {
            let (ticks, ns) = pair();
            ORIGIN_TICKS.store(ticks, Ordering::Relaxed);
            ORIGIN_NS.store(ns, Ordering::Relaxed);
        }
        TSC.store(tsc, Ordering::Relaxed);
    });
}

/// The time in ticks, never 0 (0 means "not waiting" to the hook). From any thread, lock-free.
#[inline]
pub fn now() -> u64 {
    let ticks = if TSC.load(Ordering::Relaxed) { read_tsc() } else { monotonic_ns() as u64 };
    ticks.max(1)
}

/// `ticks` (a count of them, not a time) in ns.
pub fn to_ns(ticks: u64) -> u64 {
    if !TSC.load(Ordering::Relaxed) {
        return ticks;
    }
    let (now_ticks, now_ns) = pair();
    let elapsed_ticks = now_ticks.saturating_sub(ORIGIN_TICKS.load(Ordering::Relaxed));
    let elapsed_ns = now_ns - ORIGIN_NS.load(Ordering::Relaxed);
    if elapsed_ticks == 0 || elapsed_ns <= 0 {
        return 0;
    }
    (ticks as f64 * elapsed_ns as f64 / elapsed_ticks as f64) as u64
}

/// The counter and the monotonic clock at one moment: the counter read between two clock reads,
/// with the clock's midpoint; the closest of a few tries if none is within [`PAIR_NS`].
fn pair() -> (u64, i64) {
    let mut best = (0, 0, i64::MAX);
    for _ in 0..5 {
        let before = monotonic_ns();
        let ticks = read_tsc();
        let after = monotonic_ns();
        let gap = after - before;
        if gap < best.2 {
            best = (ticks, before + gap / 2, gap);
        }
        if gap <= PAIR_NS {
            break;
        }
    }
    (best.0, best.1)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` reads a register; every x86-64 CPU has it, and Linux lets user space run
    // it (CR4.TSD clear: the vDSO's clock_gettime reads the same counter).
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    unreachable!("the counter is only chosen on x86-64")
}

/// The kernel keeps time with the time-stamp counter, which runs at one rate in all states.
fn kernel_uses_tsc() -> bool {
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo");
    match (source, cpuinfo) {
        (Ok(source), Ok(cpuinfo)) => source.trim() == "tsc" && invariant_tsc(&cpuinfo),
        _ => false,
    }
}

/// `/proc/cpuinfo` lists `constant_tsc` and `nonstop_tsc` among the first CPU's flags.
fn invariant_tsc(cpuinfo: &str) -> bool {
    let Some(flags) = cpuinfo.lines().find(|line| line.starts_with("flags")) else {
        return false;
    };
    let flags = flags.split_whitespace();
    let has = |name: &str| flags.clone().any(|flag| flag == name);
    has("constant_tsc") && has("nonstop_tsc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_flags_decide_with_both_or_neither() {
        let both = "processor\t: 0\nflags\t\t: fpu tsc constant_tsc rdtscp nonstop_tsc\n";
        assert!(invariant_tsc(both));
        assert!(!invariant_tsc("flags\t\t: fpu tsc constant_tsc rdtscp\n"));
        assert!(!invariant_tsc("flags\t\t: fpu nonstop_tsc_x constant_tsc\n"));
        assert!(!invariant_tsc("processor\t: 0\n"));
    }

    #[test]
    fn ticks_come_back_as_the_ns_that_passed() {
        init();
        if !TSC.load(Ordering::Relaxed) {
            assert_eq!(to_ns(12_345), 12_345, "a tick is a ns of CLOCK_MONOTONIC");
            return;
        }
        let (t0, ns0) = pair();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (t1, ns1) = pair();
        assert!(t1 > t0);
        let measured = to_ns(t1 - t0) as f64;
        let truth = (ns1 - ns0) as f64;
        // Each pair is good to 10 µs or so unless five tries in a row were switched out; the
        // rate, over the 50 ms since `init` at least, to as much: 1% is far from both.
        assert!((measured / truth - 1.0).abs() < 0.01, "{measured} ns for {truth}");
    }
}
