//! The two-slot recorder through its public API, checked with an independent decode of the
//! pprof it produces.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ddprof_recorder_core::pprof::PprofProfile;
use ddprof_recorder_core::{
    Compression, Config, Frame, Label, LabelValue, Output, RecordError, Recorder, Sample,
    SerializeError, SpanId, Timestamp, ValueType,
};
use prost::Message;

fn recorder() -> Recorder {
    let config = Config::new(
        vec![ValueType::new("cpu-samples", "count"), ValueType::new("wall-time", "nanoseconds")],
        400,
    )
    .unwrap();
    Recorder::new(config, Timestamp::now())
}

fn record(r: &Recorder, name: &str, values: [i64; 2]) {
    let frames = [Frame { function_name: name, filename: "t.rb", line: 1 }];
    r.record_sample(&Sample { frames: &frames, omitted_frames: 0, values: &values, labels: &[] })
        .unwrap();
}

fn totals(pprof: &[u8]) -> Vec<i64> {
    let d = PprofProfile::decode(pprof).unwrap();
    let mut totals = vec![0; d.sample_type.len()];
    for s in &d.sample {
        for (t, v) in totals.iter_mut().zip(&s.value) {
            *t += v;
        }
    }
    totals
}

#[test]
fn new_recorder_has_slot_one_active_and_slot_two_held() {
    let r = recorder();
    assert_eq!(r.active_slot(), 1);
    assert!(!r.slot_is_locked(1));
    assert!(r.slot_is_locked(2));
}

#[test]
fn each_serialize_flips_the_slots_and_returns_only_its_window() {
    let r = recorder();
    record(&r, "a", [1, 10]);
    let first = r.serialize(Compression::None).unwrap();
    assert_eq!((r.active_slot(), r.slot_is_locked(1), r.slot_is_locked(2)), (2, true, false));
    assert_eq!(totals(&first.bytes), [1, 10]);

    record(&r, "b", [2, 20]);
    let second = r.serialize(Compression::None).unwrap();
    assert_eq!((r.active_slot(), r.slot_is_locked(1), r.slot_is_locked(2)), (1, false, true));
    assert_eq!(totals(&second.bytes), [2, 20]);
    assert_eq!(second.start, first.finish, "windows chain");
    assert!(first.start <= first.finish && second.start <= second.finish);

    let third = r.serialize(Compression::None).unwrap();
    assert_eq!(totals(&third.bytes), [0, 0]);
    assert_eq!(r.stats().serializations, 3);
    assert_eq!(r.stats().samples_recorded, 2);
    assert_eq!(r.stats().last_serialization_bytes, third.bytes.len() as u64);
}

#[test]
fn clear_discards_the_window() {
    let r = recorder();
    record(&r, "a", [1, 10]);
    let cleared = r.start_next_profile(Timestamp::now()).unwrap().flip(Output::Discard).unwrap();
    assert!(cleared.bytes.is_empty());
    assert_eq!(r.active_slot(), 2);
    assert_eq!(totals(&r.serialize(Compression::None).unwrap().bytes), [0, 0]);
}

#[test]
fn endpoints_belong_to_their_window() {
    let r = recorder();
    let labels = [Label { key: "local root span id", value: LabelValue::Num(9) }];
    let frames = [Frame { function_name: "f", filename: "t.rb", line: 1 }];
    let sample = Sample { frames: &frames, omitted_frames: 0, values: &[1, 1], labels: &labels };
    r.record_sample(&sample).unwrap();
    r.record_endpoint(SpanId::Num(9), "GET /old").unwrap();
    r.record_endpoint(SpanId::Str("9"), "GET /new").unwrap(); // latest wins, "9" == 9
    let endpoint_of = |bytes: &[u8]| {
        let d = PprofProfile::decode(bytes).unwrap();
        let key = d.string_table.iter().position(|s| s == "trace endpoint");
        d.sample[0]
            .label
            .iter()
            .find(|l| Some(l.key as usize) == key)
            .map(|l| d.string_table[l.str as usize].clone())
    };
    assert_eq!(
        endpoint_of(&r.serialize(Compression::None).unwrap().bytes).as_deref(),
        Some("GET /new")
    );
    r.record_sample(&sample).unwrap();
    assert_eq!(
        endpoint_of(&r.serialize(Compression::None).unwrap().bytes),
        None,
        "not carried over"
    );
}

