//! State that only the thread holding the GVL touches, and the GC roots that mark it.
//!
//! The memory profiler's pending samples, its tracked heap and GC-time table, the frame cache
//! and the queue of thread ends are read and written by the GC's mark and compaction callbacks
//! and by internal event hooks, which run inside the allocator or the GC. Behind a `Mutex`,
//! such a callback that found the lock held (by a panic that poisoned it, or by a caller that
//! let a GC start) could only skip its work: a frame left unmarked, an address left stale, a
//! use-after-free later.
//! A [`GvlCell`] has no such way out: its value is reached only through [`GvlCell::with`], and
//! a `with` that finds the value in use ends the process.
//!
//! # Why the value is never found in use
//!
//! - **Every access holds the GVL.** The cells are touched by Ruby methods, postponed jobs
//!   (`rb_postponed_job_flush`, Ruby 3.1 `vm_trace.c`), end procs, internal event hooks, the
//!   thread-end event hook (on the ending thread, with the GVL: `sampling/thread_end.rs`) and
//!   the GC's callbacks. The GC runs on the thread that holds the GVL: a thread without it
//!   that needs a collection takes it first (`garbage_collect_with_gvl`, Ruby 3.1 `gc.c`,
//!   which asks `ruby_thread_has_gvl_p`); `dmark` runs in its marking, `dcompact` in its
//!   reference update (`gc_update_object_references`), and an internal hook is dispatched by
//!   the thread that allocates or collects (`gc_event_hook_body`). No native thread of ours
//!   (the trigger, the duty cycle's) and no signal handler touches a cell: they use atomics.
//!   Debug builds check the GVL at every access (`vm::ruby_thread_has_gvl_p`).
//! - **Nothing inside `with` can start a GC or run a hook.** The GC starts only at an
//!   allocation or a call into Ruby, and the closure makes neither: it must be `Send`, and
//!   magnus's `Ruby` handle and Ruby object types are not, so it cannot capture any; the raw
//!   `rb_sys` calls it may still make are `unsafe` blocks whose `SAFETY` lines say they do not
//!   allocate. So no mark callback or hook can re-enter a cell while its closure runs.
//! - **Ractors.** A GC on another Ractor's thread (which holds that Ractor's GVL) first stops
//!   every other running Ractor where it checks interrupts or takes the VM lock (`gc_enter`
//!   calls `rb_vm_barrier`, Ruby 3.1 `gc.c`); a closure does neither, so the main Ractor is
//!   never inside one then. Our hooks go to the enabling Ractor's hook list
//!   (`connect_event_hook`, `rb_ec_ractor_hooks`, Ruby 3.1 `vm_trace.c`), and the allocation
//!   and heap hooks stop before the first Ractor starts (docs/profiler.md, "Ractors").
//!
//! # If it were found in use anyway
//!
//! A second `with` on the same cell while the first runs could only come from a broken rule
//! above (a closure that called Ruby, a thread without the GVL). Skipping the access is the
//! failure this type removes, and going on would read or write a value the first closure holds
//! `&mut` to, mid-change. So it calls `rb_bug`: Ruby's crash report (Ruby and C backtraces)
//! names the cell, and the process ends before anything is freed that is still in use.
//! The in-use flag is an atomic, so even a thread that broke the rules is caught, not raced.
//!
//! A panic inside `with` clears the flag as it unwinds, as `RefCell` does: no poisoning, the
//! value stays as the closure left it (each holds plain words and collections that are valid at
//! every step). After `fork` every flag is clear: the forking thread holds the GVL and is in
//! Ruby's `fork`, not in a closure.
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

use magnus::{gc, prelude::*, DataTypeFunctions, Error, Ruby, TypedData};

