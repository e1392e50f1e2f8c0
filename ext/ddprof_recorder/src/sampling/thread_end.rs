//! Thread ends: the CPU a thread used between its last sample and its exit. Without this, a
//! thread that ends between two passes takes that CPU with it (its clock can no longer be
//! read), and a short thread that no pass ever saw takes all of it: in a program of many
//! short threads, a few percent of its CPU on 3.1 and most of it on 3.3 and 3.4, where a
//! finished thread's native thread is gone at once (bench/RESULTS.md, "Short-lived threads").
//!
//! Two native observers, neither of which runs Ruby code or makes a Ruby object:
//!
//! - **The hook**: an event hook (`rb_add_event_hook`) on `RUBY_EVENT_THREAD_BEGIN` and
//!   `RUBY_EVENT_THREAD_END`. Thread events run on the thread itself with the GVL (`thread.c`:
//!   `EXEC_EVENT_HOOK(th->ec, RUBY_EVENT_THREAD_END, th->self, ...)`, in `thread_do_start_proc`
//!   on 3.1, in `thread_start_func_2` on 3.3 and 3.4, both before the GVL is given up for the
//!   last time). At the end, the hook reads the thread's own CPU clock (as the sampler does)
//!   and queues `(thread, tid, cpu, now)` in [`ENDS`]; the sampler's next pass
//!   (`ThreadSampler#thread_ended`) charges the CPU since the thread's last charge to its last
//!   on-CPU stack, or to a `(thread exit)` frame when it has none (a hook's thread has no Ruby
//!   frame left: its block has returned). A thread never sampled is charged from its native
//!   thread's birth (or from the profiler's start, for a native thread that existed then),
//!   since the sampler's account is per native thread. At the beginning, the hook only makes
//!   the thread's exit watch (below). The hook's `Thread` stays alive while queued: the queue is
//!   a [`GvlCell`] (the hook and the drain hold the GVL), and its [`GcRoot`] marks each queued
//!   `Thread` (and so pins it against compaction) at every GC, never finding the queue
//!   mid-write (`vm::gvl_cell`).
//! - **The exit watch**: a thread-local value whose destructor runs when the native thread
//!   exits (after its Ruby thread's end, without the GVL), made by the hook at the thread's
//!   beginning. It queues `(tid, cpu)` in [`EXITS`]: the CPU after the end hook (Ruby's own
//!   cleanup of the thread, charged to `(thread exit)`), and, on 3.1, where the end hook does
//!   not fire for a thread that ends with an exception or is killed (`vm::THREAD_END_ON_EVERY_END`),
//!   what that thread used since its last charge (to its last on-CPU stack if the sampler knew
//!   the thread, else to `(unsampled thread)`). The queue has no lock: see "The exits' queue".
//!
//! Where the hook cannot be added, the exit watch is not made either, and
//! `stats[:thread_ends][:hook]` says why: on 3.1 with YJIT on, adding any thread-event hook
//! throws away YJIT's machine code for the rest of the process (`vm::THREAD_HOOK_DISABLES_YJIT`).
//!
//! # The exits' queue
//!
//! [`EXITS`] is the one queue here filled without the GVL, by native threads that exit at once
//! (a pool that finishes, 3,000 threads released together). It was a `Mutex<Vec>` taken with
//! `try_lock` only, so that a lock held by a thread that vanished in a fork could never block;
//! but then an exit that found the lock held by another exit was dropped, its CPU lost from the
//! profile: 4-10 of 6,000 exits per run on Ruby 3.4.5, with 3,000 threads at once
//! (bench/RESULTS.md, "Short-lived threads"). A blocking lock would drop none, but in a forked
//! child it could wait forever for a lock a vanished thread held.
//!
//! So it is a bounded queue of fixed cells without a lock ([`ExitQueue`]: Dmitry Vyukov's
//! bounded queue, with one consumer). Each cell has a sequence number saying whose turn it is.
//! An exit claims the next position with a compare-and-swap on `tail`, writes its record into
//! that position's cell, then publishes it by storing the cell's sequence (release); the pass
//! (the one consumer, with the GVL) takes cells in order while the next one is published, and
//! frees each by storing its sequence for the next lap. What that gives:
//!
//! - **No exit is dropped for contention.** A failed compare-and-swap only means that another
//!   exit claimed that position first, so the loser tries the next one: each retry is another
//!   exit's progress, so an exit retries at most as often as other exits claim positions
//!   meanwhile. An exit is dropped (counted in [`DROPPED`], its CPU lost) only when all
//!   [`EXIT_CAPACITY`] cells hold exits the pass has not taken yet.
//! - **Nothing waits for a vanished thread.** An exit waits for no other (a retry needs another
//!   exit to have moved `tail`, which a vanished thread cannot do). An exit that vanished in a
//!   fork between its claim and its publication leaves its cell unpublished in the child, where
//!   the pass stops there (the exits after it wait); the child's [`start`] resets the whole
//!   queue, when no exit can be writing (an exit queues only when its watch was set in this
//!   process and run, by the hook after that start).
//! - **No allocation and no lock** without the GVL: the cells are a static array, zeroed (so in
//!   no file and resident only as far as the queue has gone round; a cell's sequence is stored
//!   as its offset from the cell's index, so that all zeros is the empty queue).
//!
//! Lifecycle: [`start`] adds the hook (once; it stays added while sampling) and [`stop`] removes
//! it, both with the GVL, from `_native_sampling_start` and `_native_sampling_stop` (and the end
//! proc). A forked child inherits the hook and the queues (Ruby's hook list is process memory):
//! until it starts sampling, the hook sees another fork generation and does nothing (`ForkHook`
//! removes it there, `lib/ddprof_recorder/fork_hook.rb`), and [`start`] empties the queues the
//! parent left. An exit that passed its watch's check just before a stop can be queued after
//! that run's last flush: each exit carries its run, and a later run's take drops the ones that
//! are not its own (their CPU was that run's, whose profile is done). Nothing here unwinds: each
//! callback runs inside `catch_unwind`.
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use magnus::{rb_sys::FromRawValue, Error, RArray, Ruby, Value};

