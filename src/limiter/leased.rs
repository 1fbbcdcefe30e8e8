//! The limiter's side of [`crate::lease`]: which requests are leased, the
//! store calls a lease makes (through the breaker, within the budget), the
//! background renewals and give-backs, and the sweep.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::compiled::{CompiledLimit, CompiledTier};
use super::live::Live;
use super::{Decision, DecisionPath, Limiter, Source, StoreFailure, build};
use crate::algorithm::Algorithm;
use crate::identity::Identity;
use crate::lease::{GiveBack, Label, Leases, Step};
use crate::policy::{FailurePolicy, LeaseMode};
use crate::store::{Batch, Item, StoreDecision};
use crate::telemetry::lease as metrics;

mod split;

/// The lease table and whether its sweep runs.
pub(super) struct LeaseState {
    table: Leases,
    sweeping: AtomicBool,
    /// Set at shutdown: every key is exact from then on.
    closing: AtomicBool,
    /// The runtime the limiter was built on: renewals, give-backs and the
    /// sweep run there, not on the deciding task's runtime, whose thread
    /// may be too busy deciding from the lease to ever run them.
    runtime: Option<tokio::runtime::Handle>,
    hasher: ahash::RandomState,
}

impl LeaseState {
    pub(super) fn new(origin: crate::clock::Micros) -> Self {
        Self {
            table: Leases::new(origin),
            sweeping: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::try_current().ok(),
            hasher: ahash::RandomState::new(),
        }
    }

    /// Where background work runs: the limiter's runtime, else the
    /// caller's.
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
    }

    /// The lease table's key for a request of `items`: their store keys
    /// and their limits. A reload that changes a limit but keeps its key
    /// (same name, scope and algorithm) makes a new entry, so a lease taken
    /// under the old limit is never spent against the new one; the old
    /// entry goes quiet and the sweep gives its lease back.
    fn key_of(&self, items: &[Item]) -> u64 {
        let mut h = self.hasher.build_hasher();
        for i in items {
            i.key.hash(&mut h);
            i.shadow.hash(&mut h);
            hash_algorithm(&i.algorithm, &mut h);
        }
        h.finish()
    }
}

/// Feeds a limit's algorithm and parameters to `h` (rates by their bits).
fn hash_algorithm(a: &Algorithm, h: &mut impl Hasher) {
    std::mem::discriminant(a).hash(h);
    match *a {
        Algorithm::TokenBucket {
            capacity,
            refill_per_second: rate,
        }
        | Algorithm::Gcra {
            burst: capacity,
            rate_per_second: rate,
        } => (capacity, rate.to_bits()).hash(h),
        Algorithm::SlidingWindow { limit, window_us }
        | Algorithm::SlidingLog { limit, window_us }
        | Algorithm::FixedWindow { limit, window_us } => (limit, window_us).hash(h),
        Algorithm::LeakyBucket {
            rate_per_second,
            capacity,
            max_delay_us,
        } => (rate_per_second.to_bits(), capacity, max_delay_us).hash(h),
        Algorithm::Concurrency { limit, hold_us } => (limit, hold_us).hash(h),
    }
}

/// The mode of a request of these limits on this route; exact when any
/// enforced limit's algorithm cannot be leased.
fn mode_of(live: &Live, route: Option<usize>, limits: &[&CompiledLimit]) -> LeaseMode {
    let route_mode = route.and_then(|i| live.compiled.routes[i].rule.mode);
    let mode = LeaseMode::of_request(route_mode, limits.iter().map(|l| l.mode));
    if mode != LeaseMode::Exact
        && limits
            .iter()
            .any(|l| !l.shadow && !crate::policy::leasable(&l.algorithm))
    {
        return LeaseMode::Exact;
    }
    mode
}

