//! Cost and settle metrics: units requests were charged at their decision
//! with an explicit cost, and what settling after the response charged or
//! gave back. Labels are the tier and the route rule's pattern (or `*`),
//! never an identity. Every family exists at zero from start-up
//! ([`register_at_zero`]).

use std::sync::Arc;

use metrics::{Label, counter, describe_counter, describe_gauge, gauge};

use super::labelled::Series;
use super::metrics::{LABEL_LIMIT, LABEL_ROUTE, LABEL_TIER};
use crate::policy::Policy;

/// Units admitted requests were charged at their decision, where the
/// cost was given per request (`Limiter::check_cost`, `Limiter::reserve`,
/// the layer's cost function): counter {tier, route}.
pub const COST_UNITS_TOTAL: &str = "ratewatch_cost_units_total";
/// Settles after a response, by outcome (`charged`, `refunded`,
/// `failed`, `stale`): counter {tier, route, outcome}.
pub const SETTLES_TOTAL: &str = "ratewatch_settles_total";
/// Units settles charged or gave back, by direction (`charged`,
/// `refunded`): counter {tier, route, direction}.
pub const SETTLED_UNITS_TOTAL: &str = "ratewatch_settled_units_total";

/// Units admitted requests were charged at their decision, per unit,
/// where some limit counted a unit of its own or the request named its
/// costs: counter {tier, unit}.
pub const UNITS_CHARGED_TOTAL: &str = "ratewatch_units_charged_total";
/// Units settles gave back to reservations (used less than reserved, or
/// refused downstream): counter {tier, unit}.
pub const UNITS_REFUNDED_TOTAL: &str = "ratewatch_units_refunded_total";
/// Units settles charged beyond reservations (used more than reserved):
/// counter {tier, unit}.
pub const UNITS_SETTLED_TOTAL: &str = "ratewatch_units_settled_total";

/// The unit each limit of each tier counts, always 1: gauge {tier, limit,
/// unit}. Joined on {tier, limit} it gives `ratewatch_limit_exceeded_total`
/// its unit (refusals by limits that count tokens). Labels come from the
/// policy alone.
pub(crate) const LIMIT_UNIT_INFO: &str = "ratewatch_limit_unit_info";

/// Label: `charged` or `refunded`.
pub const LABEL_DIRECTION: &str = "direction";
/// Label: the unit a limit counts (`requests`, `tokens`, ...: from the
/// policy, never from a request).
pub const LABEL_UNIT: &str = "unit";

/// The `outcome` values of [`SETTLES_TOTAL`].
pub const SETTLE_OUTCOMES: [&str; 4] = ["charged", "refunded", "failed", "stale"];

/// Describes the cost families to the current recorder.
pub fn describe() {
    describe_counter!(
        COST_UNITS_TOTAL,
        "Units admitted requests were charged at their decision, where the request named its cost."
    );
    describe_counter!(
        SETTLES_TOTAL,
        "Settles after a response: charged (used more than reserved), refunded (used less), failed (the store could not be asked), stale (the policy changed since the decision: not settled)."
    );
    describe_counter!(
        SETTLED_UNITS_TOTAL,
        "Units settles charged beyond a reservation or gave back to it."
    );
    describe_counter!(
        UNITS_CHARGED_TOTAL,
        "Units admitted requests were charged at their decision, per unit (requests, tokens, ...)."
    );
    describe_counter!(
        UNITS_REFUNDED_TOTAL,
        "Units settles gave back to reservations, per unit: used less than reserved, or refused downstream."
    );
    describe_counter!(
        UNITS_SETTLED_TOTAL,
        "Units settles charged beyond reservations, per unit: used more than reserved."
    );
    describe_gauge!(
        LIMIT_UNIT_INFO,
        "The unit each limit of each tier counts (always 1), to join with ratewatch_limit_exceeded_total on tier and limit."
    );
}

