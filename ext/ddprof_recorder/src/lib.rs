//! The Ruby binding of ddprof_recorder: argument conversion, GVL handling and Ruby objects
//! around the pure-Rust core in `crates/core`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod directory_exporter;
mod labels;
mod memory;
mod recorder;
mod ruby_api;
mod sampling;
mod views;
mod vm;

use magnus::{Error, Ruby};

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    let module = ruby.define_module("DdprofRecorder")?;
    recorder::stack_recorder::init(ruby, module)?;
    views::pprof_views::init(ruby, module)?;
    sampling::init(ruby, module)?;
    memory::init(ruby)?;
    ruby_api::profiler::init(ruby, module)?;
    labels::init(ruby, module)?;
    directory_exporter::init(ruby, module)
}
