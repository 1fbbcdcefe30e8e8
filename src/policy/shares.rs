//! Shares of a quota, and the rule that keeps them honest.
//!
//! Three things hand a limit out in shares: `partition` (a deployment's
//! share of every quota), a tier's `split` (each of N sub-identities gets
//! 1/N of every identity-scoped quota) and the `local` fallback (each of
//! `expected_instances` processes gets 1/N while the store is away). A
//! share is the quota times the fraction, rounded down, and never raised:
//! raising a share to fit an expensive route hands every request, on every
//! route, more than its quota (a split of 8 shares raised from 1 to 5 admits
//! 40 of a burst of 10).
//!
//! So a share that falls below a cost that can occur where the share is
//! decided is a config error, named by field and line. "Can occur" is
//! exact: a tier's limit is decided on every limited route and on requests
//! no rule matches (cost 1); a route rule's limit on its own route only; a
//! local share only on the routes whose failure policy is `local`.

use super::{FailurePolicy, Limit, Policy, RouteRule, Scope};
use crate::algorithm::Algorithm;

/// `algorithm` with every quota multiplied by `num / den` (rounded down,
/// computed on integers so `12 / 3` is 4, not 3.999...) and every rate by
/// the same fraction. A quota of 0 is kept at 1 in the algorithm, so it
/// stays well-formed; [`share_quota`] gives the exact share that
/// validation compares with costs.
pub fn divided(algorithm: &Algorithm, num: u64, den: u64) -> Algorithm {
    algorithm.with_quotas(
        |n| share_quota(n, num, den).max(1),
        num as f64 / den.max(1) as f64,
    )
}

/// `n * num / den`, rounded down.
pub fn share_quota(n: u64, num: u64, den: u64) -> u64 {
    (u128::from(n) * u128::from(num) / u128::from(den.max(1))) as u64
}

/// A partition fraction as an integer ratio (parts per billion), so shares
/// round the same way everywhere.
pub fn partition_ratio(partition: f64) -> (u64, u64) {
    const DEN: u64 = 1_000_000_000;
    (((partition * DEN as f64).round() as u64).clamp(1, DEN), DEN)
}

/// The enforced form of a tier's limit: split into `split` shares if it is
/// identity-scoped (IP and route keys are not split, so neither are their
/// quotas).
pub fn split_share(limit: &Limit, split: u32) -> Algorithm {
    if split > 1 && limit.scope == Scope::Identity {
        divided(&limit.algorithm, 1, u64::from(split))
    } else {
        limit.algorithm.clone()
    }
}

/// The local fallback's share of an enforced algorithm.
pub fn local_share(enforced: &Algorithm, instances: u32) -> Algorithm {
    divided(enforced, 1, u64::from(instances.max(1)))
}

/// The config name of a limit's quota parameter.
pub fn quota_field(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => "capacity",
        Algorithm::Gcra { .. } => "burst",
        _ => "limit",
    }
}

/// The most expensive request a limit can be asked to admit, and where it
/// comes from (for messages): `None` if the limit is never decided there.
#[derive(Debug, Clone)]
pub(crate) struct Cost {
    pub units: u64,
    pub source: String,
}

fn costliest<'a>(costs: impl Iterator<Item = (u64, String)> + 'a) -> Option<Cost> {
    costs
        .max_by_key(|(c, _)| *c)
        .map(|(units, source)| Cost { units, source })
}

fn effective(p: &Policy, r: &RouteRule) -> FailurePolicy {
    r.on_store_failure.unwrap_or(p.resilience.on_store_failure)
}

/// The costliest request a tier's limit is decided for: every limited
/// route, and requests no rule matches (cost 1). With `local_only`, only
/// where the failure policy is `local`.
pub(crate) fn tier_cost(p: &Policy, local_only: bool) -> Option<Cost> {
    let unmatched = (!local_only || p.resilience.on_store_failure == FailurePolicy::Local)
        .then(|| (1, "a request no route rule matches".to_owned()));
    let routes = p
        .routes
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.exempt && (!local_only || effective(p, r) == FailurePolicy::Local))
        .map(|(i, r)| (r.cost, format!("routes[{i}] ({})", r.describe())));
    costliest(unmatched.into_iter().chain(routes))
}

/// The cost a route rule's limit is decided for, if it is decided at all
/// (with `local_only`, by the local fallback).
pub(crate) fn route_cost(p: &Policy, ri: usize, local_only: bool) -> Option<Cost> {
    let r = &p.routes[ri];
    (!r.exempt && (!local_only || effective(p, r) == FailurePolicy::Local)).then(|| Cost {
        units: r.cost,
        source: format!("routes[{ri}] ({})", r.describe()),
    })
}

