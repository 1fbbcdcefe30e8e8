//! One request's decision under one policy generation: tier, keys, a
//! lease or the store (synchronously when it can, see `ask.rs`), the
//! failure policy when it cannot, then the event.

use std::time::Duration;

use super::ask::{Answer, StoreFailure};
use super::assemble::build;
use super::compiled::{CompiledLimit, CompiledTier, Limits};
use super::live::Live;
use super::{Costs, Decision, DecisionPath, Limiter, Source};
use crate::identity::Identity;
use crate::policy::FailurePolicy;
use crate::policy::REQUESTS;
use crate::store::{Batch, Item, StoreDecision};
use crate::telemetry::Outcome;

/// A request's limits, keyed and ready for the store.
pub(super) struct Prepared<'a> {
    pub(super) tier: &'a CompiledTier,
    pub(super) items: super::compiled::Items,
    pub(super) limits: Limits<'a>,
    /// The requests cost: every `requests` limit's (the batch's cost).
    pub(super) cost: u64,
    /// Whether some limit is asked for its own cost (another unit, or a
    /// check that something is left): decided exactly, never from a lease.
    pub(super) per_unit: bool,
    pub(super) route: Option<usize>,
    pub(super) failure: FailurePolicy,
    pub(super) peek: bool,
    /// The holder id of the request's in-flight slots, if it has in-flight
    /// limits and is not a peek.
    pub(super) holder: Option<String>,
}

impl Prepared<'_> {
    pub(super) fn batch(&self) -> Batch<'_> {
        if self.peek {
            Batch::peek(&self.items)
        } else {
            let batch = Batch::consume(&self.items, self.cost);
            match &self.holder {
                Some(h) => batch.holding(h),
                None => batch,
            }
        }
    }
}

impl Limiter {
    /// Decides under `live` from start to end, waiting for the store if it
    /// must.
    pub(super) async fn run(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
    ) -> Decision {
        self.run_cost(live, identity, tier, route, peek, None).await
    }

    /// [`Limiter::run`] at `costs` instead of the route's cost.
    pub(super) async fn run_cost(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
        cost: Option<&Costs>,
    ) -> Decision {
        let Some(p) = self.prepare(live, identity, tier, route, peek, cost) else {
            return self.unlimited();
        };
        if p.exceeds_quota() {
            return self.over_quota(live, &p, identity).await;
        }
        let decision = self.decide_prepared(live, &p, identity).await;
        let units = self.count_cost(live, &p, &decision, cost.is_some());
        self.recorded(live, &p, decision, identity, units)
    }

    /// The decision of a prepared request: from a lease where the store
    /// leases, else one store call (or the failure policy). Not recorded.
    pub(super) async fn decide_prepared(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        identity: &Identity,
    ) -> Decision {
        let (peek, route) = (p.peek, p.route);
        // A store without leases skips the lease path's (large) future; a
        // request taking in-flight slots is decided exactly (a slot is
        // held, not spent, so it cannot be leased).
        let leased = if peek || !self.inner.store.leases() || p.holder.is_some() || p.per_unit {
            None
        } else {
            self.decide_leased(
                live, p.tier, route, identity, &p.items, &p.limits, p.cost, p.failure,
            )
            .await
        };
        match leased {
            Some(d) => d,
            None => {
                self.decide_exact(
                    live,
                    p.tier,
                    route,
                    identity,
                    &p.batch(),
                    p.failure,
                    &p.limits,
                    false,
                )
                .await
                .0
            }
        }
    }

    /// [`Limiter::run`] without waiting: `None` when the store can only
    /// answer asynchronously (Redis, or a store with leases), `Some` from a
    /// store that decides in process.
    pub(super) fn run_now(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
    ) -> Option<Decision> {
        self.run_now_cost(live, identity, tier, route, peek, None)
    }

    /// [`Limiter::run_now`] at `costs` instead of the route's cost.
    pub(super) fn run_now_cost(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
        cost: Option<&Costs>,
    ) -> Option<Decision> {
        if !self.may_decide_now() {
            return None;
        }
        let Some(p) = self.prepare(live, identity, tier, route, peek, cost) else {
            return Some(self.unlimited());
        };
        if p.exceeds_quota() {
            return self.over_quota_now(live, &p, identity);
        }
        let batch = p.batch();
        let answer = self.decide_now(&batch)?;
        let (decision, _) = self.answered(
            live, p.tier, route, identity, &batch, p.failure, &p.limits, answer, false,
        );
        let units = self.count_cost(live, &p, &decision, cost.is_some());
        Some(self.recorded(live, &p, decision, identity, units))
    }

