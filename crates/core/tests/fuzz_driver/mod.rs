//! What the stable-Rust drivers of the fuzz harnesses share (`tests/fuzz_regressions.rs` for
//! `fuzz/harness.rs`, `tests/pprof_reader_fuzz.rs` for `fuzz/pprof_harness.rs`): replaying the
//! inputs kept in a folder, and a deterministic pseudo-random driver.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs `run` on every file of `dir` (relative to the crate; a missing folder has none) but
/// its README.md, in name order, failing the test with the file's name if one panics. Returns
/// how many ran.
pub fn replay(dir: &str, run: impl Fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
    let mut paths: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
    paths.retain(|path| path.extension().is_none_or(|ext| ext != "md"));
    paths.sort();
    for path in &paths {
        let data = std::fs::read(path).unwrap();
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            panic!("fuzz input {} fails again", path.display());
        }
    }
    paths.len()
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

/// Feeds `run` inputs of fewer than `max_len` pseudo-random bytes: `iterations` of them, or
/// `FUZZ_ITERATIONS`, or as many as `FUZZ_SECONDS` allow; `FUZZ_SEED` picks another sequence
/// than `seed`'s. An input that panics is written to `keep_dir` (relative to the crate) and the
/// test fails naming it. Returns the inputs run and the seed.
pub fn pseudo_random(
    seed: u64,
    iterations: u64,
    max_len: u64,
    keep_dir: &str,
    mut run: impl FnMut(&[u8]),
) -> (u64, u64) {
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(seed);
    let seconds: Option<u64> = std::env::var("FUZZ_SECONDS").ok().and_then(|s| s.parse().ok());
    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let iterations = match (deadline, std::env::var("FUZZ_ITERATIONS")) {
        (Some(_), _) => u64::MAX,
        (None, Ok(n)) => n.parse().unwrap(),
        (None, Err(_)) => iterations,
    };
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut data = Vec::new();
    let mut ran = 0u64;
    for index in 0..iterations {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let len = (rng.next() % max_len) as usize;
        data.clear();
        data.extend((0..len).map(|_| rng.next() as u8));
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(keep_dir);
            std::fs::create_dir_all(&dir).unwrap();
            let kept = dir.join(format!("prng-seed{seed}-input{index}"));
            std::fs::write(&kept, &data).unwrap();
            panic!("input {index} of seed {seed} failed; kept as {}", kept.display());
        }
        ran += 1;
    }
    (ran, seed)
}
