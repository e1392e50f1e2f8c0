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
//! `event_data->thread`"). So the hook takes no lock, allocates nothing and calls no Ruby API:
//! each thread's [`Slot`] in a static table is found by hashing the Thread's VALUE (open
//! addressing, at most [`PROBES`] slots looked at) and claimed with a compare-and-swap at the
//! thread's first event. READY stores when the thread became ready; RESUMED adds the time since
//! to the slot's waits; EXITED marks the slot ended ([`ENDED`]), keeping its last waits until
//! the sampler takes them at the thread's end (the take leaves a [`TOMB`], so that the threads
//! that probed past the slot are still found), or, with no slot free, a new thread reclaims it.
//! A slot is a cache line of its own: a thread's events come from both cores, and two threads'
//! slots never share a line. Times are the ticks of `clocks::tsc` (the CPU's counter where the
//! kernel keeps time with it), turned into ns by the take only.
//!
//! The hook makes no read-modify-write either (each is a locked instruction): a slot's wait
//! fields are written by its thread's events, which never run at once, with plain stores, and
//! the sampler keeps its own count of what it took ([`Slot::taken`]). A take reads the waits
//! ended (`waited`) before the wait under way (`ready_at`), and RESUMED clears `ready_at`
//! before it adds the wait to `waited`: so a take that sees the wait added sees it ended, and
//! no wait is counted twice. A take that counted a wait's part so far while the wait's RESUMED
//! read its clock just before the take's read can find `waited` short of what it took by those
//! few ns later: it takes nothing until the waits pass it again.
//!
//! The VALUE names its thread while the thread lives, and after: the sampler holds every
//! thread it looks at until its last take, so a VALUE is reused only once that take is done.
//! An ended thread's slot that a new thread at the same address finds (the sampler did not
//! take it: not profiling then) is the new thread's, cleared. GC compaction can move a Thread
//! (3.3.8 `vm.c`, `thread_compact`): its events then name the new address, which claims a new
//! slot, and the waits left on the old one are not taken. Before this table, each thread's
//! slot was named by its thread-specific value (`rb_internal_thread_specific_get`, two loads
//! through the `rb_thread_t` that missed the cache as threads moved between cores; the owner
//! was checked by VALUE then too): bench/RESULTS.md, "Timeline", has both costs.
//!
//! In a forked child every parent thread's slot is stale (its threads are gone without an
//! EXITED), so [`native_start`] frees them all, removing the parent's hook and adding a new one. With
//! more threads than slots, or a thread whose probes find none free, the waits of the threads
//! without one are not measured, and counted ([`UNTRACKED`]).
// On 3.1 the table and the events' logic are built (and unit-tested) but nothing calls them.
#![cfg_attr(not(ruby_gte_3_3), allow(dead_code))]
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use magnus::{prelude::*, rb_sys::AsRawValue, Error, Ruby, Value};

use crate::recorder::errors::entry;
use crate::sampling::clocks::tsc;

/// Whether this Ruby has the thread event API with the event's thread (3.3 and later).
pub const AVAILABLE: bool = cfg!(ruby_gte_3_3);

/// Threads whose waits are measured at once: a Puma of 32 threads uses 33.
const SLOTS: usize = 1024;

