//! The clocks the sampler reads, each in its own file:
//!
//! - this file: any `clock_gettime` clock in ns ([`clock_ns`]) and the monotonic clock
//!   ([`monotonic_ns`]), the one every timestamp of the sampler is on;
//! - [`thread_cpu`]: a thread's CPU clock, the calling thread's or any thread's of this process
//!   by its Linux id;
//! - [`tsc`]: the GVL hook's clock, the CPU's time-stamp counter where the kernel keeps time
//!   with it (ticks, turned into ns only when read);
//!
//! `Profiler::NativeClock` gives them to the Ruby sampler (registered in `ruby_api::profiler`).
//! Nothing here uses the rest of `sampling`: every other part reads its clocks from here.

pub mod thread_cpu;
pub mod tsc;

/// `clock`'s reading in nanoseconds, or None if the clock cannot be read (a dead thread's).
pub fn clock_ns(clock: libc::clockid_t) -> Option<i64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call; clock_gettime only
    // writes into it and reports a bad or dead clock id through its return value.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return None;
    }
    // `time_t` and `c_long` are i64 here but i32 on 32-bit Linux targets.
    #[allow(clippy::useless_conversion)]
    let (sec, nsec) = (i64::from(ts.tv_sec), i64::from(ts.tv_nsec));
    sec.checked_mul(1_000_000_000)?.checked_add(nsec)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of Ruby's `Process.clock_gettime(
/// Process::CLOCK_MONOTONIC, :nanosecond)`, which the Ruby side compares with.
pub fn monotonic_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// `Profiler::NativeClock.now_ns`: the monotonic clock, in ns.
pub(crate) fn native_now_ns(ruby: &magnus::Ruby) -> Result<i64, magnus::Error> {
    crate::recorder::errors::entry(ruby, || Ok(monotonic_ns()))
}
