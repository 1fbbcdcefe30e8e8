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

mod compiled;
mod decision;
mod fallback;
mod identify;
mod leased;
mod live;
mod metrics_handler;
mod reload;
mod snapshot;
mod store_metrics;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use decision::{Decision, DecisionPath, LimitReport, Source};
pub use live::{PolicyVersion, RouteMatch};
pub use reload::{PolicyStatus, ReloadAttempt, ReloadError, ReloadOutcome};
pub use snapshot::PolicySnapshot;

use arc_swap::ArcSwap;
use compiled::CompiledLimit;
use fallback::LocalFallback;
use live::{Live, Plugins};
use store_metrics::StoreMetrics;

use crate::Error;
use crate::algorithm::Verdict;
use crate::clock::{Clock, SystemClock};
use crate::identity::{Identity, KeyExtractor, TierResolver};
use crate::policy::{FailurePolicy, Policy};
use crate::resilience::{Change, ShardBreakers};
use crate::store::{Batch, Store, StoreDecision};
use crate::telemetry::{Event, FallbackReason, Outcome, Telemetry};

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
        let breakers = (store.kind() != "memory").then(|| {
            ShardBreakers::with_probes(
                policy.resilience.breaker,
                self.clock.clone(),
                store.clone(),
                policy.store.timeout,
            )
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

    /// Decides under one policy generation, `live`, from start to end.
    async fn run(
        &self,
        live: &Live,
        identity: &Identity,
        tier: &str,
        route_idx: Option<usize>,
        peek: bool,
    ) -> Decision {
        let inner = &*self.inner;
        let c = &live.compiled;
        let tier = c
            .tiers
            .get(tier)
            .or_else(|| c.tiers.get(&live.policy.identity.default_tier))
            .or_else(|| c.tiers.values().next());
        let Some(tier) = tier else {
            // A policy without tiers limits nothing.
            return Decision {
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
                decided_at: inner.clock.now_us(),
                path: DecisionPath::Store,
            };
        };
        let cost = route_idx.map_or(1, |i| c.routes[i].rule.cost);
        let (items, limits) = c.items(tier, route_idx, identity, false);
        let batch = if peek {
            Batch::peek(&items)
        } else {
            Batch::consume(&items, cost)
        };
        let failure = route_idx.map_or(c.default_failure, |i| c.routes[i].failure);
        let leased = if peek {
            None
        } else {
            self.decide_leased(
                live, tier, route_idx, identity, &items, &limits, cost, failure,
            )
            .await
        };
        let decision = match leased {
            Some(d) => d,
            None => {
                self.decide_exact(
                    live, tier, route_idx, identity, &batch, failure, &limits, false,
                )
                .await
                .0
            }
        };
        if !peek {
            self.record(live, &decision, route_idx, identity, cost);
        }
        decision
    }

    /// One store decision of `batch`, or the failure policy's answer when
    /// the store gave none; with the store's own answer if `keep` and it
    /// gave one.
    #[allow(clippy::too_many_arguments)]
    async fn decide_exact(
        &self,
        live: &Live,
        tier: &compiled::CompiledTier,
        route_idx: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        failure: FailurePolicy,
        limits: &[&CompiledLimit],
        keep: bool,
    ) -> (Decision, Option<StoreDecision>) {
        match self.ask_store(batch, live.policy.store.timeout).await {
            Ok(d) => {
                let source = Source::Store {
                    shard: d.shard.clone(),
                };
                let kept = keep.then(|| d.clone());
                (build(tier.name.clone(), limits, d, source, None), kept)
            }
            Err(f) => (
                self.failed_over(live, tier, route_idx, identity, batch, failure, limits, f),
                None,
            ),
        }
    }

    /// The failure policy's answer for `batch` after the store failed `f`.
    #[allow(clippy::too_many_arguments)]
    fn failed_over(
        &self,
        live: &Live,
        tier: &compiled::CompiledTier,
        route_idx: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        failure: FailurePolicy,
        limits: &[&CompiledLimit],
        f: StoreFailure,
    ) -> Decision {
        let shard = f.shard.unwrap_or_else(|| "memory".into());
        let mut d = self.fallback(
            live, tier, route_idx, identity, batch, shard, f.reason, failure, limits,
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

    /// One store call within the decision budget, through the breaker of
    /// every shard the request touches (one, unless a cluster request spans
    /// slots). A timed-out call is never retried. On failure: the reason,
    /// how long until an open breaker lets a probe go, and the shard to
    /// blame.
    async fn ask_store(
        &self,
        batch: &Batch<'_>,
        budget: Duration,
    ) -> Result<StoreDecision, StoreFailure> {
        self.ask_store_for(batch, budget, false)
            .await
            .map(|(d, _)| d)
    }

    /// [`Limiter::ask_store`], keeping what an admitted decision charged
    /// when `charged` (a lease take).
    async fn ask_store_for(
        &self,
        batch: &Batch<'_>,
        budget: Duration,
        charged: bool,
    ) -> Result<(StoreDecision, Option<crate::store::Charge>), StoreFailure> {
        let inner = &*self.inner;
        if inner.breakers.is_none() {
            // The memory store: no breaker, no timer, no shard to gather.
            return inner
                .store
                .decide(batch)
                .await
                .map(|d| (d, None))
                .map_err(|e| {
                    tracing::debug!(error = %e, "store could not decide");
                    StoreFailure {
                        reason: if e.is_timeout() {
                            FallbackReason::Timeout
                        } else {
                            FallbackReason::Error
                        },
                        breaker_wait: None,
                        shard: e
                            .shard()
                            .cloned()
                            .or_else(|| batch.items.first().map(|i| inner.store.shard_for(&i.key))),
                    }
                });
        }
        let mut shards: Vec<Arc<str>> = Vec::with_capacity(1);
        for item in batch.items {
            let shard = inner.store.shard_for(&item.key);
            if !shards.contains(&shard) {
                shards.push(shard);
            }
        }
        // Guards, not bare permits: if this future is dropped (client gone,
        // timeout around the service) or panics before reporting, each
        // permit goes back, so a probe is never lost.
        let mut permits = Vec::with_capacity(shards.len());
        if let Some(b) = &inner.breakers {
            for shard in &shards {
                match b.enter(shard) {
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
        }
        let decide = async {
            if charged {
                inner.store.decide_charged(batch).await
            } else {
                inner.store.decide(batch).await.map(|d| (d, None))
            }
        };
        // A store without breakers (the memory store) never waits on
        // anything: no timer is needed around it.
        let answer = if inner.breakers.is_some() {
            tokio::time::timeout(budget, decide).await
        } else {
            Ok(decide.await)
        };
        let result = match answer {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "store could not decide");
                let reason = if e.is_timeout() {
                    FallbackReason::Timeout
                } else {
                    FallbackReason::Error
                };
                Err((reason, e.shard().cloned()))
            }
            Err(_) => Err((FallbackReason::Timeout, None)),
        };
        for permit in permits {
            let shard = permit.shard().clone();
            // A failure the store pinned on one shard counts against that
            // shard only; the others' permits go back unreported (their
            // part may or may not have answered). An unattributed failure
            // counts against every shard asked.
            let ok = match &result {
                Ok(_) => true,
                Err((_, Some(failed))) if *failed != shard => continue,
                Err(_) => false,
            };
            match permit.report(ok) {
                Change::Tripped(trip) => {
                    inner.telemetry.record_breaker_trip(&shard);
                    tracing::warn!(%shard, reason = ?trip.reason, "circuit breaker opened");
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
        result.map_err(|(reason, failed)| StoreFailure {
            reason,
            breaker_wait: None,
            shard: failed.or_else(|| shards.first().cloned()),
        })
    }

    /// Every shard's breaker state (empty for the memory store).
    pub fn breaker_states(&self) -> Vec<(Arc<str>, crate::resilience::BreakerState)> {
        self.inner
            .breakers
            .as_ref()
            .map_or_else(Vec::new, ShardBreakers::states)
    }

    fn record(
        &self,
        live: &Live,
        d: &Decision,
        route: Option<usize>,
        identity: &Identity,
        cost: u64,
    ) {
        let c = &live.compiled;
        // A fallback that counted nothing exceeded nothing.
        let exceeded: Vec<Arc<str>> = d
            .limits
            .iter()
            .filter(|l| d.state_known() && !l.allowed)
            .map(|l| l.name.clone())
            .collect();
        let fallback = match &d.source {
            Source::Fallback { reason, policy, .. } => Some((*reason, *policy)),
            Source::Store { .. } => None,
        };
        let event = Event {
            tier: d.tier.clone(),
            route: route.map_or_else(|| c.any_route.clone(), |i| c.routes[i].label.clone()),
            limit: d.most_constraining().map(|l| l.name.clone()),
            exceeded,
            outcome: d.outcome,
            shard: d.source.shard().clone(),
            identity: identity.display(live.policy.telemetry.key_display),
            cost,
            redis_rtt: d.store_rtt,
            fallback,
        };
        self.inner.telemetry.record(&event);
    }
}

/// Why the store gave no decision.
struct StoreFailure {
    reason: FallbackReason,
    /// How long until an open breaker lets a probe go.
    breaker_wait: Option<Duration>,
    /// The shard to blame (and to label the fallback with).
    shard: Option<Arc<str>>,
}

fn build(
    tier: Arc<str>,
    limits: &[&CompiledLimit],
    d: StoreDecision,
    source: Source,
    local_items: Option<&[crate::store::Item]>,
) -> Decision {
    let reports: Vec<LimitReport> = limits
        .iter()
        .zip(&d.verdicts)
        .enumerate()
        .map(|(i, (l, v))| report(l, v, local_items.map(|items| &items[i])))
        .collect();
    let retry_after = (!d.allowed).then(|| {
        reports
            .iter()
            .filter(|r| !r.shadow && !r.allowed)
            .map(|r| r.retry_after)
            .max()
            .unwrap_or(Duration::from_secs(1))
    });
    // A shadow shaper reports its delay but never holds a request.
    let delay = d
        .verdicts
        .iter()
        .zip(limits)
        .filter(|(_, l)| !l.shadow)
        .map(|(v, _)| v.delay_us)
        .max()
        .map_or(Duration::ZERO, Duration::from_micros);
    let shadow_blocked = reports.iter().any(|r| r.shadow && !r.allowed);
    let outcome = match (d.allowed, shadow_blocked) {
        (false, _) => Outcome::Blocked,
        (true, true) => Outcome::ShadowBlocked,
        (true, false) => Outcome::Allowed,
    };
    Decision {
        allowed: d.allowed,
        tier,
        limits: reports,
        retry_after,
        delay: if d.allowed { delay } else { Duration::ZERO },
        source,
        outcome,
        store_rtt: d.rtt,
        decided_at: d.now,
        path: DecisionPath::Store,
    }
}

fn report(l: &CompiledLimit, v: &Verdict, local: Option<&crate::store::Item>) -> LimitReport {
    let algorithm = local.map_or(&l.algorithm, |i| &i.algorithm);
    LimitReport {
        name: l.name.clone(),
        quota: algorithm.quota(),
        window_secs: algorithm.window_secs(),
        remaining: v.remaining,
        reset_after: Duration::from_micros(v.reset_after_us),
        retry_after: Duration::from_micros(v.retry_after_us),
        allowed: v.allowed,
        shadow: l.shadow,
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
