//! What the handler, the arming and the trigger's looks counted: `Profiler#stats[:signals]`.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the handler did, for `stats`. Counted per run ([`start`] clears them).
///
/// [`start`]: super::start
pub struct Counters {
    pub signals: AtomicU64,
    /// Perf-event ticks (`perf_ticks`), of all the signals.
    pub perf_ticks: AtomicU64,
    /// Signals of ours that none of our timers or events sent (a `kill`, a `sigqueue`).
    pub foreign: AtomicU64,
    /// Threads armed with a perf event, and those whose event the kernel refused (armed
    /// with a CPU-clock timer instead).
    pub perf_threads: AtomicU64,
    pub perf_failures: AtomicU64,
    /// Our signals taken off the `exec`ing thread before an `exec` (`prepare_exec`).
    pub drained_at_exec: AtomicU64,
    /// Times the program took our signal and we moved to another (`signal_sampler`, "Our
    /// signal").
    pub moves: AtomicU64,
    /// Ticks left out by the draw (`signal_sampler`, "Which CPU ticks are samples").
    pub passed_over: AtomicU64,
    pub read_in_handler: AtomicU64,
    pub read_at_job: AtomicU64,
    /// Ticks inside the GC whose stack was read at the GC step's end (`gc_ticks`).
    pub read_at_gc_exit: AtomicU64,
    /// Ticks inside the GC whose stack was read at the job after it, under a GC leaf, where
    /// no GC_EXIT hook reads it (`gc_ticks`, Ruby < 3.3, or the safepoint mode).
    pub read_after_gc: AtomicU64,
    pub without_gvl: AtomicU64,
    pub in_gc: AtomicU64,
    pub slot_busy: AtomicU64,
    pub in_job: AtomicU64,
    pub stale: AtomicU64,
    pub arm_failures: AtomicU64,
    /// Threads armed that block the signal (a thread's mask is inherited from its creator):
    /// their ticks stay pending, and they are sampled at their passes only.
    pub blocked: AtomicU64,
    /// Most threads armed at once in the run.
    pub armed_peak: AtomicU64,
    pub dropped: AtomicU64,
    /// Ticks on a thread whose VM stack could not be walked (`vm::current_stack_walkable`: the
    /// thread was ending): no sample.
    pub unwalkable: AtomicU64,
    /// Jobs that took samples from the slots (each takes a batch or less, `signal_sampler`,
    /// "Batches").
    pub jobs: AtomicU64,
}

pub static COUNTERS: Counters = Counters {
    signals: AtomicU64::new(0),
    perf_ticks: AtomicU64::new(0),
    foreign: AtomicU64::new(0),
    perf_threads: AtomicU64::new(0),
    perf_failures: AtomicU64::new(0),
    drained_at_exec: AtomicU64::new(0),
    moves: AtomicU64::new(0),
    passed_over: AtomicU64::new(0),
    read_in_handler: AtomicU64::new(0),
    read_at_job: AtomicU64::new(0),
    read_at_gc_exit: AtomicU64::new(0),
    read_after_gc: AtomicU64::new(0),
    without_gvl: AtomicU64::new(0),
    in_gc: AtomicU64::new(0),
    slot_busy: AtomicU64::new(0),
    in_job: AtomicU64::new(0),
    stale: AtomicU64::new(0),
    arm_failures: AtomicU64::new(0),
    blocked: AtomicU64::new(0),
    armed_peak: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    unwalkable: AtomicU64::new(0),
    jobs: AtomicU64::new(0),
};

impl Counters {
    /// Every counter with its name in `stats` (the one list `clear` and the stats share).
    pub fn named(&self) -> [(&'static str, &AtomicU64); 23] {
        [
            ("signals", &self.signals),
            ("perf_ticks", &self.perf_ticks),
            ("signals_foreign", &self.foreign),
            ("perf_threads", &self.perf_threads),
            ("perf_arm_failures", &self.perf_failures),
            ("signals_drained_at_exec", &self.drained_at_exec),
            ("signal_moves", &self.moves),
            ("signals_passed_over", &self.passed_over),
            ("signals_read_in_handler", &self.read_in_handler),
            ("signals_read_at_job", &self.read_at_job),
            ("signals_read_at_gc_exit", &self.read_at_gc_exit),
            ("signals_read_after_gc", &self.read_after_gc),
            ("signals_without_gvl", &self.without_gvl),
            ("signals_in_gc", &self.in_gc),
            ("signals_slot_busy", &self.slot_busy),
            ("signals_in_job", &self.in_job),
            ("signals_stack_unwalkable", &self.unwalkable),
            ("signals_stale", &self.stale),
            ("signal_samples_dropped", &self.dropped),
            ("signal_arm_failures", &self.arm_failures),
            ("signal_blocked_threads", &self.blocked),
            ("threads_armed_peak", &self.armed_peak),
            ("signal_jobs", &self.jobs),
        ]
    }

    pub(super) fn clear(&self) {
        for (_, c) in self.named() {
            c.store(0, Relaxed);
        }
    }
}
