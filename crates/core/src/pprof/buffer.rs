//! The capacity of output buffers: how a serialization's bytes are held so that glibc hands
//! their memory back to the kernel once they are freed.

use std::io::Write;

/// From this size up, output buffers get an mmapped capacity, see [`output_capacity`].
pub const LARGE_OUTPUT: usize = 4 * 1024 * 1024;

/// Capacity to allocate for an output buffer of `len` bytes: `len` itself, or, from
/// [`LARGE_OUTPUT`] (4 MiB) up, at least 32 MiB and a page.
///
/// Why: freeing a mapped block under 32 MiB raises glibc's mmap threshold, after which each
/// window's pprof came from the heap and up to twice its size stayed resident (+36 MiB RSS over
/// 1,000 medium windows); a block of 32 MiB or more is always mapped, and unmapped when freed.
/// The capacity past `len` is never written, so never resident. The measurements and the
/// reasons for 4 MiB: docs/reliability.md, "Figures" (the medium soak).
pub fn output_capacity(len: usize) -> usize {
    /// Above glibc's `DEFAULT_MMAP_THRESHOLD_MAX` (32 MiB on 64-bit), with room for its header.
    const ALWAYS_MMAPPED: usize = 32 * 1024 * 1024 + 4096;
    if len < LARGE_OUTPUT {
        len
    } else {
        len.max(ALWAYS_MMAPPED)
    }
}

/// Gives `bytes` the capacity [`output_capacity`] asks for: only what is used, or, for a large
/// buffer, a capacity that keeps it mmapped.
pub(super) fn fit(bytes: &mut Vec<u8>) {
    let capacity = output_capacity(bytes.len());
    if capacity > bytes.capacity() {
        bytes.reserve_exact(capacity - bytes.len());
    } else {
        bytes.shrink_to(capacity);
    }
}

/// A buffer of unknown final size (the gzip encoder's output), grown by a quarter at a time
/// rather than doubled, so that at most a fifth of it is spare at the peak (large buffers are
/// grown in place by `mremap`, so the smaller steps cost no copying).
pub(super) struct GrowByQuarter {
    pub(super) bytes: Vec<u8>,
    /// The smallest step.
    pub(super) min_step: usize,
}

impl Write for GrowByQuarter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let spare = self.bytes.capacity() - self.bytes.len();
        if spare < bytes.len() {
            let step = (self.bytes.capacity() / 4).max(self.min_step).max(bytes.len());
            self.bytes.reserve_exact(step);
        }
        self.bytes.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_capacity_keeps_large_buffers_above_glibcs_dynamic_mmap_threshold() {
        assert_eq!(output_capacity(0), 0);
        assert_eq!(output_capacity(LARGE_OUTPUT - 1), LARGE_OUTPUT - 1);
        assert!(output_capacity(LARGE_OUTPUT) > 32 << 20);
        assert!(output_capacity(18 << 20) > 32 << 20);
        assert_eq!(output_capacity(200 << 20), 200 << 20);
    }
}
