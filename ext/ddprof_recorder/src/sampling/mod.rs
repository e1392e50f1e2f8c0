//! The CPU and wall sampler of `DdprofRecorder::Profiler`: the native half of
//! `lib/ddprof_recorder/profiler/thread_sampler.rb`.
//!
//! - [`trigger`] (a plain native thread, [`native_thread`]) ticks `hz` times a second and asks
//!   Ruby to run [`job`], the sampling job, on the thread that holds the GVL;
//! - [`signal_sampler`] reads a thread's stack at its CPU tick, in a signal handler
//!   (and its `gc_ticks` at the end of the GC step a tick came in), and asks for
//!   [`signal_job`], which hands those samples to the profiler;
//! - [`stack_capture`] reads and names stacks without making Ruby objects;
//! - [`clocks`] are the clocks: the monotonic one, each thread's CPU, the GVL hook's counter,
//!   and `Profiler::NativeClock`; [`thread_end`] keeps the CPU of the threads that end
//!   between two passes;
//! - [`gvl_events`] measures GVL waits (Ruby 3.3+);
//! - [`interrupt_mask`] keeps `Thread#raise` out of the job's Ruby handler;
//! - [`random`] is the random generator (the trigger's, the handler's draw, and `memory`'s);
//! - [`ruby_handler`] is the profiler's Ruby handler, which both jobs call, and what they share;
//! - [`stats`] gathers what they all counted for `Profiler#stats`.
//!
//! The modules use one another one way, from the signal to the pprof: [`clocks`] and
//! [`random`] at the bottom; the capture ([`signal_sampler`]: the handler and its buffers);
//! the schedule ([`trigger`], and the timers in `signal_sampler/`), which uses the capture;
//! the charge ([`ruby_handler`], then [`signal_job`], then [`job`], which starts and stops
//! them all), which uses both. [`thread_end`] uses only the clocks; [`stats`] reads them all.

pub mod clocks;
pub mod gvl_events;
pub mod interrupt_mask;
pub mod job;
pub mod native_thread;
pub mod random;
pub mod ruby_handler;
pub mod signal_job;
pub mod signal_sampler;
pub mod stack_capture;
pub mod stats;
pub mod thread_end;
pub mod trigger;

use magnus::{Error, RModule, Ruby};

/// Registers the sampler's GC roots, postponed jobs and end procs, and `Profiler::SignalSlotsRoot`
/// (its native methods and constants are `ruby_api::profiler`'s). At load.
pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    job::init();
    signal_job::init(ruby, module)?;
    thread_end::init(ruby)?;
    stack_capture::init(ruby)?;
    signal_sampler::gc_ticks::init();
    gvl_events::init();
    Ok(())
}
