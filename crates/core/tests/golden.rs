//! Byte stability of the pprof encoder: fixed recordings (fixed timestamps, samples, labels,
//! endpoints) serialized through the public API must equal the files in `tests/golden/`, raw
//! and gzip, to the byte.
//!
//! The files were written by this test before `pprof.rs` and `profile.rs` were split into
//! modules, so that the split is proven to change no byte. A deliberate change of the output
//! regenerates them with `GOLDEN_UPDATE=1 cargo test -p ddprof_recorder_core --test golden`
//! (and says why in its commit). The gzip files also pin flate2's zlib-rs backend (0.6.8 in
//! Cargo.lock), which is meant to compress alike on every CPU (it stopped choosing its hash by
//! CPU feature in 2025, zlib-rs issue 300); another version may compress differently. Only a
//! `.gz` file differing, with its raw twin equal, is such a case: the raw bytes are what the
//! encoder must keep.
use std::path::PathBuf;

use ddprof_recorder_core::pprof::PprofProfile;
use ddprof_recorder_core::{
    Compression, Config, Frame, Label, LabelValue, Limits, Output, Recorder, Sample, SpanId,
    Timestamp, ValueType,
};
use prost::Message;

const START: Timestamp = Timestamp { secs: 1_764_590_400, nanos: 123_456_789 };
const FINISH: Timestamp = Timestamp { secs: 1_764_590_460, nanos: 987_654_321 };

fn recorder(value_types: &[(&str, &str)], max_frames: usize, limits: Limits) -> Recorder {
    let value_types = value_types.iter().map(|&(t, u)| ValueType::new(t, u)).collect();
    let config = Config::new(value_types, max_frames).unwrap().with_limits(limits).unwrap();
    Recorder::new(config, START)
}

fn record(r: &Recorder, frames: &[Frame<'_>], omitted: usize, values: &[i64], labels: &[Label]) {
    let sample = Sample { frames, omitted_frames: omitted, values, labels };
    r.record_sample(&sample).unwrap();
}

fn frame<'a>(function_name: &'a str, filename: &'a str, line: i64) -> Frame<'a> {
    Frame { function_name, filename, line }
}

fn num<'a>(key: &'a str, n: i64) -> Label<'a> {
    Label { key, value: LabelValue::Num(n) }
}

fn text<'a>(key: &'a str, s: &'a str) -> Label<'a> {
    Label { key, value: LabelValue::Str(s) }
}

/// A small recording that touches every field the encoder writes: shared frames, one function
/// on two lines, negative and zero lines, an empty stack, truncated stacks (placeholders),
/// labels of both kinds, aggregation of labels given in another order, extreme values, and
/// endpoints keyed by a number, by a decimal string and by another string.
fn varied() -> Recorder {
    let r = recorder(
        &[("cpu-time", "nanoseconds"), ("wall-time", "nanoseconds"), ("cpu-samples", "count")],
        6,
        Limits::DEFAULT,
    );
    let leaf = frame("leaf", "/app/a.rb", 10);
    let leaf11 = frame("leaf", "/app/a.rb", 11);
    let main = frame("<main>", "/app/main.rb", 1);
    let block = frame("block in Worker#run", "/app/worker.rb", -1);
    let native = frame("Integer#times", "", 0);
    let unicode = frame("résumé", "/app/ünïcode.rb", 300);
    let span77 = num("local root span id", 77);
    let span_str = text("local root span id", "77");
    let span_abc = text("local root span id", "abc-1");
    let thread = text("thread name", "main");
    let worker = text("thread name", "worker 1");
    let tid = num("thread id", 1234);

    record(&r, &[leaf, main], 0, &[1000, 2000, 1], &[tid, thread]);
    // Same stack and labels, given in the other order: aggregates with the first.
    record(&r, &[leaf, main], 0, &[500, 600, 1], &[thread, tid]);
    record(&r, &[leaf11, main], 0, &[7, 8, 1], &[span77, worker]);
    record(&r, &[block, native, leaf, main], 0, &[0, 0, 0], &[span_str]);
    record(&r, &[unicode, block, main], 0, &[-5, i64::MAX, 1], &[span_abc, tid]);
    record(&r, &[], 0, &[1, 1, 1], &[]);
    record(&r, &[native], 0, &[i64::MIN, -1, 1], &[num("negative", -42)]);
    // 8 frames with max_frames 6: five kept and "3 frames omitted".
    let deep: Vec<Frame<'_>> = (0..8).map(|i| frame("recurse", "/app/deep.rb", i)).collect();
    record(&r, &deep, 0, &[3, 3, 1], &[thread]);
    // 4 given and 4 already cut by the caller: 8 in all, so four kept and "4 frames omitted".
    record(&r, &deep[..4], 4, &[4, 4, 1], &[thread]);

    r.record_endpoint(SpanId::Num(77), "GET /users/:id").unwrap();
    r.record_endpoint(SpanId::Str("abc-1"), "POST /jobs").unwrap();
    // An endpoint for a span no sample has: stored, never written.
    r.record_endpoint(SpanId::Num(9), "GET /unused").unwrap();
    r
}

/// Samples over the limits fold into the placeholder sample; one endpoint is over them too.
fn over_limits() -> Recorder {
    let limits = Limits {
        max_stacks: 3,
        max_strings: 16,
        max_label_sets: 3,
        max_samples: 4,
        ..Limits::DEFAULT
    };
    let r = recorder(&[("wall-time", "nanoseconds")], 64, limits);
    let names = ["a", "b", "c", "d", "e", "f"];
    for (i, name) in names.iter().enumerate() {
        let frames = [frame(name, "/l.rb", i as i64 + 1)];
        let labels = [num("local root span id", i as i64 % 3)];
        record(&r, &frames, 0, &[10 * (i as i64 + 1)], &labels);
    }
    for (span, endpoint) in [(0, "GET /zero"), (1, "GET /one"), (2, "GET /two")] {
        r.record_endpoint(SpanId::Num(span), endpoint).unwrap();
    }
    r
}

