//! The limiter: identity → tier → route → one store decision → answer.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use ratewatch::{Limiter, Limit, Policy, Tier};
//! use ratewatch::identity::{Identity, IdentityKind};
//! let policy = Policy::builder()
//!     .tier(Tier::new("free").match_prefix("free_").limit(Limit::token_bucket("burst", 2, 0.1)))
//!     .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::new(policy).await.unwrap();
//! let caller = Identity::new(IdentityKind::ApiKey, "free_abc");
//! assert!(limiter.check(&caller, "free", None).await.allowed);
//! assert!(limiter.check(&caller, "free", None).await.allowed);
//! assert!(!limiter.check(&caller, "free", None).await.allowed);
//! # });
//! ```

mod ask;
mod assemble;
mod compiled;
mod decide;
mod decision;
mod fallback;
mod identify;
mod leased;
mod live;
mod metrics_handler;
mod record;
mod reload;
mod snapshot;
mod store_metrics;

use std::path::Path;
use std::sync::Arc;

pub use decision::{Decision, DecisionPath, LimitReport, Source};
pub use live::{PolicyVersion, RouteMatch};
pub use reload::{PolicyStatus, ReloadAttempt, ReloadError, ReloadOutcome};
pub use snapshot::PolicySnapshot;

use arc_swap::ArcSwap;
use ask::StoreFailure;
use assemble::build;
use fallback::LocalFallback;
use live::{Live, Plugins};
use store_metrics::StoreMetrics;

use crate::Error;
use crate::clock::{Clock, SystemClock};
use crate::identity::{Identity, KeyExtractor, TierResolver};
use crate::policy::Policy;
use crate::resilience::ShardBreakers;
use crate::store::Store;
use crate::telemetry::Telemetry;

/// A rate limiter: a policy, a store and the telemetry around them.
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    /// The current policy generation; a reload swaps it whole.
    live: ArcSwap<Live>,
    /// The resolver and extractor the app plugged in, kept across reloads.
    plugins: Plugins,
    /// Where the policy came from, and how its reloads went.
    reload: reload::ReloadState,
    store: Arc<dyn Store>,
    /// The local fallback's counters, one store per failed shard.
    local: LocalFallback,
    telemetry: Telemetry,
    clock: Arc<dyn Clock>,
    /// One breaker per shard; none for the memory store, which cannot fail.
    breakers: Option<ShardBreakers>,
    /// Hot keys' pre-paid leases (unused unless the store supports them).
    leases: leased::LeaseState,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.inner.store.kind())
            .field("policy", &self.inner.live.load().version)
            .finish()
    }
}

/// Builds a [`Limiter`] with a custom store, resolver, extractor or clock.
pub struct LimiterBuilder {
    policy: Policy,
    store: Option<Arc<dyn Store>>,
    resolver: Option<Arc<dyn TierResolver>>,
    extractor: Option<Arc<dyn KeyExtractor>>,
    clock: Arc<dyn Clock>,
    telemetry: Option<Telemetry>,
    source: reload::Source,
}

