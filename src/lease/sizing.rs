//! How many units a lease takes, and when a key is in its exact tail.
//!
//! The largest lease (`cap`) is what the false-refusal bound is made of:
//! at most `instances × cap` units can sit unspent in other instances'
//! leases while one instance is refused, so it is kept a small share of
//! the smallest quota. A bucket's lease is also held to what the bucket
//! refills within one lease TTL, so a dead holder's tokens come back within
//! the lease's lifetime.

use crate::algorithm::Algorithm;
use crate::policy::LeaseSettings;
use crate::store::Item;

/// The largest lease, in units, for a request of `items` costing `cost`:
/// `max_share × smallest quota / instances`, no more than a bucket refills
/// in one TTL, and never below `cost` (a lease must hold one request).
pub(crate) fn max_lease(
    items: &[Item],
    cost: u64,
    settings: &LeaseSettings,
    instances: u32,
) -> u64 {
    let ttl = settings.ttl.as_secs_f64();
    let mut cap = f64::INFINITY;
    for item in items.iter().filter(|i| !i.shadow) {
        let share =
            settings.max_share * item.algorithm.quota() as f64 / f64::from(instances.max(1));
        cap = cap.min(share);
        match item.algorithm {
            Algorithm::TokenBucket {
                refill_per_second, ..
            } => cap = cap.min(refill_per_second * ttl),
            Algorithm::Gcra {
                rate_per_second, ..
            } => cap = cap.min(rate_per_second * ttl),
            _ => {}
        }
    }
    if !cap.is_finite() {
        return cost;
    }
    (cap.floor() as u64).max(cost)
}

/// The units to take now: what `rate` (units per second) spends in one
/// renew interval, at least `cost`, with what is `held` no more than `cap`.
pub(crate) fn take_size(
    rate: f64,
    held: u64,
    cost: u64,
    cap: u64,
    settings: &LeaseSettings,
) -> u64 {
    let want = (rate * settings.renew.as_secs_f64()).ceil() as u64;
    want.min(cap.saturating_sub(held)).max(cost)
}

/// Below this many units held, a lease is renewed in the background: half
/// of what the last take wanted, so the renewal lands before the lease runs
/// dry at a steady rate.
pub(crate) fn low_water(last_take: u64, cost: u64) -> u64 {
    (last_take / 2).max(cost)
}

/// Whether a take that left `remaining` (the smallest enforced remaining)
/// is in the quota's tail: fewer than every instance's largest lease. From
/// there leases shrink to [`tail_lease`] until the lease expires, so the
/// last units of a quota go to whoever asks for them, not to a lease that
/// may sit unspent.
pub(crate) fn in_tail(remaining: f64, cap: u64, instances: u32) -> bool {
    remaining < (cap * u64::from(instances.max(1))) as f64
}

/// The largest lease in the tail, when a take left `remaining`: a share of
/// what is left such that every instance's lease together holds at most
/// half of it. Each take in the tail halves what can sit unspent, so the
/// last units of a window cost a few takes per instance instead of one
/// store call per request; 0 (decide per request) once not one unit fits.
pub(crate) fn tail_lease(remaining: f64, instances: u32) -> u64 {
    let share = remaining / (2.0 * f64::from(instances.max(1)));
    // `as` saturates: a negative or NaN share is 0.
    share.floor() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fw(limit: u64) -> Item {
        Item::new(
            "k",
            Algorithm::FixedWindow {
                limit,
                window_us: 1_000_000,
            },
        )
    }

    #[test]
    fn the_largest_lease_is_a_share_of_the_smallest_quota_per_instance() {
        let s = LeaseSettings::default();
        assert_eq!(max_lease(&[fw(1200), fw(120)], 1, &s, 3), 10);
        // Never below one request.
        assert_eq!(max_lease(&[fw(4)], 2, &s, 3), 2);
    }

    #[test]
    fn a_buckets_lease_is_what_it_refills_within_one_ttl() {
        let s = LeaseSettings {
            ttl: Duration::from_millis(500),
            ..LeaseSettings::default()
        };
        let tb = Item::new(
            "k",
            Algorithm::TokenBucket {
                capacity: 10_000,
                refill_per_second: 40.0,
            },
        );
        assert_eq!(max_lease(&[tb], 1, &s, 1), 20);
    }

    #[test]
    fn a_take_follows_the_rate_within_the_cap() {
        let s = LeaseSettings::default(); // renew 100 ms
        assert_eq!(take_size(500.0, 0, 1, 100, &s), 50);
        assert_eq!(take_size(500.0, 80, 1, 100, &s), 20);
        assert_eq!(take_size(0.0, 0, 3, 100, &s), 3);
        assert_eq!(take_size(1e6, 0, 1, 100, &s), 100);
    }

    #[test]
    fn the_tail_starts_below_every_instances_largest_lease() {
        assert!(in_tail(29.0, 10, 3));
        assert!(!in_tail(30.0, 10, 3));
    }

    #[test]
    fn tail_leases_hold_at_most_half_of_what_is_left_across_instances() {
        assert_eq!(tail_lease(29.0, 3), 4);
        assert_eq!(tail_lease(6.0, 3), 1);
        // Not one unit per instance: per request.
        assert_eq!(tail_lease(5.0, 3), 0);
        assert_eq!(tail_lease(-1.0, 3), 0);
        assert_eq!(tail_lease(f64::NAN, 3), 0);
    }
}
