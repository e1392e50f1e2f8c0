//! `bench/run core WORKLOAD.json [--reps N]`: add, serialize (raw and gzip), output size and
//! peak heap of the core recorder, against the floor recorder, on one workload.
use std::path::PathBuf;

use ddprof_recorder_bench::alloc::CountingAlloc;
use ddprof_recorder_bench::workload::Workload;
use ddprof_recorder_bench::{core_bench, exit_on_error, take_option, take_reps};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn main() {
    exit_on_error(run());
}

fn run() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let reps = take_reps(&mut args, 5)?;
    let only = take_option(&mut args, "--only")?;
    let [path] = &args[..] else {
        return Err("usage: core WORKLOAD.json [--reps N] [--only load|core-add|floor-add|serialize-raw|serialize-gzip]".into());
    };
    let w = Workload::load(&PathBuf::from(path))?;
    eprintln!("loaded {path}: {} samples; {reps} reps", w.samples.len());
    if let Some(part) = only {
        // A profiling aid: run one part alone (under `perf stat` or callgrind), no table.
        return core_bench::run_part(&w, &part, reps);
    }
    let result = core_bench::run(&w, reps, false)?;
    result.print_table();
    println!("{}", result.to_json());
    Ok(())
}