    /// The tier and keyed limits of a request, each asked for the
    /// request's cost in its unit (see [`Costs`]); `None` when the policy
    /// has no tier at all.
    pub(super) fn prepare<'a>(
        &self,
        live: &'a Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
        costs: Option<&Costs>,
    ) -> Option<Prepared<'a>> {
        let c = &live.compiled;
        let tier = c
            .tiers
            .get(tier)
            .or_else(|| c.tiers.get(&live.policy.identity.default_tier))
            .or_else(|| c.tiers.values().next())?;
        let (mut items, limits) = c.items(tier, route, identity, false);
        let holder = (!peek && items.iter().any(|i| i.algorithm.is_concurrency()))
            .then(crate::store::holder_id);
        let cost = costs
            .and_then(|c| c.get(REQUESTS))
            .unwrap_or_else(|| route.map_or(1, |i| c.routes[i].rule.cost));
        let mut per_unit = false;
        if !peek {
            for (item, l) in items.iter_mut().zip(&limits) {
                let asked = if l.requests {
                    cost
                } else {
                    costs.and_then(|c| c.get(&l.unit)).unwrap_or(0)
                };
                if item.algorithm.is_concurrency() || (l.requests && asked > 0) {
                    continue;
                }
                per_unit = true;
                if asked == 0 {
                    // Named at 0 or not at all: checked, not charged.
                    item.cost = Some(0);
                    item.require_left = true;
                } else {
                    item.cost = Some(asked);
                }
            }
        }
        Some(Prepared {
            holder,
            tier,
            items,
            limits,
            cost,
            per_unit,
            route,
            failure: route.map_or(c.default_failure, |i| c.routes[i].failure),
            peek,
        })
    }

    /// The answer of a policy without tiers: it limits nothing.
    pub(super) fn unlimited(&self) -> Decision {
        Decision {
            allowed: true,
            tier: "".into(),
            limits: Vec::new(),
            retry_after: None,
            delay: Duration::ZERO,
            source: Source::Store {
                shard: "memory".into(),
            },
            outcome: Outcome::Allowed,
            store_rtt: None,
            decided_at: self.inner.clock.now_us(),
            path: DecisionPath::Store,
            route: None,
            method: None,
            slot: None,
        }
    }

    /// One store decision of `batch`, or the failure policy's answer when
    /// the store gave none; with the store's own answer if `keep` and it
    /// gave one. The store path is picked in `ask.rs`: here and now for a
    /// store that never waits, else through the breakers.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn decide_exact(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        failure: FailurePolicy,
        limits: &[&CompiledLimit],
        keep: bool,
    ) -> (Decision, Option<StoreDecision>) {
        let answer = match self.decide_now(batch) {
            Some(answer) => answer,
            None => self.ask_store(batch, live.policy.store.timeout).await,
        };
        self.answered(
            live, tier, route, identity, batch, failure, limits, answer, keep,
        )
    }

    /// The decision from the store's answer, or the failure policy's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn answered(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        failure: FailurePolicy,
        limits: &[&CompiledLimit],
        answer: Answer,
        keep: bool,
    ) -> (Decision, Option<StoreDecision>) {
        match answer {
            Ok(d) => {
                let source = Source::Store {
                    shard: d.shard.clone(),
                };
                let kept = keep.then(|| d.clone());
                let slot = self.slot_for(&tier.name, batch, limits, &d, &self.inner.store);
                let mut decision = build(tier.name.clone(), limits, d, source, None);
                decision.slot = slot;
                (decision, kept)
            }
            Err(f) => (
                self.failed_over(live, tier, route, identity, batch, failure, limits, f),
                None,
            ),
        }
    }

    /// The failure policy's answer for `batch` after the store failed `f`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn failed_over(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        failure: FailurePolicy,
        limits: &[&CompiledLimit],
        f: StoreFailure,
    ) -> Decision {
        let shard = f.shard.unwrap_or_else(|| "memory".into());
        let mut d = self.fallback(
            live, tier, route, identity, batch, shard, f.reason, failure, limits,
        );
        // Failing closed behind an open breaker: retry once it lets a
        // probe through.
        if let (Some(wait), Some(retry), FailurePolicy::Closed) =
            (f.breaker_wait, d.retry_after.as_mut(), failure)
        {
            *retry = wait.max(Duration::from_secs(1));
        }
        d
    }

    /// The in-flight slots an admitted `d` took for `batch`'s holder on
    /// `store`; `None` when it took none.
    pub(super) fn slot_for(
        &self,
        tier: &std::sync::Arc<str>,
        batch: &Batch<'_>,
        limits: &[&CompiledLimit],
        d: &StoreDecision,
        store: &std::sync::Arc<dyn crate::store::Store>,
    ) -> Option<super::Slot> {
        let holder = batch.holder?;
        if !d.allowed || batch.peek {
            return None;
        }
        let (items, names): (Vec<Item>, Vec<std::sync::Arc<str>>) = batch
            .items
            .iter()
            .zip(limits)
            .zip(&d.verdicts)
            .filter(|((i, _), v)| i.algorithm.is_concurrency() && v.allowed)
            .map(|((i, l), _)| (i.clone(), l.name.clone()))
            .unzip();
        if items.is_empty() {
            return None;
        }
        Some(self.inner.slots.take(
            store.clone(),
            items,
            names,
            holder.to_owned(),
            d.shard.clone(),
            tier.clone(),
            self.inner.telemetry.limiter().cloned(),
        ))
    }

    /// `decision`, recorded unless it was a peek.
    pub(super) fn recorded(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        decision: Decision,
        identity: &Identity,
        units: crate::telemetry::UnitsCharged,
    ) -> Decision {
        if !p.peek {
            self.record(live, &decision, p.route, identity, p.cost, units);
        }
        decision
    }
}
