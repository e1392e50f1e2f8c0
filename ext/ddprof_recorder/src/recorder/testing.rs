//! `DdprofRecorder::StackRecorder::Testing`: hooks that exist for RSpec only, not part of the
//! API a profiler should use. Each is an entry point like any other (the fork check and the
//! panic guard), except `_native_slot_locks_before_fork_check`.
//!
//! Two kinds:
//! - the observers and helpers (active slot, slot locks, fork generation, malloc in use,
//!   `record_endpoint`, holding the active slot), in every build: `_native_active_slot`, the two
//!   `_native_slot_*_mutex_locked?` and `_native_record_endpoint` are part of the recorder's
//!   fixed contract (docs/design.md, section 3);
//! - the deliberate panics (`panics`), one in each kind of entry point, only with the cargo
//!   feature `test-panics`: the specs' build has it and the gem's does not (`TEST_FEATURES` in
//!   ext/ddprof_recorder/cargo_build.rb), so that an installed gem has no method that panics
//!   on purpose, and its resets no hook to panic in.
use std::time::{Duration, Instant};

use magnus::{function, prelude::*, Error, RClass, Ruby, Value};

use crate::recorder::errors::{entry, IntoRubyError};
use crate::recorder::fork::fork_generation;
use crate::recorder::nogvl::nogvl;
use crate::recorder::stack_recorder::{record_endpoint, StackRecorder};

/// Defines `StackRecorder::Testing` under `class` (`StackRecorder`).
pub fn init(class: RClass) -> Result<(), Error> {
    let testing = class.define_module("Testing")?;
    testing.define_singleton_method("_native_active_slot", function!(native_active_slot, 1))?;
    testing.define_singleton_method(
        "_native_slot_one_mutex_locked?",
        function!(native_slot_one_mutex_locked, 1),
    )?;
    testing.define_singleton_method(
        "_native_slot_two_mutex_locked?",
        function!(native_slot_two_mutex_locked, 1),
    )?;
    testing
        .define_singleton_method("_native_fork_generation", function!(native_fork_generation, 0))?;
    testing.define_singleton_method("_native_malloc_in_use", function!(native_malloc_in_use, 0))?;
    testing.define_singleton_method(
        "_native_slot_locks_before_fork_check",
        function!(native_slot_locks_before_fork_check, 1),
    )?;
    testing
        .define_singleton_method("_native_record_endpoint", function!(native_record_endpoint, 3))?;
    testing.define_singleton_method(
        "_native_hold_active_slot",
        function!(native_hold_active_slot, 3),
    )?;
    #[cfg(feature = "test-panics")]
    panics::init(testing)?;
    Ok(())
}

fn native_active_slot(ruby: &Ruby, rb_self: &StackRecorder) -> Result<u8, Error> {
    rb_self.entry(ruby, |recorder| Ok(recorder.active_slot()))
}

fn native_slot_one_mutex_locked(ruby: &Ruby, rb_self: &StackRecorder) -> Result<bool, Error> {
    rb_self.entry(ruby, |recorder| Ok(recorder.slot_is_locked(1)))
}

fn native_slot_two_mutex_locked(ruby: &Ruby, rb_self: &StackRecorder) -> Result<bool, Error> {
    rb_self.entry(ruby, |recorder| Ok(recorder.slot_is_locked(2)))
}

fn native_fork_generation(ruby: &Ruby) -> Result<u64, Error> {
    entry(ruby, || Ok(fork_generation()))
}

