//! The core benchmark, shared by `core` and `scaling`: per repetition, fresh recorders fed the
//! whole workload through [`Recorder::record_sample`], endpoints added, then serialized raw
//! (one recorder) and gzip (another), each output decoded and checked against the input
//! totals; the floor recorder is timed on the same input, interleaved with the core runs.
use std::io::Read as _;
use std::time::Instant;

use ddprof_recorder_core::pprof::{PprofProfile, GZIP_LEVEL};
use ddprof_recorder_core::{Compression, Config, Recorder, SpanId, Timestamp};
use prost::Message as _;
use serde_json::{json, Value};

use crate::floor::FloorRecorder;
use crate::stats::{median, min, round};
use crate::workload::Workload;
use crate::{alloc, MAX_FRAMES};

#[derive(Debug, Default)]
pub struct CoreResult {
    pub workload: String,
    pub samples_in: usize,
    pub distinct_stacks: usize,
    pub frames_per_sample: f64,
    pub reps: usize,
    pub samples_out: usize,
    pub endpoint_samples: usize,
    /// One per fill (two fills per repetition: one serialized raw, one gzip).
    pub add_ns: Vec<f64>,
    pub floor_ns: Vec<f64>,
    pub endpoints_ms: Vec<f64>,
    pub raw_ms: Vec<f64>,
    pub gzip_ms: Vec<f64>,
    pub raw_bytes: usize,
    pub gzip_bytes: usize,
    /// Heap the recorder holds once the workload is in (both slots), largest over fills.
    pub heap_after_add: usize,
    /// Peak heap while adding samples and endpoints.
    pub peak_heap_add: usize,
    /// Peak heap over add + serialize raw, the returned pprof included.
    pub peak_heap_raw: usize,
    /// Peak heap over add + serialize gzip, the returned pprof included.
    pub peak_heap_gzip: usize,
    pub floor_peak_heap: usize,
    /// 1-minute load average before and after the run.
    pub loadavg: (Option<f64>, Option<f64>),
}

fn config(w: &Workload) -> Result<Config, String> {
    Config::new(w.value_types.clone(), MAX_FRAMES).map_err(|e| e.to_string())
}

/// Decodes a pprof (gunzipping it first if `gzip`) and checks it against the workload.
/// Returns (samples out, samples carrying a "trace endpoint" label).
pub fn verify(w: &Workload, bytes: &[u8], gzip: bool) -> Result<(usize, usize), String> {
    let raw = if gzip {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(|e| format!("gzip output does not decompress: {e}"))?;
        raw
    } else {
        bytes.to_vec()
    };
    let d = PprofProfile::decode(&raw[..]).map_err(|e| format!("pprof does not decode: {e}"))?;
    if d.sample_type.len() != w.num_values() {
        return Err(format!("{} sample types, expected {}", d.sample_type.len(), w.num_values()));
    }
    let mut totals = vec![0i64; w.num_values()];
    for s in &d.sample {
        for (t, v) in totals.iter_mut().zip(&s.value) {
            *t += v;
        }
    }
    if totals != w.totals() {
        return Err(format!("decoded totals {totals:?} != input totals {:?}", w.totals()));
    }
    let endpoint_key = d.string_table.iter().position(|s| s == "trace endpoint");
    let with_endpoint = d
        .sample
        .iter()
        .filter(|s| s.label.iter().any(|l| Some(l.key as usize) == endpoint_key))
        .count();
    Ok((d.sample.len(), with_endpoint))
}

/// Adds the whole workload to `rec` (timed, ns per sample) then its endpoints (timed, ms).
fn fill(w: &Workload, rec: &Recorder) -> Result<(f64, f64), String> {
    let mut failed = 0usize;
    let t = Instant::now();
    w.feed(0..w.samples.len(), |s| failed += usize::from(rec.record_sample(s).is_err()));
    let add_ns = t.elapsed().as_nanos() as f64 / w.samples.len() as f64;
    if failed > 0 {
        return Err(format!("record_sample failed {failed} times"));
    }
    let t = Instant::now();
    for (span, endpoint) in &w.endpoints {
        rec.record_endpoint(SpanId::Num(*span), endpoint).map_err(|e| e.to_string())?;
    }
    Ok((add_ns, t.elapsed().as_secs_f64() * 1e3))
}

fn run_floor(w: &Workload, r: &mut CoreResult) -> Result<(), String> {
    alloc::reset_peak();
    let base = alloc::live();
    let mut floor = FloorRecorder::new(w.num_values());
    let t = Instant::now();
    w.feed(0..w.samples.len(), |s| floor.add(s));
    r.floor_ns.push(t.elapsed().as_nanos() as f64 / w.samples.len() as f64);
    r.floor_peak_heap = r.floor_peak_heap.max(alloc::peak() - base);
    if floor.totals() != w.totals() || floor.samples_out() != r.samples_out {
        return Err(format!(
            "floor disagrees with the core: {} samples out vs {}",
            floor.samples_out(),
            r.samples_out
        ));
    }
    Ok(())
}

