//! The sampling signal: which one (the first free real-time signal, [`install`]ed once, or
//! another when the program takes it, [`move_to_free`]), what a CPU timer's carries (a slot's
//! index and generation, [`signal_value`]) and a perf event's (its descriptor, [`poll_fd`]),
//! whether our handler is still the one installed ([`still_ours`]), and keeping it from a
//! thread ([`BlockedHere`], [`blocks_signal`], [`drain_pending`]).
use std::sync::atomic::{AtomicI32, Ordering::Acquire, Ordering::Release};

use super::handler::on_signal;

/// The slot index in a signal value.
pub(super) const INDEX_MASK: usize = (1 << 16) - 1;
/// The signal number in use (0: the handler is not installed yet).
pub(super) static SIGNO: AtomicI32 = AtomicI32::new(0);

/// What the timer's signal carries: the slot's index and generation.
pub(super) fn signal_value(index: usize, generation: u32) -> usize {
    index | ((generation as usize & 0xff_ffff) << 16)
}

/// The signal in use, or 0 if none was installed yet.
pub fn signal() -> i32 {
    SIGNO.load(Acquire)
}

/// The signal's name, e.g. `SIGRTMIN+8`.
pub fn signal_name(signo: i32) -> String {
    let base = libc::SIGRTMIN();
    if signo >= base {
        format!("SIGRTMIN+{}", signo - base)
    } else {
        format!("signal {signo}")
    }
}

/// The first free real-time signal, with our handler installed on it (or the one installed
/// already).
pub(super) fn install() -> Result<i32, String> {
    let installed = SIGNO.load(Acquire);
    if installed != 0 {
        return Ok(installed);
    }
    let signo = install_free(0)?;
    SIGNO.store(signo, Release);
    Ok(signo)
}

/// Installs our handler on the first free real-time signal other than `taken` and the one in
/// use, and makes it the one in use; the old one keeps our handler (a tick of it already
/// queued still finds it) until the program's replaces it. Returns the new signal.
pub(super) fn move_to_free(taken: i32) -> Result<i32, String> {
    let signo = install_free(taken)?;
    SIGNO.store(signo, Release);
    Ok(signo)
}

/// The first real-time signal from SIGRTMIN+8 whose action is the default, but `except`, with
/// our handler installed on it.
fn install_free(except: i32) -> Result<i32, String> {
    // glibc keeps the first real-time signals for itself (SIGRTMIN() is past them); others
    // (threading libraries, runtimes) often take the first few of the rest.
    let first = libc::SIGRTMIN() + 8;
    for signo in first..=libc::SIGRTMAX() {
        if signo == except || installed_action(signo) != Some(libc::SIG_DFL) {
            continue; // somebody's (or ignored, or ours already): leave it alone
        }
        // SAFETY: zeroed, then every field we rely on set; `on_signal` has the SA_SIGINFO
        // signature and never unwinds.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: `sa_mask` is a valid sigset_t to fill.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: valid action; no old action wanted.
        if unsafe { libc::sigaction(signo, &action, std::ptr::null_mut()) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "could not install the sampling signal handler on {}: {e}",
                signal_name(signo)
            ));
        }
        return Ok(signo);
    }
    Err(format!(
        "every real-time signal from {} to SIGRTMAX already has a handler: none is free for sampling (start with signals: false)",
        signal_name(first)
    ))
}

/// The handler (or SIG_DFL, SIG_IGN) installed on `signo` now.
fn installed_action(signo: i32) -> Option<libc::sighandler_t> {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only reads.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `signo` is a valid signal number or the call fails.
    (unsafe { libc::sigaction(signo, std::ptr::null(), &mut old) } == 0).then_some(old.sa_sigaction)
}

/// Whether our handler is still the one installed on the signal in use (true if none is in
/// use): a program's `trap` or a C extension's `sigaction` replaces it.
pub(super) fn still_ours() -> bool {
    let signo = SIGNO.load(Acquire);
    signo == 0 || installed_action(signo) == Some(on_signal as *const () as usize)
}

/// The descriptor a perf event's signal came from (`si_fd` of `F_SETSIG`'s `siginfo`: after
/// `si_band`, a long, in `_sifields._sigpoll`).
///
/// # Safety
///
/// `info` is the siginfo the kernel passed for a signal whose `si_code` is a `POLL_*` band.
pub(super) unsafe fn poll_fd(info: *const libc::siginfo_t) -> i32 {
    // SAFETY: as the caller promises, `_sigpoll` is the live member of `_sifields`.
    unsafe { info.cast::<u8>().add(SIFIELDS_OFFSET + 8).cast::<i32>().read() }
}

/// Takes every signal `signo` pending for the calling thread or the process (`sigtimedwait`
/// with no wait), which the caller blocks; returns how many. Before an `exec`: a pending
/// real-time signal survives `execve`, whose new image has the default action for it (ends
/// the process).
pub(super) fn drain_pending(signo: i32) -> u64 {
    let mut drained = 0;
    // SAFETY: sigset_t is plain data filled by sigemptyset/sigaddset; sigtimedwait with a zero
    // timeout takes one pending signal of the set or fails with EAGAIN at once.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signo);
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        while libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == signo {
            drained += 1;
        }
    }
    drained
}

/// Where `_sifields` starts in Linux's `siginfo_t` on 64-bit targets: after `si_signo`,
/// `si_errno`, `si_code` and padding to 8 bytes.
const SIFIELDS_OFFSET: usize = 16;

/// Keeps the sampling signal from the calling thread while it lives (a tick that comes
/// meanwhile waits, and is delivered when it is dropped): for the profiler's own measurements.
pub struct BlockedHere(Option<libc::sigset_t>, std::marker::PhantomData<*const ()>);

impl BlockedHere {
    pub fn new() -> Self {
        Self::signal(SIGNO.load(Acquire))
    }

    /// Keeps `signo` (0: none) from the calling thread while it lives.
    pub(super) fn signal(signo: i32) -> Self {
        if signo == 0 {
            return Self(None, std::marker::PhantomData);
        }
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset fill it; pthread_sigmask only
        // changes the calling thread's mask and writes the old one into `old`.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signo);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return Self(None, std::marker::PhantomData);
            }
            Self(Some(old), std::marker::PhantomData)
        }
    }
}

impl Drop for BlockedHere {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: restores the mask saved in `new`, on the same thread (the PhantomData
            // raw pointer keeps it from being sent to another).
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        }
    }
}

/// Whether thread `tid` blocks `signo` (its `SigBlk` in `/proc/self/task/<tid>/status`).
pub(super) fn blocks_signal(tid: i32, signo: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigBlk:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| signo >= 1 && mask & (1 << (signo - 1)) != 0)
}
