//! What a store and its breakers report besides decisions, turned into
//! metrics. The store knows only the [`StoreObserver`] trait, the breakers
//! only [`BreakerObserver`]; the limiter, which sits above them, connects
//! both to telemetry.

use crate::resilience::{BreakerObserver, BreakerState};
use crate::store::StoreObserver;
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
}

/// Sets `ratewatch_breaker_state` (and the fleet view's breaker column) and
/// counts trips found by health probes in `ratewatch_breaker_trips_total`.
impl BreakerObserver for StoreMetrics {
    fn state(&self, shard: &str, state: BreakerState) {
        metrics::record_breaker_state(shard, state.as_gauge());
    }

    fn probe_tripped(&self, shard: &str) {
        metrics::record_breaker_trip(shard);
    }
}
