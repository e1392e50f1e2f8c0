//! `Profiler._native_sampling_stats`: what each part of the sampler counted, in one Hash for
//! `Profiler#stats` (the signal handler's own under `:signals`).
use std::sync::atomic::Ordering;

use magnus::{Error, RHash, Ruby};

use crate::recorder::errors::entry;
use crate::sampling::{job, ruby_handler, signal_sampler, trigger};

pub(crate) fn native_sampling_stats(ruby: &Ruby) -> Result<RHash, Error> {
    entry(ruby, || {
        let hash = ruby.hash_new();
        hash.aset(ruby.to_symbol("ticks"), trigger::TICKS.load(Ordering::Relaxed))?;
        hash.aset(
            ruby.to_symbol("quiet_stretches"),
            trigger::QUIET_STRETCHES.load(Ordering::Relaxed),
        )?;
        hash.aset(ruby.to_symbol("jobs"), ruby_handler::JOBS.load(Ordering::Relaxed))?;
        hash.aset(ruby.to_symbol("late_jobs"), job::LATE_JOBS.load(Ordering::Relaxed))?;
        hash.aset(ruby.to_symbol("trigger_running"), trigger::is_running())?;
        hash.aset(ruby.to_symbol("trigger_cpu_ns"), trigger::thread_cpu_ns())?;
        hash.aset(
            ruby.to_symbol("jobs_deferring_interrupts"),
            crate::sampling::interrupt_mask::DEFERRING.load(Ordering::Relaxed),
        )?;
        hash.aset(
            ruby.to_symbol("interrupt_deferral_refused"),
            crate::sampling::interrupt_mask::REFUSED.load(Ordering::Relaxed),
        )?;
        // The signal handler's own, apart: `Profiler#stats[:signals]`.
        let signals = ruby.hash_new();
        let signo = signal_sampler::signal();
        signals.aset(
            ruby.to_symbol("signal"),
            (signo != 0).then(|| signal_sampler::signal_name(signo)),
        )?;
        for (name, counter) in signal_sampler::COUNTERS.named() {
            signals.aset(ruby.to_symbol(name), counter.load(Ordering::Relaxed))?;
        }
        signals.aset(ruby.to_symbol("threads_armed"), signal_sampler::armed())?;
        signals.aset(ruby.to_symbol("tick_ns"), signal_sampler::tick_ns())?;
        signals.aset(
            ruby.to_symbol("ticks"),
            signal_sampler::ticks_kind().map(|kind| ruby.to_symbol(kind)),
        )?;
        signals.aset(ruby.to_symbol("perf_refused"), signal_sampler::perf_refused())?;
        signals.aset(ruby.to_symbol("signal_taken"), signal_sampler::signal_taken())?;
        hash.aset(ruby.to_symbol("signals"), signals)?;
        hash.aset(ruby.to_symbol("thread_end_hook"), crate::sampling::thread_end::hook_state())?;
        hash.aset(
            ruby.to_symbol("thread_end_hook_on_every_end"),
            crate::vm::THREAD_END_ON_EVERY_END,
        )?;
        hash.aset(
            ruby.to_symbol("thread_ends_seen"),
            crate::sampling::thread_end::ENDS_SEEN.load(Ordering::Relaxed),
        )?;
        hash.aset(
            ruby.to_symbol("thread_exits_seen"),
            crate::sampling::thread_end::EXITS_SEEN.load(Ordering::Relaxed),
        )?;
        hash.aset(
            ruby.to_symbol("thread_ends_dropped"),
            crate::sampling::thread_end::DROPPED.load(Ordering::Relaxed),
        )?;
        hash.aset(
            ruby.to_symbol("gvl_untracked_events"),
            crate::sampling::gvl_events::UNTRACKED.load(Ordering::Relaxed),
        )?;
        Ok(hash)
    })
}
