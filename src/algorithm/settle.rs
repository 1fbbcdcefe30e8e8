//! Settling a request after its response: charging what it used beyond
//! what its decision reserved, or giving back what it did not use.
//!
//! `lua/settle.lua` performs the same operations in the same order
//! (tests/settle_parity.rs holds them together). Each function takes the
//! state at `now` and returns the state to write with its TTL, or `None`
//! when nothing changes.
//!
//! - A **charge** is forced: it is applied even past the limit, as debt
//!   that later requests pay back by being refused until it has drained.
//!   The debt is bounded so one hostile report cannot lock a client out
//!   for ever: a bucket goes no lower than `-capacity`, a window counts at
//!   most `2 × limit`, a TAT lies at most `2 × burst` intervals ahead, a log
//!   holds at most `2 × limit` entries. A charge lands in the window of
//!   `now` (the units were spent now, not when the request was admitted).
//! - A **refund** never gives back more than was charged and never below
//!   zero: a bucket fills up to its capacity at most; a window counter
//!   goes down only while the window that was charged (the one holding
//!   `charged_at`) is still the current one, so a window that rolled
//!   between the decision and the settle keeps nothing to give; a TAT
//!   moves back no earlier than `now`; a log loses at most the entries
//!   stamped `charged_at`.
//!
//! ```
//! use ratewatch::algorithm::{Adjust, Algorithm, settle};
//! let day = Algorithm::FixedWindow { limit: 10, window_us: 86_400_000_000 };
//! let now = 1_000_000_000;
//! let step = day.decide(None, now, 4);
//! // The request used 1 unit of the 4 it reserved: 3 go back.
//! let (state, _ttl) = settle(&day, step.state.as_ref(), now + 5, now, Adjust::Refund(3)).unwrap();
//! assert_eq!(day.decide(Some(&state), now + 6, 0).verdict.remaining, 9.0);
//! ```

use std::collections::VecDeque;

use super::{Algorithm, State, ceil_us, interval_us};
use crate::clock::{MICROS_PER_SEC, Micros};

/// What a settle does to each limit a decision charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjust {
    /// Charge this many more units (forced: may go past the limit as debt).
    Charge(u64),
    /// Give this many units back (never more than was charged).
    Refund(u64),
}

impl Adjust {
    /// The adjustment that takes a reservation of `reserved` units to
    /// `actual`; `None` when they are equal.
    pub fn between(reserved: u64, actual: u64) -> Option<Adjust> {
        match actual.cmp(&reserved) {
            std::cmp::Ordering::Greater => Some(Adjust::Charge(actual - reserved)),
            std::cmp::Ordering::Less => Some(Adjust::Refund(reserved - actual)),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// The units charged or refunded.
    pub fn units(self) -> u64 {
        match self {
            Adjust::Charge(n) | Adjust::Refund(n) => n,
        }
    }
}

/// Settles `adjust` against one limit whose state at `now` is `state`, for
/// a request its decision charged at `charged_at`. Returns the new state
/// and how long it must live, or `None` when nothing is to be written.
pub fn settle(
    algorithm: &Algorithm,
    state: Option<&State>,
    now: Micros,
    charged_at: Micros,
    adjust: Adjust,
) -> Option<(State, u64)> {
    match *algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill_per_second,
        } => tokens(capacity, refill_per_second, state, now, adjust),
        Algorithm::FixedWindow { limit, window_us } => {
            fixed(limit, window_us, state, now, charged_at, adjust)
        }
        Algorithm::SlidingWindow { limit, window_us } => {
            sliding(limit, window_us, state, now, charged_at, adjust)
        }
        Algorithm::SlidingLog { limit, window_us } => {
            log(limit, window_us, state, now, charged_at, adjust)
        }
        Algorithm::Gcra {
            rate_per_second,
            burst,
        } => tat(interval_us(rate_per_second), burst, state, now, adjust),
        Algorithm::LeakyBucket {
            rate_per_second,
            capacity,
            ..
        } => tat(interval_us(rate_per_second), capacity, state, now, adjust),
        // A slot is held until its request ends, not spent: nothing to
        // settle (the limiter never sends one).
        Algorithm::Concurrency { .. } => None,
    }
}

