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
use super::aggregate::{
    BREAKER_STATES, Flat, parse_blocked_member, parse_breaker_field, parse_counter_field,
    parse_hot_member, parse_rtt_field, parse_unit_field, parse_unit_member, split_display_name,
};
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

/// A blocked identity, why, and how often (space-saving counts: never
/// below the true count).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedKey {
    /// The identity in display form (masked by default).
    pub identity: String,
    /// The display name the app gave it (a customer id), if any.
    pub name: Option<String>,
    /// Why: the name of the limit that blocked, `fail_closed` (a refusal
    /// because the store could not decide, not a block) or
    /// `local_fallback` (the local fallback limiter blocked).
    pub cause: String,
    /// Blocked decisions.
    pub blocked: u64,
}

/// An identity by traffic, blocked or not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HotKey {
    /// The identity in display form (masked by default).
    pub identity: String,
    /// The display name the app gave it (a customer id), if any.
    pub name: Option<String>,
    /// Its tier.
    pub tier: String,
    /// The shard that decided it.
    pub shard: String,
    /// Decisions (space-saving count: never below the true count).
    pub decisions: u64,
    /// Its share of all decisions in the range, 0 to 1.
    pub share: f64,
}

/// An identity among those charged the most of one unit (tokens, bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnitKey {
    /// Display form (masked, hashed or raw per policy).
    pub identity: String,
    /// The caller's display name, if it named one.
    pub name: Option<String>,
    /// The tier it was charged under.
    pub tier: String,
    /// Units charged over the range (admitted decisions only).
    pub units: u64,
    /// Its share of the unit's total over the range (0..=1).
    pub share: f64,
}

/// The shard deciding the most.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HotShard {
    /// The shard.
    pub shard: String,
    /// Its decisions.
    pub decisions: u64,
    /// Its share of all decisions, 0 to 1.
    pub share: f64,
}

/// One shard's round-trip quantiles per bucket (`None`: no round trip in
/// that bucket).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct RttSeries {
    /// Median per bucket, seconds.
    pub p50_s: Vec<Option<f64>>,
    /// 99th percentile per bucket, seconds.
    pub p99_s: Vec<Option<f64>>,
}

/// Where a view came from, and why it is not the fleet's when it is not.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct ViewSource {
    /// `fleet` (every instance, read from Redis), `in_process` (the memory
    /// store: this instance is the fleet), `instance` (this instance only,
    /// because the fleet view did not answer) or `disabled` (a
    /// metrics-only pipeline: nothing is kept).
    pub kind: &'static str,
    /// Set while the fleet view in Redis does not answer.
    pub fleet_unavailable: Option<Unavailable>,
    /// Events this instance flushed that the fleet view in Redis has not
    /// taken yet: kept, and written into their original buckets when it
    /// answers again (0 without Redis).
    pub unflushed_events: u64,
    /// The 10 s buckets those events belong to.
    pub unflushed_buckets: usize,
    /// Events this instance dropped since start because more than an
    /// hour of buckets waited for Redis (also in
    /// `ratewatch_telemetry_dropped_total{reason="buffer_full"}`).
    pub dropped_events: u64,
    /// The latest outage of the fleet view this instance lived through
    /// and recovered from, with what it kept and wrote afterwards (`None`
    /// until one ended, and always without Redis).
    pub last_outage: Option<Outage>,
    /// Buckets of the range the fleet view in Redis did not answer while
    /// the others did (a Redis Cluster master that is down holds them):
    /// their part of the view is this instance's own, and stale. Empty
    /// otherwise.
    pub stale_buckets: Vec<u64>,
    /// Why the last of them did not answer.
    pub stale_reason: Option<String>,
}

