//! Reading any thread's control frames the way `rb_profile_frames` reads the current one's, so
//! that every stack the profiler records is named from the same frame objects (see
//! `stack_capture`'s module doc, "Names").
//!
//! Ruby 3.1 has no public API that reads another thread's frames without making Ruby objects
//! (3.3 adds `rb_profile_thread_frames`), and no Ruby has one that tells a method made with
//! `define_method` (a *bmethod*) from the block it runs. Used on 3.1, 3.3 and 3.4: the layouts
//! below are the same in the three (checked in 3.3.8's and 3.4.5's `vm_core.h`, `method.h`
//! and `internal/imemo.h`), but for the frame's size and `rb_thread_t::ec`'s offset, which
//! `vm` gives per version, and for how 3.3+'s `rb_profile_frames` walks
//! (`vm::PROFILE_FRAMES_SKIP_DUMMY_AND_PCLESS`), which [`read`] follows there.
//! `rb_profile_frames` (Ruby 3.1 `vm_backtrace.c`) walks `GET_EC()->cfp` towards the root
//! (`RUBY_VM_PREVIOUS_CONTROL_FRAME`, one 64-byte `rb_control_frame_t` at a time) up to
//! `RUBY_VM_END_CONTROL_FRAME(ec)` (`ec->vm_stack + ec->vm_stack_size`). For a Ruby frame
//! (`VM_FRAME_RUBYFRAME_P`: the `VM_FRAME_FLAG_CFRAME` bit clear in `ep[0]`) it stores the
//! frame's callable method entry if `rb_vm_frame_method_entry(cfp)` (`vm_insnhelper.c`) gives
//! one of type `VM_METHOD_TYPE_ISEQ`, else `cfp->iseq`, and the line `calc_lineno(iseq, pc)`;
//! for a C frame, the method entry if it is a `VM_METHOD_TYPE_CFUNC` one, with line 0.
//! [`read`] does the same for the execution context of any thread, with two differences: for
//! a bmethod's frame (and the blocks inside it, which `rb_vm_frame_method_entry` also maps to
//! it) it stores the bmethod's method entry where `rb_profile_frames` stores the block's iseq,
//! so that the frame can be named `Node#meth` rather than `block in <class:Node>`; and for
//! code eval'd from a string (an eval's frame, and the blocks in it: an eval's frame comes in
//! their ep chain before the method entry) it stores the frame's iseq where
//! `rb_profile_frames` stores the method entry of the method whose binding the eval ran in,
//! so that a template's code (`ERB#result` evals the template's compiled source with the
//! caller's binding) is named for the template's file, not for the method that rendered it
//! (`stack_capture`'s module doc, "Names"; [`in_eval`] tells such an iseq when it is named).
//!
//! The layouts it relies on (Ruby 3.1.0 `vm_core.h`, `method.h`, `internal/imemo.h`; checked
//! against the machine code of `rb_profile_frames` and `rb_profile_frame_classpath` in
//! Debian's `libruby-3.1.so.3.1.2`):
//!
//! - `rb_thread_t`: `self` and `ec`, at `vm::THREAD_SELF_OFFSET` and `vm::THREAD_EC_OFFSET`
//!   (whose docs give them by version); the Thread object's typed data is its `rb_thread_t`.
//! - `rb_execution_context_t`: `vm_stack`, `vm_stack_size` (in VALUEs), `cfp` and
//!   `thread_ptr`, at `vm::EC_VM_STACK_OFFSET` and the three after it.
//! - `rb_control_frame_t` (64 bytes): `pc` 0x00, `iseq` 0x10, `ep` 0x20. `ep[0]` holds the
//!   frame flags (`VM_FRAME_FLAG_BMETHOD` 0x40, `VM_FRAME_FLAG_CFRAME` 0x80,
//!   `VM_ENV_FLAG_LOCAL` 0x2) and the frame's magic (`& 0x7fff0001`: `METHOD` 0x11110001,
//!   `BLOCK` 0x22220001, `CFUNC` 0x55550001, `EVAL` 0x77770001; copied with the flags when
//!   the env moves to the heap, `vm_make_env_each`; 3.1.2's machine code masks and compares
//!   them so, and our 3.3.8 and 3.4.5 builds' debug information has the same values),
//!   `ep[-1]` the previous ep (tagged in its low 2 bits) and `ep[-2]` a method entry, a cref
//!   or (local ep only) an svar whose `cref_or_me` is at 0x8.
//! - an imemo's type is `(flags >> 12) & 0xf` (`imemo_cref` 1, `imemo_svar` 2, `imemo_ment`
//!   6, `imemo_iseq` 7) of a `T_IMEMO` (0x1a) object.
//! - `rb_callable_method_entry_t`: `def` at 0x10; `rb_method_definition_t`: the method type in
//!   the low 4 bits of its first word (`ISEQ` 0, `CFUNC` 1, `BMETHOD` 4), `body` at 0x08
//!   (`body.iseq.iseqptr`, `body.bmethod.proc`), `original_id` at 0x20.
//! - `rb_iseq_t`: `body` at 0x10; its body: `type` at 0x00 (`enum iseq_type`: `TOP` 0,
//!   `METHOD` 1, `BLOCK` 2, `CLASS` 3, `RESCUE` 4, `ENSURE` 5, `EVAL` 6, `MAIN` 7, `PLAIN` 8),
//!   `iseq_encoded` at 0x08, `parent_iseq` at [`BODY_PARENT_ISEQ`] (0xa8 on 3.1, 0xa0 on 3.3
//!   and 3.4). The line is `rb_iseq_line_no(iseq, pos)` (exported by libruby),
//!   with `pos` the pc's index less 1 (or 0), as `calc_lineno` does; with no pc, 0 for a
//!   top iseq and its first line otherwise. The type and `parent_iseq` were checked in
//!   Debian's 3.1.2 machine code (`prepare_iseq_build` stores the type at 0x00, then for a
//!   `METHOD` or `CLASS` iseq (`type & ~2 == 1`) itself as `local_iseq` at 0xb0 and its
//!   parent at 0xa8; `rb_iseq_new_eval` passes type 6; `rb_iseq_method_name` compares
//!   `local_iseq`'s type with 1) and in the debug information of our 3.3.8 and 3.4.5 builds
//!   (`ptype /o struct rb_iseq_constant_body`: `parent_iseq` at 160; `ISEQ_TYPE_EVAL` 6). A
//!   child iseq marks its parent (`rb_iseq_mark_and_move`, 3.3.8 `iseq.c`), so the parent of a
//!   live iseq is live. A block, class body, `rescue` or `ensure` has the iseq it is in as
//!   its parent (`NEW_CHILD_ISEQ`, 3.3.8 `compile.c`); a method has none (`NEW_ISEQ`); an
//!   eval's is the iseq of the binding it runs in (`eval_make_iseq`).
//! - a Proc's typed data (`rb_proc_t`) starts with its `rb_block`: the captured block's iseq at
//!   0x10, the block type at 0x18 (`block_type_iseq` 0).
//!
//! **Self-check.** [`check`] runs once, before any frame is named (`Profiler::FrameNames`
//! calls it from a bmethod that a `def` method calls, so that the stack holds a Ruby method, a
//! bmethod and C methods). It reads the current thread with [`read`] (bmethods left as
//! `rb_profile_frames` gives them) and requires the very frame objects and lines that
//! `rb_profile_frames` gives; the thread's `ec->thread_ptr` back to its `rb_thread_t`; a C
//! method's `original_id` naming it as `rb_profile_frame_method_name` does; a Ruby method's
//! `body.iseq.iseqptr` being the iseq its frame runs; and the bmethod's Proc running the
//! iseq of its frame; the C method's, the Ruby method's and the bmethod's frames having the
//! magic of their kind; and that block's parents (at [`BODY_PARENT_ISEQ`]) being iseqs of type
//! `CLASS` up to one of type `TOP` (the module bodies around `FrameNames`, in the file that
//! `require` loaded; the leafmost bmethod is the check's own). Only if all hold is [`read`]
//! used; otherwise the profiler names frames the weaker way (`stack_capture`'s module doc).
//! Each later read checks the thread's back pointer and bounds again, and a bmethod's Proc is
//! only followed to an iseq that is a live `imemo_iseq`.
//!
//! **Other threads.** `Thread#backtrace_locations` (Ruby 3.1 `vm_backtrace.c`,
//! `thread_backtrace_to_ary`) reads another thread's `th->ec` frames the same way with the
//! GVL held, which is what makes this sound: a thread that does not hold the GVL cannot push
//! or pop frames (its `cfp` only moves while it runs Ruby), and the thread's VM stack lives
//! until the thread ends, which the caller excludes by calling with the GVL held for a thread
//! that is alive (`Thread#status` not false or nil). A thread not started yet or finished has
//! no VM stack (`vm_stack` NULL, `rb_ec_clear_vm_stack`): it reads as no frames.
use std::sync::atomic::{AtomicU8, Ordering};

