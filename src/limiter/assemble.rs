//! A store's verdicts turned into the [`Decision`] a request is answered
//! with: one report per limit, the retry time, the shaping delay and the
//! outcome telemetry records.

use std::time::Duration;

use super::compiled::CompiledLimit;
use super::{Decision, DecisionPath, LimitReport, Source};
use crate::algorithm::Verdict;
use crate::store::{Item, StoreDecision};
use crate::telemetry::Outcome;

/// The decision for `limits` (same order as the store's verdicts).
/// `local_items` are the items the local fallback decided, whose scaled
/// algorithms the reports show instead of the policy's.
pub(super) fn build(
    tier: std::sync::Arc<str>,
    limits: &[&CompiledLimit],
    d: StoreDecision,
    source: Source,
    local_items: Option<&[Item]>,
) -> Decision {
    let reports: Vec<LimitReport> = limits
        .iter()
        .zip(&d.verdicts)
        .enumerate()
        .map(|(i, (l, v))| report(l, v, local_items.map(|items| &items[i])))
        .collect();
    let retry_after = (!d.allowed).then(|| {
        reports
            .iter()
            .filter(|r| !r.shadow && !r.allowed)
            .map(|r| r.retry_after)
            .max()
            .unwrap_or(Duration::from_secs(1))
    });
    // A shadow shaper reports its delay but never holds a request.
    let delay = d
        .verdicts
        .iter()
        .zip(limits)
        .filter(|(_, l)| !l.shadow)
        .map(|(v, _)| v.delay_us)
        .max()
        .map_or(Duration::ZERO, Duration::from_micros);
    let shadow_blocked = reports.iter().any(|r| r.shadow && !r.allowed);
    let outcome = match (d.allowed, shadow_blocked) {
        (false, _) => Outcome::Blocked,
        (true, true) => Outcome::ShadowBlocked,
        (true, false) => Outcome::Allowed,
    };
    Decision {
        allowed: d.allowed,
        tier,
        limits: reports,
        retry_after,
        delay: if d.allowed { delay } else { Duration::ZERO },
        source,
        outcome,
        store_rtt: d.rtt,
        decided_at: d.now,
        path: DecisionPath::Store,
        route: None,
        method: None,
        slot: None,
    }
}

fn report(l: &CompiledLimit, v: &Verdict, local: Option<&Item>) -> LimitReport {
    let algorithm = local.map_or(&l.algorithm, |i| &i.algorithm);
    LimitReport {
        name: l.name.clone(),
        unit: l.unit.clone(),
        quota: algorithm.quota(),
        window_secs: algorithm.window_secs(),
        remaining: Some(v.remaining),
        reset_after: Duration::from_micros(v.reset_after_us),
        retry_after: Duration::from_micros(v.retry_after_us),
        allowed: v.allowed,
        shadow: l.shadow,
        exceeds_quota: false,
    }
}
