//! The background half-open probe of a health-checked breaker.
//!
//! When a breaker opens, one task per shard waits out the cooldown, takes
//! the probe permit and runs the store's probe (a fresh connection that
//! proves the decide script runs), within its budget. Success closes the
//! breaker; failure opens it for another cooldown and the task waits again.
//! The task ends when the breaker is closed, or with the breakers (it holds
//! them weakly, so a dropped limiter leaves no task behind). Recovery thus
//! takes at most one cooldown plus one probe after the shard is back, and
//! no client's request is spent on the probe.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Change;
use super::shards::{ShardBreakers, Shared};
use crate::store::StoreError;

/// Starts `shard`'s probe task unless it runs already or the breakers have
/// no prober (or there is no runtime: requests then probe once the check is
/// a cooldown late).
pub(super) fn start(breakers: &ShardBreakers, shard: &Arc<str>) {
    if breakers.shared.prober.is_none() {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if !breakers.shared.probing.lock().insert(shard.clone()) {
        return;
    }
    handle.spawn(run(Arc::downgrade(&breakers.shared), shard.clone()));
}

async fn run(shared: Weak<Shared>, shard: Arc<str>) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let breakers = ShardBreakers { shared };
        let Some(due) = breakers.next_probe_at(&shard) else {
            // Closed. A trip between this check and leaving the set would
            // find the task still registered and start none: look again.
            breakers.shared.probing.lock().remove(&shard);
            if breakers.next_probe_at(&shard).is_none()
                || !breakers.shared.probing.lock().insert(shard.clone())
            {
                return;
            }
            continue;
        };
        let now = breakers.now();
        if due > now {
            drop(breakers);
            tokio::time::sleep(Duration::from_micros(due - now)).await;
            continue;
        }
        let Some(guard) = breakers.acquire_probe(&shard) else {
            drop(breakers);
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let Some((store, budget)) = breakers.shared.prober.clone() else {
            return;
        };
        let failed = match tokio::time::timeout(budget, store.probe(&shard)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(StoreError::Timeout),
        };
        if let Some(error) = &failed {
            tracing::debug!(%shard, last_error = %error.summary(), "health probe failed");
            breakers.note_error(&shard, error);
        }
        match guard.report(failed.is_none()) {
            Change::Closed => tracing::info!(%shard, "circuit breaker closed after a health probe"),
            Change::Tripped(_) => {
                // The shard stays down: not a new trip, and one line per
                // interval at most, naming what the probe ran into.
                breakers.note_probe_trip(&shard);
                breakers.still_down(&shard);
            }
            Change::None => {}
        }
    }
}
