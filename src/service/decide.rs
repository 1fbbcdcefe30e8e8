//! [`RateLimitService`]: one [`RlsRequest`] to one limiter call.
//!
//! Each descriptor is matched to its rule in the request's domain
//! (envoyproxy/ratelimit's rules, see [`crate::policy::rls::Domain::find`]),
//! or decided by the limit the proxy sent with it. Every descriptor that
//! has limits becomes one group of [`Limiter::decide_groups`], so the whole
//! request is ONE atomic store call: all or nothing, a refused request
//! charges nothing. A descriptor repeated in a request names its counter
//! once per copy: each copy is charged, in order, inside that call. The
//! one exception is a charge of an `apply_on_stream_done` rule, forced
//! through [`Limiter::charge_groups`] before the decision (which then only
//! reports it).
//!
//! Status per descriptor, in request order:
//! - no rule, an unknown domain, or a rule replaced by another matched
//!   rule's `replaces`: OK, no `current_limit`, nothing counted;
//! - an `unlimited` rule: the same, with `limit_remaining` 4294967295 (as
//!   envoyproxy/ratelimit reports it);
//! - a shadow rule: decided and counted like any other, but always OK;
//! - otherwise OK or OVER_LIMIT, with `current_limit`, `limit_remaining`
//!   (0 when OVER_LIMIT) and `duration_until_reset` of the rule's most
//!   constraining limit; `requests_per_unit: 0` is a window of nothing.
//!
//! Limits that are not windows are reported honestly, not as windows they
//! are not: `requests_per_unit` is the limit's quota (a token bucket's
//! capacity, a GCRA's burst), `unit` is the limit's window when that is
//! one whole unit, else the smallest unit at least as long as the time the
//! limit takes to
//! refill from empty; `limit_remaining` is what is left now (rounded down)
//! and `duration_until_reset` the time until the quota is whole again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proto::Unit;
use super::request::{CurrentLimit, RlsAnswer, RlsDescriptor, RlsRequest, RlsStatus};
use crate::identity::{Identity, IdentityKind};
use crate::limiter::{
    Group, GroupReport, Groups, GroupsDecision, GroupsFailure, GroupsUnavailable, LimitReport,
    Limiter,
};
use crate::policy::rls::{DescriptorRule, Domain, RlsFailure, RlsHeaders, RlsSettings};
use crate::policy::{FailurePolicy, Limit};
use crate::telemetry::detailed::{self, HitResult};
use crate::telemetry::rls as m;

/// The decision service: a limiter and how to answer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RateLimitService {
    limiter: Limiter,
    /// Set by [`RateLimitService::with_ietf_headers`]; else the policy's
    /// `[rls] response_headers` decides, afresh for every request.
    ietf_headers: Option<bool>,
}

/// Why a request got no decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RlsError {
    /// The store could not decide and the failure policy is
    /// `unavailable` (gRPC UNAVAILABLE, HTTP 503).
    #[error("{0}")]
    Unavailable(GroupsUnavailable),
}

/// What one descriptor asks for, before the store call.
enum Plan {
    /// Nothing to decide: OK.
    Free { rule: Arc<str>, unlimited: bool },
    /// Limits to decide, as group `group` of the call.
    Decide {
        rule: Arc<str>,
        limits: Vec<Limit>,
        name: String,
        cost: u64,
        shadow: bool,
        identity: String,
        shown: String,
        failure: Option<RlsFailure>,
        /// A charge of an `apply_on_stream_done` rule: forced (it lands
        /// past the limit as capped debt) before the decision, which then
        /// only reports the group.
        lands: bool,
        /// The per-value statistics' name of the descriptor, when its
        /// rule asks for one (`detailed_metric`, `value_to_metric`).
        detail: Option<String>,
    },
}

impl RateLimitService {
    /// The service deciding against `limiter` (its policy's `[rls]`
    /// domains, read afresh for every request, so reloads apply).
    /// Answers carry IETF `RateLimit` / `RateLimit-Policy` response
    /// headers when the policy's `[rls] response_headers` is `"ietf"`
    /// (none by default, as envoyproxy/ratelimit), unless
    /// [`RateLimitService::with_ietf_headers`] says otherwise.
    pub fn new(limiter: Limiter) -> Self {
        Self {
            limiter,
            ietf_headers: None,
        }
    }

