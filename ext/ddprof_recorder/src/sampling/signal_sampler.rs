//! Reading a thread's stack at the moment its CPU tick comes, in a signal handler, rather than
//! at the VM's next interrupt check (which charges the CPU of Ruby code to the cheap C methods
//! around it: safepoint bias).
//!
//! # Wall ticks (`ticks: :wall`, and `:auto` from 250 Hz)
//!
//! Each Ruby thread that the profiler samples is *armed*: it gets a [`Slot`], and its CPU
//! timer (the CPU ticks below). With wall ticks, at each of its ticks (`hz` a second of wall
//! time, randomized, see `trigger`) the trigger thread also looks at every armed thread's CPU
//! clock ([`kick`]) and sends the signal to each thread that is on a CPU at that moment: its
//! clock moved since the trigger's previous look and moves again between two reads a moment
//! apart (reading a running thread's clock from another thread brings it up to the
//! nanosecond, `task_sched_runtime` in Linux's `kernel/sched/core.c`). Sampling the threads
//! that run at random moments of the wall clock samples each thread's stacks in proportion to
//! the CPU they use, at `hz` samples per second of its CPU, past the kernel's tick. Except for
//! one case: when the trigger wakes on the CPU a thread was running on, it has taken that CPU
//! from the thread, which then reads as not running, and that tick is not a sample of it; on
//! a loaded machine that is often, since the scheduler wakes the trigger where it last ran
//! (a busy thread at 999 Hz with the test suite running beside it got 92–640 wall ticks per
//! CPU-second, and with three busy processes beside, some profiles none). So after two ticks in
//! a row that found a thread run since the last look, not running now, and none running, the
//! trigger moves itself off its CPU for the next one ([`hop`]: its affinity, every CPU it may
//! use but that one). That changes where the trigger runs, not where the signals land.
//! Measured, alternating runs with and without the hop: a busy thread at 999 Hz, three busy
//! processes beside, 0–283 wall ticks a profile without, 221–268 with (hopping at the first
//! such tick); a thread that works 10 ms and waits 20 ms, two busy processes beside, 832–970
//! samples a CPU-second without, 901–1,010 with (at the second: at the first it hopped at
//! nearly every tick, the thread having just gone to wait, and got 698–710). Taking a thread
//! ready to run on the trigger's own CPU for a displaced one (its state in `/proc`) was tried
//! and left out: the scheduler
//! (EEVDF, Linux 6.6+) lets the running thread go on to its next preemption point before the
//! trigger runs, and a system call that updates the thread's runtime (`clock_gettime` of its
//! CPU clock) is one, so those samples fell there (12% of bench/accuracy's `threads` on
//! `Process.clock_gettime`, against 0.5% for stackprof). So the CPU timer's ticks stay samples
//! too (every one of them from 250 Hz up): both sample where the CPU is, so together they do,
//! and a thread gets at least what the CPU ticks give it, under load too (a sample's CPU is
//! measured, so more samples cost only their work; totals stay exact). Measured:
//! bench/RESULTS.md, "Sampling rate" (`bench/run rate`, `bench/bursty_rate.rb`).
//!
//! The signal goes to that thread only (`rt_tgsigqueueinfo`, carrying the slot's index and
//! generation, see [`send`]), at most one at a time per thread (`kick_pending`: a thread that
//! blocks the signal does not pile them up). A thread that waits (`read(2)`, `sleep`,
//! `IO.select`, `Queue#pop`, a futex, a libc call through Fiddle) uses no CPU and is never
//! signalled. What remains is a race of a few microseconds: a thread seen running that enters
//! a blocking system call before the signal lands has that call interrupted; with `SA_RESTART`
//! `read(2)`, `write(2)` and futex waits restart in the kernel, and Ruby's own waits (`sleep`,
//! `IO.select`, `Queue#pop`) retry on `EINTR` with the time left, so Ruby code sees nothing; a
//! C function that sleeps with `nanosleep` or `poll` and does not retry could return early.
//! For programs with such C code, CPU ticks (below) never signal a thread about to block, and
//! `signals: false` sends no signal at all.
//!
//! Below 250 Hz `:auto` is [`WallTicks::WhenShort`] (`ticks: :cpu_plus_wall`): the CPU ticks,
//! and a wall tick only to a running thread whose samples fall short of one per period of its
//! CPU ([`pay`]). Under load the CPU ticks fall short of `hz` (a thread's CPU slices end
//! between two scheduler ticks, which then miss it); these fill the gaps. What a thread owes
//! carries over to its next samples, so a look that finds it off its CPU is made up at a later
//! one; a CPU tick that comes when its samples are a period or more ahead is left out
//! ([`ahead`]). Which thread gets one, and which tick is left out, depends on its clock only,
//! not on what it runs. Measured in bench/RESULTS.md, "Sampling rate".
//!
//! # CPU ticks (`ticks: :cpu`, and `:auto` below 250 Hz with the wall ticks above)
//!
//! Each armed thread gets a POSIX timer on its own
//! CPU clock (`timer_create` on the clock id `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, see
//! `thread_cpu`), whose signal goes to that thread only (`SIGEV_THREAD_ID`). A CPU-clock timer
//! expires at a scheduler tick while its thread is on a CPU, and Linux sends the signal from
//! the tick's task work, on the thread's return to user mode: a thread that waits (`read(2)`,
//! `sleep`, `IO.select`, `Queue#pop`, a futex, a libc call through Fiddle) uses no CPU, so its
//! timer never expires and it is never interrupted, and a signal never lands inside a blocking
//! system call. The handler is installed with `SA_RESTART` all the same. The signal is a
//! real-time one that nothing else in the process handles (see [`install`]): Ruby's `trap`
//! cannot take real-time signals, so a program's own `trap("PROF")` and the profiler never meet.
//!
//! ## Which CPU ticks are samples
//!
//! The kernel checks CPU timers at its scheduler tick only (`CONFIG_HZ`, 250 on Debian's
//! kernels), so the moments a timer can fire are the ticks its thread runs through. The timers'
//! period is 10 µs ([`PROBE_PERIOD_NS`]): at every such tick the timer has expired, and the
//! thread gets a signal. Each tick is then a sample, independently, with the same probability
//! `hz * tick` (all of them when `hz` is at or above the tick rate: a thread gets at most about
//! 250 samples a second of its CPU on such a kernel), drawn in the handler ([`drawn`]); the
//! tick is measured as the average CPU a thread uses from one tick to the next ([`TICK_NS`]).
//! Ticks come at fixed times of the wall clock, which a program does not follow, so they fall
//! on a thread's stacks in proportion to the CPU each uses, and so do the samples. A timer
//! with a period of `1/hz` would not do: it fires at the first tick after each `1/hz` of CPU,
//! so a tick is chosen in proportion to the CPU used since the previous tick, and the first
//! tick after a sleep, which follows less CPU, is chosen less often (on bench/accuracy's
//! `sleepy`, the method run after each sleep got 35% of the CPU against a truth of 59%). For
//! the same reason the profiler charges each sample about the thread's average CPU per sample,
//! not the CPU since its previous sample (`ThreadSampler#signal_charge`).
//!
//! # The handler
//!
//! Each armed thread has a [`Slot`]: a state, the tick's CPU clock and time, and a buffer for
//! the frames, allocated when the thread is armed and reused (never freed). The signal (the
//! trigger's, or the timer's) carries the slot's index and generation, so the handler finds its
//! slot without thread-local storage (whose first use in a `dlopen`ed library can allocate).
//! The handler does only async-signal-safe work: atomics, `clock_gettime`,
//! `ruby_thread_has_gvl_p` and `rb_during_gc` (plain reads of the thread's and the VM's
//! state, Ruby 3.1 `thread.c` and `gc.c`), `rb_profile_frames` and
//! `rb_postponed_job_register_one`. It reads the frames only when
//!
//! - the thread holds the GVL (`ruby_thread_has_gvl_p`, which is "not inside a blocking
//!   region"): then no other thread runs Ruby, so nothing moves or frees the objects it reads;
//! - no GC runs (`rb_during_gc`): the GC itself may be moving objects (compaction). From 3.3
//!   such a tick is kept, and its stack read when the GC step ends (`gc_ticks`);
//! - its slot is empty: a sample still waiting for its job is not overwritten.
//!
//! Otherwise it counts why and returns: that thread's CPU is charged at its next sample
//! (`lib/ddprof_recorder/profiler/thread_sampler.rb`), so nothing is lost.
//!
//! `rb_profile_frames` reads the running thread's control frames (`ec->cfp` down to the end
//! frame, Ruby 3.1 `vm_backtrace.c`), and for each its iseq or method entry and line, with no
//! allocation and no lock; the handler reads them that way too, through
//! `stack_capture::read_current` (`vm::frames` on 3.1, 3.3 and 3.4 once its self-check passed, which
//! reads the same fields and gives a `define_method` method its method entry; else
//! `rb_profile_frames` itself). Reading them in a handler is sound since Ruby 3.0: `vm_push_frame`
//! fills a frame before it moves `ec->cfp` to it (ruby/ruby PR #3296, commit 0e276dc), so an
//! interrupted push shows either the old top or a whole new frame; ruby/ruby PR #11036 (3.2.5,
//! 3.3.4, 3.4) adds a compiler fence that keeps the compiler from reordering those stores, which
//! the compilers checked in that PR did not do anyway (Debian's 3.1.2 has no fence). This is
//! what stackprof does on Ruby 3.0+ (its PRs #150 and #172), and dd-trace-rb on 3.2.5+/3.3.4+
//! (its PRs #4785, #4786). Where it is not sound, the handler only asks for the job, which
//! then reads the stack at the thread's next interrupt check, as the trigger's job does (the
//! safepoint mode, [`Mode::Safepoint`]):
//!
//! - with YJIT on, on Ruby 3.1: JIT code does not keep `cfp->pc` current, and
//!   `rb_profile_frames` turns the pc into a line (stackprof #179/#180: crashes). From 3.3 on
//!   YJIT fills a frame before it publishes it and the top frame's unwritten pc is told by its
//!   `jit_return` (line 0), so the handler reads stacks under YJIT there
//!   (`vm::HANDLER_READS_UNDER_YJIT` has the sources), as stackprof does from 3.3;
//! - with `GC.auto_compact` on, before Ruby 3.2: compaction then protects heap pages with a
//!   read barrier (`mprotect`, whose fault handler is not async-signal-safe) between GC steps.
//!
//! Known limits: `ruby_thread_has_gvl_p` also says yes for a thread that a time slice took the
//! GVL from and that waits to get it back (it is not in a blocking region); such a thread
//! uses no CPU while it waits, so its timer can expire only in the few microseconds of the
//! hand-over itself. And rb_profile_frames walks environment pointers
//! (`rb_vm_frame_method_entry`), which `vm_make_env_each` leaves inconsistent for a few
//! instructions while it moves an environment to the heap (ruby/ruby PR #16615, open): a
//! risk that stackprof and dd-trace-rb share.
//!
//! # The job
//!
//! The handler then registers [`Setup::job`] (`job`), a postponed job that runs at
//! the thread's next interrupt check with the GVL: [`drain`] names the frames
//! (`stack_capture::store_read_frames`) and hands each sample to the profiler. Between the
//! handler and the job the frame objects are marked by [`SlotsRoot`], a GC root (marking
//! also pins them against compaction); the GC runs with the GVL, and the handler writes a
//! slot only with the GVL, so the root never reads a slot being written.
//!
//! # Batches
//!
//! A job costs the program about 100 µs of CPU whatever it does, because the program ran for
//! a period since the last one and took our code and data out of the caches
//! (bench/RESULTS.md, "What makes a job cold"). So in [`Mode::Handler`] a slot keeps up to
//! [`BATCH`] samples, each with its own frames, and the handler asks for the job only when
//! the batch is full: a busy thread runs one job for every `BATCH` samples (measured: 246
//! jobs instead of 925–951 in 10 s of a busy thread at 99 Hz, the profiler's CPU 41–43 ms
//! instead of 72–77). Every wall pass and every window's end takes what the slots hold first
//! (`ThreadSampler#take_signal_samples`), before any thread's end or idle time is accounted,
//! and a thread disarmed with samples waiting (it ended, or `stop`) leaves them in [`KEPT`]
//! for the next of those, so no sample waits past a pass. The wall passes then need not come
//! every period either: while nothing but the batched threads ran, the trigger lets them wait
//! (`trigger`, "Batches"), and a pass counts the periods since the last one. In
//! [`Mode::Safepoint`] each sample has its job at once, as the job reads its stack.
//!
//! # Lifecycle
//!
//! Threads are armed and disarmed with the GVL held (`ThreadSampler`), the handler is
//! installed once and stays (a signal after `stop` finds [`ENABLED`] false and returns; with
//! no handler the default action of a real-time signal would end the process). A forked
//! child has the handler but no timers (POSIX timers are not inherited): its slots are
//! forgotten at its first start. `execve` deletes timers before it resets handlers.
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::Mutex;

