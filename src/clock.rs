//! Where time comes from.
//!
//! Every algorithm takes `now` as an argument; the memory store asks a
//! [`Clock`] for it, and the Redis stores ask Redis (`TIME`), so app-server
//! clock skew cannot hand out tokens. Tests swap in a [`ManualClock`].
//!
//! ```
//! use ratewatch::clock::{Clock, ManualClock};
//! let clock = ManualClock::new(1_000_000);
//! clock.advance_us(500);
//! assert_eq!(clock.now_us(), 1_000_500);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch: the unit of time of every algorithm.
pub type Micros = u64;

/// One million: microseconds per second.
pub const MICROS_PER_SEC: u64 = 1_000_000;

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now_us(&self) -> Micros;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
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