    /// Whether answers carry `RateLimit` / `RateLimit-Policy` headers for
    /// the client (`response_headers_to_add`), whatever the policy's
    /// `[rls] response_headers` says.
    pub fn with_ietf_headers(mut self, on: bool) -> Self {
        self.ietf_headers = Some(on);
        self
    }

    /// The limiter decisions go to.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Registers the service's metrics at zero for every configured domain.
    pub fn register_metrics(&self) {
        m::register_policy(&self.limiter.policy());
        crate::telemetry::detailed::describe();
    }

    /// Decides `request`: every descriptor in one store call. `api` names
    /// the front end in metrics (`grpc`, `json`, `decide`).
    pub async fn decide(
        &self,
        request: &RlsRequest,
        api: &'static str,
    ) -> Result<RlsAnswer, RlsError> {
        let started = Instant::now();
        let answer = self.decide_inner(request, false).await;
        m::record_latency(api, started.elapsed());
        if answer.is_err() {
            m::record_error(api, "store_unavailable");
        }
        answer.map(|(a, _)| a)
    }

    /// [`RateLimitService::decide`] with the limiter's answer beside it
    /// (for headers built like the middleware's), and `peek` to report
    /// without charging.
    pub async fn decide_with_groups(
        &self,
        request: &RlsRequest,
        peek: bool,
        api: &'static str,
    ) -> Result<(RlsAnswer, GroupsDecision), RlsError> {
        let started = Instant::now();
        let answer = self.decide_inner(request, peek).await;
        m::record_latency(api, started.elapsed());
        if answer.is_err() {
            m::record_error(api, "store_unavailable");
        }
        answer
    }

