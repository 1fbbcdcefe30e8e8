//! Several groups of limits decided in ONE store call, all or nothing: the
//! descriptors of one rate limit service request.
//!
//! A group is what one descriptor asks: a counter identity (hashed into
//! the keys, never stored raw), its limits and its own cost (0 checks
//! without charging). Every key of one call carries the same hash tag,
//! the call's `tag` (the service passes the domain), so the whole request
//! is one script on one cluster slot: all or nothing needs one atomic
//! script, and a cluster runs a script on one slot only. The price is that
//! one domain's counters all live on one cluster shard.
//!
//! Leases do not apply here: a lease pre-pays one group of limits to one
//! process, and spending two leases together atomically in process (or
//! falling back to the store for one of them) would break the
//! all-or-nothing rule across descriptors. Every request goes to the store.

use std::sync::Arc;
use std::time::Duration;

use super::ask::StoreFailure;
use super::{Decision, DecisionPath, LimitReport, Limiter, Source};
use crate::algorithm::Algorithm;
use crate::clock::Micros;
use crate::identity::{Identity, IdentityKind};
use crate::policy::{FailurePolicy, Limit, shares};
use crate::store::keys;
use crate::store::{Batch, Item, StoreDecision};
use crate::telemetry::{Event, FallbackReason, Outcome};

/// One group of limits (a descriptor's) in a [`Groups`] decision.
#[derive(Debug, Clone)]
pub struct Group<'a> {
    /// What the counters belong to: equal identities share counters
    /// (within the call's tag). Hashed into keys; shown masked on the
    /// dashboard like API keys.
    pub identity: &'a str,
    /// How the dashboard shows the group (masked, hashed or raw like an
    /// API key, per `[telemetry] key_display`), such as `path=/api`.
    pub shown: &'a str,
    /// The limits, decided together with every other group's.
    pub limits: &'a [Limit],
    /// Units asked of every limit of the group; 0 checks without charging.
    pub cost: u64,
    /// Decided and reported, never blocks the request.
    pub shadow: bool,
    /// Bounded label for telemetry (the `route` of its events): a rule
    /// name from configuration, never a request value.
    pub label: Arc<str>,
}

/// What to answer when the store cannot decide a [`Groups`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupsFailure {
    /// A failure policy of the middleware: open, closed or local.
    Policy(FailurePolicy),
    /// No answer: [`Limiter::decide_groups`] returns the failure, so the
    /// caller (a proxy with its own failure setting) decides.
    Unavailable,
}

/// A request of several groups, decided in one store call.
#[derive(Debug, Clone)]
pub struct Groups<'a> {
    /// The hash tag every key carries (one cluster slot for the call) and
    /// the `tier` of its telemetry events: a domain name from config.
    pub tag: Arc<str>,
    /// The groups, in order.
    pub groups: Vec<Group<'a>>,
    /// What to do when the store cannot decide.
    pub on_failure: GroupsFailure,
    /// Report without charging anything.
    pub peek: bool,
}

/// One group's part of a [`GroupsDecision`].
#[derive(Debug, Clone, PartialEq)]
pub struct GroupReport {
    /// Whether every enforced limit of this group admitted (a shadow group
    /// reports its own verdict here but never blocks the request).
    pub allowed: bool,
    /// Each limit's state, in the group's order. Nothing was charged
    /// unless the whole request was admitted.
    pub limits: Vec<LimitReport>,
}

/// The answer of [`Limiter::decide_groups`].
#[derive(Debug, Clone, PartialEq)]
pub struct GroupsDecision {
    /// Whether the request passes: every enforced limit of every
    /// non-shadow group admitted (then all were charged), or the failure
    /// policy admitted it.
    pub allowed: bool,
    /// One report per group, in order.
    pub groups: Vec<GroupReport>,
    /// Who decided.
    pub source: Source,
    /// Round trip of the store call, when Redis was asked.
    pub store_rtt: Option<Duration>,
    /// The time the decision was made at.
    pub decided_at: Micros,
}

impl GroupsDecision {
    /// Whether the failure policy, not the store, answered.
    pub fn is_fallback(&self) -> bool {
        self.source.is_fallback()
    }

