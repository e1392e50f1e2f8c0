//! GVL waits: how long each thread was ready to run but without the GVL, from Ruby's thread
//! event API (`rb_internal_thread_add_event_hook`, Ruby 3.2+; used here from 3.3 on, where the
//! event names its thread). The sampler takes each thread's waits (`Profiler._native_gvl_take`)
//! when it records that thread, and charges them as `gvl-wait-time` to the stack the thread
//! runs once it has the lock (`lib/ddprof_recorder/profiler/thread_sampler.rb`). On 3.1 there is
//! no such API: [`AVAILABLE`] is false and nothing here is added.
//!
//! # What the hook may do
//!
//! Ruby calls the hook at every GVL hand-over, without the GVL for READY and EXITED and under
//! its scheduler's lock (Ruby 3.3.8 `thread_pthread.c`: `thread_sched_to_ready_common` fires
//! READY, "waiting -> ready (locked)"; `thread_sched_to_running_common` fires RESUMED once the
//! thread holds the GVL; `thread_sched_to_dead_common` fires EXITED), not always on the native
//! thread of the Ruby thread it is about (`include/ruby/thread.h`: "you must use
//! `event_data->thread`"). So the hook takes no lock, allocates nothing and calls no Ruby API
//! but `rb_internal_thread_specific_get`/`_set`, which `thread.h` documents as "async signal
//! safe and thread safe": each thread's thread-specific value names its [`Slot`] in a static
//! table, claimed with a compare-and-swap at the thread's first event. READY stores when the
//! thread became ready; RESUMED adds the time since to the slot's waits; EXITED marks the slot
//! ended ([`ENDED`]), keeping its last waits until the sampler takes them at the thread's end
//! (the take frees it), or, with no slot free, a new thread reclaims it.
//!
//! A slot's value carries the fork generation it was claimed in: in a forked child every
//! parent thread's slot is stale (its threads are gone without an EXITED), so [`start`] frees
//! them all, removing the parent's hook and adding a new one, and a thread whose value names
//! another generation claims a slot anew. With more threads than slots, the waits of the
//! threads without one are not measured, and counted ([`UNTRACKED`]).
// On 3.1 the table and the events' logic are built (and unit-tested) but nothing calls them.
#![cfg_attr(not(ruby_gte_3_3), allow(dead_code))]
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use magnus::{function, prelude::*, rb_sys::AsRawValue, Error, RModule, Ruby, Value};

use crate::errors::entry;

/// Whether this Ruby has the thread event API with the event's thread (3.3 and later).
pub const AVAILABLE: bool = cfg!(ruby_gte_3_3);

/// Threads whose waits are measured at once: a Puma of 32 threads uses 33.
const SLOTS: usize = 1024;

/// One thread's GVL account. `owner` is the Ruby thread (its VALUE) while claimed, with
/// [`ENDED`] set once it exited; 0 when free.
struct Slot {
    owner: AtomicUsize,
    /// Monotonic ns when the thread became ready, 0 while it is not waiting.
    ready_at: AtomicI64,
    /// Ns waited since the sampler last took them.
    waited: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only the array's initializer
const FREE: Slot =
    Slot { owner: AtomicUsize::new(0), ready_at: AtomicI64::new(0), waited: AtomicU64::new(0) };
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// In `owner`: the thread exited (a VALUE is 8-aligned, so its low bit is free).
const ENDED: usize = 1;

/// The fork generation the slots were claimed in (`stack_recorder::fork_generation`), as the
/// high half of each thread-specific value.
static GENERATION: AtomicUsize = AtomicUsize::new(0);
static HOOKED: AtomicBool = AtomicBool::new(false);
/// The hook `rb_internal_thread_add_event_hook` returned (null: none).
static HOOK: AtomicUsize = AtomicUsize::new(0);
/// The thread-specific key, once made (-1: not yet).
static KEY: AtomicI64 = AtomicI64::new(-1);
/// Events of threads that had no slot (the table full); `Profiler._native_sampling_stats`'s
/// `:gvl_untracked_events`.
pub static UNTRACKED: AtomicU64 = AtomicU64::new(0);

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a plain function with no data, run with the GVL after every `at_exit` block
        // (`eval_jump.c`, `rb_ec_exec_end_proc`, 3.1 to 3.4): the hook is gone before the VM
        // frees the Threads that its callback would look up.
        unsafe { rb_sys::rb_set_end_proc(Some(stop_at_exit), rb_sys::Qnil as rb_sys::VALUE) };
    });
    let class = module.define_class("Profiler", ruby.class_object())?;
    class.const_set("GVL_EVENTS", AVAILABLE)?;
    class.define_singleton_method("_native_gvl_start", function!(native_start, 0))?;
    class.define_singleton_method("_native_gvl_stop", function!(native_stop, 0))?;
    class.define_singleton_method("_native_gvl_take", function!(native_take, 1))?;
    class.define_singleton_method("_native_gvl_waiting", function!(native_waiting, 1))?;
    Ok(())
}

fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the timespec it is given; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// The thread-specific value that names slot `index` in `generation` (never null).
fn slot_value(generation: usize, index: usize) -> usize {
    ((generation & 0xffff_ffff) << 32) | (index + 1)
}

/// The slot a thread-specific value names, if it was claimed in `generation`.
fn slot_of_value(value: usize, generation: usize) -> Option<&'static Slot> {
    let index = (value & 0xffff_ffff).checked_sub(1)?;
    (value >> 32 == generation & 0xffff_ffff).then(|| TABLE.get(index)).flatten()
}

unsafe extern "C" fn stop_at_exit(_: rb_sys::VALUE) {
    let _ = catch_unwind(stop);
}

/// Removes the hook. A wait under way then never sees its RESUMED: it is dropped, so that a
/// take after this counts no time that is not a wait. What was measured stays to be taken.
fn stop() {
    if HOOKED.swap(false, Ordering::AcqRel) {
        imp::remove_hook();
        for slot in &TABLE {
            slot.ready_at.store(0, Ordering::Release);
        }
    }
}

/// `Profiler._native_gvl_start`: measures the GVL waits from now on; false on a Ruby without
/// the API (or whose thread-specific keys are used up). In a forked child, the parent's hook
/// and slots go first. With the GVL.
fn native_start(ruby: &Ruby) -> Result<bool, Error> {
    entry(ruby, || {
        if !AVAILABLE || !imp::ensure_key() {
            return Ok(false);
        }
        let generation = crate::stack_recorder::fork_generation() as usize;
        if GENERATION.swap(generation, Ordering::AcqRel) != generation {
            imp::remove_hook();
            HOOKED.store(false, Ordering::Release);
            for slot in &TABLE {
                slot.owner.store(0, Ordering::Relaxed);
                slot.ready_at.store(0, Ordering::Relaxed);
                slot.waited.store(0, Ordering::Relaxed);
            }
        }
        if !HOOKED.swap(true, Ordering::AcqRel) {
            imp::add_hook();
        }
        Ok(true)
    })
}

/// `Profiler._native_gvl_stop`: removes the hook. With the GVL.
fn native_stop(ruby: &Ruby) -> Result<(), Error> {
    entry(ruby, || {
        stop();
        Ok(())
    })
}

/// `Profiler._native_gvl_take(thread)`: the ns `thread` waited for the GVL since the last
/// take, counted up to now if it is waiting now; nil if its waits are not measured. After
/// [`stop`] too: the sampler's last flush takes what the last waits left.
fn native_take(ruby: &Ruby, thread: Value) -> Result<Option<u64>, Error> {
    entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(Error::new(ruby.exception_type_error(), "expected a Thread"));
        }
        let thread = thread.as_raw() as usize;
        let Some(slot) = imp::slot(thread, false) else { return Ok(None) };
        let mut waited = slot.waited.swap(0, Ordering::AcqRel);
        // An ended thread's last take: its slot is free again.
        if slot
            .owner
            .compare_exchange(thread | ENDED, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Ok(Some(waited));
        }
        // A wait under way: the part so far now, the rest at its RESUMED (moved up so as not
        // to count it twice).
        let ready = slot.ready_at.load(Ordering::Acquire);
        if ready > 0 {
            let now = now_ns();
            if now > ready
                && slot
                    .ready_at
                    .compare_exchange(ready, now, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                waited += (now - ready) as u64;
            }
        }
        Ok(Some(waited))
    })
}