impl LimiterBuilder {
    /// Decides against `store` instead of the one the policy names.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Chooses tiers with `resolver` (falling back to key prefixes when it
    /// answers `None`).
    pub fn with_resolver(mut self, resolver: Arc<dyn TierResolver>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// Identifies callers with `extractor`.
    pub fn with_extractor(mut self, extractor: Arc<dyn KeyExtractor>) -> Self {
        self.extractor = Some(extractor);
        self
    }

    /// Uses `clock` for the memory store and the local fallback.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sends events to `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// Builds the limiter, connecting to the store the policy names if no
    /// store was given. A Redis that is down does not fail this: decisions
    /// answer by failure policy until it appears.
    pub async fn build(self) -> Result<Limiter, Error> {
        self.policy.validate()?;
        let policy = self.policy;
        let store = match self.store {
            Some(s) => s,
            None => open_store(&policy, self.clock.clone()).await?,
        };
        let telemetry = self
            .telemetry
            .unwrap_or_else(|| Telemetry::for_store(&policy.telemetry, &policy.store));
        metrics_handler::prepare(&policy);
        // After the recorder: the store's counts exist at zero from here on.
        let observer: Arc<dyn crate::store::StoreObserver> = Arc::new(StoreMetrics);
        store.observe(observer.clone());
        store_metrics::sample_usage(&store);
        let breakers = (store.kind() != "memory").then(|| {
            let breakers = ShardBreakers::with_probes(
                policy.resilience.breaker,
                self.clock.clone(),
                store.clone(),
                policy.store.timeout,
            );
            breakers.observe(Arc::new(StoreMetrics));
            breakers
        });
        let plugins = Plugins {
            resolver: self.resolver,
            extractor: self.extractor,
        };
        let max_entries = policy.store.max_entries;
        let live = Live::new(policy, &plugins);
        reload::started(&live.version);
        telemetry.set_policy_version(&live.version);
        Ok(Limiter {
            inner: Arc::new(Inner {
                reload: reload::ReloadState::new(self.source, &live.version),
                live: ArcSwap::from_pointee(live),
                plugins,
                local: LocalFallback::new(self.clock.clone(), max_entries, observer),
                store,
                telemetry,
                leases: leased::LeaseState::new(self.clock.now_us()),
                clock: self.clock,
                breakers,
            }),
        })
    }
}

async fn open_store(policy: &Policy, clock: Arc<dyn Clock>) -> Result<Arc<dyn Store>, Error> {
    Ok(crate::store::open(&policy.store, clock).await?)
}

impl Limiter {
    /// A limiter for `policy`, on the store it names.
    pub async fn new(policy: Policy) -> Result<Self, Error> {
        Self::builder(policy).build().await
    }

    /// Loads a TOML policy file and builds its limiter; [`Limiter::reload`]
    /// re-reads the same file.
    pub async fn from_config_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        Self::builder(Policy::from_toml_file(path)?)
            .with_source_file(path)
            .build()
            .await
    }

    /// Starts a limiter with custom parts.
    pub fn builder(policy: Policy) -> LimiterBuilder {
        LimiterBuilder {
            policy,
            store: None,
            resolver: None,
            extractor: None,
            clock: Arc::new(SystemClock),
            telemetry: None,
            source: reload::Source::default(),
        }
    }

    /// The policy in force now (a reload may replace it at any time: take
    /// a [`Limiter::snapshot`] to use one policy for a whole request).
    pub fn policy(&self) -> Arc<Policy> {
        self.inner.live.load().policy.clone()
    }

    /// The limiter pinned to the policy in force now: route matching, tier
    /// resolution and the decision of one request all use that one policy,
    /// whatever reloads happen meanwhile. One atomic load.
    pub fn snapshot(&self) -> PolicySnapshot {
        PolicySnapshot::new(self.clone(), self.inner.live.load_full())
    }

    /// The store decisions go to.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The telemetry pipeline.
    pub fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    /// The identity extractor of the policy in force now.
    pub fn extractor(&self) -> Arc<dyn KeyExtractor> {
        self.inner.live.load().extractor.clone()
    }

    /// The clock of the memory store and the local fallback.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The route rule matching a request under the policy in force now, if
    /// any. The match keeps its policy: [`Limiter::check`] decides under it.
    pub fn route_for(&self, method: &str, path: &str) -> Option<RouteMatch> {
        self.snapshot().route_for(method, path)
    }

    /// Whether the matched route is exempt from limiting.
    pub fn is_exempt(&self, route: Option<&RouteMatch>) -> bool {
        route.is_some_and(RouteMatch::is_exempt)
    }

    /// Decides one request of `identity` in `tier` on `route` (cost from the
    /// route rule, 1 otherwise) and records the event. With a route, the
    /// policy that matched it decides; without, the policy in force now.
    pub async fn check(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<RouteMatch>,
    ) -> Decision {
        self.snapshot().check(identity, tier, route.as_ref()).await
    }

    /// Reports every limit's quota for `identity` without consuming any.
    pub async fn peek(
        &self,
        identity: &Identity,
        tier: &str,
        route: Option<RouteMatch>,
    ) -> Decision {
        self.snapshot().peek(identity, tier, route.as_ref()).await
    }
}

impl Limiter {
    /// Gives unspent leases back, flushes telemetry and stops background
    /// work; call before exit.
    pub async fn shutdown(&self) {
        self.return_leases().await;
        self.inner.telemetry.shutdown().await;
    }
}
