//! A native TracePoint on Ruby's internal events (`RUBY_INTERNAL_EVENT_*`, Ruby 3.1
//! `ruby/debug.h`, `vm_trace.c`): the NEWOBJ, FREEOBJ and GC hooks of `allocations`,
//! `heap` and `gc_events`. Internal events cannot be hooked from Ruby; a TracePoint
//! made by `rb_tracepoint_new` with a C function can. The TracePoint object is made on first
//! use and kept for the process's life in a static registered as a GC root
//! (`rb_gc_register_address`, which also pins it). Everything here runs with the GVL held.
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A hook function: it must never unwind, and, called from inside the allocator or the GC,
/// never allocate or call Ruby.
pub type HookFn = unsafe extern "C" fn(rb_sys::VALUE, *mut c_void);

pub struct InternalHook {
    /// The TracePoint object, or Qnil before the first `enable`.
    tracepoint: AtomicUsize,
    /// Whether it is on: enabling a TracePoint twice would add its hook twice (Ruby 3.1
    /// `rb_tracepoint_enable` does not check), so each call is made only on a change.
    on: AtomicBool,
    events: rb_sys::rb_event_flag_t,
    func: HookFn,
}

impl InternalHook {
    pub const fn new(events: rb_sys::rb_event_flag_t, func: HookFn) -> Self {
        Self {
            tracepoint: AtomicUsize::new(rb_sys::Qnil as usize),
            on: AtomicBool::new(false),
            events,
            func,
        }
    }

    /// Makes the TracePoint slot a GC root. Once, at load, with the GVL.
    pub fn register(&'static self) {
        // SAFETY: a static, valid for the process's life; an AtomicUsize has a VALUE's layout.
        unsafe { rb_sys::rb_gc_register_address(self.tracepoint.as_ptr().cast()) };
    }

    /// Turns the hook on, if it is off (GVL held).
    pub fn enable(&self) {
        if self.on.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut tracepoint = self.tracepoint.load(Ordering::Acquire) as rb_sys::VALUE;
        if tracepoint == rb_sys::Qnil as rb_sys::VALUE {
            // SAFETY: GVL held; `func` never unwinds (see [`HookFn`]); no data pointer.
            tracepoint = unsafe {
                rb_sys::rb_tracepoint_new(
                    rb_sys::Qnil as rb_sys::VALUE,
                    self.events,
                    Some(self.func),
                    std::ptr::null_mut(),
                )
            };
            self.tracepoint.store(tracepoint as usize, Ordering::Release);
        }
        // SAFETY: a TracePoint object kept by its GC root; GVL held.
        unsafe { rb_sys::rb_tracepoint_enable(tracepoint) };
    }

    /// Whether it is on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Turns the hook off, if it is on (GVL held).
    pub fn disable(&self) {
        if !self.on.swap(false, Ordering::AcqRel) {
            return;
        }
        let tracepoint = self.tracepoint.load(Ordering::Acquire) as rb_sys::VALUE;
        if tracepoint != rb_sys::Qnil as rb_sys::VALUE {
            // SAFETY: a TracePoint made by `rb_tracepoint_new`, kept by its GC root; GVL held.
            unsafe { rb_sys::rb_tracepoint_disable(tracepoint) };
        }
    }
}
