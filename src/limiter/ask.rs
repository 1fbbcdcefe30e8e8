//! How a batch reaches the store: [`Limiter::decide_now`] picks the path.
//!
//! A store that never waits (the memory store) decides synchronously, with
//! no future, timer or breaker around it, so the layer can answer from
//! `call` itself. Any other store is asked through the breaker of every
//! shard the request touches, within the decision budget.

use std::sync::Arc;
use std::time::Duration;

use super::Limiter;
use super::slot::Unseen;
use crate::resilience::{BreakerState, Change};
use crate::store::{Batch, Charge, StoreDecision, StoreError};
use crate::telemetry::FallbackReason;

/// Why the store gave no decision.
pub(super) struct StoreFailure {
    pub(super) reason: FallbackReason,
    /// How long until an open breaker lets a probe go.
    pub(super) breaker_wait: Option<Duration>,
    /// The shard to blame (and to label the fallback with).
    pub(super) shard: Option<Arc<str>>,
}

/// A store's answer, or why there is none.
pub(super) type Answer = Result<StoreDecision, StoreFailure>;

fn reason_of(e: &StoreError) -> FallbackReason {
    if e.is_timeout() {
        FallbackReason::Timeout
    } else {
        FallbackReason::Error
    }
}

impl Limiter {
    /// Whether decisions may be taken synchronously: the store has no
    /// breakers (it cannot fail over the network) and no leases (taking
    /// one waits on the store), so it is asked
    /// [`crate::store::Store::decide_sync`] first.
    pub(super) fn may_decide_now(&self) -> bool {
        self.inner.breakers.is_none() && !self.inner.store.leases()
    }

    /// The one place that picks the store path. `Some` when the store
    /// decided here and now (the memory store); `None` when the batch must
    /// go through [`Limiter::ask_store`].
    pub(super) fn decide_now(&self, batch: &Batch<'_>) -> Option<Answer> {
        if !self.may_decide_now() {
            return None;
        }
        let inner = &*self.inner;
        let answer = inner.store.decide_sync(batch)?;
        Some(answer.map_err(|e| {
            tracing::debug!(error = %e, "store could not decide");
            StoreFailure {
                reason: reason_of(&e),
                breaker_wait: None,
                shard: e
                    .shard()
                    .cloned()
                    .or_else(|| batch.items.first().map(|i| inner.store.shard_for(&i.key))),
            }
        }))
    }

    /// One store call within the decision budget, through the breaker of
    /// every shard the request touches (one, unless a cluster request spans
    /// slots). A timed-out call is never retried. On failure: the reason,
    /// how long until an open breaker lets a probe go, and the shard to
    /// blame.
    pub(super) async fn ask_store(&self, batch: &Batch<'_>, budget: Duration) -> Answer {
        self.ask_store_for(batch, budget, false)
            .await
            .map(|(d, _)| d)
    }

    /// [`Limiter::ask_store`], keeping what an admitted decision charged
    /// when `charged` (a lease take).
    pub(super) async fn ask_store_for(
        &self,
        batch: &Batch<'_>,
        budget: Duration,
        charged: bool,
    ) -> Result<(StoreDecision, Option<Charge>), StoreFailure> {
        // Until the answer is here, a slot the store takes for this
        // request is held by nothing: dropped here (the caller gave up) or
        // after a timeout, it is given back rather than left to expire.
        let unseen = Unseen::new(&self.inner.store, batch.items, batch.holder);
        let answer = self.ask_store_once(batch, budget, charged).await;
        match &answer {
            Err(f) if f.reason == FallbackReason::Timeout => drop(unseen),
            // Answered; refused by a breaker (no call made); or an error
            // before or instead of the script (a down Redis is not asked
            // again for every request).
            _ => unseen.seen(),
        }
        answer
    }

