//! The soak at the core level: `cycles` serialize cycles of a bench/gen_workload.rb workload
//! through the two-slot [`Recorder`] (no Ruby), watching the process's RSS and the recorder's
//! `heap_bytes`. bench/soak.rb is the same through Ruby (slower: the Ruby-side conversion of
//! 200k samples a cycle dominates there).
//!
//!     cargo run --release -p ddprof_recorder_core --example soak -- WORKLOAD.json [CYCLES]
//!
//! Prints one JSON object: RSS after cycle 10 and after the last, the growth between them, and
//! heap_bytes at the same points.
use ddprof_recorder_core::{
    Compression, Config, Frame, Label, LabelValue, Recorder, Sample, SpanId, Timestamp, ValueType,
};
use serde_json::Value;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

type OwnedLabel = (String, Result<String, i64>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: soak WORKLOAD.json [CYCLES]")?;
    let cycles: usize = args.next().map_or(Ok(1_000), |c| c.parse())?;
    let w: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let arr = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let value_types: Vec<ValueType> = arr(&w["value_types"])
        .iter()
        .map(|p| ValueType::new(p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or("")))
        .collect();
    let frames: Vec<(String, String, i64)> = arr(&w["frames"])
        .iter()
        .map(|f| {
            let s = |i: usize| f[i].as_str().unwrap_or("").to_string();
            (s(0), s(1), f[2].as_i64().unwrap_or(0))
        })
        .collect();
    let stacks: Vec<Vec<usize>> = arr(&w["stacks"])
        .iter()
        .map(|s| arr(s).iter().map(|i| i.as_u64().unwrap_or(0) as usize).collect())
        .collect();
    let samples: Vec<(usize, Vec<i64>, Vec<OwnedLabel>)> = arr(&w["samples"])
        .iter()
        .map(|s| {
            let values = arr(&s[1]).iter().map(|v| v.as_i64().unwrap_or(0)).collect();
            let labels = arr(&s[2])
                .iter()
                .map(|l| {
                    let key = l[0].as_str().unwrap_or("").to_string();
                    let value = match l[1].as_str() {
                        Some(s) => Ok(s.to_string()),
                        None => Err(l[2].as_i64().unwrap_or(0)),
                    };
                    (key, value)
                })
                .collect();
            (s[0].as_u64().unwrap_or(0) as usize, values, labels)
        })
        .collect();
    let endpoints: Vec<(i64, String)> = arr(&w["endpoints"])
        .iter()
        .map(|e| (e[0].as_i64().unwrap_or(0), e[1].as_str().unwrap_or("").to_string()))
        .collect();
    drop(w);
    let stack_frames: Vec<Vec<Frame<'_>>> = stacks
        .iter()
        .map(|s| {
            s.iter()
                .map(|&i| Frame {
                    function_name: &frames[i].0,
                    filename: &frames[i].1,
                    line: frames[i].2,
                })
                .collect()
        })
        .collect();

    let recorder = Recorder::new(Config::new(value_types, 400)?, Timestamp::now());
    let started = std::time::Instant::now();
    let (mut rss_early, mut heap_early, mut bytes_out) = (0, 0, 0usize);
    let mut labels: Vec<Label<'_>> = Vec::new();
    for cycle in 1..=cycles {
        for (stack, values, owned) in &samples {
            labels.clear();
            labels.extend(owned.iter().map(|(key, value)| Label {
                key,
                value: match value {
                    Ok(s) => LabelValue::Str(s),
                    Err(n) => LabelValue::Num(*n),
                },
            }));
            let sample = Sample {
                frames: &stack_frames[*stack],
                omitted_frames: 0,
                values,
                labels: &labels,
            };
            recorder.record_sample(&sample)?;
        }
        for (id, name) in &endpoints {
            recorder.record_endpoint(SpanId::Num(*id), name)?;
        }
        bytes_out += recorder.serialize(Compression::None)?.bytes.len();
        if cycle == 10 {
            (rss_early, heap_early) = (rss_bytes(), recorder.heap_bytes());
        }
        if cycle % 100 == 0 {
            eprintln!("cycle {cycle}: rss {} heap_bytes {}", rss_bytes(), recorder.heap_bytes());
        }
    }
    let (rss_last, heap_last) = (rss_bytes(), recorder.heap_bytes());
    let stats = recorder.stats();
    println!(
        "{{\"workload\":{path:?},\"cycles\":{cycles},\"samples_per_cycle\":{},\"seconds\":{:.1},\
         \"rss_after_10\":{rss_early},\"rss_last\":{rss_last},\"rss_growth_percent\":{:.2},\
         \"heap_bytes_after_10\":{heap_early},\"heap_bytes_last\":{heap_last},\
         \"samples_recorded\":{},\"samples_lost\":{},\"samples_dropped\":{},\"serialized_mib\":{:.1}}}",
        samples.len(),
        started.elapsed().as_secs_f64(),
        (rss_last as f64 - rss_early as f64) / rss_early as f64 * 100.0,
        stats.samples_recorded,
        stats.samples_lost,
        stats.samples_dropped,
        bytes_out as f64 / 1048576.0,
    );
    Ok(())
}