fn tokens(
    capacity: u64,
    refill_per_second: f64,
    state: Option<&State>,
    now: Micros,
    adjust: Adjust,
) -> Option<(State, u64)> {
    let cap = capacity as f64;
    let per_us = refill_per_second / MICROS_PER_SEC as f64;
    let (stored, stored_last) = match super::token_bucket::stored(capacity, state) {
        Some(held) => held,
        // A full bucket has nothing to take back.
        None if matches!(adjust, Adjust::Refund(_)) => return None,
        None => (cap, now),
    };
    let held = super::token_bucket::refill(cap, per_us, stored, stored_last, now);
    let last = stored_last.max(now);
    let left = match adjust {
        Adjust::Charge(n) => (held - n as f64).max(-cap),
        Adjust::Refund(n) => (held + n as f64).min(cap),
    };
    let ttl = (last - now) + ceil_us((cap - left) / per_us);
    Some((
        State::Tokens {
            tokens: left,
            last_us: last,
            capacity,
        },
        ttl,
    ))
}

/// The most a window record holds (its count field has 40 bits).
const MAX_COUNT: u64 = (1 << 40) - 1;

/// `count` moved by `adjust`: a charge up to `2 × limit` (never down), a
/// refund down to 0.
fn counted(count: u64, limit: u64, adjust: Adjust) -> u64 {
    match adjust {
        Adjust::Charge(n) => count.max(
            count
                .saturating_add(n)
                .min(limit.saturating_mul(2))
                .min(MAX_COUNT),
        ),
        Adjust::Refund(n) => count.saturating_sub(n),
    }
}

fn fixed(
    limit: u64,
    window: u64,
    state: Option<&State>,
    now: Micros,
    charged_at: Micros,
    adjust: Adjust,
) -> Option<(State, u64)> {
    let (start, count, last) = super::fixed_window::current(window, state, now);
    if matches!(adjust, Adjust::Refund(_))
        && (count == 0 || start != charged_at - charged_at % window)
    {
        return None;
    }
    Some((
        State::Window {
            start_us: start,
            count: counted(count, limit, adjust),
            prev: 0,
            last_us: last,
        },
        start + window - now,
    ))
}

fn sliding(
    limit: u64,
    window: u64,
    state: Option<&State>,
    now: Micros,
    charged_at: Micros,
    adjust: Adjust,
) -> Option<(State, u64)> {
    let (start, curr, prev, last) = super::sliding_window::rolled(window, state, now);
    if matches!(adjust, Adjust::Refund(_))
        && (curr == 0 || start != charged_at - charged_at % window)
    {
        return None;
    }
    Some((
        State::Window {
            start_us: start,
            count: counted(curr, limit, adjust),
            prev,
            last_us: last,
        },
        start + 2 * window - now,
    ))
}

fn log(
    limit: u64,
    window: u64,
    state: Option<&State>,
    now: Micros,
    charged_at: Micros,
    adjust: Adjust,
) -> Option<(State, u64)> {
    let horizon = now.saturating_sub(window);
    let mut log: VecDeque<Micros> = match state {
        Some(State::Log(log)) => log.iter().copied().filter(|&t| t > horizon).collect(),
        _ => VecDeque::new(),
    };
    match adjust {
        Adjust::Charge(n) => {
            let room = limit.saturating_mul(2).saturating_sub(log.len() as u64);
            let at = log.partition_point(|&t| t <= now);
            for _ in 0..n.min(room) {
                log.insert(at, now);
            }
        }
        Adjust::Refund(n) => {
            // The entries the decision added are the ones stamped with its
            // time; later ones at the same stamp are alike, and as many go.
            let mut left = n;
            log.retain(|&t| {
                if t == charged_at && left > 0 {
                    left -= 1;
                    false
                } else {
                    true
                }
            });
            if left == n {
                return None;
            }
        }
    }
    let ttl = log.back().map_or(now, |&t| t.max(now)) + window - now;
    Some((State::Log(log), ttl))
}