use rb_sys::VALUE;

use crate::vm::{EC_CFP_OFFSET as EC_CFP, EC_THREAD_PTR_OFFSET as EC_THREAD_PTR};
use crate::vm::{EC_VM_STACK_OFFSET as EC_VM_STACK, EC_VM_STACK_SIZE_OFFSET as EC_VM_STACK_SIZE};
const CFP_SIZE: usize = crate::vm::CFP_SIZE;
const CFP_PC: usize = 0x00;
const CFP_ISEQ: usize = 0x10;
const CFP_EP: usize = 0x20;
const FRAME_FLAG_BMETHOD: VALUE = 0x40;
const FRAME_MAGIC_MASK: VALUE = 0x7fff_0001;
const FRAME_MAGIC_METHOD: VALUE = 0x1111_0001;
const FRAME_MAGIC_BLOCK: VALUE = 0x2222_0001;
const FRAME_MAGIC_CFUNC: VALUE = 0x5555_0001;
const FRAME_MAGIC_EVAL: VALUE = 0x7777_0001;
const FRAME_FLAG_CFRAME: VALUE = 0x80;
const ENV_FLAG_LOCAL: VALUE = 0x2;
const T_MASK: usize = 0x1f;
const T_IMEMO: usize = 0x1a;
const T_DATA: usize = 0x0c;
const IMEMO_CREF: usize = 1;
const IMEMO_SVAR: usize = 2;
const IMEMO_MENT: usize = 6;
const IMEMO_ISEQ: usize = 7;
const SVAR_CREF_OR_ME: usize = 0x08;
const ME_DEF: usize = 0x10;
const DEF_BODY: usize = 0x08;
const DEF_ORIGINAL_ID: usize = 0x20;
const ISEQ_BODY: usize = 0x10;
const BODY_ISEQ_ENCODED: usize = 0x08;
/// `rb_iseq_constant_body::parent_iseq` (module doc): 3.1's `location.first_lineno` is a
/// VALUE (an `int` from 3.2), which makes `location` 8 bytes longer there.
const BODY_PARENT_ISEQ: usize = if cfg!(ruby_eq_3_1) { 0xa8 } else { 0xa0 };
/// `enum iseq_type` (module doc).
const ISEQ_TYPE_TOP: u32 = 0;
const ISEQ_TYPE_BLOCK: u32 = 2;
const ISEQ_TYPE_CLASS: u32 = 3;
const ISEQ_TYPE_RESCUE: u32 = 4;
const ISEQ_TYPE_ENSURE: u32 = 5;
const ISEQ_TYPE_EVAL: u32 = 6;
const ISEQ_TYPE_PLAIN: u32 = 8;
/// Deeper nesting of blocks than this in one scope is not looked through by [`in_eval`].
const MAX_NESTING: usize = 64;
const PROC_BLOCK_ISEQ: usize = 0x10;
const PROC_BLOCK_TYPE: usize = 0x18;

