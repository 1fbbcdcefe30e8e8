//! What the dashboard page shows, computed from the fleet view, the policy
//! and this instance's breakers. Every string reaches the page through
//! askama's HTML escaping.

use std::collections::BTreeMap;

use askama::Template;
use serde::Serialize;

use crate::Limiter;
use crate::algorithm::Algorithm;
use crate::policy::Policy;
use crate::telemetry::{FleetStats, Outcome};

/// The dashboard page.
#[derive(Template)]
#[template(path = "dashboard.html")]
pub struct DashboardPage {
    stats: FleetStats,
    range_label: &'static str,
    ranges: Vec<RangeLink>,
    outcomes: Vec<&'static str>,
    tiers: Vec<TierRow>,
    shards: Vec<ShardRow>,
    routes: Vec<RouteRow>,
    store_kind: &'static str,
    fail_open_pct: String,
    /// Headline: `blocked` decisions / all decisions over the range.
    block_pct: String,
    /// The block rate against the previous period (empty without one).
    block_trend: String,
    /// The fail-open rate against the previous period.
    fail_open_trend: String,
    generated: String,
    refresh_ms: u64,
    /// Set when the fleet view did not answer: since (UTC), and why.
    banner: Option<(String, String)>,
    /// The policy in force and its reloads (`_policy_status.html`).
    policy_status: crate::PolicyStatus,
    /// The latest reload's error, while the latest reload failed.
    policy_error: Option<String>,
    /// Keys this instance serves from leases, hottest first.
    leases: Vec<crate::lease::HotKey>,
    unit_keys: Vec<UnitKeyRow>,
    /// The limiter's name, where several share a process.
    limiter_name: Option<String>,
}

/// One of the identities charged the most of one unit.
struct UnitKeyRow {
    unit: String,
    key: crate::telemetry::UnitKey,
}

struct RangeLink {
    name: &'static str,
    on: bool,
}

struct TierRow {
    name: String,
    prefix: Option<String>,
    limits: Vec<String>,
    counts: Vec<u64>,
    /// Units charged over the range, `1234 tokens` each.
    units: String,
}

struct ShardRow {
    name: String,
    p50: String,
    p99: String,
    count: u64,
    decisions: u64,
    share: String,
    state: &'static str,
    state_class: &'static str,
    trips: u64,
}

struct RouteRow {
    route: String,
    counts: Vec<u64>,
}

