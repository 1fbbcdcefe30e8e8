//! Settling a reservation: the store call, through the breakers, within
//! the decision budget.
//!
//! A settle is never retried (the store may have applied it) and never
//! waits past the decision budget; a shard whose breaker is open is not
//! asked at all. A settle that could not be made is counted
//! (`ratewatch_settles_total{outcome="failed"}`) and leaves the limits as
//! the decision charged them: the reserved units stay spent.

use std::time::Duration;

use std::sync::Arc;

use super::reserve::{Reservation, UnitReservation};
use super::{Costs, Limiter};
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
    /// Settles the request at `actual` units of its primary unit
    /// ([`Reservation::primary_unit`]: requests unless its limits count
    /// another unit): the difference from [`Reservation::reserved`] is
    /// charged (forced, as debt later requests pay back) or given back
    /// (never more than was charged, only within the window charged),
    /// against the limits of that unit the decision charged, in one atomic
    /// store call per shard (per slot on a cluster). Other units keep what
    /// was reserved. Never waits past the decision budget; never panics.
    pub async fn settle(self, actual: u64) -> Settled {
        let Some(primary) = self.units.first() else {
            return Settled::Exact;
        };
        let used = Costs::new().with(primary.unit.to_string(), actual);
        self.settle_costs(&used)
            .await
            .into_iter()
            .next()
            .map_or(Settled::Exact, |(_, s)| s)
    }

    /// Settles every unit `used` names at what it says the request used
    /// (as [`Reservation::settle`] does for one unit), one store call per
    /// unit that differs from its reservation; a unit `used` does not name
    /// keeps what was reserved. Answers how each unit the reservation
    /// holds and `used` names ended, in the reservation's order.
    pub async fn settle_costs(self, used: &Costs) -> Vec<(Arc<str>, Settled)> {
        let mut out = Vec::new();
        for u in &self.units {
            if let Some(actual) = used.get(&u.unit) {
                let settled = self.settle_unit(u, actual).await;
                out.push((u.unit.clone(), settled));
            }
        }
        out
    }

    /// Gives back everything the decision reserved, in every unit.
    pub async fn cancel(self) -> Vec<(Arc<str>, Settled)> {
        let none: Costs = self.units.iter().map(|u| (u.unit.to_string(), 0)).collect();
        self.settle_costs(&none).await
    }

    async fn settle_unit(&self, u: &UnitReservation, actual: u64) -> Settled {
        let Some(adjust) = Adjust::between(u.reserved, actual) else {
            return Settled::Exact;
        };
        if u.items.is_empty() {
            return Settled::Exact;
        }
        if self.limiter.inner.live.load().version.hash != self.policy {
            crate::telemetry::cost::settled(&self.tier, &self.route, "stale", 0);
            return Settled::Stale;
        }
        // A check that something was left charged nothing: nothing to give.
        if matches!(adjust, Adjust::Refund(_)) && u.reserved == 0 {
            return Settled::Exact;
        }
        let settle = Settle::new(&u.items, self.charged_at, adjust);
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
        if let Settled::Charged(n) | Settled::Refunded(n) = settled {
            let refunded = matches!(settled, Settled::Refunded(_));
            crate::telemetry::cost::units_settled(&self.tier, &u.unit, refunded, n);
        }
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
