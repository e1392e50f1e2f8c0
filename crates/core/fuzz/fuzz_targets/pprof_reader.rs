//! libFuzzer target: the views' pprof reader on untrusted bytes, raw or as the recipe of a
//! profile checked against a model (see `../pprof_harness.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../pprof_harness.rs"]
mod pprof_harness;

fuzz_target!(|data: &[u8]| {
    pprof_harness::run(data);
});