#[test]
fn invalid_samples_are_rejected_and_counted() {
    let r = recorder();
    let err = r
        .record_sample(&Sample { frames: &[], omitted_frames: 0, values: &[1], labels: &[] })
        .unwrap_err();
    assert_eq!(err, RecordError::ValuesLength { expected: 2, got: 1 });
    assert_eq!(r.stats().samples_rejected, 1);
    assert_eq!(r.stats().samples_recorded, 0);
}

#[test]
fn renewed_is_the_initial_state_from_either_slot_with_the_counters_shared() {
    for serializations in 0..3 {
        let r = recorder();
        for _ in 0..serializations {
            r.serialize(Compression::None).unwrap();
        }
        record(&r, "a", [1, 1]);
        let now = Timestamp::now();
        let fresh = r.renewed(now);
        assert_eq!(
            (fresh.active_slot(), fresh.slot_is_locked(1), fresh.slot_is_locked(2)),
            (1, false, true)
        );
        let out = fresh.serialize(Compression::None).unwrap();
        assert_eq!(out.start, now);
        assert_eq!(totals(&out.bytes), [0, 0], "the reset dropped the samples");
        record(&fresh, "b", [1, 1]);
        assert_eq!(totals(&fresh.serialize(Compression::None).unwrap().bytes), [1, 1]);
        assert_eq!(fresh.stats().samples_recorded, 2, "counted over the recorder's life");
        assert_eq!(r.stats(), fresh.stats(), "one set of counters");
    }
}

#[test]
fn a_second_serialization_meanwhile_is_busy_and_waits_for_nothing() {
    let r = recorder();
    record(&r, "a", [1, 1]);
    let pending = r.start_next_profile(Timestamp::now()).unwrap();
    assert_eq!(r.serialize(Compression::None).unwrap_err(), SerializeError::Busy);
    assert_eq!(r.start_next_profile(Timestamp::now()).unwrap_err(), SerializeError::Busy);
    // A by-hand reset meanwhile does not wait either; the pending flip ends the old window.
    let fresh = r.renewed(Timestamp::now());
    record(&fresh, "b", [2, 2]);
    assert_eq!(totals(&pending.flip(Output::Pprof(Compression::None)).unwrap().bytes), [1, 1]);
    assert_eq!(totals(&fresh.serialize(Compression::None).unwrap().bytes), [2, 2]);
    assert_eq!(fresh.stats().serializations, 2);
    // Dropping a pending flip releases the serializer lock, and flips nothing.
    drop(r.start_next_profile(Timestamp::now()).unwrap());
    assert_eq!(r.active_slot(), 2);
    assert!(r.serialize(Compression::None).is_ok());
}

#[test]
fn gzip_output_decompresses_to_the_same_totals() {
    let r = recorder();
    record(&r, "a", [3, 4]);
    let gz = r.serialize(Compression::Gzip).unwrap().bytes;
    assert_eq!(&gz[..2], &[0x1f, 0x8b]);
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    assert_eq!(totals(&raw), [3, 4]);
}

/// A sampler records continuously while another thread serializes in a loop: the sampler
/// never fails to find a slot, and every recorded value lands in exactly one profile.
#[test]
fn sampler_never_blocks_and_nothing_is_lost_or_double_counted() {
    let r = Arc::new(recorder());
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let names: Vec<String> = (0..200).map(|i| format!("fn{i}")).collect();
            let mut recorded = [0i64; 2];
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) || i < 100_000 {
                let frames: Vec<Frame<'_>> = (0..8)
                    .map(|d| Frame {
                        function_name: &names[(i + d) % 200],
                        filename: "x.rb",
                        line: d as i64,
                    })
                    .collect();
                let values = [1, (i % 1000) as i64];
                r.record_sample(&Sample {
                    frames: &frames,
                    omitted_frames: 0,
                    values: &values,
                    labels: &[],
                })
                .expect("sampler must always find a slot");
                recorded[0] += values[0];
                recorded[1] += values[1];
                i += 1;
            }
            recorded
        })
    };
    let mut serialized = [0i64; 2];
    let mut rounds = 0;
    while rounds < 200 || !sampler.is_finished() {
        let out = r
            .serialize(if rounds % 2 == 0 { Compression::None } else { Compression::Gzip })
            .unwrap();
        let raw = if rounds % 2 == 0 {
            out.bytes
        } else {
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&out.bytes[..]), &mut raw)
                .unwrap();
            raw
        };
        let t = totals(&raw);
        serialized[0] += t[0];
        serialized[1] += t[1];
        rounds += 1;
        if rounds == 200 {
            stop.store(true, Ordering::Relaxed);
        }
    }
    let recorded = sampler.join().unwrap();
    let t = totals(&r.serialize(Compression::None).unwrap().bytes);
    serialized[0] += t[0];
    serialized[1] += t[1];
    assert_eq!(serialized, recorded);
    assert_eq!(r.stats().samples_lost, 0);
    assert_eq!(r.stats().samples_recorded as i64, recorded[0]);
}