fn run_core_once(w: &Workload, r: &mut CoreResult, compression: Compression) -> Result<(), String> {
    alloc::reset_peak();
    let base = alloc::live();
    let rec = Recorder::new(config(w)?, Timestamp::now());
    let (add_ns, endpoints_ms) = fill(w, &rec)?;
    r.add_ns.push(add_ns);
    r.endpoints_ms.push(endpoints_ms);
    r.heap_after_add = r.heap_after_add.max(alloc::live() - base);
    r.peak_heap_add = r.peak_heap_add.max(alloc::peak() - base);
    let t = Instant::now();
    let out = rec.serialize(compression).map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    // The output's capacity past its length (see `pprof::output_capacity`) is address space
    // that is never written, so never resident: not counted.
    let peak = alloc::peak() - base - (out.bytes.capacity() - out.bytes.len());
    drop(rec);
    let gzip = compression == Compression::Gzip;
    let (samples_out, with_endpoint) = verify(w, &out.bytes, gzip)?;
    if gzip {
        r.gzip_ms.push(ms);
        r.gzip_bytes = out.bytes.len();
        r.peak_heap_gzip = r.peak_heap_gzip.max(peak);
    } else {
        r.raw_ms.push(ms);
        r.raw_bytes = out.bytes.len();
        r.peak_heap_raw = r.peak_heap_raw.max(peak);
    }
    if r.samples_out != 0 && r.samples_out != samples_out {
        return Err(format!(
            "samples out changed between runs: {} vs {samples_out}",
            r.samples_out
        ));
    }
    r.samples_out = samples_out;
    r.endpoint_samples = with_endpoint;
    if !w.endpoints.is_empty() && with_endpoint == 0 {
        return Err("no sample carries a \"trace endpoint\" label".into());
    }
    Ok(())
}

/// Runs `reps` repetitions on `w`, interleaving core and floor so that drift in the machine's
/// speed hits both alike.
pub fn run(w: &Workload, reps: usize, quiet: bool) -> Result<CoreResult, String> {
    let mut r = CoreResult {
        workload: w.name.clone(),
        samples_in: w.samples.len(),
        distinct_stacks: w.distinct_stacks(),
        frames_per_sample: w.mean_frames(),
        reps,
        loadavg: (crate::loadavg(), None),
        ..CoreResult::default()
    };
    for rep in 0..reps {
        run_core_once(w, &mut r, Compression::None)?;
        run_floor(w, &mut r)?;
        run_core_once(w, &mut r, Compression::Gzip)?;
        run_floor(w, &mut r)?;
        r.loadavg.1 = crate::loadavg();
        if !quiet {
            eprintln!(
                "  rep {}/{reps}: add {:.0} {:.0} ns/sample, floor {:.0} {:.0}, raw {:.1} ms, gzip {:.1} ms",
                rep + 1,
                r.add_ns[2 * rep],
                r.add_ns[2 * rep + 1],
                r.floor_ns[2 * rep],
                r.floor_ns[2 * rep + 1],
                r.raw_ms[rep],
                r.gzip_ms[rep],
            );
        }
    }
    Ok(r)
}

/// Compresses the workload's raw pprof at every level with flate2's zlib-rs backend (the
/// core's) and with miniz_oxide (flate2's default Rust backend), 3 times each: what the
/// choice of `GZIP_LEVEL` and backend rests on.
fn gzip_levels(w: &Workload) -> Result<(), String> {
    let rec = Recorder::new(config(w)?, Timestamp::now());
    fill(w, &rec)?;
    let raw = rec.serialize(Compression::None).map_err(|e| e.to_string())?.bytes;
    println!("raw pprof {} bytes; best of 3 runs", raw.len());
    println!("{:<12} {:>5} {:>10} {:>12} {:>7}", "backend", "level", "ms", "bytes", "ratio");
    for level in 1..=9u32 {
        let mut zlib_rs = (f64::INFINITY, 0);
        let mut miniz = (f64::INFINITY, 0);
        for _ in 0..3 {
            let t = Instant::now();
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
            std::io::Write::write_all(&mut e, &raw).map_err(|e| e.to_string())?;
            let out = e.finish().map_err(|e| e.to_string())?;
            zlib_rs = (f64::min(zlib_rs.0, t.elapsed().as_secs_f64() * 1e3), out.len());
            let t = Instant::now();
            let out = miniz_oxide::deflate::compress_to_vec(&raw, level as u8);
            miniz = (f64::min(miniz.0, t.elapsed().as_secs_f64() * 1e3), out.len());
        }
        for (name, (ms, bytes)) in [("zlib-rs", zlib_rs), ("miniz_oxide", miniz)] {
            let ratio = bytes as f64 / raw.len() as f64;
            println!("{name:<12} {level:>5} {ms:>10.1} {bytes:>12} {ratio:>7.3}");
        }
    }
    Ok(())
}