    /// Whether the limits' state is known: false when the store could not
    /// decide and the open or closed policy answered without counting.
    pub fn state_known(&self) -> bool {
        self.source.state_known()
    }
}

/// The store could not decide and the call asked for no fallback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupsUnavailable {
    /// Why.
    pub reason: FallbackReason,
    /// The shard that failed.
    pub shard: Arc<str>,
}

impl std::fmt::Display for GroupsUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "store shard {} could not decide ({})",
            self.shard,
            self.reason.as_str()
        )
    }
}

impl std::error::Error for GroupsUnavailable {}

/// A group's limits, compiled for the store and the local fallback.
struct Compiled {
    items: Vec<Item>,
    local: Vec<Item>,
    /// (group, name, algorithm) per item, for the reports.
    owners: Vec<(usize, Arc<str>, Algorithm, bool)>,
}

fn compile(prefix: &str, instances: u32, key: &keys::IdentityKey, groups: &Groups<'_>) -> Compiled {
    // Keyed like every identity, so descriptor values (often API keys or
    // addresses) cannot be read back from Redis key names offline.
    let tag = key.hash_identity("rls-domain", &groups.tag);
    let mut items = Vec::new();
    let mut local = Vec::new();
    let mut owners = Vec::new();
    for (g, group) in groups.groups.iter().enumerate() {
        let who = key.hash_identity("rls", group.identity);
        for limit in group.limits {
            let algorithm = limit.algorithm.clone();
            let code = keys::limit_code(None, &limit.name, keys::algorithm_code(&algorithm));
            let key = keys::descriptor_key(prefix, &tag, &who, &code);
            let shadow = group.shadow || limit.shadow;
            let mut item = Item::new(key, algorithm.clone()).with_cost(group.cost);
            item.shadow = shadow;
            let mut l = item.clone();
            l.algorithm = shares::local_share(&algorithm, instances);
            items.push(item);
            local.push(l);
            owners.push((g, Arc::from(limit.name.as_str()), algorithm, shadow));
        }
    }
    Compiled {
        items,
        local,
        owners,
    }
}

impl Limiter {
    /// Decides every group of `request` in one store call, all or nothing:
    /// the request passes only if every enforced limit of every group
    /// admits, and then each limit is charged its group's cost; a refused
    /// request charges nothing. The breaker and the store timeout apply;
    /// when the store cannot decide, `on_failure` answers (or, with
    /// [`GroupsFailure::Unavailable`], the failure is returned). One
    /// telemetry event is recorded per group (unless peeking).
    pub async fn decide_groups(
        &self,
        request: &Groups<'_>,
    ) -> Result<GroupsDecision, GroupsUnavailable> {
        let live = self.inner.live.load();
        let policy = &live.policy;
        let c = compile(
            &policy.store.key_prefix,
            policy.resilience.expected_instances.max(1),
            &live.key,
            request,
        );
        if c.items.is_empty() {
            return Ok(self.groups_unlimited(request));
        }
        let batch = if request.peek {
            Batch::peek(&c.items)
        } else {
            Batch::consume(&c.items, 1)
        };
        let answer = match self.decide_now(&batch) {
            Some(a) => a,
            None => self.ask_store(&batch, policy.store.timeout).await,
        };
        let decision = match answer {
            Ok(d) => {
                let source = Source::Store {
                    shard: d.shard.clone(),
                };
                reports(request, &c, d, source, false)
            }
            Err(f) => self.groups_failed(request, &c, &batch, f)?,
        };
        if !request.peek {
            self.record_groups(&live.policy, request, &decision);
        }
        Ok(decision)
    }

