//! What the NEWOBJ hook of `allocations` costs an allocation, for the duty cycle, which
//! lengthens its on-slots by that cost and sizes its blocks with it (`duty_cycle`): measured
//! when sampling starts ([`calibrate`]), then on the program itself ([`Ledger`]). Figures:
//! docs/profiler.md, "The duty cycle", and bench/RESULTS.md, "Allocation sampling".
use std::sync::atomic::{AtomicU64, Ordering};

use magnus::{prelude::*, Error, RModule, Ruby, Value};

use crate::memory::allocations::{JOB_NS, SEEN};

/// The least the calibration may find: the hook does cost something (a slow path and a call).
const MIN_HOOK_COST_NS: f64 = 10.0;
/// What the hook costs an allocation of a loop of Strings on the development machine
/// (bench/RESULTS.md): the start under `GC.stress`, where nothing is calibrated.
const TYPICAL_HOOK_COST_NS: f64 = 39.0;

/// What the enabled hook costs an allocation, in nanoseconds: a run of `calibration` (Ruby
/// code that allocates) with the hook on (it counts the objects and samples none), against a
/// run with it off just before, per object the hook saw: the median of five such pairs, after
/// one run to warm up, and at least [`MIN_HOOK_COST_NS`]. Ruby code, not a loop in C: the hook
/// costs more in the interpreter's company, and an on-slot lengthened too little would see
/// allocation-heavy code too rarely (the duty cycle then measures it on the program itself,
/// [`Ledger`]). About 15 ms, with the GVL, at start.
pub fn calibrate(ruby: &Ruby, calibration: Value) -> Result<f64, Error> {
    // Under `GC.stress` every object is a full GC: the passes would take minutes. The duty
    // cycle then starts from what the hook usually costs here, and measures the program's.
    let gc = ruby.class_object().const_get::<_, RModule>("GC")?;
    if gc.funcall::<_, _, Value>("stress", ())?.to_bool() {
        return Ok(TYPICAL_HOOK_COST_NS);
    }
    let pass = |hooked: bool| -> Result<(i64, u64), Error> {
        if hooked {
            crate::memory::allocations::count_only(true);
        }
        let seen = SEEN.load(Ordering::Relaxed);
        let started = crate::sampling::clocks::thread_cpu::own_cpu_ns();
        let called = calibration.funcall::<_, _, Value>("call", ());
        let spent = crate::sampling::clocks::thread_cpu::own_cpu_ns() - started;
        crate::memory::allocations::count_only(false);
        called?;
        Ok((spent, SEEN.load(Ordering::Relaxed).wrapping_sub(seen)))
    };
    // No signal sample on this thread meanwhile: its job's CPU would be taken for the hook's
    // (held until the end).
    let _blocked = crate::sampling::signal_sampler::BlockedHere::new();
    // A first pass warms what a fresh process has not run yet (in which an object costs more
    // than twice as much: bench/RESULTS.md).
    pass(false)?;
    // The median of five paired differences: a pass that had to sweep, or was preempted,
    // moves one difference only (after a `GC.start`, the fastest off-pass was measured slower
    // than the fastest on-pass).
    let mut differences = Vec::with_capacity(5);
    let mut objects = 0;
    for _ in 0..5 {
        let (off, _) = pass(false)?;
        let (on, seen) = pass(true)?;
        differences.push(on - off);
        objects = objects.max(seen);
    }
    differences.sort_unstable();
    let measured = differences[2] as f64 / objects.max(1) as f64;
    Ok(measured.max(MIN_HOOK_COST_NS))
}

/// What the duty cycle's job saw at each switch, summed by the hook's state before it: the
/// program's CPU time (`duty_cycle::program_cpu_ns`; not the clock: on a busy machine the time
/// the Ruby thread is switched out would count, at random, for the hook or against it),
/// allocations (Ruby's `total_allocated_objects`) and, while on, time in the allocation jobs.
/// The on and off periods are placed at random, so on average they hold the same mix of the
/// program: their times per allocation differ by what the hook costs one,
/// `(on_ns - on_job_ns) / on_allocs - off_ns / off_allocs`. That is what the program's own
/// allocations cost with the hook, where the start's calibration measured Ruby code of its own
/// (and varies from run to run). Written by the job (GVL held), read by the duty cycle's
/// thread.
struct Ledger {
    at_ns: AtomicU64,
    allocs: AtomicU64,
    job_ns: AtomicU64,
    on_ns: AtomicU64,
    on_allocs: AtomicU64,
    on_job_ns: AtomicU64,
    off_ns: AtomicU64,
    off_allocs: AtomicU64,
    /// The on periods' allocations, each times its `every`: what the duty cycle estimates
    /// the program allocated in all (for stats: it has no sampling noise).
    weighed: AtomicU64,
}

