//! `bench/run soak WORKLOAD.json|small|medium|large [CYCLES]`: the soak at the core level,
//! `CYCLES` (default 1,000) serialize cycles of a workload through the two-slot [`Recorder`]
//! (no Ruby), watching the process's RSS and the recorder's `heap_bytes`. bench/soak.rb is the
//! same through Ruby (slower: the Ruby-side conversion of 200k samples a cycle dominates there).
//!
//! Prints one JSON object: RSS after cycle 10 and after the last, the growth between them, and
//! heap_bytes at the same points.
use std::path::PathBuf;

use ddprof_recorder_bench::exit_on_error;
use ddprof_recorder_bench::stats::round;
use ddprof_recorder_bench::workload::Workload;
use ddprof_recorder_core::{Compression, Config, Recorder, SpanId, Timestamp};
use serde_json::json;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    exit_on_error(run());
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, cycles) = match &args[..] {
        [path] => (path, 1_000),
        [path, cycles] => (path, cycles.parse::<usize>().map_err(|e| format!("CYCLES: {e}"))?),
        _ => return Err("usage: soak WORKLOAD.json [CYCLES]".into()),
    };
    let w = Workload::load(&PathBuf::from(path))?;
    let config = Config::new(w.value_types.clone(), 400).map_err(|e| e.to_string())?;
    let recorder = Recorder::new(config, Timestamp::now());
    let started = std::time::Instant::now();
    let (mut rss_early, mut heap_early, mut bytes_out) = (0, 0, 0usize);
    for cycle in 1..=cycles {
        let mut failed = None;
        w.feed(0..w.samples.len(), |sample| {
            if let Err(e) = recorder.record_sample(sample) {
                failed.get_or_insert(e);
            }
        });
        for (id, name) in &w.endpoints {
            recorder.record_endpoint(SpanId::Num(*id), name).map_err(|e| e.to_string())?;
        }
        if let Some(e) = failed {
            return Err(format!("cycle {cycle}: {e}"));
        }
        bytes_out += recorder.serialize(Compression::None).map_err(|e| e.to_string())?.bytes.len();
        if cycle == 10 {
            (rss_early, heap_early) = (rss_bytes(), recorder.heap_bytes());
        }
        if cycle % 100 == 0 {
            eprintln!("cycle {cycle}: rss {} heap_bytes {}", rss_bytes(), recorder.heap_bytes());
        }
    }
    let (rss_last, heap_last) = (rss_bytes(), recorder.heap_bytes());
    let stats = recorder.stats();
    let json = json!({
        "workload": w.name,
        "cycles": cycles,
        "samples_per_cycle": w.samples.len(),
        "seconds": round(started.elapsed().as_secs_f64(), 1),
        "rss_after_10": rss_early,
        "rss_last": rss_last,
        "rss_growth_percent": round((rss_last as f64 - rss_early as f64) / rss_early as f64 * 100.0, 2),
        "heap_bytes_after_10": heap_early,
        "heap_bytes_last": heap_last,
        "samples_recorded": stats.samples_recorded,
        "samples_lost": stats.samples_lost,
        "samples_dropped": stats.samples_dropped,
        "serialized_mib": round(bytes_out as f64 / 1048576.0, 1),
    });
    println!("{json}");
    Ok(())
}