/// The comments of a pprof, resolved.
fn comments(pprof: &[u8]) -> Vec<String> {
    let d = PprofProfile::decode(pprof).unwrap();
    d.comment.iter().map(|&c| d.string_table[c as usize].clone()).collect()
}

#[test]
fn comments_go_into_every_profile_serialized_after_they_are_set() {
    let r = recorder();
    record(&r, "a", [1, 1]);
    let before = r.serialize(Compression::None).unwrap().bytes;
    assert!(PprofProfile::decode(&before[..]).unwrap().comment.is_empty());

    let set = vec!["sampling: at each tick".to_string(), "by: a test".to_string()];
    r.set_comments(set.clone()).unwrap();
    assert_eq!(&r.comments()[..], &set[..]);
    for compression in [Compression::None, Compression::Gzip, Compression::None] {
        record(&r, "a", [1, 1]);
        let mut bytes = r.serialize(compression).unwrap().bytes;
        if compression == Compression::Gzip {
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw)
                .unwrap();
            bytes = raw;
        }
        assert_eq!(comments(&bytes), set);
        assert_eq!(totals(&bytes), [1, 1]);
    }
    r.set_comments(Vec::new()).unwrap();
    assert!(comments(&r.serialize(Compression::None).unwrap().bytes).is_empty());
}

#[test]
fn a_serialization_under_way_keeps_the_comments_it_started_with() {
    let r = recorder();
    r.set_comments(vec!["first".to_string()]).unwrap();
    let pending = r.start_next_profile(Timestamp::now()).unwrap();
    // Setting comments never waits for the serializer.
    r.set_comments(vec!["second".to_string()]).unwrap();
    assert_eq!(comments(&pending.flip(Output::Pprof(Compression::None)).unwrap().bytes), ["first"]);
    assert_eq!(comments(&r.serialize(Compression::None).unwrap().bytes), ["second"]);
}

#[test]
fn bad_comments_are_refused_and_change_nothing() {
    let r = recorder();
    r.set_comments(vec!["kept".to_string()]).unwrap();
    let heap = r.heap_bytes();
    let long = "x".repeat(ddprof_recorder_core::MAX_COMMENT_BYTES + 1);
    let cases = [
        (vec!["fine".to_string(), String::new()], "comments[1] is empty"),
        (vec![long], "comments[0] is 4097 bytes long, more than 4096"),
        (
            vec!["c".to_string(); ddprof_recorder_core::MAX_COMMENTS + 1],
            "comments must have at most 64 entries, got 65",
        ),
    ];
    for (comments, message) in cases {
        assert_eq!(r.set_comments(comments).unwrap_err().to_string(), message);
    }
    assert_eq!(&r.comments()[..], ["kept"]);
    assert_eq!(r.heap_bytes(), heap);
    let longest = "y".repeat(ddprof_recorder_core::MAX_COMMENT_BYTES);
    r.set_comments(vec![longest.clone(); ddprof_recorder_core::MAX_COMMENTS]).unwrap();
    assert!(r.heap_bytes() >= heap + ddprof_recorder_core::MAX_COMMENTS * longest.len());
}

#[test]
fn comments_survive_a_reset_and_a_fork() {
    let r = recorder();
    r.set_comments(vec!["sampling: kept".to_string()]).unwrap();
    let fresh = r.renewed(Timestamp::now());
    assert_eq!(comments(&fresh.serialize(Compression::None).unwrap().bytes), ["sampling: kept"]);
    let mut shared = Arc::new(fresh);
    Recorder::after_fork(&mut shared, Timestamp::now());
    assert_eq!(comments(&shared.serialize(Compression::None).unwrap().bytes), ["sampling: kept"]);
}
