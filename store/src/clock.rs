//! The controller's clocks: monotonic and wall-clock time, injectable
//! (C12.1), shared by the runtime and the managed terminals.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock and monotonic time for the controller (C12.1: injectable).
pub trait Clock: Send + Sync {
    /// Monotonic now.
    fn now(&self) -> Instant;
    /// Wall-clock milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}