/// A method entry's type (`rb_method_type_t`, Ruby 3.1 `method.h`).
pub const METHOD_ISEQ: u32 = 0;
pub const METHOD_CFUNC: u32 = 1;
pub const METHOD_BMETHOD: u32 = 4;

extern "C" {
    /// Ruby 3.1 `iseq.c`: the line of the instruction at `pos`.
    fn rb_iseq_line_no(iseq: VALUE, pos: usize) -> std::os::raw::c_uint;
}

const UNCHECKED: u8 = 0;
/// The current thread's read matched `rb_profile_frames`; the other-thread check is running.
const CHECKING: u8 = 1;
const PASSED: u8 = 2;
const FAILED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNCHECKED);

/// Whether this reader is built for the Ruby at hand: the layouts below hold on 3.1, 3.3 and
/// 3.4 (module doc), with the frame size and thread layout of `vm`.
pub const BUILT: bool = crate::vm::THREAD_EC_OFFSET.is_some();

/// Whether [`read`] is in use (the self-check passed).
pub fn available() -> bool {
    matches!(STATE.load(Ordering::Acquire), CHECKING | PASSED)
}

/// Whether the self-check has come to an end (either way).
pub fn decided() -> bool {
    matches!(STATE.load(Ordering::Acquire), PASSED | FAILED)
}

