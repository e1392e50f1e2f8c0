//! The Ruby binding of ddprof_recorder: argument conversion, GVL handling and Ruby objects
//! around the pure-Rust core in `crates/core`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod allocation_sampler;
mod convert;
mod duty_cycle;
mod errors;
mod gc_events;
mod gc_ticks;
mod gvl_events;
mod heap_tracker;
mod internal_hook;
mod interrupt_mask;
mod native_clock;
mod native_thread;
mod nogvl;
mod postponed;
mod pprof_views;
mod sampling_job;
mod signal_sampler;
mod stack_capture;
mod stack_recorder;
mod thread_cpu;
mod thread_end;
mod trigger;
mod vm;
mod vm_frames;

use magnus::{Error, Ruby};

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    let module = ruby.define_module("DdprofRecorder")?;
    stack_recorder::init(ruby, module)?;
    pprof_views::init(ruby, module)?;
    thread_cpu::init(ruby, module)?;
    sampling_job::init(ruby, module)?;
    thread_end::init(ruby, module)?;
    native_clock::init(ruby, module)?;
    stack_capture::init(ruby, module)?;
    allocation_sampler::init(ruby, module)?;
    heap_tracker::init(ruby, module)?;
    gc_events::init(ruby, module)?;
    gc_ticks::init();
    gvl_events::init(ruby, module)
}
