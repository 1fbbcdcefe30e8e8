//! The six rate-limiting algorithms, as pure functions.
//!
//! Each algorithm is `(limit, state, now, cost) -> Step`: it never reads a
//! clock and never writes anything itself. A store (memory or Redis, whose
//! Lua scripts in `lua/` repeat the same arithmetic) keeps the state and
//! writes [`Step::state`] only when every limit of the request admits it.
//!
//! | algorithm | state | bound | TTL |
//! |---|---|---|---|
//! | token bucket | tokens (f64), last refill | capacity + rate × t | time to refill to full |
//! | sliding window counter | window start, count, previous count | ~limit per window (weighted) | two windows |
//! | sliding window log | one timestamp per admitted unit | exactly limit per window | one window past the newest entry |
//! | fixed window | window start, count | limit per aligned window | until the window ends |
//! | GCRA | theoretical arrival time | burst + rate × t | TAT − now |
//! | leaky bucket | time the queue drains | capacity + rate × t; may delay | drain time |
//!
//! Time never runs backwards for a key. `now` may be earlier than what the
//! state remembers (a wall clock stepped back; a failover to a Redis replica
//! whose clock is behind): a later window stays the current window with its
//! count, a later refill time or TAT refills nothing until the clock reaches
//! it, later log entries keep counting, and the TTL covers the state's own
//! times. A step back can only make a limit stricter for a while, never hand
//! a quota out again.
//!
//! ## Reloads
//!
//! A state is read under whatever parameters the limit has now, so a reload
//! that changes a window, a limit, a capacity or a rate keeps what was
//! already admitted and never hands a quota out again:
//! - window counters count the units of the stored windows in the new
//!   window (of the new length, aligned to the epoch) that holds the latest
//!   time they can have been admitted: the latest admission for the current
//!   window's units, the end of the previous window for its units. A unit
//!   moved later never counts less, so the new limit applies to at least
//!   what the store still remembers;
//! - a token bucket keeps what it is short of full (`capacity - tokens`):
//!   under a new capacity it holds that much less than full, at least 0;
//! - GCRA and the leaky bucket keep the units queued ahead
//!   (`(TAT - now) / interval`), re-timed at the new interval;
//! - a sliding log's entries are the units themselves, counted in the new
//!   window.
//!
//! A limit or capacity raised by a reload is available at once, one lowered
//! counts what was admitted against the lower value: the same answer as if
//! the new parameters had been in place while those units were admitted.
//! What no store keeps is not counted: a state holds one window of the old
//! length (two for the sliding counter), so units of earlier old windows
//! do not count where a new window reaches back before the stored one (a
//! lengthened window, or a length that does not divide the old one).
//!
//! ```
//! use ratewatch::algorithm::Algorithm;
//! let burst = Algorithm::TokenBucket { capacity: 2, refill_per_second: 1.0 };
//! let now = 1_000_000_000;
//! let first = burst.decide(None, now, 1);
//! assert!(first.verdict.allowed);
//! let second = burst.decide(first.state.as_ref(), now, 1);
//! let third = burst.decide(second.state.as_ref(), now, 1);
//! assert!(!third.verdict.allowed);
//! assert_eq!(third.verdict.retry_after_us, 1_000_000);
//! ```

pub mod concurrency;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod settle;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::collections::VecDeque;

pub use settle::{Adjust, settle};

use crate::clock::{MICROS_PER_SEC, Micros};