/// An outage of the fleet view in Redis that ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outage {
    /// When this instance first failed to reach it, Unix seconds.
    pub since: u64,
    /// When the batches it kept were written, Unix seconds.
    pub until: u64,
    /// The last error seen during it.
    pub reason: String,
    /// Events this instance kept during it and wrote into their own
    /// buckets when Redis answered again.
    pub kept_events: u64,
    /// The 10 s buckets those events were written into.
    pub kept_buckets: usize,
}

/// An instance that flushed into the range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceSeen {
    /// Its name (`telemetry` instance name: `RATEWATCH_INSTANCE`, or
    /// `host:pid`).
    pub instance: String,
    /// Events it flushed in the range.
    pub events: u64,
    /// Its latest flush in the range, Unix seconds.
    pub last_report: u64,
}

/// Why the fleet view is not shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unavailable {
    /// When it stopped answering, Unix seconds.
    pub since: u64,
    /// What went wrong last.
    pub reason: String,
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
    /// Most blocked identities, highest first, each with its cause.
    pub top_blocked: Vec<BlockedKey>,
    /// Blocked or refused requests per cause (limit name, `fail_closed`,
    /// `local_fallback`), over the top-blocked entries.
    pub blocked_by_cause: BTreeMap<String, u64>,
    /// Identities with the most decisions, highest first.
    pub hot_keys: Vec<HotKey>,
    /// Units admitted decisions were charged, per tier then unit (the
    /// fleet's `ratewatch_units_charged_total` over the range).
    pub units: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per unit, the identities charged the most, highest first.
    pub top_units: BTreeMap<String, Vec<UnitKey>>,
    /// In-flight slots held now per tier and in-flight limit, by the
    /// process answering (the fleet's sum is the
    /// `ratewatch_inflight_slots` gauge summed over instances). Filled by
    /// the dashboard; empty from [`FleetReader::query`](super::FleetReader::query).
    pub slots_held: Vec<super::inflight::SlotsHeld>,
    /// The shard with the most decisions, if any decided.
    pub hot_shard: Option<HotShard>,
    /// Per shard: decisions in each bucket of `bucket_starts`.
    pub shard_series: BTreeMap<String, Vec<u64>>,
    /// Per bucket: `fallback_allowed` / all decisions (`None` without
    /// decisions).
    pub fail_open_series: Vec<Option<f64>>,
    /// Per shard: round-trip p50 and p99 in each bucket.
    pub rtt_series: BTreeMap<String, RttSeries>,
    /// Per shard: the worst breaker state any instance reported in each
    /// bucket (`closed`, `half_open`, `open`; `None` when none reported).
    pub breaker_series: BTreeMap<String, Vec<Option<&'static str>>>,
    /// Redis round trips per shard.
    pub rtt: BTreeMap<String, RttStats>,
    /// Circuit breaker trips per shard.
    pub breaker_trips: BTreeMap<String, u64>,
    /// `fallback_allowed` / all decisions (0 when there were none).
    pub fail_open_rate: f64,
    /// `blocked` (refused by a limit; not the failure policy's refusals)
    /// / all decisions (0 when there were none).
    pub block_rate: f64,
    /// The same rates over the period just before this one, as long as
    /// this one, for the trend (`None` when it was not read).
    pub previous: Option<PeriodRates>,
    /// Where this view came from.
    pub source: ViewSource,
    /// The policies instances ran while flushing in the range, most
    /// recently seen first: more than one seen lately is a rollout in
    /// progress (or stuck).
    pub policies: Vec<PolicySeen>,
    /// The instances that flushed events in the range, latest report
    /// first (at most [`MAX_INSTANCES_LISTED`]).
    pub instances: Vec<InstanceSeen>,
}

/// The headline rates of one period.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct PeriodRates {
    /// Period start, Unix seconds.
    pub from: u64,
    /// Period end, Unix seconds.
    pub to: u64,
    /// All decisions in it.
    pub decisions: u64,
    /// Its block rate (see [`FleetStats::block_rate`]).
    pub block_rate: f64,
    /// Its fail-open rate.
    pub fail_open_rate: f64,
}

