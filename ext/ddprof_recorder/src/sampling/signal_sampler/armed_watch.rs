//! The trigger thread's looks at the armed threads: at each of its ticks while the handler
//! keeps samples in batches (`signal_sampler`, "Batches"; `trigger`, "Batches"), whether a
//! thread stopped running since the last look, so that a wall pass has something new to
//! record of it ([`watch_stops`]); and a few times a second, whether a thread that runs has
//! blocked our signal ([`watch_masks`]; `signal_sampler`, "Threads that block our signal").
//! They read CPU clocks and `/proc`, and send nothing. No GVL, no Ruby.
use std::sync::atomic::{
    AtomicBool, AtomicI64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use super::rt_signal::{blocks_signal, SIGNO};
use super::slots::{used_slots, FREE};
use super::timers::count_blocked;
use super::{batching, ENABLED};
use crate::sampling::clocks::clock_ns;
use crate::sampling::clocks::thread_cpu::cpu_clock_id;

/// How often [`watch_masks`] looks (monotonic ns).
const MASK_WATCH_NS: i64 = 50_000_000;
/// The CPU a thread uses with no tick of ours reaching it before its mask is read: ten
/// periods at 999 Hz, three at 99 Hz, and many of the kernel's ticks (1 to 10 ms), each of
/// which signals a running armed thread.
const MASK_SUSPECT_NS: i64 = 30_000_000;
/// When [`watch_masks`] last looked (only the trigger thread calls it).
static MASKS_WATCHED_NS: AtomicI64 = AtomicI64::new(0);
/// [`watch_masks`] found a thread that blocks our signal since [`take_masked`] last ran.
static MASKED_FOUND: AtomicBool = AtomicBool::new(false);

/// Called by the trigger thread at each of its ticks (no GVL, no Ruby), every
/// [`MASK_WATCH_NS`] at most: an armed thread whose CPU clock ran [`MASK_SUSPECT_NS`] past its
/// last tick has its signal mask read, and if it blocks our signal, it is marked for the
/// profiler to disarm ([`take_masked`], which counts it in `signal_blocked_threads`).
pub fn watch_masks(now_ns: i64) {
    if !ENABLED.load(Acquire) || now_ns - MASKS_WATCHED_NS.load(Relaxed) < MASK_WATCH_NS {
        return;
    }
    MASKS_WATCHED_NS.store(now_ns, Relaxed);
    let signo = SIGNO.load(Acquire);
    for slot in used_slots() {
        if slot.state.load(Acquire) == FREE || slot.masked.load(Acquire) {
            continue;
        }
        let tid = slot.tid.load(Acquire);
        let Some(cpu) = (tid > 0).then(|| clock_ns(cpu_clock_id(tid))).flatten() else {
            continue;
        };
        // Read again only after as much CPU again: a thread that runs in the kernel a while
        // with its ticks late is not read at every look.
        if cpu - slot.heard_cpu_ns.load(Acquire) < MASK_SUSPECT_NS
            || cpu - slot.mask_read_cpu_ns.load(Acquire) < MASK_SUSPECT_NS
        {
            continue;
        }
        slot.mask_read_cpu_ns.store(cpu, Release);
        if blocks_signal(tid, signo) && !slot.masked.swap(true, AcqRel) {
            MASKED_FOUND.store(true, Release);
        }
    }
}

/// The native ids of the armed threads [`watch_masks`] found blocking our signal since the
/// last call (with the GVL: the profiler then disarms them), or None if none.
pub fn take_masked() -> Option<Vec<i32>> {
    if !MASKED_FOUND.swap(false, AcqRel) {
        return None;
    }
    let tids: Vec<i32> = used_slots()
        .iter()
        .filter(|s| s.state.load(Acquire) != FREE && s.masked.load(Acquire))
        .map(|s| s.tid.load(Acquire))
        .collect();
    tids.iter().for_each(|&tid| count_blocked(tid));
    Some(tids)
}

/// What the trigger's look at the armed threads found ([`watch_stops`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct Stops {
    /// A thread ran since the previous look and is not on a CPU now: it went to wait (or was
    /// displaced), so a wall pass has something new to record of it.
    pub stopped: bool,
}

/// Called by the trigger thread at each of its ticks (no GVL, no Ruby), while [`batching`]:
/// looks at each armed thread's CPU clock, twice a moment apart.
pub fn watch_stops() -> Stops {
    if !ENABLED.load(Acquire) || !batching() {
        return Stops::default();
    }
    let mut stopped = false;
    for slot in used_slots() {
        if slot.state.load(Acquire) == FREE {
            continue;
        }
        let tid = slot.tid.load(Acquire);
        if tid <= 0 {
            continue;
        }
        let clock = cpu_clock_id(tid);
        let Some(first) = clock_ns(clock) else { continue };
        let last = slot.look_cpu_ns.swap(first, AcqRel);
        if first <= last {
            continue; // no CPU since the last look: waiting
        }
        let Some(second) = clock_ns(clock) else { continue };
        slot.look_cpu_ns.store(second, Release);
        // Not on a CPU between the two reads: gone to wait, or ready to run while another
        // thread has its CPU.
        stopped |= second <= first;
    }
    Stops { stopped }
}
