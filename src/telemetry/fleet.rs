//! The fleet view: what every instance flushed, merged over a time range.
//!
//! Buckets come in two resolutions (10 s kept an hour, 1 min kept two
//! days); each bucket holds the counter, top-blocked, RTT and breaker-trip
//! data of every instance that flushed into it. [`FleetStats`] is the merge
//! of the buckets of one range, the same whether they were read from Redis
//! or from the in-process ring.

use std::collections::BTreeMap;

use ahash::AHashMap;
use serde::Serialize;

use super::Outcome;
use super::aggregate::{Flat, parse_counter_field, parse_rtt_field};
use super::metrics::RTT_BUCKETS;

/// One bucket resolution of the fleet view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    /// Bucket width in seconds.
    pub secs: u64,
    /// How long a bucket is kept, in seconds.
    pub keep: u64,
    /// Its name in keys (`10s`, `1m`).
    pub name: &'static str,
}

/// Every resolution, finest first.
pub const RESOLUTIONS: [Resolution; 2] = [
    Resolution {
        secs: 10,
        keep: 3600,
        name: "10s",
    },
    Resolution {
        secs: 60,
        keep: 2 * 86_400,
        name: "1m",
    },
];

impl Resolution {
    /// The start of the bucket holding `t` (Unix seconds).
    pub fn bucket_of(self, t: u64) -> u64 {
        t - t % self.secs
    }

    /// The bucket's hash tag content: `10s:1700000000`.
    pub fn tag(self, start: u64) -> String {
        format!("{}:{start}", self.name)
    }

    /// The resolution that answers `[from, to]` at `now`: 10 s buckets
    /// while they still exist for the whole range, else 1 min.
    pub fn for_range(from: u64, to: u64, now: u64) -> Resolution {
        let fine = RESOLUTIONS[0];
        if to.saturating_sub(from) <= fine.keep && from + fine.keep >= now + fine.secs {
            fine
        } else {
            RESOLUTIONS[1]
        }
    }

    /// The bucket starts covering `[from, to]`, clamped to what is kept.
    pub fn starts(self, from: u64, to: u64, now: u64) -> Vec<u64> {
        let oldest = self.bucket_of(now.saturating_sub(self.keep));
        let first = self.bucket_of(from).max(oldest);
        let last = self.bucket_of(to.min(now));
        (0..)
            .map(|i| first + i * self.secs)
            .take_while(|s| *s <= last)
            .collect()
    }
}

/// A blocked identity and how often it was blocked (space-saving counts:
/// never below the true count).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedKey {
    /// The identity in display form (masked by default).
    pub identity: String,
    /// Blocked decisions.
    pub blocked: u64,
}

/// Round trips to one shard over the range.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RttStats {
    /// Round trips counted.
    pub count: u64,
    /// Median, in seconds, interpolated within the histogram buckets.
    pub p50_s: f64,
    /// 99th percentile, in seconds.
    pub p99_s: f64,
}

/// The whole fleet over a time range, for the dashboard and its JSON API.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct FleetStats {
    /// Range start, Unix seconds.
    pub from: u64,
    /// Range end, Unix seconds.
    pub to: u64,
    /// Width of the buckets used, in seconds.
    pub resolution_s: u64,
    /// All decisions in the range.
    pub decisions: u64,
    /// Decisions per tier, then per outcome (every outcome listed).
    pub totals: BTreeMap<String, BTreeMap<String, u64>>,
    /// Decisions per route pattern, then per outcome.
    pub by_route: BTreeMap<String, BTreeMap<String, u64>>,
    /// Decisions per shard, then per outcome.
    pub by_shard: BTreeMap<String, BTreeMap<String, u64>>,
    /// Start of every bucket in the range, the x axis of `series`.
    pub bucket_starts: Vec<u64>,
    /// Per tier, per outcome: decisions in each bucket of `bucket_starts`.
    pub series: BTreeMap<String, BTreeMap<String, Vec<u64>>>,
    /// Most blocked identities, highest first.
    pub top_blocked: Vec<BlockedKey>,
    /// Redis round trips per shard.
    pub rtt: BTreeMap<String, RttStats>,
    /// Circuit breaker trips per shard.
    pub breaker_trips: BTreeMap<String, u64>,
    /// `fallback_allowed` / all decisions (0 when there were none).
    pub fail_open_rate: f64,
    /// The policies instances ran while flushing in the range, most
    /// recently seen first: more than one seen lately is a rollout in
    /// progress (or stuck).
    pub policies: Vec<PolicySeen>,
}

