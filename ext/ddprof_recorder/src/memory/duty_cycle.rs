//! The duty cycle of the allocation hook: a native thread that turns the NEWOBJ hook of
//! `allocations` on for random slices of time only, so that what the hook costs stays
//! under a target share of the program's time, and says how much each sample then stands for.
//!
//! # Why
//!
//! On Ruby 3.1 an enabled NEWOBJ hook, whatever it does, sends every allocation through
//! `newobj_of`'s slow path (`gc.c`: `newobj_slowpath` takes the VM lock, and
//! `gc_event_hook_prep` dispatches the event through `rb_exec_event_hooks`): a loop that does
//! nothing but allocate runs 46% slower, whatever the sampling interval (bench/RESULTS.md,
//! "Allocation sampling"). Sampling fewer allocations does not help; seeing fewer of them does.
//!
//! # The schedule
//!
//! Time is cut into slots of [`SLOT`], and the slots into blocks of `every` slots. In each
//! block the hook is on for one slot, drawn uniformly: every slot is on with probability
//! `1 / every`, each block's draw on its own. An allocation is then seen with probability
//! `1 / every`, whatever the program does, and a sample that stands for `step` seen
//! allocations stands for `step * every` in all (Horvitz–Thompson: the estimate stays
//! unbiased). One slot per block, rather than a coin per slot, keeps the number of slots seen
//! fixed: on a steady program the estimate does not wander with how many came up on. Two
//! things would make the probability depend on the program, and are handled:
//!
//! - **An on-slot runs the program slower** (the hook's cost), so it would cover less of the
//!   program than an off-slot: allocation-heavy code would be seen less often than the rest
//!   (a loop that only allocates, about 1/1.46 as often). So an on-slot lasts [`SLOT`] plus
//!   what the hook cost in it, `hook_cost_ns` times the allocations it saw plus the time of
//!   the allocation jobs: it covers one slot of the program as it would run without the hook.
//!   The block is lengthened the same way by all the hook cost in it, also after the on-slot
//!   (a C method that allocates without an interrupt check keeps the hook on until it
//!   returns). What the hook costs an allocation is measured when sampling starts, then on
//!   the program itself (`hook_cost`). The edges' timing matters as much: see [`run`].
//! - **The hook is switched by a postponed job**, at the next interrupt check of the thread
//!   holding the GVL, not at the slot's edge. The hook's state at any moment is then that of
//!   the slot in which the last interrupt check fell: a moment the program picks, but a draw
//!   it cannot see, so still on with probability `1 / every`. The job ([`job`]) copies the
//!   `every` of that draw with it ([`DESIRED`] holds it), and samples take their weight from
//!   it (`allocations::see`).
//!
//! # How many slots a block has
//!
//! `every = ceil(overhead / target)`, within 1..=[`MAX_EVERY`], where `overhead` is what the
//! hook cost in a block against the CPU the program used in it (less that cost), times
//! `every` (the slowdown while on, less 1; at most [`MAX_OVERHEAD`], smoothed over the
//! blocks). It is set before each block is drawn, from the blocks before it, so each slot's
//! probability is known when it is drawn: that keeps the estimate unbiased. A program that
//! allocates little gets `every = 1`: the hook stays on and sees every allocation, as without
//! the duty cycle.
//!
//! # Calling Ruby from this thread
//!
//! The thread calls one Ruby function, `rb_postponed_job_register_one`, only when the hook's
//! state must change: sound from a thread Ruby does not know since Ruby 3.1, and registered
//! with the bug #19991 decoy data, both as for the trigger (see `trigger`'s module doc).
use std::ffi::c_void;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use magnus::{rb_sys::AsRawValue, value::LazyId, Error, RHash, Ruby};

use crate::memory::{allocations, hook_cost};
use crate::sampling::native_thread::NativeThread;
use crate::sampling::random::Jitter;

