//! The profiler's Ruby handler (`ThreadSampler`, with `call` and `signal_samples`), which both
//! sampling jobs call ([`call_handler`]): the trigger's (`job`) and the signal handler's
//! (`signal_job`); and what those two jobs share: whether sampling is on ([`ENABLED`]), the
//! count of jobs that sampled ([`JOBS`]) and the flag that tells the memory hooks the calling
//! thread runs a job ([`in_job_here`]).
//!
//! The jobs' side of the sampler, from the bottom up: the capture (`signal_sampler`: the
//! handler and its buffers) uses no other part; the schedule (`trigger`, and the timers in
//! `signal_sampler/`) uses the capture; the charge (this file, `signal_job`, then `job`, which
//! starts and stops them all) uses both. Below them all, `clocks` and `random`.
//!
//! [`HANDLER`] is a GC root (`rb_gc_register_address` in `job::init`, which also pins it
//! against compaction); it is only read and written with the GVL held.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use magnus::{prelude::*, rb_sys::FromRawValue, Error, Value};

use crate::sampling::clocks::thread_cpu::own_tid;
use crate::sampling::signal_sampler;

/// Whether sampling is on: jobs still queued when it is turned off do nothing.
pub(super) static ENABLED: AtomicBool = AtomicBool::new(false);
/// The handler (a Ruby object with `call` and `signal_samples`), or Qnil. A GC root.
pub(super) static HANDLER: AtomicUsize = AtomicUsize::new(rb_sys::Qnil as usize);
/// Jobs that sampled (the trigger watches it to know when to wake the Ruby sampler thread).
pub(super) static JOBS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The job runs on this thread (possibly switched out in its handler).
    pub(super) static JOB_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running the job: the memory hooks leave its allocations
/// and GC out (see `allocations`, `gc_events`).
pub fn in_job_here() -> bool {
    JOB_HERE.with(Cell::get)
}

/// Calls the handler (if any) with the program's asynchronous interrupts deferred and the
/// memory hooks told to leave the job out. With the GVL, in a job.
pub(super) fn call_handler<T>(call: impl FnOnce(Value) -> Result<T, Error>) -> Option<T> {
    let raw = HANDLER.load(Ordering::Acquire);
    // SAFETY: HANDLER holds Qnil or a live object kept by the GC root; we hold the GVL.
    let handler = unsafe { Value::from_raw(raw as rb_sys::VALUE) };
    if handler.is_nil() {
        return None;
    }
    // The program's Thread#raise / Thread#kill / Timeout wait until the job is over, so
    // that they reach the program's code, not the handler (see `interrupt_mask`).
    // SAFETY: in a postponed job with the GVL; dropped before the job returns.
    let deferred = unsafe { crate::sampling::interrupt_mask::defer_async_interrupts() };
    let was_here = JOB_HERE.with(|here| here.replace(true));
    let tid = own_tid();
    // Jobs do not nest on a thread (the flush masks the postponed-job interrupt), so the
    // handler's end is the end of the thread's time in a job.
    signal_sampler::set_in_job(tid, true);
    // magnus calls through `rb_protect` and clears `$!`: an exception comes back as an
    // `Err`, which the handler (it rescues everything) should never produce anyway.
    let result = call(handler).ok();
    signal_sampler::set_in_job(tid, false);
    JOB_HERE.with(|here| here.set(was_here));
    drop(deferred);
    result
}