/// One thread's GVL account, a cache line of its own. `owner` is the Ruby thread (its VALUE)
/// while claimed, with [`ENDED`] set once it exited; [`TOMB`] once taken after that; 0 if never
/// claimed.
#[repr(align(64))]
struct Slot {
    owner: AtomicUsize,
    /// Ticks (`clocks::tsc`) when the thread became ready, 0 while it is not waiting.
    ready_at: AtomicU64,
    /// Ticks waited in the waits that ended since the slot was claimed. Written by the thread's
    /// events only.
    waited: AtomicU64,
    /// Ticks of `waited` and of waits under way that the sampler took. Written by the take
    /// (with the GVL), and cleared with the rest when the slot is claimed.
    taken: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only the array's initializer
const FREE: Slot = Slot {
    owner: AtomicUsize::new(0),
    ready_at: AtomicU64::new(0),
    waited: AtomicU64::new(0),
    taken: AtomicU64::new(0),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// In `owner`: the thread exited (a VALUE is 8-aligned, so its low bit is free).
const ENDED: usize = 1;
/// `owner` of a slot freed by the sampler's last take: free to claim, but a lookup goes on past
/// it (a thread that probed past the slot while it was owned is further on). Never a VALUE.
const TOMB: usize = 2;
/// Slots a lookup or a claim looks at, from the one the VALUE hashes to.
const PROBES: usize = 32;

/// The fork generation the slots were claimed in (`recorder::fork`).
static GENERATION: AtomicUsize = AtomicUsize::new(0);
static HOOKED: AtomicBool = AtomicBool::new(false);
/// The hook `rb_internal_thread_add_event_hook` returned (null: none).
static HOOK: AtomicUsize = AtomicUsize::new(0);
/// Events of threads that had no slot (the table full); `Profiler._native_sampling_stats`'s
/// `:gvl_untracked_events`.
pub static UNTRACKED: AtomicU64 = AtomicU64::new(0);

pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a plain function with no data, run with the GVL after every `at_exit` block
        // (`eval_jump.c`, `rb_ec_exec_end_proc`, 3.1 to 3.4): the hook is gone before the VM
        // frees the Threads that its callback would look up.
        unsafe { rb_sys::rb_set_end_proc(Some(stop_at_exit), rb_sys::Qnil as rb_sys::VALUE) };
    });
}

/// The slots `thread` (a VALUE) may be in, in probe order: from the one its hash names on.
fn probes(thread: usize) -> impl Iterator<Item = &'static Slot> {
    // Fibonacci hashing of the VALUE without its 3 always-zero bits; SLOTS is a power of two.
    // The top log2(SLOTS) bits of the product: below SLOTS.
    let start =
        (thread >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - SLOTS.trailing_zeros());
    (0..PROBES).map(move |i| &TABLE[(start + i) % SLOTS])
}

/// `thread`'s slot, claimed if `claim` and it has none: the one it owns (ended or not) among
/// its probes, else, if `claim`, the first free one (never claimed, or a [`TOMB`]), else the
/// first whose thread ended (its last waits, not taken yet, are dropped). A claim clears the
/// slot's times.
fn slot(thread: usize, claim: bool) -> Option<&'static Slot> {
    for slot in probes(thread) {
        match slot.owner.load(Ordering::Acquire) {
            0 => break,
            owner if owner & !ENDED == thread => {
                // An ended thread's VALUE, with events: a new thread at its address.
                if owner != thread && claim && !take_slot(slot, owner, thread) {
                    continue;
                }
                return Some(slot);
            }
            _ => {}
        }
    }
    if !claim {
        return None;
    }
    let free = |slot: &&Slot| {
        let owner = slot.owner.load(Ordering::Acquire);
        (owner == 0 || owner == TOMB) && take_slot(slot, owner, thread)
    };
    let ended = |slot: &&Slot| {
        let owner = slot.owner.load(Ordering::Acquire);
        owner & ENDED != 0 && take_slot(slot, owner, thread)
    };
    probes(thread).find(free).or_else(|| probes(thread).find(ended))
}

/// Gives `slot`, owned by `owner` now, to `thread`, its times cleared; false if it changed.
fn take_slot(slot: &Slot, owner: usize, thread: usize) -> bool {
    let ok =
        slot.owner.compare_exchange(owner, thread, Ordering::AcqRel, Ordering::Relaxed).is_ok();
    if ok {
        clear(slot);
    }
    ok
}

unsafe extern "C" fn stop_at_exit(_: rb_sys::VALUE) {
    let _ = catch_unwind(stop);
}

/// Removes the hook. A wait under way then never sees its RESUMED: it is dropped, so that a
/// take after this counts no time that is not a wait (the part of it a take counted stays
/// counted). What was measured stays to be taken.
fn stop() {
    if HOOKED.swap(false, Ordering::AcqRel) {
        // Once this returns no callback runs (Ruby takes its hooks' write lock), so the slots'
        // wait fields have no other writer until the hook is added again.
        imp::remove_hook();
        for slot in &TABLE {
            slot.ready_at.store(0, Ordering::Relaxed);
            let taken = slot.taken.load(Ordering::Relaxed);
            slot.waited.fetch_max(taken, Ordering::Release);
        }
    }
}

