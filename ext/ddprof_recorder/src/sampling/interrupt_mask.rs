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
//! Ruby 3.3 and 3.4 do the same (`finalize_deferred` in their `gc.c`), and their
//! `rb_postponed_job_flush` (`vm_trace.c`) masks the same two bits as 3.1's.
//!
//! There is no public API for it, so the fields are reached by their offsets, which
//! `vm::THREAD_EC_OFFSET` gives per Ruby version (checked in each libruby's machine code).
//! Three guards: on a Ruby without checked offsets it does nothing; the `rb_thread_t` must
//! hold the Thread object at `vm::THREAD_SELF_OFFSET`; and it writes only if the mask it
//! reads has the postponed-job and trap bits set (`0x4 | 0x8`), which
//! `rb_postponed_job_flush` sets before running jobs: a wrong offset would not read that.
//! Otherwise it does nothing, counts it (`interrupt_deferral_refused` in the sampling
//! stats), and the handler runs unmasked as before.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::vm::{
    EC_INTERRUPT_MASK_OFFSET, PENDING_INTERRUPT_MASK, POSTPONED_JOB_INTERRUPT_MASK,
    THREAD_EC_OFFSET, THREAD_SELF_OFFSET, TRAP_INTERRUPT_MASK,
};

/// How many times the mask was set: `Profiler._native_sampling_stats[:jobs_deferring_interrupts]`
/// (it equals the jobs run when the layout checks pass).
pub static DEFERRING: AtomicU64 = AtomicU64::new(0);
/// How many times a guard refused (module doc): `..[:interrupt_deferral_refused]`, 0 on a
/// Ruby whose layout we know.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

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
    // SAFETY: as this function's own contract.
    let mask = unsafe { interrupt_mask() };
    let Some(mask) = mask else {
        REFUSED.fetch_add(1, Ordering::Relaxed);
        return Deferred { mask: None, before: 0 };
    };
    let before = mask.load(Ordering::SeqCst);
    mask.store(before | PENDING_INTERRUPT_MASK, Ordering::SeqCst);
    DEFERRING.fetch_add(1, Ordering::Relaxed);
    Deferred { mask: Some(mask), before }
}

/// The running thread's `interrupt_mask`, if every guard of the module doc passes.
///
/// # Safety
///
/// As [`defer_async_interrupts`].
unsafe fn interrupt_mask() -> Option<&'static AtomicU32> {
    // SAFETY: as this function's own contract.
    let mask = unsafe { thread_interrupt_mask() }?;
    let flush_bits = POSTPONED_JOB_INTERRUPT_MASK | TRAP_INTERRUPT_MASK;
    // Not the layout we know, or not inside a flush: leave it alone.
    (mask.load(Ordering::SeqCst) & flush_bits == flush_bits).then_some(mask)
}

/// Whether the layout guards pass on the calling thread, outside a job: the start's
/// self-check (`Profiler#stats[:interrupt_deferral]`, and the profile's `sampling` comment
/// when they fail).
///
/// # Safety
///
/// GVL held, on a Ruby thread.
pub unsafe fn layout_checks() -> bool {
    // SAFETY: as this function's own contract (the mask is only read).
    unsafe { thread_interrupt_mask() }.is_some()
}

/// The calling thread's `interrupt_mask` field, if the Ruby's layout is known and the
/// `rb_thread_t` holds its Thread at `vm::THREAD_SELF_OFFSET`.
///
/// # Safety
///
/// GVL held, on a Ruby thread whose execution context lives while the result is used.
unsafe fn thread_interrupt_mask() -> Option<&'static AtomicU32> {
    let ec_offset = THREAD_EC_OFFSET?;
    // SAFETY: the caller holds the GVL; rb_thread_current has no other precondition.
    let thread = unsafe { rb_sys::rb_thread_current() };
    // SAFETY: a Thread is a T_DATA object whose data is its rb_thread_t (`vm_core.h`,
    // `rb_thread_ptr`, 3.1 to 3.4); the object is alive (it is running this code).
    let th = unsafe { rb_sys::RTYPEDDATA_GET_DATA(thread) as *const u8 };
    if th.is_null() {
        return None;
    }
    // SAFETY: `th` points to a live rb_thread_t, which is larger than this offset on every
    // Ruby with a known layout (vm.rs).
    if unsafe { *(th.add(THREAD_SELF_OFFSET) as *const rb_sys::VALUE) } != thread {
        return None;
    }
    // SAFETY: `ec` is at this offset of the rb_thread_t (vm.rs) and points to the execution
    // context that runs this job.
    let ec = unsafe { *(th.add(ec_offset) as *const *const u8) };
    if ec.is_null() {
        return None;
    }
    // SAFETY: `interrupt_mask` is a 4-byte aligned rb_atomic_t at this offset of the live
    // execution context (vm.rs); other threads only read or atomically update it.
    Some(unsafe { &*(ec.add(EC_INTERRUPT_MASK_OFFSET) as *const AtomicU32) })
}