/// Makes every cost family exist at zero, for each tier on route `*`.
pub fn register_at_zero(policy: &Policy) {
    describe();
    let limiter = super::metrics::zero_limiter(policy);
    for tier in &policy.tiers {
        let t = tier.name.clone();
        let mut labels = vec![
            Label::new(LABEL_TIER, t.clone()),
            Label::new(LABEL_ROUTE, "*"),
        ];
        super::metrics::push_limiter(&mut labels, limiter.as_ref());
        counter!(COST_UNITS_TOTAL, labels).increment(0);
        for o in SETTLE_OUTCOMES {
            counter!(SETTLES_TOTAL, LABEL_TIER => t.clone(), LABEL_ROUTE => "*", super::metrics::LABEL_OUTCOME => o)
                .increment(0);
        }
        for d in ["charged", "refunded"] {
            counter!(SETTLED_UNITS_TOTAL, LABEL_TIER => t.clone(), LABEL_ROUTE => "*", LABEL_DIRECTION => d)
                .increment(0);
        }
        let mut units: Vec<&str> = Vec::new();
        let limits = tier.limits.iter().chain(
            policy
                .routes
                .iter()
                .flat_map(|r| &r.limits)
                .filter(|l| l.applies_to(&tier.name)),
        );
        for l in limits {
            gauge!(LIMIT_UNIT_INFO, LABEL_TIER => t.clone(), LABEL_LIMIT => l.name.clone(), LABEL_UNIT => l.unit.clone())
                .set(1.0);
            if !units.contains(&l.unit.as_str()) {
                units.push(&l.unit);
            }
        }
        for unit in units {
            for family in [
                UNITS_CHARGED_TOTAL,
                UNITS_REFUNDED_TOTAL,
                UNITS_SETTLED_TOTAL,
            ] {
                let mut labels = vec![
                    Label::new(LABEL_TIER, t.clone()),
                    Label::new(LABEL_UNIT, unit.to_owned()),
                ];
                // Only the charged family is the limiter's: settles are not
                // split by limiter.
                if family == UNITS_CHARGED_TOTAL {
                    super::metrics::push_limiter(&mut labels, limiter.as_ref());
                }
                counter!(family, labels).increment(0);
            }
        }
    }
}

/// An admitted request charged `units` of `unit` at its decision, by the
/// limiter named `limiter` (`None`: an unnamed one, no `limiter` label).
pub(crate) fn units_charged(tier: &str, unit: &str, limiter: Option<&Arc<str>>, units: u64) {
    let series = Series {
        family: UNITS_CHARGED_TOTAL,
        first: (LABEL_TIER, tier),
        second: (LABEL_UNIT, unit),
        third: None,
        limiter,
    };
    super::labelled::add(&series, units);
}

/// A settle gave back (`refunded`) or charged `units` of `unit`.
pub(crate) fn units_settled(tier: &str, unit: &str, refunded: bool, units: u64) {
    let family = if refunded {
        UNITS_REFUNDED_TOTAL
    } else {
        UNITS_SETTLED_TOTAL
    };
    let series = Series::two(family, (LABEL_TIER, tier), (LABEL_UNIT, unit));
    super::labelled::add(&series, units);
}

/// An admitted request charged `units` at its decision, by the limiter
/// named `limiter` (`None`: an unnamed one, no `limiter` label).
pub(crate) fn charged_at_decision(tier: &str, route: &str, limiter: Option<&Arc<str>>, units: u64) {
    let series = Series {
        family: COST_UNITS_TOTAL,
        first: (LABEL_TIER, tier),
        second: (LABEL_ROUTE, route),
        third: None,
        limiter,
    };
    super::labelled::add(&series, units);
}

/// A settle ended: `outcome` is `charged`, `refunded`, `failed` or `stale`; `units`
/// were moved (0 when it failed or was stale).
pub(crate) fn settled(tier: &str, route: &str, outcome: &'static str, units: u64) {
    let series = Series::two(SETTLES_TOTAL, (LABEL_TIER, tier), (LABEL_ROUTE, route));
    super::labelled::add(&series.and(super::metrics::LABEL_OUTCOME, outcome), 1);
    if outcome == "charged" || outcome == "refunded" {
        let series = Series::two(
            SETTLED_UNITS_TOTAL,
            (LABEL_TIER, tier),
            (LABEL_ROUTE, route),
        );
        super::labelled::add(&series.and(LABEL_DIRECTION, outcome), units);
    }
}
