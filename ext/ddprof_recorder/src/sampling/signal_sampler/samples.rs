//! Taking the samples out of the slots, with the GVL (`signal_sampler`, "The job" and
//! "Batches"): each gets a key of its own, under which `stack_capture` keeps its stack once
//! named.
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Mutex;

use super::counters::COUNTERS;
use super::slots::{
    is_frame_object, used_slots, Slot, BATCH, DEPTH, EMPTY, FREE, FULL, READING, READ_AFTER_GC,
    READ_AT_GC_EXIT, READ_AT_JOB,
};

/// Keys under which `stack_capture` keeps signal samples' stacks: `tid + KEY_OFFSET * (1 + n)`
/// for the thread's samples in turn (`n` in `0..KEYS_PER_THREAD`), apart from the safepoint
/// job's (`tid`, `-tid`). A sample waits under its own key until the profiler records it, so
/// a few can wait (a pass switched out holds the profiler's lock) without the next capture of
/// the same thread overwriting them.
pub const KEY_OFFSET: i64 = 1 << 32;
pub const KEYS_PER_THREAD: u32 = 16;

/// The key of a thread's `n`th signal sample (see [`KEY_OFFSET`]).
pub fn key(tid: i32, n: u32) -> i64 {
    i64::from(tid) + KEY_OFFSET * (1 + i64::from(n % KEYS_PER_THREAD))
}

/// One sample for the profiler: the thread, its CPU clock and the time at its tick, the key
/// its stack is kept under (see [`KEY_OFFSET`]) and that stack's depth (0: none kept).
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub tid: i32,
    pub cpu_ns: i64,
    pub at_ns: i64,
    pub key: i64,
    pub depth: usize,
}

/// Takes every sample waiting in the slots, oldest first for each thread, names its frames,
/// and hands it to `take`. With the GVL held, in a postponed job or a pass. `own_tid` is the
/// calling thread's id: a sample whose stack is to be read at the job (safepoint mode) is read
/// here if it is this thread's, and left waiting otherwise, for its own thread's job (the
/// handler asked for one on that thread: a job runs on the thread whose signal handler
/// triggered it). Dropping it there, as before, lost the samples of a thread whose job had not
/// run yet when another thread's did (a thread in a C call that lets go of the GVL).
pub fn drain(own_tid: i32, mut take: impl FnMut(Sample)) {
    if let Ok(mut kept) = KEPT.lock() {
        kept.drain(..).for_each(&mut take);
    }
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE {
            drain_slot(slot, own_tid, &mut take);
        }
    }
}

/// Samples taken from the slots of threads disarmed since the last [`drain`] (a thread
/// that ended, or `stop`): the profiler records them at its next drain. With the GVL.
pub(super) static KEPT: Mutex<Vec<Sample>> = Mutex::new(Vec::new());

/// [`drain`] for one slot.
pub(super) fn drain_slot(slot: &Slot, own_tid: i32, take: &mut impl FnMut(Sample)) {
    // At most a batch: the handler writes only with the GVL, which the caller holds.
    for _ in 0..BATCH {
        let read = slot.read.load(Acquire);
        let buffer = &slot.buffers[read as usize % BATCH];
        if buffer.state.compare_exchange(FULL, READING, AcqRel, Acquire).is_err() {
            break;
        }
        let tid = slot.tid.load(Acquire);
        let depth = buffer.depth.load(Acquire);
        if (depth == READ_AT_JOB || depth == READ_AFTER_GC) && tid != own_tid {
            buffer.state.store(FULL, Release);
            break;
        }
        let key = key(tid, slot.taken.fetch_add(1, AcqRel));
        let kept = if depth == READ_AT_JOB {
            // This thread's own (checked above).
            crate::sampling::stack_capture::capture_here(key)
        } else if depth == READ_AFTER_GC {
            // This thread's own, its GC over: under a GC leaf.
            crate::sampling::stack_capture::capture_here_under_gc(key)
        } else if depth == READ_AT_GC_EXIT {
            // Its GC step ended after the hook was turned off: no stack (`gc_ticks`).
            COUNTERS.in_gc.fetch_add(1, Relaxed);
            0
        } else {
            let frames = buffer.frames.load(Acquire);
            let depth = (depth as usize).min(DEPTH);
            // SAFETY: the buffer is READING: the handler does not write it, and the root
            // marks its first `depth` frames, which are alive since the handler read them
            // (marked at every GC since); we hold the GVL.
            unsafe {
                let frames = &*frames;
                let read = &frames.frames[..depth];
                let leaf =
                    usize::from(read.first() == Some(&crate::sampling::stack_capture::GC_LEAF));
                if read[leaf..].iter().all(|&f| is_frame_object(f)) {
                    crate::sampling::stack_capture::store_read_frames(
                        key,
                        &frames.frames[..depth],
                        &frames.lines[..depth],
                    )
                } else {
                    0
                }
            }
        };
        let sample = Sample {
            tid,
            cpu_ns: buffer.cpu_ns.load(Acquire),
            at_ns: buffer.at_ns.load(Acquire),
            key,
            depth: kept,
        };
        buffer.state.store(EMPTY, Release);
        slot.read.store(read.wrapping_add(1), Release);
        take(sample);
    }
}