use crate::recorder::errors::entry;
use crate::recorder::fork::fork_generation;
use crate::sampling::clocks::thread_cpu::own_cpu_ns;
use crate::vm::gvl_cell::{GcRoot, GvlCell};

/// Records kept until the sampler's next pass takes them; past this, records are counted in
/// [`DROPPED`]: an end's CPU is left on the native thread (the next charge there takes it), an
/// exit's is lost (its native thread is gone).
/// A pass comes about `hz` times a second: 99 a second at 5,000 ended threads a second is 50.
const MAX_QUEUED: usize = 1 << 16;
/// The exits' queue's cells (a power of two): the same bound as the ends'. 24 bytes each, 1.5 MiB
/// of zeroed static memory, resident only as far as the queue has gone round.
const EXIT_CAPACITY: usize = MAX_QUEUED;

/// A thread seen ending by the hook.
#[derive(Clone, Copy)]
pub struct Ended {
    /// The Thread object (marked by [`mark_ends`] while queued).
    pub thread: rb_sys::VALUE,
    pub tid: i32,
    pub cpu_ns: i64,
    pub at_ns: i64,
}

/// A native thread seen exiting by its exit watch.
#[derive(Clone, Copy)]
pub struct Exited {
    pub tid: i32,
    pub cpu_ns: i64,
    /// The [`RUN`] its watch was set in (its low 32 bits): an exit that passed its watch's
    /// check just before a stop and was queued after that run's last flush is not the next
    /// run's, which drops it at its take.
    pub run: u32,
}

/// Queued by the hook, taken by the sampler's pass, marked by the GC: all with the GVL.
static ENDS: GvlCell<Vec<Ended>> = GvlCell::new("the queue of thread ends", Vec::new());
/// Queued by the exit watches, without the GVL; taken by the pass, with it ("The exits' queue").
static EXITS: ExitQueue = ExitQueue::new();
/// Whether the hook is added (changed with the GVL only).
static HOOKED: AtomicBool = AtomicBool::new(false);
/// The last [`start`] did not add the hook because YJIT is on (see the module doc).
static REFUSED_FOR_YJIT: AtomicBool = AtomicBool::new(false);
/// The fork generation that added the hook (a child's hook does nothing until it starts).
static GENERATION: AtomicU64 = AtomicU64::new(u64::MAX);
/// Bumped at each [`start`]: a watch set in an earlier run is not this run's (on 3.1 a native
/// thread outlives its Ruby thread in Ruby's thread cache, and may exit during a later run,
/// with CPU this run never saw).
static RUN: AtomicU64 = AtomicU64::new(0);
/// Ends the hook queued, exits the watches queued, and records neither could queue.
pub static ENDS_SEEN: AtomicU64 = AtomicU64::new(0);
pub static EXITS_SEEN: AtomicU64 = AtomicU64::new(0);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Threads whose beginning the hook saw: `Profiler::NativeClock.threads_begun`. The sampler lists
/// the threads (`Thread.list`) only when it moved since its last look.
static BEGUN: AtomicU64 = AtomicU64::new(0);