/// Runs one part of the benchmark `reps` times, for profiling it alone (`--only PART`):
/// `load` (nothing but the workload load), `core-add`, `floor-add`, `serialize-raw` and
/// `serialize-gzip` (each also adds the workload first: subtract `core-add`).
pub fn run_part(w: &Workload, part: &str, reps: usize) -> Result<(), String> {
    if part == "gzip-levels" {
        // Takes its own best of 3 per level.
        return gzip_levels(w);
    }
    for _ in 0..reps {
        let t = Instant::now();
        match part {
            "load" => {}
            "core-add" => {
                let rec = Recorder::new(config(w)?, Timestamp::now());
                fill(w, &rec)?;
            }
            "floor-add" => {
                let mut floor = FloorRecorder::new(w.num_values());
                w.feed(0..w.samples.len(), |s| floor.add(s));
            }
            "serialize-raw" | "serialize-gzip" => {
                let rec = Recorder::new(config(w)?, Timestamp::now());
                fill(w, &rec)?;
                let compression =
                    if part == "serialize-raw" { Compression::None } else { Compression::Gzip };
                rec.serialize(compression).map_err(|e| e.to_string())?;
            }
            _ => return Err(format!("unknown part {part:?}")),
        }
        eprintln!("{part}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

impl CoreResult {
    pub fn print_table(&self) {
        let mb = |b: usize| format!("{:.2} MB", b as f64 / 1e6);
        println!(
            "workload {}: {} samples in ({} distinct stacks, {:.1} frames/sample), {} out; {} reps ({} fills)",
            self.workload,
            self.samples_in,
            self.distinct_stacks,
            self.frames_per_sample,
            self.samples_out,
            self.reps,
            self.add_ns.len()
        );
        println!("{:<34} {:>12} {:>12}", "", "min", "median");
        let row = |name: &str, xs: &[f64], digits: usize| {
            println!("{name:<34} {:>12.digits$} {:>12.digits$}", min(xs), median(xs));
        };
        row("add, ns/sample (core)", &self.add_ns, 0);
        row("add, ns/sample (floor)", &self.floor_ns, 0);
        let ratios: Vec<f64> =
            [min(&self.add_ns) / min(&self.floor_ns), self.ratio_to_floor()].into_iter().collect();
        println!("{:<34} {:>12.2} {:>12.2}", "core / floor", ratios[0], ratios[1]);
        row("add endpoints, ms", &self.endpoints_ms, 2);
        row("serialize raw, ms", &self.raw_ms, 1);
        row(&format!("serialize gzip (level {GZIP_LEVEL}), ms"), &self.gzip_ms, 1);
        println!("{:<34} {:>12}", "raw pprof", mb(self.raw_bytes));
        println!("{:<34} {:>12}", "gzip pprof", mb(self.gzip_bytes));
        println!("{:<34} {:>12}", "heap held after add (2 slots)", mb(self.heap_after_add));
        println!("{:<34} {:>12}", "peak heap, add", mb(self.peak_heap_add));
        println!("{:<34} {:>12}", "peak heap, add + serialize raw", mb(self.peak_heap_raw));
        println!("{:<34} {:>12}", "peak heap, add + serialize gzip", mb(self.peak_heap_gzip));
        println!("{:<34} {:>12}", "peak heap, floor", mb(self.floor_peak_heap));
        println!("{:<34} {:>12}", "samples with an endpoint", self.endpoint_samples);
        if let (Some(before), Some(after)) = self.loadavg {
            println!("{:<34} {:>12}", "load average before / after", format!("{before} / {after}"));
        }
    }

    /// Median core add cost over median floor add cost.
    pub fn ratio_to_floor(&self) -> f64 {
        median(&self.add_ns) / median(&self.floor_ns)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "workload": self.workload,
            "samples_in": self.samples_in,
            "samples_out": self.samples_out,
            "distinct_stacks": self.distinct_stacks,
            "frames_per_sample": round(self.frames_per_sample, 2),
            "reps": self.reps,
            "add_ns_per_sample_min": round(min(&self.add_ns), 1),
            "add_ns_per_sample_median": round(median(&self.add_ns), 1),
            "floor_ns_per_sample_min": round(min(&self.floor_ns), 1),
            "floor_ns_per_sample_median": round(median(&self.floor_ns), 1),
            "ratio_to_floor": round(self.ratio_to_floor(), 3),
            "endpoints_ms_median": round(median(&self.endpoints_ms), 3),
            "serialize_raw_ms_min": round(min(&self.raw_ms), 2),
            "serialize_raw_ms_median": round(median(&self.raw_ms), 2),
            "serialize_gzip_ms_min": round(min(&self.gzip_ms), 2),
            "serialize_gzip_ms_median": round(median(&self.gzip_ms), 2),
            "gzip_level": GZIP_LEVEL,
            "raw_bytes": self.raw_bytes,
            "gzip_bytes": self.gzip_bytes,
            "peak_heap_bytes": self.peak_heap_raw,
            "peak_heap_add_bytes": self.peak_heap_add,
            "peak_heap_gzip_bytes": self.peak_heap_gzip,
            "heap_after_add_bytes": self.heap_after_add,
            "floor_peak_heap_bytes": self.floor_peak_heap,
            "endpoint_samples": self.endpoint_samples,
            "loadavg_before": self.loadavg.0,
            "loadavg_after": self.loadavg.1,
        })
    }
}
