//! Benchmarks of `ddprof_recorder_core` (see `bench/run` and `bench/RESULTS.md`). The
//! binaries in `src/bin` print a table and, as their last line, one JSON object.
pub mod alloc;
pub mod core_bench;
pub mod floor;
pub mod stats;
pub mod workload;

/// The Ruby API's default `max_frames`; the workload's stacks (at most ~100 frames) fit.
pub const MAX_FRAMES: usize = 400;

/// Parses `--name VALUE` out of `args`, removing both.
pub fn take_option(args: &mut Vec<String>, name: &str) -> Result<Option<String>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) if i + 1 < args.len() => {
            let value = args.remove(i + 1);
            args.remove(i);
            Ok(Some(value))
        }
        Some(_) => Err(format!("{name} needs a value")),
    }
}

/// `--reps N` (N >= 1) taken out of `args`, or `default`.
pub fn take_reps(args: &mut Vec<String>, default: usize) -> Result<usize, String> {
    match take_option(args, "--reps")? {
        Some(n) => {
            n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| "--reps must be >= 1".into())
        }
        None => Ok(default),
    }
}

/// Runs a benchmark's `main`, turning an error into a message and exit status 1.
pub fn exit_on_error(result: Result<(), String>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The 1-minute load average (Linux), recorded with each result: this machine is shared and
/// noisy, and a number measured under load 4 is not one measured idle.
pub fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}