/// A cell of [`ExitQueue`]: the record's fields as atomics (written by the one exit that claimed
/// the cell, read by the pass once it is published), and its sequence number.
struct ExitCell {
    /// The cell's sequence number less its index (wrapping), so that a zeroed cell reads as
    /// Vyukov's initial `sequence == index`. For position `pos` of this cell: `pos` when free to
    /// claim, `pos + 1` when published, `pos + EXIT_CAPACITY` once the pass took it.
    turn: AtomicU32,
    tid: AtomicI32,
    cpu_ns: AtomicI64,
    run: AtomicU32,
}

impl ExitCell {
    const fn new() -> Self {
        Self {
            turn: AtomicU32::new(0),
            tid: AtomicI32::new(0),
            cpu_ns: AtomicI64::new(0),
            run: AtomicU32::new(0),
        }
    }
}

/// The exits' queue: many producers without the GVL, one consumer with it (module doc, "The
/// exits' queue"). Positions are `u32`s that wrap; the cell of position `pos` is
/// `pos % EXIT_CAPACITY`, and two positions never differ by more than `EXIT_CAPACITY`, so their
/// wrapping difference read as an `i32` is their true difference.
struct ExitQueue {
    cells: [ExitCell; EXIT_CAPACITY],
    /// The next position an exit claims.
    tail: AtomicU32,
    /// The next position the pass takes (only the pass and [`ExitQueue::reset`], with the GVL).
    head: AtomicU32,
}

const EXIT_MASK: u32 = EXIT_CAPACITY as u32 - 1;
const _: () = assert!(EXIT_CAPACITY.is_power_of_two() && EXIT_CAPACITY <= 1 << 30);

impl ExitQueue {
    const fn new() -> Self {
        Self {
            cells: [const { ExitCell::new() }; EXIT_CAPACITY],
            tail: AtomicU32::new(0),
            head: AtomicU32::new(0),
        }
    }

    /// Position `pos`'s cell, and its sequence number (acquire: what the cell's previous owner
    /// wrote happened before).
    fn cell(&self, pos: u32) -> (&ExitCell, u32) {
        let index = pos & EXIT_MASK;
        let cell = &self.cells[index as usize];
        (cell, index.wrapping_add(cell.turn.load(Ordering::Acquire)))
    }

    /// Stores `sequence` in position `pos`'s cell (release: what was written before is seen by
    /// whoever reads it next).
    fn set_sequence(cell: &ExitCell, pos: u32, sequence: u32) {
        cell.turn.store(sequence.wrapping_sub(pos & EXIT_MASK), Ordering::Release);
    }

    /// Queues `item`; false only when every cell holds an exit the pass has not taken. Never
    /// waits: it retries only after another exit claimed the position it tried (module doc).
    /// Any thread, without the GVL; no allocation.
    fn push(&self, item: Exited) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let (cell, sequence) = self.cell(pos);
            let ahead = sequence.wrapping_sub(pos) as i32;
            if ahead == 0 {
                // Free for `pos`: claim it. Strong, so that a failure always means another exit
                // claimed `pos` (the module doc's bound on retries); it gives the current tail.
                match self.tail.compare_exchange(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        cell.tid.store(item.tid, Ordering::Relaxed);
                        cell.cpu_ns.store(item.cpu_ns, Ordering::Relaxed);
                        cell.run.store(item.run, Ordering::Relaxed);
                        Self::set_sequence(cell, pos, pos.wrapping_add(1));
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if ahead < 0 {
                // The cell still holds the exit of position `pos - EXIT_CAPACITY`: full.
                return false;
            } else {
                // Another exit claimed `pos` since this one read `tail`.
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest exit, if it is published (an exit still being written, and those after
    /// it, wait for the next take). The pass only, with the GVL.
    fn pop(&self) -> Option<Exited> {
        let pos = self.head.load(Ordering::Relaxed);
        let (cell, sequence) = self.cell(pos);
        if sequence != pos.wrapping_add(1) {
            return None;
        }
        let item = Exited {
            tid: cell.tid.load(Ordering::Relaxed),
            cpu_ns: cell.cpu_ns.load(Ordering::Relaxed),
            run: cell.run.load(Ordering::Relaxed),
        };
        Self::set_sequence(cell, pos, pos.wrapping_add(EXIT_CAPACITY as u32));
        self.head.store(pos.wrapping_add(1), Ordering::Relaxed);
        Some(item)
    }

    /// Whether the oldest exit is published. With the GVL.
    fn ready(&self) -> bool {
        let pos = self.head.load(Ordering::Relaxed);
        self.cell(pos).1 == pos.wrapping_add(1)
    }

    /// Empties the queue, cells claimed by a vanished exit included. Only where no exit can be
    /// queuing: at [`start`] in a new fork generation (module doc). With the GVL.
    fn reset(&self) {
        for cell in &self.cells {
            cell.turn.store(0, Ordering::Relaxed);
        }
        self.head.store(0, Ordering::Relaxed);
        self.tail.store(0, Ordering::Release);
    }
}

/// The exit watch of a native thread: its destructor is the thread's last word.
struct ExitWatch {
    /// The fork generation it was made in (a watch made in the parent is not the child's).
    generation: Cell<u64>,
    /// The [`RUN`] it was set in.
    run: Cell<u64>,
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if !active()
                || self.generation.get() != fork_generation()
                || self.run.get() != RUN.load(Ordering::Acquire)
            {
                return;
            }
            // SAFETY: gettid has no preconditions and cannot fail. Not `own_tid`: its cache is
            // another thread-local, which may already be gone in a destructor.
            let tid = unsafe { libc::gettid() };
            let exited = Exited { tid, cpu_ns: own_cpu_ns(), run: self.run.get() as u32 };
            push_exit(exited);
        }));
    }
}

