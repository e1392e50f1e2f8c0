//! Facts about the Ruby VM that no public API gives, each with the Ruby source it comes from,
//! for every Ruby version the gem runs on. Code elsewhere asks here rather than knowing them.
//! The VM interfaces that need such facts live here too: [`frames`] reads any thread's
//! control frames, [`postponed`] asks Ruby to run a postponed job, [`internal_hook`] hooks its
//! internal events (NEWOBJ, FREEOBJ, the GC's), and [`gvl_cell`] keeps the state that only GVL
//! holders (the GC's callbacks and Ruby's internal hooks among them) touch.

pub mod frames;
pub mod gvl_cell;
pub mod internal_hook;
pub mod postponed;

use std::cell::UnsafeCell;
use std::ffi::c_void;

/// `RUBY_T_MASK` and `RUBY_T_IMEMO` (`include/ruby/internal/value_type.h`, the same in 3.1,
/// 3.3 and 3.4): an object's type is the low 5 bits of its `RBasic::flags`.
const T_MASK: u64 = 0x1f;
const T_IMEMO: u64 = 0x1a;

/// `imemo_ment` and `imemo_iseq` (`internal/imemo.h`: 6 and 7 in 3.1, 3.3 and 3.4), stored
/// in `flags` from bit `FL_USHIFT` (12) on, 4 bits (`IMEMO_MASK`).
const IMEMO_SHIFT: u64 = 12;
const IMEMO_MASK: u64 = 0x0f;
const IMEMO_MENT: u64 = 6;
const IMEMO_ISEQ: u64 = 7;

/// `RUBY_T_ICLASS` (`include/ruby/internal/value_type.h`, 3.1, 3.3 and 3.4): the class that
/// stands for a module in the ancestors of the class that includes it.
const T_ICLASS: u64 = 0x1c;

/// `rb_callable_method_entry_t::defined_class` (`method.h`, 3.1, 3.3 and 3.4: after `flags`).
const CME_DEFINED_CLASS_OFFSET: usize = 0x8;

/// Whether the callable method entry `cme` was found through an included module (its
/// `defined_class` is an iclass). `rb_profile_frame_singleton_method_p` tests `FL_SINGLETON`
/// on `defined_class` without looking at its type (Ruby 3.3.8 `vm_backtrace.c`); on an iclass
/// that bit (`FL_USER1`) means something else, so on 3.3 a module function called as the
/// module's instance method (`format`, `sleep`: Kernel's, through Object's iclass) reads as a
/// singleton method, `Kernel.format`. Ruby 3.4 checks the type (`RCLASS_SINGLETON_P`).
///
/// # Safety
///
/// `cme` is a live `imemo_ment`; GVL held.
pub unsafe fn defined_in_iclass(cme: rb_sys::VALUE) -> bool {
    // SAFETY: a method entry's `defined_class` is a live class or module (marked by it), or 0.
    let klass = unsafe { *((cme as usize + CME_DEFINED_CLASS_OFFSET) as *const rb_sys::VALUE) };
    if klass == 0 || klass & 0x7 != 0 {
        return false;
    }
    // SAFETY: a heap object's first word is its flags.
    let flags = unsafe { *(klass as *const u64) };
    flags & T_MASK == T_ICLASS
}

/// Whether `v` is a heap object of the kinds `rb_profile_frames` returns (an iseq or a
/// callable method entry): a frame object read earlier that a compaction moved in the
/// meantime would read as `T_MOVED` instead.
///
/// # Safety (of the read inside)
///
/// `v` must be 0, a special constant, or a pointer into the Ruby heap (a slot that stays
/// mapped: heap pages are freed only by a GC, and the callers hold frames read from a live
/// stack and marked since).
pub fn is_imemo(v: rb_sys::VALUE) -> bool {
    // Special constants (immediates, nil, false) have low bits set or are small.
    if v == 0 || v & 0x7 != 0 {
        return false;
    }
    // SAFETY: a heap slot's first word is its `RBasic::flags` (see the doc above).
    let flags = unsafe { std::ptr::read_volatile(v as *const u64) };
    let imemo = (flags >> IMEMO_SHIFT) & IMEMO_MASK;
    flags & T_MASK == T_IMEMO && (imemo == IMEMO_MENT || imemo == IMEMO_ISEQ)
}

