//! One named limit: an algorithm, what it counts (scope) and whether it is
//! enforced.
//!
//! Every algorithm has a builder taking rates and [`Duration`](std::time::Duration)s:
//!
//! ```
//! use std::time::Duration;
//! use ratewatch::{Limit, Policy, Tier};
//! let tier = Tier::new("free")
//!     .match_prefix("free_")
//!     .limit(Limit::token_bucket("burst", 10, 0.5))
//!     .limit(Limit::gcra("steady", 2.0, 5))
//!     .limit(Limit::sliding_window("minute", 60, Duration::from_secs(60)))
//!     .limit(Limit::sliding_log("exact", 5, Duration::from_secs(10)))
//!     .limit(Limit::shaping_leaky_bucket("queue", 5.0, 10, Duration::from_millis(500)))
//!     .limit(Limit::per_day("day", 1_000));
//! let policy = Policy::builder()
//!     .tier(tier)
//!     .tier(Tier::new("anonymous").limit(Limit::leaky_bucket("burst", 1.0, 5)))
//!     .build()
//!     .unwrap();
//! assert_eq!(policy.tiers[0].limits.len(), 6);
//! ```

use crate::algorithm::Algorithm;

/// What a limit's counter is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scope {
    /// The caller's identity (API key, token, or IP for anonymous callers).
    #[default]
    Identity,
    /// The client IP, whatever key it presents: one attacker with many keys
    /// still meets one ceiling.
    Ip,
    /// Every caller of the route together: one ceiling for an endpoint.
    Route,
}

impl Scope {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Identity => "identity",
            Scope::Ip => "ip",
            Scope::Route => "route",
        }
    }
}

/// A named limit of a tier or a route.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Name, unique within its tier (shown in headers and metrics).
    pub name: String,
    /// The algorithm and its parameters.
    pub algorithm: Algorithm,
    /// Evaluated and reported as `shadow_blocked`, never enforced.
    pub shadow: bool,
    /// What the counter is keyed by.
    pub scope: Scope,
    /// How requests are decided; `None` takes the default: `auto` for
    /// `scope = "route"` (a route-wide ceiling is hot by definition),
    /// otherwise whatever the request's other limits ask for (`exact` if
    /// none asks).
    pub mode: Option<crate::policy::LeaseMode>,
    /// What the limit counts: [`REQUESTS`] (the default: each request
    /// charges the route rule's cost) or another unit such as `tokens`,
    /// charged with the request's cost in that unit (see
    /// [`Costs`](crate::Costs)). An in-flight limit counts requests (one
    /// slot each) and takes no other unit.
    pub unit: String,
    /// On a route rule: the only tier the limit applies to (`None`: every
    /// tier), so a route can give each plan its own limit (one stream at
    /// once on free, five on pro). Not allowed on a tier's own limits.
    pub tier: Option<String>,
}

/// The unit every limit counts unless it names another: requests, each
/// charged the route rule's cost (1 without a rule).
pub const REQUESTS: &str = "requests";

/// The longest unit name.
pub const MAX_UNIT_LEN: usize = 32;

/// Why `unit` is not a valid unit name, if it is not: 1 to
/// [`MAX_UNIT_LEN`] characters of `a-z`, `0-9` and `_` (it becomes a
/// response header name and a metric label).
pub fn check_unit(unit: &str) -> Option<String> {
    let ok = !unit.is_empty()
        && unit.len() <= MAX_UNIT_LEN
        && unit
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    (!ok).then(|| {
        format!(
            "must be 1 to {MAX_UNIT_LEN} characters of a-z, 0-9 and '_' (it names response \
             headers and a metric label), such as \"requests\" or \"tokens\"; got {unit:?}"
        )
    })
}

impl Limit {
    /// A limit keyed by identity and enforced.
    pub fn new(name: impl Into<String>, algorithm: Algorithm) -> Self {
        Self {
            name: name.into(),
            algorithm,
            shadow: false,
            scope: Scope::Identity,
            mode: None,
            unit: REQUESTS.to_owned(),
            tier: None,
        }
    }

    /// On a route rule: applies to callers of tier `tier` only.
    pub fn for_tier(mut self, tier: impl Into<String>) -> Self {
        self.tier = Some(tier.into());
        self
    }

    /// Whether the limit applies to callers of tier `tier`.
    pub fn applies_to(&self, tier: &str) -> bool {
        self.tier.as_deref().is_none_or(|t| t == tier)
    }

    /// Counts `unit` instead of requests: a request is charged its cost in
    /// that unit ([`Costs`](crate::Costs)), and checked without charge (it
    /// passes only while at least one unit is left) when it names none.
    ///
    /// ```
    /// use ratewatch::Limit;
    /// let tpm = Limit::per_minute("tpm", 100_000).unit("tokens");
    /// assert_eq!(tpm.unit, "tokens");
    /// assert!(Limit::per_minute("rpm", 60).counts_requests());
    /// ```
    pub fn unit(mut self, unit: impl Into<String>) -> Self {
        self.unit = unit.into();
        self
    }