use magnus::{gc, rb_sys::FromRawValue, DataTypeFunctions, TypedData, Value};

use crate::sampling::thread_cpu::{clock_ns, cpu_clock_id, own_cpu_ns};

/// The CPU timers' period: far below any scheduler tick (1 to 10 ms), so that a timer has
/// expired at every tick its thread runs through (see "Which CPU ticks are samples").
const PROBE_PERIOD_NS: i64 = 10_000;
/// CPU between two ticks of a thread past which the gap is not taken into the tick's
/// estimate (the thread's first tick after it was armed, say).
const MAX_TICK_NS: i64 = 50_000_000;
/// Ticks over which the estimate of the tick averages.
const TICK_AVERAGE: i64 = 64;

/// Most threads armed at once; past it, a thread is sampled at safepoints (counted).
pub const MAX_SLOTS: usize = 256;
/// Deepest stack read in the handler (the root-most frames of deeper ones are left out).
pub const DEPTH: usize = 1024;
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

/// How the handler samples.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Reads the stack in the handler.
    Handler,
    /// Asks for the job, which reads the stack at the thread's next interrupt check.
    Safepoint,
}

/// Samples a thread's slot keeps for the profiler before its handler asks for the job (see
/// "Batches"): a busy thread then runs a job for every `BATCH` samples, not for each.
pub const BATCH: usize = 4;

