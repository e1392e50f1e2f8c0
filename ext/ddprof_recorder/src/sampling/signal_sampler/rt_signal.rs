//! The sampling signal: which one (the first free real-time signal, [`install`]ed once), what
//! it carries (a slot's index and generation, [`signal_value`]), sending it to one thread
//! ([`send`]), and keeping it from a thread ([`BlockedHere`], [`blocks_signal`]).
use std::sync::atomic::{AtomicI32, Ordering::Acquire, Ordering::Release};

use super::handler::on_signal;

/// Set in a wall tick's signal value: the tick is a sample, with no draw.
pub(super) const KICK_BIT: usize = 1 << 15;
/// The slot index in a signal value.
pub(super) const INDEX_MASK: usize = KICK_BIT - 1;
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
    // glibc keeps the first real-time signals for itself (SIGRTMIN() is past them); others
    // (threading libraries, runtimes) often take the first few of the rest.
    let first = libc::SIGRTMIN() + 8;
    for signo in first..=libc::SIGRTMAX() {
        // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only reads.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `signo` is a valid signal number (between SIGRTMIN and SIGRTMAX).
        if unsafe { libc::sigaction(signo, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.sa_sigaction != libc::SIG_DFL {
            continue; // somebody's (or ignored): leave it alone
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
        SIGNO.store(signo, Release);
        return Ok(signo);
    }
    Err(format!(
        "every real-time signal from {} to SIGRTMAX already has a handler: none is free for sampling (start with signals: false)",
        signal_name(first)
    ))
}

/// Queues `signo` with `value` to thread `tid` of process `pid` (`rt_tgsigqueueinfo`, what
/// `pthread_sigqueue` calls, for a thread known by its Linux id).
pub(super) fn send(pid: i32, tid: i32, signo: i32, value: usize) -> bool {
    // SAFETY: a zeroed siginfo_t is valid; the fields the kernel copies for SI_QUEUE (signo,
    // code, pid, uid, value) are set below, at the offsets of Linux's `struct siginfo`
    // (`_sifields._rt`: pid, uid, then the sigval, after the three ints).
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        info.si_signo = signo;
        info.si_code = libc::SI_QUEUE;
        let fields = (&mut info as *mut libc::siginfo_t).cast::<u8>().add(SIFIELDS_OFFSET);
        fields.cast::<libc::pid_t>().write(pid);
        fields.add(4).cast::<libc::uid_t>().write(libc::getuid());
        fields.add(8).cast::<usize>().write(value);
        libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, signo, &info) == 0
    }
}

/// Where `_sifields` starts in Linux's `siginfo_t` on 64-bit targets: after `si_signo`,
/// `si_errno`, `si_code` and padding to 8 bytes.
const SIFIELDS_OFFSET: usize = 16;

/// Keeps the sampling signal from the calling thread while it lives (a tick that comes
/// meanwhile waits, and is delivered when it is dropped): for the profiler's own measurements.
pub struct BlockedHere(Option<libc::sigset_t>, std::marker::PhantomData<*const ()>);

impl BlockedHere {
    pub fn new() -> Self {
        let signo = SIGNO.load(Acquire);
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
