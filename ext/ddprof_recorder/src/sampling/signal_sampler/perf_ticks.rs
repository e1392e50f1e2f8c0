//! Perf-event ticks (`signal_sampler`, "Perf-event ticks"): a `perf_event_open` software event
//! on one thread's CPU clock, whose overflows signal that thread. Opening, pointing its signal,
//! re-enabling it after each tick, closing. Linux only; everything here is a system call or two.
//!
//! The event is `PERF_COUNT_SW_CPU_CLOCK` for one thread (`pid` = its id, `cpu` = -1), with a
//! period of `1/hz` of its CPU and `exclude_kernel`: the kernel's hrtimer for the event runs
//! while the thread is on a CPU, and an expiry that interrupts kernel mode is no overflow
//! (`perf_swevent_hrtimer` in Linux's `kernel/events/core.c` checks `perf_exclude_event` on
//! the interrupted registers), so an overflow always interrupts user mode. Its file descriptor
//! has `O_ASYNC`, `F_SETSIG` (our signal) and `F_SETOWN_EX` (`F_OWNER_TID`: that thread only),
//! as async-profiler sets its own. The overflow queues the signal from the interrupt's
//! `irq_work`, which runs before the thread executes another user instruction, so the signal
//! is delivered on that return to user mode: never inside a system call, as with CPU-clock
//! timers, but at `hz`, past the kernel's scheduler tick.
//!
//! Each event is limited to one overflow (`PERF_EVENT_IOC_REFRESH` 1): it disables itself at
//! the overflow that signals, and the handler enables it again ([`refresh`]). So a thread
//! that blocks the signal has at most one of ours pending (two after the signal moved, whose
//! refresh may find the event still enabled and adds one to its limit), never a queue that
//! reaches `RLIMIT_SIGPENDING` (past which `send_sigio` sends a plain `SIGIO` instead, whose
//! default action ends the process).
//!
//! `remove_on_exec` (Linux 5.13+; retried without it before) and `PERF_FLAG_FD_CLOEXEC`: an
//! `exec` the profiler did not see (a C extension's `execve`) keeps no event.
//!
//! Where the kernel refuses (`perf_event_paranoid` 3 on Debian's kernels for a user without
//! `CAP_PERFMON`, a seccomp filter, a container's policy), [`probe`] says why at the start, and
//! the run uses CPU-clock timers only.
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set by `Profiler::Testing.refuse_perf_events` only: [`probe`] then fails, as where the
/// kernel refuses.
pub static REFUSED_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// `PERF_TYPE_SOFTWARE`, `PERF_COUNT_SW_CPU_CLOCK` (Linux's `include/uapi/linux/perf_event.h`).
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// `perf_event_attr`'s flag bits that we set.
const DISABLED: u64 = 1 << 0;
const EXCLUDE_KERNEL: u64 = 1 << 5;
const EXCLUDE_HV: u64 = 1 << 6;
const REMOVE_ON_EXEC: u64 = 1 << 36;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// `_IO('$', 2)`: adds to the event's overflow limit and enables it.
const PERF_EVENT_IOC_REFRESH: libc::c_ulong = 0x2402;
/// `_IOW('$', 4, __u64)`.
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
/// `fcntl` commands and `f_owner_ex` types (Linux's `include/uapi/asm-generic/fcntl.h`).
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

/// The first 64 bytes of `perf_event_attr` (`PERF_ATTR_SIZE_VER0`): every field we set.
#[repr(C)]
struct Attr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

