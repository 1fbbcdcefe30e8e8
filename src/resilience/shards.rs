//! One breaker per shard, shared by every request of a limiter, each behind
//! its own short lock. Breakers appear as shards are first seen.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::{Breaker, BreakerState, Permit, Refused, Trip};
use crate::clock::Micros;
use crate::policy::BreakerSettings;
use crate::telemetry::metrics;

/// What a report changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// Nothing the caller must act on.
    None,
    /// The breaker opened.
    Tripped(Trip),
    /// The probe succeeded and the breaker closed: decisions go back to the
    /// store (local fallback counts are kept and expire on their windows).
    Closed,
}

/// The breakers of every shard.
#[derive(Debug)]
pub struct ShardBreakers {
    settings: BreakerSettings,
    breakers: RwLock<HashMap<Arc<str>, Arc<Mutex<Breaker>>>>,
}

impl ShardBreakers {
    /// Breakers with `settings`.
    pub fn new(settings: BreakerSettings) -> Self {
        Self {
            settings,
            breakers: RwLock::new(HashMap::new()),
        }
    }

    fn breaker(&self, shard: &Arc<str>) -> Arc<Mutex<Breaker>> {
        if let Some(b) = self.breakers.read().get(shard) {
            return b.clone();
        }
        let mut map = self.breakers.write();
        map.entry(shard.clone())
            .or_insert_with(|| {
                metrics::record_breaker_state(shard, BreakerState::Closed.as_gauge());
                Arc::new(Mutex::new(Breaker::new(self.settings)))
            })
            .clone()
    }

    /// Leave to call `shard` at `now`, or why not.
    pub fn acquire(&self, shard: &Arc<str>, now: Micros) -> Result<Permit, Refused> {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        let before = b.state();
        let permit = b.acquire(now);
        let after = b.state();
        if before != after {
            metrics::record_breaker_state(shard, after.as_gauge());
        }
        permit
    }

    /// Gives back a permit whose call was not made.
    pub fn release(&self, shard: &Arc<str>, permit: Permit, now: Micros) {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        let before = b.state();
        b.release(permit, now);
        if b.state() != before {
            metrics::record_breaker_state(shard, b.state().as_gauge());
        }
    }

    /// Reports the outcome of a permitted call.
    pub fn report(&self, shard: &Arc<str>, permit: Permit, ok: bool, now: Micros) -> Change {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        if ok {
            match b.on_success(permit, now) {
                Some(t) if t.to == BreakerState::Closed => {
                    metrics::record_breaker_state(shard, t.to.as_gauge());
                    Change::Closed
                }
                Some(t) => {
                    metrics::record_breaker_state(shard, t.to.as_gauge());
                    Change::None
                }
                None => Change::None,
            }
        } else {
            match b.on_failure(permit, now) {
                Some(trip) => {
                    metrics::record_breaker_state(shard, BreakerState::Open.as_gauge());
                    Change::Tripped(trip)
                }
                None => Change::None,
            }
        }
    }

    /// Every known shard and its breaker's state, sorted by shard.
    pub fn states(&self) -> Vec<(Arc<str>, BreakerState)> {
        let mut out: Vec<_> = self
            .breakers
            .read()
            .iter()
            .map(|(s, b)| (s.clone(), b.lock().state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}