/// A value only touched with the GVL held, through [`GvlCell::with`] (module doc).
pub struct GvlCell<T> {
    /// What a crash report calls it.
    name: &'static str,
    in_use: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `with` gives out the value only while it holds `in_use` (set with Acquire, cleared
// with Release when it ends), so no two accesses overlap and each sees the writes of the one
// before, whatever thread makes it; `T: Send` because those threads differ.
unsafe impl<T: Send> Sync for GvlCell<T> {}

impl<T> GvlCell<T> {
    pub const fn new(name: &'static str, value: T) -> Self {
        Self { name, in_use: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Runs `f` on the value, with the GVL held. `f` is `Send` so that it can hold no Ruby
    /// handle: it must not allocate a Ruby object or call Ruby (module doc). A `with` on this
    /// cell inside `f` ends the process with `rb_bug`.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R + Send) -> R {
        check_gvl(self.name);
        if self.in_use.swap(true, Ordering::Acquire) {
            fatal(
                self.name,
                "entered while in use: a closure called Ruby, or a thread without the GVL came in",
            );
        }
        let _release = Release(&self.in_use);
        // SAFETY: `in_use` was clear and is now ours until `_release` drops: no other
        // reference to the value exists meanwhile.
        f(unsafe { &mut *self.value.get() })
    }
}

/// Clears a cell's `in_use` when `with` ends, also when it unwinds.
struct Release<'a>(&'a AtomicBool);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Debug builds: the caller holds the GVL. (Not in unit tests, which run without a VM.)
#[inline]
fn check_gvl(name: &str) {
    // SAFETY: reads the calling thread's Ruby thread-local only; callable from any thread.
    if cfg!(all(debug_assertions, not(test))) && unsafe { crate::vm::ruby_thread_has_gvl_p() } == 0
    {
        fatal(name, "touched without the GVL");
    }
}

/// Ends the process: `rb_bug` (Ruby's crash report, then abort); in unit tests, without a VM,
/// a message and abort.
#[cold]
#[inline(never)]
fn fatal(name: &str, what: &str) -> ! {
    let message = format!("ddprof_recorder: {name} {what}");
    #[cfg(not(test))]
    magnus::error::bug(&message);
    #[cfg(test)]
    {
        eprintln!("{message}");
        std::process::abort()
    }
}

/// A GC root for state kept in statics: one Ruby object for the process's life whose mark
/// callback calls `mark` and whose compaction callback calls `compact` at every GC.
#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::GcRoot", mark, compact, free_immediately)]
pub struct GcRoot {
    /// Marks the objects the state holds, with `rb_gc_mark` (which pins them).
    pub mark: Option<fn()>,
    /// Rewrites the addresses the state holds after `GC.compact` moved objects.
    pub compact: Option<fn()>,
}

impl DataTypeFunctions for GcRoot {
    fn mark(&self, _marker: &gc::Marker) {
        if let Some(mark) = self.mark {
            mark();
        }
    }

    fn compact(&self, _compactor: &gc::Compactor) {
        if let Some(compact) = self.compact {
            compact();
        }
    }
}

impl GcRoot {
    /// Makes this root live for the process's life. At load, with the GVL.
    pub fn register(self, ruby: &Ruby) -> Result<(), Error> {
        let module = ruby.define_module("DdprofRecorder")?;
        // `obj_wrap` finds the class by the path above (and takes its `allocate` away).
        module.define_class("GcRoot", ruby.class_object())?;
        ruby.gc_register_mark_object(ruby.obj_wrap(self));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_gives_the_value_and_keeps_what_it_wrote() {
        let cell = GvlCell::new("test cell", vec![1]);
        cell.with(|v| v.push(2));
        assert_eq!(cell.with(|v| v.clone()), vec![1, 2]);
    }

    #[test]
    fn a_panic_inside_clears_the_flag_without_poisoning() {
        let cell = GvlCell::new("test cell", 0);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cell.with(|v| {
                *v = 7;
                panic!("on purpose");
            })
        }));
        assert!(result.is_err());
        assert_eq!(cell.with(|v| *v), 7);
    }

    /// Entering a cell inside its own `with` aborts the process (run in a child process).
    #[test]
    fn entering_it_again_aborts() {
        const CHILD: &str = "DDPROF_GVL_CELL_REENTER";
        if std::env::var_os(CHILD).is_some() {
            let cell = GvlCell::new("test cell", 0);
            cell.with(|_| cell.with(|_| ()));
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(exe)
            .args(["--exact", "vm::gvl_cell::tests::entering_it_again_aborts", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .expect("the child runs");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("test cell entered while in use"), "{stderr}");
    }
}
