//! Fork detection without a hook: the fork generation, a count of the forks that separate this
//! process from the one that loaded the extension.
//!
//! A `pthread_atfork` child handler, installed once, bumps [`FORK_GENERATION`] in every forked
//! child. Process-wide state that a fork leaves stale (a recorder's locks, a native thread, a
//! timer, a queue the parent's threads filled, an event hook) remembers the generation it was
//! made in; a mismatch with [`fork_generation`] says "made in a process that is not this one",
//! and its owner forgets or remakes it at its next use. The check is one relaxed atomic load
//! and a compare, so it can sit on the sampler's path: a generation rather than `getpid()`,
//! which is a system call on current glibc (it no longer caches the pid), and which a
//! recycled pid could fool.
//!
//! The users: the StackRecorder's entry points (their reset after a fork is in the module doc
//! of `stack_recorder.rs`), the native threads (`sampling::native_thread`), the signal sampler's
//! timers, the thread-end and GVL-event hooks, the sampling job's cached thread id, and the
//! allocation sampler's state.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Once;

use magnus::{Error, Ruby};

/// How many forks separate this process from the one that loaded the extension: bumped in
/// each child by [`after_fork_in_child`]. A process's threads all see its own count.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// How many forks separate this process from the one that loaded the extension.
pub fn fork_generation() -> u64 {
    FORK_GENERATION.load(Relaxed)
}

/// The `pthread_atfork` child handler. Runs in the child's only thread before `fork` returns
/// there; it must be async-signal-safe, and one atomic add is.
extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Relaxed);
}

/// Installs the child handler, once per process tree (handlers are inherited by children).
/// Called when the extension loads, before any state that compares generations is made.
pub fn install_handler(ruby: &Ruby) -> Result<(), Error> {
    static INSTALL: Once = Once::new();
    let mut status = 0;
    INSTALL.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured state.
        status = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    if status != 0 {
        return Err(Error::new(
            ruby.exception_runtime_error(),
            format!("pthread_atfork failed (error {status}): fork detection unavailable"),
        ));
    }
    Ok(())
}