/// Ends the self-check: `passed` if the other thread read the same as its Locations.
pub fn finish_check(passed: bool) {
    let next = if passed && STATE.load(Ordering::Acquire) == CHECKING { PASSED } else { FAILED };
    STATE.store(next, Ordering::Release);
}

fn is_heap(v: VALUE) -> bool {
    v != 0 && v & 7 == 0 && v != rb_sys::Qnil as VALUE && v != rb_sys::Qfalse as VALUE
}

/// # Safety
///
/// `v` is a live heap object (or a special constant); GVL held.
unsafe fn imemo_type(v: VALUE) -> Option<usize> {
    if !is_heap(v) {
        return None;
    }
    // SAFETY: a live heap object starts with its flags word (`struct RBasic`).
    let flags = unsafe { *(v as *const usize) };
    (flags & T_MASK == T_IMEMO).then_some((flags >> 12) & 0xf)
}

/// The type of method entry `me` (module doc).
///
/// # Safety
///
/// `me` is a live `imemo_ment`; GVL held.
pub unsafe fn method_type(me: VALUE) -> u32 {
    // SAFETY: a method entry's `def` is a valid definition for as long as the entry lives.
    unsafe {
        let def = *((me as usize + ME_DEF) as *const *const u32);
        *def & 0xf
    }
}

/// `def->body`'s first word: `body.iseq.iseqptr` or `body.bmethod.proc`.
///
/// # Safety
///
/// As [`method_type`].
unsafe fn method_body(me: VALUE) -> VALUE {
    // SAFETY: as in method_type; the union is at least one word.
    unsafe {
        let def = *((me as usize + ME_DEF) as *const usize);
        *((def + DEF_BODY) as *const VALUE)
    }
}

/// `def->original_id`, the method's name when it was defined.
///
/// # Safety
///
/// As [`method_type`].
pub unsafe fn original_id(me: VALUE) -> rb_sys::ID {
    // SAFETY: as in method_type.
    unsafe {
        let def = *((me as usize + ME_DEF) as *const usize);
        *((def + DEF_ORIGINAL_ID) as *const rb_sys::ID)
    }
}

/// The iseq a bmethod's Proc runs, if it is one (a Proc made from a Method or a Symbol is not).
///
/// # Safety
///
/// `me` is a live `imemo_ment` of type `BMETHOD`; GVL held; the layouts were checked.
pub unsafe fn bmethod_iseq(me: VALUE) -> Option<VALUE> {
    // SAFETY: a bmethod's body starts with its Proc, marked by the method entry.
    let proc = unsafe { method_body(me) };
    if !is_heap(proc) {
        return None;
    }
    // SAFETY: a live heap object; rb_obj_is_proc only reads its type.
    if unsafe { *(proc as *const usize) } & T_MASK != T_DATA
        || unsafe { rb_sys::rb_obj_is_proc(proc) } != rb_sys::Qtrue as VALUE
    {
        return None;
    }
    // SAFETY: a Proc's typed data is its rb_proc_t (module doc), alive with the Proc.
    let (iseq, kind) = unsafe {
        let data = rb_sys::RTYPEDDATA_GET_DATA(proc) as usize;
        (*((data + PROC_BLOCK_ISEQ) as *const VALUE), *((data + PROC_BLOCK_TYPE) as *const u32))
    };
    // SAFETY: only read if the block is an iseq block, whose code is a live iseq.
    (kind == 0 && unsafe { imemo_type(iseq) } == Some(IMEMO_ISEQ)).then_some(iseq)
}

