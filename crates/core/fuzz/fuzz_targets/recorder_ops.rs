//! libFuzzer target: recorder operation sequences from arbitrary bytes, checked against a
//! model (see `../harness.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