    /// [`Limiter::ask_store_for`] without the care of a slot taken for an
    /// answer that never arrives.
    async fn ask_store_once(
        &self,
        batch: &Batch<'_>,
        budget: Duration,
        charged: bool,
    ) -> Result<(StoreDecision, Option<Charge>), StoreFailure> {
        let inner = &*self.inner;
        let Some(breakers) = &inner.breakers else {
            // A store without breakers that could not decide synchronously:
            // no shard to gather, no timer (it never waits on a network).
            let answer = if charged {
                inner.store.decide_charged(batch).await
            } else {
                inner.store.decide(batch).await.map(|d| (d, None))
            };
            return answer.map_err(|e| {
                tracing::debug!(error = %e, "store could not decide");
                StoreFailure {
                    reason: reason_of(&e),
                    breaker_wait: None,
                    shard: e
                        .shard()
                        .cloned()
                        .or_else(|| batch.items.first().map(|i| inner.store.shard_for(&i.key))),
                }
            });
        };
        let shards = self.shards_of(batch.items);
        // Guards, not bare permits: if this future is dropped (client gone,
        // timeout around the service) or panics before reporting, each
        // permit goes back, so a probe is never lost.
        let mut permits = Vec::with_capacity(shards.len());
        for shard in &shards {
            match breakers.enter(shard) {
                Ok(p) => permits.push(p),
                Err(refused) => {
                    // The call will not be made: the permits granted so
                    // far (perhaps a probe) go back as they are dropped.
                    return Err(StoreFailure {
                        reason: FallbackReason::BreakerOpen,
                        breaker_wait: Some(Duration::from_micros(refused.retry_after_us)),
                        shard: Some(shard.clone()),
                    });
                }
            }
        }
        let decide = async {
            if charged {
                inner.store.decide_charged(batch).await
            } else {
                // Bounded by `budget` below: the store needs no timer.
                inner.store.decide_bounded(batch).await.map(|d| (d, None))
            }
        };
        // The error goes to the breakers, whose log lines name it
        // (`last_error="tls: invalid peer certificate ..."`).
        let result = match tokio::time::timeout(budget, decide).await {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "store could not decide");
                Err((reason_of(&e), e.shard().cloned(), e))
            }
            Err(_) => Err((FallbackReason::Timeout, None, StoreError::Timeout)),
        };
        for permit in permits {
            let shard = permit.shard().clone();
            // A failure the store pinned on one shard counts against that
            // shard only; the others' permits go back unreported (their
            // part may or may not have answered). An unattributed failure
            // counts against every shard asked.
            let ok = match &result {
                Ok(_) => true,
                Err((_, Some(failed), _)) if *failed != shard => continue,
                Err((_, _, e)) => {
                    breakers.note_error(&shard, e);
                    false
                }
            };
            self.reported(breakers, &shard, permit, ok);
        }
        result.map_err(|(reason, failed, _)| StoreFailure {
            reason,
            breaker_wait: None,
            shard: failed.or_else(|| shards.first().cloned()),
        })
    }

    /// Reports a store call's result to `shard`'s breaker through its
    /// permit, counting and logging a trip.
    pub(super) fn reported(
        &self,
        breakers: &crate::resilience::ShardBreakers,
        shard: &Arc<str>,
        permit: crate::resilience::PermitGuard,
        ok: bool,
    ) {
        let inner = &*self.inner;
        let shard = shard.clone();
        match permit.report(ok) {
            // A failed probe: the shard stayed down, which is no new
            // trip (neither counted nor logged as one).
            Change::Tripped(trip) if trip.from != BreakerState::Closed => {
                breakers.still_down(&shard);
            }
            Change::Tripped(trip) => {
                inner.telemetry.record_breaker_trip(&shard);
                tracing::warn!(
                    %shard,
                    reason = ?trip.reason,
                    last_error = breakers.last_error(&shard).as_str(),
                    "circuit breaker opened"
                );
            }
            Change::Closed => {
                // Back to the store after a successful probe. The
                // local fallback keeps its counts: they expire on
                // their own windows, so a breaker that flaps does
                // not hand out a fresh local share each time.
                tracing::info!(%shard, "circuit breaker closed");
            }
            Change::None => {}
        }
    }

    /// The shards `items` live on, each once, in the order first met (one,
    /// unless a cluster request spans slots).
    pub(super) fn shards_of(&self, items: &[crate::store::Item]) -> Vec<Arc<str>> {
        let mut shards: Vec<Arc<str>> = Vec::with_capacity(1);
        for item in items {
            let shard = self.inner.store.shard_for(&item.key);
            if !shards.contains(&shard) {
                shards.push(shard);
            }
        }
        shards
    }

    /// Every shard's breaker state (empty for the memory store).
    pub fn breaker_states(&self) -> Vec<(Arc<str>, crate::resilience::BreakerState)> {
        self.inner
            .breakers
            .as_ref()
            .map_or_else(Vec::new, crate::resilience::ShardBreakers::states)
    }
}
