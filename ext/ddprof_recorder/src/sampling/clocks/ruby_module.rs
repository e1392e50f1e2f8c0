//! The clocks of `DdprofRecorder::Profiler::ThreadSampler` (its `Clock`), as the module
//! functions of `DdprofRecorder::Profiler::NativeClock`: each reading is one call of a C
//! function, with no Ruby method in between. The sampling job reads four of them each time
//! it runs, mostly with cold caches (the program ran for a period since), where a Ruby
//! method that only forwards to the native one adds cache misses of its own.
//!
//! The readings are the ones the `Profiler._native_*` functions give (the same Rust
//! functions): this file only names them as the sampler's clock. Fake clocks in the specs
//! answer the same six names.
use magnus::{function, prelude::*, Error, RModule, Ruby};

use crate::recorder::errors::entry;

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let profiler = module.define_class("Profiler", ruby.class_object())?;
    let clock = profiler.define_module("NativeClock")?;
    // `now_ns`: the monotonic clock, in ns.
    clock.define_singleton_method("now_ns", function!(now_ns, 0))?;
    // `thread_cpu_ns(tid)`: thread `tid`'s CPU clock, or nil.
    clock.define_singleton_method(
        "thread_cpu_ns",
        function!(crate::sampling::clocks::thread_cpu::native_thread_cpu_time_ns, 1),
    )?;
    // `current_cpu_ns`: the calling thread's CPU clock.
    clock.define_singleton_method(
        "current_cpu_ns",
        function!(crate::sampling::clocks::thread_cpu::native_current_thread_cpu_time_ns, 0),
    )?;
    // `moved(tids, seen)`: the indices whose thread's CPU clock does not read `seen[i]`.
    clock.define_singleton_method(
        "moved",
        function!(crate::sampling::clocks::thread_cpu::native_moved_threads, 2),
    )?;
    // `thread_ends`: nil, or what the thread-end hook and the exit watches queued.
    clock.define_singleton_method(
        "thread_ends",
        function!(crate::sampling::thread_end::native_take_thread_ends, 0),
    )?;
    // `threads_begun`: how many threads the thread-event hook saw begin, or nil while it is off.
    clock.define_singleton_method(
        "threads_begun",
        function!(crate::sampling::thread_end::native_threads_begun, 0),
    )?;
    Ok(())
}

fn now_ns(ruby: &Ruby) -> Result<i64, Error> {
    entry(ruby, || Ok(crate::sampling::clocks::monotonic_ns()))
}
