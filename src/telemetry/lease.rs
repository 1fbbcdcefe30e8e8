//! Lease metrics: what [`crate::lease`] reports, as Prometheus families.
//! Every family exists at zero from start-up ([`register_at_zero`]). No
//! label names a key; per-key detail is on the dashboard only.

use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::lease::Transition;

/// Keys in lease mode on this instance: gauge.
pub const LEASE_KEYS: &str = "ratewatch_lease_keys";
/// Lease units, by event (`granted`, `spent`, `returned`, `expired`): counter.
pub const LEASE_TOKENS_TOTAL: &str = "ratewatch_lease_tokens_total";
/// Keys into or out of lease mode, by `to` (`leased`, `exact`) and reason
/// (`hot`, `cooled`, `configured`, `tail`): counter.
pub const LEASE_TRANSITIONS_TOTAL: &str = "ratewatch_lease_transitions_total";
/// Time to take a lease from the store: histogram, seconds.
pub const LEASE_RENEW_SECONDS: &str = "ratewatch_lease_renew_seconds";
/// Decisions of keys in `leased` or `auto` mode, by path (`local`, `store`):
/// counter.
pub const LEASE_DECISIONS_TOTAL: &str = "ratewatch_lease_decisions_total";

/// Label: what happened to lease units.
pub const LABEL_EVENT: &str = "event";
/// Label: the mode a transition went to.
pub const LABEL_TO: &str = "to";
/// Label: where a decision was made.
pub const LABEL_PATH: &str = "path";

/// The `event` label values.
pub const EVENTS: [&str; 4] = ["granted", "spent", "returned", "expired"];

/// Describes the lease families to the current recorder.
pub fn describe() {
    describe_gauge!(LEASE_KEYS, "Keys in lease mode on this instance.");
    describe_counter!(
        LEASE_TOKENS_TOTAL,
        "Lease units granted by the store, spent locally, returned unused, or expired unspent."
    );
    describe_counter!(
        LEASE_TRANSITIONS_TOTAL,
        "Keys into (to=leased) or out of (to=exact) lease mode, by reason."
    );
    describe_histogram!(
        LEASE_RENEW_SECONDS,
        Unit::Seconds,
        "Time to take a lease from the store."
    );
    describe_counter!(
        LEASE_DECISIONS_TOTAL,
        "Decisions of keys in leased or auto mode, by path: local (from a lease or a remembered refusal) or store."
    );
}

/// Makes every lease family exist at zero.
pub fn register_at_zero() {
    describe();
    gauge!(LEASE_KEYS).set(0.0);
    for e in EVENTS {
        counter!(LEASE_TOKENS_TOTAL, LABEL_EVENT => e).increment(0);
    }
    for t in Transition::ALL {
        counter!(LEASE_TRANSITIONS_TOTAL, LABEL_TO => to(t), super::metrics::LABEL_REASON => t.as_str())
            .increment(0);
    }
    for p in ["local", "store"] {
        counter!(LEASE_DECISIONS_TOTAL, LABEL_PATH => p).increment(0);
    }
    // A histogram has no zero value to set: registering it makes the
    // family (with empty buckets) appear.
    let _ = histogram!(LEASE_RENEW_SECONDS);
}

fn to(t: Transition) -> &'static str {
    // The tail keeps a key's entry but decides it per request.
    if t.leased() { "leased" } else { "exact" }
}

fn tokens(event: &'static str, n: u64) {
    counter!(LEASE_TOKENS_TOTAL, LABEL_EVENT => event).increment(n);
}

pub(crate) fn granted(n: u64) {
    tokens("granted", n);
}

pub(crate) fn spent(n: u64) {
    tokens("spent", n);
}

pub(crate) fn returned(n: u64) {
    tokens("returned", n);
}

pub(crate) fn expired(n: u64) {
    tokens("expired", n);
}

pub(crate) fn transition(t: Transition) {
    counter!(LEASE_TRANSITIONS_TOTAL, LABEL_TO => to(t), super::metrics::LABEL_REASON => t.as_str())
        .increment(1);
}

pub(crate) fn leased_keys(n: i64) {
    gauge!(LEASE_KEYS).set(n.max(0) as f64);
}

pub(crate) fn renew_latency(d: Duration) {
    histogram!(LEASE_RENEW_SECONDS).record(d.as_secs_f64());
}

/// One decision of a leased or auto key: `local` or not.
pub(crate) fn decision(local: bool) {
    counter!(LEASE_DECISIONS_TOTAL, LABEL_PATH => if local { "local" } else { "store" })
        .increment(1);
}