/// The type and parent of `iseq` (module doc), if it is a live `imemo_iseq` with a body.
///
/// # Safety
///
/// `iseq` is a live object, 0 or a special constant; GVL held.
unsafe fn type_and_parent(iseq: VALUE) -> Option<(u32, VALUE)> {
    // SAFETY: the caller's contract.
    if unsafe { imemo_type(iseq) } != Some(IMEMO_ISEQ) {
        return None;
    }
    // SAFETY: a live iseq's body pointer (module doc).
    let body = unsafe { *((iseq as usize + ISEQ_BODY) as *const usize) };
    if body == 0 {
        return None;
    }
    // SAFETY: the body's `type` and `parent_iseq` fields (module doc).
    Some(unsafe { (*(body as *const u32), *((body + BODY_PARENT_ISEQ) as *const VALUE)) })
}

/// Whether `iseq` is code eval'd from a string outside any method that code defines: an
/// `ISEQ_TYPE_EVAL` iseq (`Kernel#eval`, `Binding#eval`, `instance_eval`/`module_eval` of a
/// String: `eval_make_iseq`, Ruby 3.1 `vm_eval.c`; `ERB#result` runs a template so), or a
/// block, `rescue`, `ensure` or `once` iseq whose nearest enclosing scope is one. A method
/// or class body defined inside eval'd code is its own scope, not eval'd code; the block of a
/// `define_method` inside it is one of these blocks, but [`read`] gives its frames the
/// bmethod's entry (found in the ep chain before any eval's frame), so that it is not named
/// as eval'd code. Only reads memory.
///
/// # Safety
///
/// `iseq` is a frame object read from a live stack and alive since (or 0 or a special
/// constant); GVL held; the layouts were checked.
pub unsafe fn in_eval(iseq: VALUE) -> bool {
    let mut iseq = iseq;
    for _ in 0..MAX_NESTING {
        // SAFETY: `iseq` is the frame object or, after a step, the parent of a live iseq,
        // which that iseq marks (module doc).
        match unsafe { type_and_parent(iseq) } {
            Some((ISEQ_TYPE_EVAL, _)) => return true,
            Some((
                ISEQ_TYPE_BLOCK | ISEQ_TYPE_RESCUE | ISEQ_TYPE_ENSURE | ISEQ_TYPE_PLAIN,
                parent,
            )) => iseq = parent,
            _ => return false,
        }
    }
    false
}

/// Whether `iseq` is a block whose parents are class or module bodies, up to a file's top
/// level (the self-check: `FrameNames.check_from_bmethod`'s block).
///
/// # Safety
///
/// As [`type_and_parent`].
unsafe fn block_in_class_bodies(iseq: VALUE) -> bool {
    // SAFETY: the caller's contract.
    let Some((ISEQ_TYPE_BLOCK, mut parent)) = (unsafe { type_and_parent(iseq) }) else {
        return false;
    };
    for bodies in 0..MAX_NESTING {
        // SAFETY: the parent of a live iseq is live (module doc).
        match unsafe { type_and_parent(parent) } {
            Some((ISEQ_TYPE_CLASS, next)) => parent = next,
            Some((ISEQ_TYPE_TOP, _)) => return bodies > 0,
            _ => return false,
        }
    }
    false
}

