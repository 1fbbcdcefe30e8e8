//! The decision event: what telemetry hears of every decision.

use std::sync::Arc;

use super::live::Live;
use super::{Decision, Limiter, Source};
use crate::identity::Identity;
use crate::telemetry::Event;

impl Limiter {
    pub(super) fn record(
        &self,
        live: &Live,
        d: &Decision,
        route: Option<usize>,
        identity: &Identity,
        cost: u64,
    ) {
        let c = &live.compiled;
        // A fallback that counted nothing exceeded nothing.
        let exceeded: Vec<Arc<str>> = d
            .limits
            .iter()
            .filter(|l| d.state_known() && !l.allowed)
            .map(|l| l.name.clone())
            .collect();
        let fallback = match &d.source {
            Source::Fallback { reason, policy, .. } => Some((*reason, *policy)),
            Source::Store { .. } => None,
        };
        let event = Event {
            tier: d.tier.clone(),
            route: route.map_or_else(|| c.any_route.clone(), |i| c.routes[i].label.clone()),
            limit: d.most_constraining().map(|l| l.name.clone()),
            exceeded,
            outcome: d.outcome,
            shard: d.source.shard().clone(),
            // Only the fleet view's top keys read the display form.
            identity: if self.inner.telemetry.keeps_identities() {
                identity.display(live.policy.telemetry.key_display)
            } else {
                String::new()
            },
            cost,
            redis_rtt: d.store_rtt,
            fallback,
        };
        self.inner.telemetry.record(&event);
    }
}