/// `Profiler._native_gvl_waiting(thread)`: whether `thread` is ready to run but without the
/// GVL now (between its READY and its RESUMED); nil if its waits are not measured. With the
/// GVL, so `thread` is not the caller.
fn native_waiting(ruby: &Ruby, thread: Value) -> Result<Option<bool>, Error> {
    entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(Error::new(ruby.exception_type_error(), "expected a Thread"));
        }
        if !HOOKED.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some(slot) = imp::slot(thread.as_raw() as usize, false) else { return Ok(None) };
        Ok(Some(slot.ready_at.load(Ordering::Acquire) > 0))
    })
}

/// What the hook does for one event on `thread`'s slot.
fn on_event(event: u32, thread: usize) {
    let claim = event != imp::EXITED;
    let Some(slot) = imp::slot(thread, claim) else {
        if claim {
            UNTRACKED.fetch_add(1, Ordering::Relaxed);
        }
        return;
    };
    match event {
        imp::READY => {
            let _ =
                slot.ready_at.compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Relaxed);
        }
        imp::RESUMED => {
            let ready = slot.ready_at.swap(0, Ordering::AcqRel);
            let now = now_ns();
            if ready > 0 && now > ready {
                slot.waited.fetch_add((now - ready) as u64, Ordering::AcqRel);
            }
        }
        _ => {
            slot.ready_at.store(0, Ordering::Relaxed);
            slot.owner.store(thread | ENDED, Ordering::Release);
        }
    }
}

/// Claims a free slot for `thread`, if there is one, else one whose thread ended (its last
/// waits, not taken yet, are dropped).
fn claim(thread: usize) -> Option<usize> {
    let start = (thread >> 3) % SLOTS;
    let order = || (0..SLOTS).map(move |i| (start + i) % SLOTS);
    let take = |i: usize, owner: usize| {
        let slot = &TABLE[i];
        let ok =
            slot.owner.compare_exchange(owner, thread, Ordering::AcqRel, Ordering::Relaxed).is_ok();
        if ok {
            slot.waited.store(0, Ordering::Relaxed);
            slot.ready_at.store(0, Ordering::Relaxed);
        }
        ok
    };
    order().find(|&i| take(i, 0)).or_else(|| {
        order().find(|&i| {
            let owner = TABLE[i].owner.load(Ordering::Acquire);
            owner & ENDED != 0 && take(i, owner)
        })
    })
}

#[cfg(ruby_gte_3_3)]
mod imp {
    use std::ffi::c_void;
    use std::panic::AssertUnwindSafe;

    use super::*;

    pub const READY: u32 = rb_sys::RUBY_INTERNAL_THREAD_EVENT_READY;
    pub const RESUMED: u32 = rb_sys::RUBY_INTERNAL_THREAD_EVENT_RESUMED;
    pub const EXITED: u32 = rb_sys::RUBY_INTERNAL_THREAD_EVENT_EXITED;

    /// Makes the thread-specific key once; false if Ruby refused (it allows 8 per process,
    /// and the first one only while one Ractor runs: `thread.c`, it raises ThreadError).
    pub fn ensure_key() -> bool {
        if KEY.load(Ordering::Acquire) >= 0 {
            return true;
        }
        let mut key = -1;
        // SAFETY: GVL held; `protect` turns the ThreadError it may raise into an Err.
        let made = magnus::rb_sys::protect(|| {
            key = unsafe { rb_sys::rb_internal_thread_specific_key_create() };
            rb_sys::Qnil as rb_sys::VALUE
        });
        if made.is_ok() {
            KEY.store(i64::from(key), Ordering::Release);
        }
        made.is_ok()
    }

