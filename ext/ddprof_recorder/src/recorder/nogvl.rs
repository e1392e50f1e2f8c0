//! Running Rust code without the GVL, so that other Ruby threads keep running.
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

use magnus::{Error, Ruby};

use crate::recorder::errors::{gem_error, panic_error};

struct Call<F, R> {
    work: Option<F>,
    result: Option<std::thread::Result<R>>,
}

unsafe extern "C" fn trampoline<F, R>(data: *mut c_void) -> *mut c_void
where
    F: FnOnce() -> R,
{
    // SAFETY: `data` is the `&mut Call<F, R>` that `nogvl` passed, alive for this whole call.
    let call = unsafe { &mut *data.cast::<Call<F, R>>() };
    if let Some(work) = call.work.take() {
        call.result = Some(catch_unwind(AssertUnwindSafe(work)));
    }
    null_mut()
}

/// Runs `work` without the GVL and returns its result.
///
/// dd-trace-rb's loop: process pending interrupts (`Thread#raise`, `Thread#kill`, signals)
/// first, while nothing has been computed, then `rb_thread_call_without_gvl2`, which returns
/// without running `work` when an interrupt is pending and, unlike
/// `rb_thread_call_without_gvl`, never raises after `work` ran, so its result (owned Rust
/// memory) cannot be leaked by a longjmp. An interrupt is raised as `Err` here, through
/// `rb_protect`, so no Rust frame is ever jumped over.
///
/// `F: Send` and `R: Send` keep Ruby values out of the closure and its result: no Ruby object
/// may be touched without the GVL. A panic in `work` comes back as a Ruby exception.
pub fn nogvl<F, R>(ruby: &Ruby, work: F) -> Result<R, Error>
where
    F: Send + FnOnce() -> R,
    R: Send,
{
    let mut call = Call { work: Some(work), result: None };
    loop {
        magnus::rb_sys::protect(|| {
            // SAFETY: called with the GVL held (we have `&Ruby`); may raise, which `protect`
            // turns into an `Err` instead of a longjmp over our frames.
            unsafe { rb_sys::rb_thread_check_ints() };
            rb_sys::Qnil as rb_sys::VALUE
        })?;
        without_gvl(&mut call);
        match call.result.take() {
            Some(result) => return result.map_err(|panic| panic_error(ruby, panic)),
            // Returned early because an interrupt is pending: process it, then try again.
            None => continue,
        }
    }
}

/// Runs `work` without the GVL if no interrupt is pending, else here with it; never processes
/// an interrupt. For the work done after a serialization took its window, whose result must
/// reach the caller: an interrupt processed here (`rb_thread_check_ints`, or
/// `rb_thread_call_without_gvl` on its way out) would raise, or kill the thread, and take the
/// window with it, even for a caller that deferred interrupts to blocking points
/// (`Thread.handle_interrupt(Object => :on_blocking)`): both check at blocking timing (3.4.5:
/// thread.c:1424 and 1584-1586). A pending interrupt stays pending, for the next point where
/// the caller's mask lets it in.
pub fn nogvl_or_here<F, R>(ruby: &Ruby, work: F) -> Result<R, Error>
where
    F: Send + FnOnce() -> R,
    R: Send,
{
    let mut call = Call { work: Some(work), result: None };
    without_gvl(&mut call);
    let result = match (call.result.take(), call.work.take()) {
        (Some(result), _) => result,
        // Returned early because an interrupt is pending: do the work with the GVL instead.
        (None, Some(work)) => catch_unwind(AssertUnwindSafe(work)),
        // Not reached: the trampoline stores a result whenever it takes the work.
        (None, None) => {
            return Err(gem_error(ruby, "internal error in ddprof_recorder: no-GVL work lost"))
        }
    };
    result.map_err(|panic| panic_error(ruby, panic))
}

/// Runs `call`'s work once without the GVL, unless an interrupt is pending (then `call.result`
/// stays None and the work is still in `call.work`). Never raises.
fn without_gvl<F, R>(call: &mut Call<F, R>)
where
    F: Send + FnOnce() -> R,
    R: Send,
{
    // SAFETY: `trampoline::<F, R>` matches `call`'s type; no unblocking function is given, so
    // the work runs to completion once started; `call` outlives the call, which returns only
    // when the work is done or was not started; rb_thread_call_without_gvl2 never raises.
    unsafe {
        rb_sys::rb_thread_call_without_gvl2(
            Some(trampoline::<F, R>),
            (call as *mut Call<F, R>).cast(),
            None,
            null_mut(),
        );
    }
}