/// The length of a slot, in the program's time. Each on-slot costs more than its hook's
/// allocations (a cost `hook_cost`'s ledger does not see), so shorter slots cost more; longer
/// ones are fewer, and the estimate wanders more. 2 ms is the shortest whose cost stayed near
/// the target (bench/RESULTS.md, "Allocation sampling": 1, 2 and 4 ms).
pub const SLOT: Duration = Duration::from_millis(2);
/// The most slots in a block: at least one slot in this many is seen (a block of 128 ms).
/// Enough for the target: the most the hook was measured to slow a program while on, 46% (an
/// allocation-only loop, bench/RESULTS.md), needs `every` 23 at 2%. Longer blocks are fewer,
/// and each on-slot stands for more of the program.
pub const MAX_EVERY: u64 = 64;
/// The most a block's measure may say the hook slows the program while on (its slowdown,
/// less 1): a GC that runs inside an allocation job counts as that job's time, though it would
/// have run anyway, and one such block must not send `every` to its largest.
const MAX_OVERHEAD: f64 = 2.0;
/// Weight of the newest block in the smoothed overhead, and of the newest on-slot in the
/// smoothed lateness of its end.
const SMOOTHING: f64 = 0.2;
/// The most the hook's cost may lengthen an on-slot: [`MAX_OVERHEAD`] slots, the slowdown it
/// stands for. Each wake-up lengthens the slot by what the hook cost since the last, so a cost
/// that grows as fast as the clock would never let it end (a high calibration on a loaded CI
/// machine against a loop that allocates as fast: the hook stayed on for the whole run,
/// bench/RESULTS.md). A block may be lengthened by twice this: its on-slot's, and a C
/// method's that keeps the hook on after it.
const MAX_LENGTHENING: Duration = Duration::from_millis(2 * MAX_OVERHEAD as u64);

/// What the hook should be: 0 for off, else the `every` of the block whose slot put it on.
/// Written by the thread, read by the job.
static DESIRED: AtomicU64 = AtomicU64::new(0);
/// Whether the latest start has a duty cycle, and what its calibration found (`f64` bits).
static IN_USE: AtomicBool = AtomicBool::new(false);
static CALIBRATED_NS: AtomicU64 = AtomicU64::new(0);
/// For stats: the thread's time with the hook wanted on (added at each on-slot's end), when it
/// started and ended (the monotonic clock; 0: still running), and the latest `every`.
static ON_NS: AtomicU64 = AtomicU64::new(0);
static BEGUN_NS: AtomicU64 = AtomicU64::new(0);
static ENDED_NS: AtomicU64 = AtomicU64::new(0);
static EVERY: AtomicU64 = AtomicU64::new(1);

static THREAD: NativeThread = NativeThread::new();

/// Makes the job ready to be triggered. Once, at load, with the GVL.
pub fn init() {
    crate::vm::postponed::prepare(job);
}

/// A run's duty cycle.
pub struct Setup {
    /// The share of the program's time the hook may cost, in (0, 1).
    pub target: f64,
    /// What the hook costs an allocation, as calibrated at start (`hook_cost::calibrate`).
    pub hook_cost_ns: f64,
}

/// Starts a run's duty cycle, called last by the start of allocation sampling, with the GVL
/// (the hook is on): with a setup, the hook is wanted on at once (`every = 1` until the first
/// on-slot is measured) and the thread starts; without one, the run has none and the hook
/// stays on.
pub fn start(setup: Option<Setup>) -> std::io::Result<()> {
    // On, seeing everything, until the thread says otherwise (a job queued by an earlier run
    // then finds nothing to change).
    DESIRED.store(1, Ordering::Release);
    let calibrated = setup.as_ref().map_or(0.0, |setup| setup.hook_cost_ns);
    CALIBRATED_NS.store(calibrated.to_bits(), Ordering::Relaxed);
    IN_USE.store(setup.is_some(), Ordering::Release);
    let Some(setup) = setup else { return Ok(()) };
    hook_cost::start(program_cpu_ns(), total_allocated());
    for counter in [&ON_NS, &ENDED_NS] {
        counter.store(0, Ordering::Relaxed);
    }
    BEGUN_NS.store(monotonic_ns(), Ordering::Relaxed);
    EVERY.store(1, Ordering::Relaxed);
    THREAD.start("ddprof-allocwin", move |stop| run(&setup, stop))
}

pub fn stop() {
    THREAD.stop();
}

