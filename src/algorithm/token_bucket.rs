//! Token bucket: `capacity` tokens, refilled continuously at a fractional
//! rate. Admits at most `capacity + rate × t` units over any span `t`.
//!
//! Tokens are kept as an `f64` (a rate of 0.33/s is common); `lua/token_bucket.lua`
//! performs the same floating-point operations in the same order, so both
//! stores give bit-identical answers.

use super::{Step, Verdict, ceil_us};
use crate::algorithm::State;
use crate::clock::{MICROS_PER_SEC, Micros};

pub(super) fn decide(
    capacity: u64,
    refill_per_second: f64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
) -> Step {
    let cap = capacity as f64;
    let per_us = refill_per_second / MICROS_PER_SEC as f64;
    let (mut tokens, last) = match state {
        Some(State::Tokens { tokens, last_us }) => (*tokens, *last_us),
        _ => (cap, now),
    };
    // A clock that steps back refills nothing; it never drains either.
    if now > last {
        tokens = cap.min(tokens + (now - last) as f64 * per_us);
    }
    let last = last.max(now);
    let need = cost as f64;
    if tokens >= need {
        let left = tokens - need;
        let reset = ceil_us((cap - left) / per_us);
        Step {
            verdict: Verdict {
                allowed: true,
                remaining: left,
                reset_after_us: reset,
                retry_after_us: 0,
                delay_us: 0,
            },
            state: Some(State::Tokens {
                tokens: left,
                last_us: last,
            }),
            ttl_us: reset,
        }
    } else {
        let reset = ceil_us((cap - tokens) / per_us);
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: tokens,
                reset_after_us: reset,
                retry_after_us: ceil_us((need - tokens) / per_us).max(1),
                delay_us: 0,
            },
            state: None,
            ttl_us: reset,
        }
    }
}
