//! Deciding a request at a cost of its own, and keeping what its decision
//! charged so that the request can be settled after its response
//! ([`Reservation::settle`]).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use ratewatch::{Limit, Limiter, Policy, Tier};
//! use ratewatch::identity::{Identity, IdentityKind};
//! let policy = Policy::builder()
//!     .tier(Tier::new("free").limit(Limit::per_minute("tokens", 1000)))
//!     .tier(Tier::new("anonymous").limit(Limit::per_minute("tokens", 100)))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::new(policy).await.unwrap();
//! let caller = Identity::new(IdentityKind::ApiKey, "k");
//! // Reserve an estimate of 300 tokens; the answer used 120.
//! let (decision, reservation) = limiter.reserve(&caller, "free", None, 300).await;
//! assert!(decision.allowed);
//! reservation.unwrap().settle(120).await;
//! let left = limiter.peek(&caller, "free", None).await.limits[0].remaining.unwrap();
//! assert_eq!(left, 880.0);
//! // A cost no limit could ever admit is refused, with no retry time.
//! let refused = limiter.check_cost(&caller, "free", None, 5000).await;
//! assert!(!refused.allowed && refused.retry_after.is_none());
//! assert!(refused.limits[0].exceeds_quota);
//! # });
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::decide::Prepared;
use super::live::{Live, RouteMatch};
use super::{Decision, Limiter, PolicySnapshot};
use crate::clock::Micros;
use crate::identity::Identity;
use crate::store::Item;

/// What an admitted request's decision charged, kept to settle the request
/// once its real usage is known: [`Reservation::settle`] charges what it
/// used beyond [`Reservation::reserved`] or gives back what it did not
/// use, against the same limits, in one atomic store call per shard.
/// Dropping it unsettled keeps the reserved units charged. Not `Clone`:
/// a request is settled once.
#[derive(Debug)]
pub struct Reservation {
    pub(super) limiter: Limiter,
    /// The limits the decision charged (shadow limits that blocked were not).
    pub(super) items: Arc<[Item]>,
    /// When the decision was made, on the store's clock.
    pub(super) charged_at: Micros,
    pub(super) reserved: u64,
    pub(super) tier: Arc<str>,
    /// The route rule's pattern, or `*`.
    pub(super) route: Arc<str>,
    /// The decision budget: a settle never waits longer.
    pub(super) budget: Duration,
    /// The hash of the policy the decision was made under: `items` carry
    /// its numbers, which a reload may have changed since.
    pub(super) policy: String,
}

impl Reservation {
    /// Units the decision charged each limit.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
}

impl Limiter {
    /// Decides one request of `identity` like [`Limiter::check`], at
    /// `cost` units instead of the route rule's cost, and records it.
    ///
    /// A cost of 0 only looks: it is decided and reported like any other,
    /// and charges nothing. A cost above what an enforced limit can ever
    /// admit (more than its quota, capacity or burst) is refused at once,
    /// charging nothing: that limit's report has
    /// [`exceeds_quota`](super::LimitReport::exceeds_quota) set and the
    /// decision has no [`retry_after`](Decision::retry_after), since
    /// waiting would never let it pass.
    pub async fn check_cost(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<RouteMatch>,
        cost: u64,
    ) -> Decision {
        self.snapshot()
            .check_with_cost(identity, tier, route.as_ref(), cost)
            .await
    }

    /// [`Limiter::check_cost`], keeping what an admitted request was
    /// charged: settle it with [`Reservation::settle`] once the request's
    /// real usage is known. `None` when nothing was charged: the request
    /// was refused, or the store could not decide and the failure policy
    /// answered.
    pub async fn reserve(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<RouteMatch>,
        cost: u64,
    ) -> (Decision, Option<Reservation>) {
        self.snapshot()
            .reserve(identity, tier, route.as_ref(), Some(cost))
            .await
    }

    /// Decides and keeps the reservation; `cost` `None` is the route
    /// rule's.
    pub(super) async fn run_reserve(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route: Option<usize>,
        cost: Option<u64>,
    ) -> (Decision, Option<Reservation>) {
        let Some(p) = self.prepare(live, identity, tier, route, false, cost) else {
            return (self.unlimited(), None);
        };
        if p.exceeds_quota() {
            return (self.over_quota(live, &p, identity).await, None);
        }
        let decision = self.decide_prepared(live, &p, identity).await;
        let decision = self.recorded(live, &p, decision, identity);
        let reservation = self.reservation(live, &p, &decision);
        self.count_cost(live, &p, &decision, cost.is_some());
        (decision, reservation)
    }

    /// Counts the units an admitted, counted decision charged, where the
    /// request named its cost (`ratewatch_cost_units_total`).
    pub(super) fn count_cost(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        decision: &Decision,
        explicit: bool,
    ) {
        if explicit && !p.peek && decision.allowed && decision.state_known() && p.cost > 0 {
            let route = route_label(live, p.route);
            crate::telemetry::cost::charged_at_decision(&decision.tier, &route, p.cost);
        }
    }

    /// The reservation of an admitted, counted decision.
    fn reservation(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        decision: &Decision,
    ) -> Option<Reservation> {
        if !decision.allowed || decision.is_fallback() {
            return None;
        }
        let items: Arc<[Item]> = p
            .items
            .iter()
            .zip(&decision.limits)
            // An in-flight slot is held and released, not spent: a
            // settle has nothing to charge or give back there.
            .filter(|(i, l)| l.allowed && !i.algorithm.is_concurrency())
            .map(|(i, _)| i.clone())
            .collect();
        Some(Reservation {
            limiter: self.clone(),
            items,
            charged_at: decision.decided_at,
            reserved: p.cost,
            tier: decision.tier.clone(),
            route: route_label(live, p.route),
            budget: live.policy.store.timeout,
            policy: live.version.hash.clone(),
        })
    }
}

/// The metric label of route rule `route`, or `*`.
pub(super) fn route_label(live: &Live, route: Option<usize>) -> Arc<str> {
    route.map_or_else(|| Arc::from("*"), |i| live.compiled.routes[i].label.clone())
}

impl PolicySnapshot {
    /// [`Limiter::reserve`] under this snapshot's policy; `cost` `None` is
    /// the route rule's cost (1 without a rule).
    pub async fn reserve(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
        cost: Option<u64>,
    ) -> (Decision, Option<Reservation>) {
        let live = route.map_or(self.live(), |r| &r.live);
        let keyed = identity.with_key(&live.key);
        let (mut d, r) = self
            .limiter()
            .run_reserve(live, &keyed, tier, route.map(|r| r.index), cost)
            .await;
        d.route = route.map(|r| r.live.compiled.routes[r.index].label.clone());
        (d, r)
    }
}
