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
use super::{Costs, Decision, Limiter, PolicySnapshot};
use crate::clock::Micros;
use crate::identity::Identity;
use crate::policy::REQUESTS;
use crate::store::Item;
use crate::telemetry::UnitsCharged;

/// What an admitted request's decision charged, kept to settle the request
/// once its real usage is known: [`Reservation::settle_costs`] charges, per
/// unit, what it used beyond what was reserved or gives back what it did
/// not use, against the same limits, in one atomic store call per unit and
/// shard. Dropping it unsettled keeps the reserved units charged. Not
/// `Clone`: a request is settled once.
///
/// A reservation has a *primary unit*, the one [`Reservation::settle`],
/// [`Meter::record`](crate::Meter::record) and [`Usage`](crate::Usage)
/// mean: the first unit other than `requests` among the limits it charged
/// (in tier then route order), else `requests`. A policy whose limits all
/// count requests settles requests, as before units existed.
#[derive(Debug)]
pub struct Reservation {
    pub(super) limiter: Limiter,
    /// Per unit: its name, the units reserved, and the limits of that unit
    /// the decision charged or checked (shadow limits that blocked and
    /// in-flight limits are left out).
    pub(super) units: Vec<UnitReservation>,
    /// When the decision was made, on the store's clock.
    pub(super) charged_at: Micros,
    pub(super) tier: Arc<str>,
    /// The route rule's pattern, or `*`.
    pub(super) route: Arc<str>,
    /// The decision budget: a settle never waits longer.
    pub(super) budget: Duration,
    /// The hash of the policy the decision was made under: `items` carry
    /// its numbers, which a reload may have changed since.
    pub(super) policy: String,
}

/// One unit's part of a [`Reservation`].
#[derive(Debug)]
pub(super) struct UnitReservation {
    pub(super) unit: Arc<str>,
    pub(super) reserved: u64,
    pub(super) items: Vec<Item>,
}

impl Reservation {
    /// Units of the primary unit the decision charged each of its limits
    /// (0 when it charged none of them: a check that something was left).
    pub fn reserved(&self) -> u64 {
        self.units.first().map_or(0, |u| u.reserved)
    }

    /// The unit [`Reservation::reserved`] and [`Reservation::settle`] mean.
    pub fn primary_unit(&self) -> &str {
        self.units.first().map_or(REQUESTS, |u| &u.unit)
    }

    /// What the decision reserved in each unit of the limits it charged.
    pub fn reserved_costs(&self) -> Costs {
        let mut costs = Costs::new();
        for u in &self.units {
            costs.set(u.unit.to_string(), u.reserved);
        }
        costs
    }
}

impl Limiter {
    /// Decides one request of `identity` like [`Limiter::check`], at
    /// `cost` units instead of the route rule's cost, and records it.
    ///
    /// A cost of 0 only checks: it charges nothing, and is refused once a
    /// limit has nothing left (less than one unit). A cost above what an enforced limit can ever
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

    /// Decides one request of `identity` at `costs`, one cost per unit
    /// (see [`Costs`]), like [`Limiter::check_costs`], keeping what an
    /// admitted request was reserved in each unit: settle it with
    /// [`Reservation::settle_costs`] once its real usage is known. `None`
    /// when nothing was charged: the request was refused, or the failure
    /// policy answered.
    pub async fn reserve_costs(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<RouteMatch>,
        costs: &Costs,
    ) -> (Decision, Option<Reservation>) {
        self.snapshot()
            .reserve_costs(identity, tier, route.as_ref(), Some(costs))
            .await
    }

    /// Decides one request of `identity` like [`Limiter::check`], charging
    /// every limit the request's cost in that limit's unit ([`Costs`]), in
    /// one atomic store call, all or nothing: a request refused by its
    /// `tokens` limit charges no `requests` limit either. A limit of a unit
    /// `costs` names at 0 or not at all is checked without charge and
    /// refuses once nothing of it is left. Recorded like any decision.
    pub async fn check_costs(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<RouteMatch>,
        costs: &Costs,
    ) -> Decision {
        self.snapshot()
            .check_with_costs(identity, tier, route.as_ref(), costs)
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
        cost: Option<&Costs>,
    ) -> (Decision, Option<Reservation>) {
        let Some(p) = self.prepare(live, identity, tier, route, false, cost) else {
            return (self.unlimited(), None);
        };
        if p.exceeds_quota() {
            return (self.over_quota(live, &p, identity).await, None);
        }
        let decision = self.decide_prepared(live, &p, identity).await;
        let units = self.count_cost(live, &p, &decision, cost.is_some());
        let decision = self.recorded(live, &p, decision, identity, units);
        let reservation = self.reservation(live, &p, &decision);
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
    ) -> UnitsCharged {
        let mut charged = UnitsCharged::new();
        if p.peek || !decision.allowed || !decision.state_known() {
            return charged;
        }
        if explicit && p.cost > 0 {
            let route = route_label(live, p.route);
            crate::telemetry::cost::charged_at_decision(
                &decision.tier,
                &route,
                self.inner.telemetry.limiter(),
                p.cost,
            );
        }
        // Per unit where units are in play: the one-unit path counts nothing more.
        if !(explicit || p.per_unit) {
            return charged;
        }
        for ((item, limit), report) in p.items.iter().zip(&p.limits).zip(&decision.limits) {
            let units = item.cost.unwrap_or(p.cost);
            if item.algorithm.is_concurrency()
                || !report.allowed
                || units == 0
                || charged.get(&limit.unit).is_some()
            {
                continue;
            }
            crate::telemetry::cost::units_charged(
                &decision.tier,
                &limit.unit,
                self.inner.telemetry.limiter(),
                units,
            );
            charged.add(limit.unit.clone(), units);
        }
        charged
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
        let mut units: Vec<UnitReservation> = Vec::new();
        for ((i, l), limit) in p.items.iter().zip(&decision.limits).zip(&p.limits) {
            // An in-flight slot is held and released, not spent: a
            // settle has nothing to charge or give back there.
            if !l.allowed || i.algorithm.is_concurrency() {
                continue;
            }
            let reserved = i.cost.unwrap_or(p.cost);
            match units.iter_mut().find(|u| u.unit == limit.unit) {
                Some(u) => u.items.push(i.clone()),
                None => units.push(UnitReservation {
                    unit: limit.unit.clone(),
                    reserved,
                    items: vec![i.clone()],
                }),
            }
        }
        // The primary unit first: the first one that is not requests.
        if let Some(k) = units.iter().position(|u| u.unit.as_ref() != REQUESTS) {
            units[..=k].rotate_right(1);
        }
        Some(Reservation {
            limiter: self.clone(),
            units,
            charged_at: decision.decided_at,
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
        let costs = cost.map(Costs::requests);
        self.reserve_costs(identity, tier, route, costs.as_ref())
            .await
    }

    /// [`Limiter::reserve_costs`] under this snapshot's policy; `costs`
    /// `None` is the route rule's cost in requests, every other unit
    /// checked without charge.
    pub async fn reserve_costs(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
        costs: Option<&Costs>,
    ) -> (Decision, Option<Reservation>) {
        let live = route.map_or(self.live(), |r| &r.live);
        let keyed = identity.with_key(&live.key);
        let (mut d, r) = self
            .limiter()
            .run_reserve(live, &keyed, tier, route.map(|r| r.index), costs)
            .await;
        d.route = route.map(|r| r.live.compiled.routes[r.index].label.clone());
        (d, r)
    }
}
