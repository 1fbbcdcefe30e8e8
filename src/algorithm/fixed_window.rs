//! Fixed window: a counter per window aligned to the Unix epoch, so a `1d`
//! quota resets at 00:00 UTC for every instance alike. Up to twice the limit
//! can pass around a boundary; use it for quotas, not for burst control.
//!
//! Time never runs a window backwards: a stored window that starts after
//! `now` (the clock stepped back, or a failover landed on a replica whose
//! clock is behind) is still the current window, with its count, until the
//! clock passes its end. Otherwise a step back of a few seconds would open a
//! fresh window and hand out the quota again.
//!
//! The state records when its latest unit was admitted, and the stored
//! count belongs to the window (of the current length) that holds that
//! time. With an unchanged window that is the stored window itself; after
//! a reload that changed the window's length, the units count in the new,
//! epoch-aligned window that holds the latest of them (they may all have
//! been admitted in it), so a shorter window never starts with a fresh
//! quota and a `1d` window still ends at 00:00 UTC.

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
    let (start, count, last) = current(window, state, now);
    let reset = start + window - now;
    // Saturating: a cost near u64::MAX (a decision service client sends
    // any) must be refused, never wrap round to a small sum and admit.
    if count.saturating_add(cost) <= limit {
        Step {
            verdict: Verdict {
                allowed: true,
                remaining: (limit - count - cost) as f64,
                reset_after_us: reset,
                retry_after_us: 0,
                delay_us: 0,
            },
            state: Some(State::Window {
                start_us: start,
                count: count + cost,
                prev: 0,
                last_us: last,
            }),
            ttl_us: reset,
        }
    } else {
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: limit.saturating_sub(count) as f64,
                reset_after_us: reset,
                retry_after_us: reset,
                delay_us: 0,
            },
            state: None,
            ttl_us: reset,
        }
    }
}

/// The current window of a stored counter at `now`, read under `window`:
/// its start, the units it counts and the latest admission. The stored
/// units count in the window holding their latest admission (a later one
/// stays current when the clock stepped back); an older window counts
/// nothing. The decision and a settle read a window the same way.
pub(super) fn current(window: u64, state: Option<&State>, now: Micros) -> (Micros, u64, Micros) {
    let aligned = now - now % window;
    match state {
        Some(State::Window { count, last_us, .. }) => {
            let held = last_us - last_us % window;
            if held >= aligned {
                (held, *count, (*last_us).max(now))
            } else {
                (aligned, 0, now)
            }
        }
        _ => (aligned, 0, now),
    }
}