// A slot's states: armed or not.
const FREE: u8 = 0;
const ARMED: u8 = 1;
// A buffer's states.
const EMPTY: u8 = 1;
const WRITING: u8 = 2;
const FULL: u8 = 3;
const READING: u8 = 4;

/// `depth` of a sample whose stack the job must read (safepoint mode).
const READ_AT_JOB: u32 = u32::MAX;
/// `depth` of a sample whose tick came inside the GC: its stack is read at the GC step's end
/// ([`read_gc_ticks`], `gc_ticks`).
const READ_AT_GC_EXIT: u32 = u32::MAX - 1;
/// Some slot has a sample [`READ_AT_GC_EXIT`].
static GC_TICKS_WAITING: AtomicBool = AtomicBool::new(false);

/// Frames read in the handler: what `rb_profile_frames` fills.
struct Frames {
    frames: [rb_sys::VALUE; DEPTH],
    lines: [i32; DEPTH],
}

/// One sample waiting in a slot: its state, the tick's CPU clock and time, and its frames.
struct Buffer {
    state: AtomicU8,
    /// The thread's CPU clock and the monotonic clock at the tick.
    cpu_ns: AtomicI64,
    at_ns: AtomicI64,
    /// Frames read, or [`READ_AT_JOB`].
    depth: AtomicU32,
    /// Allocated at the slot's first arm, never freed (a handler may hold it).
    frames: AtomicPtr<Frames>,
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
struct Slot {
    /// [`FREE`] or [`ARMED`].
    state: AtomicU8,
    /// Bumped at each arm and disarm; the timer's signal carries it, so a signal of an earlier
    /// timer of this slot is ignored.
    generation: AtomicU32,
    tid: AtomicI32,
    /// The `timer_t` (a pointer-sized id), valid while armed.
    timer: AtomicUsize,
    /// Its samples, written in turn: the handler writes `buffers[written % BATCH]`, the job
    /// reads `buffers[read % BATCH]` (both with the GVL, so never at once; each buffer's state
    /// keeps them apart all the same).
    buffers: [Buffer; BATCH],
    written: AtomicU32,
    read: AtomicU32,
    /// Samples taken from this slot: picks the key of the next ([`key`]).
    taken: AtomicU32,
    /// The thread is running one of the profiler's jobs: a tick now is the profiler's CPU.
    in_job: AtomicBool,
    /// The thread's CPU clock at its previous tick (0: none yet).
    last_tick_cpu_ns: AtomicI64,
    /// This thread's xorshift state for the ticks' draw (only its own handler uses it).
    random: AtomicU64,
    /// Wall ticks: the thread's CPU clock when the trigger last looked at it.
    kick_cpu_ns: AtomicI64,
    /// Wall ticks: a signal was sent that the handler has not taken yet (so a thread that
    /// blocks the signal has at most one queued).
    kick_pending: AtomicBool,
    /// [`WallTicks::WhenShort`]: the thread's CPU clock up to which its samples pay for its
    /// CPU, one period each ([`pay`]); a wall tick goes to it once its clock is past that.
    paid_cpu_ns: AtomicI64,
}

impl Slot {
    const fn new() -> Self {
        Self {
            state: AtomicU8::new(FREE),
            generation: AtomicU32::new(0),
            tid: AtomicI32::new(0),
            timer: AtomicUsize::new(0),
            buffers: [const { Buffer::new() }; BATCH],
            written: AtomicU32::new(0),
            read: AtomicU32::new(0),
            taken: AtomicU32::new(0),
            in_job: AtomicBool::new(false),
            last_tick_cpu_ns: AtomicI64::new(0),
            random: AtomicU64::new(0),
            kick_cpu_ns: AtomicI64::new(0),
            kick_pending: AtomicBool::new(false),
            paid_cpu_ns: AtomicI64::new(0),
        }
    }
}

static SLOTS: [Slot; MAX_SLOTS] = [const { Slot::new() }; MAX_SLOTS];
/// Slots up to this index were ever armed in this process: the loops over the slots (each
/// job's drain among them) stop there, touching no more memory than the threads need.
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// The slots that may be armed.
fn used_slots() -> &'static [Slot] {
    &SLOTS[..SLOTS_USED.load(Acquire).min(MAX_SLOTS)]
}

/// Whether signals sample: false before `start` and after `stop`.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// [`Mode::Handler`] if true.
static IN_HANDLER: AtomicBool = AtomicBool::new(true);
/// Whether the trigger also signals the threads that run (see "Wall ticks").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WallTicks {
    /// CPU ticks only.
    Off = 0,
    /// At each of the trigger's ticks.
    On = 1,
    /// To a running thread whose samples fall short of one per period of its CPU ([`pay`]):
    /// the CPU ticks fell short (on a loaded machine a thread's CPU slices often end between
    /// two scheduler ticks, which then miss it).
    WhenShort = 2,
}
/// A [`WallTicks`], as its number.
static WALL_TICKS: AtomicU8 = AtomicU8::new(WallTicks::Off as u8);
/// Set in a wall tick's signal value: the tick is a sample, with no draw.
const KICK_BIT: usize = 1 << 15;
/// The slot index in a signal value.
const INDEX_MASK: usize = KICK_BIT - 1;
/// The signal number in use (0: the handler is not installed yet).
static SIGNO: AtomicI32 = AtomicI32::new(0);
/// The job the handler registers.
static JOB: AtomicUsize = AtomicUsize::new(0);
/// Samples asked for per second of a thread's CPU.
static HZ: AtomicU32 = AtomicU32::new(0);
/// The kernel's scheduler tick as measured: the average CPU a thread uses from one of its
/// ticks to the next (each tick a thread runs through stands for one tick of its CPU on
/// average, whatever it does between them; 0: not measured yet). Process-wide, kept across
/// runs. Not the shortest wall time between two ticks: each CPU has its own tick, so a thread
/// that moves between CPUs sees shorter gaps.
static TICK_NS: AtomicI64 = AtomicI64::new(0);

