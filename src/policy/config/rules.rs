//! `[[tiers]]`, `[[routes]]` and the limits inside them.

use super::reader::{Result, Table, unknown_key};
use super::sections::FAILURE_POLICIES;
use crate::algorithm::Algorithm;
use crate::policy::{Condition, CostEstimate, LeaseMode, Limit, RouteRule, Scope, Tier};

/// Each algorithm's config name and the parameters it takes.
const ALGORITHMS: [(&str, &[&str]); 7] = [
    ("token_bucket", &["capacity", "refill_per_second"]),
    ("sliding_window", &["limit", "window"]),
    ("sliding_log", &["limit", "window"]),
    ("fixed_window", &["limit", "window"]),
    ("gcra", &["rate_per_second", "burst"]),
    (
        "leaky_bucket",
        &["rate_per_second", "capacity", "max_delay"],
    ),
    ("concurrency", &["limit", "hold_timeout"]),
];

/// Keys every limit may have, whatever its algorithm.
const COMMON: [&str; 7] = [
    "name",
    "algorithm",
    "shadow",
    "scope",
    "mode",
    "unit",
    "tier",
];

/// Every key some limit may have.
const ANY_LIMIT_KEY: [&str; 15] = [
    "name",
    "algorithm",
    "shadow",
    "scope",
    "mode",
    "unit",
    "tier",
    "capacity",
    "refill_per_second",
    "limit",
    "window",
    "rate_per_second",
    "burst",
    "max_delay",
    "hold_timeout",
];

pub(super) fn tier(t: &Table<'_>) -> Result<Tier> {
    t.only(
        &["name", "match_prefix", "split", "unlimited", "limits"],
        "a tier",
    )?;
    let mut tier = Tier::new(t.required_str("name", "every tier needs a name, like \"free\"")?);
    tier.match_prefix = t.str("match_prefix")?.map(str::to_owned);
    if let Some(n) = t.uint("split", 1, 64)? {
        tier.split = n as u32;
    }
    tier.unlimited = t.bool("unlimited")?.unwrap_or(false);
    tier.limits = limits(t)?;
    // A file cut short (a non-atomic write, a full disk) often ends right
    // after a tier's name: read as a tier without limits, it would lift
    // every limit of its callers. Only an explicit `unlimited = true` may.
    if tier.limits.is_empty() && !tier.unlimited {
        return Err(t.error_at(
            "limits",
            format!(
                "is missing: tier \"{}\" has no limits; give it limits, or write \
                 `unlimited = true` if its callers are meant to pass unlimited \
                 (a file cut short reads as a tier without limits)",
                tier.name
            ),
        ));
    }
    Ok(tier)
}

pub(super) fn route(t: &Table<'_>) -> Result<RouteRule> {
    t.only(
        &[
            "method",
            "path",
            "cost",
            "on_store_failure",
            "exempt",
            "mode",
            "refund_on_error",
            "costs",
            "max_body_bytes",
            "when",
            "limits",
        ],
        "a route",
    )?;
    // Which methods exist is checked with the rest of the rule, so a policy
    // built in code meets the same rule.
    let method = t.str("method")?.unwrap_or("*");
    let path = t.required_str(
        "path",
        "the path pattern the rule matches, like \"/api/export\"",
    )?;
    let mut route = RouteRule::new(method, path);
    if let Some(cost) = t.uint("cost", 1, u64::MAX)? {
        route.cost = cost;
    }
    route.on_store_failure = t.choice("on_store_failure", &FAILURE_POLICIES)?;
    route.exempt = t.bool("exempt")?.unwrap_or(false);
    route.mode = t.choice("mode", &LeaseMode::CHOICES)?;
    route.refund_on_error = t.bool("refund_on_error")?.unwrap_or(true);
    route.estimates = t
        .tables("costs")?
        .iter()
        .map(estimate)
        .collect::<Result<_>>()?;
    if let Some(n) = t.uint("max_body_bytes", 1, 64 << 20)? {
        route.max_body_bytes = n;
    }
    route.when = t
        .tables("when")?
        .iter()
        .map(condition)
        .collect::<Result<_>>()?;
    route.limits = limits(t)?;
    Ok(route)
}

