//! What a matched descriptor decides.

use std::sync::Arc;

use super::RlsFailure;
use crate::policy::{LeaseMode, Limit};

/// The unit of an envoyproxy/ratelimit `rate_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RlsUnit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (UTC).
    Day,
    /// Seven days (Envoy's `WEEK`).
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts a year.
    Year,
}

impl RlsUnit {
    /// The YAML spellings (lower case, as envoyproxy/ratelimit writes them).
    pub const CHOICES: [(&'static str, RlsUnit); 7] = [
        ("second", RlsUnit::Second),
        ("minute", RlsUnit::Minute),
        ("hour", RlsUnit::Hour),
        ("day", RlsUnit::Day),
        ("week", RlsUnit::Week),
        ("month", RlsUnit::Month),
        ("year", RlsUnit::Year),
    ];

    /// The length of one unit in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            RlsUnit::Second => 1,
            RlsUnit::Minute => 60,
            RlsUnit::Hour => 3_600,
            RlsUnit::Day => 86_400,
            RlsUnit::Week => 86_400 * 7,
            RlsUnit::Month => 86_400 * 30,
            RlsUnit::Year => 86_400 * 365,
        }
    }

    /// The number of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub fn to_proto(self) -> i32 {
        match self {
            RlsUnit::Second => 1,
            RlsUnit::Minute => 2,
            RlsUnit::Hour => 3,
            RlsUnit::Day => 4,
            RlsUnit::Month => 5,
            RlsUnit::Year => 6,
            RlsUnit::Week => 7,
        }
    }

    /// The unit of a proto number; `None` for `UNKNOWN` (0) and numbers
    /// this version does not know.
    pub fn from_proto(n: i32) -> Option<Self> {
        Self::CHOICES
            .iter()
            .map(|&(_, u)| u)
            .find(|u| u.to_proto() == n)
    }

    /// The lower-case spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RlsUnit::Second => "second",
            RlsUnit::Minute => "minute",
            RlsUnit::Hour => "hour",
            RlsUnit::Day => "day",
            RlsUnit::Week => "week",
            RlsUnit::Month => "month",
            RlsUnit::Year => "year",
        }
    }
}

impl RlsUnit {
    /// The limit envoyproxy/ratelimit enforces for `requests_per_unit` per
    /// unit: a fixed window of one unit aligned to the epoch, named after
    /// the unit.
    pub fn limit(self, requests_per_unit: u64) -> Limit {
        Limit::fixed_window(
            self.as_str(),
            requests_per_unit,
            std::time::Duration::from_secs(self.seconds()),
        )
    }
}

/// The rule a request descriptor matched.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorRule {
    /// Bounded metric label: the `name` if given, else the config path of
    /// keys and config values (never request values), such as
    /// `remote_address` or `header_match_foo.remote_address`.
    pub label: Arc<str>,
    /// `rate_limit.name` (for `replaces` and `current_limit.name`).
    pub name: Option<Arc<str>>,
    /// Limits to decide (envoy YAML: one fixed window of
    /// `requests_per_unit` per unit, aligned to the epoch). Empty when
    /// unlimited.
    pub limits: Vec<Limit>,
    /// Every request is allowed and nothing is counted.
    pub unlimited: bool,
    /// Decided and reported, never enforced.
    pub shadow: bool,
    /// Names of rules this one replaces.
    pub replaces: Vec<Arc<str>>,
    /// Envoy unit of the (first) limit, for `current_limit`; `None` for
    /// native rules whose first limit is not a window of a whole unit.
    pub unit: Option<RlsUnit>,
    /// Native: the tier named after the descriptor entry this names, as
    /// keys are resolved to tiers (`tier_from`); the entry's key.
    pub tier: Option<Arc<str>>,
    /// Native: units one request costs (`None`: the request's addend).
    pub cost: Option<u64>,
    /// Native: what to answer while the store is unreachable (`None`:
    /// `[rls] on_store_failure`).
    pub on_store_failure: Option<RlsFailure>,
    /// Native: how the rule's limits are decided (`None`: each limit's own
    /// mode, see [`LeaseMode::of_request`]).
    pub mode: Option<LeaseMode>,
    /// envoyproxy/ratelimit's `detailed_metric`: the descriptor's hits are
    /// also counted per request value
    /// ([`Domain::value_path`](super::Domain::value_path)), for a bounded
    /// number of values (`[rls] detailed_metric_top_k`).
    pub detailed_metric: bool,
    /// envoyproxy/ratelimit's `requests_per_unit: 0` (its deny-list
    /// idiom): every charge of the descriptor is refused, a check
    /// (addend 0) passes; `unit` says the window reported.
    pub deny: bool,
    /// Native: the rule's charges arrive after the response (Envoy's
    /// `apply_on_stream_done` entry reporting the tokens used): a charge
    /// whose addend the request states (a descriptor's `hits_addend`, or
    /// the request's above 0) always lands, past the limit as capped
    /// debt; a request with no addend is decided as usual at 1 (refused
    /// once nothing is left), and an explicit 0 checks (refused once the
    /// counter is past its limit).
    pub apply_on_stream_done: bool,
    /// envoyproxy/ratelimit's `metadata` of the rule's descriptor (a JSON
    /// object), returned in an answer's `dynamic_metadata` when the
    /// descriptor passes and `[rls] response_dynamic_metadata` is on.
    pub metadata: Option<Arc<serde_json::Value>>,
}