thread_local! {
    static EXIT_WATCH: ExitWatch = const {
        ExitWatch { generation: Cell::new(u64::MAX), run: Cell::new(u64::MAX) }
    };
}

/// Whether the hook is added and this process added it.
fn active() -> bool {
    HOOKED.load(Ordering::Acquire) && GENERATION.load(Ordering::Acquire) == fork_generation()
}

/// Registers the queue's GC root. At load.
pub fn init(ruby: &Ruby) -> Result<(), Error> {
    GcRoot { mark: Some(mark_ends), compact: None }.register(ruby)
}

/// Adds the hook, if it is not added yet and `yjit` (whether YJIT is on) does not rule it out
/// on this Ruby, and forgets what a parent process left queued. With the GVL.
pub fn start(yjit: bool) {
    RUN.fetch_add(1, Ordering::AcqRel);
    let generation = fork_generation();
    if GENERATION.swap(generation, Ordering::AcqRel) != generation {
        clear();
    }
    let refused = yjit && crate::vm::THREAD_HOOK_DISABLES_YJIT;
    REFUSED_FOR_YJIT.store(refused, Ordering::Release);
    if refused || HOOKED.swap(true, Ordering::AcqRel) {
        return;
    }
    let events = rb_sys::RUBY_EVENT_THREAD_BEGIN | rb_sys::RUBY_EVENT_THREAD_END;
    // SAFETY: GVL held (a Ruby method or the end proc); `on_thread_event` never unwinds; no
    // data VALUE to keep alive (Qnil).
    unsafe {
        rb_sys::rb_add_event_hook(
            Some(on_thread_event),
            events as rb_sys::rb_event_flag_t,
            rb_sys::Qnil as rb_sys::VALUE,
        )
    };
}

/// Removes the hook, if it is added. What is queued stays for the sampler's last flush.
/// With the GVL.
pub fn stop() {
    if !HOOKED.swap(false, Ordering::AcqRel) {
        return;
    }
    // SAFETY: GVL held; removes only the hook added with this function (a hook running now
    // is unlinked once it returns: `rb_remove_event_hook` marks it deleted, `vm_trace.c`).
    unsafe { rb_sys::rb_remove_event_hook(Some(on_thread_event)) };
}

/// For `stats`: `"on"`, `"off"` (not sampling), or why the last start did not add it.
pub fn hook_state() -> &'static str {
    if active() {
        "on"
    } else if REFUSED_FOR_YJIT.load(Ordering::Acquire) {
        "not added: YJIT is on, and on this Ruby a thread-event hook throws its code away"
    } else {
        "off"
    }
}

