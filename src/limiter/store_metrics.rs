//! What a store and its breakers report besides decisions, turned into
//! metrics. The store knows only the [`StoreObserver`] trait, the breakers
//! only [`BreakerObserver`]; the limiter, which sits above them, connects
//! both to telemetry.

use std::sync::{Arc, Weak};

use crate::resilience::{BreakerObserver, BreakerState};
use crate::store::{Store, StoreObserver};
use crate::telemetry::metrics;

/// Counts script reloads (`ratewatch_script_reloads_total`) and memory-store
/// evictions (`ratewatch_store_evictions_total`) in Prometheus.
pub(super) struct StoreMetrics;

impl StoreObserver for StoreMetrics {
    fn script_reloaded(&self, shard: &str) {
        metrics::record_script_reload(shard);
    }

    fn evicted(&self, shard: &str, n: u64) {
        metrics::record_store_evictions(shard, n);
    }

    fn holders_expired(&self, shard: &str, n: u64) {
        crate::telemetry::inflight::expired(shard, n);
    }
}

/// Sets `ratewatch_breaker_state` (and the fleet view's breaker column). A
/// failed health probe is not a trip: `ratewatch_breaker_trips_total`
/// counts only a closed breaker opening, which the request that tripped it
/// counts, so a shard that stays down for an hour is one trip.
impl BreakerObserver for StoreMetrics {
    fn state(&self, shard: &str, state: BreakerState) {
        metrics::record_breaker_state(shard, state.as_gauge());
    }
}

/// Samples what `store` holds (keys, memory) into the `ratewatch_store_*`
/// gauges every [`metrics::STORE_USAGE_EVERY`], off the request path, until
/// the store is dropped. A shard that does not answer keeps its last value.
/// Without a runtime nothing is sampled (the gauges stay at zero).
pub(super) fn sample_usage(store: &Arc<dyn Store>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let store: Weak<dyn Store> = Arc::downgrade(store);
    handle.spawn(async move {
        let mut every = tokio::time::interval(metrics::STORE_USAGE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(store) = store.upgrade() else {
                return;
            };
            for u in store.usage().await {
                metrics::record_store_usage(&u.shard, u.keys, u.used_bytes, u.max_bytes);
            }
        }
    });
}
