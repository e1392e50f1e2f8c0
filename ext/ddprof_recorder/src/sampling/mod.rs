//! The CPU and wall sampler of `DdprofRecorder::Profiler`: the native half of
//! `lib/ddprof_recorder/profiler/thread_sampler.rb`.
//!
//! - [`trigger`] (a plain native thread, [`native_thread`]) ticks `hz` times a second and asks
//!   Ruby to run [`job`], the sampling job, on the thread that holds the GVL;
//! - [`signal_sampler`] reads a thread's stack at its CPU tick, in a signal handler
//!   (and [`gc_ticks`] at the end of the GC step a tick came in);
//! - [`stack_capture`] reads and names stacks without making Ruby objects;
//! - [`thread_cpu`], [`native_clock`] and [`thread_end`] are the clocks: each thread's CPU,
//!   and the CPU of the threads that end between two passes;
//! - [`gvl_events`] measures GVL waits (Ruby 3.3+);
//! - [`interrupt_mask`] keeps `Thread#raise` out of the job's Ruby handler;
//! - [`random`] is the random generator (the trigger's, the handler's draw, and `memory`'s).

pub mod gc_ticks;
pub mod gvl_events;
pub mod interrupt_mask;
pub mod job;
pub mod native_clock;
pub mod native_thread;
pub mod random;
pub mod signal_sampler;
pub mod stack_capture;
pub mod thread_cpu;
pub mod thread_end;
pub mod trigger;
