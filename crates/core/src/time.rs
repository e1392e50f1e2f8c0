use std::time::{SystemTime, UNIX_EPOCH};

/// A wall-clock instant (CLOCK_REALTIME), as seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    pub fn now() -> Self {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => Self { secs: d.as_secs() as i64, nanos: d.subsec_nanos() },
            // A clock set before 1970: report the epoch rather than fail a serialization.
            Err(_) => Self::default(),
        }
    }

    /// Nanoseconds since the epoch, saturating (pprof's `time_nanos` is an int64).
    pub fn unix_nanos(self) -> i64 {
        self.secs.saturating_mul(1_000_000_000).saturating_add(i64::from(self.nanos))
    }

    /// `self - earlier` in nanoseconds, never negative (the wall clock can step back).
    pub fn nanos_since(self, earlier: Timestamp) -> i64 {
        self.unix_nanos().saturating_sub(earlier.unix_nanos()).max(0)
    }
}