    async fn decide_inner(
        &self,
        request: &RlsRequest,
        peek: bool,
    ) -> Result<(RlsAnswer, GroupsDecision), RlsError> {
        // One policy generation for the whole request: domains, tiers and
        // the decision itself (a reload meanwhile does not mix them).
        let snapshot = self.limiter.snapshot();
        let policy = snapshot.policy();
        let settings: &RlsSettings = &policy.rls;
        let domain = settings.domains.domain(&request.domain);
        let domain_label: Arc<str> = match domain {
            Some(d) => d.name.clone(),
            None => m::UNKNOWN_DOMAIN.into(),
        };
        // `tier_from`: the entry's value is resolved to a tier as API keys
        // are, under the same policy generation.
        let parts = http::Request::new(()).into_parts().0;
        let tier_limits = |value: &str| -> TierLimits {
            let identity = Identity::new(IdentityKind::ApiKey, value);
            let resolved = snapshot.resolve_tier(&identity, &parts);
            // A value that names no tier follows `[identity]
            // unmatched_keys`, as a key in a header does; a value of a tier
            // (the anonymous one included) keeps its own counters, as every
            // descriptor value does.
            let (tier, shared) = match snapshot.caller_of(identity, &parts) {
                // Made the anonymous caller for naming no tier: every such
                // value on one counter, so invented keys mint no quota.
                Ok(c)
                    if c.identity.kind() == IdentityKind::Ip
                        && resolved != policy.identity.anonymous_tier =>
                {
                    (c.tier, true)
                }
                Ok(_) => (resolved, false),
                Err(_) => return TierLimits::Refused,
            };
            let limits = policy
                .tiers
                .iter()
                .find(|t| t.name == tier)
                .map(|t| {
                    t.limits
                        .iter()
                        // An in-flight limit would take a slot no request
                        // end ever gives back here: the middleware's alone.
                        .filter(|l| !l.algorithm.is_concurrency())
                        .map(|l| {
                            // Apart from the rule's own limits of one name.
                            let mut l = l.clone();
                            l.name = format!("{tier}.{}", l.name);
                            l
                        })
                        .collect()
                })
                .unwrap_or_default();
            TierLimits::Tier { limits, shared }
        };
        let plans = plan(domain, request, &tier_limits);
        // One failure policy per call: the strictest any decided rule asks
        // for (unavailable > closed > local > open), else the section's.
        let failure = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Decide { failure, .. } => *failure,
                Plan::Free { .. } => None,
            })
            .max_by_key(|f| strictness(*f))
            .unwrap_or(settings.on_store_failure);
        // Charges reported after the response land first, forced; the
        // decision below then reports them without charging again.
        let charges: Vec<Group<'_>> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Decide {
                    rule,
                    limits,
                    cost,
                    identity,
                    shown,
                    lands: true,
                    ..
                } => Some(Group {
                    identity,
                    shown,
                    limits,
                    cost: *cost,
                    shadow: false,
                    label: rule.clone(),
                }),
                _ => None,
            })
            .collect();
        if !peek && !charges.is_empty() {
            let call = Groups {
                tag: domain_label.clone(),
                groups: charges,
                on_failure: GroupsFailure::Unavailable,
                peek: false,
            };
            if let Err(e) = self.limiter.charge_groups(&call).await {
                if failure == RlsFailure::Unavailable {
                    return Err(RlsError::Unavailable(e));
                }
                // The usage is lost; the failure policy answers below.
                tracing::warn!(error = %e, "a charge after the response could not land");
            }
        }
        let groups: Vec<Group<'_>> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Decide {
                    rule,
                    limits,
                    cost,
                    shadow,
                    identity,
                    shown,
                    lands,
                    ..
                } => Some(Group {
                    identity,
                    shown,
                    limits,
                    cost: if *lands { 0 } else { *cost },
                    // A landed charge is reported, never refused.
                    shadow: *shadow || *lands,
                    label: rule.clone(),
                }),
                Plan::Free { .. } => None,
            })
            .collect();
        let call = Groups {
            tag: domain_label.clone(),
            groups,
            on_failure: match failure {
                RlsFailure::Open => GroupsFailure::Policy(FailurePolicy::Open),
                RlsFailure::Closed => GroupsFailure::Policy(FailurePolicy::Closed),
                RlsFailure::Local => GroupsFailure::Policy(FailurePolicy::Local),
                RlsFailure::Unavailable => GroupsFailure::Unavailable,
            },
            peek,
        };
        let decision = self
            .limiter
            .decide_groups(&call)
            .await
            .map_err(RlsError::Unavailable)?;
        let ietf = self
            .ietf_headers
            .unwrap_or(settings.response_headers == RlsHeaders::Ietf);
        let near = (settings.near_limit_ratio, settings.detailed_metric_top_k);
        let mut answer = answer(&domain_label, &plans, &decision, peek, ietf, near);
        if settings.response_dynamic_metadata {
            answer.dynamic_metadata = Some(dynamic_metadata(domain, request, &answer.statuses));
        }
        Ok((answer, decision))
    }
}