/// Enough samples that the gzip path hands the compressor many 64 KiB chunks: stacks drawn
/// from a fixed pseudo-random sequence (an LCG, so that the bytes never depend on a crate's
/// random generator), with labels and endpoints.
fn many() -> Recorder {
    let r =
        recorder(&[("cpu-time", "nanoseconds"), ("wall-time", "nanoseconds")], 64, Limits::DEFAULT);
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let names: Vec<String> =
        (0..400).map(|i| format!("Module{}::Class{}#method_{i}", i % 7, i % 31)).collect();
    let files: Vec<String> = (0..40).map(|i| format!("/app/lib/file_{i}.rb")).collect();
    let threads: Vec<String> = (0..8).map(|i| format!("worker {i}")).collect();
    // A pool of stacks, as a real profile has: most samples share a stack with others.
    let stacks: Vec<Vec<Frame<'_>>> = (0..150)
        .map(|_| {
            (0..1 + next(70))
                .map(|_| {
                    let f = next(names.len() as u64) as usize;
                    frame(&names[f], &files[f % files.len()], 1 + next(200) as i64)
                })
                .collect()
        })
        .collect();
    for i in 0..3_000u64 {
        let frames = &stacks[next(stacks.len() as u64) as usize];
        let labels = [
            num("local root span id", next(50) as i64),
            text("thread name", &threads[next(8) as usize]),
        ];
        let values = [next(10_000_000) as i64, 10_000_000 + i as i64];
        record(&r, frames, 0, &values, &labels);
    }
    for span in 0..25 {
        r.record_endpoint(SpanId::Num(span), &format!("GET /route/{span}")).unwrap();
    }
    r
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

/// The pprof of `recorder` as `compression`, over `START..FINISH`.
fn serialize(recorder: &Recorder, compression: Compression) -> Vec<u8> {
    let pending = recorder.start_next_profile(FINISH).unwrap();
    let serialized = pending.flip(Output::Pprof(compression)).unwrap();
    assert_eq!((serialized.start, serialized.finish), (START, FINISH));
    serialized.bytes
}

/// Compares `bytes` with golden file `name` (or writes it, under `GOLDEN_UPDATE=1`).
fn check(name: &str, bytes: &[u8]) {
    let path = golden_path(name);
    if std::env::var_os("GOLDEN_UPDATE").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        return;
    }
    let expected = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (GOLDEN_UPDATE=1 writes it)", path.display()));
    if bytes != expected {
        let first = bytes.iter().zip(&expected).position(|(a, b)| a != b);
        panic!(
            "{name}: {} bytes, golden file has {}; first difference at byte {}",
            bytes.len(),
            expected.len(),
            first.map_or_else(|| "(one is a prefix of the other)".into(), |i| i.to_string())
        );
    }
}

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut raw).unwrap();
    raw
}

/// Serializes a fresh recording raw and gzip, checks both against their golden files, and
/// returns the raw bytes decoded (with prost, not the encoder) for a sanity check.
fn check_both(name: &str, make: fn() -> Recorder) -> PprofProfile {
    let raw = serialize(&make(), Compression::None);
    let gz = serialize(&make(), Compression::Gzip);
    assert_eq!(gunzip(&gz), raw, "{name}: the gzip stream inflates to the raw encoding");
    check(&format!("{name}.pprof"), &raw);
    check(&format!("{name}.pprof.gz"), &gz);
    PprofProfile::decode(&raw[..]).unwrap()
}

fn totals(p: &PprofProfile) -> Vec<i64> {
    let mut totals = vec![0i64; p.sample_type.len()];
    for s in &p.sample {
        for (t, v) in totals.iter_mut().zip(&s.value) {
            *t = t.wrapping_add(*v);
        }
    }
    totals
}

#[test]
fn varied_recording_is_byte_stable() {
    let p = check_both("varied", varied);
    assert_eq!(p.time_nanos, 1_764_590_400_123_456_789);
    assert_eq!(p.duration_nanos, 60_864_197_532);
    assert_eq!(p.sample.len(), 8, "9 samples, the first two aggregated");
    let s = |i: i64| p.string_table[i as usize].as_str();
    let endpoints: Vec<&str> = p
        .sample
        .iter()
        .flat_map(|sample| &sample.label)
        .filter(|l| s(l.key) == "trace endpoint")
        .map(|l| s(l.str))
        .collect();
    assert_eq!(endpoints, ["GET /users/:id", "GET /users/:id", "POST /jobs"]);
}

#[test]
fn recording_over_the_limits_is_byte_stable() {
    let p = check_both("over_limits", over_limits);
    assert_eq!(totals(&p), [10 + 20 + 30 + 40 + 50 + 60]);
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert!(p.function.iter().any(|f| s(f.name) == ddprof_recorder_core::DROPPED_FRAME));
}

#[test]
fn many_samples_are_byte_stable() {
    let p = check_both("many", many);
    assert!(p.encoded_len() > 4 * 64 * 1024, "several gzip stream chunks");
    assert_eq!(totals(&p)[1], (0..3_000).map(|i| 10_000_000 + i).sum::<i64>());
}

#[test]
fn empty_recording_is_byte_stable() {
    let p = check_both("empty", || recorder(&[("wall-time", "nanoseconds")], 8, Limits::DEFAULT));
    assert!(p.sample.is_empty() && p.mapping.is_empty());
}
