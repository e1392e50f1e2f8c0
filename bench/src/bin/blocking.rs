//! `bench/run blocking [--rounds N] [--runs N]`: is the sampler ever blocked by a serialization?
//!
//! A sampler thread records the medium workload's samples over and over, timing every call.
//! Another thread serializes each time the sampler has recorded a full medium workload since
//! the last serialization, so every serialization encodes a medium-sized profile. Each call's
//! latency is filed under "during" when a serialization was in progress at its start or end,
//! else under "idle". The same is done, in the same run, for a baseline that guards one
//! profile with one mutex (the serializer holds it while encoding). The first two rounds are
//! warm-up (both of the two-slot recorder's profiles have then grown to their steady size) and
//! are not counted.
//!
//! The machine has 2 cores and is shared, so a call can also be slow because the OS took the
//! core away from the sampler. Each call is bracketed by `getrusage(RUSAGE_THREAD)`: a call
//! during which the sampler thread was switched out involuntarily (`ru_nivcsw` grew) and never
//! gave up the core itself (`ru_nvcsw` unchanged) was preempted. Waiting on a lock is a
//! voluntary switch (a futex wait), so a blocked call is never taken for a preempted one.
//! Latencies are reported over all calls and over the calls that were not preempted.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use ddprof_recorder_bench::stats::{median, percentile_sorted, round};
use ddprof_recorder_bench::workload::Workload;
use ddprof_recorder_bench::{exit_on_error, take_option, MAX_FRAMES};
use ddprof_recorder_core::{pprof, Compression, Config, Profile, Recorder, Sample, Timestamp};
use parking_lot::Mutex;
use serde_json::{json, Value};

const WARMUP_ROUNDS: usize = 2;

trait Target: Sync {
    fn name(&self) -> &'static str;
    fn record(&self, sample: &Sample<'_>) -> bool;
    /// Serializes (raw) the current profile and starts an empty one; returns the bytes' size.
    fn serialize(&self) -> Result<usize, String>;
}

struct TwoSlot(Recorder);

impl Target for TwoSlot {
    fn name(&self) -> &'static str {
        "two-slot recorder"
    }

    fn record(&self, sample: &Sample<'_>) -> bool {
        self.0.record_sample(sample).is_ok()
    }

    fn serialize(&self) -> Result<usize, String> {
        Ok(self.0.serialize(Compression::None).map_err(|e| e.to_string())?.bytes.len())
    }
}

/// The baseline: one profile (the same storage and encoder as the core's) behind one mutex.
struct OneMutex {
    config: Config,
    profile: Mutex<Profile>,
}

impl Target for OneMutex {
    fn name(&self) -> &'static str {
        "one-mutex baseline"
    }

    fn record(&self, sample: &Sample<'_>) -> bool {
        self.profile.lock().add(sample, self.config.max_frames()).is_ok()
    }

    fn serialize(&self) -> Result<usize, String> {
        let mut profile = self.profile.lock();
        let now = Timestamp::now();
        let bytes = pprof::encode(&mut profile, self.config.value_types(), &[], now);
        profile.reset(now);
        Ok(bytes.len())
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Latencies {
    count: usize,
    p50: u32,
    p99: u32,
    p999: u32,
    max: u32,
}

impl Latencies {
    fn of(mut ns: Vec<u32>) -> Self {
        ns.sort_unstable();
        let p = |q| percentile_sorted(&ns, q).unwrap_or(0);
        Self { count: ns.len(), p50: p(50.0), p99: p(99.0), p999: p(99.9), max: p(100.0) }
    }

    fn json(&self) -> Value {
        json!({"count": self.count, "p50_ns": self.p50, "p99_ns": self.p99,
               "p999_ns": self.p999, "max_ns": self.max})
    }
}

struct RunResult {
    idle: Latencies,
    during: Latencies,
    /// The same, without the calls during which the sampler was preempted.
    idle_running: Latencies,
    during_running: Latencies,
    serialize_ms: Vec<f64>,
}

/// (voluntary, involuntary) context switches of the calling thread so far.
fn context_switches() -> (i64, i64) {
    // SAFETY: `usage` is a plain C struct that getrusage fills; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage, for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return (0, 0);
    }
    (usage.ru_nvcsw, usage.ru_nivcsw)
}

