//! The virtual clock: a monotonic [`Instant`] built from a base instant plus
//! a virtual offset, and a wall clock in milliseconds that normally follows
//! it but can be stepped backwards (an NTP correction), as a real host's can.

use std::time::{Duration, Instant};

/// Monotonic and wall time of one simulated run. Nothing reads the host
/// clock except [`VirtualClock::new`] (once, for the base `Instant`).
#[derive(Clone, Debug)]
pub struct VirtualClock {
    base: Instant,
    mono_ms: u64,
    wall_ms: u64,
}

impl VirtualClock {
    /// A clock at monotonic offset 0 and wall time `wall_ms`.
    pub fn new(wall_ms: u64) -> Self {
        Self {
            base: Instant::now(),
            mono_ms: 0,
            wall_ms,
        }
    }

    /// The monotonic instant.
    pub fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.mono_ms)
    }

    /// Monotonic milliseconds since the start of the run.
    pub const fn mono_ms(&self) -> u64 {
        self.mono_ms
    }

    /// Wall-clock milliseconds (may have stepped backwards).
    pub const fn wall_ms(&self) -> u64 {
        self.wall_ms
    }

    /// Monotonic milliseconds of `at`, rounded up (a timer for `at` fires at
    /// or after it, never before).
    pub fn ms_of(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.base);
        let ms = d.as_millis() as u64;
        if Duration::from_millis(ms) < d {
            ms + 1
        } else {
            ms
        }
    }

    /// Moves both clocks to monotonic time `mono_ms` (never backwards).
    pub fn advance_to(&mut self, mono_ms: u64) {
        if mono_ms > self.mono_ms {
            self.wall_ms += mono_ms - self.mono_ms;
            self.mono_ms = mono_ms;
        }
    }

    /// Steps the wall clock back by `ms` (monotonic time is unaffected).
    pub fn step_wall_back(&mut self, ms: u64) {
        self.wall_ms = self.wall_ms.saturating_sub(ms);
    }
}

#[cfg(test)]
mod tests {
    use super::VirtualClock;

    #[test]
    fn monotonic_never_goes_back_wall_can() {
        let mut c = VirtualClock::new(1_000_000);
        let t0 = c.now();
        c.advance_to(500);
        assert_eq!(c.wall_ms(), 1_000_500);
        c.step_wall_back(2_000);
        assert_eq!(c.wall_ms(), 998_500);
        c.advance_to(100); // earlier: ignored
        assert_eq!(c.mono_ms(), 500);
        assert!(c.now() > t0);
        assert_eq!((c.now() - t0).as_millis(), 500);
        assert_eq!(c.ms_of(t0 + std::time::Duration::from_micros(1_500)), 2);
        assert_eq!(c.ms_of(t0 + std::time::Duration::from_millis(7)), 7);
    }
}