/// The answer to a request planned as `plans` and decided as `decision`;
/// `ietf` adds `RateLimit-Policy` / `RateLimit` for the client; an OK
/// descriptor at or past `near.0` of a limit is counted as near its limit;
/// `near.1` values of a `detailed_metric` rule have series of their own.
fn answer(
    domain: &str,
    plans: &[Plan],
    decision: &GroupsDecision,
    peek: bool,
    ietf: bool,
    (near, top_k): (f64, usize),
) -> RlsAnswer {
    let mut reports = decision.groups.iter();
    let fallback = decision.is_fallback();
    let mut statuses = Vec::with_capacity(plans.len());
    let mut policy_fields = Vec::new();
    let mut tightest: Option<(&LimitReport, &str)> = None;
    for p in plans {
        match p {
            Plan::Free { rule, unlimited } => {
                if !peek {
                    let outcome = if *unlimited { "unlimited" } else { "ok" };
                    m::record_decision(domain, rule, outcome);
                }
                // envoyproxy/ratelimit reports an unlimited rule as
                // all of u32 left; no rule at all as nothing.
                statuses.push(RlsStatus {
                    limit_remaining: if *unlimited { u32::MAX } else { 0 },
                    ..RlsStatus::default()
                });
            }
            Plan::Decide {
                rule,
                name,
                shadow,
                lands,
                cost,
                detail,
                ..
            } => {
                let report: &GroupReport = reports.next().expect("one report per group");
                // A landed charge is reported, never refused.
                let shadow = &(*shadow || *lands);
                let over = !report.allowed && !shadow;
                let outcome = match (fallback, !report.allowed, *shadow) {
                    (true, false, _) | (true, true, true) => "fallback_ok",
                    (true, true, false) => "fallback_over_limit",
                    (false, true, true) => "shadow_over_limit",
                    (false, true, false) => "over_limit",
                    (false, false, _) => "ok",
                };
                if !peek {
                    m::record_decision(domain, rule, outcome);
                    let is_near = report.limits.iter().any(|l| near_limit(l, near));
                    if outcome == "ok" && is_near {
                        m::record_near_limit(domain, rule);
                    }
                    if let Some(value) = detail.as_deref().filter(|_| *cost > 0) {
                        let result = match (report.allowed, is_near) {
                            (false, _) => HitResult::Over,
                            (true, true) => HitResult::Near,
                            (true, false) => HitResult::Within,
                        };
                        detailed::record(domain, rule, value, *cost, result, top_k);
                    }
                }
                let limit = most_constraining(report);
                let status = match limit {
                    // A fallback decision counted nothing: no numbers
                    // for Envoy to build headers from.
                    Some(l) if l.remaining.is_none() => {
                        if !shadow {
                            policy_fields.push(policy_field(l));
                        }
                        RlsStatus {
                            over_limit: over,
                            ..RlsStatus::default()
                        }
                    }
                    Some(l) => {
                        if !shadow {
                            policy_fields.push(policy_field(l));
                            if tightest.is_none_or(|(t, _)| left(l) < left(t)) {
                                tightest = Some((l, name));
                            }
                        }
                        RlsStatus {
                            over_limit: over,
                            current_limit: Some(CurrentLimit {
                                requests_per_unit: u32::try_from(l.quota).unwrap_or(u32::MAX),
                                unit: unit_for(l.window_secs),
                                name: name.clone(),
                            }),
                            // OVER_LIMIT leaves nothing, even when the
                            // addend was only larger than what is left.
                            limit_remaining: if over { 0 } else { remaining_of(l) },
                            duration_until_reset: until_reset(l),
                        }
                    }
                    None => RlsStatus {
                        over_limit: over,
                        ..RlsStatus::default()
                    },
                };
                statuses.push(status);
            }
        }
    }
    let mut response_headers = Vec::new();
    if ietf && !policy_fields.is_empty() {
        response_headers.push(("RateLimit-Policy".to_owned(), policy_fields.join(", ")));
        if let Some((l, _)) = tightest {
            response_headers.push((
                "RateLimit".to_owned(),
                format!(
                    "\"{}\";r={};t={}",
                    sf_name(&l.name),
                    if l.allowed { remaining_of(l) } else { 0 },
                    until_reset(l).as_secs()
                ),
            ));
        }
    }
    RlsAnswer {
        over_limit: !decision.allowed,
        statuses,
        response_headers,
        dynamic_metadata: None,
    }
}

