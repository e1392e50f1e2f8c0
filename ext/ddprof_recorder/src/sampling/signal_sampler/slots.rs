//! The slots: one per armed thread, with the buffers its samples wait in between the handler
//! and the job, and [`SlotsRoot`], the GC root that marks their frames meanwhile
//! (`signal_sampler`, "The handler" and "The job").
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{Acquire, Release},
};

use magnus::{gc, rb_sys::FromRawValue, DataTypeFunctions, TypedData, Value};

/// [`Slot::timer`] when the slot has no timer.
pub(super) const NO_TIMER: usize = usize::MAX;

/// Most threads armed at once; past it, a thread is sampled at the passes and its own jobs
/// (counted, and said in the profile: `Profiler#note_unarmed_threads`). Each armed thread's
/// slot holds [`BATCH`] buffers of [`DEPTH`] frames and lines, 64 KiB, kept for the process's
/// life: 16 MiB at most.
pub const MAX_SLOTS: usize = 256;
/// Deepest stack read in the handler (the root-most frames of deeper ones are left out).
pub(super) const DEPTH: usize = 1024;

/// Samples a thread's slot keeps for the profiler before its handler asks for the job
/// (`signal_sampler`, "Batches"): a busy thread then runs a job for every `BATCH` samples,
/// not for each.
pub const BATCH: usize = 4;

// A slot's states: armed or not.
pub(super) const FREE: u8 = 0;
pub(super) const ARMED: u8 = 1;
// A buffer's states.
pub(super) const EMPTY: u8 = 1;
pub(super) const WRITING: u8 = 2;
pub(super) const FULL: u8 = 3;
pub(super) const READING: u8 = 4;

/// `depth` of a sample whose stack the job must read (safepoint mode).
pub(super) const READ_AT_JOB: u32 = u32::MAX;
/// `depth` of a sample whose tick came inside the GC: its stack is read at the GC step's end
/// ([`read_gc_ticks`](super::read_gc_ticks), `gc_ticks`).
pub(super) const READ_AT_GC_EXIT: u32 = u32::MAX - 1;
/// `depth` of a sample whose tick came inside the GC where no GC_EXIT hook reads its stack:
/// the job reads it after the GC, under a GC leaf (`gc_ticks`).
pub(super) const READ_AFTER_GC: u32 = u32::MAX - 2;

/// Frames read in the handler: what `rb_profile_frames` fills.
pub(super) struct Frames {
    pub(super) frames: [rb_sys::VALUE; DEPTH],
    pub(super) lines: [i32; DEPTH],
}

/// One sample waiting in a slot: its state, the tick's CPU clock and time, and its frames.
pub(super) struct Buffer {
    pub(super) state: AtomicU8,
    /// The thread's CPU clock and the monotonic clock at the tick.
    pub(super) cpu_ns: AtomicI64,
    pub(super) at_ns: AtomicI64,
    /// Frames read, or [`READ_AT_JOB`].
    pub(super) depth: AtomicU32,
    /// Allocated at the slot's first arm, never freed (a handler may hold it).
    pub(super) frames: AtomicPtr<Frames>,
}