/// Where a thread's execution context is, for the Ruby this extension was built against:
/// the offset of `ec` in `rb_thread_t`, and of `interrupt_mask` in `rb_execution_context_t`
/// (`vm_core.h`). `None` on a Ruby whose layout has not been checked (3.0, 3.2, 3.5+).
///
/// - 3.1: `lt_node` (16 bytes), `self`, `ractor`, `vm`, then `ec` at 0x28.
/// - 3.3 and 3.4: `nt` (the native thread) comes before `ec`, at 0x30.
/// - In all three, `rb_execution_context_t` starts with `vm_stack`, `vm_stack_size`, `cfp`
///   and `tag`, then `interrupt_flag` at 0x20 and `interrupt_mask` at 0x24.
///
/// Checked in the machine code of each libruby (Debian's 3.1.2, our 3.3.8 and 3.4.5 builds):
/// `rb_thread_interrupted` loads `th->ec` from 0x28 (3.1) or 0x30 (3.3, 3.4), then
/// `interrupt_flag` from 0x20 and `interrupt_mask` from 0x24 of it.
pub const THREAD_EC_OFFSET: Option<usize> = if cfg!(ruby_eq_3_1) {
    Some(0x28)
} else if cfg!(any(ruby_eq_3_3, ruby_eq_3_4)) {
    Some(0x30)
} else {
    None
};
/// See [`THREAD_EC_OFFSET`].
pub const EC_INTERRUPT_MASK_OFFSET: usize = 0x24;
/// `sizeof(rb_control_frame_t)` (`vm_core.h`): on 3.1 eight words (`pc`, `sp`, `iseq`, `self`,
/// `ep`, `block_code`, `__bp__`, `jit_return`); 3.3 and 3.4 dropped `__bp__`, seven words
/// (`VM_DEBUG_BP_CHECK` is 0, so no `bp_check`). The fields `vm::frames` reads (`pc` 0x00,
/// `iseq` 0x10, `ep` 0x20) are at the same offsets in all three.
pub const CFP_SIZE: usize = if cfg!(ruby_eq_3_1) { 0x40 } else { 0x38 };
/// `rb_control_frame_t::jit_return` on 3.3 and 3.4 (`cfp[6]`): set while JIT code runs the frame.
pub const CFP_JIT_RETURN_OFFSET: usize = 0x30;
/// How `rb_profile_frames` walks on 3.3 and 3.4 (`thread_profile_frames`, `vm_backtrace.c`
/// of 3.3.8 and 3.4.5), unlike 3.1's: it stops one frame before the end (the dummy frame at
/// the stack's bottom, "see `rb_ec_partial_backtrace_object`"), passes over a Ruby frame with
/// no `pc`, and gives the top frame line 0 when its `jit_return` is set (the JIT may not have
/// updated its `pc`).
pub const PROFILE_FRAMES_SKIP_DUMMY_AND_PCLESS: bool = !cfg!(ruby_eq_3_1);
/// `rb_thread_t::self` (after the 16-byte `lt_node`, in 3.1, 3.3 and 3.4): the Thread object
/// itself, which lets a caller check that it holds a `rb_thread_t` of the layout above.
pub const THREAD_SELF_OFFSET: usize = 0x10;
/// The stack fields at the start of `rb_execution_context_t` (`vm_core.h`, the same in 3.1,
/// 3.3 and 3.4): `vm_stack`, `vm_stack_size` (in VALUEs) and `cfp`; and `thread_ptr`, back to
/// its `rb_thread_t`. The one statement of them: `frames` reads them from here.
pub const EC_VM_STACK_OFFSET: usize = 0x0;
pub const EC_VM_STACK_SIZE_OFFSET: usize = 0x8;
pub const EC_CFP_OFFSET: usize = 0x10;
pub const EC_THREAD_PTR_OFFSET: usize = 0x30;