impl DashboardPage {
    /// The page for `stats` over `range`, drawn at `now` (Unix seconds).
    pub fn new(limiter: &Limiter, stats: FleetStats, range: &'static str, now: u64) -> Self {
        let policy = limiter.policy();
        let policy_status = limiter.policy_status();
        let policy_error = policy_status
            .last_reload
            .as_ref()
            .and_then(|r| r.error.clone());
        let outcomes: Vec<&'static str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        let counts_of = |per: Option<&BTreeMap<String, u64>>| -> Vec<u64> {
            outcomes
                .iter()
                .map(|o| per.and_then(|m| m.get(*o)).copied().unwrap_or(0))
                .collect()
        };
        let tiers = policy
            .tiers
            .iter()
            .map(|t| TierRow {
                name: t.name.clone(),
                prefix: t.match_prefix.clone(),
                limits: t.limits.iter().map(describe_limit).collect(),
                counts: counts_of(stats.totals.get(&t.name)),
                units: units_of(stats.units.get(&t.name)),
            })
            .collect();
        let routes = stats
            .by_route
            .iter()
            .map(|(route, per)| RouteRow {
                route: route.clone(),
                counts: counts_of(Some(per)),
            })
            .collect();
        let mut breakers: BTreeMap<String, crate::resilience::BreakerState> = BTreeMap::new();
        if limiter.store().kind() != "memory" {
            for shard in crate::telemetry::metrics::configured_shards(&policy) {
                breakers.insert(shard, crate::resilience::BreakerState::Closed);
            }
        }
        breakers.extend(
            limiter
                .breaker_states()
                .into_iter()
                .map(|(s, b)| (s.to_string(), b)),
        );
        let mut names: Vec<String> = stats.rtt.keys().cloned().collect();
        names.extend(breakers.keys().cloned());
        names.extend(stats.breaker_trips.keys().cloned());
        names.extend(stats.by_shard.keys().cloned());
        names.sort();
        names.dedup();
        let total = stats.decisions.max(1) as f64;
        let shards = names
            .into_iter()
            .map(|name| {
                let rtt = stats.rtt.get(&name);
                let state = breakers.get(&name).copied();
                let decisions: u64 = stats.by_shard.get(&name).map_or(0, |m| m.values().sum());
                ShardRow {
                    p50: rtt.map_or("–".into(), |r| millis(r.p50_s)),
                    p99: rtt.map_or("–".into(), |r| millis(r.p99_s)),
                    count: rtt.map_or(0, |r| r.count),
                    decisions,
                    share: format!("{:.1} %", decisions as f64 / total * 100.0),
                    state: state.map_or("–", |s| s.as_str()),
                    state_class: match state.map(|s| s.as_gauge()) {
                        Some(0) => "ok",
                        Some(1) => "warn",
                        Some(_) => "bad",
                        None => "muted",
                    },
                    trips: stats.breaker_trips.get(&name).copied().unwrap_or(0),
                    name,
                }
            })
            .collect();
        let banner = stats
            .source
            .fleet_unavailable
            .as_ref()
            .map(|u| (clock_of(u.since), u.reason.clone()));
        let unit_keys = stats
            .top_units
            .iter()
            // Requests rank as the hot keys do, shown beside.
            .filter(|(unit, _)| unit.as_str() != crate::policy::REQUESTS)
            .flat_map(|(unit, keys)| {
                keys.iter().map(|k| UnitKeyRow {
                    unit: unit.clone(),
                    key: k.clone(),
                })
            })
            .collect();
        Self {
            limiter_name: policy.telemetry.limiter_name.clone(),
            unit_keys,
            fail_open_pct: format!("{:.2} %", stats.fail_open_rate * 100.0),
            block_pct: format!("{:.2} %", stats.block_rate * 100.0),
            block_trend: trend(
                stats.block_rate,
                stats.previous.as_ref().map(|p| (p.decisions, p.block_rate)),
                range,
            ),
            fail_open_trend: trend(
                stats.fail_open_rate,
                stats
                    .previous
                    .as_ref()
                    .map(|p| (p.decisions, p.fail_open_rate)),
                range,
            ),
            stats,
            range_label: range,
            ranges: super::RANGES
                .iter()
                .map(|(name, _)| RangeLink {
                    name,
                    on: *name == range,
                })
                .collect(),
            outcomes,
            tiers,
            shards,
            routes,
            store_kind: limiter.store().kind(),
            generated: clock_of(now),
            refresh_ms: limiter
                .policy()
                .telemetry
                .flush_interval
                .as_millis()
                .clamp(1_000, 5_000) as u64,
            banner,
            policy_status,
            policy_error,
            leases: limiter.hot_keys(),
        }
    }

    fn pct(share: &f64) -> String {
        format!("{:.1} %", share * 100.0)
    }

    /// `HH:MM:SSZ` of a Unix time.
    fn clock(t: &u64) -> String {
        clock_of(*t)
    }

    fn rate(r: &f64) -> String {
        format!("{r:.1}")
    }

    /// Whether this instance serves `identity` from a lease.
    fn leased(&self, identity: &str) -> bool {
        self.leases.iter().any(|k| k.identity == identity)
    }

    /// The "served" cell of a hot key: `lease` or `store`.
    fn served(&self, identity: &str) -> &'static str {
        if self.leased(identity) {
            "lease"
        } else {
            "store"
        }
    }

    fn served_class(&self, identity: &str) -> &'static str {
        if self.leased(identity) {
            "lease ok"
        } else {
            "muted"
        }
    }
}

