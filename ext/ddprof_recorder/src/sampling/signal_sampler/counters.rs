//! What the handler, the arming and the trigger's looks counted: `Profiler#stats[:signals]`.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the handler did, for `stats`. Counted per run ([`start`] clears them).
///
/// [`start`]: super::start
pub struct Counters {
    pub signals: AtomicU64,
    /// Wall ticks: signals the trigger sent to running threads, and sends the kernel refused.
    pub kicks: AtomicU64,
    pub kick_failures: AtomicU64,
    /// Wall ticks after which the trigger moved off its CPU ([`hop`](super::looks::hop)).
    pub hops: AtomicU64,
    /// Ticks left out by the draw (`signal_sampler`, "Which CPU ticks are samples").
    pub passed_over: AtomicU64,
    /// [`WallTicks::WhenShort`]: CPU ticks drawn but left out, the thread's samples being a
    /// period or more ahead of its CPU ([`ahead`]).
    ///
    /// [`WallTicks::WhenShort`]: super::WallTicks::WhenShort
    /// [`ahead`]: super::draw::ahead
    pub ahead: AtomicU64,
    pub read_in_handler: AtomicU64,
    pub read_at_job: AtomicU64,
    /// Ticks inside the GC whose stack was read at the GC step's end (`gc_ticks`).
    pub read_at_gc_exit: AtomicU64,
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
    kicks: AtomicU64::new(0),
    kick_failures: AtomicU64::new(0),
    hops: AtomicU64::new(0),
    passed_over: AtomicU64::new(0),
    ahead: AtomicU64::new(0),
    read_in_handler: AtomicU64::new(0),
    read_at_job: AtomicU64::new(0),
    read_at_gc_exit: AtomicU64::new(0),
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
    pub fn named(&self) -> [(&'static str, &AtomicU64); 20] {
        [
            ("signals", &self.signals),
            ("wall_ticks_sent", &self.kicks),
            ("wall_ticks_failed", &self.kick_failures),
            ("trigger_hops", &self.hops),
            ("signals_passed_over", &self.passed_over),
            ("signals_ahead", &self.ahead),
            ("signals_read_in_handler", &self.read_in_handler),
            ("signals_read_at_job", &self.read_at_job),
            ("signals_read_at_gc_exit", &self.read_at_gc_exit),
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