/// `check_method_entry` (Ruby 3.1 `vm_insnhelper.c`).
///
/// # Safety
///
/// `v` is an `ep[-2]` of a live frame; GVL held.
unsafe fn check_method_entry(v: VALUE, can_be_svar: bool) -> Option<VALUE> {
    // SAFETY: ep[-2] holds Qfalse or a live imemo (the frame marks it).
    match unsafe { imemo_type(v) }? {
        IMEMO_MENT => Some(v),
        IMEMO_CREF => None,
        // SAFETY: an svar's second word is its cref_or_me, a live value.
        IMEMO_SVAR if can_be_svar => unsafe {
            check_method_entry(*((v as usize + SVAR_CREF_OR_ME) as *const VALUE), false)
        },
        _ => None,
    }
}

/// `rb_vm_frame_method_entry` (Ruby 3.1 `vm_insnhelper.c`): walks the ep chain to the local
/// one. Also says whether an eval's frame (`VM_FRAME_MAGIC_EVAL` in an ep's flags) comes in
/// the chain before the method entry: the frame runs code eval'd from a string, in the
/// method's binding, not the method's own code (a method, or a `define_method` block, defined
/// inside eval'd code has its entry in its own ep, found first).
///
/// # Safety
///
/// `ep` is a live frame's ep; GVL held.
unsafe fn frame_method_entry(mut ep: *const VALUE) -> (Option<VALUE>, bool) {
    let mut eval = false;
    // A chain deeper than this is not one (the walk must end even on a bad read).
    for _ in 0..100_000 {
        // SAFETY: an ep points at its flags word, preceded by the specval and me/cref words.
        let (flags, me_cref, prev) = unsafe { (*ep, *ep.sub(2), *ep.sub(1)) };
        eval |= flags & FRAME_MAGIC_MASK == FRAME_MAGIC_EVAL;
        let local = flags & ENV_FLAG_LOCAL != 0;
        // SAFETY: ep[-2] of a live frame.
        if let Some(me) = unsafe { check_method_entry(me_cref, local) } {
            return (Some(me), eval);
        }
        if local {
            return (None, eval);
        }
        ep = (prev & !3) as *const VALUE;
        if ep.is_null() {
            return (None, eval);
        }
    }
    (None, eval)
}

/// `calc_lineno` (Ruby 3.1 `vm_backtrace.c`, module doc).
///
/// # Safety
///
/// `iseq` and `pc` are a live Ruby frame's; GVL held.
unsafe fn line_of(iseq: VALUE, pc: usize) -> i32 {
    // SAFETY: a live iseq has its body (module doc).
    let body = unsafe { *((iseq as usize + ISEQ_BODY) as *const usize) };
    if pc == 0 {
        // SAFETY: as above; the type is the body's first field.
        if unsafe { *(body as *const u32) } == 0 {
            return 0;
        }
        // SAFETY: a live iseq; returns its first line (a Fixnum).
        let first = unsafe { rb_sys::rb_profile_frame_first_lineno(iseq) };
        return (first as i64 >> 1) as i32;
    }
    // SAFETY: as above.
    let encoded = unsafe { *((body + BODY_ISEQ_ENCODED) as *const usize) };
    let pos = pc.wrapping_sub(encoded) / 8;
    // SAFETY: pos is the index of an instruction of `iseq` (the frame's pc is in it).
    unsafe { rb_iseq_line_no(iseq, pos.saturating_sub(1)) as i32 }
}

/// Which frame objects [`read`] stores (module doc).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// A bmethod's method entry for its frames, and the iseq of eval'd code's frames.
    Named,
    /// What `rb_profile_frames` stores: the block's iseq for a bmethod's frames, and the
    /// method entry of the binding's method for eval'd code's (the self-check).
    AsProfileFrames,
}

