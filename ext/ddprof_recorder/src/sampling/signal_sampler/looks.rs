//! The trigger thread's look at the armed threads at each of its ticks, while the handler
//! keeps samples in batches (`signal_sampler`, "Batches"; `trigger`, "Batches"): whether a
//! thread stopped running since the last look, so that a wall pass has something new to
//! record of it. It reads CPU clocks and sends nothing. No GVL, no Ruby.
use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};

use super::slots::{used_slots, FREE};
use super::{batching, ENABLED};
use crate::sampling::thread_cpu::{clock_ns, cpu_clock_id};

/// What the trigger's look at the armed threads found ([`look`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct Look {
    /// A thread ran since the previous look and is not on a CPU now: it went to wait (or was
    /// displaced), so a wall pass has something new to record of it.
    pub stopped: bool,
}

/// Called by the trigger thread at each of its ticks (no GVL, no Ruby), while [`batching`]:
/// looks at each armed thread's CPU clock, twice a moment apart.
pub fn look() -> Look {
    if !ENABLED.load(Acquire) || !batching() {
        return Look::default();
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
    Look { stopped }
}
