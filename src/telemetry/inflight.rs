//! In-flight limit metrics: slots held, holders that expired, renewals and
//! releases that failed. Labels are bounded: tier and limit names come
//! from the policy, shards are `memory` or a Redis `host:port`; no label
//! names a holder, key or identity. Every family exists at zero from
//! start-up for every in-flight limit and configured shard
//! ([`register_at_zero`]).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use metrics::{Label, counter, describe_counter, describe_gauge, gauge};

use super::metrics::{LABEL_LIMIT, LABEL_SHARD, LABEL_TIER};
use crate::policy::Policy;

/// Slots this instance holds now: gauge {tier, limit}. Summed over the
/// fleet it is what the store counts (less holders that crashed and have
/// not expired yet).
pub const INFLIGHT_SLOTS: &str = "ratewatch_inflight_slots";
/// Holders dropped past their deadline (a holder that neither released nor
/// renewed: a crashed process): counter {shard}.
pub const INFLIGHT_EXPIRED_TOTAL: &str = "ratewatch_inflight_expired_holders_total";
/// Renewals that failed: the store could not be asked, or the holder was
/// already gone (its slot may have gone to another request): counter
/// {shard}.
pub const INFLIGHT_RENEWALS_FAILED_TOTAL: &str = "ratewatch_inflight_renewals_failed_total";
/// Releases the store did not take (down, timed out): the slot comes back
/// after its hold timeout instead: counter {shard}.
pub const INFLIGHT_RELEASES_FAILED_TOTAL: &str = "ratewatch_inflight_releases_failed_total";

/// Describes the in-flight families to the current recorder.
pub fn describe() {
    describe_gauge!(
        INFLIGHT_SLOTS,
        "In-flight slots this instance holds, by tier and limit."
    );
    describe_counter!(
        INFLIGHT_EXPIRED_TOTAL,
        "In-flight holders dropped past their hold timeout (never released nor renewed), by shard."
    );
    describe_counter!(
        INFLIGHT_RENEWALS_FAILED_TOTAL,
        "In-flight renewals that failed (store error, or the holder was already gone), by shard."
    );
    describe_counter!(
        INFLIGHT_RELEASES_FAILED_TOTAL,
        "In-flight releases the store did not take (the slot expires after its hold timeout), by shard."
    );
}

/// Makes every in-flight family exist at zero: the slots gauge for every
/// in-flight limit of the policy, the counters for every shard.
pub fn register_at_zero(policy: &Policy, shards: &[String]) {
    describe();
    let limiter = super::metrics::zero_limiter(policy);
    for tier in &policy.tiers {
        let route_limits = policy.routes.iter().flat_map(|r| r.limits.iter());
        for limit in tier.limits.iter().chain(route_limits) {
            if limit.algorithm.is_concurrency() {
                let mut labels = vec![
                    Label::new(LABEL_TIER, tier.name.clone()),
                    Label::new(LABEL_LIMIT, limit.name.clone()),
                ];
                super::metrics::push_limiter(&mut labels, limiter.as_ref());
                gauge!(INFLIGHT_SLOTS, labels).increment(0.0);
            }
        }
    }
    for shard in shards {
        counter!(INFLIGHT_EXPIRED_TOTAL, LABEL_SHARD => shard.clone()).increment(0);
        counter!(INFLIGHT_RENEWALS_FAILED_TOTAL, LABEL_SHARD => shard.clone()).increment(0);
        counter!(INFLIGHT_RELEASES_FAILED_TOTAL, LABEL_SHARD => shard.clone()).increment(0);
    }
}