/// The job: turns the hook on or off as the thread wants ([`DESIRED`]), with the `every` of
/// the block that put it on, and tells `hook_cost`'s ledger what the state it ends saw. Never
/// unwinds.
unsafe extern "C" fn job(_data: *mut c_void) {
    let _ = catch_unwind(|| {
        // A job queued by a run that has stopped may run in the next one: it must not turn
        // off the hook of a run without a duty cycle.
        if !IN_USE.load(Ordering::Acquire) || !allocations::live() {
            return;
        }
        let (on, every) = allocations::seen();
        hook_cost::switched(on, every, program_cpu_ns(), total_allocated());
        allocations::see(DESIRED.load(Ordering::Acquire));
    });
}

/// Ruby's count of the objects allocated so far (`GC.stat(:total_allocated_objects)`), GVL
/// held.
fn total_allocated() -> u64 {
    static KEY: LazyId = LazyId::new("total_allocated_objects");
    let Ok(ruby) = Ruby::get() else { return 0 };
    let key =
        magnus::symbol::IntoSymbol::into_symbol_with(LazyId::get_inner_with(&KEY, &ruby), &ruby);
    // SAFETY: GVL held; with a Symbol key `rb_gc_stat` only reads the counter (Ruby 3.1
    // `gc.c`, `gc_stat_internal`): no allocation, no raise for a key it knows.
    unsafe { rb_sys::rb_gc_stat(key.as_raw()) as u64 }
}

/// Adds the duty cycle's part of `Profiler._native_allocations_stats` to `hash`: the
/// calibrated cost, and for a run with a duty cycle what it did.
pub fn add_stats(ruby: &Ruby, hash: RHash) -> Result<(), Error> {
    let calibrated = f64::from_bits(CALIBRATED_NS.load(Ordering::Relaxed));
    let duty = IN_USE.load(Ordering::Relaxed).then(|| stats(calibrated));
    hash.aset(ruby.to_symbol("hook_cost_calibrated_ns"), calibrated)?;
    hash.aset(ruby.to_symbol("hook_cost_ns"), duty.as_ref().map_or(0.0, |d| d.hook_cost_ns))?;
    hash.aset(ruby.to_symbol("hook_on_share"), duty.as_ref().map_or(1.0, |d| d.on_share))?;
    hash.aset(ruby.to_symbol("seen_every"), duty.as_ref().map_or(1, |d| d.every))?;
    hash.aset(ruby.to_symbol("weighed_allocations"), duty.as_ref().map(|d| d.weighed))?;
    Ok(())
}

/// For stats.
struct Stats {
    /// The share of time the hook was wanted on.
    on_share: f64,
    /// The latest `every`.
    every: u64,
    /// What the hook costs an allocation, as used now.
    hook_cost_ns: f64,
    /// The allocations made while the hook was on, each times its `every` (up to the latest
    /// switch).
    weighed: u64,
}

fn stats(calibrated: f64) -> Stats {
    let ended = match ENDED_NS.load(Ordering::Relaxed) {
        0 => monotonic_ns(),
        ended => ended,
    };
    let all = ended.saturating_sub(BEGUN_NS.load(Ordering::Relaxed));
    let on = ON_NS.load(Ordering::Relaxed);
    Stats {
        on_share: if all == 0 { 1.0 } else { on as f64 / all as f64 },
        every: EVERY.load(Ordering::Relaxed),
        hook_cost_ns: hook_cost::per_alloc_ns(calibrated),
        weighed: hook_cost::weighed(),
    }
}

/// The block length a smoothed overhead calls for.
fn every_for(target: f64, overhead: f64) -> u64 {
    if overhead <= target {
        return 1;
    }
    ((overhead / target).ceil() as u64).clamp(1, MAX_EVERY)
}

/// Sets what the hook should be, and has the job apply it if that changed.
fn want(word: u64) {
    if DESIRED.swap(word, Ordering::AcqRel) != word {
        crate::vm::postponed::trigger(job);
    }
}

