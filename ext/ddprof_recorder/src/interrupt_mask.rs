//! Deferring the running thread's asynchronous interrupts (`Thread#raise`, `Thread#kill`,
//! `Timeout`) while the sampling job runs the profiler's Ruby handler.
//!
//! The job runs inside `rb_postponed_job_flush`, which masks only the postponed-job and trap
//! interrupts. The handler is Ruby code: its interrupt checks would deliver an exception that
//! another thread raised at the sampled thread meanwhile (the handler can be switched out at
//! a time slice), and the exception would end inside the handler, where `rb_protect` catches
//! it: the program's `Thread#raise` or `Timeout` would be lost and its thread would run on.
//! Found by `spec/profiler/disturbance_spec.rb` (a thread killed or timed out while profiled
//! at 999 Hz never stopped). Ruby itself does what this module does when the GC runs
//! finalizers from a postponed job: `finalize_deferred` (Ruby 3.1 `gc.c`) sets
//! `PENDING_INTERRUPT_MASK` in the execution context's `interrupt_mask` around them. A masked
//! interrupt stays pending (`threadptr_get_interrupts` keeps masked bits), so once the mask is
//! restored, Ruby delivers it at the thread's next check, after the job: where the program is.
//!
//! There is no public API for it, so the fields are reached by their offsets in Ruby 3.1,
//! checked in Debian's `libruby-3.1.so.3.1.2`: `rb_thread_interrupted` loads the thread's
//! execution context from offset 0x28 of `rb_thread_t` (`th->ec`) and its `interrupt_flag`
//! from 0x20; `finalize_deferred` does `orl $0x2, 0x24(ec)` (`interrupt_mask`). Two guards:
//! it is compiled for Ruby 3.1 only, and it writes only if the mask it reads has the
//! postponed-job and trap bits set (`0x4 | 0x8`), which `rb_postponed_job_flush` sets before
//! running jobs: a wrong offset would not read that. Otherwise it does nothing, and the
//! handler runs unmasked as before.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// How many times the mask was set: `Profiler._native_sampling_stats[:jobs_deferring_interrupts]`
/// (it equals the jobs run when the layout checks pass).
pub static DEFERRING: AtomicU64 = AtomicU64::new(0);

const PENDING_INTERRUPT_MASK: u32 = 0x2;
const POSTPONED_JOB_INTERRUPT_MASK: u32 = 0x4;
const TRAP_INTERRUPT_MASK: u32 = 0x8;

/// Ruby 3.1's offsets (see the module doc).
const THREAD_EC_OFFSET: usize = 0x28;
const EC_INTERRUPT_MASK_OFFSET: usize = 0x24;

/// The running thread's `interrupt_mask`, while it has the pending-interrupt bit set by us.
pub struct Deferred {
    mask: Option<&'static AtomicU32>,
    before: u32,
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(mask) = self.mask {
            mask.store(self.before, Ordering::SeqCst);
        }
    }
}

/// Defers the current thread's asynchronous interrupts until the returned value is dropped.
///
/// # Safety
///
/// Call with the GVL held, from inside a postponed job (so that the execution context is the
/// current thread's and lives until the job returns), and drop the value before the job
/// returns.
pub unsafe fn defer_async_interrupts() -> Deferred {
    let none = Deferred { mask: None, before: 0 };
    if !cfg!(ruby_eq_3_1) {
        return none;
    }
    // SAFETY: the caller holds the GVL; rb_thread_current has no other precondition.
    let thread = unsafe { rb_sys::rb_thread_current() };
    // SAFETY: a Thread is a T_DATA object whose data is its rb_thread_t (Ruby 3.1
    // `vm_core.h`, `rb_thread_ptr`); the object is alive (it is running this code).
    let th = unsafe { rb_sys::RTYPEDDATA_GET_DATA(thread) as *const u8 };
    if th.is_null() {
        return none;
    }
    // SAFETY: `th` points to the running thread's rb_thread_t; `ec` is at this offset in
    // Ruby 3.1 (module doc) and points to the execution context that runs this job.
    let ec = unsafe { *(th.add(THREAD_EC_OFFSET) as *const *const u8) };
    if ec.is_null() {
        return none;
    }
    // SAFETY: `interrupt_mask` is a 4-byte aligned rb_atomic_t at this offset of the live
    // execution context (module doc); other threads only read or atomically update it.
    let mask = unsafe { &*(ec.add(EC_INTERRUPT_MASK_OFFSET) as *const AtomicU32) };
    let before = mask.load(Ordering::SeqCst);
    let flush_bits = POSTPONED_JOB_INTERRUPT_MASK | TRAP_INTERRUPT_MASK;
    if before & flush_bits != flush_bits {
        return none; // not the layout we know: leave it alone
    }
    mask.store(before | PENDING_INTERRUPT_MASK, Ordering::SeqCst);
    DEFERRING.fetch_add(1, Ordering::Relaxed);
    Deferred { mask: Some(mask), before }
}
