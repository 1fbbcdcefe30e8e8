//! Resilience around a store: what happens when Redis is slow or gone.
//!
//! A [`Breaker`] per shard stops calling a shard that keeps failing: after
//! enough failures it opens and refuses every call (the route's failure
//! policy answers instead), lets one probe through once its cooldown has
//! passed, and closes again when the probe succeeds. It is a pure state
//! machine: every method takes `now`, so tests drive it without a clock.
//!
//! On a store that can probe (the Redis stores), [`ShardBreakers`] probe in
//! the background: the half-open probe is a health check on a fresh
//! connection, never a client's request, so recovery takes one cooldown
//! plus one round trip after Redis is back. Requests hold their permits as
//! [`PermitGuard`]s, which give the permit back if the request's future is
//! dropped, times out or panics.
//!
//! ```
//! use std::time::Duration;
//! use ratewatch::policy::BreakerSettings;
//! use ratewatch::resilience::{Breaker, BreakerState, TripReason};
//!
//! let settings = BreakerSettings { failures: 2, open: Duration::from_secs(1), ..Default::default() };
//! let mut breaker = Breaker::new(settings);
//! let now = 1_000_000;
//! for _ in 0..2 {
//!     let permit = breaker.acquire(now).unwrap();
//!     if let Some(trip) = breaker.on_failure(permit, now) {
//!         assert_eq!(trip.reason, TripReason::ConsecutiveFailures(2));
//!     }
//! }
//! assert_eq!(breaker.state(), BreakerState::Open);
//! assert!(breaker.acquire(now + 999_999).is_err());
//! let probe = breaker.acquire(now + 1_000_000).unwrap();
//! assert!(probe.is_probe());
//! breaker.on_success(probe, now + 1_000_100);
//! assert_eq!(breaker.state(), BreakerState::Closed);
//! ```

mod breaker;
mod log_gate;
mod permit;
mod probe;
mod shards;

pub use breaker::{Breaker, BreakerState, Permit, Refused, Transition, Trip, TripReason};
pub use permit::PermitGuard;
pub use shards::{BreakerObserver, Change, STILL_DOWN_LOG_EVERY, ShardBreakers};