/// Whether the calling thread's VM stack can be walked now, in a signal handler that
/// interrupted it: its execution context has a stack and its `cfp` lies in it. A thread
/// that ends clears them one after the other (`rb_ec_clear_vm_stack`, `vm.c`, from
/// `thread_cleanup_func` via `rb_threadptr_root_fiber_terminate`, 3.1 to 3.4: `vm_stack`
/// and its size first, then `cfp`). A signal between the two finds a `cfp` with no stack
/// end to stop at, and `rb_profile_frames` then walks off the stack: found on 3.3.8 by
/// `bench/interrupt_storm.rb` (a SEGV in `thread_profile_frames` under
/// `thread_cleanup_func`). Reads only memory (the handler interrupted this very thread, so
/// nothing changes while it runs); false on a Ruby whose layout is not known.
///
/// # Safety
///
/// The calling thread is a Ruby thread holding the GVL (`ruby_thread_has_gvl_p`).
pub unsafe fn current_stack_walkable() -> bool {
    // SAFETY: a Ruby thread with the GVL has a current thread (its TLS execution context);
    // rb_thread_current only reads it.
    let thread = unsafe { rb_sys::rb_thread_current() };
    // SAFETY: the running thread is a live Thread; its own stack cannot change meanwhile.
    unsafe { stack_walkable(thread) }
}

/// Whether `thread`'s VM stack can be walked (as [`current_stack_walkable`] checks): for
/// `rb_profile_thread_frames` (3.3+), which reads `th->ec->cfp` with no check of its own but
/// a NULL one (Ruby 3.3.8 and 3.4.5 `vm_backtrace.c`, `thread_profile_frames`). With the GVL
/// held, a thread that does not hold it cannot move its frames, nor clear its stack
/// (`thread_start_func_2` calls `thread_cleanup_func` before it releases the GVL, `thread.c`): so what is read stays true until the GVL is
/// released.
///
/// # Safety
///
/// `thread` is a live Thread object; the calling thread holds the GVL (or, in a signal
/// handler, interrupted `thread` itself).
pub unsafe fn stack_walkable(thread: rb_sys::VALUE) -> bool {
    let Some(ec_offset) = THREAD_EC_OFFSET else { return false };
    // SAFETY: `thread` is a live Thread (the caller's promise).
    let Some(th) = (unsafe { thread_struct(thread) }) else { return false };
    // SAFETY: `th` is the live rb_thread_t, larger than this offset (see above).
    let ec = unsafe { *(th.add(ec_offset) as *const *const u8) };
    if ec.is_null() {
        return false;
    }
    // SAFETY: `ec` is the thread's live execution context; these are its first fields.
    let (stack, size, cfp) = unsafe {
        (
            std::ptr::read_volatile(ec.add(EC_VM_STACK_OFFSET) as *const usize),
            std::ptr::read_volatile(ec.add(EC_VM_STACK_SIZE_OFFSET) as *const usize),
            std::ptr::read_volatile(ec.add(EC_CFP_OFFSET) as *const usize),
        )
    };
    let end = stack.wrapping_add(size.wrapping_mul(8));
    stack != 0 && size != 0 && cfp >= stack && cfp < end
}

/// `rb_thread_t::ractor` (after `lt_node` and `self`, in 3.1, 3.3 and 3.4): the Ractor the
/// thread runs in, whose GVL it takes.
const THREAD_RACTOR_OFFSET: usize = 0x18;

