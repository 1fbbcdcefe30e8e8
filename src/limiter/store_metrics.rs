//! What a store reports besides its decisions, turned into metrics. The
//! store knows only the [`StoreObserver`] trait; the limiter, which sits
//! above both, connects it to telemetry.

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