    pub fn add_hook() {
        let events = READY | RESUMED | EXITED;
        // SAFETY: GVL held, not from a thread event callback (`thread.h`'s one rule);
        // `on_gvl_event` never unwinds and uses no data pointer.
        let hook = unsafe {
            rb_sys::rb_internal_thread_add_event_hook(
                Some(on_gvl_event),
                events as rb_sys::rb_event_flag_t,
                std::ptr::null_mut(),
            )
        };
        HOOK.store(hook as usize, Ordering::Release);
    }

    pub fn remove_hook() {
        let hook = HOOK.swap(0, Ordering::AcqRel);
        if hook != 0 {
            // SAFETY: GVL held, not from a callback; `hook` is the one add_hook got (a forked
            // child's is its parent's, in the hook list it inherited). Ruby takes its hooks'
            // write lock, so no callback runs it meanwhile (3.3.8 `thread_pthread.c`).
            unsafe {
                rb_sys::rb_internal_thread_remove_event_hook(
                    hook as *mut rb_sys::rb_internal_thread_event_hook_t,
                )
            };
        }
    }

    /// `thread`'s slot in this fork generation, claimed if `claim` and it has none.
    pub fn slot(thread: usize, claim: bool) -> Option<&'static Slot> {
        let key = KEY.load(Ordering::Acquire);
        if key < 0 {
            return None;
        }
        let key = key as rb_sys::rb_internal_thread_specific_key_t;
        let generation = GENERATION.load(Ordering::Acquire);
        // SAFETY: `thread` is a live Thread (the event's, or the sampler's argument with the
        // GVL); `thread.h`: the get and set are async signal safe and thread safe.
        let value =
            unsafe { rb_sys::rb_internal_thread_specific_get(thread as rb_sys::VALUE, key) };
        if let Some(slot) = slot_of_value(value as usize, generation) {
            if slot.owner.load(Ordering::Acquire) & !ENDED == thread {
                return Some(slot);
            }
        }
        if !claim {
            return None;
        }
        let index = super::claim(thread)?;
        let value = slot_value(generation, index) as *mut c_void;
        // SAFETY: as above.
        unsafe { rb_sys::rb_internal_thread_specific_set(thread as rb_sys::VALUE, key, value) };
        Some(&TABLE[index])
    }

    /// The hook. Never unwinds.
    #[allow(deprecated)] // `rb_internal_thread_event_data::thread`: the API's one field
    unsafe extern "C" fn on_gvl_event(
        event: rb_sys::rb_event_flag_t,
        data: *const rb_sys::rb_internal_thread_event_data_t,
        _user_data: *mut c_void,
    ) {
        if data.is_null() {
            return;
        }
        // SAFETY: Ruby passes the event's data, valid for the call; `thread` is its Thread.
        let thread = unsafe { (*data).thread } as usize;
        let _ = catch_unwind(AssertUnwindSafe(|| on_event(event as u32, thread)));
    }
}

#[cfg(not(ruby_gte_3_3))]
mod imp {
    use super::*;

    pub const READY: u32 = 1;
    pub const RESUMED: u32 = 2;
    pub const EXITED: u32 = 4;

    pub fn ensure_key() -> bool {
        false
    }

    pub fn add_hook() {}

    pub fn remove_hook() {}

    pub fn slot(_thread: usize, _claim: bool) -> Option<&'static Slot> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_value_names_its_slot_in_its_generation_only() {
        let value = slot_value(7, 41);
        assert_ne!(value, 0);
        assert!(std::ptr::eq(slot_of_value(value, 7).unwrap(), &TABLE[41]));
        assert!(slot_of_value(value, 8).is_none());
        assert!(slot_of_value(0, 7).is_none(), "never set");
        assert!(slot_of_value(slot_value(7, SLOTS), 7).is_none(), "out of the table");
    }
}
