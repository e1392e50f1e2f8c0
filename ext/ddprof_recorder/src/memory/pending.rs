//! The sampled allocations waiting for their job (see `allocations`), and their GC root.
//!
//! The NEWOBJ hook reads a sampled allocation's stack into preallocated buffers ([`push`]); a
//! job takes the samples one by one ([`take`]), names them and records them, then gives each
//! back ([`done`]). Until then the frames read, and the sample's thread, class and object, are
//! marked by this module's GC root with `rb_gc_mark`, which keeps them alive and pins them
//! against `GC.compact`: while pending, then, once a job took the sample, in [`FLYING`], so
//! that a job switched out in its Ruby handler (while another thread stops or restarts
//! sampling, or fills the buffers again) still holds live objects when it names them.
//!
//! Any thread's job takes the next sample not taken. The buffers start over as soon as every
//! sample in them is taken, whatever the jobs that took them are doing: waiting for those jobs
//! let the buffers fill while one was switched out, and at interval 1 drop most samples
//! (bench/RESULTS.md, "Allocation sampling", "Under load"). Both the queue and [`FLYING`]
//! are GVL cells (`vm::gvl_cell`): the root's mark always reads them whole.
use std::sync::atomic::{AtomicU64, Ordering};

use magnus::{Error, Ruby};

use crate::vm::gvl_cell::{GcRoot, GvlCell};

/// Deepest allocating stack read (the recorder's `max_frames` then cuts it further).
const DEPTH: usize = 512;
/// Samples that can wait for their job, and the frames they can hold in all (each takes its
/// depth; 3 MiB for both buffers, resident only as far as written). The job runs at the next
/// interrupt check; a C method that makes many objects without one fills them at a small
/// `interval`, and the samples past them are counted in `dropped`. 256 samples were too few:
/// at interval 1, `JSON.parse` (1,400 objects a call, none checked) lost most of its objects.
const MAX_PENDING: usize = 16_384;
const POOL: usize = 1 << 18;

/// A sampled allocation, as the hook saw it.
#[derive(Clone, Copy)]
pub struct Sample {
    pub thread: rb_sys::VALUE,
    /// 0: none (a hidden or internal object).
    pub klass: rb_sys::VALUE,
    /// Kept (and marked) only for the heap profile; else 0.
    pub object: rb_sys::VALUE,
    pub weight: u64,
}

/// A sample waiting for the job; its frames are at `start` in the buffers.
struct Pending {
    sample: Sample,
    start: usize,
    depth: usize,
}

struct Queue {
    frames: Vec<rb_sys::VALUE>,
    lines: Vec<i32>,
    pending: Vec<Pending>,
    /// Pending samples taken by a job (from the front). Once all are, the buffers start over:
    /// what a job holds is marked through [`FLYING`] from the moment it takes it.
    taken: usize,
}

static QUEUE: GvlCell<Option<Queue>> = GvlCell::new("the pending allocation samples", None);

/// Samples taken by a job and not recorded yet, by id, each with the objects it holds (frames,
/// thread, class, object; 0 for none). One entry per job at work: a few.
static FLYING: GvlCell<Vec<(u64, Vec<rb_sys::VALUE>)>> =
    GvlCell::new("the allocation samples taken", Vec::new());
static NEXT_FLYING: AtomicU64 = AtomicU64::new(0);

/// Registers the GC root. At load, with the GVL.
pub fn init(ruby: &Ruby) -> Result<(), Error> {
    GcRoot { mark: Some(mark), compact: None }.register(ruby)
}

/// Marks what the pending samples hold, and the samples jobs have taken.
fn mark() {
    QUEUE.with(|queue| {
        FLYING.with(|flying| {
            let pending = queue.iter().flat_map(|queue| {
                queue.pending.iter().flat_map(|pending| {
                    let frames = &queue.frames[pending.start..pending.start + pending.depth];
                    let sample = &pending.sample;
                    frames.iter().chain([&sample.thread, &sample.klass, &sample.object])
                })
            });
            for &value in pending.chain(flying.iter().flat_map(|(_, held)| held)) {
                if value != 0 {
                    // SAFETY: in the GC's mark phase; each is a heap object that was live
                    // when the hook read it, and has been marked (so kept, pinned) at every
                    // GC since, pending or taken.
                    unsafe { rb_sys::rb_gc_mark(value) };
                }
            }
        })
    });
}

/// Fresh, empty buffers for a run that starts.
pub fn start() {
    let fresh = Queue {
        frames: vec![0; POOL],
        lines: vec![0; POOL],
        pending: Vec::with_capacity(MAX_PENDING),
        taken: 0,
    };
    QUEUE.with(|queue| *queue = Some(fresh));
}

/// Drops the pending samples (those taken stay marked until their job is [`done`]).
pub fn clear() {
    QUEUE.with(|queue| {
        if let Some(queue) = queue {
            queue.pending.clear();
            queue.taken = 0;
        }
    });
}

/// Queues `sample`, whose stack `read` writes into the buffers it is given (leaf first) and
/// returns the depth of. `read` runs inside the hook: it must not allocate (as
/// `stack_capture::read_current`). False, with nothing queued, when the buffers are full.
pub fn push(
    sample: Sample,
    read: impl FnOnce(&mut [rb_sys::VALUE], &mut [i32]) -> usize + Send,
) -> bool {
    QUEUE.with(|queue| {
        let Some(queue) = queue else { return false };
        let start = queue.pending.last().map_or(0, |p| p.start + p.depth);
        if queue.pending.len() == MAX_PENDING || start + DEPTH > POOL {
            return false;
        }
        let depth =
            read(&mut queue.frames[start..start + DEPTH], &mut queue.lines[start..start + DEPTH]);
        queue.pending.push(Pending { sample, start, depth });
        true
    })
}

/// What a job copies out of a pending sample; what it holds stays marked until [`done`].
pub struct Taken {
    /// Its entry in [`FLYING`].
    id: u64,
    pub sample: Sample,
    pub frames: Vec<rb_sys::VALUE>,
    pub lines: Vec<i32>,
}

/// The next pending sample not taken yet, or None: none left (the buffers then start over),
/// or not `live` (sampling is off, or was started in another process: what is pending is
/// dropped).
pub fn take(live: bool) -> Option<Taken> {
    QUEUE.with(|queue| {
        let queue = queue.as_mut()?;
        let Some(pending) = queue.pending.get(queue.taken).filter(|_| live) else {
            queue.pending.clear();
            queue.taken = 0;
            return None;
        };
        queue.taken += 1;
        let range = pending.start..pending.start + pending.depth;
        let frames = queue.frames[range.clone()].to_vec();
        let sample = pending.sample;
        let marks =
            frames.iter().copied().chain([sample.thread, sample.klass, sample.object]).collect();
        Some(Taken { id: hold(marks), sample, frames, lines: queue.lines[range].to_vec() })
    })
}

/// Marks `marks` as held by a job until [`done`]; returns the id to give back.
fn hold(marks: Vec<rb_sys::VALUE>) -> u64 {
    let id = NEXT_FLYING.fetch_add(1, Ordering::Relaxed);
    FLYING.with(|flying| flying.push((id, marks)));
    id
}

/// A taken sample is recorded (or given up): what it holds is no longer marked for it.
pub fn done(taken: Taken) {
    FLYING.with(|flying| flying.retain(|(held, _)| *held != taken.id));
}
