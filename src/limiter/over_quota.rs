//! A request that costs more than a limit can ever admit (more than its
//! quota, capacity or burst) is refused outright: waiting would never let
//! it pass, so it gets no retry time rather than one that lies.
//!
//! The store is only asked to report (a peek, which charges nothing), so
//! the refusal still carries every limit's state; each limit the cost
//! exceeds says so ([`LimitReport::exceeds_quota`](super::LimitReport)),
//! and [`Decision::retry_after`] is `None`. The layer answers it with a 429
//! without `Retry-After`.

use std::time::Duration;

use super::decide::Prepared;
use super::live::Live;
use super::{Decision, Limiter};
use crate::identity::Identity;
use crate::store::{Batch, Item};
use crate::telemetry::Outcome;

impl Prepared<'_> {
    /// Whether the request costs more than some enforced limit's quota.
    pub(super) fn exceeds_quota(&self) -> bool {
        !self.peek
            && self
                .items
                .iter()
                .any(|i| !i.shadow && i.cost.unwrap_or(self.cost) > i.algorithm.max_cost())
    }
}

impl Limiter {
    /// The refusal of a request [`Prepared::exceeds_quota`], recorded.
    pub(super) async fn over_quota(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        identity: &Identity,
    ) -> Decision {
        let batch = Batch::peek(&p.items);
        let (d, _) = self
            .decide_exact(
                live, p.tier, p.route, identity, &batch, p.failure, &p.limits, false,
            )
            .await;
        self.recorded(
            live,
            p,
            refused(d, &p.items, p.cost),
            identity,
            Default::default(),
        )
    }

    /// [`Limiter::over_quota`] without waiting, where the store decides in
    /// process.
    pub(super) fn over_quota_now(
        &self,
        live: &Live,
        p: &Prepared<'_>,
        identity: &Identity,
    ) -> Option<Decision> {
        let batch = Batch::peek(&p.items);
        let answer = self.decide_now(&batch)?;
        let (d, _) = self.answered(
            live, p.tier, p.route, identity, &batch, p.failure, &p.limits, answer, false,
        );
        Some(self.recorded(
            live,
            p,
            refused(d, &p.items, p.cost),
            identity,
            Default::default(),
        ))
    }
}

/// `peeked` turned into the refusal of a request costing `cost`.
fn refused(mut peeked: Decision, items: &[Item], cost: u64) -> Decision {
    for (report, item) in peeked.limits.iter_mut().zip(items) {
        if item.cost.unwrap_or(cost) > item.algorithm.max_cost() {
            report.allowed = false;
            report.exceeds_quota = true;
            report.retry_after = Duration::ZERO;
        }
    }
    peeked.allowed = false;
    peeked.retry_after = None;
    peeked.delay = Duration::ZERO;
    peeked.outcome = Outcome::Blocked;
    peeked
}
