//! GCRA, the generic cell rate algorithm: one timestamp per key, the
//! theoretical arrival time (TAT) of the next unit. Admits `burst` at once
//! and then one unit per emission interval, in integer microseconds (the
//! interval is rounded up, so rounding never admits more than the rate).
//!
//! The leaky bucket in policing mode is this same meter; see
//! [`super::leaky_bucket`].

use super::{Step, Verdict};
use crate::algorithm::State;
use crate::clock::Micros;

/// The TAT of a state written at another emission interval (a reload):
/// the same units queued ahead of `now`, re-timed at `interval`, rounded up
/// (so a rounding never empties the queue by a microsecond). One
/// floating-point multiplication and division, as `lua/gcra.lua` does.
pub(super) fn retimed(tat: Micros, was: u64, interval: u64, now: Micros) -> Micros {
    if was == interval || tat <= now {
        return tat;
    }
    let queued = (tat - now) as f64 * interval as f64 / was as f64;
    now.saturating_add(queued.ceil() as u64)
}

/// `interval` µs per unit, `burst` units at once. `max_delay` > 0 turns the
/// meter into a shaper (leaky bucket): see [`super::leaky_bucket`].
pub(super) fn decide(
    interval: u64,
    burst: u64,
    max_delay: u64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
) -> Step {
    // A stored TAT later than `now` is the normal case (units queued ahead);
    // a clock that stepped back only lengthens the queue, never empties it.
    let tat = match state {
        Some(State::Tat {
            tat_us,
            interval_us,
        }) => retimed(*tat_us, *interval_us, interval, now).max(now),
        _ => now,
    };
    // Validation bounds these products; saturating keeps a hand-built
    // policy from panicking on a request.
    let window = burst.saturating_mul(interval);
    let queued = tat - now;
    let new_tat = tat.saturating_add(cost.saturating_mul(interval));
    let used = new_tat - now;
    let shaping_too_long = max_delay > 0 && queued > max_delay;
    if used <= window && !shaping_too_long {
        Step {
            verdict: Verdict {
                allowed: true,
                remaining: ((window - used) / interval) as f64,
                reset_after_us: used,
                retry_after_us: 0,
                delay_us: if max_delay > 0 { queued } else { 0 },
            },
            state: Some(State::Tat {
                tat_us: new_tat,
                interval_us: interval,
            }),
            ttl_us: used,
        }
    } else {
        // Both conditions must hold at the retry time: room in the window
        // and, when shaping, a queue ahead no longer than `max_delay`.
        let mut retry = used.saturating_sub(window);
        if max_delay > 0 {
            retry = retry.max(queued.saturating_sub(max_delay));
        }
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: (window.saturating_sub(queued) / interval) as f64,
                reset_after_us: queued,
                retry_after_us: retry.max(1),
                delay_us: 0,
            },
            state: None,
            ttl_us: queued,
        }
    }
}