/// Empties a slot's times (its owner is set apart).
fn clear(slot: &Slot) {
    slot.ready_at.store(0, Ordering::Relaxed);
    slot.waited.store(0, Ordering::Relaxed);
    slot.taken.store(0, Ordering::Relaxed);
}

/// `Profiler._native_gvl_start`: measures the GVL waits from now on; false on a Ruby without
/// the API (or whose thread-specific keys are used up). In a forked child, the parent's hook
/// and slots go first. With the GVL.
pub(crate) fn native_start(ruby: &Ruby) -> Result<bool, Error> {
    entry(ruby, || {
        if !AVAILABLE {
            return Ok(false);
        }
        let generation = crate::recorder::fork::fork_generation() as usize;
        if GENERATION.swap(generation, Ordering::AcqRel) != generation {
            imp::remove_hook();
            HOOKED.store(false, Ordering::Release);
            for slot in &TABLE {
                slot.owner.store(0, Ordering::Relaxed);
                clear(slot);
            }
        }
        tsc::init();
        if !HOOKED.swap(true, Ordering::AcqRel) {
            imp::add_hook();
        }
        Ok(true)
    })
}

/// `Profiler._native_gvl_stop`: removes the hook. With the GVL.
pub(crate) fn native_stop(ruby: &Ruby) -> Result<(), Error> {
    entry(ruby, || {
        stop();
        Ok(())
    })
}

/// `Profiler._native_gvl_take(thread)`: the ns `thread` waited for the GVL since the last
/// take, counted up to now if it is waiting now; nil if its waits are not measured. After
/// [`stop`] too: the sampler's last flush takes what the last waits left.
pub(crate) fn native_take(ruby: &Ruby, thread: Value) -> Result<Option<u64>, Error> {
    entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(Error::new(ruby.exception_type_error(), "expected a Thread"));
        }
        let thread = thread.as_raw() as usize;
        let Some(slot) = slot(thread, false) else { return Ok(None) };
        let new = take(slot);
        // An ended thread's last take: its slot is free again.
        let _ =
            slot.owner.compare_exchange(thread | ENDED, TOMB, Ordering::AcqRel, Ordering::Relaxed);
        Ok(Some(tsc::to_ns(new)))
    })
}

/// The ticks `slot`'s thread waited since the last take, the wait under way counted up to now
/// (its rest at its RESUMED). By the sampler only.
fn take(slot: &Slot) -> u64 {
    // `waited` before `ready_at` (module doc): a wait is in one or the other, never both.
    let mut total = slot.waited.load(Ordering::Acquire);
    let ready = slot.ready_at.load(Ordering::Acquire);
    if ready > 0 {
        total += tsc::now().saturating_sub(ready);
    }
    let new = total.saturating_sub(slot.taken.load(Ordering::Relaxed));
    if new > 0 {
        slot.taken.store(total, Ordering::Relaxed);
    }
    new
}

/// `Profiler._native_gvl_waiting(thread)`: whether `thread` is ready to run but without the
/// GVL now (between its READY and its RESUMED); nil if its waits are not measured. With the
/// GVL, so `thread` is not the caller.
pub(crate) fn native_waiting(ruby: &Ruby, thread: Value) -> Result<Option<bool>, Error> {
    entry(ruby, || {
        if !thread.is_kind_of(ruby.class_thread()) {
            return Err(Error::new(ruby.exception_type_error(), "expected a Thread"));
        }
        if !HOOKED.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some(slot) = slot(thread.as_raw() as usize, false) else { return Ok(None) };
        Ok(Some(slot.ready_at.load(Ordering::Acquire) > 0))
    })
}

/// `Profiler._native_gvl_dispatch_probe(on)`, for bench/gvl_hook.rb only: adds (or removes) a
/// second thread event hook, on STARTED alone, whose callback does nothing. With it Ruby pays
/// its dispatch of every GVL event (its hooks' lock and list walk run for any event once a hook
/// exists), and no callback runs while no thread starts: the part of the hook's cost that is
/// Ruby's, measured apart from ours. False on a Ruby without the API. With the GVL.
pub(crate) fn native_dispatch_probe(ruby: &Ruby, on: bool) -> Result<bool, Error> {
    entry(ruby, || {
        if AVAILABLE {
            imp::dispatch_probe(on);
        }
        Ok(AVAILABLE)
    })
}

