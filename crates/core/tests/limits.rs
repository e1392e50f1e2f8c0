//! Per-profile limits through the public API: samples over a limit fold into the placeholder,
//! totals stay exact, what exists is reused, and memory stops growing.
use ddprof_recorder_core::{
    Compression, Config, ConfigError, Frame, Label, LabelValue, Limits, Profile, Recorder, Sample,
    SpanId, Timestamp, ValueType, DROPPED_FRAME,
};

fn limits(
    max_stacks: usize,
    max_strings: usize,
    max_label_sets: usize,
    max_samples: usize,
) -> Limits {
    Limits { max_stacks, max_strings, max_label_sets, max_samples, ..Limits::DEFAULT }
}

fn add(p: &mut Profile, name: &str, labels: &[Label<'_>], value: i64) {
    let frames = [Frame { function_name: name, filename: "l.rb", line: 1 }];
    p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[value], labels }, 400).unwrap();
}

fn samples(p: &Profile) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    p.for_each_sample(|frames, values, _| {
        out.push((frames[0].function_name.to_string(), values[0]))
    });
    out.sort();
    out
}

#[test]
fn over_max_stacks_folds_into_the_placeholder_and_existing_stacks_still_aggregate() {
    let mut p = Profile::with_limits(1, Timestamp::default(), limits(2, 100, 100, 100));
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        add(&mut p, name, &[], i as i64 + 1);
    }
    add(&mut p, "a", &[], 10);
    assert_eq!(
        samples(&p),
        vec![(DROPPED_FRAME.to_string(), 3 + 4), ("a".into(), 11), ("b".into(), 2)]
    );
    assert_eq!(p.samples_dropped(), 2);
    assert_eq!(p.samples_added(), 5);
}

#[test]
fn each_limit_folds() {
    let k = |v: &'static str| [Label { key: "k", value: LabelValue::Str(v) }];
    // Strings: "", "a", "l.rb" fill 3; a new label string does not fit.
    let mut p = Profile::with_limits(1, Timestamp::default(), limits(100, 3, 100, 100));
    add(&mut p, "a", &[], 1);
    add(&mut p, "a", &k("v"), 1);
    add(&mut p, "a", &[], 1);
    assert_eq!(samples(&p), vec![(DROPPED_FRAME.to_string(), 1), ("a".into(), 2)]);
    // Label sets.
    let mut p = Profile::with_limits(1, Timestamp::default(), limits(100, 100, 1, 100));
    add(&mut p, "a", &k("1"), 1);
    add(&mut p, "a", &k("2"), 1);
    assert_eq!(p.samples_dropped(), 1);
    // Samples: the same stack with another label set is another sample.
    let mut p = Profile::with_limits(1, Timestamp::default(), limits(100, 100, 100, 1));
    add(&mut p, "a", &k("1"), 1);
    add(&mut p, "a", &k("2"), 1);
    assert_eq!(p.samples_dropped(), 1);
}

#[test]
fn heap_stops_growing_at_the_limits() {
    let mut p = Profile::with_limits(1, Timestamp::default(), limits(50, 200, 50, 50));
    let names: Vec<String> = (0..20_000).map(|i| format!("f{i}")).collect();
    for name in &names[..1_000] {
        add(&mut p, name, &[], 1);
    }
    let bounded = p.heap_bytes();
    for name in &names {
        add(&mut p, name, &[], 1);
    }
    assert_eq!(p.heap_bytes(), bounded);
    assert!(p.stack_count() <= 51 && p.sample_count() <= 51 && p.string_count() <= 201);
}

#[test]
fn endpoints_over_the_limits_are_dropped() {
    let mut p = Profile::with_limits(1, Timestamp::default(), limits(100, 100, 1, 100));
    assert!(p.record_endpoint(SpanId::Num(1), "GET /a"));
    assert!(!p.record_endpoint(SpanId::Num(2), "GET /b"));
    assert!(p.record_endpoint(SpanId::Num(1), "GET /c"), "replacing an endpoint is no growth");
}

#[test]
fn the_recorder_counts_drops_and_reports_its_heap_without_locking() {
    let config = Config::new(vec![ValueType::new("cpu-samples", "count")], 400)
        .unwrap()
        .with_limits(limits(1, 100, 100, 100))
        .unwrap();
    let r = Recorder::new(config, Timestamp::now());
    let empty = r.heap_bytes();
    for name in ["a", "b", "c"] {
        let frames = [Frame { function_name: name, filename: "l.rb", line: 1 }];
        r.record_sample(&Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &[] })
            .unwrap();
    }
    assert!(r.heap_bytes() > empty);
    assert_eq!((r.stats().samples_recorded, r.stats().samples_dropped), (3, 2));
    let held = r.heap_bytes();
    r.serialize(Compression::None).unwrap();
    assert!(r.heap_bytes() >= held, "storage is kept for reuse");
}

#[test]
fn limits_are_validated() {
    let config = || Config::new(vec![ValueType::new("cpu-samples", "count")], 400).unwrap();
    assert_eq!(
        config().with_limits(limits(0, 1, 1, 1)),
        Err(ConfigError::Limit { name: "max_stacks", value: 0 })
    );
    assert_eq!(
        config().with_limits(limits(1, 1, 1, Limits::MAX + 1)),
        Err(ConfigError::Limit { name: "max_samples", value: Limits::MAX + 1 })
    );
    assert_eq!(config().limits(), Limits::DEFAULT);
    assert!(config().with_limits(limits(1, 1, 1, Limits::MAX)).is_ok());
}