/// One limit's algorithm and its parameters, validated (see
/// [`Algorithm::validate`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Algorithm {
    /// Bursts up to `capacity`, refilled continuously at `refill_per_second`.
    TokenBucket {
        /// Tokens the bucket holds when full.
        capacity: u64,
        /// Tokens added per second (fractions are kept).
        refill_per_second: f64,
    },
    /// Two fixed windows, the previous one weighted by how much of it still
    /// overlaps the sliding window.
    SlidingWindow {
        /// Units admitted per window.
        limit: u64,
        /// Window length.
        window_us: u64,
    },
    /// Exact: one timestamp per admitted unit (a sorted set in Redis).
    SlidingLog {
        /// Units admitted per window.
        limit: u64,
        /// Window length.
        window_us: u64,
    },
    /// Windows aligned to the Unix epoch (a `1d` window resets at 00:00 UTC).
    FixedWindow {
        /// Units admitted per window.
        limit: u64,
        /// Window length.
        window_us: u64,
    },
    /// Generic cell rate algorithm: one timestamp per key.
    Gcra {
        /// Sustained units per second.
        rate_per_second: f64,
        /// Units that may arrive at once.
        burst: u64,
    },
    /// A queue that drains at `rate_per_second`. With `max_delay_us == 0` it
    /// polices (rejects when full); otherwise it shapes: a request waits for
    /// the queue ahead of it, up to `max_delay_us`, instead of being rejected.
    LeakyBucket {
        /// Units drained per second.
        rate_per_second: f64,
        /// Units the queue holds.
        capacity: u64,
        /// Longest wait a shaped request may be given; 0 polices.
        max_delay_us: u64,
    },
    /// In flight: at most `limit` requests at once, each holding a slot
    /// until it ends or `hold_us` passes without a renewal (see
    /// [`concurrency`]).
    Concurrency {
        /// Requests in flight at once.
        limit: u64,
        /// How long a slot is held without a renewal: a crashed holder's
        /// slot comes back after it.
        hold_us: u64,
    },
}

/// What an algorithm remembers for one key.
///
/// Each state also records what it needs to be read conservatively under
/// other parameters (a reload that changes a window, a capacity or a rate):
/// see "Reloads" above.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Token bucket: tokens left at `last_us`, in a bucket of `capacity`.
    Tokens {
        /// Tokens in the bucket (fractional).
        tokens: f64,
        /// When `tokens` was computed.
        last_us: Micros,
        /// The capacity the bucket had when written: under another
        /// capacity, what it was short of full is kept.
        capacity: u64,
    },
    /// Fixed and sliding window counters.
    Window {
        /// Start of the current window (a multiple of the window length).
        start_us: Micros,
        /// Units admitted in the current window.
        count: u64,
        /// Units admitted in the previous window (sliding counter only).
        prev: u64,
        /// When the latest of these units was admitted: under another
        /// window length, they count in the new window that holds it.
        last_us: Micros,
    },
    /// Sliding log: admission times, oldest first, one per unit.
    Log(VecDeque<Micros>),
    /// GCRA's theoretical arrival time, or when a leaky bucket's queue
    /// drains.
    Tat {
        /// The theoretical arrival time (µs).
        tat_us: Micros,
        /// The emission interval it was reached with: under another
        /// interval, the units queued ahead are kept, not the time.
        interval_us: u64,
    },
    /// In-flight holders: each holder's id and its deadline (µs).
    Holders(Vec<(String, Micros)>),
}

/// The answer of one limit for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Whether this limit admits the request.
    pub allowed: bool,
    /// Units left after this decision (charged if allowed). Headers show the floor.
    pub remaining: f64,
    /// Time until the quota is fully back (the `t` of the `RateLimit` header).
    pub reset_after_us: u64,
    /// When blocked: the earliest time from now at which the same request
    /// would pass. Zero when allowed.
    pub retry_after_us: u64,
    /// Leaky bucket shaping: how long the admitted request must wait.
    pub delay_us: u64,
}

/// The result of applying an algorithm: the verdict and what to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The answer.
    pub verdict: Verdict,
    /// The new state, to be written only if the whole request is admitted.
    /// `None` when this limit blocks (a blocked request writes nothing).
    pub state: Option<State>,
    /// How long the written state must live; past it, a fresh key decides
    /// exactly the same.
    pub ttl_us: u64,
}

impl Algorithm {
    /// Applies the algorithm to `state` (`None` for a fresh or expired key)
    /// for a request of `cost` units at `now`. A `cost` of zero peeks.
    pub fn decide(&self, state: Option<&State>, now: Micros, cost: u64) -> Step {
        self.decide_as(state, now, cost, None)
    }

