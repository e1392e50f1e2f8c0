//! A fork taken while a serializer is parked on a slot lock (a sampler holds the slot while the
//! flip waits in its step 2): the child recovers with `Recorder::after_fork`, without touching a
//! lock of the inherited recorder, and records and serializes. Each child runs under a deadline:
//! one that hangs is killed and fails the test. FORK_TEST_FORKS sets the number of forks (100).
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddprof_recorder_core::pprof::PprofProfile;
use ddprof_recorder_core::{Compression, Config, Frame, Recorder, Sample, Timestamp, ValueType};
use prost::Message;

fn recorder() -> Recorder {
    let config = Config::new(vec![ValueType::new("cpu-samples", "count")], 8).unwrap();
    Recorder::new(config, Timestamp::now())
}

fn record(r: &Recorder, name: &str) -> bool {
    let frames = [Frame { function_name: name, filename: "f.rb", line: 1 }];
    r.record_sample(&Sample { frames: &frames, omitted_frames: 0, values: &[1], labels: &[] })
        .is_ok()
}

/// The sample total of a pprof, and whether its strings name `function`.
fn samples(bytes: &[u8], function: &str) -> (i64, bool) {
    let Ok(p) = PprofProfile::decode(bytes) else { return (-1, false) };
    (p.sample.iter().map(|s| s.value[0]).sum(), p.string_table.iter().any(|s| s == function))
}

/// What the child checks, as an exit code (0: all well). No panic and no printing here: a
/// thread of the parent may have held the stderr lock at the fork.
fn child(inherited: &Arc<Recorder>) -> i32 {
    let parent_view = Arc::clone(inherited);
    let mut r = Arc::clone(inherited);
    Recorder::after_fork(&mut r, Timestamp::now());
    // The inherited locks are as the fork left them: slot one held by the sampler, slot two
    // released by the flip's step 1, the serializer lock held.
    if (parent_view.slot_is_locked(1), parent_view.slot_is_locked(2)) != (true, false) {
        return 2;
    }
    if (r.active_slot(), r.slot_is_locked(1), r.slot_is_locked(2)) != (1, false, true) {
        return 3;
    }
    if !record(&r, "child") {
        return 4;
    }
    match r.serialize(Compression::None) {
        Ok(s) if samples(&s.bytes, "child") == (1, true) && !samples(&s.bytes, "parent").1 => {}
        _ => return 5,
    }
    if r.stats().samples_recorded != 2 || r.stats().samples_lost != 0 {
        return 6; // the parent's one sample, copied, and the child's
    }
    0
}

/// Waits for `pid` up to `timeout`; kills it and returns None if it hangs.
fn wait_child(pid: libc::pid_t, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if Instant::now() > deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_child_forked_while_a_serializer_is_parked_on_a_slot_recovers() {
    let forks: usize = std::env::var("FORK_TEST_FORKS").map_or(100, |v| v.parse().unwrap());
    for round in 0..forks {
        let r = Arc::new(recorder());
        assert!(record(&r, "parent"));
        let (release, released) = mpsc::channel::<()>();
        let (held_tx, held) = mpsc::channel::<()>();
        let sampler = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                r.hold_active_slot(|| {
                    held_tx.send(()).unwrap();
                    released.recv_timeout(Duration::from_secs(30)).is_ok()
                })
            })
        };
        held.recv_timeout(Duration::from_secs(30)).expect("the sampler holds slot one");
        let serializer = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.serialize(Compression::None))
        };
        // The flip's step 1 released slot two; step 2 waits for slot one.
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.slot_is_locked(2) {
            assert!(Instant::now() < deadline, "round {round}: the flip never started");
            std::thread::yield_now();
        }
        // parking_lot spins a few microseconds before it parks the thread.
        std::thread::sleep(Duration::from_millis(2));

        // SAFETY: the child only runs `child`, which neither prints nor panics, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = child(&r);
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0, "fork failed");
        let status = wait_child(pid, Duration::from_secs(10));

        release.send(()).unwrap();
        assert_eq!(sampler.join().unwrap(), Ok(true));
        let serialized = serializer.join().unwrap().expect("the parent's serialization ends");
        assert_eq!(samples(&serialized.bytes, "parent"), (1, true));
        assert_eq!(status, Some(0), "round {round}: the child hung (None) or failed");
    }
}
