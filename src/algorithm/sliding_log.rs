//! Sliding window log: the exact count of units admitted in the last
//! `window`, one timestamp per unit (a sorted set in Redis). Memory grows with
//! the limit, so keep it for small limits where exactness matters.
//!
//! Entries logged at a time later than `now` (the clock stepped back) keep
//! counting until they leave the window on the clock that runs now.

use std::collections::VecDeque;

use super::{Step, Verdict};
use crate::algorithm::State;
use crate::clock::Micros;

pub(super) fn decide(
    limit: u64,
    window: u64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
) -> Step {
    let horizon = now.saturating_sub(window);
    let mut log: VecDeque<Micros> = match state {
        Some(State::Log(log)) => log.iter().copied().filter(|&t| t > horizon).collect(),
        _ => VecDeque::new(),
    };
    let count = log.len() as u64;
    // Entries later than `now` (the clock stepped back) still count, and the
    // key lives until the newest of them leaves the window.
    let ttl = log.back().map_or(now, |&t| t.max(now)) + window - now;
    // Saturating: a huge cost is refused, never wrapped into admission.
    if count.saturating_add(cost) <= limit {
        // Kept in time order, as the sorted set is, even when the clock
        // stepped back behind entries already logged.
        let at = log.partition_point(|&t| t <= now);
        for _ in 0..cost {
            log.insert(at, now);
        }
        let oldest = log.front().copied().unwrap_or(now);
        let reset = if log.is_empty() {
            0
        } else {
            oldest + window - now
        };
        Step {
            verdict: Verdict {
                allowed: true,
                remaining: (limit - count - cost) as f64,
                reset_after_us: reset,
                retry_after_us: 0,
                delay_us: 0,
            },
            state: Some(State::Log(log)),
            ttl_us: ttl,
        }
    } else {
        // The request passes once `count + cost - limit` of the oldest
        // entries have left the window.
        let must_expire = usize::try_from(count.saturating_add(cost) - limit).unwrap_or(usize::MAX);
        // A cost above the limit can never pass (configs reject it); say
        // "a window from now" rather than index past the log.
        let retry = match log.get(must_expire.wrapping_sub(1)) {
            Some(&t) if must_expire > 0 => t + window - now,
            _ => window,
        };
        let reset = log.back().map_or(0, |&t| t + window - now);
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: limit.saturating_sub(count) as f64,
                reset_after_us: reset,
                retry_after_us: retry.max(1),
                delay_us: 0,
            },
            state: None,
            ttl_us: ttl,
        }
    }
}