    /// [`Algorithm::decide`] for a request that takes in-flight slots as
    /// `holder`: only an in-flight limit uses it (without a holder it is
    /// checked, nothing taken).
    pub fn decide_as(
        &self,
        state: Option<&State>,
        now: Micros,
        cost: u64,
        holder: Option<&str>,
    ) -> Step {
        match *self {
            Algorithm::Concurrency { limit, hold_us } => {
                concurrency::decide(limit, hold_us, state, now, cost, holder)
            }
            Algorithm::TokenBucket {
                capacity,
                refill_per_second,
            } => token_bucket::decide(capacity, refill_per_second, state, now, cost),
            Algorithm::SlidingWindow { limit, window_us } => {
                sliding_window::decide(limit, window_us, state, now, cost)
            }
            Algorithm::SlidingLog { limit, window_us } => {
                sliding_log::decide(limit, window_us, state, now, cost)
            }
            Algorithm::FixedWindow { limit, window_us } => {
                fixed_window::decide(limit, window_us, state, now, cost)
            }
            Algorithm::Gcra {
                rate_per_second,
                burst,
            } => gcra::decide(interval_us(rate_per_second), burst, 0, state, now, cost),
            Algorithm::LeakyBucket {
                rate_per_second,
                capacity,
                max_delay_us,
            } => leaky_bucket::decide(
                interval_us(rate_per_second),
                capacity,
                max_delay_us,
                state,
                now,
                cost,
            ),
        }
    }

