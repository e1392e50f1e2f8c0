//! The pprof reader fuzz harness (`fuzz/pprof_harness.rs`) on stable Rust, in `cargo test`:
//! every input kept in `fuzz/pprof_regressions/` and every seed of
//! `fuzz/seeds/pprof_reader/` is replayed, and a deterministic pseudo-random driver feeds the
//! harness a fixed number of inputs, or for `FUZZ_SECONDS` seconds (`rake fuzz` uses it where
//! libFuzzer cannot run). `FUZZ_SEED` picks another sequence, `FUZZ_ITERATIONS` another count; a
//! failure keeps the input in `fuzz/pprof_regressions/` and names it.
#[path = "../fuzz/pprof_harness.rs"]
mod pprof_harness;

mod fuzz_driver;

use std::path::Path;

#[test]
fn replays_every_kept_input_and_seed() {
    let kept = fuzz_driver::replay("fuzz/pprof_regressions", |data| {
        pprof_harness::run(data);
    });
    let seeds = fuzz_driver::replay("fuzz/seeds/pprof_reader", |data| {
        pprof_harness::run(data);
    });
    assert!(seeds > 0, "the seed corpus is in fuzz/seeds/pprof_reader");
    eprintln!("replayed {kept} kept inputs and {seeds} seeds");
}

/// The seeds are what they say: pprofs the reader reads (raw mode: a leading 0 byte).
#[test]
fn seeds_are_read_in_full() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/pprof_reader");
    for entry in std::fs::read_dir(dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        if data.first() == Some(&0) {
            assert!(pprof_harness::run(&data).read > 0);
        }
    }
}

#[test]
fn pseudo_random_inputs_hold_every_property() {
    let mut total = pprof_harness::Outcome::default();
    let (ran, seed) =
        fuzz_driver::pseudo_random(10, 3_000, 512, "fuzz/pprof_regressions", |data| {
            total += pprof_harness::run(data);
        });
    eprintln!("pseudo-random pprof fuzz driver: {ran} inputs, seed {seed}: {total:?}");
}