/// A policy some instance ran while flushing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct PolicySeen {
    /// The policy's `version` (empty if it names none).
    pub version: String,
    /// Its content hash.
    pub hash: String,
    /// Flushes that carried it (one per instance per flush interval with
    /// traffic).
    pub flushes: u64,
    /// Start of the latest bucket it was seen in, Unix seconds.
    pub last_seen: u64,
}

fn outcome_map() -> BTreeMap<String, u64> {
    Outcome::ALL
        .iter()
        .map(|o| (o.as_str().to_owned(), 0))
        .collect()
}

/// Merges the buckets of `[from, to]` (each `(start, data)`, `starts`
/// giving every bucket of the range in order) into fleet stats.
pub(crate) fn merge(
    from: u64,
    to: u64,
    res: Resolution,
    starts: Vec<u64>,
    buckets: &[(u64, Flat)],
    top_n: usize,
) -> FleetStats {
    let mut s = FleetStats {
        from,
        to,
        resolution_s: res.secs,
        ..FleetStats::default()
    };
    let index: AHashMap<u64, usize> = starts.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut top: AHashMap<&str, u64> = AHashMap::new();
    let mut rtt: BTreeMap<String, [u64; RTT_BUCKETS.len() + 1]> = BTreeMap::new();
    let mut fallback_allowed = 0;
    let mut policies: AHashMap<&str, (u64, u64)> = AHashMap::new();
    for (start, b) in buckets {
        let Some(&slot) = index.get(start) else {
            continue;
        };
        for (field, n) in &b.counters {
            let Some((tier, outcome, shard, route)) = parse_counter_field(field) else {
                continue;
            };
            s.decisions += n;
            if outcome == Outcome::FallbackAllowed.as_str() {
                fallback_allowed += n;
            }
            for (map, k) in [
                (&mut s.totals, tier),
                (&mut s.by_route, route),
                (&mut s.by_shard, shard),
            ] {
                *map.entry(k.to_owned())
                    .or_insert_with(outcome_map)
                    .entry(outcome.to_owned())
                    .or_insert(0) += n;
            }
            let per_tier = s.series.entry(tier.to_owned()).or_insert_with(|| {
                Outcome::ALL
                    .iter()
                    .map(|o| (o.as_str().to_owned(), vec![0; starts.len()]))
                    .collect()
            });
            per_tier
                .entry(outcome.to_owned())
                .or_insert_with(|| vec![0; starts.len()])[slot] += n;
        }
        for (id, n) in &b.top {
            *top.entry(id.as_str()).or_insert(0) += n;
        }
        for (field, n) in &b.rtt {
            if let Some((shard, i)) = parse_rtt_field(field) {
                rtt.entry(shard.to_owned())
                    .or_insert([0; RTT_BUCKETS.len() + 1])[i] += n;
            }
        }
        for (shard, n) in &b.trips {
            *s.breaker_trips.entry(shard.clone()).or_insert(0) += n;
        }
        for (policy, n) in &b.policies {
            let seen = policies.entry(policy.as_str()).or_insert((0, 0));
            seen.0 += n;
            seen.1 = seen.1.max(*start);
        }
    }
    s.policies = policies
        .into_iter()
        .map(|(p, (flushes, last_seen))| {
            let (version, hash) = p.rsplit_once('#').unwrap_or(("", p));
            PolicySeen {
                version: version.to_owned(),
                hash: hash.to_owned(),
                flushes,
                last_seen,
            }
        })
        .collect();
    s.policies.sort_by(|a, b| {
        b.last_seen
            .cmp(&a.last_seen)
            .then_with(|| b.flushes.cmp(&a.flushes))
    });
    let mut top: Vec<BlockedKey> = top
        .into_iter()
        .map(|(identity, blocked)| BlockedKey {
            identity: identity.to_owned(),
            blocked,
        })
        .collect();
    top.sort_by(|a, b| {
        b.blocked
            .cmp(&a.blocked)
            .then_with(|| a.identity.cmp(&b.identity))
    });
    top.truncate(top_n);
    s.top_blocked = top;
    s.rtt = rtt
        .into_iter()
        .map(|(shard, counts)| {
            let count = counts.iter().sum();
            let stats = RttStats {
                count,
                p50_s: quantile(&counts, 0.5),
                p99_s: quantile(&counts, 0.99),
            };
            (shard, stats)
        })
        .collect();
    if s.decisions > 0 {
        s.fail_open_rate = fallback_allowed as f64 / s.decisions as f64;
    }
    s.bucket_starts = starts;
    s
}