    /// Charges every group of `request` its cost, forced: past the limit
    /// as debt, capped as a settle's is ([`crate::algorithm::settle`]), so
    /// a charge reported after the response (Envoy's
    /// `apply_on_stream_done` entry) always lands. One store settle per
    /// distinct cost (usually one), within the store timeout; nothing is
    /// recorded as a decision. Groups of cost 0 charge nothing.
    pub async fn charge_groups(&self, request: &Groups<'_>) -> Result<(), GroupsUnavailable> {
        let live = self.inner.live.load();
        let policy = &live.policy;
        let c = compile(
            &policy.store.key_prefix,
            policy.resilience.expected_instances.max(1),
            &live.key,
            request,
        );
        let mut costs: Vec<u64> = request.groups.iter().map(|g| g.cost).collect();
        costs.sort_unstable();
        costs.dedup();
        let now = self.inner.clock.now_us();
        for cost in costs.into_iter().filter(|&c| c > 0) {
            let items: Vec<Item> = c
                .items
                .iter()
                .zip(&c.owners)
                .filter(|(_, (g, ..))| request.groups[*g].cost == cost)
                .map(|(i, _)| i.clone())
                .collect();
            let settle =
                crate::store::Settle::new(&items, now, crate::algorithm::Adjust::Charge(cost));
            let shard = self.inner.store.shard_for(&items[0].key);
            let failed = |reason| GroupsUnavailable {
                reason,
                shard: shard.clone(),
            };
            match tokio::time::timeout(policy.store.timeout, self.inner.store.settle(&settle)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "store could not charge");
                    return Err(failed(FallbackReason::Error));
                }
                Err(_) => return Err(failed(FallbackReason::Timeout)),
            }
        }
        Ok(())
    }

    fn groups_unlimited(&self, request: &Groups<'_>) -> GroupsDecision {
        GroupsDecision {
            allowed: true,
            groups: request
                .groups
                .iter()
                .map(|_| GroupReport {
                    allowed: true,
                    limits: Vec::new(),
                })
                .collect(),
            source: Source::Store {
                shard: "memory".into(),
            },
            store_rtt: None,
            decided_at: self.inner.clock.now_us(),
        }
    }

    fn groups_failed(
        &self,
        request: &Groups<'_>,
        c: &Compiled,
        batch: &Batch<'_>,
        f: StoreFailure,
    ) -> Result<GroupsDecision, GroupsUnavailable> {
        let shard = f.shard.unwrap_or_else(|| "memory".into());
        let policy = match request.on_failure {
            GroupsFailure::Unavailable => {
                return Err(GroupsUnavailable {
                    reason: f.reason,
                    shard,
                });
            }
            GroupsFailure::Policy(p) => p,
        };
        let source = Source::Fallback {
            reason: f.reason,
            policy,
            shard: shard.clone(),
        };
        match policy {
            FailurePolicy::Open | FailurePolicy::Closed => {
                let allowed = policy == FailurePolicy::Open;
                let mut groups: Vec<GroupReport> = request
                    .groups
                    .iter()
                    .map(|_| GroupReport {
                        allowed,
                        limits: Vec::new(),
                    })
                    .collect();
                // Nothing was counted: each limit is reported with its
                // policy only, and no remaining quota is invented.
                for (g, name, algorithm, shadow) in &c.owners {
                    groups[*g].limits.push(LimitReport {
                        name: name.clone(),
                        unit: super::costs::requests_unit(),
                        quota: algorithm.quota(),
                        window_secs: algorithm.window_secs(),
                        remaining: None,
                        reset_after: Duration::ZERO,
                        retry_after: Duration::ZERO,
                        allowed,
                        shadow: *shadow,
                        exceeds_quota: false,
                    });
                }
                Ok(GroupsDecision {
                    allowed,
                    groups,
                    source,
                    store_rtt: None,
                    decided_at: self.inner.clock.now_us(),
                })
            }
            FailurePolicy::Local => {
                let local = Batch {
                    items: &c.local,
                    ..*batch
                };
                let (d, _) = self.inner.local.decide(&shard, &local);
                Ok(reports(request, c, d, source, true))
            }
        }
    }

    /// One event per group: the domain as tier, the rule label as route,
    /// the descriptor (masked like a key) as identity.
    fn record_groups(
        &self,
        policy: &crate::policy::Policy,
        request: &Groups<'_>,
        d: &GroupsDecision,
    ) {
        let telemetry = &self.inner.telemetry;
        let fallback = match &d.source {
            Source::Fallback { reason, policy, .. } => Some((*reason, *policy)),
            Source::Store { .. } => None,
        };
        for (group, report) in request.groups.iter().zip(&d.groups) {
            let shadow_blocked = report.limits.iter().any(|l| l.shadow && !l.allowed);
            let outcome = match (fallback, report.allowed || group.shadow) {
                (Some(_), true) => Outcome::FallbackAllowed,
                (Some(_), false) => Outcome::FallbackBlocked,
                (None, false) => Outcome::Blocked,
                (None, true) if shadow_blocked => Outcome::ShadowBlocked,
                (None, true) => Outcome::Allowed,
            };
            let exceeded = report
                .limits
                .iter()
                .filter(|l| d.state_known() && !l.allowed && !l.shadow)
                .map(|l| l.name.clone())
                .collect();
            let identity = if telemetry.keeps_identities() {
                Identity::new(IdentityKind::Custom, group.shown)
                    .display(policy.telemetry.key_display)
                    .into()
            } else {
                super::record::no_display()
            };
            let limit = report
                .limits
                .iter()
                .find(|l| !l.allowed && !l.shadow)
                .or(report.limits.first())
                .map(|l| &*l.name);
            crate::telemetry::span::decision(
                &request.tag,
                &group.label,
                outcome,
                limit,
                "store",
                d.store_rtt,
            );
            telemetry.record(&Event {
                tier: request.tag.clone(),
                route: group.label.clone(),
                limit: report.limits.first().map(|l| l.name.clone()),
                exceeded,
                outcome,
                shard: d.source.shard().clone(),
                identity,
                cost: group.cost,
                units: Default::default(),
                redis_rtt: d.store_rtt,
                fallback,
            });
        }
    }
}