/// `Profiler::NativeClock.thread_ends`: nil when nothing is queued, else `[ends, exits]`:
/// `ends` flat, `[thread, tid, cpu_ns, at_ns]` per thread whose end the hook saw, oldest first;
/// `exits` flat, `[tid, cpu_ns]` per native thread whose exit watch saw it exit, set in this
/// run.
pub fn native_take_thread_ends(ruby: &Ruby) -> Result<Option<RArray>, Error> {
    entry(ruby, || {
        if !any_queued() {
            return Ok(None);
        }
        let (ends, exits) = peek();
        let flat_ends = ruby.ary_new_capa(ends.len() * 4);
        for ended in &ends {
            // SAFETY: still queued, so marked by `mark_ends` until `forget_taken` below, by which
            // time this array holds it.
            flat_ends.push(unsafe { Value::from_raw(ended.thread) })?;
            flat_ends.push(ended.tid)?;
            flat_ends.push(ended.cpu_ns)?;
            flat_ends.push(ended.at_ns)?;
        }
        forget_taken(ends.len());
        let flat_exits = ruby.ary_new_capa(exits.len() * 2);
        let run = RUN.load(Ordering::Acquire) as u32;
        for exited in exits.iter().filter(|exited| exited.run == run) {
            flat_exits.push(exited.tid)?;
            flat_exits.push(exited.cpu_ns)?;
        }
        let both = ruby.ary_new_capa(2);
        both.push(flat_ends)?;
        both.push(flat_exits)?;
        Ok(Some(both))
    })
}

/// `Profiler::NativeClock.threads_begun`: how many threads the hook saw begin (it only grows), or
/// nil while the hook is not active in this process, when the beginnings go unseen.
pub fn native_threads_begun(ruby: &Ruby) -> Result<Option<u64>, Error> {
    entry(ruby, || Ok(active().then(|| BEGUN.load(Ordering::Acquire))))
}

/// What the hook and the watches saw so far (threads begun, ends and exits queued or not),
/// as one count that only grows: read by the trigger thread, which asks for a pass when it
/// moved (`trigger`, "Batches"). None while the hook is not active in this process.
pub fn events() -> Option<u64> {
    active().then(|| {
        [&BEGUN, &ENDS_SEEN, &EXITS_SEEN, &DROPPED]
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .fold(0u64, u64::wrapping_add)
    })
}

/// Empties both queues. At [`start`] in a new fork generation only (see [`ExitQueue::reset`]).
fn clear() {
    ENDS.with(|ends| ends.clear());
    EXITS.reset();
}

/// The hook. With the GVL, on the thread that begins or ends. Never unwinds, never calls Ruby.
unsafe extern "C" fn on_thread_event(
    event: rb_sys::rb_event_flag_t,
    _data: rb_sys::VALUE,
    thread: rb_sys::VALUE,
    _mid: rb_sys::ID,
    _klass: rb_sys::VALUE,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !active() {
            return;
        }
        let generation = fork_generation();
        // Made at the beginning (and at the end, for a thread that began before the hook was
        // added), so that its destructor runs when this native thread exits.
        let run = RUN.load(Ordering::Acquire);
        let _ = EXIT_WATCH.try_with(|watch| {
            watch.generation.set(generation);
            watch.run.set(run);
        });
        if u64::from(event) & u64::from(rb_sys::RUBY_EVENT_THREAD_END) == 0 {
            BEGUN.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let ended = Ended {
            thread,
            tid: crate::sampling::clocks::thread_cpu::own_tid(),
            cpu_ns: own_cpu_ns(),
            at_ns: crate::sampling::clocks::monotonic_ns(),
        };
        // With the GVL, as every user of ENDS.
        let queued = ENDS.with(|ends| {
            let room = ends.len() < MAX_QUEUED;
            if room {
                ends.push(ended);
            }
            room
        });
        count(queued, &ENDS_SEEN);
    }));
}

/// Queues `item` in [`EXITS`] if it has room, else counts it dropped. Never waits.
fn push_exit(item: Exited) {
    count(EXITS.push(item), &EXITS_SEEN);
}

