//! A route-wide ceiling leased on its own.
//!
//! A lease of the whole request is keyed by all its store keys, so it is
//! one identity on one route. A `scope = "route"` ceiling is hot only in
//! aggregate: every identity may be far below `enter_per_second` while the
//! route key takes every request. When the ceiling's limits are
//! leased/auto and the request's other limits are exact (or follow), the
//! ceiling gets a lease of its own, keyed by the route items only: one per
//! route and instance, shared by every identity, its rate the route's
//! aggregate.
//!
//! A request spends its cost from that lease first (no I/O). Then the
//! other limits are decided in the store, in one call. If they refuse (or
//! the store fails), the spent units go back into the very lease they came
//! from: they are still charged and still held, so nothing is overshot and
//! nothing lost. Without units in the lease (none yet, the tail, expired),
//! the whole request is decided exactly, as ever.

use std::time::Instant;

use super::super::compiled::{CompiledLimit, CompiledTier};
use super::super::live::Live;
use super::super::{Decision, Limiter, Source, build};
use super::{local, metrics};
use crate::identity::Identity;
use crate::lease::{Label, Request, Step};
use crate::policy::{FailurePolicy, LeaseMode, Scope};
use crate::store::{Batch, Charge, Item, StoreDecision};

/// What the split looks at of one limit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Part {
    /// `scope = "route"`.
    pub(super) route_scope: bool,
    /// The limit's own mode (`None`: it follows the others).
    pub(super) mode: Option<LeaseMode>,
    /// Whether its algorithm can be leased.
    pub(super) leasable: bool,
    /// A shadow limit never refuses, so its algorithm does not matter.
    pub(super) shadow: bool,
}

/// A request's limits split into the route-wide ceiling, leased on its
/// own, and the rest, decided exactly (indexes into the request's limits).
#[derive(Debug, PartialEq)]
pub(super) struct Split {
    pub(super) route: Vec<usize>,
    pub(super) rest: Vec<usize>,
    /// The ceiling's mode: `Leased` or `Auto`.
    pub(super) mode: LeaseMode,
}

impl Split {
    /// The split of a request's limits, if its ceiling can be leased apart:
    /// no route-level `mode` (which decides for the whole request), at
    /// least one route-scope limit and one other, the route-scope limits
    /// `leased` or `auto` and all leasable, the others exact or following.
    pub(super) fn of(route_mode: Option<LeaseMode>, parts: &[Part]) -> Option<Split> {
        if route_mode.is_some() {
            return None;
        }
        let (route, rest): (Vec<usize>, Vec<usize>) =
            (0..parts.len()).partition(|&i| parts[i].route_scope);
        // Only route limits: the whole request's lease is the ceiling's.
        if route.is_empty() || rest.is_empty() {
            return None;
        }
        if route
            .iter()
            .any(|&i| !parts[i].shadow && !parts[i].leasable)
        {
            return None;
        }
        let mode = LeaseMode::of_request(None, route.iter().map(|&i| parts[i].mode));
        if mode == LeaseMode::Exact {
            return None;
        }
        let rest_mode = LeaseMode::of_request(None, rest.iter().map(|&i| parts[i].mode));
        (rest_mode == LeaseMode::Exact).then_some(Split { route, rest, mode })
    }

    fn pick<T: Clone, C: FromIterator<T>>(idx: &[usize], all: &[T]) -> C {
        idx.iter().map(|&i| all[i].clone()).collect()
    }

    /// The store's answer for every limit, from the ceiling's answer
    /// `ceiling` and the others' answer `rest`, in the request's order.
    fn merge(&self, ceiling: &StoreDecision, rest: &StoreDecision) -> StoreDecision {
        let mut verdicts = vec![None; self.route.len() + self.rest.len()];
        for (&i, v) in self.route.iter().zip(&ceiling.verdicts) {
            verdicts[i] = Some(*v);
        }
        for (&i, v) in self.rest.iter().zip(&rest.verdicts) {
            verdicts[i] = Some(*v);
        }
        StoreDecision {
            allowed: ceiling.allowed && rest.allowed,
            verdicts: verdicts.into_iter().flatten().collect(),
            shard: rest.shard.clone(),
            now: rest.now,
            rtt: rest.rtt,
        }
    }