    /// The config name of the algorithm (`token_bucket`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::Concurrency { .. } => "concurrency",
        }
    }

    /// The quota `q` of the `RateLimit-Policy` header: units per window.
    pub fn quota(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, .. } => capacity,
            Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. }
            | Algorithm::FixedWindow { limit, .. } => limit,
            Algorithm::Gcra { burst, .. } => burst,
            Algorithm::LeakyBucket { capacity, .. } => capacity,
            Algorithm::Concurrency { limit, .. } => limit,
        }
    }

    /// Whether this is an in-flight limit (slots held until a request ends).
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Algorithm::Concurrency { .. })
    }

    /// The window `w` of the `RateLimit-Policy` header, in whole seconds: the
    /// window, or the time a bucket takes to refill from empty.
    pub fn window_secs(&self) -> u64 {
        let us = match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_per_second,
            } => (capacity as f64 / refill_per_second * MICROS_PER_SEC as f64).ceil() as u64,
            Algorithm::SlidingWindow { window_us, .. }
            | Algorithm::SlidingLog { window_us, .. }
            | Algorithm::FixedWindow { window_us, .. } => window_us,
            Algorithm::Gcra {
                rate_per_second,
                burst,
            } => burst * interval_us(rate_per_second),
            Algorithm::LeakyBucket {
                rate_per_second,
                capacity,
                ..
            } => capacity * interval_us(rate_per_second),
            // Slots come back when requests end: the hold timeout is the
            // longest a slot can stay taken without a live holder.
            Algorithm::Concurrency { hold_us, .. } => hold_us,
        };
        us.div_ceil(MICROS_PER_SEC).max(1)
    }

    /// The same algorithm with every quota (capacity, limit, burst) mapped
    /// by `quota` and every rate multiplied by `rate_factor`: a region's
    /// partition, a sub-identity's share or a local fallback's cap.
    pub fn with_quotas(&self, quota: impl Fn(u64) -> u64, rate_factor: f64) -> Algorithm {
        match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_per_second,
            } => Algorithm::TokenBucket {
                capacity: quota(capacity),
                refill_per_second: refill_per_second * rate_factor,
            },
            Algorithm::SlidingWindow { limit, window_us } => Algorithm::SlidingWindow {
                limit: quota(limit),
                window_us,
            },
            Algorithm::SlidingLog { limit, window_us } => Algorithm::SlidingLog {
                limit: quota(limit),
                window_us,
            },
            Algorithm::FixedWindow { limit, window_us } => Algorithm::FixedWindow {
                limit: quota(limit),
                window_us,
            },
            Algorithm::Gcra {
                rate_per_second,
                burst,
            } => Algorithm::Gcra {
                rate_per_second: rate_per_second * rate_factor,
                burst: quota(burst),
            },
            Algorithm::LeakyBucket {
                rate_per_second,
                capacity,
                max_delay_us,
            } => Algorithm::LeakyBucket {
                rate_per_second: rate_per_second * rate_factor,
                capacity: quota(capacity),
                max_delay_us,
            },
            Algorithm::Concurrency { limit, hold_us } => Algorithm::Concurrency {
                limit: quota(limit),
                hold_us,
            },
        }
    }

    /// Checks the parameters; the message says what would be valid.
    pub fn validate(&self) -> Result<(), String> {
        const MAX_QUOTA: u64 = 1_000_000_000_000;
        const MAX_WINDOW_US: u64 = 366 * 86_400 * MICROS_PER_SEC;
        // A queue or GCRA window past ~317 years would overflow µs arithmetic.
        const MAX_SPAN_US: u64 = 10_000_000_000_000_000;
        let rate = |r: f64, field: &str| {
            if r.is_finite() && (1e-6..=1e6).contains(&r) {
                Ok(())
            } else {
                Err(format!(
                    "`{field}` must be a number from 0.000001 to 1000000 per second, got {r}"
                ))
            }
        };
        let quota = |n: u64, field: &str| {
            if (1..=MAX_QUOTA).contains(&n) {
                Ok(())
            } else {
                Err(format!("`{field}` must be from 1 to {MAX_QUOTA}, got {n}"))
            }
        };
        let window = |w: u64| {
            if (1_000..=MAX_WINDOW_US).contains(&w) {
                Ok(())
            } else {
                Err(
                    "`window` must be from 1ms to 366d (for example \"60s\", \"1h\", \"1d\")"
                        .into(),
                )
            }
        };
        let span = |n: u64, r: f64, field: &str| {
            if n.checked_mul(interval_us(r))
                .is_some_and(|s| s <= MAX_SPAN_US)
            {
                Ok(())
            } else {
                Err(format!(
                    "`{field}` {n} at {r}/s spans more than 317 years; lower it or raise the rate"
                ))
            }
        };
        match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_per_second,
            } => {
                quota(capacity, "capacity")?;
                rate(refill_per_second, "refill_per_second")
            }
            Algorithm::SlidingWindow { limit, window_us }
            | Algorithm::SlidingLog { limit, window_us }
            | Algorithm::FixedWindow { limit, window_us } => {
                quota(limit, "limit")?;
                window(window_us)
            }
            Algorithm::Gcra {
                rate_per_second,
                burst,
            } => {
                quota(burst, "burst")?;
                rate(rate_per_second, "rate_per_second")?;
                span(burst, rate_per_second, "burst")
            }
            Algorithm::LeakyBucket {
                rate_per_second,
                capacity,
                max_delay_us,
            } => {
                quota(capacity, "capacity")?;
                rate(rate_per_second, "rate_per_second")?;
                span(capacity, rate_per_second, "capacity")?;
                if max_delay_us > MAX_WINDOW_US {
                    return Err("`max_delay` must be at most 366d".into());
                }
                Ok(())
            }
            Algorithm::Concurrency { limit, hold_us } => {
                quota(limit, "limit")?;
                if (MIN_HOLD_US..=MAX_HOLD_US).contains(&hold_us) {
                    Ok(())
                } else {
                    Err(
                        "`hold_timeout` must be from 1s to 1d (for example \"30s\"): \
                         renewals run every third of it"
                            .into(),
                    )
                }
            }
        }
    }

    /// The largest cost a single request may have: a request costing more
    /// could never pass, so the config is rejected instead.
    pub fn max_cost(&self) -> u64 {
        match self {
            // A request takes one slot whatever its cost.
            Algorithm::Concurrency { .. } => u64::MAX,
            _ => self.quota(),
        }
    }
}

/// The shortest hold timeout of an in-flight limit (renewals run every
/// third of it).
pub const MIN_HOLD_US: u64 = MICROS_PER_SEC;
/// The longest hold timeout of an in-flight limit.
pub const MAX_HOLD_US: u64 = 86_400 * MICROS_PER_SEC;
/// The hold timeout of an in-flight limit that names none: long enough
/// for renewals (every 10 s) to ride out a slow store call, short enough
/// that a crashed process's slots come back within half a minute.
pub const DEFAULT_HOLD_US: u64 = 30 * MICROS_PER_SEC;

/// Microseconds between two units at `rate_per_second`, rounded up so that
/// rounding never admits more than the configured rate.
pub fn interval_us(rate_per_second: f64) -> u64 {
    ((MICROS_PER_SEC as f64 / rate_per_second).ceil() as u64).max(1)
}

fn ceil_us(x: f64) -> u64 {
    if x <= 0.0 { 0 } else { x.ceil() as u64 }
}