/// Marks thread `tid` as running one of the profiler's jobs (or no longer): a tick that comes
/// then is the profiler's own CPU, which it leaves out of the thread's account. With the GVL.
pub fn set_in_job(tid: i32, in_job: bool) {
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE && slot.tid.load(Acquire) == tid {
            slot.in_job.store(in_job, Release);
        }
    }
}
/// The fork generation the slots' timers were made in.
static SLOTS_GENERATION: AtomicU64 = AtomicU64::new(0);
/// Taken (with the GVL) around arming and disarming, so that two never race for a slot.
static ARMING: Mutex<()> = Mutex::new(());

/// What the handler did, for `stats`. Counted per run ([`start`] clears them).
pub struct Counters {
    pub signals: AtomicU64,
    /// Wall ticks: signals the trigger sent to running threads, and sends the kernel refused.
    pub kicks: AtomicU64,
    pub kick_failures: AtomicU64,
    /// Wall ticks after which the trigger moved off its CPU ([`hop`]).
    pub hops: AtomicU64,
    /// Ticks left out by the draw (see "Which CPU ticks are samples").
    pub passed_over: AtomicU64,
    /// [`WallTicks::WhenShort`]: CPU ticks drawn but left out, the thread's samples being a
    /// period or more ahead of its CPU ([`ahead`]).
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
    /// Jobs that took samples from the slots (each takes a batch or less, see "Batches").
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

    fn clear(&self) {
        for (_, c) in self.named() {
            c.store(0, Relaxed);
        }
    }
}

/// Keeps the sampling signal from the calling thread while it lives (a tick that comes
/// meanwhile waits, and is delivered when it is dropped): for the profiler's own measurements.
pub struct BlockedHere(Option<libc::sigset_t>, std::marker::PhantomData<*const ()>);

impl BlockedHere {
    pub fn new() -> Self {
        let signo = SIGNO.load(Acquire);
        if signo == 0 {
            return Self(None, std::marker::PhantomData);
        }
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset fill it; pthread_sigmask only
        // changes the calling thread's mask and writes the old one into `old`.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signo);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return Self(None, std::marker::PhantomData);
            }
            Self(Some(old), std::marker::PhantomData)
        }
    }
}

impl Drop for BlockedHere {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: restores the mask saved in `new`, on the same thread (the PhantomData
            // raw pointer keeps it from being sent to another).
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        }
    }
}

/// Whether the trigger's wall ticks signal the threads at each of its ticks (see "Wall
/// ticks"); not [`WallTicks::WhenShort`], whose ticks signal only the threads the CPU ticks
/// left short.
pub fn wall_ticks() -> bool {
    ENABLED.load(Acquire) && WALL_TICKS.load(Acquire) == WallTicks::On as u8
}

/// The kernel's tick as measured so far, in ns (0: not yet).
pub fn tick_ns() -> i64 {
    TICK_NS.load(Acquire)
}

/// The signal in use, or 0 if none was installed yet.
pub fn signal() -> i32 {
    SIGNO.load(Acquire)
}

/// The signal's name, e.g. `SIGRTMIN+8`.
pub fn signal_name(signo: i32) -> String {
    let base = libc::SIGRTMIN();
    if signo >= base {
        format!("SIGRTMIN+{}", signo - base)
    } else {
        format!("signal {signo}")
    }
}

/// Threads armed now.
pub fn armed() -> usize {
    used_slots().iter().filter(|s| s.state.load(Acquire) != FREE).count()
}

/// Installs the handler on the first real-time signal that has none (once per process), and
/// starts sampling with `mode`; `job` is the postponed job the handler registers.
///
/// # Errors
///
/// When no real-time signal is free, or `sigaction` fails: a message naming the signal.
pub fn start(
    mode: Mode,
    hz: u32,
    wall_ticks: WallTicks,
    job: unsafe extern "C" fn(*mut c_void),
) -> Result<i32, String> {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    disarm_all_locked();
    // What the last run left is not this run's.
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
    COUNTERS.clear();
    HZ.store(hz, Release);
    JOB.store(job as *const () as usize, Release);
    IN_HANDLER.store(mode == Mode::Handler, Release);
    WALL_TICKS.store(wall_ticks as u8, Release);
    let signo = install()?;
    ENABLED.store(true, Release);
    Ok(signo)
}

/// Stops sampling: every thread is disarmed. The handler stays installed.
pub fn stop() {
    ENABLED.store(false, Release);
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    disarm_all_locked();
}

/// The first free real-time signal, with our handler installed on it (or the one installed
/// already).
fn install() -> Result<i32, String> {
    let installed = SIGNO.load(Acquire);
    if installed != 0 {
        return Ok(installed);
    }
    // glibc keeps the first real-time signals for itself (SIGRTMIN() is past them); others
    // (threading libraries, runtimes) often take the first few of the rest.
    let first = libc::SIGRTMIN() + 8;
    for signo in first..=libc::SIGRTMAX() {
        // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only reads.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `signo` is a valid signal number (between SIGRTMIN and SIGRTMAX).
        if unsafe { libc::sigaction(signo, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.sa_sigaction != libc::SIG_DFL {
            continue; // somebody's (or ignored): leave it alone
        }
        // SAFETY: zeroed, then every field we rely on set; `on_signal` has the SA_SIGINFO
        // signature and never unwinds.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: `sa_mask` is a valid sigset_t to fill.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: valid action; no old action wanted.
        if unsafe { libc::sigaction(signo, &action, std::ptr::null_mut()) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "could not install the sampling signal handler on {}: {e}",
                signal_name(signo)
            ));
        }
        SIGNO.store(signo, Release);
        return Ok(signo);
    }
    Err(format!(
        "every real-time signal from {} to SIGRTMAX already has a handler: none is free for sampling (start with signals: false)",
        signal_name(first)
    ))
}