static LEDGER: Ledger = Ledger {
    at_ns: AtomicU64::new(0),
    allocs: AtomicU64::new(0),
    job_ns: AtomicU64::new(0),
    on_ns: AtomicU64::new(0),
    on_allocs: AtomicU64::new(0),
    on_job_ns: AtomicU64::new(0),
    off_ns: AtomicU64::new(0),
    off_allocs: AtomicU64::new(0),
    weighed: AtomicU64::new(0),
};

/// Allocations each side needs before the ledger's cost is used instead of the calibration's.
const LEDGER_MIN_ALLOCS: u64 = 50_000;

/// Starts the ledger afresh, at the program's CPU clock `at_ns` and Ruby's allocation count
/// `allocs`.
pub fn start(at_ns: u64, allocs: u64) {
    let ledger = &LEDGER;
    for counter in [
        &ledger.on_ns,
        &ledger.on_allocs,
        &ledger.on_job_ns,
        &ledger.off_ns,
        &ledger.off_allocs,
        &ledger.weighed,
    ] {
        counter.store(0, Ordering::Relaxed);
    }
    ledger.at_ns.store(at_ns, Ordering::Relaxed);
    ledger.allocs.store(allocs, Ordering::Relaxed);
    ledger.job_ns.store(JOB_NS.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A switch of the hook, from the job: `was_on` is the state it ends (seen under `every`),
/// `at_ns` the program's CPU clock and `allocs` Ruby's allocation count now.
pub fn switched(was_on: bool, every: u64, at_ns: u64, allocs: u64) {
    let job_ns = JOB_NS.load(Ordering::Relaxed);
    let ledger = &LEDGER;
    let span = at_ns.saturating_sub(ledger.at_ns.swap(at_ns, Ordering::Relaxed));
    let made = allocs.saturating_sub(ledger.allocs.swap(allocs, Ordering::Relaxed));
    let jobs = job_ns.saturating_sub(ledger.job_ns.swap(job_ns, Ordering::Relaxed));
    if was_on {
        ledger.on_ns.fetch_add(span, Ordering::Relaxed);
        ledger.on_allocs.fetch_add(made, Ordering::Relaxed);
        ledger.on_job_ns.fetch_add(jobs, Ordering::Relaxed);
        ledger.weighed.fetch_add(made.saturating_mul(every), Ordering::Relaxed);
    } else {
        ledger.off_ns.fetch_add(span, Ordering::Relaxed);
        ledger.off_allocs.fetch_add(made, Ordering::Relaxed);
    }
}

/// What the hook costs an allocation: the ledger's measure once it has enough on both sides,
/// kept within a quarter and four times the calibration's; else the calibration's.
pub fn per_alloc_ns(calibrated: f64) -> f64 {
    let ledger = &LEDGER;
    let on_allocs = ledger.on_allocs.load(Ordering::Relaxed);
    let off_allocs = ledger.off_allocs.load(Ordering::Relaxed);
    if on_allocs < LEDGER_MIN_ALLOCS || off_allocs < LEDGER_MIN_ALLOCS {
        return calibrated;
    }
    let on = ledger.on_ns.load(Ordering::Relaxed) as f64
        - ledger.on_job_ns.load(Ordering::Relaxed) as f64;
    let off = ledger.off_ns.load(Ordering::Relaxed) as f64;
    let measured = on / on_allocs as f64 - off / off_allocs as f64;
    measured.clamp(calibrated / 4.0, calibrated * 4.0)
}

/// The allocations made while the hook was on, each times its `every` (up to the latest
/// switch).
pub fn weighed() -> u64 {
    LEDGER.weighed.load(Ordering::Relaxed)
}