impl FleetStats {
    /// This view's headline rates.
    pub fn rates(&self) -> PeriodRates {
        PeriodRates {
            from: self.from,
            to: self.to,
            decisions: self.decisions,
            block_rate: self.block_rate,
            fail_open_rate: self.fail_open_rate,
        }
    }
}

/// Most instances [`FleetStats::instances`] lists (the latest reports):
/// a page lists a fleet, not every pod a rollout ever started.
pub const MAX_INSTANCES_LISTED: usize = 200;

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
    let mut hot: AHashMap<&str, u64> = AHashMap::new();
    let mut unit_keys: AHashMap<&str, u64> = AHashMap::new();
    let mut rtt: BTreeMap<String, [u64; RTT_BUCKETS.len() + 1]> = BTreeMap::new();
    let mut rtt_per_bucket: BTreeMap<String, Vec<[u64; RTT_BUCKETS.len() + 1]>> = BTreeMap::new();
    let mut per_bucket = vec![(0u64, 0u64); starts.len()];
    let mut breakers: BTreeMap<String, Vec<Option<u8>>> = BTreeMap::new();
    let mut fallback_allowed = 0;
    let mut policies: AHashMap<&str, (u64, u64)> = AHashMap::new();
    let mut instances: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (start, b) in buckets {
        let Some(&slot) = index.get(start) else {
            continue;
        };
        for (field, n) in &b.counters {
            let Some((tier, outcome, shard, route)) = parse_counter_field(field) else {
                continue;
            };
            s.decisions += n;
            per_bucket[slot].1 += n;
            if outcome == Outcome::FallbackAllowed.as_str() {
                fallback_allowed += n;
                per_bucket[slot].0 += n;
            }
            s.shard_series
                .entry(shard.to_owned())
                .or_insert_with(|| vec![0; starts.len()])[slot] += n;
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
        for (field, n) in &b.units {
            if let Some((tier, unit)) = parse_unit_field(field) {
                *s.units
                    .entry(tier.to_owned())
                    .or_default()
                    .entry(unit.to_owned())
                    .or_insert(0) += n;
            }
        }
        for (member, n) in &b.unit_keys {
            *unit_keys.entry(member.as_str()).or_insert(0) += n;
        }
        for (id, n) in &b.hot {
            *hot.entry(id.as_str()).or_insert(0) += n;
        }
        for (field, n) in &b.rtt {
            if let Some((shard, i)) = parse_rtt_field(field) {
                rtt.entry(shard.to_owned())
                    .or_insert([0; RTT_BUCKETS.len() + 1])[i] += n;
                rtt_per_bucket
                    .entry(shard.to_owned())
                    .or_insert_with(|| vec![[0; RTT_BUCKETS.len() + 1]; starts.len()])[slot][i] +=
                    n;
            }
        }
        for (field, seen) in &b.breakers {
            if let Some((shard, state)) = parse_breaker_field(field) {
                if *seen > 0 {
                    let cell = &mut breakers
                        .entry(shard.to_owned())
                        .or_insert_with(|| vec![None; starts.len()])[slot];
                    *cell = Some(cell.map_or(state, |c: u8| c.max(state)));
                }
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
        for (name, n) in &b.instances {
            instances.entry(name.as_str()).or_insert((0, 0)).0 += n;
        }
        for (name, at) in &b.reported {
            let seen = instances.entry(name.as_str()).or_insert((0, 0));
            seen.1 = seen.1.max(*at);
        }
    }
    s.instances = instances
        .into_iter()
        .map(|(name, (events, last_report))| InstanceSeen {
            instance: name.to_owned(),
            events,
            last_report,
        })
        .collect();
    s.instances.sort_by(|a, b| {
        b.last_report
            .cmp(&a.last_report)
            .then_with(|| a.instance.cmp(&b.instance))
    });
    s.instances.truncate(MAX_INSTANCES_LISTED);
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
        .map(|(member, blocked)| {
            let (cause, identity) = parse_blocked_member(member);
            let (identity, name) = split_display_name(identity);
            BlockedKey {
                identity: identity.to_owned(),
                name: name.map(str::to_owned),
                cause: cause.to_owned(),
                blocked,
            }
        })
        .collect();
    for k in &top {
        *s.blocked_by_cause.entry(k.cause.clone()).or_insert(0) += k.blocked;
    }
    top.sort_by(|a, b| {
        b.blocked
            .cmp(&a.blocked)
            .then_with(|| a.identity.cmp(&b.identity))
            .then_with(|| a.cause.cmp(&b.cause))
    });
    top.truncate(top_n);
    s.top_blocked = top;
    let total = s.decisions.max(1) as f64;
    let mut hot: Vec<HotKey> = hot
        .into_iter()
        .filter_map(|(member, decisions)| {
            let (tier, shard, identity) = parse_hot_member(member)?;
            let (identity, name) = split_display_name(identity);
            Some(HotKey {
                identity: identity.to_owned(),
                name: name.map(str::to_owned),
                tier: tier.to_owned(),
                shard: shard.to_owned(),
                decisions,
                share: (decisions as f64 / total).min(1.0),
            })
        })
        .collect();
    hot.sort_by(|a, b| {
        b.decisions
            .cmp(&a.decisions)
            .then_with(|| a.identity.cmp(&b.identity))
    });
    hot.truncate(top_n);
    s.hot_keys = hot;
    let mut unit_totals: BTreeMap<&str, u64> = BTreeMap::new();
    for per in s.units.values() {
        for (unit, n) in per {
            *unit_totals.entry(unit.as_str()).or_insert(0) += n;
        }
    }
    for (member, units) in unit_keys {
        let Some((unit, tier, identity)) = parse_unit_member(member) else {
            continue;
        };
        let (identity, name) = split_display_name(identity);
        let total = unit_totals
            .get(unit)
            .copied()
            .unwrap_or(0)
            .max(units)
            .max(1);
        s.top_units
            .entry(unit.to_owned())
            .or_default()
            .push(UnitKey {
                identity: identity.to_owned(),
                name: name.map(str::to_owned),
                tier: tier.to_owned(),
                units,
                share: units as f64 / total as f64,
            });
    }
    for keys in s.top_units.values_mut() {
        keys.sort_by(|a, b| {
            b.units
                .cmp(&a.units)
                .then_with(|| a.identity.cmp(&b.identity))
                .then_with(|| a.tier.cmp(&b.tier))
        });
        keys.truncate(top_n);
    }
    s.hot_shard = s
        .by_shard
        .iter()
        .map(|(shard, per)| (shard, per.values().sum::<u64>()))
        .filter(|(_, d)| *d > 0)
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(shard, decisions)| HotShard {
            shard: shard.clone(),
            decisions,
            share: decisions as f64 / total,
        });
    s.fail_open_series = per_bucket
        .iter()
        .map(|(open, all)| (*all > 0).then(|| *open as f64 / *all as f64))
        .collect();
    s.rtt_series = rtt_per_bucket
        .into_iter()
        .map(|(shard, buckets)| {
            let q = |p| {
                buckets
                    .iter()
                    .map(|c| (c.iter().sum::<u64>() > 0).then(|| quantile(c, p)))
                    .collect()
            };
            let series = RttSeries {
                p50_s: q(0.5),
                p99_s: q(0.99),
            };
            (shard, series)
        })
        .collect();
    s.breaker_series = breakers
        .into_iter()
        .map(|(shard, states)| {
            let named = states
                .into_iter()
                .map(|st| st.map(|v| BREAKER_STATES[usize::from(v.min(2))]))
                .collect();
            (shard, named)
        })
        .collect();
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
        let blocked: u64 = s
            .totals
            .values()
            .filter_map(|per| per.get(Outcome::Blocked.as_str()))
            .sum();
        s.block_rate = blocked as f64 / s.decisions as f64;
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
    fn units_sum_per_tier_and_rank_keys_per_unit_apart_from_other_units() {
        let b = |tokens, bytes| Flat {
            units: vec![
                ("free|tokens".into(), tokens),
                ("pro|tokens".into(), 7),
                ("free|bytes".into(), bytes),
            ],
            unit_keys: vec![
                ("tokens|free|free_a…1111".into(), tokens),
                ("tokens|pro|pro_b…2222".into(), 7),
                ("bytes|free|free_a…1111".into(), bytes),
            ],
            ..Flat::default()
        };
        let s = merge(
            0,
            30,
            RESOLUTIONS[0],
            vec![0, 10, 20],
            &[(0, b(5, 1)), (20, b(10, 2))],
            10,
        );
        assert_eq!(s.units["free"]["tokens"], 15);
        assert_eq!(s.units["pro"]["tokens"], 14);
        assert_eq!(s.units["free"]["bytes"], 3);
        let tokens: Vec<(&str, &str, u64)> = s.top_units["tokens"]
            .iter()
            .map(|k| (k.identity.as_str(), k.tier.as_str(), k.units))
            .collect();
        assert_eq!(
            tokens,
            vec![("free_a…1111", "free", 15), ("pro_b…2222", "pro", 14)]
        );
        assert!((s.top_units["tokens"][0].share - 15.0 / 29.0).abs() < 1e-9);
        assert_eq!(s.top_units["bytes"].len(), 1);
    }

    #[test]
    fn instances_sum_their_events_and_keep_their_latest_report() {
        let b = |events, at| Flat {
            instances: vec![("edge-a".into(), events), ("edge-b".into(), 1)],
            reported: vec![("edge-a".into(), at), ("edge-b".into(), 5)],
            ..Flat::default()
        };
        let s = merge(
            0,
            30,
            RESOLUTIONS[0],
            vec![0, 10, 20],
            &[(0, b(3, 7)), (20, b(4, 25)), (10, b(2, 12))],
            10,
        );
        let seen: Vec<(&str, u64, u64)> = s
            .instances
            .iter()
            .map(|i| (i.instance.as_str(), i.events, i.last_report))
            .collect();
        assert_eq!(seen, vec![("edge-a", 9, 25), ("edge-b", 3, 5)]);
    }

    #[test]
    fn merged_buckets_sum_counters_per_tier_and_outcome_and_fill_the_series() {
        let res = RESOLUTIONS[0];
        let b = |n| Flat {
            counters: vec![
                ("free|allowed|memory|*".into(), n),
                ("free|fallback_allowed|memory|/x".into(), 1),
            ],
            top: vec![("burst|free_ab…1234".into(), n)],
            hot: vec![("free|memory|free_ab…1234".into(), n + 1)],
            breakers: vec![("127.0.0.1:7000|open".into(), 1)],
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
        assert_eq!(s.top_blocked[0].cause, "burst");
        assert_eq!(s.top_blocked[0].identity, "free_ab…1234");
        assert_eq!(s.by_route["/x"]["fallback_allowed"], 3);
        assert_eq!(s.hot_keys[0].decisions, 12);
        assert_eq!(s.hot_keys[0].tier, "free");
        assert!((s.hot_keys[0].share - 1.0).abs() < 1e-9);
        assert_eq!(s.shard_series["memory"], vec![4, 0, 8]);
        assert_eq!(s.fail_open_series[1], None);
        assert!((s.fail_open_series[0].unwrap() - 0.25).abs() < 1e-9);
        assert_eq!(
            s.breaker_series["127.0.0.1:7000"],
            vec![Some("open"), None, Some("open")]
        );
        let hot = s.hot_shard.expect("a busiest shard");
        assert_eq!((hot.shard.as_str(), hot.decisions), ("memory", 12));
    }
}