/// One entry of a route's `costs`: `{ unit = "tokens", header =
/// "x-max-tokens" }` or `{ unit = "bytes", content_length = true }`.
fn estimate(t: &Table<'_>) -> Result<CostEstimate> {
    t.only(
        &["unit", "header", "json", "content_length"],
        "a route's cost estimate",
    )?;
    let unit = t.required_str("unit", "the unit estimated, like \"tokens\"")?;
    let length = t.bool("content_length")?.unwrap_or(false);
    let estimate = match (t.str("header")?, t.str("json")?, length) {
        (Some(name), None, false) => CostEstimate::header(unit, name),
        (None, Some(path), false) => CostEstimate::json(unit, path),
        (None, None, true) => CostEstimate::content_length(unit),
        (None, None, false) => {
            return Err(t.missing(
                "header",
                "is required (or `json = \"field\"`, or `content_length = true`): where the \
                 estimate is read",
            ));
        }
        _ => {
            let second = if t.get("json").is_some() && t.get("header").is_some() {
                "json"
            } else {
                "content_length"
            };
            return Err(t.error_at(
                second,
                "is a second source: an estimate has one (`header`, `json` or `content_length`)",
            ));
        }
    };
    if let Some((field, message)) = estimate.check() {
        return Err(t.error_at(field, message));
    }
    Ok(estimate)
}

/// One entry of a route's `when`: `{ header = "x-stream", equals = "1" }`
/// or `{ json = "stream", equals = true }`.
fn condition(t: &Table<'_>) -> Result<Condition> {
    t.only(&["header", "json", "equals"], "a route condition")?;
    let Some(equals) = t.get("equals") else {
        return Err(t.missing(
            "equals",
            "is required: the value the header or field must have",
        ));
    };
    match (t.str("header")?, t.str("json")?) {
        (Some(name), None) => {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(t.error_at(
                    "header",
                    format!("must be a valid HTTP header name such as \"x-stream\", got {name:?}"),
                ));
            }
            Ok(Condition::Header {
                name: name.to_ascii_lowercase(),
                equals: equals.as_str()?.to_owned(),
            })
        }
        (None, Some(field)) => {
            if field.is_empty() || field.split('.').any(str::is_empty) {
                return Err(t.error_at("json", "must name a field such as \"stream\""));
            }
            let value = if let Ok(b) = equals.as_bool() {
                serde_json::Value::from(b)
            } else if let Ok(s) = equals.as_str() {
                serde_json::Value::from(s)
            } else {
                serde_json::Value::from(equals.as_uint(0, u64::MAX).map_err(|_| {
                    equals.error("must be a string, true or false, or a whole number")
                })?)
            };
            Ok(Condition::Json {
                field: field.to_owned(),
                equals: value,
            })
        }
        (Some(_), Some(_)) => Err(t.error_at(
            "json",
            "is a second subject: a condition reads one header or one field",
        )),
        (None, None) => Err(t.missing(
            "header",
            "is required (or `json = \"field\"`): what the condition reads",
        )),
    }
}

pub(super) fn limits(t: &Table<'_>) -> Result<Vec<Limit>> {
    t.tables("limits")?.iter().map(limit).collect()
}

