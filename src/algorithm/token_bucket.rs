//! Token bucket: `capacity` tokens, refilled continuously at a fractional
//! rate. Admits at most `capacity + rate × t` units over any span `t`.
//!
//! Tokens are kept as an `f64` (a rate of 0.33/s is common); `lua/token_bucket.lua`
//! performs the same floating-point operations in the same order, so both
//! stores give bit-identical answers.
//!
//! The state records the capacity it was written with. Under another
//! capacity (a reload) the bucket keeps what it was short of full: it holds
//! `tokens + new capacity - old capacity`, at least 0, so a lowered
//! capacity counts what was already taken against the lower value and a
//! raised one is available at once, as if it had always been in place.

use super::{Step, Verdict, ceil_us};
use crate::algorithm::State;
use crate::clock::{MICROS_PER_SEC, Micros};

/// Tokens held at `now` by a bucket that held `tokens` at `last`. A clock
/// that steps back refills nothing; it never drains either. Once the time to
/// refill to full (the TTL written with the state) has passed, the bucket is
/// exactly full, as a fresh key would be: adding `elapsed × per_us` back
/// could fall an ulp short of `cap`.
pub(super) fn refill(cap: f64, per_us: f64, tokens: f64, last: Micros, now: Micros) -> f64 {
    if now <= last {
        return tokens;
    }
    let elapsed = now - last;
    if elapsed >= ceil_us((cap - tokens) / per_us) {
        cap
    } else {
        cap.min(tokens + elapsed as f64 * per_us)
    }
}

pub(super) fn decide(
    capacity: u64,
    refill_per_second: f64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
) -> Step {
    let cap = capacity as f64;
    let per_us = refill_per_second / MICROS_PER_SEC as f64;
    let (stored, stored_last) = stored(capacity, state).unwrap_or((cap, now));
    let tokens = refill(cap, per_us, stored, stored_last, now);
    let last = stored_last.max(now);
    // Behind a refill time later than `now` (the clock stepped back) the
    // bucket refills only from that time on: the time to full, and so the
    // key's TTL, count from there, or the key would expire while it still
    // holds less than a fresh one.
    let lag = last - now;
    let need = cost as f64;
    if tokens >= need {
        let left = tokens - need;
        let reset = lag + ceil_us((cap - left) / per_us);
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
                capacity,
            }),
            ttl_us: reset,
        }
    } else {
        let reset = lag + ceil_us((cap - tokens) / per_us);
        // The closed form, then corrected by at most a microsecond or two so
        // that the request passes at exactly `now + retry` and not a
        // microsecond earlier, as the same refill arithmetic computes it.
        let passes = |wait: u64| refill(cap, per_us, stored, stored_last, now + wait) >= need;
        let mut retry = lag + ceil_us((need - tokens) / per_us).max(1);
        for _ in 0..4 {
            if !passes(retry) {
                retry += 1;
            } else if retry > 1 && passes(retry - 1) {
                retry -= 1;
            } else {
                break;
            }
        }
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: tokens,
                reset_after_us: reset,
                retry_after_us: retry,
                delay_us: 0,
            },
            state: None,
            ttl_us: reset,
        }
    }
}

/// The tokens a stored bucket holds and when they were counted, read under
/// `capacity`: a bucket written under another capacity keeps what it was
/// short of full (at least 0 tokens). `None` for no bucket (a fresh key).
/// The decision and a settle read a bucket the same way.
pub(super) fn stored(capacity: u64, state: Option<&State>) -> Option<(f64, Micros)> {
    match state {
        Some(State::Tokens {
            tokens,
            last_us,
            capacity: was,
        }) if *was != capacity => Some((
            (*tokens + (capacity as f64 - *was as f64)).max(0.0),
            *last_us,
        )),
        Some(State::Tokens {
            tokens, last_us, ..
        }) => Some((*tokens, *last_us)),
        _ => None,
    }
}
