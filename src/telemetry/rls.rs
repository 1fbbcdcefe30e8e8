//! Metrics of the decision service (`ratewatch::service`): decisions per
//! domain, rule and outcome, request latency and errors.
//!
//! Labels are bounded by configuration: `domain` is a configured domain
//! name (any other domain is counted as [`UNKNOWN_DOMAIN`]), `rule` is a
//! configured rule's label ([`UNMATCHED_RULE`] when no rule matched,
//! [`OVERRIDE_RULE`] for a limit the proxy sent), never a descriptor value.

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};

use super::labelled::Series;

/// Descriptor decisions: counter {domain, rule, outcome}.
pub const RLS_DECISIONS_TOTAL: &str = "ratewatch_rls_decisions_total";
/// Allowed descriptor decisions that left the used share of a limit at or
/// above `[rls] near_limit_ratio`: counter {domain, rule}.
pub const RLS_NEAR_LIMIT_TOTAL: &str = "ratewatch_rls_near_limit_total";
/// Decision-service request latency: histogram {api}, in seconds.
pub const RLS_REQUEST_SECONDS: &str = "ratewatch_rls_request_duration_seconds";
/// Decision-service requests answered with an error: counter {api, reason}.
pub const RLS_ERRORS_TOTAL: &str = "ratewatch_rls_errors_total";

/// Label: the domain.
pub const LABEL_DOMAIN: &str = "domain";
/// Label: the rule's label.
pub const LABEL_RULE: &str = "rule";
/// Label: the front end (`grpc`, `json`, `decide`, `rlconfig`).
pub const LABEL_API: &str = "api";

/// The `domain` of every domain the configuration does not name.
pub const UNKNOWN_DOMAIN: &str = "_unknown";
/// The `rule` of a descriptor no rule matched.
pub const UNMATCHED_RULE: &str = "_unmatched";
/// The `rule` of a descriptor decided by the limit the proxy sent.
pub const OVERRIDE_RULE: &str = "_override";

/// Outcomes of a descriptor: `ok`, `over_limit`, `shadow_over_limit`,
/// `fallback_ok`, `fallback_over_limit`, `unlimited`.
pub const OUTCOMES: [&str; 6] = [
    "ok",
    "over_limit",
    "shadow_over_limit",
    "fallback_ok",
    "fallback_over_limit",
    "unlimited",
];

/// Error reasons: `store_unavailable` (the store failed and the policy is
/// `unavailable`), `bad_request`, `unauthorized`.
pub const ERROR_REASONS: [&str; 3] = ["store_unavailable", "bad_request", "unauthorized"];

/// The front ends (`rlconfig`: the configuration dump, which only errs).
pub const APIS: [&str; 4] = ["grpc", "json", "decide", "rlconfig"];

/// Upper bounds, in seconds, of the latency buckets: from 50 µs (a memory
/// decision) past Envoy's default 20 ms timeout to a slow store's second.
pub const RLS_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Describes the decision-service metrics to the current recorder.
pub fn describe() {
    describe_counter!(
        RLS_DECISIONS_TOTAL,
        "Decision-service descriptor decisions, by domain, rule and outcome."
    );
    describe_counter!(
        RLS_NEAR_LIMIT_TOTAL,
        "Decision-service descriptors allowed at or above [rls] near_limit_ratio of a limit, by domain and rule."
    );
    describe_histogram!(
        RLS_REQUEST_SECONDS,
        Unit::Seconds,
        "Decision-service request latency, by api (grpc, json, decide)."
    );
    describe_counter!(
        RLS_ERRORS_TOTAL,
        "Decision-service requests answered with an error, by api and reason."
    );
}

/// Every series that exists whatever the traffic, at zero: errors and
/// latency per api, and decisions and near-limit counts for each configured
/// `(domain, rule)`.
pub fn register_at_zero<'a>(rules: impl Iterator<Item = (&'a str, &'a str)>) {
    for api in APIS {
        for reason in ERROR_REASONS {
            counter!(RLS_ERRORS_TOTAL, LABEL_API => api, LABEL_REASON => reason).increment(0);
        }
        // A histogram appears with its first sample only; the counter pair
        // above is what alerts read.
        let _ = histogram!(RLS_REQUEST_SECONDS, LABEL_API => api);
    }
    for outcome in OUTCOMES {
        counter!(RLS_DECISIONS_TOTAL, LABEL_DOMAIN => UNKNOWN_DOMAIN, LABEL_RULE => UNMATCHED_RULE, LABEL_OUTCOME => outcome).increment(0);
    }
    counter!(RLS_NEAR_LIMIT_TOTAL, LABEL_DOMAIN => UNKNOWN_DOMAIN, LABEL_RULE => UNMATCHED_RULE)
        .increment(0);
    for (domain, rule) in rules {
        counter!(RLS_NEAR_LIMIT_TOTAL, LABEL_DOMAIN => domain.to_owned(), LABEL_RULE => rule.to_owned()).increment(0);
        for outcome in OUTCOMES {
            counter!(RLS_DECISIONS_TOTAL, LABEL_DOMAIN => domain.to_owned(), LABEL_RULE => rule.to_owned(), LABEL_OUTCOME => outcome).increment(0);
        }
    }
}

/// [`register_at_zero`] for every domain and rule of `policy`'s `[rls]`.
pub fn register_policy(policy: &crate::policy::Policy) {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let domains: Vec<_> = policy.rls.domains.iter().collect();
    for d in &domains {
        pairs.push((&d.name, UNMATCHED_RULE));
        pairs.push((&d.name, OVERRIDE_RULE));
    }
    let rules: Vec<(&str, Vec<&crate::policy::rls::DescriptorRule>)> =
        domains.iter().map(|d| (&*d.name, d.rules())).collect();
    for (d, rs) in &rules {
        for r in rs {
            pairs.push((d, &r.label));
        }
    }
    register_at_zero(pairs.into_iter());
}

/// Counts one descriptor's decision.
pub fn record_decision(domain: &str, rule: &str, outcome: &'static str) {
    let series = Series::two(
        RLS_DECISIONS_TOTAL,
        (LABEL_DOMAIN, domain),
        (LABEL_RULE, rule),
    );
    super::labelled::add(&series.and(LABEL_OUTCOME, outcome), 1);
}

/// Counts one allowed descriptor near its limit.
pub fn record_near_limit(domain: &str, rule: &str) {
    let series = Series::two(
        RLS_NEAR_LIMIT_TOTAL,
        (LABEL_DOMAIN, domain),
        (LABEL_RULE, rule),
    );
    super::labelled::add(&series, 1);
}

/// Times one request.
pub fn record_latency(api: &'static str, took: Duration) {
    super::labelled::record(RLS_REQUEST_SECONDS, (LABEL_API, api), took.as_secs_f64());
}

/// Counts one request answered with an error.
pub fn record_error(api: &'static str, reason: &'static str) {
    counter!(RLS_ERRORS_TOTAL, LABEL_API => api, LABEL_REASON => reason).increment(1);
}

use super::metrics::{LABEL_OUTCOME, LABEL_REASON};
