//! One request's decision under one policy generation: tier, keys, the
//! store (synchronously when it can, see `ask.rs`), the failure policy
//! when it cannot, then the event.

use std::time::Duration;

use super::ask::Answer;
use super::assemble::build;
use super::compiled::{CompiledTier, Limits};
use super::live::Live;
use super::{Decision, Limiter, Source};
use crate::identity::Identity;
use crate::policy::FailurePolicy;
use crate::store::{Batch, Item};
use crate::telemetry::Outcome;

/// A request's limits, keyed and ready for the store.
pub(super) struct Prepared<'a> {
    tier: &'a CompiledTier,
    items: Vec<Item>,
    limits: Limits<'a>,
    cost: u64,
    route: Option<usize>,
    peek: bool,
}

impl Prepared<'_> {
    fn batch(&self) -> Batch<'_> {
        if self.peek {
            Batch::peek(&self.items)
        } else {
            Batch::consume(&self.items, self.cost)
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
        let Some(p) = self.prepare(live, identity, tier, route, peek) else {
            return self.unlimited();
        };
        let batch = p.batch();
        let answer = match self.decide_now(&batch) {
            Some(answer) => answer,
            None => self.ask_store(&batch, live.policy.store.timeout).await,
        };
        self.finish(live, &p, answer, identity)
    }

    /// [`Limiter::run`] without waiting: `None` when the store can only
    /// answer asynchronously (Redis), `Some` from a store that decides in
    /// process.
    pub(super) fn run_now(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
    ) -> Option<Decision> {
        if !self.may_decide_now() {
            return None;
        }
        let Some(p) = self.prepare(live, identity, tier, route, peek) else {
            return Some(self.unlimited());
        };
        let answer = self.decide_now(&p.batch())?;
        Some(self.finish(live, &p, answer, identity))
    }

    /// The tier and keyed limits of a request; `None` when the policy has
    /// no tier at all.
    fn prepare<'a>(
        &self,
        live: &'a Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        peek: bool,
    ) -> Option<Prepared<'a>> {
        let c = &live.compiled;
        let tier = c
            .tiers
            .get(tier)
            .or_else(|| c.tiers.get(&live.policy.identity.default_tier))
            .or_else(|| c.tiers.values().next());
        let tier = tier?;
        let (items, limits) = c.items(tier, route, identity, false);
        Some(Prepared {
            tier,
            items,
            limits,
            cost: route.map_or(1, |i| c.routes[i].rule.cost),
            route,
            peek,
        })
    }

    /// The answer of a policy without tiers: it limits nothing.
    fn unlimited(&self) -> Decision {
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
        }
    }

    /// The decision from the store's answer (or the failure policy's),
    /// recorded unless it was a peek.
    fn finish(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        answer: Answer,
        identity: &Identity,
    ) -> Decision {
        let c = &live.compiled;
        let failure = p.route.map_or(c.default_failure, |i| c.routes[i].failure);
        let decision = match answer {
            Ok(d) => {
                let source = Source::Store {
                    shard: d.shard.clone(),
                };
                build(p.tier.name.clone(), &p.limits, d, source, None)
            }
            Err(f) => {
                let shard = f.shard.unwrap_or_else(|| "memory".into());
                let mut d = self.fallback(
                    live,
                    p.tier,
                    p.route,
                    identity,
                    &p.batch(),
                    shard,
                    f.reason,
                    failure,
                    &p.limits,
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
        };
        if !p.peek {
            self.record(live, &decision, p.route, identity, p.cost);
        }
        decision
    }
}