/// envoyproxy/ratelimit's `dynamic_metadata` of an answer (see
/// [`RlsAnswer::dynamic_metadata`]): the request as the peer writes it,
/// and the `metadata` of every matched, limited rule whose descriptor is
/// not over its limit (not unlimited, not replaced, not a proxy's limit).
fn dynamic_metadata(
    domain: Option<&Domain>,
    request: &RlsRequest,
    statuses: &[RlsStatus],
) -> serde_json::Value {
    use serde_json::{Map, Value, json};
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|d| {
            let mut o = Map::new();
            let entries = d.entries.iter().map(|(k, v)| json!(format!("{k}={v}")));
            o.insert("entries".into(), Value::Array(entries.collect()));
            if let Some(l) = d.limit {
                // The peer writes the override in protobuf's text format.
                let text = format!(
                    "requests_per_unit:{} unit:{}",
                    l.requests_per_unit,
                    l.unit.json_name()
                );
                o.insert("limit".into(), json!(text));
            }
            if let Some(n) = d.hits_addend {
                o.insert("hitsAddend".into(), json!(n));
            }
            Value::Object(o)
        })
        .collect();
    let mut out = Map::new();
    out.insert("domain".into(), json!(request.domain));
    out.insert("descriptors".into(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        out.insert("hitsAddend".into(), json!(request.hits_addend));
    }
    let mut passed = Map::new();
    if let Some(domain) = domain {
        let rules: Vec<Option<&DescriptorRule>> = request
            .descriptors
            .iter()
            .map(|d| domain.find(&d.entry_refs()).filter(|_| d.limit.is_none()))
            .collect();
        let replaced: Vec<&Arc<str>> = rules
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter())
            .collect();
        for (rule, status) in rules.iter().zip(statuses) {
            let Some(rule) = rule else { continue };
            let is_replaced = rule
                .name
                .as_ref()
                .is_some_and(|n| replaced.iter().any(|r| **r == *n));
            if rule.unlimited || is_replaced || status.over_limit {
                continue;
            }
            if let Some(Value::Object(m)) = rule.metadata.as_deref() {
                merge_metadata(&mut passed, m);
            }
        }
    }
    if !passed.is_empty() {
        out.insert("metadata".into(), Value::Object(passed));
    }
    Value::Object(out)
}

/// Adds `src`'s members to `dest`: a member `dest` already has keeps its
/// value, except that two objects merge, member by member.
fn merge_metadata(
    dest: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    use serde_json::Value;
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (Some(Value::Object(d)), Value::Object(s)) => merge_metadata(d, s),
            (Some(_), _) => {}
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
        }
    }
}

/// What a `tier_from` value adds to its rule.
enum TierLimits {
    /// The limits of the tier the value resolves to; `shared`: the value
    /// counts as the anonymous caller, one counter for every such value.
    Tier { limits: Vec<Limit>, shared: bool },
    /// The value names no tier and `[identity] unmatched_keys` rejects it.
    Refused,
}

/// The descriptor's plan in `domain` (none: an unknown domain).
fn plan(
    domain: Option<&Domain>,
    request: &RlsRequest,
    tier_limits: &dyn Fn(&str) -> TierLimits,
) -> Vec<Plan> {
    let default_cost = u64::from(request.hits_addend.max(1));
    let Some(domain) = domain else {
        return request
            .descriptors
            .iter()
            .map(|_| Plan::Free {
                rule: m::UNMATCHED_RULE.into(),
                unlimited: false,
            })
            .collect();
    };
    let rules: Vec<Option<&DescriptorRule>> = request
        .descriptors
        .iter()
        .map(|d| domain.find(&d.entry_refs()))
        .collect();
    // envoyproxy's `replaces`: a matched rule naming another matched
    // rule's name takes its place; the replaced one counts nothing.
    let replaced: Vec<&Arc<str>> = rules
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter())
        .collect();
    request
        .descriptors
        .iter()
        .zip(rules)
        .map(|(d, rule)| {
            let entries = d.entry_refs();
            let detail = rule.and_then(|_| domain.value_path(&entries));
            // share_threshold: the counter is named by the pattern.
            let shared = rule.map_or_else(Vec::new, |_| domain.shared_patterns(&entries));
            descriptor_plan(
                &domain.name,
                d,
                rule,
                (detail, &shared),
                &replaced,
                (default_cost, request.hits_addend > 0),
                tier_limits,
            )
        })
        .collect()
}

