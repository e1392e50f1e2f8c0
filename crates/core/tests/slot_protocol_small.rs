//! The two-slot protocol at a size Miri can run (`rake sanitize:miri`): a sampler thread and a
//! serializer thread, then a forked child's recovery from a serialization cut short. Miri checks
//! the unsafe code on these paths (parking_lot's) for undefined behaviour and data races, under
//! many thread interleavings. Also an ordinary fast test.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ddprof_recorder_core::pprof::PprofProfile;
use ddprof_recorder_core::{Compression, Config, Frame, Recorder, Sample, Timestamp, ValueType};
use prost::Message;

fn recorder() -> Recorder {
    let config = Config::new(vec![ValueType::new("cpu-samples", "count")], 8).unwrap();
    Recorder::new(config, Timestamp::now())
}

fn total(bytes: &[u8]) -> i64 {
    PprofProfile::decode(bytes).unwrap().sample.iter().map(|s| s.value[0]).sum()
}

#[test]
fn a_sampler_and_a_serializer_lose_nothing() {
    let r = Arc::new(recorder());
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (r, done) = (r.clone(), done.clone());
        std::thread::spawn(move || {
            for i in 0..60 {
                let name = if i % 2 == 0 { "a" } else { "b" };
                let frames = [Frame { function_name: name, filename: "m.rb", line: i }];
                let sample =
                    Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &[] };
                r.record_sample(&sample).expect("a slot is always free");
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut seen = 0;
    while !done.load(Ordering::Acquire) {
        seen += total(&r.serialize(Compression::None).unwrap().bytes);
    }
    sampler.join().unwrap();
    seen += total(&r.serialize(Compression::None).unwrap().bytes);
    assert_eq!(seen, 60);
    assert_eq!(r.stats().samples_lost, 0);
}

#[test]
fn after_a_serialization_cut_short_a_child_gets_a_working_recorder() {
    let mut r = Arc::new(recorder());
    let frames = [Frame { function_name: "a", filename: "m.rb", line: 1 }];
    r.record_sample(&Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &[] })
        .unwrap();
    // The serializer's first step only, its thread gone, as a fork in the middle of a
    // serialization leaves it: the serializer lock stays held for ever.
    std::mem::forget(r.start_next_profile(Timestamp::now()).unwrap());
    Recorder::after_fork(&mut r, Timestamp::now());
    assert_eq!((r.active_slot(), r.slot_is_locked(1), r.slot_is_locked(2)), (1, false, true));
    assert_eq!(total(&r.serialize(Compression::None).unwrap().bytes), 0);
    assert_eq!(r.stats().samples_recorded, 1, "the counters are copied");
}