/// In a forked child, the slots describe the parent's timers, which the child does not have:
/// forget them (no `timer_delete`: the ids mean nothing here). Called with [`ARMING`].
fn forget_if_forked() {
    let generation = crate::recorder::fork::fork_generation();
    if SLOTS_GENERATION.swap(generation, AcqRel) == generation {
        return;
    }
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
    for slot in &SLOTS {
        slot.generation.fetch_add(1, AcqRel);
        slot.timer.store(0, Release);
        slot.tid.store(0, Release);
        slot.state.store(FREE, Release);
        for buffer in &slot.buffers {
            buffer.state.store(EMPTY, Release);
        }
    }
}

/// Arms the thread `tid` (a thread of this process, with the GVL held): a CPU-time timer
/// that expires at every scheduler tick the thread runs through. Returns false when it
/// cannot be armed (all slots taken, or the kernel refused), which is counted; true if armed
/// (or already).
pub fn arm(tid: i32) -> bool {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    if used_slots().iter().any(|s| s.state.load(Acquire) != FREE && s.tid.load(Acquire) == tid) {
        return true;
    }
    let armed = arm_locked(tid);
    if armed {
        COUNTERS.armed_peak.fetch_max(self::armed() as u64, Relaxed);
        if blocks_signal(tid, SIGNO.load(Acquire)) {
            COUNTERS.blocked.fetch_add(1, Relaxed);
        }
    } else {
        COUNTERS.arm_failures.fetch_add(1, Relaxed);
    }
    armed
}

fn arm_locked(tid: i32) -> bool {
    let signo = SIGNO.load(Acquire);
    let Some((index, slot)) = SLOTS.iter().enumerate().find(|(_, s)| s.state.load(Acquire) == FREE)
    else {
        return false;
    };
    if signo == 0 || tid <= 0 {
        return false;
    }
    for buffer in &slot.buffers {
        if buffer.frames.load(Acquire).is_null() {
            let frames = Box::new(Frames { frames: [0; DEPTH], lines: [0; DEPTH] });
            buffer.frames.store(Box::into_raw(frames), Release);
        }
        buffer.state.store(EMPTY, Release);
    }
    slot.written.store(0, Release);
    slot.read.store(0, Release);
    SLOTS_USED.fetch_max(index + 1, AcqRel);
    let generation = slot.generation.fetch_add(1, AcqRel).wrapping_add(1);
    // SAFETY: a zeroed sigevent is valid; the fields the kernel reads for SIGEV_THREAD_ID
    // (notify, signo, value, tid) are set below.
    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
    event.sigev_notify = libc::SIGEV_THREAD_ID;
    event.sigev_signo = signo;
    event.sigev_value = libc::sigval { sival_ptr: signal_value(index, generation) as *mut c_void };
    event.sigev_notify_thread_id = tid;
    let mut timer: libc::timer_t = std::ptr::null_mut();
    // SAFETY: `event` and `timer` are valid for the call; the kernel checks that the clock
    // is a thread of this process's (EINVAL otherwise).
    if unsafe { libc::timer_create(cpu_clock_id(tid), &mut event, &mut timer) } != 0 {
        return false;
    }
    slot.tid.store(tid, Release);
    slot.timer.store(timer as usize, Release);
    slot.in_job.store(false, Release);
    slot.last_tick_cpu_ns.store(0, Release);
    let seed = (clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(1) as u64) ^ ((tid as u64) << 32);
    slot.random.store(seed | 1, Release);
    // The trigger's first look can then tell whether the thread runs (and, for
    // `WallTicks::WhenShort`, what its samples must pay for: its CPU from now, see `pay`).
    let cpu_now = clock_ns(cpu_clock_id(tid)).unwrap_or(0);
    slot.kick_cpu_ns.store(cpu_now, Release);
    slot.paid_cpu_ns.store(cpu_now.saturating_add(period_ns()), Release);
    slot.kick_pending.store(false, Release);
    slot.state.store(ARMED, Release);
    let spec = libc::itimerspec {
        it_interval: timespec(PROBE_PERIOD_NS),
        it_value: timespec(PROBE_PERIOD_NS),
    };
    // SAFETY: `timer` was just created; `spec` is a valid itimerspec.
    if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
        disarm_slot(slot);
        return false;
    }
    true
}

/// Whether thread `tid` blocks `signo` (its `SigBlk` in `/proc/self/task/<tid>/status`).
fn blocks_signal(tid: i32, signo: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigBlk:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| signo >= 1 && mask & (1 << (signo - 1)) != 0)
}

fn timespec(ns: i64) -> libc::timespec {
    libc::timespec { tv_sec: (ns / 1_000_000_000) as _, tv_nsec: (ns % 1_000_000_000) as _ }
}

/// What the timer's signal carries: the slot's index and generation.
fn signal_value(index: usize, generation: u32) -> usize {
    index | ((generation as usize & 0xff_ffff) << 16)
}

/// Disarms the thread `tid` if armed. With the GVL held.
pub fn disarm(tid: i32) {
    let _arming = ARMING.lock().unwrap_or_else(|p| p.into_inner());
    forget_if_forked();
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE && slot.tid.load(Acquire) == tid {
            disarm_slot(slot);
        }
    }
}

fn disarm_all_locked() {
    for slot in used_slots() {
        if slot.state.load(Acquire) != FREE {
            disarm_slot(slot);
        }
    }
}

