//! Where time comes from.
//!
//! Every algorithm takes `now` as an argument; the memory store, the local
//! fallback and the circuit breakers ask a [`Clock`] for it, and the Redis
//! stores ask Redis (`TIME`), so app-server clock skew cannot hand out
//! tokens. Tests swap in a [`ManualClock`].
//!
//! [`SystemClock`] reads the wall clock once, at its first use in the
//! process, and from then on adds the time elapsed on the monotonic clock:
//! an NTP step or a hand-set date never moves it backwards (which would
//! reopen windows) nor forwards by a jump (which would refill buckets or
//! end a breaker's cooldown early). The price is that a long-lived process
//! does not follow a wall-clock step: its windows stay aligned to the
//! clock it started with, slewed at the rate NTP slews the monotonic clock.
//!
//! ```
//! use ratewatch::clock::{Clock, ManualClock};
//! let clock = ManualClock::new(1_000_000);
//! clock.advance_us(500);
//! assert_eq!(clock.now_us(), 1_000_500);
//! ```

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch: the unit of time of every algorithm.
pub type Micros = u64;

/// One million: microseconds per second.
pub const MICROS_PER_SEC: u64 = 1_000_000;

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now_us(&self) -> Micros;
}

/// The system clock, monotonic: the wall-clock time of its first use in the
/// process plus the monotonic time elapsed since. It never runs backwards.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// The wall clock now, in µs since the epoch (0 before the epoch).
fn wall_now_us() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as Micros)
        .unwrap_or(0)
}

/// The wall-clock reading and the monotonic instant it was taken at, shared
/// by every `SystemClock` of the process so they all agree.
fn anchor() -> &'static (Micros, Instant) {
    static ANCHOR: OnceLock<(Micros, Instant)> = OnceLock::new();
    ANCHOR.get_or_init(|| (wall_now_us(), Instant::now()))
}

impl Clock for SystemClock {
    fn now_us(&self) -> Micros {
        let (wall, at) = anchor();
        wall + at.elapsed().as_micros() as Micros
    }
}

/// A clock that moves only when told to; cheap to clone, clones share time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `now_us`.
    pub fn new(now_us: Micros) -> Self {
        Self(Arc::new(AtomicU64::new(now_us)))
    }

    /// Moves the clock forward by `us` microseconds.
    pub fn advance_us(&self, us: u64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }

    /// Moves the clock forward by a duration.
    pub fn advance(&self, d: std::time::Duration) {
        self.advance_us(d.as_micros() as u64);
    }

    /// Sets the clock to `now_us`.
    pub fn set_us(&self, now_us: Micros) {
        self.0.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_starts_at_the_wall_clock_and_never_runs_backwards() {
        let first = SystemClock.now_us();
        assert!(first.abs_diff(wall_now_us()) < 60 * MICROS_PER_SEC);
        let mut last = first;
        for _ in 0..10_000 {
            let now = SystemClock.now_us();
            assert!(now >= last, "{now} after {last}");
            last = now;
        }
    }
}
