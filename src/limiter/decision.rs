//! What a limiter answers: the decision and every limit's state.

use std::sync::Arc;
use std::time::Duration;

use crate::policy::FailurePolicy;
use crate::telemetry::{FallbackReason, Outcome};

/// Who decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The store, on this shard (`memory` or a Redis `host:port`).
    Store {
        /// The shard.
        shard: Arc<str>,
    },
    /// The store could not decide; the failure policy did.
    Fallback {
        /// Why the store could not decide.
        reason: FallbackReason,
        /// The policy that answered.
        policy: FailurePolicy,
        /// The shard that failed.
        shard: Arc<str>,
    },
}

impl Source {
    /// Whether the failure policy, not the store, answered.
    pub fn is_fallback(&self) -> bool {
        matches!(self, Source::Fallback { .. })
    }

    /// Whether the limits' state is known: false when the store could not
    /// decide and the open or closed policy answered without counting.
    pub fn state_known(&self) -> bool {
        !matches!(
            self,
            Source::Fallback {
                policy: FailurePolicy::Open | FailurePolicy::Closed,
                ..
            }
        )
    }

    /// The shard label.
    pub fn shard(&self) -> &Arc<str> {
        match self {
            Source::Store { shard } | Source::Fallback { shard, .. } => shard,
        }
    }
}

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecisionPath {
    /// A store call (or the failure policy, when it failed).
    #[default]
    Store,
    /// In process, with no I/O: spent from a pre-paid lease, or a refusal
    /// remembered until its retry time.
    Local,
}

impl DecisionPath {
    /// The `path` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionPath::Store => "store",
            DecisionPath::Local => "local",
        }
    }
}

/// One limit's state after a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitReport {
    /// The limit's name.
    pub name: Arc<str>,
    /// The unit it counts (`requests` unless the limit names another).
    pub unit: Arc<str>,
    /// Units per window (`q`).
    pub quota: u64,
    /// Window in seconds (`w`).
    pub window_secs: u64,
    /// Units left (fractional; headers show the floor). `None` when
    /// nothing was counted: an `open` or `closed` failure policy answered
    /// without the store, so no remaining quota is known (and none is
    /// made up).
    pub remaining: Option<f64>,
    /// Until the quota is fully back.
    pub reset_after: Duration,
    /// When this limit blocked: until the request would pass.
    pub retry_after: Duration,
    /// Whether this limit admitted the request.
    pub allowed: bool,
    /// Reported, never enforced.
    pub shadow: bool,
    /// The request cost more than this limit's quota: it can never pass,
    /// however long it waits, so this limit gives no retry time
    /// ([`crate::Limiter::check_cost`]).
    pub exceeds_quota: bool,
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Whether the request may pass.
    pub allowed: bool,
    /// The tier decided against.
    pub tier: Arc<str>,
    /// Every limit of the tier and route, in order.
    pub limits: Vec<LimitReport>,
    /// When blocked: the latest retry time of the blocking limits.
    pub retry_after: Option<Duration>,
    /// Leaky-bucket shaping: hold the request this long before passing it on.
    pub delay: Duration,
    /// Who decided.
    pub source: Source,
    /// The outcome recorded for telemetry.
    pub outcome: Outcome,
    /// Round trip of the store call, when Redis was asked.
    pub store_rtt: Option<Duration>,
    /// The time the decision was made at (Redis `TIME` for Redis stores).
    pub decided_at: crate::clock::Micros,
    /// Local (from a lease) or from the store.
    pub path: DecisionPath,
    /// The pattern of the route rule that matched the request (its metric
    /// label), `None` when no rule matched.
    pub route: Option<Arc<str>>,
    /// The request's method, where the decision was made for an HTTP
    /// request (the layer sets it; [`crate::Limiter::check`] does not know
    /// one).
    pub method: Option<http::Method>,
    /// The in-flight slots the admitted request holds (none without
    /// in-flight limits, when blocked, or when the failure policy admitted
    /// without the store): given back when the last clone of this decision
    /// (or of the slot, taken out with `Option::take`) is dropped.
    pub slot: Option<super::Slot>,
}

impl Decision {
    /// The limit the `RateLimit` header names: when blocked, the enforced
    /// blocking limit with the latest retry; otherwise the enforced limit
    /// with the fewest units left. `None` when the state is not known.
    pub fn most_constraining(&self) -> Option<&LimitReport> {
        if !self.state_known() {
            return None;
        }
        let enforced = self.limits.iter().filter(|l| !l.shadow);
        if self.allowed {
            enforced.min_by(|a, b| {
                let left = |l: &LimitReport| l.remaining.unwrap_or(f64::INFINITY);
                left(a)
                    .total_cmp(&left(b))
                    .then(b.reset_after.cmp(&a.reset_after))
            })
        } else {
            enforced
                .filter(|l| !l.allowed)
                .max_by_key(|l| l.retry_after)
                .or_else(|| self.limits.iter().find(|l| !l.shadow))
        }
    }

    /// Whether the failure policy, not the store, answered.
    pub fn is_fallback(&self) -> bool {
        self.source.is_fallback()
    }

    /// The enforced limit that refused the request (the one with the
    /// latest retry time, when several did); `None` when it was admitted,
    /// or when the failure policy refused it without the store.
    pub fn refused_by(&self) -> Option<&LimitReport> {
        if self.allowed || !self.state_known() {
            return None;
        }
        self.limits
            .iter()
            .filter(|l| !l.shadow && !l.allowed)
            .max_by_key(|l| l.retry_after)
    }

    /// The limit of `unit` the `RateLimit` header would name among that
    /// unit's limits: the blocking one with the latest retry when the
    /// request was refused by one of them, else the one with the fewest
    /// units left. `None` when the decision has no enforced limit of `unit`
    /// or its state is not known.
    pub fn most_constraining_in(&self, unit: &str) -> Option<&LimitReport> {
        if !self.state_known() {
            return None;
        }
        let of_unit = || {
            self.limits
                .iter()
                .filter(move |l| !l.shadow && l.unit.as_ref() == unit)
        };
        if let Some(blocking) = of_unit()
            .filter(|l| !l.allowed)
            .max_by_key(|l| l.retry_after)
        {
            return Some(blocking);
        }
        of_unit().min_by(|a, b| {
            let left = |l: &LimitReport| l.remaining.unwrap_or(f64::INFINITY);
            left(a)
                .total_cmp(&left(b))
                .then(b.reset_after.cmp(&a.reset_after))
        })
    }

    /// Every unit the decision's enforced limits count, each once, in the
    /// order of the limits.
    pub fn units(&self) -> impl Iterator<Item = &Arc<str>> {
        self.limits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.shadow)
            .filter(|(i, l)| {
                !self.limits[..*i]
                    .iter()
                    .any(|e| !e.shadow && e.unit == l.unit)
            })
            .map(|(_, l)| &l.unit)
    }

    /// The enforced limit the request's cost exceeds the quota of, if any:
    /// then the request can never pass and [`Decision::retry_after`] is
    /// `None`.
    pub fn exceeded_quota(&self) -> Option<&LimitReport> {
        self.limits.iter().find(|l| l.exceeds_quota && !l.shadow)
    }

    /// Whether the limits' state is known: false when the store could not
    /// decide and the open or closed policy answered without counting.
    pub fn state_known(&self) -> bool {
        self.source.state_known()
    }
}