fn tat(
    interval: u64,
    burst: u64,
    state: Option<&State>,
    now: Micros,
    adjust: Adjust,
) -> Option<(State, u64)> {
    let tat = match state {
        Some(State::Tat {
            tat_us,
            interval_us,
        }) => super::gcra::retimed(*tat_us, *interval_us, interval, now).max(now),
        // Nothing queued: nothing to take back.
        _ if matches!(adjust, Adjust::Refund(_)) => return None,
        _ => now,
    };
    let new = match adjust {
        Adjust::Charge(n) => {
            let most = now.saturating_add(burst.saturating_mul(interval).saturating_mul(2));
            tat.max(tat.saturating_add(n.saturating_mul(interval)).min(most))
        }
        Adjust::Refund(n) => tat.saturating_sub(n.saturating_mul(interval)).max(now),
    };
    Some((
        State::Tat {
            tat_us: new,
            interval_us: interval,
        },
        new - now,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Micros = 1_700_000_000_000_000;

    fn after(a: &Algorithm, state: Option<State>, at: Micros) -> f64 {
        a.decide(state.as_ref(), at, 0).verdict.remaining
    }

    #[test]
    fn a_refund_in_the_charged_window_gives_units_back_and_a_rolled_window_keeps_them() {
        let w = 60_000_000;
        for a in [
            Algorithm::FixedWindow {
                limit: 10,
                window_us: w,
            },
            Algorithm::SlidingWindow {
                limit: 10,
                window_us: w,
            },
        ] {
            let at = NOW - NOW % w + 1;
            let step = a.decide(None, at, 8);
            let (s, _) = settle(&a, step.state.as_ref(), at + 10, at, Adjust::Refund(5)).unwrap();
            assert!(after(&a, Some(s), at + 10) >= 7.0, "{a:?}");
            // Next window: the refund finds nothing of its own to give.
            assert_eq!(
                settle(&a, step.state.as_ref(), at + w, at, Adjust::Refund(5)),
                None,
                "{a:?}"
            );
        }
    }

    #[test]
    fn a_refund_never_gives_more_than_was_charged() {
        let a = Algorithm::TokenBucket {
            capacity: 10,
            refill_per_second: 1.0,
        };
        let step = a.decide(None, NOW, 2);
        let (s, _) = settle(&a, step.state.as_ref(), NOW, NOW, Adjust::Refund(u64::MAX)).unwrap();
        assert_eq!(after(&a, Some(s), NOW), 10.0);
        let g = Algorithm::Gcra {
            rate_per_second: 1.0,
            burst: 5,
        };
        let step = g.decide(None, NOW, 2);
        let (s, ttl) = settle(
            &g,
            step.state.as_ref(),
            NOW + 1,
            NOW,
            Adjust::Refund(u64::MAX),
        )
        .unwrap();
        assert_eq!(ttl, 0);
        assert_eq!(
            s,
            State::Tat {
                tat_us: NOW + 1,
                interval_us: 1_000_000
            }
        );
    }

    #[test]
    fn a_charge_goes_past_the_limit_as_bounded_debt() {
        for a in [
            Algorithm::TokenBucket {
                capacity: 10,
                refill_per_second: 1.0,
            },
            Algorithm::FixedWindow {
                limit: 10,
                window_us: 60_000_000,
            },
            Algorithm::SlidingWindow {
                limit: 10,
                window_us: 60_000_000,
            },
            Algorithm::SlidingLog {
                limit: 10,
                window_us: 60_000_000,
            },
            Algorithm::Gcra {
                rate_per_second: 1.0,
                burst: 10,
            },
        ] {
            let step = a.decide(None, NOW, 5);
            let (s, ttl) =
                settle(&a, step.state.as_ref(), NOW, NOW, Adjust::Charge(u64::MAX)).unwrap();
            // In debt: even one unit is refused, for a bounded time.
            let d = a.decide(Some(&s), NOW, 1);
            assert!(!d.verdict.allowed, "{a:?}");
            assert!(ttl <= 2 * 60_000_000 + 20_000_000, "{a:?}: {ttl}");
        }
    }

    #[test]
    fn between_names_the_direction() {
        assert_eq!(Adjust::between(5, 9), Some(Adjust::Charge(4)));
        assert_eq!(Adjust::between(5, 1), Some(Adjust::Refund(4)));
        assert_eq!(Adjust::between(5, 5), None);
    }
}