#[repr(C)]
struct OwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// Opens the event for thread `tid` of this process, its first overflow after `first_ns` of
/// the thread's user-mode CPU signalling `signo` to it (the handler then sets the period,
/// [`set_period`]); disabled until the first [`refresh`].
///
/// # Errors
///
/// The `errno` of the call the kernel refused.
pub(super) fn open(tid: i32, first_ns: u64, signo: i32) -> Result<i32, std::io::Error> {
    let mut attr =
        cpu_clock_attr(first_ns, DISABLED | EXCLUDE_KERNEL | EXCLUDE_HV | REMOVE_ON_EXEC);
    let mut fd = open_attr(&attr, tid);
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        attr.flags &= !REMOVE_ON_EXEC; // before Linux 5.13
        fd = open_attr(&attr, tid);
    }
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let owner = OwnerEx { kind: F_OWNER_TID, pid: tid };
    // SAFETY: fcntl and ioctl on the descriptor just opened, with valid arguments (`owner`
    // lives through the call).
    let ok = unsafe {
        libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC) == 0
            && libc::fcntl(fd, F_SETSIG, signo) == 0
            && libc::fcntl(fd, F_SETOWN_EX, &owner as *const OwnerEx as *const c_void) == 0
    };
    if !ok {
        let e = std::io::Error::last_os_error();
        close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// The software cpu-clock event that overflows every `period_ns`, with `flags`.
fn cpu_clock_attr(period_ns: u64, flags: u64) -> Attr {
    Attr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<Attr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_period: period_ns.max(1),
        sample_type: 0,
        read_format: 0,
        flags,
        wakeup_events: 1,
        bp_type: 0,
        config1: 0,
    }
}

fn open_attr(attr: &Attr, tid: i32) -> i32 {
    // SAFETY: `attr` is a valid perf_event_attr of the size it says; pid/cpu/group/flags are
    // plain integers. The kernel reads the struct and returns a new descriptor or -1.
    unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const Attr,
            tid,
            -1i32,
            -1i32,
            PERF_FLAG_FD_CLOEXEC,
        ) as i32
    }
}

/// Enables the event again for one overflow: the handler's, at each of its ticks.
/// Async-signal-safe (one `ioctl`).
pub(super) fn refresh(fd: i32) {
    // SAFETY: an ioctl on a descriptor number; a stale one fails harmlessly (ENOTTY, EBADF).
    unsafe { libc::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) };
}

/// Sets the event's period to `period_ns` of CPU, from now (Linux 3.14 on; before, from its
/// next overflow). Async-signal-safe (one `ioctl`).
pub(super) fn set_period(fd: i32, period_ns: u64) {
    let period = period_ns.max(1);
    // SAFETY: an ioctl that reads one u64 from a live local; a stale descriptor fails
    // harmlessly.
    unsafe { libc::ioctl(fd, PERF_EVENT_IOC_PERIOD, &period as *const u64) };
}

/// Points the event's signal at `signo` (the signal moved, `signal_sampler`, "Our signal").
pub(super) fn retarget(fd: i32, signo: i32) -> bool {
    // SAFETY: fcntl on a descriptor number with an integer argument.
    unsafe { libc::fcntl(fd, F_SETSIG, signo) == 0 }
}

pub(super) fn close(fd: i32) {
    // SAFETY: closes a descriptor this module opened (callers check [`is_event`] where the
    // number may have been reused).
    unsafe { libc::close(fd) };
}

/// Whether descriptor `fd` is a perf event (its `/proc/self/fd` link): a forked child closes
/// its copies of the parent's events only after this check.
pub(super) fn is_event(fd: i32) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|target| target.to_string_lossy() == "anon_inode:[perf_event]")
}

/// Whether this process may open the events: one opened for the calling thread (not
/// enabled), then closed. The error says why not.
pub(super) fn probe(hz: u32) -> Result<(), String> {
    if REFUSED_FOR_TESTS.load(Relaxed) {
        return Err("perf_event_open refused (Profiler::Testing.refuse_perf_events)".into());
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let period_ns = 1_000_000_000 / u64::from(hz.max(1));
    let fd = open_attr(&cpu_clock_attr(period_ns, DISABLED | EXCLUDE_KERNEL | EXCLUDE_HV), tid);
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(format!("perf_event_open refused: {e} (perf_event_paranoid {paranoid})"));
    }
    close(fd);
    Ok(())
}