fn run_once(w: &Workload, target: &dyn Target, rounds: usize) -> Result<RunResult, String> {
    let since_last = AtomicUsize::new(0);
    let serializing = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let measuring = AtomicBool::new(false);
    let per_round = w.samples.len();
    std::thread::scope(|s| {
        let serializer = s.spawn(|| -> Result<Vec<f64>, String> {
            let mut times = Vec::new();
            let result = (|| {
                for round in 0..WARMUP_ROUNDS + rounds {
                    while since_last.load(Relaxed) < per_round {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    since_last.store(0, Relaxed);
                    measuring.store(round >= WARMUP_ROUNDS, Relaxed);
                    serializing.store(true, Relaxed);
                    let t = Instant::now();
                    let bytes = target.serialize();
                    let elapsed = t.elapsed();
                    serializing.store(false, Relaxed);
                    if bytes? == 0 {
                        return Err("empty serialization".to_string());
                    }
                    if round >= WARMUP_ROUNDS {
                        times.push(elapsed.as_secs_f64() * 1e3);
                    }
                }
                // The last serialization's "during" window has closed: one more round of idle.
                while since_last.load(Relaxed) < per_round / 2 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(())
            })();
            stop.store(true, Relaxed);
            result.map(|()| times)
        });

        let capacity = per_round * (rounds + 1);
        let (mut idle, mut during) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
        // Sized up front like the others: no reallocation inside a measured loop.
        let (mut idle_running, mut during_running) =
            (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
        let mut failed = 0usize;
        let mut next = 0usize;
        while !stop.load(Relaxed) {
            w.feed(next..next + 1000, |sample| {
                let switches = context_switches();
                let before = serializing.load(Relaxed);
                let t = Instant::now();
                let ok = target.record(sample);
                let ns = t.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32;
                let after = serializing.load(Relaxed);
                let (voluntary, involuntary) = context_switches();
                let preempted = voluntary == switches.0 && involuntary != switches.1;
                failed += usize::from(!ok);
                if measuring.load(Relaxed) {
                    let (all, running) = if before || after {
                        (&mut during, &mut during_running)
                    } else {
                        (&mut idle, &mut idle_running)
                    };
                    all.push(ns);
                    if !preempted {
                        running.push(ns);
                    }
                }
                since_last.fetch_add(1, Relaxed);
            });
            next += 1000;
        }
        let serialize_ms = serializer.join().map_err(|_| "serializer thread panicked")??;
        if failed > 0 {
            return Err(format!("{}: {failed} samples were not recorded", target.name()));
        }
        Ok(RunResult {
            idle_running: Latencies::of(idle_running),
            during_running: Latencies::of(during_running),
            idle: Latencies::of(idle),
            during: Latencies::of(during),
            serialize_ms,
        })
    })
}

struct Summary {
    idle: Latencies,
    during: Latencies,
    idle_running: Latencies,
    during_running: Latencies,
    serialize_ms: f64,
}

/// Medians over runs of each statistic.
fn summarize(runs: &[RunResult]) -> Summary {
    let med = |f: &dyn Fn(&RunResult) -> u32| {
        median(&runs.iter().map(|r| f64::from(f(r))).collect::<Vec<_>>()) as u32
    };
    let pick = |l: fn(&RunResult) -> Latencies| Latencies {
        count: runs.iter().map(|r| l(r).count).sum(),
        p50: med(&|r| l(r).p50),
        p99: med(&|r| l(r).p99),
        p999: med(&|r| l(r).p999),
        max: med(&|r| l(r).max),
    };
    let ser: Vec<f64> = runs.iter().flat_map(|r| r.serialize_ms.iter().copied()).collect();
    Summary {
        idle: pick(|r| r.idle),
        during: pick(|r| r.during),
        idle_running: pick(|r| r.idle_running),
        during_running: pick(|r| r.during_running),
        serialize_ms: median(&ser),
    }
}

fn main() {
    exit_on_error(run());
}

fn run() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let parse = |v: Option<String>, default: usize, name: &str| -> Result<usize, String> {
        v.map_or(Ok(default), |v| v.parse().ok().filter(|&n| n > 0).ok_or(format!("bad {name}")))
    };
    let rounds = parse(take_option(&mut args, "--rounds")?, 6, "--rounds")?;
    let runs = parse(take_option(&mut args, "--runs")?, 3, "--runs")?;
    let [path] = &args[..] else {
        return Err("usage: blocking MEDIUM_WORKLOAD.json [--rounds N] [--runs N]".into());
    };
    let w = Workload::load(&PathBuf::from(path))?;
    let config = Config::new(w.value_types.clone(), MAX_FRAMES).map_err(|e| e.to_string())?;
    eprintln!(
        "loaded {path}: {} samples; {runs} runs of {WARMUP_ROUNDS} + {rounds} rounds each",
        w.samples.len()
    );

    let load_before = ddprof_recorder_bench::loadavg();
    let mut two_slot_runs = Vec::new();
    let mut mutex_runs = Vec::new();
    for run in 0..runs {
        // Fresh targets for every run, alternating which goes first.
        let two_slot = TwoSlot(Recorder::new(config.clone(), Timestamp::now()));
        let mutex = OneMutex {
            config: config.clone(),
            profile: Mutex::new(Profile::new(w.num_values(), Timestamp::now())),
        };
        let order: [(&dyn Target, &mut Vec<RunResult>); 2] = if run % 2 == 0 {
            [(&two_slot, &mut two_slot_runs), (&mutex, &mut mutex_runs)]
        } else {
            [(&mutex, &mut mutex_runs), (&two_slot, &mut two_slot_runs)]
        };
        for (target, results) in order {
            let r = run_once(&w, target, rounds)?;
            eprintln!(
                "  run {}/{runs} {:<20} idle p99.9 {:>8} ns max {:>10} ns | during p99.9 {:>10} ns max {:>10} ns | serialize {:.1} ms",
                run + 1,
                target.name(),
                r.idle.p999,
                r.idle.max,
                r.during.p999,
                r.during.max,
                median(&r.serialize_ms)
            );
            results.push(r);
        }
    }

    let ts = summarize(&two_slot_runs);
    let mx = summarize(&mutex_runs);
    println!(
        "sampler latency per record_sample call, medium workload; median over {runs} runs of {rounds} serializations each"
    );
    println!(
        "{:<20} {:<7} {:<14} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "recorder", "phase", "calls", "p50 ns", "p99 ns", "p99.9 ns", "max ns", "count"
    );
    for (name, s) in [("two-slot recorder", &ts), ("one-mutex baseline", &mx)] {
        for (phase, calls, l) in [
            ("idle", "all", s.idle),
            ("during", "all", s.during),
            ("idle", "not preempted", s.idle_running),
            ("during", "not preempted", s.during_running),
        ] {
            println!(
                "{name:<20} {phase:<7} {calls:<14} {:>10} {:>10} {:>10} {:>12} {:>10}",
                l.p50, l.p99, l.p999, l.max, l.count
            );
        }
    }
    let ratio = |s: &Summary, running: bool| {
        let (during, idle) =
            if running { (s.during_running, s.idle_running) } else { (s.during, s.idle) };
        f64::from(during.max) / f64::from(idle.p999)
    };
    let mutex_over_two_slot = f64::from(mx.during.max) / f64::from(ts.during.max);
    println!(
        "serialize (raw), median ms: two-slot {:.1}, one-mutex {:.1}",
        ts.serialize_ms, mx.serialize_ms
    );
    println!(
        "max during serialization / idle p99.9, all calls: two-slot {:.2}, one-mutex {:.1}",
        ratio(&ts, false),
        ratio(&mx, false)
    );
    println!(
        "max during serialization / idle p99.9, calls not preempted: two-slot {:.2}, one-mutex {:.1}",
        ratio(&ts, true),
        ratio(&mx, true)
    );
    println!("one-mutex max during / two-slot max during (all calls): {mutex_over_two_slot:.1}x");
    let side = |s: &Summary| {
        json!({"idle": s.idle.json(), "during": s.during.json(),
               "idle_not_preempted": s.idle_running.json(),
               "during_not_preempted": s.during_running.json(),
               "serialize_ms_median": round(s.serialize_ms, 2)})
    };
    let json = json!({
        "benchmark": "blocking",
        "workload": w.name,
        "runs": runs,
        "rounds": rounds,
        "two_slot": side(&ts),
        "mutex": side(&mx),
        "two_slot_during_max_over_idle_p999": round(ratio(&ts, false), 3),
        "mutex_during_max_over_idle_p999": round(ratio(&mx, false), 3),
        "two_slot_during_max_over_idle_p999_not_preempted": round(ratio(&ts, true), 3),
        "mutex_during_max_over_idle_p999_not_preempted": round(ratio(&mx, true), 3),
        "mutex_over_two_slot_during_max": round(mutex_over_two_slot, 3),
        "loadavg_before": load_before,
        "loadavg_after": ddprof_recorder_bench::loadavg(),
    });
    println!("{json}");
    Ok(())
}