/// `1234 tokens, 10 requests`: what a tier was charged, per unit.
fn units_of(per: Option<&BTreeMap<String, u64>>) -> String {
    per.map_or_else(String::new, |m| {
        m.iter()
            .map(|(unit, n)| format!("{n} {unit}"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

fn millis(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1000.0)
}

/// `HH:MM:SSZ` of a Unix time, for the "refreshed" and "since" stamps.
fn clock_of(unix_s: u64) -> String {
    let s = unix_s % 86_400;
    format!("{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

/// `burst: token_bucket 10, +0.33/s` and the like.
fn describe_limit(l: &crate::policy::Limit) -> String {
    let what = match &l.algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill_per_second,
        } => format!("token bucket {capacity}, +{refill_per_second}/s"),
        Algorithm::SlidingWindow { limit, .. } => {
            format!("sliding window {limit} / {}s", l.algorithm.window_secs())
        }
        Algorithm::SlidingLog { limit, .. } => {
            format!("sliding log {limit} / {}s", l.algorithm.window_secs())
        }
        Algorithm::FixedWindow { limit, .. } => {
            format!("fixed window {limit} / {}s", l.algorithm.window_secs())
        }
        Algorithm::Gcra {
            rate_per_second,
            burst,
        } => format!("gcra {rate_per_second}/s, burst {burst}"),
        Algorithm::LeakyBucket {
            rate_per_second,
            capacity,
            max_delay_us,
        } => format!(
            "leaky bucket {capacity} at {rate_per_second}/s{}",
            if *max_delay_us > 0 { ", shaping" } else { "" }
        ),
        Algorithm::Concurrency { limit, .. } => format!("in flight {limit}"),
    };
    let mut s = format!("{}: {what}", l.name);
    if l.scope != crate::policy::Scope::Identity {
        s.push_str(&format!(" (per {})", l.scope.as_str()));
    }
    if l.shadow {
        s.push_str(" (shadow)");
    }
    s
}

/// The tiers and limits as the JSON API shows them.
#[derive(Debug, Serialize)]
pub struct PolicyView {
    tiers: Vec<TierView>,
}

#[derive(Debug, Serialize)]
struct TierView {
    name: String,
    match_prefix: Option<String>,
    limits: Vec<LimitView>,
}

#[derive(Debug, Serialize)]
struct LimitView {
    name: String,
    algorithm: &'static str,
    quota: u64,
    window_seconds: u64,
    scope: &'static str,
    shadow: bool,
    description: String,
}

impl PolicyView {
    /// The view of `policy`.
    pub fn of(policy: &Policy) -> Self {
        Self {
            tiers: policy
                .tiers
                .iter()
                .map(|t| TierView {
                    name: t.name.clone(),
                    match_prefix: t.match_prefix.clone(),
                    limits: t
                        .limits
                        .iter()
                        .map(|l| LimitView {
                            name: l.name.clone(),
                            algorithm: l.algorithm.kind(),
                            quota: l.algorithm.quota(),
                            window_seconds: l.algorithm.window_secs(),
                            scope: l.scope.as_str(),
                            shadow: l.shadow,
                            description: describe_limit(l),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The trend of a rate against the previous period of `range`:
/// `▲ +1.20 pts vs 3.40 % the previous 15m`, or why there is none.
fn trend(now: f64, previous: Option<(u64, f64)>, range: &str) -> String {
    match previous {
        None => String::new(),
        Some((0, _)) => format!("no decisions the previous {range}"),
        Some((_, before)) => {
            let delta = (now - before) * 100.0;
            let arrow = if delta > 0.005 {
                "▲"
            } else if delta < -0.005 {
                "▼"
            } else {
                "="
            };
            format!(
                "{arrow} {delta:+.2} pts vs {:.2} % the previous {range}",
                before * 100.0
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::trend;

    #[test]
    fn a_trend_says_which_way_by_how_much_and_from_what() {
        assert_eq!(
            trend(0.05, Some((100, 0.02)), "15m"),
            "▲ +3.00 pts vs 2.00 % the previous 15m"
        );
        assert_eq!(
            trend(0.0, Some((10, 0.5)), "5m"),
            "▼ -50.00 pts vs 50.00 % the previous 5m"
        );
        assert_eq!(
            trend(0.1, Some((5, 0.1)), "1h"),
            "= +0.00 pts vs 10.00 % the previous 1h"
        );
        assert_eq!(
            trend(0.1, Some((0, 0.0)), "1h"),
            "no decisions the previous 1h"
        );
        assert_eq!(trend(0.1, None, "1h"), "");
    }
}