fn descriptor_plan(
    domain: &str,
    d: &RlsDescriptor,
    rule: Option<&DescriptorRule>,
    // The per-value stat name, and the share_threshold patterns.
    (detail, shared): (Option<String>, &[Option<Arc<str>>]),
    replaced: &[&Arc<str>],
    (default_cost, addend_given): (u64, bool),
    tier_limits: &dyn Fn(&str) -> TierLimits,
) -> Plan {
    let mut identity = descriptor_identity(domain, d, shared);
    let shown = d
        .entries
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("/");
    if let Some(o) = d.limit {
        // The proxy's limit wins over the configured one, as in
        // envoyproxy/ratelimit (never shadow there either).
        let secs = o.unit.seconds().unwrap_or(1);
        let name = rule.and_then(|r| r.name.as_deref()).unwrap_or("");
        return Plan::Decide {
            rule: rule.map_or_else(|| m::OVERRIDE_RULE.into(), |r| r.label.clone()),
            // The limit's name becomes a metric label (the limit that
            // blocked): only the unit, never the client's number, so a
            // client cannot mint a series per number it sends. The
            // counters still keep numbers apart (the identity has them).
            limits: vec![Limit::fixed_window(
                format!("override:{}", o.unit.json_name().to_ascii_lowercase()),
                u64::from(o.requests_per_unit),
                Duration::from_secs(secs),
            )],
            name: name.to_owned(),
            cost: d.hits_addend.unwrap_or(default_cost),
            shadow: false,
            identity,
            shown,
            failure: rule.and_then(|r| r.on_store_failure),
            lands: false,
            detail: None,
        };
    }
    let Some(rule) = rule else {
        return Plan::Free {
            rule: m::UNMATCHED_RULE.into(),
            unlimited: false,
        };
    };
    let is_replaced = rule
        .name
        .as_ref()
        .is_some_and(|n| replaced.iter().any(|r| **r == *n));
    let mut limits = rule.limits.clone();
    if rule.deny {
        // `requests_per_unit: 0`: a window of nothing, so every charge is
        // refused (and a check of 0 passes), decided like any other limit
        // and all or nothing with the request's other descriptors.
        let unit = rule.unit.unwrap_or(crate::policy::rls::RlsUnit::Second);
        limits.push(Limit::fixed_window(
            unit.as_str(),
            0,
            Duration::from_secs(unit.seconds()),
        ));
    }
    if let Some(key) = &rule.tier {
        if let Some((_, value)) = d.entries.iter().find(|(k, _)| **k == **key) {
            match tier_limits(value) {
                TierLimits::Tier {
                    limits: tier,
                    shared,
                } => {
                    if shared {
                        identity = format!("{domain}\u{0}{}\u{0}anonymous", rule.label);
                    }
                    limits.extend(tier);
                }
                // `unmatched_keys = "reject"`: refused as a deny rule is.
                TierLimits::Refused => limits.push(Limit::fixed_window(
                    "unmatched_key",
                    0,
                    Duration::from_secs(1),
                )),
            }
        }
    }
    if rule.unlimited || limits.is_empty() || is_replaced {
        return Plan::Free {
            rule: rule.label.clone(),
            unlimited: rule.unlimited,
        };
    }
    let cost = d.hits_addend.or(rule.cost).unwrap_or(default_cost);
    Plan::Decide {
        rule: rule.label.clone(),
        limits,
        name: rule.name.as_deref().unwrap_or("").to_owned(),
        cost,
        shadow: rule.shadow,
        identity,
        shown,
        failure: rule.on_store_failure,
        // Only an addend the caller sent (the tokens Envoy's stream-done
        // entry reports) is forced: Envoy's request-time check arrives
        // with no addend at all (charging 1, refused once nothing is
        // left) or with an explicit 0 (checking only).
        lands: rule.apply_on_stream_done && cost > 0 && (d.hits_addend.is_some() || addend_given),
        detail,
    }
}

/// The counter identity of a descriptor: its domain and every entry, so
/// each distinct value has its own counters (as in envoyproxy/ratelimit),
/// except where `shared` names the `share_threshold` pattern an entry
/// matched: that pattern stands for the value, so every value it matches
/// shares the counter. Each part is length-prefixed, so no entry can pass
/// for another.
fn descriptor_identity(domain: &str, d: &RlsDescriptor, shared: &[Option<Arc<str>>]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(64);
    s.push_str(domain);
    for (i, (k, v)) in d.entries.iter().enumerate() {
        let v = match shared.get(i) {
            Some(Some(pattern)) => &**pattern,
            _ => v.as_str(),
        };
        let _ = write!(s, "\u{0}{}:{k}{}:{v}", k.len(), v.len());
    }
    if let Some(o) = d.limit {
        s.push('\u{0}');
        s.push_str(&format!(
            "limit={}/{}",
            o.requests_per_unit,
            o.unit.json_name()
        ));
    }
    s
}