/// Sleeps until `deadline` (or the stop flag); false once stopped.
fn sleep_until(deadline: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// The CPU the process used, less this thread's, in nanoseconds: the program's CPU (with the
/// sampling trigger's and the Ruby sampler thread's, spread evenly over on and off periods).
/// This thread's own wake-ups fall mostly in the on-slots: counted, they made the hook look
/// dearer and the count high (bench/RESULTS.md).
fn program_cpu_ns() -> u64 {
    let process = crate::sampling::clocks::clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0);
    let own = match THREAD_TID.load(Ordering::Acquire) {
        0 => 0,
        tid => crate::sampling::clocks::thread_cpu::cpu_time_ns(tid).unwrap_or(0),
    };
    (process - own).max(0) as u64
}

/// This thread's Linux id while it runs (0: none).
static THREAD_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The hook's counters now: allocations seen, and nanoseconds of allocation jobs.
fn counters() -> (u64, u64) {
    (allocations::SEEN.load(Ordering::Relaxed), allocations::JOB_NS.load(Ordering::Relaxed))
}

/// What the hook has cost since the counters were `from`, in nanoseconds.
fn cost_since(per_alloc_ns: f64, from: (u64, u64)) -> f64 {
    let (seen, job_ns) = counters();
    seen.wrapping_sub(from.0) as f64 * per_alloc_ns + job_ns.wrapping_sub(from.1) as f64
}

/// Sleeps until `base + nominal`, lengthened by what the hook cost meanwhile, `cost()` in
/// nanoseconds (read again at each wake-up until it stops growing, or reaches `most`), and
/// ended `early`. Returns that cost (all of it, beyond `most` too), and how late the last
/// wake-up was; None once stopped.
fn sleep_lengthened(
    base: Instant,
    nominal: Duration,
    most: Duration,
    early: Duration,
    cost_now: impl Fn() -> f64,
    stop: &AtomicBool,
) -> Option<(f64, Duration)> {
    let most_ns = most.as_nanos() as f64;
    let mut cost: f64 = 0.0;
    loop {
        let lengthening = Duration::from_nanos(cost.min(most_ns) as u64);
        let deadline = (base + nominal + lengthening).checked_sub(early);
        let deadline = deadline.unwrap_or(base).max(base);
        if !sleep_until(deadline, stop) {
            return None;
        }
        let woke = Instant::now();
        let now_cost = cost_now();
        let settled = now_cost <= cost + 1_000.0 || cost >= most_ns;
        cost = now_cost;
        if settled {
            return Some((cost, woke.saturating_duration_since(deadline)));
        }
    }
}

/// The on-slot of a block of `every`: on for [`SLOT`] of the program's time, lengthened by
/// what the hook costs meanwhile (module doc), timed from when this thread turned it on and
/// ended early by how late it usually wakes (`late_ns`, updated), so that the hook is on
/// for that long on average. None once stopped.
fn on_slot(every: u64, per_alloc_ns: f64, late_ns: &mut f64, stop: &AtomicBool) -> Option<()> {
    want(every);
    let start = Instant::now();
    let early = Duration::from_nanos(late_ns.max(0.0) as u64);
    let from = counters();
    let cost_now = || cost_since(per_alloc_ns, from);
    let (_, late) = sleep_lengthened(start, SLOT, MAX_LENGTHENING, early, cost_now, stop)?;
    *late_ns += SMOOTHING * (late.as_nanos() as f64 - *late_ns);
    ON_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    Some(())
}

/// The blocks, one after the other. A block lasts `every` slots plus all that the hook cost in
/// it: in the on-slot, and after it until the job turned the hook off (a C method that
/// allocates without an interrupt check keeps it on: `JSON.parse`'s 1,400 objects). Its start
/// is where the last one ended (an absolute deadline: a late wake-up shortens what follows
/// instead of lengthening the block). The on-slot is timed from this thread's actual wake-up
/// instead, and ends early by the usual lateness of its end: this thread wakes later after a
/// long sleep than after a short one, so on absolute deadlines the hook was on less than
/// meant, and on deadlines from each wake-up more (docs/profiler.md, "The duty cycle"). What
/// the hook cost in the block, against the CPU the program used in it, times `every`, is its
/// cost while on: what sizes the next blocks.
fn run(setup: &Setup, stop: &AtomicBool) {
    // SAFETY: gettid has no preconditions and cannot fail.
    THREAD_TID.store(unsafe { libc::gettid() }, Ordering::Release);
    run_blocks(setup, stop);
    THREAD_TID.store(0, Ordering::Release);
    ENDED_NS.store(monotonic_ns(), Ordering::Relaxed);
}

