//! The answer when the store cannot decide (timeout, error, breaker open):
//! the route's failure policy.
//!
//! - `open` admits and `closed` refuses, counting nothing.
//! - `local` decides in process, every quota scaled to this instance's
//!   share, in one memory store per failed shard. Those counts are not
//!   cleared when the shard's breaker closes: they expire on their own
//!   windows, like any memory-store entry. A breaker that flaps (Redis
//!   killed and restarted, a link that drops every few seconds) therefore
//!   does not hand a client a fresh local share on every flap; at worst a
//!   client gets its local share per window plus what Redis admits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use super::assemble::build;
use super::compiled::{CompiledLimit, CompiledTier};
use super::live::Live;
use super::{Decision, DecisionPath, LimitReport, Limiter, Source};
use crate::clock::Clock;
use crate::identity::Identity;
use crate::policy::FailurePolicy;
use crate::store::{Batch, MemoryStore, Store, StoreDecision, StoreObserver};
use crate::telemetry::{FallbackReason, Outcome};

impl Limiter {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fallback(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        batch: &Batch<'_>,
        shard: Arc<str>,
        reason: FallbackReason,
        policy: FailurePolicy,
        limits: &[&CompiledLimit],
    ) -> Decision {
        let source = Source::Fallback {
            reason,
            policy,
            shard,
        };
        match policy {
            FailurePolicy::Open | FailurePolicy::Closed => {
                let allowed = policy == FailurePolicy::Open;
                let retry = (!allowed).then(|| {
                    live.policy
                        .resilience
                        .breaker
                        .open
                        .max(Duration::from_secs(1))
                });
                // Nothing was counted: the limits are reported with their
                // policy only (RateLimit-Policy); no remaining count is
                // known, so none is reported.
                let reports = limits
                    .iter()
                    .map(|l| LimitReport {
                        name: l.name.clone(),
                        unit: l.unit.clone(),
                        quota: l.algorithm.quota(),
                        window_secs: l.algorithm.window_secs(),
                        remaining: None,
                        reset_after: Duration::ZERO,
                        retry_after: Duration::ZERO,
                        allowed,
                        shadow: l.shadow,
                        exceeds_quota: false,
                    })
                    .collect();
                Decision {
                    allowed,
                    tier: tier.name.clone(),
                    limits: reports,
                    retry_after: retry,
                    delay: Duration::ZERO,
                    source,
                    outcome: if allowed {
                        Outcome::FallbackAllowed
                    } else {
                        Outcome::FallbackBlocked
                    },
                    store_rtt: None,
                    decided_at: self.inner.clock.now_us(),
                    path: DecisionPath::Store,
                    route: None,
                    method: None,
                    slot: None,
                }
            }
            FailurePolicy::Local => {
                let (mut items, _) = live.compiled.items(tier, route, identity, true);
                // Each limit is asked what the store would have asked it.
                for (local, asked) in items.iter_mut().zip(batch.items) {
                    local.cost = asked.cost;
                    local.require_left = asked.require_left;
                }
                let local = Batch {
                    items: &items,
                    ..*batch
                };
                let (d, store) = self.inner.local.decide(source.shard(), &local);
                // In-flight slots count in process too, and go back there.
                let store: Arc<dyn Store> = Arc::new(store);
                let slot = self.slot_for(&tier.name, &local, limits, &d, &store);
                let mut decision = build(tier.name.clone(), limits, d, source, Some(&items));
                decision.slot = slot;
                decision.outcome = if decision.allowed {
                    Outcome::FallbackAllowed
                } else {
                    Outcome::FallbackBlocked
                };
                decision
            }
        }
    }

    /// Drops the local fallback's counts now. They expire on their own
    /// windows anyway; this is for an operator who knows the store's counts
    /// cover the outage.
    pub fn forget_local_state(&self) {
        self.inner.local.forget_all();
    }
}

/// The local fallback's counters: an in-process store per failed shard, each
/// capped at `max_entries` like the primary memory store.
pub(super) struct LocalFallback {
    clock: Arc<dyn Clock>,
    max_entries: usize,
    observer: Arc<dyn StoreObserver>,
    stores: RwLock<HashMap<Arc<str>, MemoryStore>>,
}

impl LocalFallback {
    pub(super) fn new(
        clock: Arc<dyn Clock>,
        max_entries: usize,
        observer: Arc<dyn StoreObserver>,
    ) -> Self {
        Self {
            clock,
            max_entries,
            observer,
            stores: RwLock::new(HashMap::new()),
        }
    }

    /// Decides `batch` in the store standing in for `shard`, which it
    /// returns (a clone sharing its counts) for in-flight releases.
    pub(super) fn decide(
        &self,
        shard: &Arc<str>,
        batch: &Batch<'_>,
    ) -> (StoreDecision, MemoryStore) {
        if let Some(store) = self.stores.read().get(shard) {
            return (store.decide_now(batch), store.clone());
        }
        let store = self
            .stores
            .write()
            .entry(shard.clone())
            .or_insert_with(|| {
                let store = MemoryStore::with_clock_and_label(self.clock.clone(), shard)
                    .with_max_entries(self.max_entries);
                store.observe(self.observer.clone());
                store
            })
            .clone();
        (store.decide_now(batch), store)
    }

    fn forget_all(&self) {
        for store in self.stores.read().values() {
            store.clear();
        }
    }
}