/// The execution context of `thread` (a Thread object), checked against its back pointer;
/// None if it has none.
///
/// # Safety
///
/// `thread` is a live Thread; GVL held; the layouts were checked (or are being).
pub unsafe fn thread_ec(thread: VALUE) -> Option<*const u8> {
    let thread_ec = crate::vm::THREAD_EC_OFFSET?;
    // SAFETY: a Thread is a typed data object whose data is its rb_thread_t.
    let th = unsafe { rb_sys::RTYPEDDATA_GET_DATA(thread) } as *const u8;
    if th.is_null() {
        return None;
    }
    // SAFETY: rb_thread_t's `self` and `ec` fields (module doc).
    let (own, ec) = unsafe {
        (
            *(th.add(crate::vm::THREAD_SELF_OFFSET) as *const VALUE),
            *(th.add(thread_ec) as *const *const u8),
        )
    };
    if own != thread || ec.is_null() {
        return None;
    }
    // SAFETY: ec points to the thread's execution context, whose thread_ptr is `th`.
    let back = unsafe { *(ec.add(EC_THREAD_PTR) as *const *const u8) };
    (back == th).then_some(ec)
}

/// Reads the frames of the execution context `ec` as `rb_profile_frames` does (module doc),
/// leaf first, into `frames` and `lines`; returns how many.
///
/// # Safety
///
/// `ec` comes from [`thread_ec`] for a live thread, with the GVL held since.
pub unsafe fn read(ec: *const u8, frames: &mut [VALUE], lines: &mut [i32], how: Read) -> usize {
    // SAFETY: the context's stack fields (module doc).
    let (stack, size, mut cfp) = unsafe {
        (
            *(ec.add(EC_VM_STACK) as *const usize),
            *(ec.add(EC_VM_STACK_SIZE) as *const usize),
            *(ec.add(EC_CFP) as *const usize),
        )
    };
    let mut end = stack.wrapping_add(size.wrapping_mul(8));
    if stack == 0 || cfp < stack || cfp > end {
        return 0; // not started, or finished (module doc)
    }
    let top = cfp;
    if crate::vm::PROFILE_FRAMES_SKIP_DUMMY_AND_PCLESS {
        end = end.saturating_sub(CFP_SIZE); // the dummy frame at the bottom (3.3+)
    }
    let limit = frames.len().min(lines.len());
    let mut n = 0;
    while n < limit && cfp + CFP_SIZE <= end {
        // SAFETY: cfp is a control frame of the live stack, between its top and the end.
        let (pc, iseq, ep) = unsafe {
            (
                *((cfp + CFP_PC) as *const usize),
                *((cfp + CFP_ISEQ) as *const VALUE),
                *((cfp + CFP_EP) as *const *const VALUE),
            )
        };
        // SAFETY: a frame's ep points at its flags word.
        let flags = unsafe { *ep };
        // SAFETY: the live frame's ep.
        let (me, eval) = unsafe { frame_method_entry(ep) };
        // SAFETY: `me` is a live method entry (the frame marks it).
        let kind = me.map(|me| unsafe { method_type(me) });
        let pcless = crate::vm::PROFILE_FRAMES_SKIP_DUMMY_AND_PCLESS && pc == 0;
        if flags & FRAME_FLAG_CFRAME == 0 && !pcless {
            frames[n] = match (me, kind) {
                (Some(_), _) if how == Read::Named && eval => iseq,
                (Some(me), Some(METHOD_ISEQ)) => me,
                (Some(me), Some(METHOD_BMETHOD)) if how == Read::Named => me,
                _ => iseq,
            };
            // SAFETY: on 3.3+, a frame's `jit_return` word (vm::CFP_JIT_RETURN_OFFSET).
            let jitted = crate::vm::PROFILE_FRAMES_SKIP_DUMMY_AND_PCLESS
                && cfp == top
                && unsafe { *((cfp + crate::vm::CFP_JIT_RETURN_OFFSET) as *const usize) } != 0;
            // SAFETY: a Ruby frame's iseq and pc.
            lines[n] = if jitted { 0 } else { unsafe { line_of(iseq, pc) } };
            n += 1;
        } else if let (Some(me), Some(METHOD_CFUNC)) = (me, kind) {
            frames[n] = me;
            lines[n] = 0;
            n += 1;
        }
        cfp += CFP_SIZE;
    }
    n
}

