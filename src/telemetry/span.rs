//! The `tracing` span of a decision: the one place every front end (the
//! layer, [`crate::Limiter::check`], the decision service) makes it, so an
//! app exporting its traces sees why a request was refused.
//!
//! One span per decision event, named `ratewatch.decision` (target
//! `ratewatch::decision`, level INFO), made once the decision is known,
//! inside whatever span is current (the app's request span, if it has
//! one). Its fields:
//!
//! | field | value |
//! |---|---|
//! | `tier` | the tier (the domain, for the decision service's descriptors) |
//! | `route` | the matched route rule's pattern, or `*` |
//! | `outcome` | `allowed`, `blocked`, `fallback_allowed`, `fallback_blocked`, `shadow_blocked` |
//! | `limit` | the most constraining limit's name (the one that blocked, when blocked); empty without limits |
//! | `path` | `store` (a store call, or the failure policy when it failed) or `local` (a lease, a remembered refusal) |
//! | `store_rtt_us` | the store round trip in microseconds; absent without one |
//!
//! It carries the round trip as a field, not as its own duration. Without
//! a subscriber that wants INFO, making it costs one load of the global
//! level filter: no field is evaluated and nothing is allocated.

use std::time::Duration;

use super::Outcome;

/// The span's name.
pub const DECISION_SPAN: &str = "ratewatch.decision";

/// Makes (and closes) the span of one decision.
pub(crate) fn decision(
    tier: &str,
    route: &str,
    outcome: Outcome,
    limit: Option<&str>,
    path: &'static str,
    store_rtt: Option<Duration>,
) {
    // No subscriber wants INFO (none is installed, or all filter it out):
    // nobody can see the span. Without this, `tracing`'s `log` fallback
    // still builds every field for a span nobody reads.
    if tracing::level_filters::LevelFilter::current() < tracing::Level::INFO {
        return;
    }
    let span = tracing::info_span!(
        target: "ratewatch::decision",
        "ratewatch.decision",
        tier,
        route,
        outcome = outcome.as_str(),
        limit = limit.unwrap_or(""),
        path,
        store_rtt_us = tracing::field::Empty,
    );
    if let Some(rtt) = store_rtt {
        span.record("store_rtt_us", rtt.as_micros() as u64);
    }
}
