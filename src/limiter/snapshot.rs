//! [`PolicySnapshot`]: the limiter pinned to one policy generation, so one
//! request is decided entirely under the old policy or entirely under the
//! new one, never a mix.

use std::sync::Arc;

use super::live::{Live, RouteMatch};
use super::{Costs, Decision, Limiter};
use crate::identity::{Identity, KeyExtractor};
use crate::policy::Policy;
use crate::policy::PolicyVersion;

/// The limiter pinned to the policy that was in force when
/// [`Limiter::snapshot`] was called. Cheap to clone. A reload meanwhile
/// does not affect it: it keeps its policy alive until dropped.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use ratewatch::{Limiter, Limit, Policy, Tier};
/// use ratewatch::identity::{Identity, IdentityKind};
/// let tight = |n| Policy::builder()
///     .tier(Tier::new("free").limit(Limit::token_bucket("burst", n, 0.001)))
///     .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
///     .build()
///     .unwrap();
/// let limiter = Limiter::new(tight(1)).await.unwrap();
/// let pinned = limiter.snapshot();
/// limiter.replace_policy(tight(5)).unwrap();
/// let caller = Identity::new(IdentityKind::ApiKey, "free_abc");
/// // The pinned snapshot still decides under the old policy ...
/// assert_eq!(pinned.check(&caller, "free", None).await.limits[0].quota, 1);
/// // ... a fresh one under the new.
/// assert_eq!(limiter.snapshot().check(&caller, "free", None).await.limits[0].quota, 5);
/// # });
/// ```
#[derive(Clone)]
pub struct PolicySnapshot {
    limiter: Limiter,
    live: Arc<Live>,
}

impl std::fmt::Debug for PolicySnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySnapshot")
            .field("version", &self.live.version)
            .finish()
    }
}

impl PolicySnapshot {
    pub(super) fn new(limiter: Limiter, live: Arc<Live>) -> Self {
        Self { limiter, live }
    }

    pub(super) fn live(&self) -> &Live {
        &self.live
    }

    pub(super) fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The pinned policy.
    pub fn policy(&self) -> &Policy {
        &self.live.policy
    }

    /// The pinned policy's version and hash.
    pub fn version(&self) -> &PolicyVersion {
        &self.live.version
    }

    /// The identity extractor of the pinned policy.
    pub fn extractor(&self) -> &Arc<dyn KeyExtractor> {
        &self.live.extractor
    }

    /// The first route rule of the pinned policy matching a request.
    pub fn route_for(&self, method: &str, path: &str) -> Option<RouteMatch> {
        self.live
            .compiled
            .route_index(method, path)
            .map(|index| RouteMatch {
                index,
                live: self.live.clone(),
            })
    }

    /// The first route rule of the pinned policy matching a request,
    /// conditions on its `headers` and JSON `body` included
    /// ([`RouteRule::when`](crate::RouteRule::when)); [`PolicySnapshot::route_for`]
    /// never matches a rule with conditions.
    pub fn route_for_request(
        &self,
        method: &str,
        path: &str,
        headers: &http::HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Option<RouteMatch> {
        self.live
            .compiled
            .route_index_for(method, path, headers, body)
            .map(|index| RouteMatch {
                index,
                live: self.live.clone(),
            })
    }

    /// Whether the matched route is exempt from limiting.
    pub fn is_exempt(&self, route: Option<&RouteMatch>) -> bool {
        route.is_some_and(RouteMatch::is_exempt)
    }

    /// Decides one request and records the event. A route keeps the policy
    /// that matched it, so a route from another snapshot decides under its
    /// own policy, never against this one's routes.
    pub async fn check(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
    ) -> Decision {
        let live = route.map_or(&self.live, |r| &r.live);
        let index = route.map(|r| r.index);
        // Every front end's identities count under the deployment's key.
        let keyed = identity.with_key(&live.key);
        let identity = &*keyed;
        // A store that decides in process needs no future at all.
        if let Some(d) = self.limiter.run_now(live, identity, tier, index, false) {
            return routed(d, route);
        }
        routed(
            self.limiter.run(live, identity, tier, index, false).await,
            route,
        )
    }

    /// [`PolicySnapshot::check`] without a future: the decision, recorded,
    /// when the store decides in process (the memory store); `None`, having
    /// decided and recorded nothing, when only [`PolicySnapshot::check`] can
    /// ask it (Redis).
    pub fn check_now(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
    ) -> Option<Decision> {
        let live = route.map_or(&self.live, |r| &r.live);
        let keyed = identity.with_key(&live.key);
        let identity = &*keyed;
        self.limiter
            .run_now(live, identity, tier, route.map(|r| r.index), false)
            .map(|d| routed(d, route))
    }

    /// [`PolicySnapshot::check`] at `cost` units instead of the route
    /// rule's cost (0 checks without charging). A cost above a limit's
    /// capacity is refused by that limit, never admitted.
    pub async fn check_with_cost(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
        cost: u64,
    ) -> Decision {
        self.check_with_costs(identity, tier, route, &Costs::requests(cost))
            .await
    }

    /// [`PolicySnapshot::check`] charging each limit the request's cost in
    /// its unit ([`Limiter::check_costs`]).
    pub async fn check_with_costs(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
        costs: &Costs,
    ) -> Decision {
        let live = route.map_or(&self.live, |r| &r.live);
        let index = route.map(|r| r.index);
        // The same counters as the layer's: the deployment's keyed hash.
        let keyed = identity.with_key(&live.key);
        let identity = &*keyed;
        let cost = Some(costs);
        if let Some(d) = self
            .limiter
            .run_now_cost(live, identity, tier, index, false, cost)
        {
            return routed(d, route);
        }
        routed(
            self.limiter
                .run_cost(live, identity, tier, index, false, cost)
                .await,
            route,
        )
    }

    /// Reports every limit's quota for `identity` without consuming any.
    pub async fn peek(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<&RouteMatch>,
    ) -> Decision {
        let live = route.map_or(&self.live, |r| &r.live);
        let index = route.map(|r| r.index);
        let keyed = identity.with_key(&live.key);
        let identity = &*keyed;
        if let Some(d) = self.limiter.run_now(live, identity, tier, index, true) {
            return routed(d, route);
        }
        routed(
            self.limiter.run(live, identity, tier, index, true).await,
            route,
        )
    }
}

/// `d`, naming the route rule it was decided on.
fn routed(mut d: Decision, route: Option<&RouteMatch>) -> Decision {
    d.route = route.map(|r| r.live.compiled.routes[r.index].label.clone());
    d
}