/// Where a Ractor says which thread holds its GVL, in `rb_ractor_t` (`ractor_core.h`): on 3.1
/// `threads.gvl.owner` (`gvl_acquire_common` sets it, `gvl_release_common` clears it,
/// `thread_pthread.c`); on 3.3 and 3.4 `threads.sched.running` (`thread_sched_set_running`,
/// `thread_pthread.c`: the thread that runs, M:N threads too, whatever native thread they are
/// on). `offsetof` compiled against each Ruby's own `vm_core.h`/`ractor_core.h` and its
/// installed `config.h`: 0x150 on Debian's 3.1.2 (source package ruby3.1 3.1.2-7+deb12u1),
/// 0x148 on our 3.3.8 and 3.4.5 builds; checked at load ([`gvl_owner_checked`]). This is what
/// dd-trace-rb reads (`gvl_owner`, its `private_vm_api_access.c`).
const RACTOR_GVL_OWNER_OFFSET: Option<usize> = if cfg!(ruby_eq_3_1) {
    Some(0x150)
} else if cfg!(any(ruby_eq_3_3, ruby_eq_3_4)) {
    Some(0x148)
} else {
    None
};

/// Whether the thread whose `rb_thread_t` is `th` is the one its Ractor says holds the GVL
/// ([`RACTOR_GVL_OWNER_OFFSET`]); None where that is not known.
///
/// # Safety
///
/// `th` is a live `rb_thread_t` of the layout above.
unsafe fn owns_gvl(th: *const u8) -> Option<bool> {
    let offset = RACTOR_GVL_OWNER_OFFSET?;
    // SAFETY: `th` is live; its `ractor` is set at its creation and lives as long as it.
    let ractor = unsafe { *(th.add(THREAD_RACTOR_OFFSET) as *const *const u8) };
    if ractor.is_null() {
        return Some(false);
    }
    // SAFETY: a pointer-sized, aligned field of the live Ractor, which other threads write
    // as they take and release the GVL: read as an atomic word.
    let owner = unsafe {
        (*(ractor.add(offset) as *const std::sync::atomic::AtomicUsize))
            .load(std::sync::atomic::Ordering::Acquire)
    };
    Some(owner == th as usize)
}

/// The `rb_thread_t` of `thread`, if it is one of the layout [`THREAD_SELF_OFFSET`] checks.
///
/// # Safety
///
/// `thread` is a live Thread object.
unsafe fn thread_struct(thread: rb_sys::VALUE) -> Option<*const u8> {
    // SAFETY: a Thread is a T_DATA object whose data is its rb_thread_t (`rb_thread_ptr`).
    let th = unsafe { rb_sys::RTYPEDDATA_GET_DATA(thread) as *const u8 };
    // SAFETY: a live rb_thread_t is larger than this offset.
    (!th.is_null() && unsafe { *(th.add(THREAD_SELF_OFFSET) as *const rb_sys::VALUE) } == thread)
        .then_some(th)
}

/// Whether the calling thread really holds the GVL, for a signal handler that interrupted it:
/// `ruby_thread_has_gvl_p` says only that it is not in a blocking region, which is also true
/// of a thread that a time slice took the GVL from and that waits to get it back, while the
/// real holder may start a GC or a compaction (`signal_sampler`, "The handler"). So the
/// Ractor's GVL owner must be this thread too, where it is known ([`gvl_owner_checked`]).
///
/// # Safety
///
/// In a signal handler or with the GVL; the VM is running.
pub unsafe fn current_thread_holds_gvl() -> bool {
    // SAFETY: reads the calling thread's own TLS execution context and thread (Ruby 3.1
    // `thread.c`), as stated at the extern.
    if unsafe { ruby_thread_has_gvl_p() } == 0 {
        return false;
    }
    if !GVL_OWNER_CHECKED.load(std::sync::atomic::Ordering::Acquire) {
        return true;
    }
    // SAFETY: not in a blocking region, so a Ruby thread with an execution context, whose
    // Thread rb_thread_current only reads; a live Thread.
    (unsafe { thread_holds_gvl(rb_sys::rb_thread_current()) }) == Some(true)
}

