//! The decision event: all the hot path emits.

use std::sync::Arc;
use std::time::Duration;

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The store admitted it.
    Allowed,
    /// The store blocked it (429).
    Blocked,
    /// The store could not decide; the failure policy let it through.
    FallbackAllowed,
    /// The store could not decide; the failure policy refused it (503, or
    /// 429 from the local fallback limiter).
    FallbackBlocked,
    /// Admitted, but a shadow limit would have blocked it.
    ShadowBlocked,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 5] = [
        Outcome::Allowed,
        Outcome::Blocked,
        Outcome::FallbackAllowed,
        Outcome::FallbackBlocked,
        Outcome::ShadowBlocked,
    ];

    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Blocked => "blocked",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackBlocked => "fallback_blocked",
            Outcome::ShadowBlocked => "shadow_blocked",
        }
    }

    /// Whether the request was let through.
    pub fn passed(self) -> bool {
        matches!(
            self,
            Outcome::Allowed | Outcome::FallbackAllowed | Outcome::ShadowBlocked
        )
    }
}

/// Why a decision fell back to the failure policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// The store did not answer within the decision budget.
    Timeout,
    /// The store answered with an error or could not be reached.
    Error,
    /// The shard's circuit breaker is open: no call was attempted.
    BreakerOpen,
}

impl FallbackReason {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::Timeout => "timeout",
            FallbackReason::Error => "error",
            FallbackReason::BreakerOpen => "breaker_open",
        }
    }
}

/// One decision, as telemetry sees it. Labels are bounded: `tier` and
/// `limit` come from the policy, `route` is a rule's pattern or `*`,
/// `shard` is `memory` or a Redis `host:port`. `identity` is the form the
/// policy allows to be shown (masked by default), never the raw key.
#[derive(Debug, Clone)]
pub struct Event {
    /// The tier.
    pub tier: Arc<str>,
    /// The matched route rule's pattern, or `*`.
    pub route: Arc<str>,
    /// The limit that blocked, or the most constraining one.
    pub limit: Option<Arc<str>>,
    /// Limits that blocked (enforced or shadow), for `limit_exceeded_total`.
    pub exceeded: Vec<Arc<str>>,
    /// What happened.
    pub outcome: Outcome,
    /// Which node decided (or would have).
    pub shard: Arc<str>,
    /// The identity in display form (masked, hashed or raw per policy),
    /// shared: a client's run of decisions shares one string.
    pub identity: Arc<str>,
    /// Units the request cost.
    pub cost: u64,
    /// What an admitted decision charged, per unit, where units are in
    /// play (the same amounts as `ratewatch_units_charged_total`): empty
    /// for requests-only decisions and for decisions that charged nothing.
    pub units: UnitsCharged,
    /// Round trip to Redis, when Redis was asked.
    pub redis_rtt: Option<Duration>,
    /// Why the failure policy answered, for fallback outcomes.
    pub fallback: Option<(FallbackReason, crate::policy::FailurePolicy)>,
}

/// Most units one event carries inline: more spill to the heap.
const INLINE_UNITS: usize = 3;

/// The units one decision charged, per unit name. Unit names come from
/// the policy, never from a request, so the fleet view's unit tables stay
/// bounded. Up to three units are held inline: building it on the hot
/// path allocates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitsCharged(smallvec::SmallVec<[(Arc<str>, u64); INLINE_UNITS]>);

impl UnitsCharged {
    /// Nothing charged.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` of `unit` (summed with what `unit` already has).
    pub fn add(&mut self, unit: Arc<str>, n: u64) {
        match self.0.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, m)) => *m = m.saturating_add(n),
            None => self.0.push((unit, n)),
        }
    }

    /// `self` with `n` of `unit` added.
    pub fn with(mut self, unit: &str, n: u64) -> Self {
        self.add(Arc::from(unit), n);
        self
    }

    /// What was charged of `unit`, if anything.
    pub fn get(&self, unit: &str) -> Option<u64> {
        self.0.iter().find(|(u, _)| &**u == unit).map(|(_, n)| *n)
    }

    /// Each unit and what it was charged, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, u64)> {
        self.0.iter().map(|(u, n)| (u, *n))
    }

    /// Whether nothing was charged.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
