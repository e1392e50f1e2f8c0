//! The duty cycle of the allocation hook: a native thread that turns the NEWOBJ hook of
//! `allocations` on for random slices of time only, so that what the hook costs stays
//! under a target share of the program's time, and says how much each sample then stands for.
//!
//! # Why
//!
//! On Ruby 3.1 an enabled NEWOBJ hook, whatever it does, sends every allocation through
//! `newobj_of`'s slow path (`gc.c`: `newobj_slowpath` takes the VM lock, and
//! `gc_event_hook_prep` dispatches the event through `rb_exec_event_hooks`). Measured here,
//! about 40 ns an object: a loop that does nothing but allocate runs 46% slower, whatever the
//! sampling interval. Sampling fewer allocations does not help; seeing fewer of them does.
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
//!   returns). What the hook costs an allocation is measured when sampling starts
//!   (`allocations::calibrate`), then from the program itself ([`Ledger`]).
//!   The edges' timing matters as much: see [`run`].
//! - **The hook is switched by a postponed job**, at the next interrupt check of the thread
//!   holding the GVL, not at the slot's edge. The hook's state at any moment is then that of
//!   the slot in which the last interrupt check fell: a moment the program picks, but a draw
//!   it cannot see, so still on with probability `1 / every`. The job copies the `every` of
//!   that draw with it ([`DESIRED`] holds it), and samples take their weight from it.
//!
//! # How many slots a block has
//!
//! `every = ceil(overhead / target)`, within 1..=[`MAX_EVERY`], where `overhead` is what the
//! hook cost in a block against the CPU the program used in it (less that cost), times
//! `every` (the slowdown while on, less 1; at most [`MAX_OVERHEAD`], smoothed over the
//! blocks). It is set before
//! each block is drawn, from the blocks before it, so each slot's probability is known when it
//! is drawn: that keeps the estimate unbiased. A program that allocates little gets `every = 1`: the
//! hook stays on and sees every allocation, as without the duty cycle.
//!
//! # Calling Ruby from this thread
//!
//! The thread calls one Ruby function, `rb_postponed_job_register_one`, only when the hook's
//! state must change: sound from a thread Ruby does not know since Ruby 3.1, and registered
//! with the bug #19991 decoy data, both as for the trigger (see `trigger`'s module doc).
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sampling::native_thread::NativeThread;
use crate::sampling::random::Jitter;

/// The length of a slot, in the program's time. Each on-slot costs more than its hook's
/// allocations: with 1 ms slots `JSON.parse`/`JSON.generate` ran 3.6% slower at a 2% target
/// (about 200 µs a block beyond what the ledger counts), with 4 ms 1.2%, with 2 ms 2.3%;
/// longer slots are fewer, and the estimate wanders more (with 4 ms, one run of
/// bench/allocations.rb's String loop in seven counted 36% too many). Measured with
/// `bench/allocations.rb --kinds cpu,default`.
pub const SLOT: Duration = Duration::from_millis(2);
/// The most slots in a block: at least one slot in this many is seen (a block of 128 ms).
/// Enough for the target: the most the hook slowed a program while on, as measured, is 46%
/// (an allocation-only loop), which needs `every` 23 at 2%. Longer blocks are fewer, and each
/// on-slot stands for more of the program.
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
/// that grows as fast as the clock never lets it end: a calibration of 228 ns an allocation
/// (CI, Ruby 3.4.5, a loaded machine) against a loop that allocates every 200 ns or so kept
/// the hook on for the whole run (`hook_on_share` 0.0: no on-slot ever ended). A block may be
/// lengthened by twice this: its on-slot's, and a C method's that keeps the hook on after it.
const MAX_LENGTHENING: Duration = Duration::from_millis(2 * MAX_OVERHEAD as u64);

/// What the hook should be: 0 for off, else the `every` of the block whose slot put it on.
/// Written by the thread, read by the job.
pub static DESIRED: AtomicU64 = AtomicU64::new(0);
/// Allocations the hook saw (counted by the hook, with the GVL).
pub static SEEN: AtomicU64 = AtomicU64::new(0);
/// CPU nanoseconds spent in the allocation jobs (the samples' cost, paid only while on).
pub static JOB_NS: AtomicU64 = AtomicU64::new(0);
/// For stats: the thread's time with the hook wanted on (added at each on-slot's end), when it
/// started and ended (the monotonic clock; 0: still running), and the latest `every`.
static ON_NS: AtomicU64 = AtomicU64::new(0);
static BEGUN_NS: AtomicU64 = AtomicU64::new(0);
static ENDED_NS: AtomicU64 = AtomicU64::new(0);
static EVERY: AtomicU64 = AtomicU64::new(1);

static THREAD: NativeThread = NativeThread::new();

/// What the job saw at each switch, summed by the hook's state before it: the program's CPU
/// time ([`program_cpu_ns`]; not the clock: on a busy machine the time the Ruby thread is switched out would
/// count, at random, for the hook or against it; with a build running on both cores the count
/// came out 23% high), allocations
/// (Ruby's `total_allocated_objects`) and, while on, time in the allocation jobs. The on and
/// off periods are placed at random, so on average they hold the same mix of the program:
/// their times per allocation differ by what the hook costs one,
/// `(on_ns - on_job_ns) / on_allocs - off_ns / off_allocs`. That is what the program's own
/// allocations cost with the hook, where the start's calibration measured Ruby code of its
/// own (about 35 ns an allocation here, 10 to 70 from run to run, against 39 for a loop of
/// Strings and 63 to 73 for `JSON.parse`/`generate`). Written by the job (GVL held), read by
/// the thread.
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