fn monotonic_ns() -> u64 {
    crate::sampling::clocks::monotonic_ns().max(0) as u64
}

fn run_blocks(setup: &Setup, stop: &AtomicBool) {
    let mut rng = Jitter::new();
    let mut every = 1u64;
    let mut overhead: Option<f64> = None;
    let mut block = Instant::now();
    let mut late_ns = 0.0;
    loop {
        let from = counters();
        let cpu_from = program_cpu_ns();
        let per_alloc_ns = hook_cost::per_alloc_ns(setup.hook_cost_ns);
        // Drawn before the block: the one slot of `every` that is on.
        let on_at = ((rng.unit() * every as f64) as u64).min(every - 1);
        if on_at > 0 {
            want(0);
            if !sleep_until(block + SLOT * on_at as u32, stop) {
                return;
            }
        }
        if on_slot(every, per_alloc_ns, &mut late_ns, stop).is_none() {
            return;
        }
        // Off for the rest of the block, even when the on-slot was its last: the block is then
        // lengthened by what the hook cost, and the hook must not keep costing meanwhile.
        // Only a block of one slot (the hook always on) has no rest.
        if every > 1 {
            want(0);
        }
        let nominal = SLOT * every as u32;
        let cost = if every > 1 {
            let most = MAX_LENGTHENING * 2;
            let cost_now = || cost_since(per_alloc_ns, from);
            match sleep_lengthened(block, nominal, most, Duration::ZERO, cost_now, stop) {
                Some((cost, _)) => cost,
                None => return,
            }
        } else {
            cost_since(per_alloc_ns, from)
        };
        let end = Instant::now();
        // Against the CPU the process used meanwhile, not the clock: a program that waits most of
        // the time and allocates hard in between must not have the hook always on (its busy
        // moments would run 46% slower), nor pay for the time it is switched out.
        let elapsed = program_cpu_ns().saturating_sub(cpu_from) as f64;
        let share = (cost / (elapsed - cost).max(1.0) * every as f64).min(MAX_OVERHEAD);
        // Far behind (this thread did not run for a while): start afresh from now.
        let planned = block + nominal + Duration::from_nanos(cost as u64);
        block = if end > planned + SLOT * 4 { end } else { planned.min(end) };
        let smoothed = overhead.map_or(share, |o| o + SMOOTHING * (share - o));
        overhead = Some(smoothed);
        every = every_for(setup.target, smoothed);
        EVERY.store(every, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cost that grows faster than the clock (here twice as fast) lengthens the slot by
    /// [`MAX_LENGTHENING`] at most: the sleep ends, with all of the cost.
    #[test]
    fn a_cost_that_outruns_the_clock_lengthens_a_slot_by_the_most_only() {
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let cost_now = || started.elapsed().as_nanos() as f64 * 2.0;
        let (cost, _) =
            sleep_lengthened(started, SLOT, MAX_LENGTHENING, Duration::ZERO, cost_now, &stop)
                .expect("not stopped");
        let took = started.elapsed();
        assert!(cost >= MAX_LENGTHENING.as_nanos() as f64, "cost {cost}");
        assert!(took >= SLOT + MAX_LENGTHENING, "slept {took:?}");
        assert!(took < Duration::from_secs(2), "slept {took:?}");
    }

    #[test]
    fn every_keeps_the_target_within_bounds() {
        assert_eq!(every_for(0.02, 0.0), 1);
        assert_eq!(every_for(0.02, 0.02), 1);
        assert_eq!(every_for(0.02, 0.5), 25);
        assert_eq!(every_for(0.02, 0.46), 23);
        assert_eq!(every_for(0.02, 100.0), MAX_EVERY);
        assert_eq!(every_for(0.02, MAX_OVERHEAD), MAX_EVERY);
    }
}