    /// Whether the limit counts requests (its unit is [`REQUESTS`]).
    pub fn counts_requests(&self) -> bool {
        self.unit == REQUESTS
    }

    /// A token bucket of `capacity` refilled at `refill_per_second`.
    pub fn token_bucket(name: impl Into<String>, capacity: u64, refill_per_second: f64) -> Self {
        Self::new(
            name,
            Algorithm::TokenBucket {
                capacity,
                refill_per_second,
            },
        )
    }

    /// A sliding window counter of `limit` units per `window`.
    pub fn sliding_window(
        name: impl Into<String>,
        limit: u64,
        window: std::time::Duration,
    ) -> Self {
        Self::new(
            name,
            Algorithm::SlidingWindow {
                limit,
                window_us: micros(window),
            },
        )
    }

    /// A fixed window of `limit` units per `window`, aligned to the epoch.
    pub fn fixed_window(name: impl Into<String>, limit: u64, window: std::time::Duration) -> Self {
        Self::new(
            name,
            Algorithm::FixedWindow {
                limit,
                window_us: micros(window),
            },
        )
    }

    /// An exact sliding log of `limit` units per `window` (one timestamp per
    /// admitted unit: use it for small limits).
    pub fn sliding_log(name: impl Into<String>, limit: u64, window: std::time::Duration) -> Self {
        Self::new(
            name,
            Algorithm::SlidingLog {
                limit,
                window_us: micros(window),
            },
        )
    }

    /// GCRA: `rate_per_second` sustained, `burst` at once (one timestamp per
    /// key).
    pub fn gcra(name: impl Into<String>, rate_per_second: f64, burst: u64) -> Self {
        Self::new(
            name,
            Algorithm::Gcra {
                rate_per_second,
                burst,
            },
        )
    }

    /// A policing leaky bucket: a queue of `capacity` draining at
    /// `rate_per_second`; a request that does not fit is refused.
    pub fn leaky_bucket(name: impl Into<String>, rate_per_second: f64, capacity: u64) -> Self {
        Self::shaping_leaky_bucket(name, rate_per_second, capacity, std::time::Duration::ZERO)
    }

    /// A shaping leaky bucket: a request waits its turn in the queue, up to
    /// `max_delay`, instead of being refused. A zero `max_delay` polices.
    pub fn shaping_leaky_bucket(
        name: impl Into<String>,
        rate_per_second: f64,
        capacity: u64,
        max_delay: std::time::Duration,
    ) -> Self {
        Self::new(
            name,
            Algorithm::LeakyBucket {
                rate_per_second,
                capacity,
                max_delay_us: micros(max_delay),
            },
        )
    }

    /// An in-flight limit: at most `limit` requests at once, each holding a
    /// slot until its response body ends or it is dropped, with the default
    /// hold timeout ([`DEFAULT_HOLD_US`](crate::algorithm::DEFAULT_HOLD_US)).
    pub fn concurrency(name: impl Into<String>, limit: u64) -> Self {
        Self::concurrency_held(
            name,
            limit,
            std::time::Duration::from_micros(crate::algorithm::DEFAULT_HOLD_US),
        )
    }

    /// [`Limit::concurrency`] whose slots come back `hold_timeout` after
    /// their holder stopped renewing them (a crashed process).
    pub fn concurrency_held(
        name: impl Into<String>,
        limit: u64,
        hold_timeout: std::time::Duration,
    ) -> Self {
        Self::new(
            name,
            Algorithm::Concurrency {
                limit,
                hold_us: micros(hold_timeout),
            },
        )
    }

    /// `limit` units per minute as a sliding window.
    pub fn per_minute(name: impl Into<String>, limit: u64) -> Self {
        Self::sliding_window(name, limit, std::time::Duration::from_secs(60))
    }

    /// `limit` units per UTC day as a fixed window (resets at 00:00 UTC).
    pub fn per_day(name: impl Into<String>, limit: u64) -> Self {
        Self::fixed_window(name, limit, std::time::Duration::from_secs(86_400))
    }

    /// `limit` per second as a token bucket of the same capacity.
    pub fn per_second(name: impl Into<String>, limit: u64) -> Self {
        Self::token_bucket(name, limit, limit as f64)
    }

    /// Marks the limit as shadow: reported, never enforced.
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Decides the limit in `mode` instead of its scope's default.
    pub fn with_mode(mut self, mode: crate::policy::LeaseMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The mode this limit asks for: the one set, else `auto` for
    /// `scope = "route"` (a route-wide ceiling is hot by definition), else
    /// none (it follows the request's other limits; see
    /// [`LeaseMode::of_request`](crate::policy::LeaseMode::of_request)).
    pub fn effective_mode(&self) -> Option<crate::policy::LeaseMode> {
        use crate::policy::LeaseMode;
        self.mode.or(match self.scope {
            Scope::Route => Some(LeaseMode::Auto),
            _ => None,
        })
    }

    /// Keys the limit by `scope` instead of the identity.
    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }
}

/// A duration in microseconds, saturating: `Policy::validate` rejects
/// windows that are out of range with a clear error.
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
