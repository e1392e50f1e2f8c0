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

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

#[test]
fn replays_every_kept_fuzz_input() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut replayed = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.extension().is_some_and(|ext| ext == "md") {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        if catch_unwind(|| harness::run(&data)).is_err() {
            panic!("fuzz regression {} fails again", path.display());
        }
        replayed += 1;
    }
    eprintln!("replayed {replayed} fuzz regression inputs");
}

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn pseudo_random_inputs_hold_every_property() {
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let seconds: Option<u64> = std::env::var("FUZZ_SECONDS").ok().and_then(|s| s.parse().ok());
    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let iterations = match (deadline, std::env::var("FUZZ_ITERATIONS")) {
        (Some(_), _) => u64::MAX,
        (None, Ok(n)) => n.parse().unwrap(),
        (None, Err(_)) => 1_500,
    };
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut data = Vec::new();
    let mut ran = 0u64;
    let mut total = harness::Summary::default();
    for index in 0..iterations {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let len = (rng.next() % 1024) as usize;
        data.clear();
        data.extend((0..len).map(|_| rng.next() as u8));
        let outcome = catch_unwind(AssertUnwindSafe(|| harness::run(&data)));
        if let Ok(s) = outcome {
            total.samples_recorded += s.samples_recorded;
            total.samples_rejected += s.samples_rejected;
            total.samples_dropped += s.samples_dropped;
            total.endpoints_dropped += s.endpoints_dropped;
            total.windows_checked += s.windows_checked;
        } else {
            let kept = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("fuzz/regressions/prng-seed{seed}-input{index}"));
            std::fs::write(&kept, &data).unwrap();
            panic!("input {index} of seed {seed} failed; kept as {}", kept.display());
        }
        ran += 1;
    }
    eprintln!("pseudo-random fuzz driver: {ran} inputs, seed {seed}: {total:?}");
}
