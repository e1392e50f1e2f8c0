//! The fuzz harness (`fuzz/harness.rs`) on stable Rust, in `cargo test`:
//! - every input kept in `fuzz/regressions/` (past crashes of the libFuzzer target) is
//!   replayed;
//! - a deterministic pseudo-random driver feeds the same harness, for a fixed number of inputs
//!   by default, or for `FUZZ_SECONDS` seconds (`rake fuzz` uses it where libFuzzer cannot
//!   run). `FUZZ_SEED` picks another sequence, `FUZZ_ITERATIONS` another count; a failure keeps
//!   the input in `fuzz/regressions/` and names it.
#[path = "../fuzz/harness.rs"]
#[allow(dead_code)]
mod harness;

mod fuzz_driver;

#[test]
fn replays_every_kept_fuzz_input() {
    let replayed = fuzz_driver::replay("fuzz/regressions", |data| {
        harness::run(data);
    });
    eprintln!("replayed {replayed} fuzz regression inputs");
}

#[test]
fn pseudo_random_inputs_hold_every_property() {
    let mut total = harness::Summary::default();
    let (ran, seed) = fuzz_driver::pseudo_random(4, 1_500, 1024, "fuzz/regressions", |data| {
        let s = harness::run(data);
        total.samples_recorded += s.samples_recorded;
        total.samples_rejected += s.samples_rejected;
        total.samples_dropped += s.samples_dropped;
        total.endpoints_dropped += s.endpoints_dropped;
        total.timestamps_dropped += s.timestamps_dropped;
        total.timed_samples += s.timed_samples;
        total.windows_checked += s.windows_checked;
    });
    eprintln!("pseudo-random fuzz driver: {ran} inputs, seed {seed}: {total:?}");
}
