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
mod costs;
mod decide;
mod decision;
mod fallback;
mod follow;
mod groups;
mod identify;
mod leased;
mod live;
mod meter;
mod metrics_handler;
mod over_quota;
mod record;
mod reload;
mod reserve;
mod settle;
mod slot;
mod snapshot;
mod store_metrics;

use std::path::Path;
use std::sync::Arc;

pub use crate::policy::PolicyVersion;
pub use costs::Costs;
pub use decision::{Decision, DecisionPath, LimitReport, Source};
pub use follow::Follow;
pub use groups::{
    Group, GroupReport, Groups, GroupsDecision, GroupsFailure, GroupsUnavailable, group_decision,
};
pub use live::RouteMatch;
pub use meter::{Meter, UnitUsage, Usage};
pub use reload::{PolicyStatus, ReloadAttempt, ReloadError, ReloadOutcome};
pub use reserve::Reservation;
pub use settle::Settled;
pub use slot::Slot;
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
    /// Stops the task following the policy file when the limiter goes.
    follower: follow::FollowerHandle,
    /// In-flight slots held, for their renewals.
    slots: Arc<slot::Slots>,
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
    principal: Option<crate::identity::ReadCaller>,
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

    /// Decides on what the app's auth layer verified: a request's caller is
    /// the `T` the auth layer put into its extensions (its id, and its tier
    /// if it names one); a request without a `T` is anonymous, limited by
    /// its client address in the anonymous tier (or refused, with
    /// `[identity] anonymous = "reject"`) whatever credential it sends.
    /// `T` is [`crate::identity::Principal`] or the app's own claims type
    /// implementing [`crate::identity::VerifiedCaller`].
    ///
    /// The auth layer must run before the limiter: in axum, add it after
    /// (outside) `limiter.layer()`. A custom extractor
    /// ([`LimiterBuilder::with_extractor`]) replaces this one.
    pub fn identity_from_extension<T: crate::identity::VerifiedCaller>(mut self) -> Self {
        self.principal = Some(crate::identity::principal_reader::<T>());
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
            .unwrap_or_else(|| Telemetry::for_store(&policy.telemetry, &policy.store))
            .named(policy.telemetry.limiter_name.as_deref());
        metrics_handler::prepare(&policy);
        crate::telemetry::metrics::init_identity_metrics();
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
        let key = crate::identity::deployment_key(&policy.identity, store.kind())?;
        let plugins = Plugins {
            resolver: self.resolver,
            extractor: self.extractor,
            principal: self.principal,
            key,
            key_source: (
                policy.identity.hash_secret.clone(),
                policy.identity.hash_secret_file.clone(),
            ),
        };
        let max_entries = policy.store.max_entries;
        let live = Live::new(policy, &plugins);
        reload::started(&live.version, live.policy.telemetry.limiter_name.as_deref());
        telemetry.set_policy_version(&live.version);
        let limiter = Limiter {
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
                follower: follow::FollowerHandle::default(),
                slots: Arc::default(),
            }),
        };
        follow::start(&limiter)?;
        Ok(limiter)
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

    /// Loads a TOML policy file and builds its limiter, which follows the
    /// file ([`Follow::default`]): a changed, replaced or symlink-swapped
    /// file is applied once it has settled, if it is valid.
    /// [`Limiter::reload`] re-reads it on demand. The file is read off the
    /// async runtime. For other following, or none, or SIGHUP:
    /// [`LimiterBuilder::with_source_file`], [`LimiterBuilder::with_follow`],
    /// [`LimiterBuilder::reload_on_sighup`].
    pub async fn from_config_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::builder_from_file(path).await?.build().await
    }

    /// A builder for the policy in the TOML file `path`, with the file as
    /// its source (followed unless [`LimiterBuilder::with_follow`] says
    /// otherwise). The file is read off the async runtime, once: following
    /// starts from exactly the bytes read.
    pub async fn builder_from_file(path: impl AsRef<Path>) -> Result<LimiterBuilder, Error> {
        let path = path.as_ref().to_path_buf();
        let read = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                let file = crate::policy::read_policy_file(&path).map_err(|e| e.error)?;
                let policy = Policy::from_toml_str(&file.text, Some(&path.display().to_string()))?;
                Ok::<_, crate::policy::ConfigError>((policy, file))
            })
            .await
            .map_err(std::io::Error::other)?
        };
        let (policy, file) = read?;
        let mut builder = Self::builder(policy).with_source_file(&path);
        builder.source.initial = Some(file);
        Ok(builder)
    }

    /// Starts a limiter with custom parts.
    pub fn builder(policy: Policy) -> LimiterBuilder {
        LimiterBuilder {
            policy,
            store: None,
            resolver: None,
            extractor: None,
            principal: None,
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
    /// Gives unspent leases back, waits for the in-flight slots already
    /// given up to reach the store, flushes telemetry and stops background
    /// work; call before exit.
    pub async fn shutdown(&self) {
        self.inner.follower.stop();
        // At most twice the decision budget: a release Redis does not take
        // expires after its hold timeout anyway.
        let budget = self.policy().store.timeout * 2;
        self.inner.slots.released(budget).await;
        self.return_leases().await;
        self.inner.telemetry.shutdown().await;
    }
}