/// `delta` slots taken (+) or given back (-) under `tier`'s `limit`, by
/// the limiter named `limiter` (the gauge carries `limiter="<name>"`) or
/// an unnamed one (`None`: no such label).
pub(crate) fn slots(tier: &str, limit: &str, limiter: Option<&Arc<str>>, delta: f64) {
    let series = super::labelled::Series {
        family: INFLIGHT_SLOTS,
        first: (LABEL_TIER, tier),
        second: (LABEL_LIMIT, limit),
        third: None,
        limiter,
    };
    super::labelled::shift(&series, delta);
    let step = delta as i64;
    // Each thread keeps the counts it moved, so a slot taken or given back
    // touches one atomic, not the process-wide list under its lock.
    let kept = COUNTS
        .try_with(|counts| {
            counts
                .borrow()
                .iter()
                .find(|(t, l, _)| **t == *tier && **l == *limit)
                .map(|(_, _, n)| n.fetch_add(step, Ordering::Relaxed))
                .is_some()
        })
        .unwrap_or(false);
    if kept {
        return;
    }
    let count = {
        let mut held = HELD.lock();
        match held.iter().find(|(t, l, _)| t == tier && l == limit) {
            Some((_, _, n)) => n.clone(),
            None if held.len() < super::MAX_SERIES => {
                let n = Arc::new(AtomicI64::new(0));
                held.push((tier.to_owned(), limit.to_owned(), n.clone()));
                n
            }
            None => return,
        }
    };
    count.fetch_add(step, Ordering::Relaxed);
    let _ = COUNTS.try_with(|counts| {
        let mut counts = counts.borrow_mut();
        if counts.len() < super::MAX_SERIES {
            counts.push((tier.into(), limit.into(), count));
        }
    });
}

/// Slots held now in this process per (tier, limit): what the gauge
/// says, readable without the recorder (an app may own it). Taken and
/// given back only with slots, never per decision.
static HELD: parking_lot::Mutex<Vec<(String, String, Arc<AtomicI64>)>> =
    parking_lot::Mutex::new(Vec::new());

/// One count of [`HELD`] a thread keeps: its tier, limit and count.
type KeptCount = (Box<str>, Box<str>, Arc<AtomicI64>);

thread_local! {
    /// The counts of [`HELD`] this thread has moved, by tier and limit.
    static COUNTS: RefCell<Vec<KeptCount>> = const { RefCell::new(Vec::new()) };
}

/// One in-flight limit's slots, as the dashboard shows them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotsHeld {
    /// The tier.
    pub tier: String,
    /// The in-flight limit's name.
    pub limit: String,
    /// Slots this process holds now.
    pub held: u64,
    /// The limit's slots per identity (its `limit`).
    pub capacity: u64,
}

/// Slots this process holds now under `tier`'s `limit` (the
/// [`INFLIGHT_SLOTS`] gauge's value, whatever recorder is installed).
pub fn held_now(tier: &str, limit: &str) -> u64 {
    HELD.lock()
        .iter()
        .find(|(t, l, _)| t == tier && l == limit)
        .map_or(0, |(_, _, n)| n.load(Ordering::Relaxed).max(0) as u64)
}

/// Every in-flight limit of `policy` (tier limits, and route limits that
/// apply to the tier) with the slots this process holds now.
pub fn slots_held(policy: &Policy) -> Vec<SlotsHeld> {
    let mut out: Vec<SlotsHeld> = Vec::new();
    for tier in &policy.tiers {
        let route_limits = policy
            .routes
            .iter()
            .flat_map(|r| r.limits.iter())
            .filter(|l| l.applies_to(&tier.name));
        for limit in tier.limits.iter().chain(route_limits) {
            if !limit.algorithm.is_concurrency()
                || out
                    .iter()
                    .any(|s| s.tier == tier.name && s.limit == limit.name)
            {
                continue;
            }
            out.push(SlotsHeld {
                tier: tier.name.clone(),
                limit: limit.name.clone(),
                held: held_now(&tier.name, &limit.name),
                capacity: limit.algorithm.quota(),
            });
        }
    }
    out
}

/// `n` expired holders dropped on `shard`.
pub(crate) fn expired(shard: &str, n: u64) {
    counter!(INFLIGHT_EXPIRED_TOTAL, LABEL_SHARD => shard.to_owned()).increment(n);
}

/// `n` renewals failed on `shard`.
pub(crate) fn renewals_failed(shard: &str, n: u64) {
    counter!(INFLIGHT_RENEWALS_FAILED_TOTAL, LABEL_SHARD => shard.to_owned()).increment(n);
}

/// A release failed on `shard`.
pub(crate) fn release_failed(shard: &str) {
    counter!(INFLIGHT_RELEASES_FAILED_TOTAL, LABEL_SHARD => shard.to_owned()).increment(1);
}
