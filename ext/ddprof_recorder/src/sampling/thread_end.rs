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
//!   the thread, else to `(unsampled thread)`). The destructor takes the queue's lock with
//!   `try_lock` only, so a lock held by a thread that vanished in a fork never blocks it; what it
//!   cannot queue is counted ([`DROPPED`]).
//!
//! Where the hook cannot be added, the exit watch is not made either, and
//! `stats[:thread_ends][:hook]` says why: on 3.1 with YJIT on, adding any thread-event hook
//! throws away YJIT's machine code for the rest of the process (`vm::THREAD_HOOK_DISABLES_YJIT`).
//!
//! Lifecycle: [`start`] adds the hook (once; it stays added while sampling) and [`stop`] removes
//! it, both with the GVL, from `_native_sampling_start` and `_native_sampling_stop` (and the end
//! proc). A forked child inherits the hook and the queues (Ruby's hook list is process memory):
//! until it starts sampling, the hook sees another fork generation and does nothing, and
//! [`start`] empties the queues the parent left. Nothing here unwinds: each callback runs
//! inside `catch_unwind`.
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use magnus::{rb_sys::FromRawValue, Error, RArray, Ruby, Value};

use crate::recorder::errors::entry;
use crate::recorder::fork::fork_generation;
use crate::sampling::thread_cpu::own_cpu_ns;
use crate::vm::gvl_cell::{GcRoot, GvlCell};

/// Records kept until the sampler's next pass takes them; past this, ends are counted in
/// [`DROPPED`] and their CPU is left on the native thread (the next charge there takes it).
/// A pass comes about `hz` times a second: 99 a second at 5,000 ended threads a second is 50.
const MAX_QUEUED: usize = 1 << 16;

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
}

/// Queued by the hook, taken by the sampler's pass, marked by the GC: all with the GVL.
static ENDS: GvlCell<Vec<Ended>> = GvlCell::new("the queue of thread ends", Vec::new());
/// Queued by the exit watches, without the GVL: a lock they only `try_lock` (module doc).
static EXITS: Mutex<Vec<Exited>> = Mutex::new(Vec::new());
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
            let exited = Exited { tid, cpu_ns: own_cpu_ns() };
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
        for exited in &exits {
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

/// Empties both queues.
fn clear() {
    ENDS.with(|ends| ends.clear());
    if let Ok(mut exits) = EXITS.try_lock() {
        exits.clear();
    }
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
            tid: crate::sampling::job::own_tid(),
            cpu_ns: own_cpu_ns(),
            at_ns: crate::sampling::trigger::monotonic_ns(),
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

/// Queues `item` in [`EXITS`] if its lock is free and it has room, else counts it dropped:
/// never waits, so a lock held by a thread that vanished in a fork never blocks.
fn push_exit(item: Exited) {
    let queued = match EXITS.try_lock() {
        Ok(mut items) if items.len() < MAX_QUEUED => {
            items.push(item);
            true
        }
        _ => false,
    };
    count(queued, &EXITS_SEEN);
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
    let exits = EXITS.try_lock().map(|mut exits| std::mem::take(&mut *exits)).unwrap_or_default();
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
    ends || EXITS.try_lock().map(|exits| !exits.is_empty()).unwrap_or(false)
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
