//! A plain native thread that Ruby threads start and stop with the GVL held: the sampling
//! trigger (`trigger`) and the allocation hook's duty cycle (`duty_cycle`). It holds no Ruby
//! object and never takes the GVL.
//!
//! It does not survive `fork`: in a child, the parent's thread does not exist, so its handle
//! is forgotten, never joined (joining would wait for ever). Before the VM is torn down the
//! thread must be gone: the end procs that call [`NativeThread::stop`] see to that.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

struct Running {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    /// The fork generation it was started in: in a forked child the thread does not exist.
    fork_generation: u64,
}

/// How [`NativeThread::stop`] found the thread.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// None was running.
    None,
    /// It was told to stop and has ended.
    Joined,
    /// It was the parent's, in a forked child: forgotten.
    Forgotten,
}

/// One thread at a time. Touched only by Ruby threads holding the GVL (start, stop, end
/// procs), so its lock is never contended.
pub struct NativeThread {
    running: Mutex<Option<Running>>,
}

impl NativeThread {
    pub const fn new() -> Self {
        Self { running: Mutex::new(None) }
    }

    fn running(&self) -> MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts `body` on a thread named `name` (stopping the one running first). `body` must
    /// return soon after its flag is set; it is unparked then.
    pub fn start<F>(&self, name: &str, body: F) -> std::io::Result<()>
    where
        F: FnOnce(&AtomicBool) + Send + 'static,
    {
        self.stop();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new().name(name.into()).spawn(move || body(&flag))?;
        *self.running() = Some(Running {
            stop,
            handle,
            fork_generation: crate::recorder::fork::fork_generation(),
        });
        Ok(())
    }

    /// Stops the thread and waits for it to end (it is woken at once).
    pub fn stop(&self) -> Stopped {
        let Some(running) = self.running().take() else { return Stopped::None };
        if running.fork_generation != crate::recorder::fork::fork_generation() {
            std::mem::forget(running.handle);
            return Stopped::Forgotten;
        }
        running.stop.store(true, Ordering::Release);
        running.handle.thread().unpark();
        let _ = running.handle.join();
        Stopped::Joined
    }

    /// Whether a thread started in this process runs.
    pub fn is_running(&self) -> bool {
        self.running()
            .as_ref()
            .is_some_and(|r| r.fork_generation == crate::recorder::fork::fork_generation())
    }
}