/// The `q` quantile of bucket counts (last slot `+Inf`), interpolated
/// linearly inside its bucket like PromQL's `histogram_quantile`; values
/// in `+Inf` answer the highest finite bound.
pub fn quantile(counts: &[u64], q: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, n) in counts.iter().enumerate() {
        if *n > 0 && (below + n) as f64 >= rank {
            let Some(&upper) = RTT_BUCKETS.get(i) else {
                return RTT_BUCKETS[RTT_BUCKETS.len() - 1];
            };
            let lower = if i == 0 { 0.0 } else { RTT_BUCKETS[i - 1] };
            return lower + (upper - lower) * ((rank - below as f64) / *n as f64);
        }
        below += n;
    }
    RTT_BUCKETS[RTT_BUCKETS.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_fall_inside_the_bucket_holding_the_rank() {
        let mut c = [0u64; RTT_BUCKETS.len() + 1];
        c[3] = 98; // (0.0005, 0.001]
        c[8] = 2; // (0.025, 0.05]
        let p50 = quantile(&c, 0.5);
        assert!(p50 > 0.0005 && p50 <= 0.001, "{p50}");
        let p99 = quantile(&c, 0.99);
        assert!(p99 > 0.025 && p99 <= 0.05, "{p99}");
        assert_eq!(quantile(&[0; 15], 0.99), 0.0);
    }

    #[test]
    fn ten_second_buckets_answer_the_last_hour_and_minutes_answer_older_ranges() {
        let now = 1_700_000_000;
        assert_eq!(Resolution::for_range(now - 600, now, now).secs, 10);
        assert_eq!(Resolution::for_range(now - 7200, now, now).secs, 60);
        let starts = RESOLUTIONS[0].starts(now - 25, now, now);
        assert_eq!(starts, vec![now - 30, now - 20, now - 10, now]);
    }

    #[test]
    fn merged_buckets_sum_counters_per_tier_and_outcome_and_fill_the_series() {
        let res = RESOLUTIONS[0];
        let b = |n| Flat {
            counters: vec![
                ("free|allowed|memory|*".into(), n),
                ("free|fallback_allowed|memory|/x".into(), 1),
            ],
            top: vec![("free_ab…1234".into(), n)],
            ..Flat::default()
        };
        let s = merge(
            0,
            30,
            res,
            vec![0, 10, 20],
            &[(0, b(3)), (20, b(5)), (20, b(1))],
            10,
        );
        assert_eq!(s.totals["free"]["allowed"], 9);
        assert_eq!(s.totals["free"]["blocked"], 0);
        assert_eq!(s.series["free"]["allowed"], vec![3, 0, 6]);
        assert_eq!(s.decisions, 12);
        assert!((s.fail_open_rate - 3.0 / 12.0).abs() < 1e-9);
        assert_eq!(s.top_blocked[0].blocked, 9);
        assert_eq!(s.by_route["/x"]["fallback_allowed"], 3);
    }
}
