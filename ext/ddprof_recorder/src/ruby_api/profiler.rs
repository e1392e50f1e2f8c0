//! The native face of `DdprofRecorder::Profiler` (lib/ddprof_recorder/profiler.rb), in one
//! place: every `Profiler._native_*` method, the constants the Ruby side reads, and the module
//! functions of `Profiler::NativeClock`. The functions stay next to what they do (in
//! `sampling/` and `memory/`, each with its doc); this file only names them, with their
//! arities. The modules' own `init`s register their GC roots, postponed jobs and end procs.
use magnus::{function, prelude::*, Error, RModule, Ruby};

use crate::memory::{allocations, gc_events, heap};
use crate::sampling::clocks::{self, thread_cpu};
use crate::sampling::{
    gvl_events, job, signal_job, signal_sampler, stack_capture, stats, thread_end, trigger,
};
use crate::vm;

/// Defines `Profiler`'s native methods and constants, and `Profiler::NativeClock`. At load.
pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Profiler", ruby.class_object())?;

    // Sampling: start and stop (`sampling::job`), and the CPU clocks the Ruby side reads.
    class.define_singleton_method(
        "_native_sampling_start",
        function!(job::native_sampling_start, 7),
    )?;
    class.define_singleton_method(
        "_native_sampling_stop",
        function!(job::native_sampling_stop, 1),
    )?;
    class.define_singleton_method(
        "_native_interrupt_deferral_checked?",
        function!(job::native_interrupt_deferral_checked, 0),
    )?;
    class.const_set("MAX_HZ", job::MAX_HZ)?;
    class.const_set("JOBLESS_TICKS", trigger::JOBLESS_TICKS)?;
    class.define_singleton_method(
        "_native_current_thread_cpu_time_ns",
        function!(thread_cpu::native_current_thread_cpu_time_ns, 0),
    )?;
    class.define_singleton_method("_native_task_ids", function!(job::native_task_ids, 0))?;
    class.define_singleton_method(
        "_native_thread_cpu_time_ns",
        function!(thread_cpu::native_thread_cpu_time_ns, 1),
    )?;

    // The signal sampler: arming threads, its samples, exec and our signal (`sampling::signal_job`).
    class.define_singleton_method(
        "_native_signal_arm",
        function!(signal_job::native_signal_arm, 1),
    )?;
    class.define_singleton_method(
        "_native_take_signal_samples",
        function!(signal_job::native_take_signal_samples, 0),
    )?;
    class.define_singleton_method(
        "_native_signal_disarm",
        function!(signal_job::native_signal_disarm, 1),
    )?;
    class.define_singleton_method(
        "_native_signal_masked",
        function!(signal_job::native_signal_masked, 0),
    )?;
    class.define_singleton_method(
        "_native_thread_holds_gvl",
        function!(signal_job::native_thread_holds_gvl, 1),
    )?;
    class.define_singleton_method(
        "_native_signal_read_at_jobs",
        function!(signal_job::native_signal_read_at_jobs, 0),
    )?;
    class.define_singleton_method(
        "_native_handler_can_read_stacks?",
        function!(signal_job::native_handler_can_read_stacks, 0),
    )?;
    class.define_singleton_method(
        "_native_forget_thread_stacks",
        function!(signal_job::native_forget_thread_stacks, 1),
    )?;
    class.define_singleton_method(
        "_native_prepare_exec",
        function!(signal_job::native_prepare_exec, 0),
    )?;
    class.define_singleton_method(
        "_native_resume_after_exec",
        function!(signal_job::native_resume_after_exec, 0),
    )?;
    class.define_singleton_method(
        "_native_keep_signal",
        function!(signal_job::native_keep_signal, 1),
    )?;
    class.define_singleton_method(
        "_native_refuse_perf_events",
        function!(signal_job::native_refuse_perf_events, 1),
    )?;
    // The most threads armed at once (`signal_sampler::slots`).
    class.const_set("SIGNAL_SLOTS", signal_sampler::MAX_SLOTS)?;
    // Whether the handler reads stacks with YJIT on, on this Ruby (see `vm`).
    class.const_set("HANDLER_READS_UNDER_YJIT", vm::HANDLER_READS_UNDER_YJIT)?;
    // Whether a tick inside the GC is read at the GC step's end on this Ruby (see `gc_ticks`).
    class.const_set("GC_TICKS_READ", vm::GC_EXIT_HOOK_KEEPS_ALLOCATION_FAST)?;

    // What the sampler counted (`sampling::stats`).
    class.define_singleton_method(
        "_native_sampling_stats",
        function!(stats::native_sampling_stats, 0),
    )?;

    // Stacks read and named natively (`sampling::stack_capture`).
    class.define_singleton_method(
        "_native_capture_stack",
        function!(stack_capture::native_capture_stack, 1),
    )?;
    class.define_singleton_method(
        "_native_thread_frames",
        function!(stack_capture::native_thread_frames, 1),
    )?;
    class.define_singleton_method(
        "_native_capture_thread_stack",
        function!(stack_capture::native_capture_thread_stack, 2),
    )?;
    class.define_singleton_method(
        "_native_forget_stack",
        function!(stack_capture::native_forget_stack, 1),
    )?;
    class.define_singleton_method(
        "_native_check_frames",
        function!(stack_capture::native_check_frames, 1),
    )?;
    class.define_singleton_method(
        "_native_frame_names_checked",
        function!(stack_capture::native_frame_names_checked, 1),
    )?;
    class.define_singleton_method(
        "_native_qualified_names?",
        function!(stack_capture::native_qualified, 0),
    )?;
    class.define_singleton_method(
        "_native_frame_reader?",
        function!(stack_capture::native_frame_reader, 0),
    )?;
    class.define_singleton_method(
        "_native_frame_name",
        function!(stack_capture::native_frame_name, 2),
    )?;

    // GVL waits, Ruby 3.3+ (`sampling::gvl_events`).
    class.const_set("GVL_EVENTS", gvl_events::AVAILABLE)?;
    class.define_singleton_method("_native_gvl_start", function!(gvl_events::native_start, 0))?;
    class.define_singleton_method("_native_gvl_stop", function!(gvl_events::native_stop, 0))?;
    class.define_singleton_method("_native_gvl_take", function!(gvl_events::native_take, 1))?;
    class
        .define_singleton_method("_native_gvl_waiting", function!(gvl_events::native_waiting, 1))?;
    class.define_singleton_method(
        "_native_gvl_dispatch_probe",
        function!(gvl_events::native_dispatch_probe, 1),
    )?;

    // Allocations (`memory::allocations`).
    class.define_singleton_method(
        "_native_allocations_start",
        function!(allocations::native_start, 5),
    )?;
    class.define_singleton_method(
        "_native_allocations_stop",
        function!(allocations::native_stop, 0),
    )?;
    class.define_singleton_method(
        "_native_own_allocations",
        function!(allocations::native_own, 1),
    )?;
    class.define_singleton_method(
        "_native_allocations_stats",
        function!(allocations::native_stats, 0),
    )?;
    class.const_set("ALLOCATION_KEY", allocations::ALLOCATION_KEY)?;
    class.const_set("MAX_ALLOCATION_INTERVAL", allocations::MAX_INTERVAL)?;

    // The live heap (`memory::heap`).
    class.define_singleton_method("_native_heap_live", function!(heap::native_live, 0))?;
    class.define_singleton_method("_native_heap_stop", function!(heap::native_stop, 0))?;
    class.const_set("MAX_HEAP_TRACKED", heap::MAX_TRACKED)?;

    // The GC's time (`memory::gc_events`).
    class.define_singleton_method("_native_gc_start", function!(gc_events::native_start, 0))?;
    class.define_singleton_method("_native_gc_stop", function!(gc_events::native_stop, 0))?;
    class.define_singleton_method("_native_take_gc", function!(gc_events::native_take, 1))?;
    class.define_singleton_method("_native_gc_lost_ns", function!(gc_events::native_lost_ns, 0))?;

    // `Profiler::NativeClock`: the clocks of `ThreadSampler` (its `Clock`) as module functions,
    // each reading one call of a C function with no Ruby method in between (the sampling job
    // reads four of them each time it runs, mostly with cold caches, where a Ruby method that
    // only forwards adds cache misses of its own). The same Rust functions as the
    // `_native_*` ones; fake clocks in the specs answer the same six names.
    let clock = class.define_module("NativeClock")?;
    // `now_ns`: the monotonic clock, in ns.
    clock.define_singleton_method("now_ns", function!(clocks::native_now_ns, 0))?;
    // `thread_cpu_ns(tid)`: thread `tid`'s CPU clock, or nil.
    clock.define_singleton_method(
        "thread_cpu_ns",
        function!(thread_cpu::native_thread_cpu_time_ns, 1),
    )?;
    // `current_cpu_ns`: the calling thread's CPU clock.
    clock.define_singleton_method(
        "current_cpu_ns",
        function!(thread_cpu::native_current_thread_cpu_time_ns, 0),
    )?;
    // `moved(tids, seen)`: the indices whose thread's CPU clock does not read `seen[i]`.
    clock.define_singleton_method("moved", function!(thread_cpu::native_moved_threads, 2))?;
    // `thread_ends`: nil, or what the thread-end hook and the exit watches queued.
    clock.define_singleton_method(
        "thread_ends",
        function!(thread_end::native_take_thread_ends, 0),
    )?;
    // `threads_begun`: how many threads the thread-event hook saw begin, or nil while it is off.
    clock
        .define_singleton_method("threads_begun", function!(thread_end::native_threads_begun, 0))?;
    Ok(())
}