impl Limiter {
    /// Decides a request of a leased or auto key; `None` for exact keys
    /// (and on stores without leases), which the caller decides as ever.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn decide_leased(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        items: &[Item],
        limits: &[&CompiledLimit],
        cost: u64,
        failure: FailurePolicy,
    ) -> Option<Decision> {
        if !self.inner.store.leases() {
            return None;
        }
        if self.inner.leases.closing.load(Ordering::Relaxed) {
            return None;
        }
        let mode = mode_of(live, route, limits);
        if mode == LeaseMode::Exact {
            // The route-wide ceiling may still be leased on its own.
            return self
                .decide_split(
                    live, tier, route, identity, items, limits, cost, failure, None,
                )
                .await;
        }
        let inner = &*self.inner;
        let state = &inner.leases;
        self.start_sweep(live);
        let s = live.policy.leases;
        let instances = live.policy.resilience.expected_instances;
        let req = crate::lease::Request {
            key: state.key_of(items),
            items,
            cost,
            mode,
        };
        let label = || Label {
            identity: identity.display(live.policy.telemetry.key_display),
            tier: tier.name.clone(),
            route: route.map_or_else(
                || live.compiled.any_route.clone(),
                |i| live.compiled.routes[i].label.clone(),
            ),
        };
        let now = inner.clock.now_us();
        let (step, give) = state.table.step(&req, now, &s, instances, label);
        if let Some(g) = give {
            self.give_back_later(vec![g]);
        }
        let batch = Batch::consume(items, cost);
        match step {
            Step::Local { answer, renew, .. } => {
                metrics::decision(true);
                if let Some(units) = renew {
                    self.renew_later(req.key, items, units, live);
                }
                Some(local(tier, limits, answer))
            }
            Step::Take { units } => {
                metrics::decision(false);
                // A task that never ran (its runtime shut down) or
                // panicked cleared nothing: the key is marked as not taking.
                let taken = match self.take(req.key, items.into(), units, cost, now, live) {
                    Some(task) => task.await.map_err(|_| state.table.failed(req.key)).ok(),
                    None => None,
                };
                match taken {
                    Some(Ok(d)) if d.allowed => {
                        let source = Source::Store {
                            shard: d.shard.clone(),
                        };
                        Some(build(tier.name.clone(), limits, d, source, None))
                    }
                    // Not enough for a lease: this request alone.
                    Some(Ok(_)) | None => Some(
                        self.exact(live, tier, route, identity, &batch, failure, limits, &req)
                            .await,
                    ),
                    Some(Err(f)) => Some(
                        self.failed_over(live, tier, route, identity, &batch, failure, limits, f),
                    ),
                }
            }
            Step::Exact => {
                // Not hot as one identity: the route-wide ceiling may be
                // hot in aggregate.
                if let Some(d) = self
                    .decide_split(
                        live,
                        tier,
                        route,
                        identity,
                        items,
                        limits,
                        cost,
                        failure,
                        Some(&req),
                    )
                    .await
                {
                    return Some(d);
                }
                metrics::decision(false);
                Some(
                    self.exact(live, tier, route, identity, &batch, failure, limits, &req)
                        .await,
                )
            }
        }
    }

    /// A per-request decision of a leased or auto key: a refusal is
    /// remembered until its retry time.
    #[allow(clippy::too_many_arguments)]
    async fn exact(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        failure: FailurePolicy,
        limits: &[&CompiledLimit],
        req: &crate::lease::Request<'_>,
    ) -> Decision {
        let t0 = self.inner.clock.now_us();
        let (decision, answer) = self
            .decide_exact(live, tier, route, identity, batch, failure, limits, true)
            .await;
        if let Some(d) = answer {
            let label = || Label {
                identity: identity.display(live.policy.telemetry.key_display),
                tier: tier.name.clone(),
                route: route.map_or_else(
                    || live.compiled.any_route.clone(),
                    |i| live.compiled.routes[i].label.clone(),
                ),
            };
            self.inner.leases.table.heard(
                req,
                t0,
                self.inner.clock.now_us(),
                &d,
                &live.policy.leases,
                live.policy.resilience.expected_instances,
                label,
            );
        }
        decision
    }

    /// Takes `units` for `key` in the background; the request that asked
    /// was already answered from the lease.
    fn renew_later(&self, key: u64, items: &[Item], units: u64, live: &Live) {
        let t0 = self.inner.clock.now_us();
        // Detached: the task installs what it gets by itself.
        let _ = self.take(key, items.into(), units, 0, t0, live);
    }

    /// Takes `units` for `key` (`used` of them for the request that asked,
    /// 0 for a renewal), sent at local time `t0`, and installs the answer,
    /// in a task on the limiter's runtime. A caller that stops waiting (a
    /// client that hung up, a timeout layer dropping the request) can then
    /// neither leave the key marked as taking forever (every later request
    /// of it decided in the store) nor strand a lease Redis already
    /// charged. `None` (the key marked as not taking) without a runtime.
    fn take(
        &self,
        key: u64,
        items: Arc<[Item]>,
        units: u64,
        used: u64,
        t0: crate::clock::Micros,
        live: &Live,
    ) -> Option<tokio::task::JoinHandle<Result<StoreDecision, StoreFailure>>> {
        let Some(rt) = self.inner.leases.runtime() else {
            self.inner.leases.table.failed(key);
            return None;
        };
        let this = self.clone();
        let s = live.policy.leases;
        let instances = live.policy.resilience.expected_instances;
        let budget = live.policy.store.timeout;
        Some(rt.spawn(async move {
            let state = &this.inner.leases;
            let started = Instant::now();
            let take = Batch::consume(&items, units);
            let answer = this.ask_store_for(&take, budget, true).await;
            match &answer {
                Ok((d, charge)) if d.allowed => {
                    metrics::renew_latency(started.elapsed());
                    let now = this.inner.clock.now_us();
                    let give = state.table.granted(
                        key,
                        t0,
                        now,
                        units,
                        used,
                        d,
                        charge.clone(),
                        &s,
                        instances,
                    );
                    let mut give: Vec<GiveBack> = give.into_iter().collect();
                    if state.closing.load(Ordering::SeqCst) {
                        // Landed after shutdown drained the table (it was
                        // sent just before closing was seen): back at once.
                        give.extend(state.table.drain());
                        this.give_back(give).await;
                    } else {
                        this.give_back_later(give);
                    }
                }
                Ok((d, _)) => {
                    metrics::renew_latency(started.elapsed());
                    state.table.refused(key, t0, d, &s);
                }
                Err(_) => state.table.failed(key),
            }
            answer.map(|(d, _)| d)
        }))
    }

    /// Gives leases back in the background.
    fn give_back_later(&self, give: Vec<GiveBack>) {
        if give.is_empty() {
            return;
        }
        let Some(rt) = self.inner.leases.runtime() else {
            give.iter().for_each(|g| metrics::expired(g.units));
            return;
        };
        let this = self.clone();
        rt.spawn(async move { this.give_back(give).await });
    }

    /// Gives leases back all at once: in turn, a frozen Redis would hold
    /// shutdown for one store timeout per lease held.
    async fn give_back(&self, give: Vec<GiveBack>) {
        let store = &self.inner.store;
        let refunds = give.iter().map(|g| async move {
            match store.give_back(&g.items, &g.charge, g.units).await {
                Ok(()) => metrics::returned(g.units),
                Err(e) => {
                    // The units stay charged (the safe side) until their
                    // window rolls or the bucket refills.
                    tracing::debug!(error = %e, units = g.units, "a lease could not be given back");
                    metrics::expired(g.units);
                }
            }
        });
        futures_util::future::join_all(refunds).await;
    }

    /// Gives every held lease back (at shutdown).
    pub(super) async fn return_leases(&self) {
        let state = &self.inner.leases;
        state.closing.store(true, Ordering::SeqCst);
        // Takes in flight land first (within one decision budget), so what
        // they bring is given back too.
        let budget = self.inner.live.load().policy.store.timeout;
        let deadline = Instant::now() + budget + Duration::from_millis(50);
        while state.table.renewing() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let give = state.table.drain();
        self.give_back(give).await;
    }

    /// Keys served from leases on this instance, hottest first.
    pub fn hot_keys(&self) -> Vec<crate::lease::HotKey> {
        self.inner.leases.table.hot_keys(self.inner.clock.now_us())
    }

    /// Starts the sweep that expires leases, cools quiet keys and drops
    /// idle ones, once, on the first leased request.
    fn start_sweep(&self, live: &Live) {
        let state = &self.inner.leases;
        if state.sweeping.load(Ordering::Relaxed) || state.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(rt) = state.runtime() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let every = live.policy.leases.renew.max(Duration::from_millis(10));
        rt.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let limiter = Limiter { inner };
                let s = limiter.inner.live.load().policy.leases;
                let give = limiter
                    .inner
                    .leases
                    .table
                    .sweep(limiter.inner.clock.now_us(), &s);
                limiter.give_back_later(give);
            }
        });
    }
}

/// A decision answered from the lease table.
fn local(tier: &CompiledTier, limits: &[&CompiledLimit], answer: StoreDecision) -> Decision {
    let source = Source::Store {
        shard: answer.shard.clone(),
    };
    let mut d = build(tier.name.clone(), limits, answer, source, None);
    d.path = DecisionPath::Local;
    d
}