fn strictness(f: RlsFailure) -> u8 {
    match f {
        RlsFailure::Open => 0,
        RlsFailure::Local => 1,
        RlsFailure::Closed => 2,
        RlsFailure::Unavailable => 3,
    }
}

/// The smallest unit at least `secs` long (a year for anything longer).
fn unit_for(secs: u64) -> Unit {
    [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
    ]
    .into_iter()
    .find(|u| u.seconds().is_some_and(|s| s >= secs))
    .unwrap_or(Unit::Year)
}

/// The enforced limit with the fewest units left (a blocking one first).
fn most_constraining(report: &GroupReport) -> Option<&LimitReport> {
    report
        .limits
        .iter()
        .filter(|l| !l.allowed)
        .max_by_key(|l| l.retry_after)
        .or_else(|| {
            report
                .limits
                .iter()
                .min_by(|a, b| left(a).total_cmp(&left(b)))
        })
}

/// Units left, for ordering: an unknown count (a fallback) sorts last.
fn left(l: &LimitReport) -> f64 {
    l.remaining.unwrap_or(f64::INFINITY)
}

/// Whether `l`, after the charge, has used at least `ratio` of its quota
/// (envoyproxy/ratelimit's near-limit count). A fallback's unknown count
/// is never near.
fn near_limit(l: &LimitReport, ratio: f64) -> bool {
    match l.remaining {
        Some(remaining) if l.quota > 0 => {
            let quota = l.quota as f64;
            // A hair of slack so 8 of 10 is 0.8 of it, whatever f64 rounds.
            (quota - remaining.max(0.0)) >= ratio * quota - 1e-9 * quota
        }
        _ => false,
    }
}

/// One `RateLimit-Policy` item for `l`.
fn policy_field(l: &LimitReport) -> String {
    format!(
        "\"{}\";q={};w={}",
        sf_name(&l.name),
        l.quota,
        l.window_secs.max(1)
    )
}

fn remaining_of(l: &LimitReport) -> u32 {
    let r = l.remaining.map_or(0.0, f64::floor);
    if r <= 0.0 {
        0
    } else if r >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        r as u32
    }
}

/// Until the quota is back, in whole seconds rounded up (Envoy shows
/// seconds; a rounded-down 0 would tell a client to retry too early).
fn until_reset(l: &LimitReport) -> Duration {
    let d = l.reset_after.max(l.retry_after);
    Duration::from_secs(d.as_micros().div_ceil(1_000_000) as u64)
}

/// A limit name as a structured-field string: quotes and backslashes
/// dropped, so a configured name cannot break the header.
fn sf_name(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '"' && *c != '\\' && (' '..='~').contains(c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_merges_keep_the_first_value_and_merge_objects() {
        let mut dest = serde_json::json!({"a": 1, "o": {"x": 1}});
        let src = serde_json::json!({"a": 2, "b": 3, "o": {"x": 2, "y": 2}});
        let (serde_json::Value::Object(d), serde_json::Value::Object(s)) = (&mut dest, &src) else {
            unreachable!()
        };
        merge_metadata(d, s);
        assert_eq!(
            dest,
            serde_json::json!({"a": 1, "b": 3, "o": {"x": 1, "y": 2}})
        );
    }

    #[test]
    fn units_for_non_windows_are_the_smallest_that_covers_the_refill() {
        assert_eq!(unit_for(1), Unit::Second);
        assert_eq!(unit_for(30), Unit::Minute);
        assert_eq!(unit_for(60), Unit::Minute);
        assert_eq!(unit_for(61), Unit::Hour);
        assert_eq!(unit_for(86_400 * 400), Unit::Year);
    }

    #[test]
    fn descriptor_identities_keep_entries_apart() {
        let d = |e: &[(&str, &str)]| RlsDescriptor {
            entries: e
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..RlsDescriptor::default()
        };
        assert_ne!(
            descriptor_identity("x", &d(&[("a", "b=c")]), &[]),
            descriptor_identity("x", &d(&[("a=b", "c")]), &[])
        );
        assert_ne!(
            descriptor_identity("x", &d(&[("a", "1")]), &[]),
            descriptor_identity("y", &d(&[("a", "1")]), &[])
        );
    }
}