/// Bytes glibc malloc has handed out and not had back (heap chunks in use plus mmapped
/// chunks): lets the soak test compare `ObjectSpace.memsize_of` with what freeing a
/// recorder really returns. glibc only (2.33+): nil elsewhere.
fn native_malloc_in_use(ruby: &Ruby) -> Result<Option<u64>, Error> {
    entry(ruby, || Ok(malloc_in_use()))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn malloc_in_use() -> Option<u64> {
    // SAFETY: mallinfo2 has no preconditions; it only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    Some((info.uordblks + info.hblkhd) as u64)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn malloc_in_use() -> Option<u64> {
    None
}

/// The slot locks of the recorder as it is, without the fork check: lets a child see the
/// state the fork left (both slots held mid-flip, for instance). The panic guard only.
fn native_slot_locks_before_fork_check(
    ruby: &Ruby,
    rb_self: &StackRecorder,
) -> Result<(bool, bool), Error> {
    entry(ruby, || {
        let recorder = rb_self.recorder();
        Ok((recorder.slot_is_locked(1), recorder.slot_is_locked(2)))
    })
}

fn native_record_endpoint(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    local_root_span_id: Value,
    endpoint: Value,
) -> Result<bool, Error> {
    rb_self.entry(ruby, |recorder| {
        record_endpoint(ruby, &recorder, local_root_span_id, endpoint).map(|()| true)
    })
}

/// `_native_hold_active_slot(recorder, fd, timeout_seconds)`: holds the active slot as a
/// sampler inside `record_sample` does, without the GVL, until `fd` is readable (a byte
/// written to a pipe) or `timeout_seconds` passed, so that a serialization meanwhile waits
/// in its flip (parked on the slot). Returns true if released through `fd`; raises
/// `RuntimeError` if both slots were taken.
fn native_hold_active_slot(
    ruby: &Ruby,
    rb_self: &StackRecorder,
    fd: i32,
    timeout_seconds: f64,
) -> Result<bool, Error> {
    rb_self.entry(ruby, |recorder| {
        let timeout_ms = (timeout_seconds * 1000.0).clamp(0.0, f64::from(i32::MAX)) as i32;
        let held = nogvl(ruby, move || {
            recorder.hold_active_slot(|| {
                let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                    // SAFETY: `poll` is one valid pollfd that outlives the call; a bad fd is
                    // reported in `revents` (POLLNVAL), not undefined behaviour.
                    let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis() as i32) };
                    // A signal handled on this thread (Ruby's SIGCHLD, when a child of
                    // the spec exits) ends poll with EINTR even under SA_RESTART.
                    let interrupted = ready == -1
                        && std::io::Error::last_os_error().kind()
                            == std::io::ErrorKind::Interrupted;
                    if !interrupted {
                        return ready == 1 && poll.revents & libc::POLLIN != 0;
                    }
                }
            })
        })?;
        held.map_err(|e| e.into_ruby_error(ruby))
    })
}

/// The deliberate panics, one in each kind of entry point, that prove the panic guard
/// (`spec/stack_recorder/panic_spec.rb`). Built only with the `test-panics` feature (see the
/// module doc).
#[cfg(feature = "test-panics")]
pub mod panics {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    use magnus::{function, prelude::*, Error, RModule, Ruby};

    use crate::recorder::errors::entry;
    use crate::recorder::nogvl::nogvl;
    use crate::recorder::stack_recorder::StackRecorder;

    /// Set by `_native_panic_in_next_reset`: the next reset panics before changing anything.
    static PANIC_IN_NEXT_RESET: AtomicBool = AtomicBool::new(false);

    pub(super) fn init(testing: RModule) -> Result<(), Error> {
        testing.define_singleton_method("_native_panic", function!(native_panic, 2))?;
        testing.define_singleton_method(
            "_native_panic_without_gvl",
            function!(native_panic_without_gvl, 2),
        )?;
        testing.define_singleton_method(
            "_native_panic_in_module_function",
            function!(native_panic_in_module_function, 1),
        )?;
        testing.define_singleton_method(
            "_native_panic_in_next_reset",
            function!(native_panic_in_next_reset, 0),
        )?;
        Ok(())
    }

    /// Called by every reset, before it changes anything.
    pub fn maybe_panic_in_reset() {
        if PANIC_IN_NEXT_RESET.swap(false, Relaxed) {
            panic_on_purpose(
                "a reset panicked on purpose (Testing._native_panic_in_next_reset)".into(),
            );
        }
    }

    /// Unwinds as a panic does (the guard catches it, a lock held on the way is poisoned: the
    /// panic count is raised all the same), but through `resume_unwind`, which skips the panic
    /// hook: a green run prints no backtrace for a panic the specs asked for.
    fn panic_on_purpose(message: String) -> ! {
        std::panic::resume_unwind(Box::new(message))
    }

    /// `_native_panic(recorder, message)`: panics in the body of an entry point on a recorder.
    fn native_panic(ruby: &Ruby, rb_self: &StackRecorder, message: String) -> Result<(), Error> {
        rb_self.entry(ruby, |_| panic_on_purpose(message))
    }

    /// `_native_panic_without_gvl(recorder, message)`: panics inside an entry point's no-GVL
    /// section.
    fn native_panic_without_gvl(
        ruby: &Ruby,
        rb_self: &StackRecorder,
        message: String,
    ) -> Result<(), Error> {
        rb_self.entry(ruby, |_| nogvl(ruby, move || panic_on_purpose(message)))
    }

    /// `_native_panic_in_module_function(message)`: panics in an entry point with no recorder
    /// (the panic guard only).
    fn native_panic_in_module_function(ruby: &Ruby, message: String) -> Result<(), Error> {
        entry(ruby, || panic_on_purpose(message))
    }

    /// `_native_panic_in_next_reset`: the next reset (by hand, or a forked child's first use of
    /// a recorder) panics before changing anything; later ones work again.
    fn native_panic_in_next_reset(ruby: &Ruby) -> Result<bool, Error> {
        entry(ruby, || {
            PANIC_IN_NEXT_RESET.store(true, Relaxed);
            Ok(true)
        })
    }
}
