//! Settling a reservation: the store call, through the breakers, within
//! the decision budget.
//!
//! A settle is never retried (the store may have applied it) and never
//! waits past the decision budget; a shard whose breaker is open is not
//! asked at all. A settle that could not be made is counted
//! (`ratewatch_settles_total{outcome="failed"}`) and leaves the limits as
//! the decision charged them: the reserved units stay spent.

use std::time::Duration;

use super::Limiter;
use super::reserve::Reservation;
use crate::algorithm::Adjust;
use crate::store::{Settle, StoreError};

/// How a settle ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The request used what it reserved (or nothing was charged): no
    /// store call was made.
    Exact,
    /// The request used this many units more than it reserved; they were
    /// charged.
    Charged(u64),
    /// The request used this many units less than it reserved; they were
    /// given back (as far as each limit's window allowed).
    Refunded(u64),
    /// The store could not be asked (breaker open, timeout, error): the
    /// limits keep what the decision charged.
    Failed,
    /// The policy changed between the decision and the settle: the
    /// reservation's numbers (capacity, limit, window, rate) may no
    /// longer be the limits', and settling with them would read the state
    /// under the wrong numbers (a bucket raised from 100 to 1000 would come
    /// back full from a refund of 100). Nothing was settled: the limits
    /// keep what the decision charged.
    Stale,
}

impl Reservation {
    /// Settles the request at `actual` units: the difference from
    /// [`Reservation::reserved`] is charged (forced, as debt later
    /// requests pay back) or given back (never more than was charged, only
    /// within the window charged), against the limits the decision
    /// charged, in one atomic store call per shard (per slot on a
    /// cluster). Never waits past the decision budget; never panics.
    pub async fn settle(self, actual: u64) -> Settled {
        let Some(adjust) = Adjust::between(self.reserved, actual) else {
            return Settled::Exact;
        };
        if self.items.is_empty() {
            return Settled::Exact;
        }
        if self.limiter.inner.live.load().version.hash != self.policy {
            crate::telemetry::cost::settled(&self.tier, &self.route, "stale", 0);
            return Settled::Stale;
        }
        let settle = Settle::new(&self.items, self.charged_at, adjust);
        let result = self.limiter.settle_store(&settle, self.budget).await;
        let (outcome, settled) = match (result, adjust) {
            (Ok(()), Adjust::Charge(n)) => ("charged", Settled::Charged(n)),
            (Ok(()), Adjust::Refund(n)) => ("refunded", Settled::Refunded(n)),
            (Err(e), _) => {
                tracing::debug!(error = %e, "settle failed; the reserved units stay charged");
                ("failed", Settled::Failed)
            }
        };
        let units = match settled {
            Settled::Charged(n) | Settled::Refunded(n) => n,
            _ => 0,
        };
        crate::telemetry::cost::settled(&self.tier, &self.route, outcome, units);
        settled
    }
}

impl Limiter {
    /// One settle call: straight to a store without breakers (memory),
    /// else through the breaker of every shard the settle touches, within
    /// `budget`.
    pub(super) async fn settle_store(
        &self,
        settle: &Settle<'_>,
        budget: Duration,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let Some(breakers) = &inner.breakers else {
            return inner.store.settle(settle).await;
        };
        let shards = self.shards_of(settle.items);
        let mut permits = Vec::with_capacity(shards.len());
        for shard in &shards {
            match breakers.enter(shard) {
                Ok(p) => permits.push(p),
                Err(_) => {
                    return Err(StoreError::Unavailable(format!(
                        "the breaker of {shard} is open"
                    )));
                }
            }
        }
        let result = match tokio::time::timeout(budget, inner.store.settle(settle)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout),
        };
        for permit in permits {
            let shard = permit.shard().clone();
            let ok = match &result {
                Ok(()) => true,
                Err(e) if e.shard().is_some_and(|failed| *failed != shard) => continue,
                Err(e) => {
                    breakers.note_error(&shard, e);
                    false
                }
            };
            self.reported(breakers, &shard, permit, ok);
        }
        result
    }
}