/// The per-group reports of a store's (or the local fallback's) answer.
fn reports(
    request: &Groups<'_>,
    c: &Compiled,
    d: StoreDecision,
    source: Source,
    local: bool,
) -> GroupsDecision {
    let mut groups: Vec<GroupReport> = request
        .groups
        .iter()
        .map(|_| GroupReport {
            allowed: true,
            limits: Vec::new(),
        })
        .collect();
    for (i, ((g, name, algorithm, shadow), v)) in c.owners.iter().zip(&d.verdicts).enumerate() {
        let algorithm = if local {
            &c.local[i].algorithm
        } else {
            algorithm
        };
        if !v.allowed && !shadow {
            groups[*g].allowed = false;
        }
        groups[*g].limits.push(LimitReport {
            name: name.clone(),
            unit: super::costs::requests_unit(),
            quota: algorithm.quota(),
            window_secs: algorithm.window_secs(),
            remaining: Some(v.remaining),
            reset_after: Duration::from_micros(v.reset_after_us),
            retry_after: Duration::from_micros(v.retry_after_us),
            allowed: v.allowed,
            shadow: *shadow,
            exceeds_quota: false,
        });
    }
    GroupsDecision {
        allowed: d.allowed,
        groups,
        source,
        store_rtt: d.rtt,
        decided_at: d.now,
    }
}

/// A [`Decision`] for one group, for the middleware's headers (the
/// native `/v1/decide` answers with them).
pub fn group_decision(d: &GroupsDecision, tier: Arc<str>) -> Decision {
    let limits: Vec<LimitReport> = d.groups.iter().flat_map(|g| g.limits.clone()).collect();
    let retry_after = (!d.allowed).then(|| {
        limits
            .iter()
            .filter(|l| !l.shadow && !l.allowed)
            .map(|l| l.retry_after)
            .max()
            .unwrap_or(Duration::from_secs(1))
    });
    Decision {
        allowed: d.allowed,
        tier,
        limits,
        retry_after,
        delay: Duration::ZERO,
        source: d.source.clone(),
        outcome: if d.allowed {
            Outcome::Allowed
        } else {
            Outcome::Blocked
        },
        store_rtt: d.store_rtt,
        decided_at: d.decided_at,
        path: DecisionPath::Store,
        route: None,
        method: None,
        slot: None,
    }
}
