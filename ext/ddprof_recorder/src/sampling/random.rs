//! The extension's one random generator, xorshift64*: no allocation, no lock, integer
//! arithmetic only. [`Jitter`] draws the trigger's tick intervals and the memory sampler's
//! steps and windows (`memory::allocations`, `memory::duty_cycle`); the signal handler's draw
//! steps a state of its own per thread with [`step`] (`signal_sampler`, "Which CPU ticks are
//! samples"), which is async-signal-safe.
use std::time::Duration;

/// One xorshift64* step: advances `state` (never 0) and returns the next number, uniform over
/// `u64`.
#[inline]
pub fn step(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A xorshift64* generator, seeded from the clock: the ticks' jitter, and the allocation
/// sampler's random steps.
pub struct Jitter(u64);

impl Jitter {
    pub fn new() -> Self {
        Self((crate::sampling::clocks::monotonic_ns() as u64) | 1)
    }

    /// A number uniformly drawn from [0, 1).
    pub fn unit(&mut self) -> f64 {
        (step(&mut self.0) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A duration uniformly drawn from 0.5 to 1.5 times `period`.
    pub fn around(&mut self, period: Duration) -> Duration {
        period.mul_f64(0.5 + self.unit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_a_period_and_averages_one() {
        let mut jitter = Jitter(12345);
        let period = Duration::from_millis(10);
        let draws: Vec<Duration> = (0..10_000).map(|_| jitter.around(period)).collect();
        assert!(draws.iter().all(|d| *d >= period / 2 && *d <= period * 3 / 2));
        let mean = draws.iter().sum::<Duration>() / draws.len() as u32;
        assert!(mean > Duration::from_micros(9_800) && mean < Duration::from_micros(10_200));
    }
}