    /// The ceiling's part of a whole-request answer; admitted when every
    /// enforced route limit admitted it.
    fn ceiling_of(&self, d: &StoreDecision, parts: &[Part]) -> StoreDecision {
        let verdicts: crate::store::Verdicts = Split::pick(&self.route, &d.verdicts);
        let allowed = self
            .route
            .iter()
            .zip(&verdicts)
            .all(|(&i, v)| parts[i].shadow || v.allowed);
        StoreDecision {
            allowed,
            verdicts,
            ..d.clone()
        }
    }
}

/// One request as the split decides it.
struct Ask<'a> {
    live: &'a Live,
    tier: &'a CompiledTier,
    route: Option<usize>,
    identity: &'a Identity,
    items: &'a [Item],
    limits: &'a [&'a CompiledLimit],
    cost: u64,
    failure: FailurePolicy,
    split: Split,
    parts: Vec<Part>,
}

impl Ask<'_> {
    fn label(&self, identity: String) -> Label {
        Label {
            identity,
            tier: self.tier.name.clone(),
            route: self.route.map_or_else(
                || self.live.compiled.any_route.clone(),
                |i| self.live.compiled.routes[i].label.clone(),
            ),
        }
    }
}

impl Limiter {
    /// Decides a request whose route-wide ceiling is leased apart from its
    /// other limits; `None` when the request does not split that way.
    /// `whole` is the whole request's lease key, if it has one, to remember
    /// a refusal under.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn decide_split(
        &self,
        live: &Live,
        tier: &CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        items: &[Item],
        limits: &[&CompiledLimit],
        cost: u64,
        failure: FailurePolicy,
        whole: Option<&Request<'_>>,
    ) -> Option<Decision> {
        let parts: Vec<Part> = limits
            .iter()
            .map(|l| Part {
                route_scope: l.scope == Scope::Route,
                mode: l.mode,
                leasable: crate::policy::leasable(&l.algorithm),
                shadow: l.shadow,
            })
            .collect();
        let route_mode = route.and_then(|i| live.compiled.routes[i].rule.mode);
        let split = Split::of(route_mode, &parts)?;
        let ask = Ask {
            live,
            tier,
            route,
            identity,
            items,
            limits,
            cost,
            failure,
            split,
            parts,
        };
        Some(self.split_decide(&ask, whole).await)
    }

    async fn split_decide(&self, ask: &Ask<'_>, whole: Option<&Request<'_>>) -> Decision {
        let inner = &*self.inner;
        let state = &inner.leases;
        self.start_sweep(ask.live);
        let s = ask.live.policy.leases;
        let instances = ask.live.policy.resilience.expected_instances;
        let budget = ask.live.policy.store.timeout;
        let route_items: Vec<_> = Split::pick(&ask.split.route, ask.items);
        let req = Request {
            key: state.key_of(&route_items),
            items: &route_items,
            cost: ask.cost,
            mode: ask.split.mode,
        };
        // The ceiling's lease is everyone's: no identity to show.
        let label = || ask.label("*".to_owned());
        let now = inner.clock.now_us();
        let (step, give) = state.table.step(&req, now, &s, instances, label);
        if let Some(g) = give {
            self.give_back_later(vec![g]);
        }
        let (ceiling, from) = match step {
            Step::Local {
                answer,
                renew,
                from,
            } => {
                if let Some(units) = renew {
                    self.renew_later(req.key, &route_items, units, ask.live);
                }
                if !answer.allowed {
                    // The ceiling's refusal, remembered: nothing to ask.
                    metrics::decision(true);
                    let route_limits: Vec<_> = Split::pick(&ask.split.route, ask.limits);
                    return local(ask.tier, &route_limits, answer);
                }
                (answer, from)
            }
            Step::Take { units } => {
                let take = Batch::consume(&route_items, units);
                let started = Instant::now();
                match self.ask_store_for(&take, budget, true).await {
                    Ok((d, charge)) if d.allowed => {
                        metrics::renew_latency(started.elapsed());
                        let heard = inner.clock.now_us();
                        let give = state.table.granted(
                            req.key,
                            now,
                            heard,
                            units,
                            ask.cost,
                            &d,
                            charge.clone(),
                            &s,
                            instances,
                        );
                        self.give_back_later(give.into_iter().collect());
                        (d, charge)
                    }
                    Ok((d, _)) => {
                        metrics::renew_latency(started.elapsed());
                        state.table.refused(req.key, now, &d, &s);
                        return self.split_exact(ask, &req, whole).await;
                    }
                    Err(f) => {
                        state.table.failed(req.key);
                        metrics::decision(false);
                        let all = Batch::consume(ask.items, ask.cost);
                        return self.failed_over(
                            ask.live,
                            ask.tier,
                            ask.route,
                            ask.identity,
                            &all,
                            ask.failure,
                            ask.limits,
                            f,
                        );
                    }
                }
            }
            Step::Exact => return self.split_exact(ask, &req, whole).await,
        };
        // The ceiling's units are spent (pre-paid); the rest in one call.
        metrics::decision(false);
        let rest_items: Vec<_> = Split::pick(&ask.split.rest, ask.items);
        let rest = Batch::consume(&rest_items, ask.cost);
        let t0 = inner.clock.now_us();
        let answer = self.ask_store(&rest, budget).await;
        let refused = !matches!(&answer, Ok(d) if d.allowed);
        if refused {
            self.put_back(req.key, ask.cost, from);
        }
        match answer {
            Ok(d) => {
                let merged = ask.split.merge(&ceiling, &d);
                if !merged.allowed {
                    self.remember(ask, whole, t0, &merged);
                }
                let source = Source::Store {
                    shard: d.shard.clone(),
                };
                build(ask.tier.name.clone(), ask.limits, merged, source, None)
            }
            Err(f) => {
                let all = Batch::consume(ask.items, ask.cost);
                self.failed_over(
                    ask.live,
                    ask.tier,
                    ask.route,
                    ask.identity,
                    &all,
                    ask.failure,
                    ask.limits,
                    f,
                )
            }
        }
    }

    /// Puts units spent from the ceiling's lease back into it, or gives
    /// them back to the store if that lease is gone; without a receipt
    /// they stay charged (the safe side) until their window rolls.
    fn put_back(&self, key: u64, units: u64, from: Option<Charge>) {
        let table = &self.inner.leases.table;
        match from {
            Some(from) => {
                let now = self.inner.clock.now_us();
                if let Some(g) = table.put_back(key, units, from, now) {
                    self.give_back_later(vec![g]);
                }
            }
            None => metrics::expired(units),
        }
    }

    /// The whole request decided exactly; a refusal of the ceiling is
    /// remembered under the ceiling's key until its retry time (and the
    /// whole refusal under the request's own key, if it has one).
    async fn split_exact(
        &self,
        ask: &Ask<'_>,
        req: &Request<'_>,
        whole: Option<&Request<'_>>,
    ) -> Decision {
        metrics::decision(false);
        let inner = &*self.inner;
        let all = Batch::consume(ask.items, ask.cost);
        let t0 = inner.clock.now_us();
        let (decision, answer) = self
            .decide_exact(
                ask.live,
                ask.tier,
                ask.route,
                ask.identity,
                &all,
                ask.failure,
                ask.limits,
                true,
            )
            .await;
        if let Some(d) = answer.filter(|d| !d.allowed) {
            let now = inner.clock.now_us();
            let ceiling = ask.split.ceiling_of(&d, &ask.parts);
            let s = &ask.live.policy.leases;
            let instances = ask.live.policy.resilience.expected_instances;
            inner
                .leases
                .table
                .heard(req, t0, now, &ceiling, s, instances, || {
                    ask.label("*".to_owned())
                });
            self.remember(ask, whole, t0, &d);
        }
        decision
    }

    /// Remembers a refusal `d` (all of the request's limits) under the
    /// whole request's key, if it has one.
    fn remember(&self, ask: &Ask<'_>, whole: Option<&Request<'_>>, t0: u64, d: &StoreDecision) {
        let Some(w) = whole else { return };
        let inner = &*self.inner;
        let display = ask.live.policy.telemetry.key_display;
        inner.leases.table.heard(
            w,
            t0,
            inner.clock.now_us(),
            d,
            &ask.live.policy.leases,
            ask.live.policy.resilience.expected_instances,
            || ask.label(ask.identity.display(display)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(route_scope: bool, mode: Option<LeaseMode>) -> Part {
        Part {
            route_scope,
            mode,
            leasable: true,
            shadow: false,
        }
    }

    const AUTO: Option<LeaseMode> = Some(LeaseMode::Auto);
    const LEASED: Option<LeaseMode> = Some(LeaseMode::Leased);
    const EXACT: Option<LeaseMode> = Some(LeaseMode::Exact);

    #[test]
    fn a_route_ceiling_beside_exact_or_following_limits_is_split_off() {
        let parts = [part(false, None), part(true, AUTO), part(false, EXACT)];
        assert_eq!(
            Split::of(None, &parts),
            Some(Split {
                route: vec![1],
                rest: vec![0, 2],
                mode: LeaseMode::Auto,
            })
        );
        let leased = [part(true, LEASED), part(false, None)];
        assert_eq!(Split::of(None, &leased).unwrap().mode, LeaseMode::Leased);
    }

    #[test]
    fn no_split_when_the_route_decides_or_nothing_is_left_to_split() {
        let parts = [part(false, None), part(true, AUTO)];
        // A route-level mode decides the whole request.
        assert_eq!(Split::of(Some(LeaseMode::Auto), &parts), None);
        assert_eq!(Split::of(Some(LeaseMode::Exact), &parts), None);
        // Only the ceiling: the whole request's lease is the ceiling's.
        assert_eq!(Split::of(None, &[part(true, AUTO)]), None);
        // No ceiling.
        assert_eq!(Split::of(None, &[part(false, AUTO)]), None);
    }

    #[test]
    fn no_split_when_the_ceiling_is_exact_or_unleasable_or_the_rest_leases() {
        assert_eq!(
            Split::of(None, &[part(true, EXACT), part(false, None)]),
            None
        );
        let mut log = part(true, AUTO);
        log.leasable = false;
        assert_eq!(Split::of(None, &[log, part(false, None)]), None);
        // An unleasable shadow ceiling never refuses: it may ride along.
        log.shadow = true;
        assert!(Split::of(None, &[log, part(false, None)]).is_some());
        // The identity's own limits lease: the whole request is leased.
        assert_eq!(
            Split::of(None, &[part(true, AUTO), part(false, AUTO)]),
            None
        );
        assert_eq!(
            Split::of(None, &[part(true, AUTO), part(false, LEASED)]),
            None
        );
        // Any exact limit among two ceilings makes the ceiling exact.
        assert_eq!(
            Split::of(
                None,
                &[part(true, AUTO), part(true, EXACT), part(false, None)]
            ),
            None
        );
    }

    #[test]
    fn answers_merge_back_in_the_request_order() {
        use crate::algorithm::Verdict;
        let v = |remaining: f64, allowed: bool| Verdict {
            allowed,
            remaining,
            reset_after_us: 0,
            retry_after_us: 0,
            delay_us: 0,
        };
        let d = |verdicts: Vec<Verdict>, allowed: bool| StoreDecision {
            allowed,
            verdicts: verdicts.into(),
            shard: "s".into(),
            now: 7,
            rtt: None,
        };
        let split = Split {
            route: vec![1],
            rest: vec![0, 2],
            mode: LeaseMode::Auto,
        };
        let merged = split.merge(
            &d(vec![v(1.0, true)], true),
            &d(vec![v(0.0, true), v(2.0, false)], false),
        );
        let rem: Vec<f64> = merged.verdicts.iter().map(|v| v.remaining).collect();
        assert_eq!(rem, [0.0, 1.0, 2.0]);
        assert!(!merged.allowed);
        let parts = [part(false, None), part(true, AUTO), part(false, None)];
        let whole = d(vec![v(0.0, true), v(1.0, false), v(2.0, true)], false);
        let c = split.ceiling_of(&whole, &parts);
        assert!(!c.allowed);
        assert_eq!(c.verdicts.len(), 1);
        assert_eq!(c.verdicts[0].remaining, 1.0);
    }
}
