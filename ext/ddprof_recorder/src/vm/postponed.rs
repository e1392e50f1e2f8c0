//! Asking Ruby to run one of our postponed jobs, from any thread (the trigger, the duty
//! cycle) or from a signal handler: one function for every Ruby the gem builds for.
//!
//! - Ruby 3.1 and 3.2: `rb_postponed_job_register_one`. Since Ruby 3.1 (ruby/ruby PR #5094,
//!   `vm_trace.c`) it may be called from a thread Ruby does not know (it falls back to the
//!   main ractor's running execution context) and from a signal handler: it claims a slot of
//!   the VM's job buffer with a compare-and-swap, or finds the job queued already, and sets the
//!   `POSTPONED_JOB` bit of the context's interrupt flag with an atomic `or`. No lock, no
//!   allocation. Before 3.3 a register racing the flush can hand our data pointer to another
//!   job (Ruby bug #19991), hence the decoy data (see `trigger`).
//! - Ruby 3.3 and later: `rb_postponed_job_register_one` is deprecated; a job is preregistered
//!   once with the GVL (`rb_postponed_job_preregister`, which returns a handle) and then
//!   triggered by handle (`rb_postponed_job_trigger`: an atomic `or` into the VM's bitset of
//!   triggered jobs and the interrupt flag, documented as safe from any thread and from a
//!   signal handler, Ruby 3.3 `vm_trace.c` and `include/ruby/debug.h`).
use std::ffi::c_void;
#[cfg(ruby_gte_3_3)]
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// A job function: `extern "C"`, never unwinds, ignores its data.
pub type Job = unsafe extern "C" fn(*mut c_void);

/// Jobs preregistered (3.3+): function and handle.
#[cfg(ruby_gte_3_3)]
const MAX_JOBS: usize = 8;
#[cfg(ruby_gte_3_3)]
static FUNCS: [AtomicUsize; MAX_JOBS] = [const { AtomicUsize::new(0) }; MAX_JOBS];
#[cfg(ruby_gte_3_3)]
static HANDLES: [AtomicU32; MAX_JOBS] = [const { AtomicU32::new(u32::MAX) }; MAX_JOBS];

/// Makes `job` ready to be triggered. With the GVL held, before the first [`trigger`] of it
/// (at the extension's load). Does nothing before Ruby 3.3.
pub fn prepare(job: Job) {
    #[cfg(ruby_gte_3_3)]
    {
        let key = job as *const () as usize;
        if FUNCS.iter().any(|f| f.load(Ordering::Acquire) == key) {
            return;
        }
        // SAFETY: with the GVL (see above); `job` never unwinds; the data pointer is only
        // handed back to `job`, which ignores it.
        let handle =
            unsafe { rb_sys::rb_postponed_job_preregister(0, Some(job), crate::vm::decoy_data()) };
        if let Some(i) = FUNCS.iter().position(|f| f.load(Ordering::Acquire) == 0) {
            HANDLES[i].store(handle, Ordering::Release);
            FUNCS[i].store(key, Ordering::Release);
        }
    }
    #[cfg(not(ruby_gte_3_3))]
    let _ = job;
}

/// Asks Ruby to run `job` at the next interrupt check of the thread that holds the GVL (in a
/// signal handler on a Ruby thread: of that thread). From any thread or a signal handler.
pub fn trigger(job: Job) {
    #[cfg(ruby_gte_3_3)]
    {
        let key = job as *const () as usize;
        if let Some(i) = FUNCS.iter().position(|f| f.load(Ordering::Acquire) == key) {
            let handle = HANDLES[i].load(Ordering::Acquire);
            if handle != u32::MAX {
                // SAFETY: a handle that `rb_postponed_job_preregister` returned; callable from
                // any thread and from a signal handler (module doc).
                unsafe { rb_sys::rb_postponed_job_trigger(handle) };
            }
        }
    }
    #[cfg(not(ruby_gte_3_3))]
    // SAFETY: callable from any thread and from a signal handler since Ruby 3.1 (module
    // doc); `job` never unwinds; the data pointer is the bug #19991 decoy.
    unsafe {
        rb_sys::rb_postponed_job_register_one(0, Some(job), crate::vm::decoy_data());
    }
}
