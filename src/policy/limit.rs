//! One named limit: an algorithm, what it counts (scope) and whether it is
//! enforced.

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
}

impl Limit {
    /// A limit keyed by identity and enforced.
    pub fn new(name: impl Into<String>, algorithm: Algorithm) -> Self {
        Self {
            name: name.into(),
            algorithm,
            shadow: false,
            scope: Scope::Identity,
        }
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
                window_us: window.as_micros() as u64,
            },
        )
    }

    /// A fixed window of `limit` units per `window`, aligned to the epoch.
    pub fn fixed_window(name: impl Into<String>, limit: u64, window: std::time::Duration) -> Self {
        Self::new(
            name,
            Algorithm::FixedWindow {
                limit,
                window_us: window.as_micros() as u64,
            },
        )
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

    /// Keys the limit by `scope` instead of the identity.
    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }
}