impl Buffer {
    const fn new() -> Self {
        Self {
            state: AtomicU8::new(EMPTY),
            cpu_ns: AtomicI64::new(0),
            at_ns: AtomicI64::new(0),
            depth: AtomicU32::new(0),
            frames: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

/// One armed thread.
pub(super) struct Slot {
    /// [`FREE`] or [`ARMED`].
    pub(super) state: AtomicU8,
    /// Bumped at each arm and disarm; the timer's signal carries it, so a signal of an earlier
    /// timer of this slot is ignored.
    pub(super) generation: AtomicU32,
    pub(super) tid: AtomicI32,
    /// The `timer_t` of its CPU-clock timer, or [`NO_TIMER`]. Not 0 for none: a
    /// `SIGEV_THREAD_ID` timer's `timer_t` is the kernel's id, and the first one a process makes
    /// is 0 (on Ruby 3.4, which makes none of its own, ours was, and was never deleted: it went
    /// on signalling after a disarm or a move).
    pub(super) timer: AtomicUsize,
    /// The descriptor of its perf event (`perf_ticks`), or -1.
    pub(super) perf_fd: AtomicI32,
    /// Its perf event overflowed once, and has its whole period since: the first overflow
    /// comes after a random part of one (`timers::arm`).
    pub(super) perf_phased: AtomicBool,
    /// Its samples, written in turn: the handler writes `buffers[written % BATCH]`, the job
    /// reads `buffers[read % BATCH]` (both with the GVL, so never at once; each buffer's state
    /// keeps them apart all the same).
    pub(super) buffers: [Buffer; BATCH],
    pub(super) written: AtomicU32,
    pub(super) read: AtomicU32,
    /// Samples taken from this slot: picks the key of the next ([`key`](super::key)).
    pub(super) taken: AtomicU32,
    /// The thread is running one of the profiler's jobs: a tick now is the profiler's CPU.
    pub(super) in_job: AtomicBool,
    /// The thread's CPU clock at its previous tick (0: none yet).
    pub(super) last_tick_cpu_ns: AtomicI64,
    /// This thread's xorshift state for the ticks' draw (`random::step`; only its own handler
    /// uses it).
    pub(super) random: AtomicU64,
    /// The thread's CPU clock when the trigger last looked at it
    /// ([`watch_stops`](super::watch_stops)).
    pub(super) look_cpu_ns: AtomicI64,
    /// With a perf event: the thread's CPU clock up to which its samples pay for its CPU, one
    /// period each ([`pay`]); its CPU timer's tick is a sample only past that.
    ///
    /// [`pay`]: super::tick_choice::pay
    pub(super) paid_cpu_ns: AtomicI64,
    /// The thread's CPU clock when its handler last ran for one of its ticks (or when it was
    /// armed): far behind its clock now, its ticks do not reach it ([`watch_masks`]).
    ///
    /// [`watch_masks`]: super::armed_watch::watch_masks
    pub(super) heard_cpu_ns: AtomicI64,
    /// The thread's CPU clock when the trigger last read its signal mask.
    pub(super) mask_read_cpu_ns: AtomicI64,
    /// The thread blocks our signal: found by [`watch_masks`], for the profiler to disarm it
    /// (`Profiler._native_signal_masked`).
    ///
    /// [`watch_masks`]: super::armed_watch::watch_masks
    pub(super) masked: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            state: AtomicU8::new(FREE),
            generation: AtomicU32::new(0),
            tid: AtomicI32::new(0),
            timer: AtomicUsize::new(NO_TIMER),
            perf_fd: AtomicI32::new(-1),
            perf_phased: AtomicBool::new(false),
            buffers: [const { Buffer::new() }; BATCH],
            written: AtomicU32::new(0),
            read: AtomicU32::new(0),
            taken: AtomicU32::new(0),
            in_job: AtomicBool::new(false),
            last_tick_cpu_ns: AtomicI64::new(0),
            random: AtomicU64::new(0),
            look_cpu_ns: AtomicI64::new(0),
            paid_cpu_ns: AtomicI64::new(0),
            heard_cpu_ns: AtomicI64::new(0),
            mask_read_cpu_ns: AtomicI64::new(0),
            masked: AtomicBool::new(false),
        }
    }
}

pub(super) static SLOTS: [Slot; MAX_SLOTS] = [const { Slot::new() }; MAX_SLOTS];
/// Slots up to this index were ever armed in this process: the loops over the slots (each
/// job's drain among them) stop there, touching no more memory than the threads need.
pub(super) static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// The slots that may be armed.
pub(super) fn used_slots() -> &'static [Slot] {
    &SLOTS[..SLOTS_USED.load(Acquire).min(MAX_SLOTS)]
}

/// Marks thread `tid` as running one of the profiler's jobs (or no longer): a tick that comes
/// then is the profiler's own CPU, which it leaves out of the thread's account. With the GVL.
pub fn set_in_job(tid: i32, in_job: bool) {
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE && slot.tid.load(Acquire) == tid {
            slot.in_job.store(in_job, Release);
        }
    }
}

/// Threads armed now.
pub fn armed() -> usize {
    used_slots().iter().filter(|s| s.state.load(Acquire) != FREE).count()
}

/// Whether `v` is what `rb_profile_frames` gives: an iseq or a method entry (`T_IMEMO`
/// objects). A frame that a compaction moved would be `T_MOVED` (`signal_sampler`, "The job").
pub(super) fn is_frame_object(v: rb_sys::VALUE) -> bool {
    crate::vm::is_imemo(v)
}

/// Marks the frames of the samples waiting in the slots: their GC root.
#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::Profiler::SignalSlotsRoot", mark, free_immediately)]
pub struct SlotsRoot;

impl DataTypeFunctions for SlotsRoot {
    fn mark(&self, marker: &gc::Marker) {
        for buffer in used_slots().iter().flat_map(|slot| &slot.buffers) {
            if !matches!(buffer.state.load(Acquire), FULL | READING) {
                continue;
            }
            let depth = buffer.depth.load(Acquire);
            if depth == READ_AT_JOB || depth == READ_AT_GC_EXIT || depth == READ_AFTER_GC {
                continue;
            }
            let frames = buffer.frames.load(Acquire);
            // SAFETY: the buffer is FULL or READING: the handler does not write it, and its
            // first `depth` frames were alive when read and marked since (`signal_sampler`, "The
            // job").
            let frames: &Frames = unsafe { &*frames };
            for &frame in &frames.frames[..(depth as usize).min(DEPTH)] {
                if is_frame_object(frame) {
                    // SAFETY: a live object (see above).
                    marker.mark(unsafe { Value::from_raw(frame) });
                }
            }
        }
    }
}
