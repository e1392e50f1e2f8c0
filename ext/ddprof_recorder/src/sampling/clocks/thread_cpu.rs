//! The native half of `DdprofRecorder::Profiler` (lib/ddprof_recorder/profiler.rb): reading
//! how much CPU time one thread of this process has used, from the kernel's per-thread CPU
//! clock, given the thread's Linux id (`Thread#native_thread_id`).
//!
//! `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` only answers for the calling thread, and the
//! profiler's sampler thread wants the clocks of the threads it samples. Linux encodes "the
//! CPU clock of thread `tid`" as a clock id (`MAKE_THREAD_CPUCLOCK` in the kernel's
//! `posix-timers.h`): `((!tid) << 3) | CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED`. The kernel
//! answers only for threads of the calling process (`EINVAL` otherwise), so a thread id that
//! was reused by another process cannot be read by mistake. The calling thread's own id is
//! [`own_tid`] (cached per thread and fork generation).
use std::cell::Cell;

use magnus::{Error, RArray, Ruby};

use super::clock_ns;

thread_local! {
    /// This thread's Linux id, read once per process (`gettid` is a system call), with the
    /// fork generation it was read in: the thread that forks has a new id in the child.
    static TID: Cell<(u64, i32)> = const { Cell::new((u64::MAX, 0)) };
}

/// Per-thread clock (as opposed to the whole thread group's).
#[cfg(target_os = "linux")]
const CPUCLOCK_PERTHREAD_MASK: libc::clockid_t = 4;
/// Scheduler CPU time (user + system, ns resolution), what `CLOCK_THREAD_CPUTIME_ID` reads.
#[cfg(target_os = "linux")]
const CPUCLOCK_SCHED: libc::clockid_t = 2;

/// `Profiler._native_thread_cpu_time_ns(tid)`: the CPU time in nanoseconds that the thread
/// with Linux id `tid` has used since it started, or nil when it cannot be read (the thread
/// exited, `tid` is nil or not a thread of this process, or not on Linux).
pub fn native_thread_cpu_time_ns(ruby: &Ruby, tid: Option<i64>) -> Result<Option<i64>, Error> {
    crate::recorder::errors::entry(ruby, || Ok(thread_cpu_time_ns(tid)))
}

/// The CPU time of the thread with Linux id `tid`, if it can be read.
fn thread_cpu_time_ns(tid: Option<i64>) -> Option<i64> {
    cpu_time_ns(i32::try_from(tid?).ok()?)
}

/// `Profiler::NativeClock.moved(tids, seen)`: the indices `i` where the CPU clock of the
/// thread with Linux id `tids[i]` does not read `seen[i]` (a nil id, a nil reading, or a
/// thread that cannot be read counts as moved): the sampler's idle scan, one call a pass
/// rather than one per thread.
pub fn native_moved_threads(ruby: &Ruby, tids: RArray, seen: RArray) -> Result<RArray, Error> {
    crate::recorder::errors::entry(ruby, || {
        let moved = ruby.ary_new();
        for i in 0..tids.len() {
            let tid: Option<i64> = tids.entry(i as isize)?;
            let before: Option<i64> = seen.entry(i as isize)?;
            let now = tid.and_then(|tid| thread_cpu_time_ns(Some(tid)));
            if now.is_none() || now != before {
                moved.push(i)?;
            }
        }
        Ok(moved)
    })
}

/// The calling thread's CPU clock, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, a vDSO read).
pub fn own_cpu_ns() -> i64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// `Profiler._native_current_thread_cpu_time_ns`: the calling thread's CPU clock.
pub fn native_current_thread_cpu_time_ns(ruby: &Ruby) -> Result<i64, Error> {
    crate::recorder::errors::entry(ruby, || Ok(own_cpu_ns()))
}

/// The calling thread's Linux id (cached per thread and fork generation).
pub fn own_tid() -> i32 {
    let generation = crate::recorder::fork::fork_generation();
    TID.with(|cached| {
        let (read_in, tid) = cached.get();
        if read_in == generation {
            return tid;
        }
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::gettid() };
        cached.set((generation, tid));
        tid
    })
}

/// CPU time of thread `tid` of this process, in nanoseconds.
#[cfg(target_os = "linux")]
pub fn cpu_time_ns(tid: libc::pid_t) -> Option<i64> {
    // 0 and negative ids would name the calling process or garbage, not a thread.
    if tid <= 0 {
        return None;
    }
    clock_ns(cpu_clock_id(tid))
}

/// The clock id of the CPU clock of thread `tid` (see the module doc), for `clock_gettime`
/// and `timer_create`.
#[cfg(target_os = "linux")]
pub fn cpu_clock_id(tid: libc::pid_t) -> libc::clockid_t {
    ((!tid) << 3) | CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED
}

#[cfg(not(target_os = "linux"))]
pub fn cpu_time_ns(_tid: i32) -> Option<i64> {
    None
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn gettid() -> libc::pid_t {
        // SAFETY: gettid has no preconditions and cannot fail.
        unsafe { libc::gettid() }
    }

    fn own_clock_ns() -> i64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: as above, `ts` is valid and writable.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    }

    #[test]
    fn reads_the_calling_threads_clock_by_its_id() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let before = own_clock_ns();
        let by_tid = cpu_time_ns(gettid()).unwrap();
        let after = own_clock_ns();
        assert!(before <= by_tid && by_tid <= after, "{before} <= {by_tid} <= {after}");
    }

    #[test]
    fn reads_another_threads_clock_and_not_after_it_exits() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            // Spin on its own CPU clock, so that a busy machine cannot make it use less.
            while own_clock_ns() < 30_000_000 {
                std::hint::black_box(own_clock_ns());
            }
            tx.send(gettid()).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        let used = cpu_time_ns(tid).unwrap();
        assert!(used >= 30_000_000, "the worker spun 30 ms of CPU, clock says {used} ns");
        done_tx.send(()).unwrap();
        worker.join().unwrap();
        // `join` returns once the thread cleared its tid (`CLONE_CHILD_CLEARTID`), a moment
        // before the kernel releases the task, whose clock can be read until then.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while cpu_time_ns(tid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(cpu_time_ns(tid), None);
    }

    #[test]
    fn rejects_ids_that_are_not_threads() {
        assert_eq!(cpu_time_ns(0), None);
        assert_eq!(cpu_time_ns(-5), None);
        assert_eq!(thread_cpu_time_ns(None), None);
        assert_eq!(thread_cpu_time_ns(Some(i64::MAX)), None);
        // pid 1 is not a thread of this process.
        assert_eq!(cpu_time_ns(1), None);
    }
}