/// Checks every split and local share of `p` (already partitioned) against
/// the costs that can occur where it is decided. On failure: the field to
/// blame and why.
///
/// A share's rates are not held to the config's range: a share divides
/// quota and rate alike, so the span a limit covers (what the range keeps
/// from overflowing) stays that of the validated limit, and a rate below
/// the smallest one a file may write is a fine share of it. A partition is
/// different: it rewrites the policy itself, which is validated again.
pub(crate) fn check(p: &Policy) -> Result<(), (String, String)> {
    let instances = p.resilience.expected_instances.max(1);
    for (ti, tier) in p.tiers.iter().enumerate() {
        let split = tier.split.max(1);
        let tier_limits = tier.limits.iter().enumerate().map(|(li, l)| {
            (
                l,
                format!("tiers[{ti}].limits[{li}]"),
                tier_cost(p, false),
                tier_cost(p, true),
            )
        });
        let route_limits = p.routes.iter().enumerate().flat_map(|(ri, r)| {
            r.limits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.applies_to(&tier.name))
                .map(move |(li, l)| {
                    (
                        l,
                        format!("routes[{ri}].limits[{li}]"),
                        route_cost(p, ri, false),
                        route_cost(p, ri, true),
                    )
                })
        });
        for (limit, at, cost, local_cost) in tier_limits.chain(route_limits) {
            // Route costs are in requests; a limit of another unit is
            // asked for the request's cost in its unit, known per request.
            let (cost, local_cost) = if limit.counts_requests() {
                (cost, local_cost)
            } else {
                (None, None)
            };
            let quota = limit.algorithm.quota();
            let field = format!("{at}.{}", quota_field(&limit.algorithm));
            let enforced = split_share(limit, split);
            let split_quota = if enforced == limit.algorithm {
                quota
            } else {
                share_quota(quota, 1, u64::from(split))
            };
            if let (Some(cost), false, true) = (&cost, limit.shadow, split_quota != quota) {
                if split_quota < cost.units {
                    return Err((
                        format!("tiers[{ti}].split"),
                        format!(
                            "{split} gives each sub-identity {split_quota} of `{field}` ({quota}), below the cost {} of {}, which could then never pass; lower split or raise the quota (shares are never raised: that would admit more than the quota)",
                            cost.units, cost.source
                        ),
                    ));
                }
            }
            let Some(local_cost) = local_cost else {
                continue;
            };
            let local_quota = share_quota(split_quota, 1, u64::from(instances));
            if !limit.shadow && local_quota < local_cost.units {
                return Err((
                    field,
                    format!(
                        "is {quota}; the local fallback's share (divided by expected_instances = {instances}{}) is {local_quota}, below the cost {} of {}, which could then never pass while the store is away; lower expected_instances, raise the quota or give that route another on_store_failure",
                        if split > 1 && limit.scope == Scope::Identity {
                            format!(" after split = {split}")
                        } else {
                            String::new()
                        },
                        local_cost.units,
                        local_cost.source
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Checks that `fraction` of every quota of `p` (not yet partitioned)
/// still admits the costliest request it can be asked for.
pub(crate) fn check_partition(p: &Policy, fraction: f64) -> Result<(), (String, String)> {
    let (num, den) = partition_ratio(fraction);
    let tier_limits = p.tiers.iter().enumerate().flat_map(|(ti, t)| {
        t.limits
            .iter()
            .enumerate()
            .map(move |(li, l)| (l, format!("tiers[{ti}].limits[{li}]"), tier_cost(p, false)))
    });
    let route_limits = p.routes.iter().enumerate().flat_map(|(ri, r)| {
        r.limits.iter().enumerate().map(move |(li, l)| {
            (
                l,
                format!("routes[{ri}].limits[{li}]"),
                route_cost(p, ri, false),
            )
        })
    });
    for (limit, at, cost) in tier_limits.chain(route_limits) {
        let quota = limit.algorithm.quota();
        let share = share_quota(quota, num, den);
        if let (Some(cost), false) = (cost, limit.shadow) {
            if share < cost.units {
                return Err((
                    format!("{at}.{}", quota_field(&limit.algorithm)),
                    format!(
                        "is {quota}; partition = {fraction} leaves {share}, below the cost {} of {}, which could then never pass; raise the quota or the partition",
                        cost.units, cost.source
                    ),
                ));
            }
        }
        divided(&limit.algorithm, num, den)
            .validate()
            .map_err(|m| {
                let field = m
                    .split('`')
                    .nth(1)
                    .map_or_else(|| at.clone(), |f| format!("{at}.{f}"));
                (field, format!("{m} once partition = {fraction} is applied"))
            })?;
    }
    Ok(())
}