/// A switch of the hook, from the job: `was_on` is the state it ends (seen under `every`),
/// `at_ns` the program's CPU clock ([`program_cpu_ns`]) and `allocs` Ruby's allocation count
/// now.
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
fn hook_cost_ns(calibrated: f64) -> f64 {
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

pub struct Setup {
    /// The share of the program's time the hook may cost, in (0, 1).
    pub target: f64,
    /// What the hook costs an allocation, as calibrated at start.
    pub hook_cost_ns: f64,
    /// The job that applies [`DESIRED`] (with the GVL).
    pub job: unsafe extern "C" fn(*mut c_void),
}

/// Starts the duty cycle: the hook is wanted on at once (`every = 1` until the first on-slot
/// is measured). `at_ns` and `allocs` are the program's CPU clock ([`program_cpu_ns`]) and
/// Ruby's allocation count now.
pub fn start(setup: Setup, at_ns: u64, allocs: u64) -> std::io::Result<()> {
    let ledger = &LEDGER;
    for counter in [
        &ON_NS,
        &ENDED_NS,
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
    BEGUN_NS.store(monotonic_ns(), Ordering::Relaxed);
    ledger.job_ns.store(JOB_NS.load(Ordering::Relaxed), Ordering::Relaxed);
    EVERY.store(1, Ordering::Relaxed);
    DESIRED.store(1, Ordering::Release);
    THREAD.start("ddprof-allocwin", move |stop| run(&setup, stop))
}

pub fn stop() {
    THREAD.stop();
}

/// For stats.
pub struct Stats {
    /// The share of time the hook was wanted on.
    pub on_share: f64,
    /// The latest `every`.
    pub every: u64,
    /// What the hook costs an allocation, as used now.
    pub hook_cost_ns: f64,
    /// The allocations made while the hook was on, each times its `every` (up to the latest
    /// switch).
    pub weighed: u64,
}

pub fn stats(calibrated: f64) -> Stats {
    let ended = match ENDED_NS.load(Ordering::Relaxed) {
        0 => monotonic_ns(),
        ended => ended,
    };
    let all = ended.saturating_sub(BEGUN_NS.load(Ordering::Relaxed));
    let on = ON_NS.load(Ordering::Relaxed);
    Stats {
        on_share: if all == 0 { 1.0 } else { on as f64 / all as f64 },
        every: EVERY.load(Ordering::Relaxed),
        hook_cost_ns: hook_cost_ns(calibrated),
        weighed: LEDGER.weighed.load(Ordering::Relaxed),
    }
}

/// The block length a smoothed overhead calls for.
fn every_for(target: f64, overhead: f64) -> u64 {
    if overhead <= target {
        return 1;
    }
    ((overhead / target).ceil() as u64).clamp(1, MAX_EVERY)
}

/// Sets what the hook should be, and has a job apply it if that changed.
fn want(word: u64, job: unsafe extern "C" fn(*mut c_void)) {
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
/// This thread's own wake-ups fall mostly in the on-slots; counted, they made the hook look 5
/// ns an allocation dearer, and the count 6% high.
pub fn program_cpu_ns() -> u64 {
    let process =
        crate::sampling::thread_cpu::clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0);
    let own = match THREAD_TID.load(Ordering::Acquire) {
        0 => 0,
        tid => crate::sampling::thread_cpu::cpu_time_ns(tid).unwrap_or(0),
    };
    (process - own).max(0) as u64
}

/// This thread's Linux id while it runs (0: none).
static THREAD_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The hook's counters now: allocations seen, and nanoseconds of allocation jobs.
fn counters() -> (u64, u64) {
    (SEEN.load(Ordering::Relaxed), JOB_NS.load(Ordering::Relaxed))
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
fn on_slot(
    setup: &Setup,
    every: u64,
    per_alloc_ns: f64,
    late_ns: &mut f64,
    stop: &AtomicBool,
) -> Option<()> {
    want(every, setup.job);
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
/// long sleep than after a short one (measured here: about 100 µs against 55), so on absolute
/// deadlines the hook was on 7% less than meant (`alloc-count` 9% low), and on deadlines from
/// each wake-up 5% more (4% high). What the hook cost in the block, against the CPU the program
/// used in it, times `every`, is its cost while on: what sizes the next blocks.
fn run(setup: &Setup, stop: &AtomicBool) {
    // SAFETY: gettid has no preconditions and cannot fail.
    THREAD_TID.store(unsafe { libc::gettid() }, Ordering::Release);
    run_blocks(setup, stop);
    THREAD_TID.store(0, Ordering::Release);
    ENDED_NS.store(monotonic_ns(), Ordering::Relaxed);
}

fn monotonic_ns() -> u64 {
    crate::sampling::trigger::monotonic_ns().max(0) as u64
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
        let per_alloc_ns = hook_cost_ns(setup.hook_cost_ns);
        // Drawn before the block: the one slot of `every` that is on.
        let on_at = ((rng.unit() * every as f64) as u64).min(every - 1);
        if on_at > 0 {
            want(0, setup.job);
            if !sleep_until(block + SLOT * on_at as u32, stop) {
                return;
            }
        }
        if on_slot(setup, every, per_alloc_ns, &mut late_ns, stop).is_none() {
            return;
        }
        // Off for the rest of the block, even when the on-slot was its last: the block is then
        // lengthened by what the hook cost, and the hook must not keep costing meanwhile.
        // Only a block of one slot (the hook always on) has no rest.
        if every > 1 {
            want(0, setup.job);
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