/// What the hook does for one event on `thread`'s slot.
fn on_event(event: u32, thread: usize) {
    let claim = event != imp::EXITED;
    let Some(slot) = slot(thread, claim) else {
        if claim {
            UNTRACKED.fetch_add(1, Ordering::Relaxed);
        }
        return;
    };
    match event {
        // Plain loads and stores: only this thread's events write the wait fields, and they
        // never run at once (module doc).
        imp::READY => {
            // A READY with a wait under way keeps the wait's start.
            if slot.ready_at.load(Ordering::Relaxed) == 0 {
                slot.ready_at.store(tsc::now(), Ordering::Release);
            }
        }
        imp::RESUMED => {
            let ready = slot.ready_at.load(Ordering::Relaxed);
            if ready > 0 {
                let waited = tsc::now().saturating_sub(ready);
                // Cleared before the wait is added, so that a take sees it in one place only.
                slot.ready_at.store(0, Ordering::Relaxed);
                let total = slot.waited.load(Ordering::Relaxed) + waited;
                slot.waited.store(total, Ordering::Release);
            }
        }
        _ => {
            slot.ready_at.store(0, Ordering::Relaxed);
            slot.owner.store(thread | ENDED, Ordering::Release);
        }
    }
}

#[cfg(ruby_gte_3_3)]
mod imp {
    use std::ffi::c_void;
    use std::panic::AssertUnwindSafe;

    use super::*;

    pub const READY: u32 = rb_sys::RUBY_INTERNAL_THREAD_EVENT_READY;
    pub const RESUMED: u32 = rb_sys::RUBY_INTERNAL_THREAD_EVENT_RESUMED;
    pub const EXITED: u32 = rb_sys::RUBY_INTERNAL_THREAD_EVENT_EXITED;

    type Callback = unsafe extern "C" fn(
        rb_sys::rb_event_flag_t,
        *const rb_sys::rb_internal_thread_event_data_t,
        *mut c_void,
    );

    /// Adds `callback` on `events`, and stores the hook Ruby returned in `slot`.
    fn add(slot: &AtomicUsize, callback: Callback, events: u32) {
        // SAFETY: GVL held, not from a thread event callback (`thread.h`'s one rule); both
        // callbacks here never unwind and use no data pointer.
        let hook = unsafe {
            rb_sys::rb_internal_thread_add_event_hook(
                Some(callback),
                events as rb_sys::rb_event_flag_t,
                std::ptr::null_mut(),
            )
        };
        slot.store(hook as usize, Ordering::Release);
    }

    /// Removes the hook stored in `slot`, if any.
    fn remove(slot: &AtomicUsize) {
        let hook = slot.swap(0, Ordering::AcqRel);
        if hook != 0 {
            // SAFETY: GVL held, not from a callback; `hook` is the one `add` got (a forked
            // child's is its parent's, in the hook list it inherited). Ruby takes its hooks'
            // write lock, so no callback runs it meanwhile (3.3.8 `thread_pthread.c`).
            unsafe {
                rb_sys::rb_internal_thread_remove_event_hook(
                    hook as *mut rb_sys::rb_internal_thread_event_hook_t,
                )
            };
        }
    }

    pub fn add_hook() {
        add(&HOOK, on_gvl_event, READY | RESUMED | EXITED);
    }

    pub fn remove_hook() {
        remove(&HOOK);
    }

    /// The probe hook `native_dispatch_probe` added (null: none).
    static PROBE: AtomicUsize = AtomicUsize::new(0);

    pub fn dispatch_probe(on: bool) {
        remove(&PROBE);
        if on {
            add(&PROBE, nothing, rb_sys::RUBY_INTERNAL_THREAD_EVENT_STARTED);
        }
    }

    unsafe extern "C" fn nothing(
        _: rb_sys::rb_event_flag_t,
        _: *const rb_sys::rb_internal_thread_event_data_t,
        _: *mut c_void,
    ) {
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
        let _ = catch_unwind(AssertUnwindSafe(|| on_event(event, thread)));
    }
}