fn disarm_slot(slot: &Slot) {
    let timer = slot.timer.swap(0, AcqRel);
    if timer != 0 {
        // SAFETY: a timer this process created (the slots of a parent's are forgotten in a
        // forked child before we get here); deleting it also drops its pending signal.
        unsafe { libc::timer_delete(timer as libc::timer_t) };
    }
    // A signal of the old timer already being handled sees another generation from here on.
    slot.generation.fetch_add(1, AcqRel);
    // Its samples are the profiler's still: kept for its next drain (with the GVL, as the
    // callers are).
    if let Ok(mut kept) = KEPT.lock() {
        drain_slot(slot, crate::sampling::job::own_tid(), &mut |sample| kept.push(sample));
    }
    // A handler on another thread may still be writing (see the module doc): let it finish.
    for buffer in &slot.buffers {
        let mut spins = 0u32;
        while buffer.state.load(Acquire) == WRITING && spins < 1_000_000 {
            std::hint::spin_loop();
            spins += 1;
        }
        if matches!(buffer.state.load(Acquire), FULL) {
            COUNTERS.dropped.fetch_add(1, Relaxed);
        }
        buffer.state.store(EMPTY, Release);
    }
    slot.tid.store(0, Release);
    slot.state.store(FREE, Release);
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
static KEPT: Mutex<Vec<Sample>> = Mutex::new(Vec::new());

/// [`drain`] for one slot.
fn drain_slot(slot: &Slot, own_tid: i32, take: &mut impl FnMut(Sample)) {
    // At most a batch: the handler writes only with the GVL, which the caller holds.
    for _ in 0..BATCH {
        let read = slot.read.load(Acquire);
        let buffer = &slot.buffers[read as usize % BATCH];
        if buffer.state.compare_exchange(FULL, READING, AcqRel, Acquire).is_err() {
            break;
        }
        let tid = slot.tid.load(Acquire);
        let depth = buffer.depth.load(Acquire);
        if depth == READ_AT_JOB && tid != own_tid {
            buffer.state.store(FULL, Release);
            break;
        }
        let key = key(tid, slot.taken.fetch_add(1, AcqRel));
        let kept = if depth == READ_AT_JOB {
            // This thread's own (checked above).
            crate::sampling::stack_capture::capture_here(key)
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

/// Whether `v` is what `rb_profile_frames` gives: an iseq or a method entry (`T_IMEMO`
/// objects). A frame that a compaction moved would be `T_MOVED` (see the module doc).
fn is_frame_object(v: rb_sys::VALUE) -> bool {
    crate::vm::is_imemo(v)
}

/// The signal handler. Never unwinds: it only calls functions that do not panic.
extern "C" fn on_signal(_signo: libc::c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    // SAFETY: errno is thread-local; saved and restored so the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    handle(info);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn handle(info: *mut libc::siginfo_t) {
    COUNTERS.signals.fetch_add(1, Relaxed);
    if !ENABLED.load(Acquire) || info.is_null() {
        return;
    }
    // SAFETY: the kernel passes a valid siginfo; for a timer's signal `si_value` is the
    // sigev_value we set in `arm`.
    let value = unsafe { (*info).si_value().sival_ptr } as usize;
    let Some(slot) = SLOTS.get(value & INDEX_MASK) else { return };
    let wall_tick = value & KICK_BIT != 0;
    if wall_tick {
        slot.kick_pending.store(false, Release);
    }
    if (slot.generation.load(Acquire) as usize & 0xff_ffff) != value >> 16 {
        COUNTERS.stale.fetch_add(1, Relaxed);
        return;
    }
    let now = clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0);
    let cpu = own_cpu_ns();
    if !wall_tick && !drawn(slot, cpu) {
        COUNTERS.passed_over.fetch_add(1, Relaxed);
        return;
    }
    if !wall_tick && ahead(slot, cpu) {
        COUNTERS.ahead.fetch_add(1, Relaxed);
        return;
    }
    if slot.in_job.load(Acquire) {
        COUNTERS.in_job.fetch_add(1, Relaxed);
        return;
    }
    // SAFETY: both only read the calling thread's and the VM's state (see the module doc);
    // the VM is running (ENABLED is cleared by an end proc before it is torn down).
    if unsafe { crate::vm::ruby_thread_has_gvl_p() } == 0 {
        COUNTERS.without_gvl.fetch_add(1, Relaxed);
        return;
    }
    let in_handler = IN_HANDLER.load(Acquire);
    // SAFETY: as above.
    let in_gc = unsafe { rb_sys::rb_during_gc() } != 0;
    // Read at the GC step's end if `gc_ticks` is on, else dropped.
    if in_gc && !(in_handler && crate::sampling::gc_ticks::on()) {
        COUNTERS.in_gc.fetch_add(1, Relaxed);
        return;
    }
    let written = slot.written.load(Acquire);
    let waiting = written.wrapping_sub(slot.read.load(Acquire));
    let buffer = &slot.buffers[written as usize % BATCH];
    // At the job, one sample at a time: the job reads the stack it finds then, once.
    if (!in_handler && waiting > 0)
        || buffer.state.compare_exchange(EMPTY, WRITING, AcqRel, Acquire).is_err()
    {
        // The previous samples still wait: ask for the job again (one may have been put off).
        COUNTERS.slot_busy.fetch_add(1, Relaxed);
        trigger_job();
        return;
    }
    buffer.cpu_ns.store(cpu, Release);
    buffer.at_ns.store(now, Release);
    let depth = if in_gc {
        GC_TICKS_WAITING.store(true, Release);
        READ_AT_GC_EXIT
    } else if in_handler {
        // SAFETY: a Ruby thread with the GVL (checked above).
        if !unsafe { crate::vm::current_stack_walkable() } {
            COUNTERS.unwalkable.fetch_add(1, Relaxed);
            buffer.state.store(EMPTY, Release);
            return;
        }
        let frames = buffer.frames.load(Acquire);
        // SAFETY: the buffer was allocated at arm and is never freed; it is WRITING, so
        // nobody else reads or writes it.
        let frames = unsafe { &mut *frames };
        // SAFETY: reads the thread's own frames as rb_profile_frames does, with no allocation,
        // lock or system call (vm_frames, or rb_profile_frames itself): sound here (module doc).
        let n = unsafe {
            crate::sampling::stack_capture::read_current(&mut frames.frames, &mut frames.lines)
        };
        COUNTERS.read_in_handler.fetch_add(1, Relaxed);
        n.min(DEPTH) as u32
    } else {
        COUNTERS.read_at_job.fetch_add(1, Relaxed);
        READ_AT_JOB
    };
    buffer.depth.store(depth, Release);
    pay(slot, cpu);
    buffer.state.store(FULL, Release);
    slot.written.store(written.wrapping_add(1), Release);
    // A batch waits for one job (see "Batches"); at the job, each sample has its own.
    if !in_handler || waiting as usize + 1 >= BATCH {
        trigger_job();
    }
}

/// The GC_EXIT hook (`gc_ticks`), at the end of a GC step, on the thread that ran it, with the
/// GVL: reads this thread's stack for each of its samples whose tick came inside the GC
/// ([`READ_AT_GC_EXIT`]), leaf first under [`crate::sampling::stack_capture::GC_LEAF`]. Any other
/// thread's such sample (a thread that had the GVL taken by a time slice and waits for it
/// back reads as holding it, module doc) gets no stack. No allocation, no lock, no Ruby call.
pub fn read_gc_ticks() {
    if !GC_TICKS_WAITING.swap(false, AcqRel) {
        return;
    }
    let own_tid = crate::sampling::job::own_tid();
    for slot in used_slots() {
        if slot.state.load(Acquire) == FREE {
            continue;
        }
        let own = slot.tid.load(Acquire) == own_tid;
        for buffer in &slot.buffers {
            if buffer.depth.load(Acquire) != READ_AT_GC_EXIT
                || buffer.state.compare_exchange(FULL, WRITING, AcqRel, Acquire).is_err()
            {
                continue;
            }
            // SAFETY: a Ruby thread with the GVL (the GC's hook).
            let depth = if own && unsafe { crate::vm::current_stack_walkable() } {
                // SAFETY: allocated at arm, never freed; WRITING, so nobody else touches it.
                let frames = unsafe { &mut *buffer.frames.load(Acquire) };
                frames.frames[0] = crate::sampling::stack_capture::GC_LEAF;
                frames.lines[0] = 0;
                // SAFETY: the thread's own frames, with the GVL, after the GC step moved
                // everything it moves (`gc_ticks`); no allocation, lock or system call.
                let n = unsafe {
                    crate::sampling::stack_capture::read_current(
                        &mut frames.frames[1..],
                        &mut frames.lines[1..],
                    )
                };
                let counter = if n == 0 { &COUNTERS.in_gc } else { &COUNTERS.read_at_gc_exit };
                counter.fetch_add(1, Relaxed);
                if n == 0 {
                    0
                } else {
                    (n + 1).min(DEPTH) as u32
                }
            } else {
                COUNTERS.in_gc.fetch_add(1, Relaxed);
                0
            };
            buffer.depth.store(depth, Release);
            buffer.state.store(FULL, Release);
        }
    }
}

/// [`WallTicks::WhenShort`]: whether the thread's samples pay for a period or more of CPU it
/// has not used yet (CPU ticks drawn close together). Such a tick is left out: the wall ticks
/// make up what the CPU ticks miss, so without this the CPU ticks' lucky runs would come on
/// top (a thread would get well over `hz` quiet). Which ticks it leaves out depends on
/// the thread's clock only, not on what it runs. Atomics only (async-signal-safe).
fn ahead(slot: &Slot, cpu: i64) -> bool {
    WALL_TICKS.load(Acquire) == WallTicks::WhenShort as u8
        && slot.paid_cpu_ns.load(Acquire) - cpu > period_ns()
}

/// A period of CPU: `1/hz`, in ns.
fn period_ns() -> i64 {
    1_000_000_000 / i64::from(HZ.load(Acquire).max(1))
}

/// Samples a thread may owe, or be ahead by, in periods ([`pay`]).
const CARRIED_PERIODS: i64 = 2;

/// A sample of the thread whose CPU clock reads `cpu` pays for one period of its CPU. What it
/// owes (its clock past what its samples paid for) or is ahead by is carried to its next
/// samples up to [`CARRIED_PERIODS`], so that a wall tick can make up for a tick the CPU
/// timer missed, while neither a long stretch without GVL nor a run of lucky CPU ticks
/// decides its rate for long. Only its own handler writes it; atomics only
/// (async-signal-safe).
fn pay(slot: &Slot, cpu: i64) {
    let period = period_ns();
    let carried = CARRIED_PERIODS * period;
    let paid = slot.paid_cpu_ns.load(Acquire).max(cpu - carried) + period;
    slot.paid_cpu_ns.store(paid.min(cpu + carried), Release);
}

/// Whether this tick is a sample: each is, independently, with probability `hz * tick`
/// (1 when `hz` is at or above the kernel's tick rate). Also measures the tick. Only atomics
/// and integer arithmetic: async-signal-safe.
fn drawn(slot: &Slot, cpu_ns: i64) -> bool {
    let last = slot.last_tick_cpu_ns.swap(cpu_ns, AcqRel);
    let used = cpu_ns - last;
    if last > 0 && used > 0 && used <= MAX_TICK_NS {
        // Racy across threads on other CPUs (a lost update only slows the average down).
        let tick = TICK_NS.load(Acquire);
        let next = if tick == 0 { used } else { tick + (used - tick) / TICK_AVERAGE };
        TICK_NS.store(next.max(1), Release);
    }
    let tick = TICK_NS.load(Acquire);
    if tick <= 0 {
        return true; // not measured yet: every tick (the rate is then at most the tick's)
    }
    // P = hz * tick / 1e9, as a fraction of 2^64.
    let threshold = (u128::from(HZ.load(Acquire)) * tick as u128 * (1u128 << 64)) / 1_000_000_000;
    if threshold >= 1 << 64 {
        return true;
    }
    let mut x = slot.random.load(Relaxed);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    slot.random.store(x, Relaxed);
    u128::from(x.wrapping_mul(0x2545_f491_4f6c_dd1d)) < threshold
}

/// What the trigger's look at the armed threads found ([`kick`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct Look {
    /// The trigger has work at this rate: it sent a wall tick, or found a thread that ran but
    /// is off its CPU now (a loaded machine, where the looks make up what the CPU ticks miss).
    pub work: bool,
    /// A thread ran since the previous look and is not on a CPU now: it went to wait (or was
    /// displaced), so a wall pass has something new to record of it (see "Batches").
    pub stopped: bool,
}

/// Whether the handler keeps its samples in batches (see "Batches"): it reads the stacks.
pub fn batching() -> bool {
    ENABLED.load(Acquire) && IN_HANDLER.load(Acquire)
}

/// Whether every thread the profiler samples in this run has a timer whose signals it takes:
/// none failed to arm, none blocks the signal (see "Batches").
pub fn all_armed() -> bool {
    COUNTERS.arm_failures.load(Relaxed) == 0 && COUNTERS.blocked.load(Relaxed) == 0
}

/// Called by the trigger thread at each of its ticks (no GVL, no Ruby): looks at each armed
/// thread's CPU clock, and with wall ticks sends the sampling signal to each that is on a CPU
/// now: its CPU clock moved since the trigger's previous look, and again between two reads a
/// moment apart. A thread that waits (for I/O, a lock, the GVL, the scheduler) uses no CPU
/// and is left alone. Without wall ticks it only looks, and only while [`batching`].
pub fn kick() -> Look {
    let wall = WALL_TICKS.load(Acquire);
    let ticks = wall != WallTicks::Off as u8;
    if !ENABLED.load(Acquire) || !(ticks || batching()) {
        return Look::default();
    }
    // WhenShort: only a thread whose samples have not paid for its CPU ([`pay`]). Which
    // threads that picks depends on their clocks, not on what they run: no bias.
    let when_short = wall == WallTicks::WhenShort as u8;
    let signo = SIGNO.load(Acquire);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let (mut sent, mut displaced) = (0, 0);
    for (index, slot) in used_slots().iter().enumerate() {
        if slot.state.load(Acquire) == FREE || slot.kick_pending.load(Acquire) {
            continue;
        }
        let generation = slot.generation.load(Acquire);
        let tid = slot.tid.load(Acquire);
        if tid <= 0 {
            continue;
        }
        let clock = cpu_clock_id(tid);
        let Some(first) = clock_ns(clock) else { continue };
        let last = slot.kick_cpu_ns.swap(first, AcqRel);
        if first <= last {
            continue; // no CPU since the last look: waiting
        }
        let Some(second) = clock_ns(clock) else { continue };
        slot.kick_cpu_ns.store(second, Release);
        if second <= first {
            // Not on a CPU between the two reads: gone to wait, or ready to run while another
            // thread has its CPU (this trigger itself, maybe: see "Wall ticks").
            displaced += 1;
            continue;
        }
        if !ticks {
            continue;
        }
        if when_short && second < slot.paid_cpu_ns.load(Acquire) {
            continue; // its samples pay for its CPU: the CPU ticks keep up
        }
        if slot.generation.load(Acquire) != generation {
            continue; // disarmed (or armed anew) meanwhile
        }
        slot.kick_pending.store(true, Release);
        if send(pid, tid, signo, signal_value(index, generation) | KICK_BIT) {
            COUNTERS.kicks.fetch_add(1, Relaxed);
            sent += 1;
        } else {
            slot.kick_pending.store(false, Release);
            COUNTERS.kick_failures.fetch_add(1, Relaxed);
        }
    }
    // Twice in a row: a thread that has just gone to wait also reads as run-but-not-running,
    // once (at the next tick its clock has not moved); one the trigger displaces, tick after
    // tick. (Hopping at the first, a thread that works 10 ms and waits 20 ms at 999 Hz, two
    // busy processes beside, made the trigger hop at nearly every tick: 698-710 samples a
    // CPU-second against 815-973 without the hop.)
    let stopped = displaced > 0;
    if !ticks {
        return Look { work: false, stopped };
    }
    if sent > 0 || displaced == 0 {
        DISPLACED_STREAK.store(0, Relaxed);
    } else if DISPLACED_STREAK.fetch_add(1, Relaxed) + 1 >= 2 {
        DISPLACED_STREAK.store(0, Relaxed);
        hop();
    }
    Look { work: sent > 0 || stopped, stopped }
}

/// Wall ticks in a row that found a thread displaced and none running (only the trigger
/// thread calls [`kick`]).
static DISPLACED_STREAK: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The trigger thread's CPUs when it first hopped (what it may run on).
    static TRIGGER_CPUS: std::cell::Cell<Option<libc::cpu_set_t>> = const { std::cell::Cell::new(None) };
}

/// Wall ticks: a thread ran since the last look but not between the two reads, and none did:
/// the trigger may have taken its CPU (the scheduler wakes the trigger where it last ran,
/// often the busy thread's CPU: under load every tick was then lost, 0 wall ticks in a
/// 1.5 s profile). So the trigger moves to its other CPUs for the next tick (its affinity:
/// every CPU it may run on but this one). Each tick that finds the thread running keeps it
/// where it is.
fn hop() {
    // SAFETY: sched_getcpu has no preconditions.
    let here = unsafe { libc::sched_getcpu() };
    if here < 0 || here as usize >= libc::CPU_SETSIZE as usize {
        return;
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let allowed = TRIGGER_CPUS.with(|cpus| {
        cpus.get().or_else(|| {
            // SAFETY: a zeroed cpu_set_t is an empty set; the kernel writes at most `size`
            // bytes into it (pid 0: the calling thread).
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            let ok = unsafe { libc::sched_getaffinity(0, size, &mut set) } == 0;
            let set = ok.then_some(set);
            cpus.set(set);
            set
        })
    });
    let Some(mut set) = allowed else { return };
    // SAFETY: `here` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_CLR(here as usize, &mut set) };
    // SAFETY: reads the set only.
    if unsafe { libc::CPU_COUNT(&set) } == 0 {
        return; // one CPU: nowhere to go
    }
    // SAFETY: a valid set of `size` bytes; pid 0 is the calling thread (the trigger). A
    // failure (a CPU taken away meanwhile) leaves the affinity as it was.
    if unsafe { libc::sched_setaffinity(0, size, &set) } == 0 {
        COUNTERS.hops.fetch_add(1, Relaxed);
    }
}

/// Queues `signo` with `value` to thread `tid` of process `pid` (`rt_tgsigqueueinfo`, what
/// `pthread_sigqueue` calls, for a thread known by its Linux id).
fn send(pid: i32, tid: i32, signo: i32, value: usize) -> bool {
    // SAFETY: a zeroed siginfo_t is valid; the fields the kernel copies for SI_QUEUE (signo,
    // code, pid, uid, value) are set below, at the offsets of Linux's `struct siginfo`
    // (`_sifields._rt`: pid, uid, then the sigval, after the three ints).
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        info.si_signo = signo;
        info.si_code = libc::SI_QUEUE;
        let fields = (&mut info as *mut libc::siginfo_t).cast::<u8>().add(SIFIELDS_OFFSET);
        fields.cast::<libc::pid_t>().write(pid);
        fields.add(4).cast::<libc::uid_t>().write(libc::getuid());
        fields.add(8).cast::<usize>().write(value);
        libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, signo, &info) == 0
    }
}

/// Where `_sifields` starts in Linux's `siginfo_t` on 64-bit targets: after `si_signo`,
/// `si_errno`, `si_code` and padding to 8 bytes.
const SIFIELDS_OFFSET: usize = 16;

/// Asks for the job given to [`start`]: async-signal-safe (see `postponed`); it runs on this
/// thread, which holds the GVL, at its next interrupt check.
fn trigger_job() {
    let job = JOB.load(Acquire);
    if job != 0 {
        // SAFETY: JOB only ever holds the `postponed::Job` given to `start`.
        let job: crate::vm::postponed::Job = unsafe { std::mem::transmute(job) };
        crate::vm::postponed::trigger(job);
    }
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
            if depth == READ_AT_JOB || depth == READ_AT_GC_EXIT {
                continue;
            }
            let frames = buffer.frames.load(Acquire);
            // SAFETY: the buffer is FULL or READING: the handler does not write it, and its
            // first `depth` frames were alive when read and marked since (module doc).
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