/// The self-check (module doc), on the current thread: a `def` method calling a bmethod
/// calling this C method. Returns whether it passed; if so, [`read`] may be used while the
/// other-thread part runs ([`finish_check`] ends it).
///
/// # Safety
///
/// GVL held; called from a C method (its frame is on the stack).
pub unsafe fn check() -> bool {
    if !BUILT || decided() {
        return available();
    }
    let passed = {
        // SAFETY: GVL held; the checks below only read what the layouts say is there, each
        // after the one that makes it valid.
        unsafe { check_current() }
    };
    STATE.store(if passed { CHECKING } else { FAILED }, Ordering::Release);
    passed
}

/// # Safety
///
/// As [`check`].
unsafe fn check_current() -> bool {
    const DEPTH: usize = 512;
    let (mut ours, mut our_lines) = (vec![0; DEPTH], vec![0; DEPTH]);
    let (mut theirs, mut their_lines) = (vec![0; DEPTH], vec![0; DEPTH]);
    // SAFETY: GVL held.
    let thread = unsafe { rb_sys::rb_thread_current() };
    // SAFETY: the running thread is alive; GVL held.
    let Some(ec) = (unsafe { thread_ec(thread) }) else { return false };
    // SAFETY: as above.
    let n = unsafe { read(ec, &mut ours, &mut our_lines, Read::AsProfileFrames) };
    // SAFETY: both buffers hold DEPTH entries; GVL held.
    let m = unsafe {
        rb_sys::rb_profile_frames(0, DEPTH as i32, theirs.as_mut_ptr(), their_lines.as_mut_ptr())
    };
    if n == 0 || n == DEPTH || m < 0 || n != m as usize {
        return false;
    }
    if ours[..n] != theirs[..n] || our_lines[..n] != their_lines[..n] {
        return false;
    }
    // The frames are the same objects: the walk is right. Now the method definitions.
    let (mut cfunc, mut iseq_method, mut bmethod) = (false, false, None);
    // SAFETY: stack fields of the current context, checked by the read above.
    let mut cfp = unsafe { *(ec.add(EC_CFP) as *const usize) };
    for _ in 0..n {
        // SAFETY: walking the same frames again (still live: nothing returned meanwhile);
        // every method entry is live, marked by its frame.
        unsafe {
            let iseq = *((cfp + CFP_ISEQ) as *const VALUE);
            let ep = *((cfp + CFP_EP) as *const *const VALUE);
            let flags = *ep;
            // Each kind of frame has its magic in its flags (`eval` is told by it).
            let magic = flags & FRAME_MAGIC_MASK;
            if let (Some(me), _) = frame_method_entry(ep) {
                match method_type(me) {
                    METHOD_CFUNC if flags & FRAME_FLAG_CFRAME != 0 => {
                        let name = rb_sys::rb_id2str(original_id(me));
                        if name == 0
                            || name != rb_sys::rb_profile_frame_method_name(me)
                            || magic != FRAME_MAGIC_CFUNC
                        {
                            return false;
                        }
                        cfunc = true;
                    }
                    METHOD_ISEQ if flags & FRAME_FLAG_CFRAME == 0 && method_body(me) == iseq => {
                        if magic != FRAME_MAGIC_METHOD {
                            return false;
                        }
                        iseq_method = true;
                    }
                    // The leafmost: `FrameNames.check_from_bmethod`, whose block the
                    // module body defines (a bmethod further down is the program's).
                    METHOD_BMETHOD if flags & FRAME_FLAG_BMETHOD != 0 && bmethod.is_none() => {
                        if magic != FRAME_MAGIC_BLOCK {
                            return false;
                        }
                        bmethod = Some((me, iseq));
                    }
                    _ => {}
                }
            }
        }
        cfp += CFP_SIZE;
    }
    // The bmethod's Proc is followed only once a Ruby method's body was found where the
    // layout says (the Proc is in the same union).
    let Some((me, iseq)) = bmethod.filter(|_| cfunc && iseq_method) else { return false };
    // SAFETY: a live bmethod entry (its frame is still on the stack); the layout was checked.
    // The parents are read only once the Proc's iseq was found where the layout says.
    unsafe { bmethod_iseq(me) == Some(iseq) && block_in_class_bodies(iseq) }
}