#[cfg(not(ruby_gte_3_3))]
mod imp {
    pub const READY: u32 = 1;
    pub const RESUMED: u32 = 2;
    pub const EXITED: u32 = 4;

    pub fn add_hook() {}

    pub fn remove_hook() {}

    pub fn dispatch_probe(_on: bool) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    // The table is shared by the tests, which run at once: each uses VALUEs of its own.

    #[test]
    fn a_thread_finds_the_slot_it_claimed_and_a_take_after_its_end_frees_it() {
        let thread = 0x7f00_0000_1000;
        assert!(slot(thread, false).is_none());
        let claimed = slot(thread, true).unwrap();
        assert!(std::ptr::eq(slot(thread, false).unwrap(), claimed));
        on_event(imp::READY, thread);
        on_event(imp::RESUMED, thread);
        on_event(imp::EXITED, thread);
        assert_eq!(claimed.owner.load(Ordering::Relaxed), thread | ENDED);
        assert!(std::ptr::eq(slot(thread, false).unwrap(), claimed), "found until taken");
        // A new thread at the same address (the old one ended, never taken): its slot, cleared.
        claimed.waited.store(5, Ordering::Relaxed);
        assert!(std::ptr::eq(slot(thread, true).unwrap(), claimed));
        assert_eq!(claimed.owner.load(Ordering::Relaxed), thread);
        assert_eq!(claimed.waited.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn threads_that_hash_alike_are_found_past_a_freed_slot() {
        // VALUEs 8 * SLOTS apart hash alike only by chance, so pick ones that do.
        let base = 0x7f10_0000_0000usize;
        let first = std::ptr::addr_of!(*probes(base).next().unwrap()) as usize;
        let same: Vec<usize> = (1..200_000)
            .map(|i| base + 8 * i)
            .filter(|&v| std::ptr::addr_of!(*probes(v).next().unwrap()) as usize == first)
            .take(2)
            .collect();
        let (a, b) = (base, same[0]);
        let slot_a = slot(a, true).unwrap();
        let slot_b = slot(b, true).unwrap();
        assert!(!std::ptr::eq(slot_a, slot_b));
        // `a` ends and is taken: its slot becomes a tomb, and `b`, probed past it, is found.
        slot_a.owner.store(a | ENDED, Ordering::Relaxed);
        assert!(slot_a
            .owner
            .compare_exchange(a | ENDED, TOMB, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok());
        assert!(std::ptr::eq(slot(b, false).unwrap(), slot_b));
        // A third thread of the same hash reuses the tomb.
        let c = same[1];
        assert!(std::ptr::eq(slot(c, true).unwrap(), slot_a));
    }

    #[test]
    fn a_wait_is_taken_once_whether_taken_during_it_or_after() {
        tsc::init();
        // The ticks' rate is measured since `init`: let it settle before timing with it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let thread = 0x7f20_0000_1000;
        let slot = slot(thread, true).unwrap();
        let spin = |ns: u64| {
            let start = tsc::now();
            while tsc::to_ns(tsc::now() - start) < ns {}
        };
        on_event(imp::READY, thread);
        spin(200_000);
        let during = take(slot);
        assert!(during > 0);
        spin(200_000);
        on_event(imp::RESUMED, thread);
        let after = take(slot);
        let whole = slot.waited.load(Ordering::Relaxed);
        assert_eq!(during + after, whole, "the wait, in two parts");
        // Not 400,000 exactly: the ticks' rate may have moved a little since the spins.
        assert!(tsc::to_ns(whole) >= 396_000);
        assert_eq!(take(slot), 0, "nothing twice");
        // A second wait: the next take is it, and only it.
        on_event(imp::READY, thread);
        spin(100_000);
        on_event(imp::RESUMED, thread);
        let second = take(slot);
        assert_eq!(second, slot.waited.load(Ordering::Relaxed) - whole);
        assert!(tsc::to_ns(second) >= 98_000);
        on_event(imp::EXITED, thread);
    }

    #[test]
    fn a_slot_is_a_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::align_of::<Slot>(), 64);
    }
}
