//! Reading a thread's frames (frame objects and lines, leaf first) off its VM stack, without
//! allocating: the calling thread's ([`read_current`], which the signal handler and the NEWOBJ
//! hook call too) and another live thread's ([`read_thread`]).

/// Reads the current thread's frames, leaf first, with `vm::frames` when its self-check passed
/// (so that a `define_method` method has its method entry, and eval'd code its iseq), else
/// with `rb_profile_frames`.
/// Returns how many. Does not allocate, lock or make a system call: callable from a NEWOBJ
/// hook and from the signal handler (`signal_sampler`).
///
/// # Safety
///
/// GVL held.
pub unsafe fn read_current(frames: &mut [rb_sys::VALUE], lines: &mut [i32]) -> usize {
    let limit = frames.len().min(lines.len());
    if crate::vm::frames::available() {
        // SAFETY: GVL held; the running thread is alive.
        if let Some(ec) = unsafe { crate::vm::frames::thread_ec(rb_sys::rb_thread_current()) } {
            // SAFETY: its context, GVL held since.
            return unsafe {
                crate::vm::frames::read(ec, frames, lines, crate::vm::frames::Read::Named)
            };
        }
    }
    // SAFETY: both buffers hold `limit` entries; GVL held.
    let n = unsafe {
        rb_sys::rb_profile_frames(0, limit as i32, frames.as_mut_ptr(), lines.as_mut_ptr())
    };
    usize::try_from(n).unwrap_or(0).min(limit)
}

/// Reads `thread`'s frames, leaf first, as [`read_current`] reads the current thread's:
/// with `vm::frames` once its self-check passed (or while it runs), else, on 3.3+, with
/// `rb_profile_thread_frames` (Ruby 3.3.8 and 3.4.5 `vm_backtrace.c`: the walk of
/// `rb_profile_frames` over `th->ec`), once `vm::stack_walkable` found its stack whole.
/// Returns how many (0: no stack, not started or finished).
///
/// # Safety
///
/// `thread` is a live Thread whose status is not false or nil; GVL held.
pub(super) unsafe fn read_thread(
    thread: rb_sys::VALUE,
    frames: &mut [rb_sys::VALUE],
    lines: &mut [i32],
) -> usize {
    if crate::vm::frames::available() {
        // SAFETY: the caller's contract.
        let Some(ec) = (unsafe { crate::vm::frames::thread_ec(thread) }) else { return 0 };
        // SAFETY: its context, GVL held since.
        return unsafe {
            crate::vm::frames::read(ec, frames, lines, crate::vm::frames::Read::Named)
        };
    }
    #[cfg(ruby_gte_3_3)]
    {
        let limit = frames.len().min(lines.len());
        // SAFETY: the caller's contract.
        if !unsafe { crate::vm::stack_walkable(thread) } {
            return 0;
        }
        // SAFETY: a live Thread whose stack is whole (checked just now, GVL held since); both
        // buffers hold `limit` entries.
        let n = unsafe {
            rb_sys::rb_profile_thread_frames(
                thread,
                0,
                limit as i32,
                frames.as_mut_ptr(),
                lines.as_mut_ptr(),
            )
        };
        usize::try_from(n).unwrap_or(0).min(limit)
    }
    #[cfg(not(ruby_gte_3_3))]
    {
        let _ = thread; // only called once the reader is in use (`stack_capture`, "Names")
        0
    }
}