fn limit(t: &Table<'_>) -> Result<Limit> {
    let names = || {
        ALGORITHMS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let algorithm = t.get("algorithm");
    let known = match &algorithm {
        Some(a) => ALGORITHMS
            .iter()
            .find(|(n, _)| a.as_str().is_ok_and(|s| s == *n)),
        None => None,
    };
    // A misspelt key is reported first: it may be the name or algorithm
    // that looks missing.
    for (key, _) in t.keys() {
        if !ANY_LIMIT_KEY.contains(&key) {
            let (allowed, what): (Vec<&str>, String) = match known {
                Some(&(kind, params)) => (
                    COMMON.iter().chain(params).copied().collect(),
                    format!("a {kind} limit"),
                ),
                None => (ANY_LIMIT_KEY.to_vec(), "a limit".to_owned()),
            };
            return Err(t.error_at(key, unknown_key(key, &allowed, &what)));
        }
    }
    let Some(algorithm) = algorithm else {
        return Err(t.missing("algorithm", format!("is required; one of {}", names())));
    };
    let kind = algorithm.as_str()?;
    let Some(&(kind, params)) = known else {
        return Err(algorithm.error(format!("must be one of {}, got \"{kind}\"", names())));
    };
    if let Some((key, _)) = t
        .keys()
        .into_iter()
        .find(|(key, _)| !COMMON.contains(key) && !params.contains(key))
    {
        return Err(t.error_at(
            key,
            format!(
                "does not apply to a {kind} limit, which takes {}",
                params.join(", ")
            ),
        ));
    }
    let name = t.required_str("name", "every limit needs a name, like \"burst\"")?;
    let need = |key: &str| {
        t.get(key).ok_or_else(|| {
            t.missing(
                key,
                format!("is required: a {kind} limit takes {}", params.join(", ")),
            )
        })
    };
    let count = |key: &str| need(key)?.as_uint(1, u64::MAX);
    let rate = |key: &str| need(key)?.as_rate();
    let window_us =
        || Ok::<_, super::ConfigError>(need("window")?.as_duration(false)?.as_micros() as u64);
    let algorithm = match kind {
        "token_bucket" => Algorithm::TokenBucket {
            capacity: count("capacity")?,
            refill_per_second: rate("refill_per_second")?,
        },
        "sliding_window" => Algorithm::SlidingWindow {
            limit: count("limit")?,
            window_us: window_us()?,
        },
        "sliding_log" => Algorithm::SlidingLog {
            limit: count("limit")?,
            window_us: window_us()?,
        },
        "fixed_window" => Algorithm::FixedWindow {
            limit: count("limit")?,
            window_us: window_us()?,
        },
        "gcra" => Algorithm::Gcra {
            rate_per_second: rate("rate_per_second")?,
            burst: count("burst")?,
        },
        "concurrency" => Algorithm::Concurrency {
            limit: count("limit")?,
            hold_us: match t.get("hold_timeout") {
                Some(v) => v.as_duration(false)?.as_micros() as u64,
                None => crate::algorithm::DEFAULT_HOLD_US,
            },
        },
        _ => Algorithm::LeakyBucket {
            rate_per_second: rate("rate_per_second")?,
            capacity: count("capacity")?,
            max_delay_us: match t.get("max_delay") {
                Some(v) => v.as_duration(true)?.as_micros() as u64,
                None => 0,
            },
        },
    };
    let mut limit = Limit::new(name, algorithm);
    limit.shadow = t.bool("shadow")?.unwrap_or(false);
    let scopes = [
        ("identity", Scope::Identity),
        ("ip", Scope::Ip),
        ("route", Scope::Route),
    ];
    limit.scope = t.choice("scope", &scopes)?.unwrap_or_default();
    limit.mode = t.choice("mode", &LeaseMode::CHOICES)?;
    if let Some(unit) = t.get("unit") {
        let name = unit.as_str()?;
        if let Some(message) = crate::policy::check_unit(name) {
            return Err(unit.error(message));
        }
        limit.unit = name.to_owned();
    }
    limit.tier = t.str("tier")?.map(str::to_owned);
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_limit_key_holds_exactly_the_common_keys_and_every_parameter() {
        let mut expected: Vec<&str> = COMMON.to_vec();
        for (_, params) in ALGORITHMS {
            expected.extend(
                params
                    .iter()
                    .filter(|p| !expected.contains(p))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(ANY_LIMIT_KEY.to_vec(), expected);
    }
}