/// Set by [`check_gvl_owner`]: the Ractor's GVL owner reads as the holder on this Ruby.
static GVL_OWNER_CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// At load, with the GVL: whether [`RACTOR_GVL_OWNER_OFFSET`] holds on this Ruby, checked on
/// the calling thread (it holds the GVL, so it must read as the owner). False where it does not,
/// or where it is not known: the signal handler then reads no stack (`Profiler#sampling_mode`
/// falls back to `:safepoint`).
pub fn check_gvl_owner() {
    // SAFETY: with the GVL (at load), the current thread is a live Thread.
    let ok = unsafe { thread_holds_gvl(rb_sys::rb_thread_current()) } == Some(true);
    GVL_OWNER_CHECKED.store(ok, std::sync::atomic::Ordering::Release);
}

/// Whether [`check_gvl_owner`] found the GVL's owner where it should be.
pub fn gvl_owner_checked() -> bool {
    GVL_OWNER_CHECKED.load(std::sync::atomic::Ordering::Acquire)
}

/// Whether `thread` is the one its Ractor says holds the GVL (tests: `Profiler::Testing`);
/// None where that is not known or `thread` is not of the checked layout.
///
/// # Safety
///
/// `thread` is a live Thread object; GVL held.
pub unsafe fn thread_holds_gvl(thread: rb_sys::VALUE) -> Option<bool> {
    // SAFETY: as the caller promises.
    let th = unsafe { thread_struct(thread) }?;
    // SAFETY: a live rb_thread_t of the checked layout.
    unsafe { owns_gvl(th) }
}

/// Whether `RUBY_EVENT_THREAD_END` fires for every thread that ends. On 3.1 it fires in
/// `thread_do_start_proc` right after the thread's block returned (`thread.c`), so a thread
/// that ends with an exception, or is killed, longjmps past it (checked on Debian's 3.1.2: a
/// `TracePoint.new(:thread_end)` sees a thread that returns, not one that raises or is killed).
/// 3.3 and 3.4 fire it in `thread_start_func_2` after the thread's tag is left, however the
/// thread ended (`event_thread_end_hooked`, Ruby 3.3.8 `thread.c`).
pub const THREAD_END_ON_EVERY_END: bool = !cfg!(ruby_eq_3_1);

/// Whether adding a thread-event hook (`RUBY_EVENT_THREAD_BEGIN`/`END`) throws YJIT's machine
/// code away on this Ruby. 3.1 sends any TracePoint event, thread events too, to YJIT's
/// invalidation, and the program runs interpreted from then on (about 4 times slower on
/// Debian's 3.1.2: bench/RESULTS.md, "No thread-event hook under YJIT on 3.1"). 3.3 and 3.4
/// invalidate only when ISEQ, `c_call` or `c_return` events are first enabled
/// (`update_global_event_hook`, Ruby 3.3.8 `vm_trace.c`).
pub const THREAD_HOOK_DISABLES_YJIT: bool = cfg!(ruby_eq_3_1);

/// Whether a signal handler may read the frames of a thread that runs YJIT's machine code.
/// From 3.3.0 YJIT fills each frame it pushes, `jit_return` included, before it moves
/// `ec->cfp` to it (3.3.8 and 3.4.5 `yjit/src/codegen.rs`, `gen_send_iseq`: "ec->cfp is
/// updated after cfp->jit_return for rb_profile_frames() safety", ruby/ruby PR #9072; a C
/// method's frame, `gen_send_cfunc`, is filled before "set ec->cfp" too), and leaves a frame's
/// `pc` unwritten until it needs it, which `rb_profile_frames` allows for: it gives line 0 to
/// the top frame when its `jit_return` is set (`thread_profile_frames`, 3.3.8 and 3.4.5
/// `vm_backtrace.c`, PR #8415), the only frame whose `pc` can be stale ("the JIT compiler will
/// update the PC before entering a new function"). `vm::frames::read` does the same. Before
/// 3.3 neither holds (stackprof #179/#180: crashes; stackprof reads in its handler with YJIT
/// on from 3.3 only, its `lib/stackprof.rb`), so on 3.1 with YJIT the stack is read at the
/// job.
pub const HANDLER_READS_UNDER_YJIT: bool = !cfg!(ruby_eq_3_1);