/// Counts a record queued (in `seen`) or dropped.
fn count(queued: bool, seen: &AtomicU64) {
    let counter = if queued { seen } else { &DROPPED };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What is queued, oldest first: the ends and the exits. The ends stay queued (and marked)
/// until [`forget_taken`] with their counts, so that the caller can make Ruby objects (and so
/// run the GC) while it holds copies of their VALUEs. With the GVL.
fn peek() -> (Vec<Ended>, Vec<Exited>) {
    let ends = ENDS.with(|ends| ends.clone());
    let exits = std::iter::from_fn(|| EXITS.pop()).collect();
    (ends, exits)
}

/// Forgets the first `n` ends, once the caller holds their Threads itself. With the GVL.
fn forget_taken(n: usize) {
    ENDS.with(|ends| {
        let n = n.min(ends.len());
        ends.drain(..n);
    });
}

/// Whether anything is queued (cheap: the pass asks at each pass).
fn any_queued() -> bool {
    let ends = ENDS.with(|ends| !ends.is_empty());
    ends || EXITS.ready()
}

/// Marks the Threads of the queued ends (their GC root's mark).
fn mark_ends() {
    ENDS.with(|ends| {
        for ended in ends.iter() {
            // SAFETY: a Thread object queued by the hook, kept alive (and pinned) by this very
            // mark since; `rb_gc_mark` allocates nothing.
            unsafe { rb_sys::rb_gc_mark(ended.thread) };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exit whose run is its tid's low bits, so that every field's trip is checked.
    fn exit(tid: i32, cpu_ns: i64) -> Exited {
        Exited { tid, cpu_ns, run: tid as u32 ^ 0x5a5a }
    }

    fn take_all(queue: &ExitQueue) -> Vec<(i32, i64)> {
        std::iter::from_fn(|| queue.pop())
            .inspect(|e| {
                assert_eq!(e.run, e.tid as u32 ^ 0x5a5a, "the run comes out as it went in")
            })
            .map(|e| (e.tid, e.cpu_ns))
            .collect()
    }

    #[test]
    fn keeps_order_refuses_only_when_full_and_goes_round() {
        static QUEUE: ExitQueue = ExitQueue::new();
        assert!(!QUEUE.ready());
        for round in 0..3 {
            for i in 0..EXIT_CAPACITY as i64 {
                assert!(QUEUE.push(exit(round, i)));
            }
            assert!(!QUEUE.push(exit(-1, -1)), "full after {EXIT_CAPACITY}");
            let taken = take_all(&QUEUE);
            assert_eq!(taken.len(), EXIT_CAPACITY);
            assert!(taken.iter().enumerate().all(|(i, &e)| e == (round, i as i64)));
            assert!(!QUEUE.ready());
        }
    }

    #[test]
    fn positions_wrap() {
        static QUEUE: ExitQueue = ExitQueue::new();
        // As if 2^32 - 5 exits had gone through: each cell free for its next position.
        let start = u32::MAX - 4;
        for k in 0..EXIT_CAPACITY as u32 {
            let pos = start.wrapping_add(k);
            ExitQueue::set_sequence(QUEUE.cell(pos).0, pos, pos);
        }
        QUEUE.head.store(start, Ordering::Relaxed);
        QUEUE.tail.store(start, Ordering::Relaxed);
        for batch in 0..4 {
            let ids: Vec<i32> = (batch * 5..batch * 5 + 5).collect();
            assert!(ids.iter().all(|&i| QUEUE.push(exit(i, i.into()))));
            let taken: Vec<i32> = take_all(&QUEUE).into_iter().map(|e| e.0).collect();
            assert_eq!(taken, ids);
        }
        assert_eq!(QUEUE.tail.load(Ordering::Relaxed), start.wrapping_add(20));
        QUEUE.reset();
        assert!(!QUEUE.ready());
        assert!(QUEUE.push(exit(7, 7)));
        assert_eq!(take_all(&QUEUE), vec![(7, 7)]);
    }

    /// What the `try_lock`ed Mutex dropped: exits at once. Fewer than the capacity in all, so
    /// every push must succeed, and each thread's exits come out in its order.
    #[test]
    fn loses_nothing_to_contention() {
        static QUEUE: ExitQueue = ExitQueue::new();
        const THREADS: i32 = 4;
        const EACH: i64 = 12_000;
        let producers: Vec<_> = (0..THREADS)
            .map(|t| std::thread::spawn(move || (0..EACH).all(|i| QUEUE.push(exit(t, i)))))
            .collect();
        let mut next = vec![0i64; THREADS as usize];
        let mut taken = 0;
        while taken < THREADS as i64 * EACH {
            match QUEUE.pop() {
                Some(e) => {
                    assert_eq!(e.cpu_ns, next[e.tid as usize], "thread {}'s order", e.tid);
                    next[e.tid as usize] += 1;
                    taken += 1;
                }
                None if producers.iter().all(|p| p.is_finished()) && !QUEUE.ready() => break,
                None => std::hint::spin_loop(),
            }
        }
        assert!(producers.into_iter().all(|p| p.join().unwrap()), "a push was refused");
        assert_eq!(taken, THREADS as i64 * EACH);
        assert!(!QUEUE.ready());
    }
}
