//! Sliding window counter: two fixed windows, the previous one weighted by
//! the share of it the sliding window still covers:
//! `estimate = prev × (window − elapsed) / window + current`.
//!
//! It assumes the previous window's units were spread evenly, so it can
//! admit slightly more or fewer than an exact log would in the same window,
//! for two integers of state. `lua/sliding_window.lua` does the same
//! floating-point operations in the same order.
//!
//! A stored window that starts after `now` (the clock stepped back) is kept
//! as the current window, its previous window weighted fully until the clock
//! reaches its start, so a step back never empties the counters.
//!
//! Under a window length other than the one the counts were taken with (a
//! reload), each stored count moves to the new, epoch-aligned window that
//! holds the latest time its units can have been admitted: the latest
//! admission for the current count, the end of the stored previous window
//! for the previous one. A unit moved later only ever weighs more in the
//! estimate, so a reload never lowers it; with an unchanged length both
//! land where they were.

use super::{Step, Verdict};
use crate::algorithm::State;
use crate::clock::Micros;

fn estimate(prev: u64, curr: u64, window: u64, elapsed: u64) -> f64 {
    prev as f64 * ((window - elapsed) as f64 / window as f64) + curr as f64
}

/// The window current at `now` and the units counted in it and in the one
/// before (each stored count moved to the window of the current length
/// that holds the latest time its units can have been admitted), with the
/// latest admission: what a decision, and a settle, starts from.
pub(super) fn rolled(
    window: u64,
    state: Option<&State>,
    now: Micros,
) -> (Micros, u64, u64, Micros) {
    let aligned = now - now % window;
    match state {
        Some(State::Window {
            start_us,
            count,
            prev,
            last_us,
        }) => {
            // Where each count lands in windows of the current length.
            let at_count = last_us - last_us % window;
            let before = start_us.saturating_sub(1);
            let at_prev = before - before % window;
            // A stored window later than `now` (the clock stepped back)
            // stays current: time never runs a window backwards.
            let start = aligned.max(at_count);
            let in_window = |at: u64, n: u64, w: u64| if at == w { n } else { 0 };
            let curr = in_window(at_count, *count, start) + in_window(at_prev, *prev, start);
            let prev = in_window(at_count, *count, start.wrapping_sub(window))
                + in_window(at_prev, *prev, start.wrapping_sub(window));
            (start, curr, prev, (*last_us).max(now))
        }
        _ => (aligned, 0, 0, now),
    }
}

pub(super) fn decide(
    limit: u64,
    window: u64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
) -> Step {
    let (start, curr, prev, last) = rolled(window, state, now);
    // Before a later stored window starts, its previous window still weighs
    // fully.
    let elapsed = now.saturating_sub(start);
    let est = estimate(prev, curr, window, elapsed);
    let limit_f = limit as f64;
    if est + cost as f64 <= limit_f {
        let curr = curr + cost;
        let reset = if curr > 0 {
            start + 2 * window - now
        } else if prev > 0 {
            start + window - now
        } else {
            0
        };
        Step {
            verdict: Verdict {
                allowed: true,
                remaining: limit_f - (est + cost as f64),
                reset_after_us: reset,
                retry_after_us: 0,
                delay_us: 0,
            },
            state: Some(State::Window {
                start_us: start,
                count: curr,
                prev,
                last_us: last,
            }),
            ttl_us: start + 2 * window - now,
        }
    } else {
        let reset = if curr > 0 {
            start + 2 * window - now
        } else {
            start + window - now
        };
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: (limit_f - est).max(0.0),
                reset_after_us: reset,
                retry_after_us: retry_after(limit, window, start, prev, curr, now, cost),
                delay_us: 0,
            },
            state: None,
            ttl_us: start + 2 * window - now,
        }
    }
}

/// The earliest wait after which `estimate + cost <= limit`, found in closed
/// form and then nudged past any floating-point rounding.
fn retry_after(
    limit: u64,
    window: u64,
    start: Micros,
    prev: u64,
    curr: u64,
    now: Micros,
    cost: u64,
) -> u64 {
    let fits = |p: u64, c: u64, e: u64| estimate(p, c, window, e) + cost as f64 <= limit as f64;
    // The smallest elapsed time in a window where `p` units weighted down
    // plus `c` leave room for `cost`, if there is one before the window ends.
    let first_fit = |p: u64, c: u64, not_before: u64| -> Option<u64> {
        if c.saturating_add(cost) > limit {
            return None;
        }
        let slack = (limit - cost - c) as f64;
        let e = if p == 0 {
            0.0
        } else {
            window as f64 - slack * window as f64 / p as f64
        };
        let first = (e.max(0.0).ceil() as u64).max(not_before);
        for e in first..first + 8 {
            if e >= window {
                return None;
            }
            if fits(p, c, e) {
                return Some(e);
            }
        }
        None
    };
    let at = match first_fit(prev, curr, now.saturating_sub(start)) {
        Some(e) => start + e,
        // In the next window this window's count is the weighted one; at the
        // start of the window after that, nothing is counted at all.
        None => match first_fit(curr, 0, 0) {
            Some(e) => start + window + e,
            None => start + 2 * window,
        },
    };
    (at - now).max(1)
}