/// Whether an internal hook on the GC's events (GC_EXIT) leaves allocation on its fast path.
/// On 3.1 a hook on any objspace event (`RUBY_INTERNAL_EVENT_OBJSPACE_MASK`: NEWOBJ, FREEOBJ
/// and the GC's events) sets `objspace->flags.has_hook` (`rb_objspace_set_event_hook`), and
/// `newobj_of` takes its slow path whenever it is set (`gc_event_hook_available_p`, Ruby 3.1
/// `gc.c`; what that costs: `duty_cycle`). 3.3 tests the NEWOBJ event alone
/// (`has_newobj_hook`, set by `rb_objspace_set_event_hook` and tested in `newobj_of`, 3.3.8
/// `gc.c`), and so does 3.4 (`rb_gc_event_hook_required_p(RUBY_INTERNAL_EVENT_NEWOBJ)` in
/// `newobj_of`, 3.4.5 `gc.c`).
pub const GC_EXIT_HOOK_KEEPS_ALLOCATION_FAST: bool = !cfg!(ruby_eq_3_1);

/// The interrupt bits of `interrupt_mask` (`vm_core.h`, the same in 3.1, 3.3 and 3.4).
pub const PENDING_INTERRUPT_MASK: u32 = 0x2;
pub const POSTPONED_JOB_INTERRUPT_MASK: u32 = 0x4;
pub const TRAP_INTERRUPT_MASK: u32 = 0x8;

extern "C" {
    /// Whether the calling native thread is a Ruby thread outside a blocking region (so, most
    /// of the time, the GVL holder): Ruby 3.1 `thread.c` reads the thread-local execution
    /// context and its thread's `blocking_region_buffer`, nothing else. Exported by libruby
    /// (3.1, 3.3, 3.4) but declared in no header that rb-sys binds.
    pub fn ruby_thread_has_gvl_p() -> std::ffi::c_int;
}

/// Ruby bug #19991's decoy (see [`decoy_data`]). Zeroed, writable (`.bss`), never read by us.
#[repr(C, align(64))]
struct DecoyObjspace(UnsafeCell<[u64; 8192]>);
// SAFETY: we never touch its contents; the only writer is Ruby's `gc_finalize_deferred`
// (atomic operations, see [`decoy_data`]), from a thread holding the GVL.
unsafe impl Sync for DecoyObjspace {}
static DECOY_OBJSPACE: DecoyObjspace = DecoyObjspace(UnsafeCell::new([0; 8192]));

/// The data pointer to register any postponed job with.
///
/// Ruby bug #19991: another job may get our data.
///
/// In Ruby < 3.3 a register racing `rb_postponed_job_flush` can overwrite the slot that the
/// flush is reading, so the flush may call the *previous* job's function with *our* data
/// pointer. The previous job is in practice the GC's `gc_finalize_deferred`, whose data is the
/// VM's objspace: it atomically sets and clears `objspace->atomic_flags.finalizing` and takes
/// `objspace->heap_pages.deferred_final` (exchanging it with 0). dd-trace-rb passes the real
/// objspace; its address is not reachable through the public headers, so we pass a zeroed,
/// writable 64 KiB block instead ([`DECOY_OBJSPACE`]): that job then finds no deferred
/// finalizer and does nothing. Checked in Debian's `libruby-3.1.so.3.1.2`: the function that
/// `gc.c` registers (the only `rb_postponed_job_register_one` call in libruby) does `xchg` of
/// 1 at data+0xc8 (`finalizing`), then `xchg` of 0 at data+0x140 (`deferred_final`), loops
/// only while that was non-zero, and `xchg`es the flag back: both offsets are far inside the
/// block. Our job ignores its data, so the opposite mix-up is harmless too. From 3.3 on,
/// preregistered jobs keep their data in a table that a trigger never writes (`vm_trace.c`),
/// so this is only a precaution there.
pub fn decoy_data() -> *mut c_void {
    DECOY_OBJSPACE.0.get().cast()
}
